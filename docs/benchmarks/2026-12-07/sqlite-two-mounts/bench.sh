#!/usr/bin/env bash
# Two sqlite writers of one database, N transactions each (1 000), each from its own mount of
# one server on a local port (`calm serve`, two `calm mount --server`), against two processes
# on ext4; the time from both starting to both ending per transaction of the two. ROUNDS (3),
# the arms alternating.   bench.sh EXT4_DIR CALM [NAME=CALM...]
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
n=${N:-1000}
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
pair() {  # DIR_A DIR_B: ms per transaction of the two writers of DIR_A/db (the same file)
    python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"); c.commit()' "$1/db"
    s=$(date +%s.%N)
    python3 "$here/writer.py" "$1/db" "$n" > /dev/null & a=$!
    python3 "$here/writer.py" "$2/db" "$n" > /dev/null & b=$!
    wait $a; wait $b; e=$(date +%s.%N)
    rows=$(python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM t").fetchone()[0])' "$1/db")
    [ "$rows" = $((2 * n)) ] || { echo "rows $rows, expected $((2 * n))" >&2; exit 1; }
    echo "ms_per_tx $(echo "($e - $s) * 1000 / (2 * $n)" | bc -l | xargs printf %.3f)"
}
export -f pair; export here n
for round in $(seq "${ROUNDS:-3}"); do
    mkdir "$work/x"; echo "ext4 $(pair "$work/x" "$work/x")"; rm -rf "$work/x"
    for spec in "$@"; do
        name=${spec%%=*}; binary=$(realpath "${spec#*=}")
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        mkdir "$work/a" "$work/b"
        unshare -m bash -c '
            "$1" serve --data "$2/data" --listen 127.0.0.1:$3 > /dev/null 2>&1 & spid=$!; sleep 1
            for m in a b; do "$1" mount "$2/$m" --server 127.0.0.1:$3 > /dev/null 2>&1 & done
            for m in a b; do for _ in $(seq 100); do mountpoint -q "$2/$m" && break; sleep 0.05; done; done
            echo "$4 $(pair "$2/a" "$2/b")"
            umount "$2/a" "$2/b"; sleep 0.5; kill $spid; wait $spid || true' _ "$binary" "$work" "$port" "$name"
        rm -rf "$work/a" "$work/b" "$work/data"
    done
done
