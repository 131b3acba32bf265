#!/usr/bin/env bash
# The rows passthrough and the writeback cache could change, in DIR, one after the other;
# prints one line of figures. Needs RECORDS (docs/benchmarks/2026-12-06) and TABLE
# (docs/benchmarks/2026-12-07/mount-table).
#   run.sh DIR
set -euo pipefail
d=$1
mkdir "$d/reread"; out="$(python3 "$RECORDS/mount-copies/reread.py" "$d/reread")"
rm -rf "$d/reread"
echo "$out $(python3 "$TABLE/seq.py" "$d/seq")"
