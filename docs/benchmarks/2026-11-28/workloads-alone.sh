# Each workload of the soak alone, one server and one mount each, polling the server's heap
# every 20 s into /tmp/leak-WORKLOAD/poll.txt (seconds, in use KiB, free KiB, requests,
# RssAnon KiB). Usage, inside a private mount namespace:
#   unshare -m --propagation private bash workloads-alone.sh CALM_BINARY create|append|fsync|sqlite SECONDS
BIN=$1; W=$2; SECS=$3; D=/tmp/leak-$W; rm -rf $D; mkdir -p $D/data $D/mnt
$BIN serve --data $D/data > $D/serve.log 2>&1 &
SP=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/mnt > $D/mount.log 2>&1 &
for i in $(seq 100); do mountpoint -q $D/mnt && break; sleep 0.1; done
cat > $D/w.py <<'PY'
import os, sys, time, sqlite3, random
w, d, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.time() + secs; n = 0
if w == "create":
    os.mkdir(d + "/files"); data = b"f" * 4096
    while time.time() < end:
        with open(f"{d}/files/{n}", "xb") as f: f.write(data)
        if n >= 100: os.remove(f"{d}/files/{n-100}")
        n += 1
elif w == "append":
    fd = os.open(d + "/log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while time.time() < end:
        os.write(fd, b"line %09d xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n" % n); n += 1
elif w == "fsync":
    fd = os.open(d + "/db", os.O_RDWR | os.O_CREAT, 0o644); os.ftruncate(fd, 4 << 20)
    while time.time() < end:
        os.pwrite(fd, os.urandom(100), random.randrange(0, (4 << 20) - 100)); os.fsync(fd); n += 1
elif w == "sqlite":
    c = sqlite3.connect(d + "/app.db", isolation_level=None); c.execute("PRAGMA journal_mode=TRUNCATE")
    c.execute("CREATE TABLE t (x INTEGER, p BLOB)")
    while time.time() < end:
        c.execute("BEGIN IMMEDIATE"); c.execute("INSERT INTO t VALUES (?, ?)", (n, os.urandom(100))); c.execute("COMMIT"); n += 1
print(w, n)
PY
python3 $D/w.py $W $D/mnt $SECS > $D/w.out 2>&1 &
WP=$!
while kill -0 $WP 2>/dev/null; do
  echo "$(date +%s) $($BIN status --server unix:$D/data/calm.sock --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["heap_in_use_bytes"]>>10, s["heap_free_bytes"]>>10, s["requests"])') $(grep RssAnon /proc/$SP/status | awk '{print $2}')" >> $D/poll.txt
  sleep 20
done
cat $D/w.out
umount $D/mnt; kill $SP; wait
