#!/usr/bin/env bash
# The mount's durability A/B: `calm bench mount` with the store's default (changes on the
# disk within 10 ms, or at fsync) and with --store-sync (every change on the disk before it
# is answered, as `calm serve --sync` and before this change), each beside ext4 and tmpfs in
# its own run, alternating twice. Then tar and rm -rf of 3 000 small files through
# `calm mount --embedded` over the FUSE device and over io_uring, beside ext4 (tar.sh).
#   run.sh CALM EXT4_DIR
set -euo pipefail
calm=${1:?calm binary}; ext4=${2:?a directory on ext4}
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2; do
    for arm in default store-sync; do
        extra=(); [ "$arm" = store-sync ] && extra=(--store-sync)
        "$calm" bench mount --files 10000 --threads 1,4,16 --lock-threads 1 --locks 1000 \
            --visibility-samples 5 --ext4-dir "$ext4" --programs --sqlite-writers 1 \
            --sqlite-rows 500 --tar-files 3000 "${extra[@]}" --json \
            > "$here/mount-$arm-$round.json"
    done
done
"$here/tar.sh" "$calm" "$ext4" > "$here/tar.txt"
