# etcd requests and key writes per create+unlink through a mount of one server, at T threads
# (one directory each), from the server's `calm status --json` and the first member's /metrics.
# usage (in a private mount namespace): requests-per-pair-threads.sh BIN PAIRS etcd://HOST:PORT,... THREADS
BIN=$1; N=$2; URL=$3; T=$4; D=$(mktemp -d /tmp/rt.XXXX); mkdir -p $D/a
$BIN serve --store "$URL/rt$$" --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
for t in $(seq $T); do mkdir -p $D/a/d$t; done; sleep 1
st() { $BIN status --server unix:$D/data/calm.sock --json; }
st > $D/s0.json
EP=$(echo $URL | sed "s#etcd://##; s#,.*##"); em() { curl -s http://$EP/metrics | grep -E "^etcd_mvcc_(put|delete|txn|range)_total|^etcd_server_proposals_committed_total"; }
em > $D/e0
python3 - $D/a $T $N <<'PY'
import os,sys,threading
root,T,N=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
def w(t):
    for i in range(N//T):
        p=f"{root}/d{t+1}/f{i}"
        fd=os.open(p,os.O_CREAT|os.O_EXCL|os.O_WRONLY,0o644); os.close(fd); os.unlink(p)
ths=[threading.Thread(target=w,args=(t,)) for t in range(T)]
[x.start() for x in ths]; [x.join() for x in ths]
PY
sleep 1
st > $D/s1.json
em > $D/e1
paste $D/e0 $D/e1 | awk -v n=$N '{printf "  etcd %s %.2f\n", $1, ($4-$2)/n}'
python3 - $D $N <<'PY'
import json,sys
d,n=sys.argv[1],int(sys.argv[2])
a=json.load(open(d+'/s0.json')); b=json.load(open(d+'/s1.json'))
print('requests', (b['requests']-a['requests'])/n, 'commits', (b['commits']-a['commits'])/n)
for k in b['store']:
    print(' ', k, round((b['store'][k]-a['store'].get(k,0))/n,2))
PY
umount $D/a; kill $S; sleep 1; rm -rf $D
