#!/usr/bin/env bash
# tar -x and rm -rf of 3 000 files of 1-16 KiB in 50 directories (../../tools/small_tree.py),
# then creates and unlinks of 1 000 files each by 4 and by 16 processes, a directory each
# (../../2026-12-06/mount-threads/procs.py), on ext4 and through each arm (../../tools/arms.sh:
# an embedded mount; an arm named remote… mounts a server of its own on a free local port; a
# passthrough_hp binary is the FUSE ceiling), ROUNDS rounds (3), the arms alternating.
#   bench.sh EXT4_DIR NAME=BINARY[,ARG...]...
set -euo pipefail
ext4=${1:?}; shift
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
procs=$here/../../2026-12-06/mount-threads/procs.py
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
uring=/sys/module/fuse/parameters/enable_uring
[ -w "$uring" ] && echo Y > "$uring"
python3 "$tools/small_tree.py" "$work/src"
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
cat > "$work/run" <<RUN
#!/usr/bin/env bash
set -e
now() { date +%s.%N; }
mkdir "\$1/tar"; s=\$(now); tar -xf "$work/ball.tar" -C "\$1/tar"; e=\$(now)
sync -f "\$1"; s2=\$(now); rm -rf "\$1/tar"; e2=\$(now)
out="tar_s \$(echo "\$e - \$s" | bc) rm_s \$(echo "\$e2 - \$s2" | bc)"
for p in 4 16; do
    mkdir "\$1/p\$p"
    out="\$out \$(python3 "$procs" "\$1/p\$p" "\$p" 1000 | awk '{printf "%s_%s_per_s %s ", \$1, \$2, \$3}')"
    rm -rf "\$1/p\$p"
done
echo "\$out"
RUN
chmod +x "$work/run"; run="$work/run"
# shellcheck source=../../tools/arms.sh
. "$tools/arms.sh"
all_arms "$@"
