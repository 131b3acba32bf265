# builds alternated: ab.sh OLD NEW ETCD_CLUSTER_SCRIPT ROUNDS SECONDS
OLD=$1; NEW=$2; EC=$3; R=$4; S=$5; HERE=$(dirname "$0")
for r in $(seq $R); do for t in 4 8; do for b in "$OLD" "$NEW"; do for m in one two; do
  echo "== round $r threads $t build $b mode $m"
  bash "$HERE/writes.sh" "$b" "$EC" $t $S $m 2>&1 | grep -E "fsyncs|store|writes.sh" | sed 's/, revision reads.*//'
done; done; done; done
