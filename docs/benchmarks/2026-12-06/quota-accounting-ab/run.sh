#!/bin/sh
# A/B of two calm binaries on `calm bench quota` (creates, 4 KiB writes and unlinks by an
# unprivileged caller under five limits, and without): runs A and B in turn, ROUNDS times
# each, and prints every run's rates as JSON lines "arm op quotas ops_per_sec".
# Usage: run.sh A_BINARY B_BINARY ROUNDS > results.txt   (A/A: give the same binary twice)
set -eu
a=$1 b=$2 rounds=$3
for i in $(seq "$rounds"); do
  for arm in A B; do
    bin=$a; [ "$arm" = B ] && bin=$b
    "$bin" bench quota --files 20000 --pairs 2 --json 2>/dev/null |
      python3 -c "
import json, sys
r = json.load(sys.stdin)
for x in r['results']:
    print('$arm', x['op'], x['quotas'], round(x['ops_per_sec'], 1))
"
  done
done
