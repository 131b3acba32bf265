#!/usr/bin/env bash
# Creates and unlinks of 1 000 files each by 4 processes, a directory each
# (../../2026-12-06/mount-threads/procs.py), through a mount of a server on a free local port,
# in a tree with an inode limit of 10 million (`calm quota set`), for each build named, ROUNDS
# rounds (3), the builds alternating; and the same without the limit. Each round: a fresh
# server and mount in a private mount namespace.
#   bench.sh SCRATCH_DIR NAME=BINARY...
set -euo pipefail
scratch=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
procs=$here/../../2026-12-06/mount-threads/procs.py
work=$(mktemp -d -p "$scratch"); trap 'rm -rf "$work"' EXIT
arm() {  # NAME BINARY LIMIT
    name=$1; binary=$(realpath "$2"); limit=$3
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir "$work/mnt" "$work/data"
    unshare -m bash -c '
        "$1" serve --data "$3" --listen 127.0.0.1:$4 > /dev/null 2>&1 & spid=$!; sleep 1
        "$1" mount "$2" --server 127.0.0.1:$4 > /dev/null 2>&1 & mpid=$!
        for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done
        mkdir "$2/t"
        [ "$5" = 0 ] || "$1" quota set /t --server 127.0.0.1:$4 --inodes "$5" > /dev/null
        sleep 0.5
        echo "$6 limit $5 $(python3 "$7" "$2/t" 4 1000 | awk "{printf \"%s_%s_per_s %s \", \$1, \$2, \$3}")"
        kill $mpid; wait $mpid || true; kill $spid; wait $spid || true' \
        _ "$binary" "$work/mnt" "$work/data" "$port" "$limit" "$name" "$procs"
    rm -rf "$work/mnt" "$work/data"
}
for round in $(seq "${ROUNDS:-3}"); do
    for spec in "$@"; do
        arm "${spec%%=*}" "${spec#*=}" 10000000
        arm "${spec%%=*}" "${spec#*=}" 0
    done
done
