#!/usr/bin/env bash
# The table's workloads in DIR, one after the other; prints one line of figures. Needs BALL
# (the tarball), REPO (a git repository) and RECORDS (docs/benchmarks/2026-12-06).
#   run.sh DIR
set -euo pipefail
d=$1
now() { date +%s.%N; }
mkdir "$d/tar"; s=$(now); tar -xf "$BALL" -C "$d/tar"; e=$(now)
sync -f "$d"; s2=$(now); rm -rf "$d/tar"; e2=$(now)
out="tar_s $(echo "$e - $s" | bc) rm_s $(echo "$e2 - $s2" | bc)"
for procs in 4 16; do
    mkdir "$d/p$procs"
    out="$out $(python3 "$RECORDS/mount-threads/procs.py" "$d/p$procs" "$procs" 1000 \
        | awk '{printf "%s_%s_per_s %s ", $1, $2, $3}')"
    rm -rf "$d/p$procs"
done
mkdir "$d/reread"; out="$out$(python3 "$RECORDS/mount-copies/reread.py" "$d/reread")"
rm -rf "$d/reread"
mkdir "$d/programs"
out="$out $(python3 "$RECORDS/mount-programs/programs.py" "$REPO" "$d/programs")"
rm -rf "$d/programs"
echo "$out $(python3 "$(dirname "$0")/seq.py" "$d/seq")"
