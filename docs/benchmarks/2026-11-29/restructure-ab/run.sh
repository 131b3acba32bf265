#!/bin/bash
# Before (4ed28b6) and after (1c78f7d) the restructuring of the crates, alternated: B A B A.
# /tmp/calm-dirattrs2 and /tmp/calm-after are the release builds of those commits.
cd /tmp/ba
for round in 1 2; do
  for which in before after; do
    case $which in before) B=/tmp/calm-dirattrs2;; after) B=/tmp/calm-after;; esac
    $B bench mdtest --clients 1,4,16 --files 20000 --json 2>/dev/null > mdtest-$which-$round.json
    $B bench locks --sizes 1000,100000 --cap-seconds 5 --dir /tmp --json 2>/dev/null > locks-$which-$round.json
    $B bench activation --devices 1000,10000 --loop-devices 0 --json 2>/dev/null > activation-$which-$round.json
  done
done
echo done > done.txt
