"""A sequential write of 1 GiB in 1 MiB writes, with fsync, then a read of it with every
cache of the machine dropped (seq.py PATH). Prints `seq_write_fsync_mb_s W seq_read_cold_mb_s
R` (MB: 10^6 bytes)."""
import os
import sys
import time

path, block, count = sys.argv[1], os.urandom(1 << 20), 1024
started = time.time()
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
for _ in range(count):
    os.write(fd, block)
os.fsync(fd)
os.close(fd)
wrote = time.time() - started
with open("/proc/sys/vm/drop_caches", "w") as caches:
    caches.write("3\n")
started = time.time()
fd = os.open(path, os.O_RDONLY)
while os.read(fd, 1 << 20):
    pass
os.close(fd)
read = time.time() - started
os.unlink(path)
mb = count * len(block) / 1e6
print("seq_write_fsync_mb_s %.0f seq_read_cold_mb_s %.0f" % (mb / wrote, mb / read))
