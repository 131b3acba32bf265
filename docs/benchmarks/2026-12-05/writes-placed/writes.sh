# fsync'd 4 KiB writes through two mounts of a namespace on etcd served by two servers:
# MODE one: both mounts on server A; MODE two: mount 1 on A, mount 2 on B.
# Each run on a fresh 3-member etcd cluster (scripts/etcd-cluster of this repository).
# With a sixth argument `db`, etcd's revision and database size are printed before it stops.
# usage (private mount ns): writes.sh BIN ETCD_CLUSTER_SCRIPT THREADS SECONDS MODE [db]
BIN=$1; EC=$2; T=$3; S=$4; MODE=$5; DB=${6:-}; D=$(mktemp -d /tmp/wr.XXXX)
URL=$($EC start $D/etcd) || exit 1
NS="$URL/wr"
start() { # name
  $BIN serve --store "$NS" --data $D/$1 --objects file://$D/objects --listen 127.0.0.1:0 > $D/$1.out 2> $D/$1.log & echo $! > $D/$1.pid
  for i in $(seq 200); do grep -q . $D/$1.out 2>/dev/null && break; sleep 0.05; done
}
start a; sleep 0.5; start b
A=$(head -1 $D/a.out | grep -o '127.0.0.1:[0-9]*'); B=$(head -1 $D/b.out | grep -o '127.0.0.1:[0-9]*')
[ "$MODE" = two ] && S2=$B || S2=$A
mkdir -p $D/m1 $D/m2
$BIN mount $D/m1 --server $A > $D/m1.log 2>&1 & M1=$!
$BIN mount $D/m2 --server $S2 > $D/m2.log 2>&1 & M2=$!
for i in $(seq 100); do mountpoint -q $D/m1 && mountpoint -q $D/m2 && break; sleep 0.1; done
if ! mountpoint -q $D/m1 || ! mountpoint -q $D/m2; then
  echo "writes.sh: the mounts did not come up (logs in $D)" >&2; $EC stop $D/etcd; exit 1
fi
sleep 1.5
python3 - $D/m1 $D/m2 $T $S <<'PY'
import os,sys,threading,time,random
m1,m2,T,S=sys.argv[1],sys.argv[2],int(sys.argv[3]),float(sys.argv[4])
os.mkdir(m1+"/w")
for i in range(2*T):
    fd=os.open(f"{m1}/w/f{i}",os.O_CREAT|os.O_WRONLY,0o644); os.ftruncate(fd,1<<20); os.close(fd)
time.sleep(1.5)
counts=[0]*(2*T); stop=time.time()+S; buf=os.urandom(4096)
def w(i):
    root=m1 if i<T else m2
    fd=os.open(f"{root}/w/f{i}",os.O_WRONLY); r=random.Random(i); n=0
    while time.time()<stop:
        os.pwrite(fd,buf,r.randrange(256)*4096); os.fsync(fd); n+=1
    os.close(fd); counts[i]=n
ths=[threading.Thread(target=w,args=(i,)) for i in range(2*T)]
t0=time.time(); [x.start() for x in ths]; [x.join() for x in ths]; el=time.time()-t0
print("fsyncs/s mount1 %.0f mount2 %.0f total %.0f" % (sum(counts[:T])/el, sum(counts[T:])/el, sum(counts)/el))
PY
echo "--- status a"; $BIN status --server $A 2>&1 | grep -i "conflict\|commits\b" | head -5
echo "--- status b"; $BIN status --server $B 2>&1 | grep -i "conflict\|commits\b" | head -5
if [ "$DB" = db ]; then
  EP=${URL#etcd://}; EP=${EP%%,*}; ETCDCTL_API=3 etcdctl --endpoints $EP endpoint status -w json | python3 -c "import json,sys; h=json.load(sys.stdin)[0][\"Status\"]; print(\"etcd revision\", h[\"header\"][\"revision\"], \"db bytes\", h[\"dbSize\"])"
fi
umount $D/m1 $D/m2; kill $(cat $D/a.pid) $(cat $D/b.pid); sleep 1
$EC stop $D/etcd; rm -rf $D
