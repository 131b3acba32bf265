# mdtest-like phases through a mount of one server: THREADS threads each create FILES files in
# a directory of its own, then unlink them; each phase's rate. usage (in a private mount
# namespace): phases.sh BIN etcd://HOST:PORT,... THREADS FILES
BIN=$1; URL=$2; T=$3; N=$4; D=$(mktemp -d /tmp/ph.XXXX); mkdir -p $D/a
$BIN serve --store "$URL/ph$$" --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
for t in $(seq $T); do mkdir -p $D/a/d$t; done
python3 - $D/a $T $N <<'PY'
import os,sys,threading,time
root,T,N=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
def phase(f):
    ths=[threading.Thread(target=f,args=(t,)) for t in range(T)]
    t0=time.time(); [x.start() for x in ths]; [x.join() for x in ths]; return T*N/(time.time()-t0)
def c(t):
    for i in range(N):
        fd=os.open(f"{root}/d{t+1}/f{i}",os.O_CREAT|os.O_EXCL|os.O_WRONLY,0o644); os.close(fd)
def u(t):
    for i in range(N): os.unlink(f"{root}/d{t+1}/f{i}")
print("creates/s %.0f" % phase(c)); print("unlinks/s %.0f" % phase(u))
PY
umount $D/a; kill $S; sleep 1; rm -rf $D
