"""What each open file of one file is told when the server refuses a commit that holds the
writes of several of them (a tree quota: one descriptor's write grows the file past it).

Usage: refused_commit.py DIR (DIR under a tree limited to 2 MiB): prints one line per step,
`name result` (0 or the errno's name). refused_commit.py DIR --read (from another mount, after):
prints each file's size and how many bytes of each write it holds."""
import errno
import os
import sys

d = sys.argv[1]


def read_back():
    for name in ("by-fsync", "by-close", "by-write"):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        print(
            name,
            len(data),
            data[1000:1100].count(b"A"),
            data[2000:2100].count(b"C"),
            data[3000:3100].count(b"D"),
            data[4000:4100].count(b"E"),
        )


if sys.argv[2:] == ["--read"]:
    read_back()
    sys.exit(0)


def rc(call):
    try:
        call()
        return "0"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def fresh(name):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(b"\0" * (512 << 10))
    return path


def over_quota(fd):
    # Past the 2 MiB of the tree (three files of 512 KiB): 4 MiB at 600 KiB.
    os.pwrite(fd, b"B" * (4 << 20), 600 << 10)


# fsync of the writer that went past the limit is refused; the other writer's next fsync
# reports the loss of its bytes, once; a reader has nothing to be told.
path = fresh("by-fsync")
fd1 = os.open(path, os.O_WRONLY)
fd2 = os.open(path, os.O_WRONLY)
reader = os.open(path, os.O_RDONLY)
os.pwrite(fd1, b"A" * 100, 1000)
over_quota(fd2)
print("fsync-over", rc(lambda: os.fsync(fd2)))
print("fsync-other", rc(lambda: os.fsync(fd1)))
print("fsync-other-again", rc(lambda: os.fsync(fd1)))
print("fsync-reader", rc(lambda: os.fsync(reader)))
# What the writer writes after the refusal is kept.
os.pwrite(fd1, b"C" * 100, 2000)
print("close-other", rc(lambda: os.close(fd1)))
print("close-over", rc(lambda: os.close(fd2)))
os.close(reader)

# The other writer learns it at its close when it never fsyncs.
path = fresh("by-close")
fd1 = os.open(path, os.O_WRONLY)
fd2 = os.open(path, os.O_WRONLY)
os.pwrite(fd1, b"A" * 100, 1000)
over_quota(fd2)
print("close-over", rc(lambda: os.close(fd2)))
print("close-other", rc(lambda: os.close(fd1)))

# ... or at its next write, which writes nothing; the write after it goes through.
path = fresh("by-write")
fd1 = os.open(path, os.O_WRONLY)
fd2 = os.open(path, os.O_WRONLY)
os.pwrite(fd1, b"A" * 100, 1000)
over_quota(fd2)
print("fsync-over", rc(lambda: os.fsync(fd2)))
print("write-other", rc(lambda: os.pwrite(fd1, b"D" * 100, 3000)))
print("write-other-again", rc(lambda: os.pwrite(fd1, b"E" * 100, 4000)))
print("fsync-other", rc(lambda: os.fsync(fd1)))
os.close(fd1)
os.close(fd2)

