#!/usr/bin/env bash
# `calm bench churn` on a local 3-member etcd cluster started with a given bbolt freelist type.
#   churn-freelist.sh BIN TYPE SERVERS MINUTES OUT
# TYPE: array (etcd 3.4's default) or map (3.5's). Writes OUT.json, OUT.txt and OUT.svg.
set -euo pipefail
bin=$1 type=$2 servers=$3 minutes=$4 out=$5
dir=$(mktemp -d -t churn-freelist.XXXXXX)
trap 'while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$dir/pids"; rm -rf "$dir"' EXIT
read -r -a ports <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
cluster="" hosts=""
for i in 0 1 2; do cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$((i * 2 + 1))]}"; done
for i in 0 1 2; do
  client=http://127.0.0.1:${ports[$((i * 2))]} peer=http://127.0.0.1:${ports[$((i * 2 + 1))]}
  hosts+="${hosts:+,}127.0.0.1:${ports[$((i * 2))]}"
  etcd --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    --initial-cluster-token calm-test --max-txn-ops 32768 --max-request-bytes 8388608 \
    --heartbeat-interval 50 --election-timeout 500 --log-level warn \
    --experimental-backend-bbolt-freelist-type "$type" \
    >"$dir/m$i.log" 2>&1 </dev/null &
  echo $! >>"$dir/pids"
done
until ETCDCTL_API=3 etcdctl --endpoints="$hosts" --dial-timeout=1s endpoint health >/dev/null 2>&1; do
  sleep 0.2
done
"$bin" bench churn --servers "$servers" --minutes "$minutes" --store "etcd://$hosts" \
  --calm "$bin" --json --plot "$out.svg" >"$out.json" 2>"$out.txt"
