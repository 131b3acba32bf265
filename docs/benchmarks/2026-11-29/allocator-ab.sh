#!/bin/bash
# What a counting global allocator costs calls through a mount: two embedded mounts, one from
# each build (A: with the allocator, B: without), measured in one `calm bench mount` run as
# two other file systems beside the bench's own calm mounts and tmpfs.
#   unshare -m --propagation private allocator-ab.sh BIN_A BIN_B OUT.json [FILES]
set -e
a=$1 b=$2 out=$3 files=${4:-20000}
dir=$(mktemp -d -t calm-allocator-ab.XXXXXX)
mkdir -p "$dir"/a/data "$dir"/a/mnt "$dir"/b/data "$dir"/b/mnt
"$a" mount --embedded "$dir"/a/data "$dir"/a/mnt > "$dir"/a/log 2>&1 &
pa=$!
"$b" mount --embedded "$dir"/b/data "$dir"/b/mnt > "$dir"/b/log 2>&1 &
pb=$!
trap 'umount "$dir"/a/mnt "$dir"/b/mnt 2>/dev/null; kill $pa $pb 2>/dev/null; wait; rm -rf "$dir"' EXIT
for _ in $(seq 50); do
    mountpoint -q "$dir"/a/mnt && mountpoint -q "$dir"/b/mnt && break
    sleep 0.2
done
"$b" bench mount --files "$files" --threads 1,4,16 --lock-threads 1 --locks 1000 \
    --visibility-samples 0 --dir "$dir" \
    --other counting="$dir"/a/mnt --other plain="$dir"/b/mnt --json > "$out"
