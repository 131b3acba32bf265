#!/usr/bin/env python3
"""POSIX ACL cases whose results are compared between calm and tmpfs.

Usage (as root): acls.py DIR. As permissions.py does: for each actor (root; user A, uid 40001
without supplementary groups; user B, uid 40002 in group 40010), root builds the same tree of
files and directories with ACLs (set with setfacl, as a site would) in a fresh subdirectory of
DIR, then every case runs as the actor in a child process (umask 022) and prints one JSON line:
the actor, the case, and its result or the errno's name. Results hold only what the file
system decides (modes, owners, ACLs as getfacl prints them, errno).
"""
import errno
import fcntl
import os
import struct
import subprocess
import sys

import actors
from actors import A, B, GROUP, run_table, st, write

ROOT = sys.argv[1]


def setfacl(*args):
    subprocess.run(["setfacl", *args], check=True, capture_output=True)


def build(top):
    """The tree every actor meets, made by root."""
    os.mkdir(top)
    os.chmod(top, 0o777)

    def f(name, uid, gid, mode, acl=None):
        p = os.path.join(top, name)
        write(p)
        os.chown(p, uid, gid)
        os.chmod(p, mode)
        if acl:
            setfacl("-m", acl, p)

    def d(name, uid, gid, mode, acl=None, default=None):
        p = os.path.join(top, name)
        os.mkdir(p)
        os.chown(p, uid, gid)
        os.chmod(p, mode)
        if acl:
            setfacl("-m", acl, p)
        if default:
            setfacl("-d", "-m", default, p)

    # A's private file shared with B by name.
    f("a-shares-b", A, A, 0o600, f"u:{B}:rw")
    # Others may read, but B by name may not: the named entry comes first.
    f("r-denies-b", 0, 0, 0o644, f"u:{B}:---")
    # The group by name may write; the owning group and others nothing.
    f("r-group-rw", 0, 0, 0o600, f"g:{GROUP}:rw")
    # A by name may do all, but the mask lets only read through.
    f("r-mask-r", 0, 0, 0o600, f"u:{A}:rwx,m::r")
    # A's setgid file of a group A is not in: A's ACL change drops setgid.
    f("a-sgid", A, GROUP, 0o2660)
    f("a-plain", A, A, 0o644)
    # A directory only A (by name) may enter and change.
    d("r-dir-a", 0, 0, 0o700, f"u:{A}:rwx")
    write(os.path.join(top, "r-dir-a/f"))
    # A shared project directory: what is made in it takes its default ACL.
    d("project", 0, GROUP, 0o777, default=f"u:{B}:rw,g::rx,o::-")
    d("a-dir", A, A, 0o755)
    os.symlink("a-plain", os.path.join(top, "link"))


def getfacl(path):
    out = subprocess.run(["getfacl", "-n", "--omit-header", "-p", path],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise OSError(errno.EIO, out.stderr.strip())
    return out.stdout.strip().split("\n")


def acl_bytes(entries):
    """An ACL in the xattr form: (tag, perm, id) triples."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


UNDEFINED = 0xFFFFFFFF
# rw-r--r-- as an ACL: what the mode bits alone say.
MODE_ONLY = acl_bytes([(1, 6, UNDEFINED), (4, 4, UNDEFINED), (0x20, 4, UNDEFINED)])


def cases(top):
    p = lambda name: os.path.join(top, name)

    read = lambda name: actors.read(p(name))
    append = lambda name: actors.append(p(name))

    def create(name, mode=0o666):
        write(p(name), b"", mode)
        return [st(p(name)), getfacl(p(name))]

    def mkdir(name, mode=0o777):
        os.mkdir(p(name), mode)
        return [st(p(name)), getfacl(p(name))]

    def chmod(name, mode):
        os.chmod(p(name), mode)
        return [st(p(name)), getfacl(p(name))]

    def tool(name, *args):
        out = subprocess.run(["setfacl", *args, p(name)], capture_output=True, text=True)
        if out.returncode != 0:
            # setfacl prints the error; its text names the errno's message.
            for code, message in ((errno.EPERM, "Operation not permitted"),
                                  (errno.EACCES, "Permission denied"),
                                  (errno.EOPNOTSUPP, "Operation not supported")):
                if message in out.stderr:
                    raise OSError(code, message)
            raise OSError(errno.EIO, out.stderr.strip())
        return [st(p(name)), getfacl(p(name))]

    def lock(name):
        fd = os.open(p(name), os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return True
        finally:
            os.close(fd)

    def xattrs(name):
        return sorted(x for x in os.listxattr(p(name), follow_symlinks=False)
                      if x.startswith("system."))

    def setx(name, key, value):
        os.setxattr(p(name), key, value, follow_symlinks=False)
        return st(p(name))

    def removex(name, key):
        os.removexattr(p(name), key, follow_symlinks=False)
        return st(p(name))

    return [
        ("getfacl a-shares-b", lambda: getfacl(p("a-shares-b"))),
        ("read a-shares-b", lambda: read("a-shares-b")),
        ("append a-shares-b", lambda: append("a-shares-b")),
        ("lock a-shares-b", lambda: lock("a-shares-b")),
        ("read r-denies-b", lambda: read("r-denies-b")),
        ("read r-group-rw", lambda: read("r-group-rw")),
        ("append r-group-rw", lambda: append("r-group-rw")),
        ("lock r-group-rw", lambda: lock("r-group-rw")),
        ("read r-mask-r", lambda: read("r-mask-r")),
        ("append r-mask-r", lambda: append("r-mask-r")),
        ("list r-dir-a", lambda: sorted(os.listdir(p("r-dir-a")))),
        ("read r-dir-a/f", lambda: read("r-dir-a/f")),
        ("create in r-dir-a", lambda: create("r-dir-a/new")),
        ("unlink r-dir-a/f", lambda: os.unlink(p("r-dir-a/f"))),
        ("getfacl project", lambda: getfacl(p("project"))),
        ("create in project", lambda: create("project/file")),
        ("create 0600 in project", lambda: create("project/private", 0o600)),
        ("mkdir in project", lambda: mkdir("project/sub")),
        ("create in project/sub", lambda: create("project/sub/deeper")),
        ("mknod fifo in project", lambda: (os.mkfifo(p("project/fifo"), 0o666),
                                           st(p("project/fifo")))[1]),
        ("symlink in project", lambda: (os.symlink("file", p("project/link")),
                                        st(p("project/link")))[1]),
        ("create in a-dir", lambda: create("a-dir/plain")),
        ("setfacl -m a-plain", lambda: tool("a-plain", "-m", f"u:{B}:rw")),
        ("chmod a-plain 0640", lambda: chmod("a-plain", 0o640)),
        ("read a-plain", lambda: read("a-plain")),
        ("append a-plain", lambda: append("a-plain")),
        ("listxattr a-plain", lambda: xattrs("a-plain")),
        ("setfacl -m u::r a-plain", lambda: tool("a-plain", "-m", "u::r,o::r")),
        ("setfacl -x a-plain", lambda: tool("a-plain", "-x", f"u:{B}")),
        ("setfacl -b a-plain", lambda: tool("a-plain", "-b")),
        ("listxattr a-plain after", lambda: xattrs("a-plain")),
        ("setfacl -m a-sgid", lambda: tool("a-sgid", "-m", f"u:{B}:r")),
        ("setfacl -m r-denies-b", lambda: tool("r-denies-b", "-m", f"u:{A}:rw")),
        ("setfacl -d a-dir", lambda: tool("a-dir", "-d", "-m", f"u:{B}:rwx")),
        ("create in a-dir after", lambda: create("a-dir/inherits", 0o640)),
        ("setfacl -k a-dir", lambda: tool("a-dir", "-k")),
        ("set mode-only access a-dir", lambda: setx("a-dir", "system.posix_acl_access",
                                                    MODE_ONLY)),
        ("listxattr a-dir", lambda: xattrs("a-dir")),
        ("set default on a file", lambda: setx("a-plain", "system.posix_acl_default",
                                               MODE_ONLY)),
        ("remove default of a file", lambda: removex("a-plain", "system.posix_acl_default")),
        ("remove absent access ACL", lambda: removex("a-plain", "system.posix_acl_access")),
        ("set access ACL on link", lambda: setx("link", "system.posix_acl_access",
                                                MODE_ONLY)),
        ("set bad ACL", lambda: setx("a-plain", "system.posix_acl_access",
                                     acl_bytes([(1, 6, UNDEFINED), (2, 6, B)]))),
        ("chmod r-group-rw 0", lambda: chmod("r-group-rw", 0)),
    ]


run_table(ROOT, "acl-", build, cases, umask=0o022)
