#!/usr/bin/env bash
# usage: mount-heaptrack.sh BIN DIR ATTACH_MIN KILL_MIN — a soak, with heaptrack attached to its
# first mount from minute ATTACH_MIN; the mount is killed (-9) at KILL_MIN, so heaptrack's
# "leaked" is what was allocated since the attach and still live then. Ends the soak.
set -u
BIN=$1; D=$2; AT=$3; KILL=$4
mkdir -p $D; cd $D
T0=$(date +%s)
$BIN bench soak --minutes $((KILL+2)) --dir $D --json > $D/soak.json 2> $D/soak.err &
S=$!
at_minute() { while [ $(date +%s) -lt $((T0 + 20 + $1*60)) ]; do sleep 2; done; }
at_minute $AT
M=$(pgrep -f "$BIN mount" | head -1)
echo "mount $M $(grep RssAnon /proc/$M/status)" > $D/ht.txt
heaptrack -p $M > $D/heaptrack.out 2>&1 &
H=$!
at_minute $KILL
echo "kill at $KILL $(grep RssAnon /proc/$M/status)" >> $D/ht.txt
kill -9 $M
wait $H
sleep 5
kill $S 2>/dev/null; sleep 10; pkill -f "$BIN mount"; pkill -f "$BIN serve"; wait
ls $D >> $D/ht.txt
