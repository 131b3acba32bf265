#!/bin/bash
# Creates and unlinks by 16 processes, a directory each, through an embedded mount with 4, 8
# and 16 FUSE device reader threads and over io_uring, beside the same on ext4; three rounds,
# arms alternating. Usage: run.sh CALM EXT4_DIR [ROUNDS]
set -euo pipefail
calm=$(realpath "$1"); ext4=$2; rounds=${3:-3}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d "$ext4/calm-threads.XXXXXX")
trap 'umount "$work"/m-* 2>/dev/null || true; rm -rf "$work"' EXIT
uring=/sys/module/fuse/parameters/enable_uring
[ -w "$uring" ] && echo Y > "$uring"
arm() {
  local name=$1; shift
  mkdir -p "$work/m-$name"
  "$calm" mount --embedded "$work/st-$name" "$work/m-$name" "$@" > "$work/log-$name" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do mountpoint -q "$work/m-$name" && break; sleep 0.1; done
  echo "$name $(python3 "$here/procs.py" "$work/m-$name" 16 1000 | tr '\n' ' ')"
  umount "$work/m-$name"; wait "$pid"; rm -rf "$work/st-$name" "$work/m-$name"
}
for round in $(seq "$rounds"); do
  mkdir -p "$work/ext4"
  echo "ext4 $(python3 "$here/procs.py" "$work/ext4" 16 1000 | tr '\n' ' ')"
  rm -rf "$work/ext4"
  arm device-4 --fuse-threads 4
  arm device-8 --fuse-threads 8
  arm device-16 --fuse-threads 16
  arm io-uring --fuse-channel io-uring
done
