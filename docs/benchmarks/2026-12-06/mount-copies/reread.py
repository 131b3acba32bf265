"""Writes 1 000 files of 4 KiB in DIR, then reads each again 5 times over (open, read 4 KiB,
close; one thread); prints `opens_per_s N` of the reading."""
import os
import sys
import time

FILES, PASSES, SIZE = 1000, 5, 4096
d = sys.argv[1]
block = os.urandom(SIZE)
for i in range(FILES):
    with open(os.path.join(d, "f%04d" % i), "wb") as f:
        f.write(block)
names = [os.path.join(d, "f%04d" % i) for i in range(FILES)]
start = time.perf_counter()
for _ in range(PASSES):
    for name in names:
        fd = os.open(name, os.O_RDONLY)
        assert len(os.read(fd, SIZE)) == SIZE
        os.close(fd)
took = time.perf_counter() - start
print("opens_per_s %.0f" % (FILES * PASSES / took))
