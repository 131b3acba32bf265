# usage: python3 one-call-costs.py FILE — the time of one lock call, a stat of an absent name,
# an fstat, a chown and a write+fdatasync on FILE (on a mount), each averaged over a loop.
import fcntl, os, sys, time, struct
p=sys.argv[1]
fd=os.open(p, os.O_RDWR|os.O_CREAT, 0o644)
n=2000
t=time.time()
for i in range(n):
    fcntl.lockf(fd, fcntl.LOCK_EX|fcntl.LOCK_NB, 1, 100)
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 100)
d=time.time()-t
print(f"setlk {d/n/2*1e6:.0f} us")
t=time.time()
for i in range(n):
    try: os.stat(p+"-nothere")
    except FileNotFoundError: pass
d=time.time()-t
print(f"negative stat {d/n*1e6:.0f} us")
t=time.time()
for i in range(n):
    os.fstat(fd)
d=time.time()-t
print(f"fstat {d/n*1e6:.0f} us")
t=time.time()
for i in range(500):
    os.fchown(fd, 0, 0)
d=time.time()-t
print(f"fchown {d/500*1e6:.0f} us")
t=time.time()
for i in range(500):
    os.pwrite(fd, b"x"*100, 0); os.fdatasync(fd)
d=time.time()-t
print(f"write+fdatasync {d/500*1e6:.0f} us")
