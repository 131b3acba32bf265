#!/usr/bin/env bash
# A store on a small file system that fills up: run inside a private mount namespace
# (`unshare --mount --propagation private`) as root. Usage: full_store.sh CALM DIR.
# Mounts a 40 MiB ext4 image (a loop device, released with the namespace) at DIR/small, runs
# an embedded mount with its store there, fills it, and prints what each step answered; then
# kills the mount with -9, mounts again and checks every acknowledged file.
set -euo pipefail
calm=$1
dir=$2
truncate -s 40M "$dir/img"
mkfs.ext4 -q -F "$dir/img"
mkdir -p "$dir/small" "$dir/mnt"
mount -o loop "$dir/img" "$dir/small"
"$calm" mount "$dir/mnt" --embedded "$dir/small/data" > "$dir/mount.out" 2> "$dir/mount.err" &
mount_pid=$!
trap 'kill $mount_pid 2>/dev/null || true; wait $mount_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q "^mounted at" "$dir/mount.out" && break
    sleep 0.1
done
# Room the administrator can give back later.
dd if=/dev/zero of="$dir/small/ballast" bs=1M count=4 status=none
cd "$dir/mnt"
python3 - "$dir/small/ballast" "$dir/acknowledged" <<'PY'
import errno, hashlib, os, sys, time

def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))

written = {}
n = 0
while True:
    data = os.urandom(1 << 20)
    try:
        with open("f%d" % n, "wb") as f:
            f.write(data)
        written["f%d" % n] = hashlib.sha256(data).hexdigest()
        n += 1
    except OSError as e:
        print("filling files:", name(e))
        break
m = 0
while True:
    try:
        os.mkdir("d%d" % m)
        m += 1
    except OSError as e:
        print("filling names:", name(e))
        break
# Everything acknowledged reads back.
for path, digest in written.items():
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digest, path
print("reads:", "ok")
os.unlink(sys.argv[1])
# Writes resume by themselves once room is back.
for attempt in range(50):
    try:
        os.mkdir("after")
        break
    except OSError as e:
        time.sleep(0.1)
with open("new", "wb") as f:
    f.write(b"x" * 100000)
os.unlink("f0")
os.rename("f1", "f1-renamed")
written.pop("f0")
written["f1-renamed"] = written.pop("f1")
written["new"] = hashlib.sha256(b"x" * 100000).hexdigest()
with open(sys.argv[2], "w") as f:
    for path, digest in sorted(written.items()):
        f.write("%s %s\n" % (path, digest))
print("after room is back:", "ok")
PY
cd /
# Killed in the middle of nothing in particular: what was acknowledged must survive.
kill -9 $mount_pid
wait $mount_pid || true
umount -l "$dir/mnt" 2>/dev/null || true
"$calm" mount "$dir/mnt" --embedded "$dir/small/data" > "$dir/mount2.out" 2>> "$dir/mount.err" &
mount_pid=$!
for _ in $(seq 100); do
    grep -q "^mounted at" "$dir/mount2.out" && break
    sleep 0.1
done
python3 - "$dir/mnt" "$dir/acknowledged" <<'PY'
import hashlib, os, sys
mnt, listing = sys.argv[1], sys.argv[2]
for line in open(listing):
    path, digest = line.split()
    with open(os.path.join(mnt, path), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digest, path
assert os.path.isdir(os.path.join(mnt, "after"))
assert not os.path.exists(os.path.join(mnt, "f0"))
print("after kill -9:", "ok")
PY
kill $mount_pid
wait $mount_pid || true
"$calm" fsck "$dir/small/data" --objects | tail -1
