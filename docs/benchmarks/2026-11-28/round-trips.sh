# Round trips per create+unlink through a mount of one server on a 3-member etcd.
# usage (in a private mount namespace): round-trips.sh target/debug/calm 300 etcd://HOST:PORT,HOST:PORT,HOST:PORT
BIN=$1; N=$2; URL=$3; D=$(mktemp -d /tmp/rt.XXXX); mkdir -p $D/a
EP=$(echo $URL | sed 's|etcd://||; s|,.*||')
$BIN serve --store "$URL/rt$$" --data $D/data > $D/serve.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
CALM_LOG=fuser=debug $BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
mkdir $D/a/d; sleep 1
grpc() { for p in $(echo $URL | sed 's|etcd://||; s|,| |g'); do curl -s http://$p/metrics; done | grep '^grpc_server_handled_total' | awk '{split($0,a,"grpc_method=\""); split(a[2],b,"\""); m[b[1]]+=$NF} END {for (k in m) print k, m[k]}' | sort; }
grpc > $D/before.txt
r0=$($BIN status --server unix:$D/data/calm.sock --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["requests"])')
f0=$(grep -c "fuser::request" $D/a.log)
python3 -c "
import os
for i in range($N):
    p='$D/a/d/f%d' % i
    open(p,'w').close(); os.unlink(p)
"
sleep 1
r1=$($BIN status --server unix:$D/data/calm.sock --json | python3 -c 'import json,sys;print(json.load(sys.stdin)["requests"])')
f1=$(grep -c "fuser::request" $D/a.log)
grpc > $D/after.txt
echo "per create+unlink: FUSE requests $(echo "scale=2; ($f1-$f0)/$N" | bc), server requests $(echo "scale=2; ($r1-$r0)/$N" | bc)"
sed -n "$((f0+1)),\$p" $D/a.log | grep "fuser::request" | sed 's/\x1b\[[0-9;]*m//g' | sed -n 's/.*FUSE([0-9]*) ino [0-9a-fx]* \([A-Z_]*\).*/\1/p' | sort | uniq -c | awk -v n=$N '{printf "  %-10s %.2f\n", $2, $1/n}'
join -a1 $D/before.txt $D/after.txt | awk -v n=$N '{d=$3-$2; if (d>0) printf "  etcd %-12s %.2f per pair (all three members)\n", $1, d/n}'
umount $D/a; kill $S; sleep 1
