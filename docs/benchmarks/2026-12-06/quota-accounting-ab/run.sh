#!/bin/sh
# A/B of two calm binaries on `calm bench quota` (creates, 4 KiB writes and unlinks by an
# unprivileged caller under five limits, and without): runs A and B in turn, ROUNDS times
# each, and prints every run's rates as JSON lines "arm op quotas ops_per_sec".
# FIELD (default ops_per_sec) is the figure printed: cpu_us_per_op prints each phase's CPU time
# per operation instead (both binaries must report it).
# Usage: run.sh A_BINARY B_BINARY ROUNDS [FIELD] > results.txt   (A/A: the same binary twice)
set -eu
a=$1 b=$2 rounds=$3 field=${4:-ops_per_sec}
for i in $(seq "$rounds"); do
  for arm in A B; do
    bin=$a; [ "$arm" = B ] && bin=$b
    "$bin" bench quota --files 20000 --pairs 2 --json 2>/dev/null |
      python3 -c "
import json, sys
r = json.load(sys.stdin)
for x in r['results']:
    print('$arm', x['op'], x['quotas'], round(x['$field'], 3))
"
  done
done
