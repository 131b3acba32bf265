"""A counter in FILE, incremented under an exclusive POSIX lock (read, add one, write, fsync,
unlock) until the file STOP exists. Prints `done N` (the increments whose fsync returned 0),
or `error STEP ERRNO N` at the first call that failed, and exits 1.

Usage: locked_counter.py FILE STOP"""
import errno
import fcntl
import os
import sys

path, stop = sys.argv[1], sys.argv[2]
done = 0
f = open(path, "r+b")
while not os.path.exists(stop):
    step = "lock"
    try:
        fcntl.lockf(f, fcntl.LOCK_EX)
        step = "read"
        f.seek(0)
        value = int(f.read().strip() or b"0")
        step = "write"
        f.seek(0)
        f.write(b"%d\n" % (value + 1))
        f.flush()
        step = "fsync"
        os.fsync(f.fileno())
        done += 1
        step = "unlock"
        fcntl.lockf(f, fcntl.LOCK_UN)
    except OSError as e:
        print("error", step, errno.errorcode.get(e.errno, e.errno), done, flush=True)
        sys.exit(1)
print("done", done, flush=True)
