#!/usr/bin/env bash
# `calm bench mdtest` (creates, stats and unlinks by 16 and 64 clients in one directory,
# in-process and over gRPC, beside tmpfs) of each build in turn, ROUNDS rounds (5): one JSON
# line per run, prefixed by the arm's name. Then summarize.py.
#   ab.sh DIR NAME=BINARY...
set -euo pipefail
dir=${1:?}; shift
for round in $(seq "${ROUNDS:-5}"); do
    for spec in "$@"; do
        echo "${spec%%=*} $("${spec#*=}" bench mdtest --clients 16,64 --files 100000 --dir "$dir" --json 2>/dev/null)"
    done
done
