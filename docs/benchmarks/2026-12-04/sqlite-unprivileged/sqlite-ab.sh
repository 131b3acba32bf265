#!/usr/bin/env bash
# sqlite transactions (rollback journal, TRUNCATE) through mounts of one server, written by an
# unprivileged user (uid 65534) or by root, with two builds of calm in turn:
#   sqlite-ab.sh OLD_CALM NEW_CALM [ROUNDS] [TRANSACTIONS_PER_WRITER]
# For each round, build and case (one mount and one writer; two mounts and one writer on each;
# one mount and one writer as root): seconds per 1 000 transactions, and the server's requests
# per transaction by kind (from its --metrics endpoint). Needs root, fuse3, python3 (the
# system's) and curl. Everything it starts is stopped and removed when it ends.
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} n=${4:-1000}
program=$(cd "$(dirname "$0")/../../../.." && pwd)/crates/calm/tests/programs/endurance.py
work=$(mktemp -d /tmp/calm-sqlite-ab.XXXXXX)
chmod 755 "$work"
cleanup() {
  for m in "$work"/*/m?; do fusermount3 -u "$m" 2>/dev/null || true; done
  pkill -f "serve --data $work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run BIN CASE: prints "ms_per_tx requests_per_tx getxattr_per_tx"
run() {
  local bin=$1 case=$2 dir
  dir=$(mktemp -d "$work/run.XXXXXX"); chmod 755 "$dir"
  local metrics=127.0.0.1:$(free_port)
  "$bin" serve --data "$dir/data" --listen 127.0.0.1:0 --metrics "$metrics" > "$dir/serve.out" 2> "$dir/serve.err" &
  for _ in $(seq 200); do grep -q ready "$dir/serve.out" 2>/dev/null && break; sleep 0.05; done
  local addr; addr=$(head -1 "$dir/serve.out" | grep -oE '127\.0\.0\.1:[0-9]+' | head -1)
  local mounts=1; [ "$case" = two ] && mounts=2
  for m in $(seq "$mounts"); do
    mkdir "$dir/m$m"
    "$bin" mount "$dir/m$m" --server "$addr" --allow-other > "$dir/m$m.out" 2>&1 &
  done
  for m in $(seq "$mounts"); do
    for _ in $(seq 200); do mountpoint -q "$dir/m$m" && break; sleep 0.05; done
  done
  local as="setpriv --reuid=65534 --regid=65534 --clear-groups"
  [ "$case" = root ] && as=env
  mkdir "$dir/m1/db"; chown 65534:65534 "$dir/m1/db"
  $as /usr/bin/python3 - sqlite-init "$dir/m1/db/app.db" < "$program" > /dev/null
  local before; before=$(curl -s "http://$metrics/metrics" | awk '/^calm_server_requests_seconds_count/ && !/Meta\/(Lookup|GetAttr|SetAttr|Make|Link|Unlink|Rmdir|Rename|ReadMap|Write)"/ {s += $2} END {print s}')
  local start end pids=()
  start=$(date +%s.%N)
  for m in $(seq "$mounts"); do
    $as /usr/bin/python3 - sqlite "$dir/m$m/db/app.db" "w$m" "$n" < "$program" > "$dir/w$m.out" &
    pids+=($!)
  done
  wait "${pids[@]}"
  end=$(date +%s.%N)
  curl -s "http://$metrics/metrics" > "$dir/metrics.txt"
  local total=$((n * mounts))
  # A batch's calls are counted as their own kinds too: requests (round trips) are the rest.
  awk -v b="$before" -v t="$total" -v s="$start" -v e="$end" '
    /^calm_server_requests_seconds_count/ && !/Meta\/(Lookup|GetAttr|SetAttr|Make|Link|Unlink|Rmdir|Rename|ReadMap|Write)"/ { all += $2 }
    /^calm_server_requests_seconds_count\{op="calm.v1.Meta\/GetXattr"\}/ { x = $2 }
    END { printf "%.3f %.2f %.2f\n", (e - s) * 1000 / t, (all - b) / t, x / t }' "$dir/metrics.txt"
  for m in $(seq "$mounts"); do fusermount3 -u "$dir/m$m"; done
  pkill -f "serve --data $dir" || true
  wait 2>/dev/null || true
}

printf '%-5s %-5s %-5s %10s %14s %14s\n' round build case ms/tx requests/tx getxattr/tx
for round in $(seq "$rounds"); do
  for case in one two root; do
    for build in old new; do
      bin=$old; [ "$build" = new ] && bin=$new
      printf '%-5s %-5s %-5s %10s %14s %14s\n' "$round" "$build" "$case" $(run "$bin" "$case")
    done
  done
done
