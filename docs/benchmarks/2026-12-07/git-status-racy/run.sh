#!/bin/bash
# run.sh WORK CALM: ext4, calm and calm --sync, 2 rounds (docs/benchmarks/tools/arms.sh).
set -e
work=$1; calm=$2; here=$(dirname "$(realpath "$0")")
run="$here/status.sh"
export REPO=${REPO:-$(git -C "$here" rev-parse --show-toplevel)}
source "$here/../../tools/arms.sh"
ROUNDS=2 all_arms calm="$calm" sync="$calm",--sync
