import os, sys, time
from multiprocessing import Process, Barrier
d = sys.argv[1]; procs = int(sys.argv[2]); n = int(sys.argv[3])
def work(i, b, op):
    own = f"{d}/p{i}"
    b.wait()
    if op == "create":
        for k in range(n):
            os.close(os.open(f"{own}/f{k}", os.O_CREAT | os.O_WRONLY, 0o644))
    else:
        for k in range(n):
            os.unlink(f"{own}/f{k}")
for i in range(procs): os.makedirs(f"{d}/p{i}", exist_ok=True)
for op in ["create", "unlink"]:
    b = Barrier(procs + 1)
    ps = [Process(target=work, args=(i, b, op)) for i in range(procs)]
    for p in ps: p.start()
    b.wait(); t = time.time()
    for p in ps: p.join()
    print(op, procs, round(procs * n / (time.time() - t)), "/s")
