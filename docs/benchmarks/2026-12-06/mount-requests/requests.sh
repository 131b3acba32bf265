#!/usr/bin/env bash
# The kernel's requests to the mount and the mount's requests to its server, by kind, per file
# of `tar -x` of 3 000 files of 1-16 KiB in 50 directories (the tarball of
# ../mount-durability/tar.sh), through `calm mount --embedded`, from the mount's own counters
# (`--metrics`): scraped before and after the extraction.
#   requests.sh CALM WORK_DIR [MOUNT ARGS...]
set -euo pipefail
calm=$(realpath "${1:?}"); dir=${2:?}; shift 2
work=$(mktemp -d -p "$dir"); trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
python3 - "$work/src" <<'PY'
import os, random, sys
random.seed(1)
root = sys.argv[1]
for d in range(50):
    os.makedirs(f"{root}/t/d{d}", exist_ok=True)
    for f in range(60):
        with open(f"{root}/t/d{d}/f{f}", "wb") as out:
            out.write(os.urandom(random.randint(1024, 16384)))
PY
tar -cf "$work/ball.tar" -C "$work/src" t && rm -rf "$work/src"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$work/mnt"
"$calm" mount "$work/mnt" --embedded "$work/data" --metrics "127.0.0.1:$port" "$@" > "$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
scrape() { curl -s "127.0.0.1:$port/metrics" | grep -E '^calm_(mount|server)_requests_seconds_count' || true; }
mkdir "$work/mnt/x"
scrape > "$work/before"
tar -xf "$work/ball.tar" -C "$work/mnt/x"
scrape > "$work/after"
umount "$work/mnt"; wait "$pid" || true
python3 - "$work/before" "$work/after" <<'PY'
import re, sys
def read(path):
    out = {}
    for line in open(path):
        m = re.match(r'(\w+)\{(.*)\} (\S+)', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
before, after = read(sys.argv[1]), read(sys.argv[2])
files = 3000
rows = []
for key, value in after.items():
    delta = value - before.get(key, 0.0)
    if delta > 0:
        rows.append((key[0].replace('_requests_seconds_count', ''), key[1], delta / files))
for side in ('calm_mount', 'calm_server'):
    total = sum(r[2] for r in rows if r[0] == side)
    print(f"{side}: {total:.2f} requests per file")
    for name, labels, per in sorted((r for r in rows if r[0] == side), key=lambda r: -r[2]):
        print(f"  {labels}: {per:.2f}")
PY
