"""Lock-protected read-modify-write of shared records: the test of locks across mounts.

    increment.py FILE ITERATIONS RECORDS SEED

Each iteration takes an fcntl write lock on one record (8 bytes) of FILE, reads it, adds one and
writes it back, then unlocks. Processes on several mounts of one namespace running this at once
must end with every increment counted: the records' sum equals the iterations of all of them.
Prints "done N" when finished.
"""
import fcntl
import os
import random
import struct
import sys

path, iterations, records, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
fd = os.open(path, os.O_RDWR)
for _ in range(iterations):
    k = rng.randrange(records)
    fcntl.lockf(fd, fcntl.LOCK_EX, 8, 8 * k, os.SEEK_SET)
    (value,) = struct.unpack("<Q", os.pread(fd, 8, 8 * k).ljust(8, b"\0"))
    os.pwrite(fd, struct.pack("<Q", value + 1), 8 * k)
    fcntl.lockf(fd, fcntl.LOCK_UN, 8, 8 * k, os.SEEK_SET)
os.close(fd)
print("done", iterations, flush=True)
