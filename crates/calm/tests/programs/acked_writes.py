"""Fsync'd 100-byte records in a region of a shared file, and which of them were acknowledged.

acked_writes.py FILE WRITER STOP: writes record 0, 1, 2, ... of writer WRITER at its place
(WRITER's region, RECORDS_MAX records of 100 bytes), each followed by fsync, until the file STOP
exists; prints `ack I` when the fsync after record I returned 0 (every record up to I is then
durable) and `fail I ERRNO` when it did not (the next fsync tries again). A write that fails
(`wfail I ERRNO`) is written again.

acked_writes.py FILE --check A0 A1 ...: for writer w, every record up to Aw (its last `ack`)
must read back exactly, and every record after it exactly or as zeros (never anything else);
prints `w ok RECORDS_PRESENT` or `w bad I BYTES_WRONG`."""
import errno
import os
import sys
import time

RECORDS_MAX = 50_000
REGION = RECORDS_MAX * 100


def record(writer, i):
    return f"writer {writer} record {i} ".encode().ljust(99, b".") + b"\n"


def at(writer, i):
    return writer * REGION + i * 100


def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def write(path, writer, stop):
    fd = os.open(path, os.O_WRONLY)
    i = 0
    while not os.path.exists(stop):
        if i == RECORDS_MAX:
            time.sleep(0.1)
            continue
        try:
            os.pwrite(fd, record(writer, i), at(writer, i))
        except OSError as e:
            print("wfail", i, name(e), flush=True)
            time.sleep(0.1)
            continue
        try:
            os.fsync(fd)
            print("ack", i, flush=True)
        except OSError as e:
            print("fail", i, name(e), flush=True)
        i += 1
    os.close(fd)


def check(path, acked):
    with open(path, "rb") as f:
        data = f.read()
    for writer, last in enumerate(acked):
        present, bad, wrong = 0, None, 0
        for i in range(RECORDS_MAX):
            got = data[at(writer, i) : at(writer, i) + 100]
            want = record(writer, i)
            if got == want:
                present += 1
                continue
            if i > last and got.strip(b"\0") == b"":
                continue
            wrong += sum(1 for a, b in zip(got.ljust(100, b"\0"), want) if a != b)
            if bad is None:
                bad = i
        if bad is None:
            print(writer, "ok", present)
        else:
            print(writer, "bad", bad, wrong)


if sys.argv[2] == "--check":
    check(sys.argv[1], [int(a) for a in sys.argv[3:]])
else:
    write(sys.argv[1], int(sys.argv[2]), sys.argv[3])
