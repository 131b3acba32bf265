#!/usr/bin/env bash
# Small files just written, read again: 1 000 files of 4 KiB written in one directory, then
# read again 5 times over (open, read 4 KiB, close; one thread), on ext4 and then on each arm
# (`calm mount --embedded` on a fresh store; for an arm named remote…, `calm mount --server`
# of a `calm serve` of its own on a free local port; or a passthrough_hp binary over a fresh
# directory on EXT4_DIR: the FUSE ceiling; ../../tools/arms.sh), each in a private mount
# namespace, ROUNDS rounds (3), the arms alternating. Prints opens per second of the reading.
#   reread.sh EXT4_DIR NAME=BINARY[,ARG...]...
# e.g. reread.sh /var/tmp copies=./calm no-copies=./calm,--no-copies \
#        ceiling=passthrough_hp,--nopassthrough
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
run="python3 $here/reread.py"
. "$here/../../tools/arms.sh"
all_arms "$@"
