# usage: keys.sh BIN N  -> bytes and keys per empty file in etcd (1 member), through a mount
# (PHYSICAL=1: the compaction waits until etcd removed the old revisions: keys-physical.sh)
# Run inside a private mount namespace: unshare -m --propagation private keys.sh target/debug/calm 40000
BIN=$1; N=$2; D=$(mktemp -d /tmp/keys.XXXX); mkdir -p $D/a
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
PEER=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
etcd --data-dir $D/etcd --listen-client-urls http://127.0.0.1:$PORT --advertise-client-urls http://127.0.0.1:$PORT \
  --listen-peer-urls http://127.0.0.1:$PEER --initial-advertise-peer-urls http://127.0.0.1:$PEER \
  --initial-cluster default=http://127.0.0.1:$PEER > $D/etcd.log 2>&1 & E=$!
sleep 2
E2="etcdctl --endpoints=127.0.0.1:$PORT"
$BIN serve --store etcd://127.0.0.1:$PORT/m --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
base=$($E2 endpoint status -w json | python3 -c 'import json,sys;print(json.load(sys.stdin)[0]["Status"]["dbSize"])')
python3 - $D/a $N <<'PY'
import os, sys, threading
root, n = sys.argv[1], int(sys.argv[2])
def work(t):
    d = f"{root}/d{t}"
    os.mkdir(d)
    for i in range(n // 16):
        open(f"{d}/f{i}", "w").close()
ts = [threading.Thread(target=work, args=(t,)) for t in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
sleep 1
$E2 get --prefix m/ -w json > $D/all.json
python3 - $D/all.json $N <<'PY'
import json, sys, base64, collections
kvs = json.load(open(sys.argv[1])).get("kvs", [])
n = int(sys.argv[2])
by = collections.defaultdict(lambda: [0, 0, 0])
for kv in kvs:
    k = base64.b64decode(kv["key"]); v = base64.b64decode(kv.get("value", ""))
    tag = k[4:5].decode("latin1") if k.startswith(b"m/d/") else k[:6].decode("latin1", "replace")
    by[tag][0] += 1; by[tag][1] += len(k); by[tag][2] += len(v)
tk = sum(x[0] for x in by.values()); tb = sum(x[1] + x[2] for x in by.values())
print(f"{n} files: {tk} keys ({tk/n:.2f} per file), {tb} bytes of keys+values ({tb/n:.0f} per file)")
for tag, (c, kb, vb) in sorted(by.items(), key=lambda x: -(x[1][1] + x[1][2])):
    print(f"  {tag!r:10} {c:8} keys  {c/n:6.2f}/file  key {kb/max(c,1):6.1f} B  value {vb/max(c,1):6.1f} B  {(kb+vb)/n:7.1f} B/file")
PY
rev=$($E2 endpoint status -w json | python3 -c 'import json,sys;print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
if [ -z "$PHYSICAL" ]; then
$E2 compact $rev > /dev/null; $E2 defrag > /dev/null
after=$($E2 endpoint status -w json | python3 -c 'import json,sys;print(json.load(sys.stdin)[0]["Status"]["dbSize"])')
echo "etcd database: $base bytes before, $after after $N files (compacted and defragmented): $(( (after-base)/N )) bytes per file"
else
$E2 --command-timeout=600s compact --physical $rev >&2 || echo "compaction failed" >&2; $E2 --command-timeout=600s defrag >&2 || echo "defragmentation failed" >&2
status() { $E2 endpoint status -w json | python3 -c 'import json,sys;s=json.load(sys.stdin)[0]["Status"];print(s["dbSize"], s.get("dbSizeInUse", 0))'; }
read after inuse < <(status)
echo "etcd database: $base bytes before, $after after $N files (compacted and defragmented): $(( (after-base)/N )) bytes per file; in use $inuse: $(( inuse/N )) bytes per file"
fi
umount $D/a; kill $S; sleep 1; kill $E; wait $E 2>/dev/null; rm -rf $D
