#!/bin/sh
# As run.sh, but prints each phase's CPU time per operation (microseconds, the process's
# user and system time over every thread: `calm bench quota`'s cpu_us_per_op) instead of its
# rate: lines "arm op quotas cpu_us_per_op". Both binaries must report it.
# Usage: run-cpu.sh A_BINARY B_BINARY ROUNDS > results.txt   (A/A: give the same binary twice)
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
    print('$arm', x['op'], x['quotas'], round(x['cpu_us_per_op'], 3))
"
  done
done
