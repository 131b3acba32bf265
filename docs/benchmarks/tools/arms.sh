# Sourced by the mount records' scripts: runs one arm of a benchmark in a private mount
# namespace. `calm_arm NAME BINARY ARG...` mounts a fresh file system at $work/mnt-NAME and runs
# `$run DIR` in a fresh directory DIR of it, printing `NAME` and what it printed. The file
# system: `BINARY mount --embedded` on a fresh store; for an arm named remote…, `BINARY mount
# --server` of a `BINARY serve` of its own on a free local port; for a passthrough_hp binary
# (passthrough-hp.sh), that FUSE file system over a fresh directory of $work (the ceiling).
# ARGs go to the mount. Needs $work (a scratch directory) and $run (a command line).
calm_arm() {  # NAME BINARY ARGS...
    name=$1; binary=$(realpath "$2"); shift 2
    mnt="$work/mnt-$name"; data="$work/data-$name"; mkdir "$mnt"
    server=:
    if [ "$(basename "$binary")" = passthrough_hp ]; then
        mkdir "$data"; start='"$1" --foreground "${@:6}" "$3" "$2"'
    elif [ "${name#remote}" != "$name" ]; then
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        server='"$1" serve --data "$3" --listen 127.0.0.1:'$port' > /dev/null 2>&1 & spid=$!; sleep 1'
        start='"$1" mount "$2" --server 127.0.0.1:'$port' "${@:6}"'
    else
        start='"$1" mount "$2" --embedded "$3" "${@:6}"'
    fi
    unshare -m bash -c "spid=; $server; $start"' > /dev/null 2>&1 & pid=$!
        for _ in $(seq 100); do mountpoint -q "$2" && break; sleep 0.05; done
        mkdir "$2/x"; echo "$5 $($4 "$2/x")"
        kill $pid; wait $pid || true
        [ -z "$spid" ] || { kill $spid; wait $spid || true; }' _ "$binary" "$mnt" "$data" "$run" "$name" "$@"
    rm -rf "$mnt" "$data"
}

# Runs ext4 (`$run` in a fresh directory of $work), then every arm `NAME=BINARY[,ARG...]`,
# ROUNDS rounds (3), the arms alternating.
all_arms() {
    for round in $(seq "${ROUNDS:-3}"); do
        mkdir "$work/x"; echo "ext4 $($run "$work/x")"; rm -rf "$work/x"
        for arm in "$@"; do
            IFS=, read -r -a spec <<< "${arm#*=}"
            calm_arm "${arm%%=*}" "${spec[@]}"
        done
    done
}
