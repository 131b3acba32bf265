#!/usr/bin/env bash
# Every workload of the mount's table in one run (run.sh: tar -x and rm -rf of 3 000 small
# files, creates and unlinks by 4 and 16 processes, small files read again, sqlite, git clone
# and git status, a sequential write with fsync and a cold read of 1 GiB), on ext4 and then on
# each arm (../../tools/arms.sh: `calm mount --embedded` on a fresh store; an arm named
# remote… mounts a `calm serve` of its own on a free local port; a passthrough_hp binary is
# the FUSE ceiling over a fresh directory of EXT4_DIR), each in a private mount namespace,
# ROUNDS rounds (3), the arms alternating. FUSE over io_uring is switched on first.
#   REPO=DIR table.sh EXT4_DIR NAME=BINARY[,ARG...]...
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
uring=/sys/module/fuse/parameters/enable_uring
[ -w "$uring" ] && echo Y > "$uring"
python3 "$tools/small_tree.py" "$work/src"
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
BALL=$work/ball.tar REPO=$(realpath "${REPO:?REPO names a git repository}")
RECORDS=$(cd "$here/../../2026-12-06" && pwd)
export BALL REPO RECORDS
run="$here/run.sh"
# shellcheck source=../../tools/arms.sh
. "$tools/arms.sh"
all_arms "$@"
