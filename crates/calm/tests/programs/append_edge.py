"""O_APPEND records of one size, each one write(2) from a buffer that starts a given number of
bytes into a page (the kernel hands a mount at most 256 pages of the caller's memory in one
request, so where the buffer starts decides how many pages a write spans).

append_edge.py FILE TAG SIZE OFFSET COUNT: appends COUNT records of SIZE bytes, each from a
buffer starting OFFSET bytes into a page; prints `appended COUNT`.
append_edge.py FILE --check SIZE: prints `whole N` when the file is N whole records one after
another, else `torn AT` (the byte where the first record that is not whole starts)."""
import mmap
import os
import sys

HEAD = 32


def record(tag, seq, size):
    head = b"REC %-12s %012d\n" % (tag.encode(), seq)
    fill = bytes([65 + (seq * 7 + len(tag)) % 26])
    return head + fill * (size - len(head) - 1) + b"\n"


def append(path, tag, size, offset, count):
    buffer = mmap.mmap(-1, size + 2 * mmap.PAGESIZE)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    for seq in range(count):
        buffer[offset : offset + size] = record(tag, seq, size)
        view = memoryview(buffer)[offset : offset + size]
        written = os.write(fd, view)
        view.release()
        assert written == size, written
    os.close(fd)
    print("appended", count)


def check(path, size):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        head = data[at : at + HEAD]
        ok = head.startswith(b"REC ") and len(data) - at >= size
        if ok:
            tag = head[4:16].decode().strip()
            seq = int(head[17:29])
            ok = data[at : at + size] == record(tag, seq, size)
        if not ok:
            print("torn", at)
            return
        at += size
    print("whole", len(data) // size)


if sys.argv[2] == "--check":
    check(sys.argv[1], int(sys.argv[3]))
else:
    append(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
