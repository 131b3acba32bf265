#!/bin/bash
# status.sh DIR: clones $REPO into DIR, then runs `git status --porcelain` 6 times at once,
# printing for each its time and, on a calm mount, the kernel's requests it made of the mount
# (from the root's calm.metrics extended attribute).
d=$1
m=$(dirname "$d")
metrics() {
    python3 -c "import os; print(os.getxattr('$m', 'calm.metrics').decode())" 2>/dev/null |
        grep -E '^calm_mount_requests_seconds_count\{op="(open|read|getattr|lookup)"' |
        sed 's/calm_mount_requests_seconds_count//'
}
git clone --quiet --no-local "$REPO" "$d/clone" 2>/dev/null
cd "$d/clone"
for i in 1 2 3 4 5 6; do
    metrics > "$d/before"
    s=$(date +%s.%N); git status --porcelain > /dev/null; e=$(date +%s.%N)
    metrics > "$d/after"
    printf 'status_s %.3f %s\n' "$(echo "$e - $s" | bc)" \
        "$(join "$d/before" "$d/after" | awk '{d=$3-$2; if (d>0) printf "%s=%d ", $1, d}')"
done
