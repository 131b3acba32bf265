#!/usr/bin/env bash
# usage: memexp.sh BIN DIR MINUTES — a soak, with glibc's malloc_stats of the mounts printed
# (to the soak's stderr) at about minutes 1, MINUTES/2 and MINUTES-1.
set -u
BIN=$1; D=$2; M=$3
mkdir -p $D
T0=$(date +%s)
$BIN bench soak --minutes $M --dir $D --json > $D/soak.json 2> $D/soak.err &
S=$!
for at in 1 $((M/2)) $((M-1)); do
  while [ $(date +%s) -lt $((T0 + 20 + at*60)) ]; do sleep 5; done
  for pid in $(pgrep -f "$BIN mount" | head -2); do
    echo "=== minute $at mount $pid $(grep -E 'RssAnon' /proc/$pid/status)" >> $D/stats.txt
    timeout 60 gdb -p $pid -batch -ex 'call (void)malloc_stats()' > /dev/null 2>&1
  done
done
wait $S
