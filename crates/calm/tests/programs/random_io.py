"""Random file operations on a calm file and on a reference file, compared as they go (as fsx
does): the test of file contents through the mount against a local file system.

    random_io.py FILE REFERENCE OPS SEED [held]

Writes at random places (across 4 MiB blocks, past the end, into holes), O_APPEND writes,
reads, truncates down and up, fallocate (mode 0, KEEP_SIZE, PUNCH_HOLE), fsync, and closes
and reopens, the same on both; every read and every size must agree. Prints "ok OPS" at the
end, after comparing the whole files; exits non-zero at the first difference.

With `held`, FILE is made with O_EXCL (in a directory the mount made, the mount holds it) and
kept open to the end: no reopen, appends are writes at the end through the same file, and
half the truncates follow an fsync.
"""
import ctypes
import os
import random
import sys

path, reference, ops, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held = sys.argv[5:] == ["held"]
rng = random.Random(seed)
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE = 0x01, 0x02
BLOCK = 4 << 20
SIZE_MAX = 3 * BLOCK + 12345


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def place():
    """An offset: often near a block boundary, sometimes anywhere."""
    if rng.random() < 0.4:
        return max(0, rng.randrange(1, 4) * BLOCK + rng.randrange(-5000, 5000))
    return rng.randrange(0, SIZE_MAX)


def fail(what):
    print("DIFFERENT:", what, flush=True)
    sys.exit(1)


def open_both(append=False):
    flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if append else 0)
    return os.open(path, flags, 0o644), os.open(reference, flags, 0o644)


if held:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
    fds = os.open(path, flags, 0o644), os.open(reference, flags, 0o644)
else:
    fds = open_both()
for step in range(ops):
    op = rng.random()
    a, b = fds
    if op < 0.35:
        off, n = place(), rng.choice([1, 100, 4096, 70000, 300000])
        data = rng.randbytes(n)
        os.pwrite(a, data, off)
        os.pwrite(b, data, off)
    elif op < 0.60:
        off, n = place(), rng.choice([1, 4096, 65536, 500000])
        got, want = os.pread(a, n, off), os.pread(b, n, off)
        if got != want:
            fail(f"step {step}: read {n} at {off}: {len(got)} bytes, expected {len(want)}")
    elif op < 0.68:
        size = rng.randrange(0, SIZE_MAX)
        if held and rng.random() < 0.5:
            # Half the truncates of a file held come with no write pending (as a mount
            # answers them itself).
            os.fsync(a)
        os.ftruncate(a, size)
        os.ftruncate(b, size)
    elif op < 0.74:
        mode = rng.choice([0, KEEP_SIZE, PUNCH_HOLE | KEEP_SIZE])
        off, n = place(), rng.randrange(1, 600000)
        fallocate(a, mode, off, n)
        fallocate(b, mode, off, n)
    elif op < 0.78:
        os.fsync(a)
    elif op < 0.86 and not held:
        os.close(a)
        os.close(b)
        fds = open_both()
    elif op < 0.90 and held:
        data = rng.randbytes(rng.choice([1, 5000, 200000]))
        os.pwrite(a, data, os.fstat(a).st_size)
        os.pwrite(b, data, os.fstat(b).st_size)
    elif op < 0.90:
        # An O_APPEND write through descriptors of their own.
        data = rng.randbytes(rng.choice([1, 5000, 200000]))
        x, y = open_both(append=True)
        os.write(x, data)
        os.write(y, data)
        os.close(x)
        os.close(y)
    else:
        sa, sb = os.fstat(a).st_size, os.fstat(b).st_size
        if sa != sb:
            fail(f"step {step}: size {sa}, expected {sb}")
for fd in fds:
    os.close(fd)
with open(path, "rb") as f, open(reference, "rb") as g:
    if f.read() != g.read():
        fail("the whole files")
print("ok", ops, flush=True)
