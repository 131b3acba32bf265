"""Writes COUNT files of SIZE random bytes under DIR, one after another, each closed before the
next, and prints one line per file: "ok NAME SHA256" when every call succeeded, "err NAME
ERRNO" when one failed (the test then expects the file not to be trusted)."""

import hashlib
import os
import sys

top, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(count):
    name = f"w{i:05d}"
    data = os.urandom(size)
    try:
        fd = os.open(os.path.join(top, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        print(f"ok {name} {hashlib.sha256(data).hexdigest()}", flush=True)
    except OSError as error:
        print(f"err {name} {error.errno}", flush=True)
