#!/usr/bin/env bash
# The metadata store's size while one unprivileged writer runs sqlite transactions in DELETE
# mode (the journal made and removed at every transaction) through a mount, as fast as it
# goes, for SECONDS (3600 by default), with the trash on (the server's default, 24 h); then
# for 60 s with nothing running. Every 60 s one line: seconds, transactions so far, the store's
# bytes (the data directory without the object store), trash entries.
#
#   run.sh CALM_BINARY OUT.tsv [SECONDS [KEEP_DIR]]
#
# With KEEP_DIR, the mount and the server are stopped cleanly at the end and the data
# directory is moved there (for `calm fsck KEEP_DIR/data --json`: what the store holds).
# One server (`calm serve`, its default options) and one mount of it, in a private mount
# namespace, in a temporary directory removed at the end.
set -euo pipefail
calm=$(realpath "$1"); out=$(realpath -m "$2"); seconds=${3:-3600}; keep=${4:-}
work=$(mktemp -d -t calm-sqlite-hour.XXXXXX)
chmod 755 "$work"
cleanup() {
  [ -n "${writer:-}" ] && kill "$writer" 2>/dev/null || true
  [ -n "${mount_pid:-}" ] && kill "$mount_pid" 2>/dev/null || true
  sleep 1
  [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/data" "$work/mnt"
"$calm" serve --data "$work/data" > "$work/serve.log" 2>&1 &
server=$!
until grep -q "^ready" "$work/serve.log"; do sleep 0.1; done
sock=unix:$work/data/calm.sock
unshare --mount --propagation private -- "$calm" mount "$work/mnt" --server "$sock" \
  --allow-other > "$work/mount.log" 2>&1 &
mount_pid=$!
until grep -q "^mounted" "$work/mount.log"; do sleep 0.1; done
ns() { nsenter -t "$mount_pid" -m -- "$@"; }
ns mkdir "$work/mnt/db"
ns chown 65534:65534 "$work/mnt/db"
cat > "$work/writer.py" <<'PY'
import sqlite3, sys, time
path, count_file, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode=DELETE")
db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
n, end, noted = 0, time.monotonic() + seconds, 0.0
while time.monotonic() < end:
    db.execute("BEGIN")
    db.execute("INSERT OR REPLACE INTO t VALUES (?, randomblob(100))", (n % 1000,))
    db.execute("COMMIT")
    n += 1
    if time.monotonic() - noted > 1:
        noted = time.monotonic()
        with open(count_file, "w") as f:
            f.write(str(n))
with open(count_file, "w") as f:
    f.write(str(n))
PY
echo 0 > "$work/count"; chmod 666 "$work/count"
ns setpriv --reuid 65534 --regid 65534 --clear-groups \
  /usr/bin/python3 "$work/writer.py" "$work/mnt/db/test.db" "$work/count" "$seconds" &
writer=$!
store_bytes() { du -sb --exclude=objects "$work/data" | cut -f1; }
trash() { "$calm" status --server "$sock" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["trash_entries"])'; }
printf 'seconds\ttransactions\tstore_bytes\ttrash_entries\n' > "$out"
start=$(date +%s)
while kill -0 "$writer" 2>/dev/null; do
  printf '%s\t%s\t%s\t%s\n' $(( $(date +%s) - start )) "$(cat "$work/count")" "$(store_bytes)" "$(trash)" >> "$out"
  sleep 60
done
wait "$writer"; writer=
sleep 60
printf '%s\t%s\t%s\t%s\n' $(( $(date +%s) - start )) "$(cat "$work/count")" "$(store_bytes)" "$(trash)" >> "$out"
if [ -n "$keep" ]; then
  kill "$mount_pid"; wait "$mount_pid" 2>/dev/null || true; mount_pid=
  kill "$server"; wait "$server" 2>/dev/null || true; server=
  mkdir -p "$keep" && mv "$work/data" "$keep/data"
fi
cat "$out"
