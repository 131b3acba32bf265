#!/bin/bash
# usage: mount-smaps.sh BIN DIR MINUTES — a soak; /proc/PID/smaps and the thread count of each
# mount at minutes 1, MINUTES/2 and MINUTES-1 (compare two with smaps-growth.py A B).
BIN=$1; D=$2; M=$3
T0=$(date +%s)
$BIN bench soak --minutes $M --dir $D --json > $D/soak.json 2> $D/soak.err &
S=$!
at_minute() { while [ $(date +%s) -lt $((T0 + 20 + $1*60)) ]; do sleep 2; done; }
for at in 1 $((M/2)) $((M-1)); do
  at_minute $at
  for pid in $(pgrep -f "$BIN mount" | head -2); do
    cp /proc/$pid/smaps $D/smaps.$pid.$at
    ls /proc/$pid/task | wc -l > $D/threads.$pid.$at
  done
done
wait $S
