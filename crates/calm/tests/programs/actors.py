"""What the permission tables (permissions.py, acls.py) share: the actors, the helpers their
trees and cases use, and running a table's cases as each actor.

For each actor (root; user A, uid 40001 without supplementary groups; user B, uid 40002 in
group 40010), root builds the table's tree in a fresh subdirectory, then every case runs as the
actor in a child process, which prints one JSON line per case: the actor, the case, and its
result or the errno's name.
"""
import errno
import json
import os
import stat
import sys

A, B, GROUP = 40001, 40002, 40010
ACTORS = [("root", 0, 0, []), ("a", A, A, []), ("b", B, B, [GROUP])]


def write(path, data=b"data", mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as fh:
        return fh.read().decode()


def append(path):
    """One byte appended; the file's attributes after."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"+")
    finally:
        os.close(fd)
    return st(path)


def st(path):
    s = os.lstat(path)
    # A directory's size is the file system's own choice.
    size = s.st_size if stat.S_ISREG(s.st_mode) else None
    return {"mode": oct(s.st_mode), "uid": s.st_uid, "gid": s.st_gid, "size": size}


def run_as(actor, uid, gid, groups, cases, umask):
    """Runs `cases` (name, function) as the actor in a child; prints what each gave."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            if umask is not None:
                os.umask(umask)
            out = []
            for name, fn in cases:
                try:
                    result = fn()
                    out.append({"actor": actor, "case": name,
                                "ok": result if result is not None else True})
                except OSError as e:
                    out.append({"actor": actor, "case": name,
                                "errno": errno.errorcode.get(e.errno, str(e.errno))})
            os.write(w, "".join(json.dumps(o) + "\n" for o in out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    sys.stdout.write(data.decode())


def run_table(root, prefix, build, cases, umask=None):
    """For each actor: `build(top)` as root in ROOT/PREFIX-ACTOR, then `cases(top)` as it."""
    for actor, uid, gid, groups in ACTORS:
        top = os.path.join(root, prefix + actor)
        build(top)
        run_as(actor, uid, gid, groups, cases(top), umask)
