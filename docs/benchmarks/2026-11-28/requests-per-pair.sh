# etcd requests per create+unlink through a mount of one server, from the server's own counts
# (`calm status --json`, "store"). usage (in a private mount namespace, e.g. unshare -m):
#   requests-per-pair.sh target/release/calm 300 etcd://HOST:PORT,HOST:PORT,HOST:PORT
BIN=$1; N=$2; URL=$3; D=$(mktemp -d /tmp/rt.XXXX); mkdir -p $D/a
$BIN serve --store "$URL/rt$$" --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
CALM_LOG=fuser=debug $BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
mkdir $D/a/d; sleep 1
st() { $BIN status --server unix:$D/data/calm.sock --json; }
st > $D/s0.json
python3 -c "
import os
for i in range($N):
    p='$D/a/d/f%d' % i
    open(p,'w').close(); os.unlink(p)
"
sleep 1
st > $D/s1.json
python3 - $D $N <<'PY'
import json,sys
d,n=sys.argv[1],int(sys.argv[2])
a=json.load(open(d+'/s0.json')); b=json.load(open(d+'/s1.json'))
print('requests', (b['requests']-a['requests'])/n, 'commits', (b['commits']-a['commits'])/n)
for k in b['store']:
    print(' ', k, round((b['store'][k]-a['store'].get(k,0))/n,2))
PY
umount $D/a; kill $S; sleep 1; rm -rf $D
