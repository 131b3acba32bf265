#!/bin/bash
# usage (in a private mount namespace): sqlite-two-mounts.sh BIN N — one server, two mounts,
# one sqlite writer (rollback journal, endurance.py) on each doing N transactions; prints the
# seconds the 2N took and the check of every row.
set -e
B=$1
P=$(dirname "$0")/../../../crates/calm/tests/programs/endurance.py
D=$(mktemp -d /tmp/sqlite-two.XXXX)
mkdir -p $D/a $D/b
$B serve --data $D/data > $D/serve.out 2>$D/serve.err &
SP=$!
for i in $(seq 50); do grep -q serving $D/serve.out 2>/dev/null && break; sleep 0.2; done
ADDR=$(head -1 $D/serve.out | sed 's/.*serving on //' | awk '{print $1}')
$B mount $D/a --server $ADDR > $D/a.out 2>$D/a.err &
A=$!
$B mount $D/b --server $ADDR > $D/b.out 2>$D/b.err &
Bp=$!
sleep 2
python3 $P sqlite-init $D/a/app.db
START=$(date +%s.%N)
python3 $P sqlite $D/a/app.db w0 $2 &
W0=$!
python3 $P sqlite $D/b/app.db w1 $2 &
W1=$!
wait $W0 $W1
END=$(date +%s.%N)
echo "elapsed $(echo "$END - $START" | bc)"
python3 $P check-sqlite $D/a/app.db w0:$2 w1:$2
kill $A $Bp; sleep 1; kill $SP; wait
rm -rf $D
