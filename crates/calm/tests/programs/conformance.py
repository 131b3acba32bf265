#!/usr/bin/env python3
"""File operations whose results and errno are compared between calm and tmpfs.

Usage: conformance.py DIR. Runs every case in a fresh subdirectory of DIR and prints one JSON
line per step: the step's name and either its result or the errno's name. Nothing printed
depends on the file system's own choices (inode numbers, times it picks itself).
"""
import errno
import json
import os
import stat
import sys

ROOT = sys.argv[1]
out = []


def step(name, fn):
    try:
        result = fn()
        out.append({"step": name, "ok": result if result is not None else True})
    except OSError as e:
        out.append({"step": name, "errno": errno.errorcode.get(e.errno, str(e.errno))})


def st(path, follow=True):
    s = os.stat(path) if follow else os.lstat(path)
    kind = stat.S_IFMT(s.st_mode)
    return {
        "type": {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
                 stat.S_IFIFO: "fifo"}.get(kind, oct(kind)),
        "mode": oct(stat.S_IMODE(s.st_mode)),
        "nlink": s.st_nlink if kind != stat.S_IFDIR else None,
        "size": s.st_size if kind == stat.S_IFREG else None,
        "uid": s.st_uid,
        "gid": s.st_gid,
    }


def write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
    fd = os.open(path, flags, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("latin-1")


os.umask(0o022)
d = os.path.join(ROOT, "conformance")
os.mkdir(d)
os.chdir(d)

# create and open
step("create excl", lambda: os.close(os.open("f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)))
step("create excl again", lambda: os.open("f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640))
step("create non-excl existing", lambda: os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600)))
step("stat new file", lambda: st("f"))
step("open missing", lambda: os.open("missing", os.O_RDONLY))
step("open missing parent", lambda: os.open("nodir/f", os.O_CREAT | os.O_WRONLY))
step("open file as dir", lambda: os.open("f/x", os.O_CREAT | os.O_WRONLY))
step("open dir for writing", lambda: os.open(".", os.O_WRONLY))
step("name too long", lambda: os.open("n" * 256, os.O_CREAT | os.O_WRONLY))
step("name of 255", lambda: os.close(os.open("n" * 255, os.O_CREAT | os.O_WRONLY)))

# data, sizes, truncate
step("write", lambda: write("data", b"hello world"))
step("read", lambda: read("data"))
step("append", lambda: write("data", b"!!", os.O_WRONLY | os.O_APPEND))
step("read after append", lambda: read("data"))
step("stat after append", lambda: st("data"))
step("truncate shrink", lambda: os.truncate("data", 5))
step("read after shrink", lambda: read("data"))
step("truncate grow", lambda: os.truncate("data", 8))
step("read after grow", lambda: read("data"))
step("o_trunc", lambda: os.close(os.open("data", os.O_WRONLY | os.O_TRUNC)))
step("stat after o_trunc", lambda: st("data"))
step("write at offset", lambda: (lambda fd: (os.pwrite(fd, b"xy", 10), os.close(fd)))(os.open("data", os.O_WRONLY)) and None)
step("read sparse", lambda: read("data"))
step("truncate dir", lambda: os.truncate(".", 0))
step("truncate negative", lambda: os.truncate("data", -1))

# chmod, chown, utimens
step("chmod", lambda: os.chmod("data", 0o4751))
step("stat after chmod", lambda: st("data"))
step("chown", lambda: os.chown("data", 1234, 5678))
step("stat after chown", lambda: st("data"))
step("chown uid only", lambda: os.chown("data", 42, -1))
step("stat after chown uid", lambda: st("data"))
step("utimens", lambda: os.utime("data", ns=(1_000_000_123, 2_000_000_456)))
step("times after utimens", lambda: [os.stat("data").st_atime_ns, os.stat("data").st_mtime_ns])
step("utimens missing", lambda: os.utime("missing", ns=(1, 2)))

# directories
step("mkdir", lambda: os.mkdir("dir", 0o750))
step("stat dir", lambda: st("dir"))
step("mkdir existing", lambda: os.mkdir("dir"))
step("mkdir over file", lambda: os.mkdir("data"))
step("mkdir in missing", lambda: os.mkdir("nodir/sub"))
step("mkdir in file", lambda: os.mkdir("data/sub"))
step("file in dir", lambda: write("dir/inner", b"x"))
step("rmdir non-empty", lambda: os.rmdir("dir"))
step("rmdir file", lambda: os.rmdir("data"))
step("rmdir missing", lambda: os.rmdir("missing"))
step("rmdir dot", lambda: os.rmdir("dir/."))
step("unlink dir", lambda: os.unlink("dir"))
step("unlink missing", lambda: os.unlink("missing"))
step("listdir", lambda: sorted(os.listdir("dir")))
step("unlink inner", lambda: os.unlink("dir/inner"))
step("rmdir empty", lambda: os.rmdir("dir"))
step("listdir after", lambda: sorted(os.listdir(".")))

# rename
write("a", b"A")
write("b", b"B")
os.mkdir("d1")
os.mkdir("d2")
write("d2/x", b"X")
os.mkdir("d3")
step("rename over file", lambda: os.rename("a", "b"))
step("after rename over", lambda: [os.path.exists("a"), read("b")])
step("rename missing", lambda: os.rename("a", "c"))
step("rename dir over non-empty dir", lambda: os.rename("d1", "d2"))
step("rename dir over empty dir", lambda: os.rename("d1", "d3"))
step("after dir over dir", lambda: sorted(os.listdir(".")))
step("rename dir over file", lambda: os.rename("d3", "b"))
step("rename file over dir", lambda: os.rename("b", "d2"))
step("rename dir into itself", lambda: os.rename("d2", "d2/sub"))
step("rename to same name", lambda: os.rename("b", "b"))
step("rename into missing dir", lambda: os.rename("b", "nodir/b"))
step("rename across dirs", lambda: os.rename("b", "d2/b"))
step("after across", lambda: [sorted(os.listdir(".")), sorted(os.listdir("d2"))])

# renameat2 flags
import ctypes

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_NOREPLACE, RENAME_EXCHANGE = -100, 1, 2


def renameat2(old, new, flags):
    if _libc.renameat2(AT_FDCWD, old.encode(), AT_FDCWD, new.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


write("p", b"P")
write("q", b"Q")
step("rename noreplace onto existing", lambda: renameat2("p", "q", RENAME_NOREPLACE))
step("rename noreplace to new", lambda: renameat2("p", "p2", RENAME_NOREPLACE))
step("rename exchange", lambda: renameat2("p2", "q", RENAME_EXCHANGE))
step("after exchange", lambda: [read("p2"), read("q")])
step("rename exchange with missing", lambda: renameat2("p2", "nothere", RENAME_EXCHANGE))
step("rename exchange file and dir", lambda: renameat2("q", "d2", RENAME_EXCHANGE))
step("after file-dir exchange", lambda: [st("q")["type"], st("d2")["type"], sorted(os.listdir("q"))])
step("rename both flags", lambda: renameat2("p2", "q", RENAME_NOREPLACE | RENAME_EXCHANGE))
step("exchange back", lambda: renameat2("q", "d2", RENAME_EXCHANGE))
step("after exchange back", lambda: [st("q")["type"], sorted(os.listdir("d2"))])

# links
step("link", lambda: os.link("d2/b", "hard"))
step("nlink after link", lambda: [st("hard")["nlink"], st("d2/b")["nlink"]])
step("link existing", lambda: os.link("d2/b", "hard"))
step("link dir", lambda: os.link("d2", "dirlink"))
step("link missing", lambda: os.link("missing", "l2"))
step("rename hard link onto its twin", lambda: os.rename("hard", "d2/b"))
step("after twin rename", lambda: [os.path.exists("hard"), st("d2/b")["nlink"]])
step("unlink one link", lambda: os.unlink("hard") if os.path.exists("hard") else None)
step("nlink after unlink", lambda: st("d2/b")["nlink"])
step("symlink", lambda: os.symlink("d2/b", "sym"))
step("readlink", lambda: os.readlink("sym"))
step("lstat symlink", lambda: st("sym", follow=False)["type"])
step("read through symlink", lambda: read("sym"))
step("symlink existing", lambda: os.symlink("x", "sym"))
step("readlink of file", lambda: os.readlink("d2/b"))
step("dangling symlink", lambda: os.symlink("nowhere", "dangling"))
step("open dangling", lambda: os.open("dangling", os.O_RDONLY))
step("mkfifo", lambda: os.mkfifo("fifo", 0o600))
step("stat fifo", lambda: st("fifo"))

# an unlinked file stays usable through an open descriptor
def unlinked_open():
    write("tmp", b"still here")
    fd = os.open("tmp", os.O_RDWR)
    os.unlink("tmp")
    os.pwrite(fd, b"!", 10)
    data = os.pread(fd, 100, 0).decode()
    nlink = os.fstat(fd).st_nlink
    os.close(fd)
    return [data, nlink, os.path.exists("tmp")]
step("unlinked but open", unlinked_open)

# extended attributes
step("setxattr", lambda: os.setxattr("d2/b", "user.k", b"v1"))
step("getxattr", lambda: os.getxattr("d2/b", "user.k").decode())
step("setxattr create existing", lambda: os.setxattr("d2/b", "user.k", b"v2", os.XATTR_CREATE))
step("setxattr replace missing", lambda: os.setxattr("d2/b", "user.m", b"v", os.XATTR_REPLACE))
step("listxattr", lambda: sorted(os.listxattr("d2/b")))
step("getxattr missing", lambda: os.getxattr("d2/b", "user.m"))
step("removexattr", lambda: os.removexattr("d2/b", "user.k"))
step("removexattr missing", lambda: os.removexattr("d2/b", "user.k"))
# The largest value Linux takes: the request carrying it must fit the mount's read buffer.
step("setxattr 64 KiB", lambda: os.setxattr("d2/b", "user.big", b"x" * 65536))
step("getxattr 64 KiB", lambda: len(os.getxattr("d2/b", "user.big")))
step("removexattr 64 KiB", lambda: os.removexattr("d2/b", "user.big"))

for line in out:
    print(json.dumps(line, sort_keys=True))
