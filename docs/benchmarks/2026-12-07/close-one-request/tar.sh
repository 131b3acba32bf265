#!/usr/bin/env bash
# tar -x and rm -rf of 3 000 files of 1-16 KiB in 50 directories (../../tools/small_tree.py),
# on ext4 and through each arm (../../tools/arms.sh: an embedded mount, or for an arm named
# remote… a mount of a server on a free local port), ROUNDS rounds (3), the arms alternating.
#   tar.sh EXT4_DIR NAME=BINARY[,ARG...]...
# e.g. tar.sh /var/tmp new=./calm before=./calm-7b4f925 remote-new=./calm remote-before=./calm-7b4f925
set -euo pipefail
ext4=${1:?}; shift
tools=$(cd "$(dirname "$0")/../../tools" && pwd)
work=$(mktemp -d -p "$ext4"); trap 'rm -rf "$work"' EXIT
python3 "$tools/small_tree.py" "$work/src"
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
cat > "$work/run" <<RUN
#!/usr/bin/env bash
s=\$(date +%s.%N); tar -xf "$work/ball.tar" -C "\$1"; e=\$(date +%s.%N)
sync -f "\$1"; s2=\$(date +%s.%N); rm -rf "\$1/t"; e2=\$(date +%s.%N)
echo "tar_s \$(echo "\$e - \$s" | bc) rm_s \$(echo "\$e2 - \$s2" | bc)"
RUN
chmod +x "$work/run"; run="$work/run"
# shellcheck source=../../tools/arms.sh
. "$tools/arms.sh"
all_arms "$@"
