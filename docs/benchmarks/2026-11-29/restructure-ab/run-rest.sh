#!/bin/bash
# The other eleven benchmarks before (4ed28b6) and after (6c9d14d) the restructuring of the
# crates, alternated B A B A, each on a short setting (what is compared is the two builds, not
# the figures of record). /tmp/calm-dirattrs2 and /tmp/calm-after2 are the release builds.
# usage: run-rest.sh OUT_DIR
out=$1; mkdir -p "$out"; cd "$out" || exit 1
work=$(mktemp -d /tmp/ba-rest.XXXX)
for round in 1 2; do
  for which in before after; do
    case $which in before) B=/tmp/calm-dirattrs2;; after) B=/tmp/calm-after2;; esac
    run() { name=$1; shift; echo "$(date +%T) $which $round $name" >&2
            $B bench "$name" "$@" --json 2>/dev/null > "$name-$which-$round.json"; }
    run mount --files 5000 --threads 1,4 --lock-threads 1 --locks 1000,10000 --cap-seconds 5 --visibility-samples 5 --dir "$work"
    run data --seq-mib 256 --streams 1 --rand-mib 64 --rand-reads 2000 --files 2000 --threads 1,4 --increments 200 --dir "$work"
    run storm --mounts 500 --watchers 0,100 --creates 20000 --repeat 1 --dir "$work"
    run changelog --clients 4 --ops-per-client 1000 --ops-max 4000 --repeat 2 --dir "$work"
    run transport --stats 5000 --rounds 3 --dir "$work"
    run startup --files 20000 --repeat 2 --dir "$work"
    run appends --lines 5000 --rounds 2 --records 500 --dir "$work"
    run soak --minutes 2 --period-s 30 --dir "$work"
    run servers --servers 1,3 --files 2000 --lock-ops 10000 --pair-threads 8
    run churn --servers 1 --minutes 1 --period-s 20
    run clusters --clusters 1,2 --members 1 --clients 16 --seconds 5 --passes 1
  done
done
rm -rf "$work"
echo done > done.txt
