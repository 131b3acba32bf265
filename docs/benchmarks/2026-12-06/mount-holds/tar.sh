#!/usr/bin/env bash
# tar -x and rm -rf of 3 000 files of 1-16 KiB in 50 directories (../../tools/small_tree.py):
# ext4, then each arm (`calm mount --embedded` on a fresh store; or, for a passthrough_hp
# binary (../../tools/passthrough-hp.sh), that FUSE file system over a fresh directory on
# EXT4_DIR: the FUSE ceiling), each in a private mount namespace, ROUNDS rounds (3), the arms
# alternating.
#   tar.sh EXT4_DIR NAME=BINARY[,ARG...]...
# e.g. tar.sh /var/tmp hold=./calm no-hold=./calm,--no-hold before=./calm-47c5574 \
#        ceiling=passthrough_hp,--nopassthrough ceiling-uring=passthrough_hp,--nopassthrough,-o,io_uring
set -euo pipefail
ext4=${1:?}; shift
tools=$(cd "$(dirname "$0")/../../tools" && pwd)
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
python3 "$tools/small_tree.py" "$work/src"
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
now() { date +%s.%N; }
ext4_arm() {
    mkdir "$work/x"; s=$(now); tar -xf "$work/ball.tar" -C "$work/x"; e=$(now)
    sync; s2=$(now); rm -rf "$work/x"; e2=$(now)
    echo "ext4 tar_s $(echo "$e - $s" | bc) rm_s $(echo "$e2 - $s2" | bc)"
}
calm_arm() {  # NAME BINARY ARGS...
    name=$1; binary=$(realpath "$2"); shift 2
    mnt="$work/mnt-$name"; data="$work/data-$name"; mkdir "$mnt"
    if [ "$(basename "$binary")" = passthrough_hp ]; then
        mkdir "$data"; start='"$1" --foreground "${@:6}" "$3" "$2"'
    else
        start='"$1" mount "$2" --embedded "$3" "${@:6}"'
    fi
    unshare -m bash -c "$start"' > /dev/null 2>&1 & pid=$!
        for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done
        mkdir "$2/x"; s=$(date +%s.%N); tar -xf "$4" -C "$2/x"; e=$(date +%s.%N)
        s2=$(date +%s.%N); rm -rf "$2/x"; e2=$(date +%s.%N)
        echo "$5 tar_s $(echo "$e - $s" | bc) rm_s $(echo "$e2 - $s2" | bc)"
        kill $pid; wait $pid || true' _ "$binary" "$mnt" "$data" "$work/ball.tar" "$name" "$@"
    rm -rf "$mnt" "$data"
}
for round in $(seq "${ROUNDS:-3}"); do
    ext4_arm
    for arm in "$@"; do
        IFS=, read -r -a spec <<< "${arm#*=}"
        calm_arm "${arm%%=*}" "${spec[@]}"
    done
done
