#!/usr/bin/env bash
# Programs a person runs (programs.py: sqlite, one writer, 1 000 transactions; `git clone` of
# the repository REPO; `git status` in it, twice) on ext4 and then on each arm (`calm mount
# --embedded` on a fresh store; for an arm named remote…, `calm mount --server` of a `calm
# serve` of its own on a free local port; or a passthrough_hp binary over a fresh directory on
# EXT4_DIR: the FUSE ceiling; ../../tools/arms.sh), each in a private mount namespace, ROUNDS
# rounds (3), the arms alternating.
#   REPO=DIR programs.sh EXT4_DIR NAME=BINARY[,ARG...]...
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
repo=$(realpath "${REPO:?REPO names a git repository}")
run="python3 $here/programs.py $repo"
. "$here/../../tools/arms.sh"
all_arms "$@"
