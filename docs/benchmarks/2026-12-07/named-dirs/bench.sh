#!/usr/bin/env bash
# Work in directories that existed before the mount came: each arm's store is prepared by a
# first mount (a tree extracted, directories for 4 and 16 processes, one for sqlite), which is
# then unmounted; a second mount of the same store then extracts the tarball again over the
# tree (each file removed and made again), has 4 and 16 processes make and remove 1 000 files
# each in their directory (../../2026-12-06/mount-threads/procs.py), and runs 1 000 sqlite
# transactions (sqlite_tx.py). ext4 does the same in a directory prepared the same way. ROUNDS
# rounds (3), the arms alternating.
#   bench.sh EXT4_DIR NAME=BINARY...   (an arm named remote… mounts a server on a local port)
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
procs=$here/../../2026-12-06/mount-threads/procs.py
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
python3 "$tools/small_tree.py" "$work/src"
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
cat > "$work/prep" <<PREP
#!/usr/bin/env bash
set -e
mkdir -p "\$1/tar" "\$1/sql"; tar -xf "$work/ball.tar" -C "\$1/tar"
for i in \$(seq 0 3); do mkdir -p "\$1/p4/p\$i"; done
for i in \$(seq 0 15); do mkdir -p "\$1/p16/p\$i"; done
PREP
cat > "$work/run" <<RUN
#!/usr/bin/env bash
set -e
now() { date +%s.%N; }
s=\$(now); tar -xf "$work/ball.tar" -C "\$1/tar"; e=\$(now)
out="tar_over_s \$(echo "\$e - \$s" | bc)"
for p in 4 16; do
    out="\$out \$(python3 "$procs" "\$1/p\$p" "\$p" 1000 | awk '{printf "%s_%s_per_s %s ", \$1, \$2, \$3}')"
done
echo "\$out \$(python3 "$here/sqlite_tx.py" "\$1/sql/db" 1000)"
RUN
chmod +x "$work/prep" "$work/run"
arm() {  # NAME BINARY
    name=$1; binary=$(realpath "$2"); mnt="$work/mnt-$name"; data="$work/data-$name"
    mkdir "$mnt"
    server=: ; target="--embedded $data"
    if [ "${name#remote}" != "$name" ]; then
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        server="\"$binary\" serve --data \"$data\" --listen 127.0.0.1:$port > /dev/null 2>&1 & spid=\$!; sleep 1"
        target="--server 127.0.0.1:$port"
    fi
    unshare -m bash -c "spid=; $server"'
        up() { "$1" mount "$2" $3 > /dev/null 2>&1 & pid=$!
               for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done; }
        down() { kill $pid; wait $pid || true; }
        up "$@"; mkdir "$2/x"; "$4" "$2/x"; sync -f "$2"; down; sleep 2
        up "$@"; echo "$6 $("$5" "$2/x")"; down
        [ -z "$spid" ] || { kill $spid; wait $spid || true; }' _ \
        "$binary" "$mnt" "$target" "$work/prep" "$work/run" "$name"
    rm -rf "$mnt" "$data"
}
for round in $(seq "${ROUNDS:-3}"); do
    mkdir "$work/x"; "$work/prep" "$work/x"; sync -f "$work/x"; echo "ext4 $("$work/run" "$work/x")"
    rm -rf "$work/x"
    for spec in "$@"; do arm "${spec%%=*}" "${spec#*=}"; done
done
