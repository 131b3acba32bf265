"""Opens PATH, unlinks it, and writes up to MIB mebibytes into it 1 MiB at a time, each write
followed by fsync, as a log kept open after its removal is written. Prints one line, JSON:
the bytes written and made durable before the first refusal, and that refusal's errno (null
when every MiB went in)."""
import json
import os
import sys

path, mib = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.unlink(path)
block = b"x" * (1 << 20)
done, refused = 0, None
for _ in range(mib):
    try:
        os.write(fd, block)
        os.fsync(fd)
    except OSError as e:
        refused = e.errno
        break
    done += len(block)
try:
    os.close(fd)
except OSError as e:
    refused = refused or e.errno
print(json.dumps({"durable": done, "errno": refused}))
