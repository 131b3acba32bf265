# Creates+unlinks per second through a mount of one server on etcd at THREADS threads (one
# directory each), and the CPU each process spent per pair. usage (in a private mount
# namespace): pairs-cpu.sh BIN etcd://HOST:PORT,... THREADS SECONDS (URL "-": the server's
# local store instead, as ../2026-11-29/pairs-cpu-local.sh runs it)
BIN=$1; URL=$2; T=$3; SECS=$4; D=$(mktemp -d /tmp/pr.XXXX); mkdir -p $D/a
if [ "$URL" = - ]; then store=(); else store=(--store "$URL/pr$$"); fi
$BIN serve "${store[@]}" --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
for t in $(seq $T); do mkdir -p $D/a/d$t; done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
ecpu() { for p in $(pgrep -x etcd); do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd+ | bc; }
s0=$(cpu $S); m0=$(cpu $M); e0=$(ecpu); t0=$(date +%s.%N)
python3 - $D/a $T $SECS <<'PY' > $D/count
import os,sys,threading,time
root,T,secs=sys.argv[1],int(sys.argv[2]),float(sys.argv[3])
end=time.time()+secs; counts=[0]*T
def w(t):
    i=0
    while time.time()<end:
        p=f"{root}/d{t+1}/f{i}"
        fd=os.open(p,os.O_CREAT|os.O_EXCL|os.O_WRONLY,0o644); os.close(fd); os.unlink(p); i+=1
    counts[t]=i
ths=[threading.Thread(target=w,args=(t,)) for t in range(T)]
[x.start() for x in ths]; [x.join() for x in ths]
print(sum(counts))
PY
t1=$(date +%s.%N); s1=$(cpu $S); m1=$(cpu $M); e1=$(ecpu)
n=$(cat $D/count); el=$(echo "$t1-$t0" | bc)
echo "pairs $n in $el s: $(echo "$n/$el" | bc) /s; cpu ms per pair: server $(echo "scale=3; ($s1-$s0)*10/$n" | bc) mount $(echo "scale=3; ($m1-$m0)*10/$n" | bc) etcd(3) $(echo "scale=3; ($e1-$e0)*10/$n" | bc)"
umount $D/a; kill $S; sleep 1; rm -rf $D
