# Where a sqlite transaction's time goes through a mount of one server (local store): the
# transactions' wall time and the server's and the mount's CPU per transaction, the cost of each
# kind of call sqlite makes (one-call-costs-sqlite.py), and the context switches of the server
# and the mount per lock call and per chown.
# usage (in a private mount namespace, e.g. unshare -m --propagation private):
#   sqlite-costs.sh target/release/calm
BIN=$1; D=$(mktemp -d /tmp/sqc.XXXX); mkdir -p $D/a
HERE=$(cd "$(dirname "$0")" && pwd); P=$HERE/../../../crates/calm/tests/programs/endurance.py
$BIN serve --data $D/data > $D/server.log 2>&1 & S=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/mount.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
switches() { cat /proc/$1/task/*/status | awk '/ctxt_switches/ {s+=$2} END {print s}'; }
python3 $P sqlite-init $D/a/app.db > /dev/null
s0=$(cpu $S); m0=$(cpu $M); t0=$(date +%s.%N)
python3 $P sqlite $D/a/app.db w0 1000 > /dev/null
t1=$(date +%s.%N); s1=$(cpu $S); m1=$(cpu $M)
echo "1000 transactions: $(echo "$t1-$t0" | bc) s; CPU ms per transaction: server $(echo "scale=2; ($s1-$s0)*10/1000" | bc), mount $(echo "scale=2; ($m1-$m0)*10/1000" | bc)"
python3 $HERE/one-call-costs-sqlite.py $D/a 1000
python3 - $D/a 2000 $S $M <<'PY'
import fcntl, os, struct, sys
d, n, server, mount = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def switches(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if "ctxt_switches" in line:
                total += int(line.split()[1])
    return total
fd = os.open(os.path.join(d, "l"), os.O_RDWR | os.O_CREAT, 0o644)
def measure(name, calls, f):
    a = (switches(server), switches(mount))
    for _ in range(n):
        f()
    b = (switches(server), switches(mount))
    print(f"{name}: context switches per call: server {(b[0]-a[0])/(n*calls):.1f}, mount {(b[1]-a[1])/(n*calls):.1f}")
lock = lambda t: fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", t, 0, 100, 1, 0))
measure("fcntl lock or unlock", 2, lambda: (lock(fcntl.F_WRLCK), lock(fcntl.F_UNLCK)))
measure("fchown to the same owner", 1, lambda: os.fchown(fd, os.getuid(), os.getgid()))
PY
umount $D/a; kill $S; wait; rm -rf $D
