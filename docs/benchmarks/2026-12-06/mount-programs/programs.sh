#!/usr/bin/env bash
# Programs a person runs (programs.py: sqlite, one writer, 1 000 transactions; `git clone` of
# the repository REPO; `git status` in it, twice) on ext4 and then on each arm (`calm mount
# --embedded` on a fresh store; for an arm named remote…, `calm mount --server` of a `calm
# serve` of its own on a free local port; or a passthrough_hp binary over a fresh directory on
# EXT4_DIR: the FUSE ceiling), each in a private mount namespace, ROUNDS rounds (3), the arms
# alternating.
#   REPO=DIR programs.sh EXT4_DIR NAME=BINARY[,ARG...]...
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
reader="$here/programs.py"; repo=$(realpath "${REPO:?REPO names a git repository}")
ext4_arm() {
    mkdir "$work/x"; echo "ext4 $(python3 "$reader" "$work/x" "$repo")"; rm -rf "$work/x"
}
calm_arm() {  # NAME BINARY ARGS...
    name=$1; binary=$(realpath "$2"); shift 2
    mnt="$work/mnt-$name"; data="$work/data-$name"; mkdir "$mnt"
    server=:
    if [ "$(basename "$binary")" = passthrough_hp ]; then
        mkdir "$data"; start='"$1" --foreground "${@:6}" "$3" "$2"'
    elif [ "${name#remote}" != "$name" ]; then
        # A server of its own (`calm serve`) on a free local port, the mount its client.
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        server='"$1" serve --data "$3" --listen 127.0.0.1:'$port' > /dev/null 2>&1 & spid=$!; sleep 1'
        start='"$1" mount "$2" --server 127.0.0.1:'$port' "${@:6}"'
    else
        start='"$1" mount "$2" --embedded "$3" "${@:6}"'
    fi
    REPO=$repo unshare -m bash -c "spid=; $server; $start"' > /dev/null 2>&1 & pid=$!
        for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done
        mkdir "$2/x"; echo "$5 $(python3 "$4" "$2/x" "$REPO")"
        kill $pid; wait $pid || true
        [ -z "$spid" ] || { kill $spid; wait $spid || true; }' _ "$binary" "$mnt" "$data" "$reader" "$name" "$@"
    rm -rf "$mnt" "$data"
}
for round in $(seq "${ROUNDS:-3}"); do
    ext4_arm
    for arm in "$@"; do
        IFS=, read -r -a spec <<< "${arm#*=}"
        calm_arm "${arm%%=*}" "${spec[@]}"
    done
done
