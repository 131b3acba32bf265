#!/usr/bin/env bash
# Same-run comparison of etcd history kept 60 s and 300 s: two servers, no trash, 8 minutes
# each, a fresh 3-member cluster per run, in the order 60, 300, 300, 60.
# Usage (from the repository, in a private mount namespace): history-ab.sh CALM OUTDIR
set -euo pipefail
calm=$1 out=$2
mkdir -p "$out"
round=0
for h in 60 300 300 60; do
  round=$((round + 1))
  dir=$(mktemp -d /tmp/calm-etcd-hist.XXXXXX)
  url=$(scripts/etcd-cluster start "$dir")
  "$calm" bench churn --servers 2 --minutes 8 --trash-hours 0 \
    --store "$url?history-s=$h" --json > "$out/run$round-history$h.json" 2> "$out/run$round-history$h.txt" || true
  scripts/etcd-cluster stop "$dir"
  rm -rf "$dir"
done
