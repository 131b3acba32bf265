# A mount's heap (RssAnon) just after mounting, and after 128 MiB written and read back in
# 1 MiB writes and 200 sqlite transactions; two builds in turn. Run in a private mount
# namespace: OLD=... NEW=... unshare -m --propagation private bash mount-heap.sh
P=$(git rev-parse --show-toplevel)/crates
mkdir -p /tmp/sq && cd /tmp/sq
for C in ${OLD:?} ${NEW:?}; do
  rm -rf data ma; mkdir ma
  $C serve --data data > serve.log 2>&1 &
  S=$!
  sleep 0.5
  $C mount --server unix:/tmp/sq/data/calm.sock ma > ma.log 2>&1 &
  M=$!
  for i in 1 2 3 4 5 6 7 8 9 10; do mountpoint -q ma && break; sleep 0.5; done
  a0=$(grep RssAnon /proc/$M/status | awk '{print $2}')
  for i in 1 2 3 4; do dd if=/dev/urandom of=ma/f$i bs=1M count=32 status=none; cat ma/f$i > /dev/null; done
  python3 $P/calm/tests/programs/endurance.py sqlite-init ma/app.db >/dev/null; python3 $P/calm/tests/programs/endurance.py sqlite ma/app.db w0 200 >/dev/null
  a1=$(grep RssAnon /proc/$M/status | awk '{print $2}')
  echo "$C mount RssAnon after mount ${a0} kB, after 128 MiB written+read and 200 sqlite transactions ${a1} kB"
  umount ma; kill $S; wait
done
