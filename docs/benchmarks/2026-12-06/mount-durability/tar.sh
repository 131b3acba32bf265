#!/usr/bin/env bash
# tar -x and rm -rf of 3 000 files of 1-16 KiB in 50 directories: ext4, then calm mount
# --embedded over the FUSE device, over io_uring, and with --sync, three times each, the arms
# alternating. Each calm arm mounts in a private mount namespace.
#   tar.sh CALM EXT4_DIR
set -euo pipefail
calm=${1:?}; ext4=${2:?}
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
python3 - "$work/src" <<'PY'
import os, random, sys
random.seed(1)
root = sys.argv[1]
for d in range(50):
    os.makedirs(f"{root}/t/d{d}", exist_ok=True)
    for f in range(60):
        with open(f"{root}/t/d{d}/f{f}", "wb") as out:
            out.write(os.urandom(random.randint(1024, 16384)))
PY
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
[ -w /sys/module/fuse/parameters/enable_uring ] && echo Y > /sys/module/fuse/parameters/enable_uring
now() { date +%s.%N; }
ext4_arm() {
    mkdir "$work/x"; s=$(now); tar -xf "$work/ball.tar" -C "$work/x"; e=$(now)
    sync; s2=$(now); rm -rf "$work/x"; e2=$(now)
    echo "ext4 tar_s $(echo "$e - $s" | bc) rm_s $(echo "$e2 - $s2" | bc)"
}
calm_arm() {  # NAME ARGS...
    name=$1; shift
    mnt="$work/mnt-$name"; data="$work/data-$name"; mkdir "$mnt"
    unshare -m bash -c '
        "$1" mount "$2" --embedded "$3" "${@:6}" > /dev/null 2>&1 & pid=$!
        for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done
        mkdir "$2/x"; s=$(date +%s.%N); tar -xf "$4" -C "$2/x"; e=$(date +%s.%N)
        s2=$(date +%s.%N); rm -rf "$2/x"; e2=$(date +%s.%N)
        echo "$5 tar_s $(echo "$e - $s" | bc) rm_s $(echo "$e2 - $s2" | bc)"
        kill $pid; wait $pid' _ "$calm" "$mnt" "$data" "$work/ball.tar" "$name" "$@"
    rm -rf "$mnt" "$data"
}
for round in 1 2 3; do
    ext4_arm
    calm_arm device --fuse-channel device
    calm_arm io-uring --fuse-channel io-uring
    calm_arm sync --sync
done
