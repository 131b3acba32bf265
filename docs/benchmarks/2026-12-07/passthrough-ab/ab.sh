#!/usr/bin/env bash
# What FUSE passthrough buys the rows it could change (a small file read again, a 1 GiB write
# with fsync, its read with every cache dropped): the FUSE ceiling (libfuse's passthrough_hp
# over ext4, over io_uring) with passthrough and without, beside ext4 and calm over io_uring,
# ROUNDS rounds (3), the arms alternating.
#   ab.sh EXT4_DIR NAME=BINARY[,ARG...]...
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
uring=/sys/module/fuse/parameters/enable_uring
[ -w "$uring" ] && echo Y > "$uring"
RECORDS=$(cd "$here/../../2026-12-06" && pwd)
TABLE=$(cd "$here/../mount-table" && pwd)
export RECORDS TABLE
run="$here/run.sh"
# shellcheck source=../../tools/arms.sh
. "$tools/arms.sh"
all_arms "$@"
