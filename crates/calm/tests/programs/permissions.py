#!/usr/bin/env python3
"""Permission cases whose results are compared between calm and tmpfs.

Usage (as root): permissions.py DIR. For each actor (root; user A, uid 40001 without
supplementary groups; user B, uid 40002 in group 40010), builds the same tree in a fresh
subdirectory of DIR as root, then runs every case as the actor in a child process and prints
one JSON line per case: the actor, the case, and its result or the errno's name. Results hold
only what the file system decides (modes, owners, errno), never inode numbers or times.
"""
import errno
import os
import sys

import actors
from actors import A, B, GROUP, run_table, st, write

ROOT = sys.argv[1]


def build(top):
    """The tree every actor meets, made by root."""
    os.mkdir(top)
    os.chmod(top, 0o777)
    def f(name, uid, gid, mode, data=b"data"):
        p = os.path.join(top, name)
        write(p, data)
        os.chown(p, uid, gid)
        os.chmod(p, mode)
    def d(name, uid, gid, mode):
        p = os.path.join(top, name)
        os.mkdir(p)
        os.chown(p, uid, gid)
        os.chmod(p, mode)
    f("r600", 0, 0, 0o600)
    f("r644", 0, 0, 0o644)
    f("r666", 0, 0, 0o666)
    f("a600", A, A, 0o600)
    f("a644", A, A, 0o644)
    f("a-suid", A, GROUP, 0o6755)
    # Setuid and setgid files anyone may write: a write drops them as Linux decides.
    f("r-suid-sgid-gx", 0, GROUP, 0o6777)
    f("r-sgid", 0, GROUP, 0o2666)
    f("g660", 0, GROUP, 0o660)
    d("rdir700", 0, 0, 0o700)
    f("rdir700/f", 0, 0, 0o644)
    d("rdir755", 0, 0, 0o755)
    f("rdir755/f", 0, 0, 0o644)
    d("rdir711", 0, 0, 0o711)
    f("rdir711/f", 0, 0, 0o644)
    # Readable but not searchable by others: a listing shows names, not what they are.
    d("rdir744", 0, 0, 0o744)
    f("rdir744/f", 0, 0, 0o644)
    d("gdir770", 0, GROUP, 0o770)
    d("sticky", 0, 0, 0o1777)
    f("sticky/a", A, A, 0o644)
    f("sticky/b", B, B, 0o644)
    d("adir", A, A, 0o755)
    f("adir/f", A, A, 0o644)
    d("sgid", 0, GROUP, 0o2777)
    os.symlink("r644", os.path.join(top, "link"))
    os.setxattr(os.path.join(top, "a644"), "user.k", b"v")


def long_list(path):
    """`ls -l`: each name of a listing with its attributes, or why not."""
    out = []
    for name in sorted(os.listdir(path)):
        try:
            out.append([name, st(os.path.join(path, name))])
        except OSError as e:
            out.append([name, errno.errorcode[e.errno]])
    return out


def cases(top):
    p = lambda name: os.path.join(top, name)
    read = lambda name: actors.read(p(name))
    append = lambda name: actors.append(p(name))
    def create(name, mode=0o666):
        write(p(name), b"", mode)
        return st(p(name))
    def mkdir(name, mode=0o777):
        os.mkdir(p(name), mode)
        return st(p(name))
    def chmod(name, mode):
        os.chmod(p(name), mode)
        return st(p(name))
    def chown(name, uid, gid):
        os.chown(p(name), uid, gid)
        return st(p(name))
    def utime(name, times):
        os.utime(p(name), times)
        return True
    def write_fstat(name):
        """The mode fstat answers right after a write, before the close."""
        fd = os.open(p(name), os.O_WRONLY)
        try:
            os.write(fd, b"+")
            return oct(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
    def truncate(name):
        os.truncate(p(name), 1)
        return st(p(name))
    def setx(name, key):
        os.setxattr(p(name), key, b"x", follow_symlinks=False)
        return True
    def getx(name, key):
        return os.getxattr(p(name), key).decode()
    return [
        ("read r600", lambda: read("r600")),
        ("read r644", lambda: read("r644")),
        ("read a600", lambda: read("a600")),
        ("read g660", lambda: read("g660")),
        ("append r644", lambda: append("r644")),
        ("append r666", lambda: append("r666")),
        ("append g660", lambda: append("g660")),
        ("append a644", lambda: append("a644")),
        ("append a-suid", lambda: append("a-suid")),
        ("write then fstat r-suid-sgid-gx", lambda: write_fstat("r-suid-sgid-gx")),
        ("write then fstat r-sgid", lambda: write_fstat("r-sgid")),
        ("stat r-sgid after", lambda: st(p("r-sgid"))),
        ("truncate r644", lambda: truncate("r644")),
        ("truncate a644", lambda: truncate("a644")),
        ("lookup rdir700/f", lambda: st(p("rdir700/f"))),
        ("list rdir700", lambda: sorted(os.listdir(p("rdir700")))),
        ("lookup rdir711/f", lambda: st(p("rdir711/f"))),
        ("list rdir711", lambda: sorted(os.listdir(p("rdir711")))),
        ("list rdir744", lambda: sorted(os.listdir(p("rdir744")))),
        ("list -l rdir744", lambda: long_list(p("rdir744"))),
        ("list -l rdir755", lambda: long_list(p("rdir755"))),
        ("create in rdir755", lambda: create("rdir755/new")),
        ("create in gdir770", lambda: create("gdir770/new")),
        ("create in adir", lambda: create("adir/new")),
        ("unlink rdir755/f", lambda: os.unlink(p("rdir755/f"))),
        ("unlink adir/f", lambda: os.unlink(p("adir/f"))),
        ("rename rdir755/f", lambda: os.rename(p("rdir755/f"), p("moved"))),
        ("link r644 into adir", lambda: os.link(p("r644"), p("adir/l"))),
        ("unlink sticky/a", lambda: os.unlink(p("sticky/a"))),
        ("unlink sticky/b", lambda: os.unlink(p("sticky/b"))),
        ("rename sticky/b", lambda: os.rename(p("sticky/b"), p("sticky/c"))),
        ("create in sgid", lambda: create("sgid/new")),
        ("mkdir in sgid", lambda: mkdir("sgid/newdir")),
        ("chmod a644 0600", lambda: chmod("a644", 0o600)),
        ("chmod r644 0666", lambda: chmod("r644", 0o666)),
        ("chmod a644 g+s", lambda: chmod("a644", 0o2644)),
        ("chmod a-suid 04755", lambda: chmod("a-suid", 0o4755)),
        ("chown a644 to b", lambda: chown("a644", B, -1)),
        ("chgrp a644 to group", lambda: chown("a644", -1, GROUP)),
        ("chgrp a644 to own", lambda: chown("a644", -1, A)),
        ("chown a-suid to root", lambda: chown("a-suid", 0, -1)),
        ("utime a644 explicit", lambda: utime("a644", (1, 2))),
        ("utime r666 explicit", lambda: utime("r666", (1, 2))),
        ("utime r666 now", lambda: utime("r666", None)),
        ("utime r644 now", lambda: utime("r644", None)),
        ("setxattr user a644", lambda: setx("a644", "user.n")),
        ("getxattr user a644", lambda: getx("a644", "user.k")),
        ("getxattr user a600", lambda: getx("a600", "user.k")),
        ("setxattr user r644", lambda: setx("r644", "user.n")),
        ("setxattr trusted a644", lambda: setx("a644", "trusted.n")),
        ("setxattr security a644", lambda: setx("a644", "security.n")),
        ("setxattr user link", lambda: setx("link", "user.n")),
        ("rmdir adir", lambda: os.rmdir(p("adir"))),
        ("stat a-suid after", lambda: st(p("a-suid"))),
    ]


run_table(ROOT, "perm-", build, cases)
