# sqlite transactions (rollback journal) through mounts of one server, two builds alternated:
# 1 000 on one mount, then 1 000 on each of two mounts at once. Run in a private mount
# namespace: OLD=... NEW=... unshare -m --propagation private bash grant-wait-ab.sh
P=$(git rev-parse --show-toplevel)/crates/calm/tests/programs/endurance.py
mkdir -p /tmp/sq && cd /tmp/sq
for round in 1 2; do
for C in ${OLD:?} ${NEW:?}; do
  rm -rf data ma mb; mkdir ma mb
  $C serve --data data > serve.log 2>&1 &
  S=$!
  sleep 0.5
  $C mount --server unix:/tmp/sq/data/calm.sock ma > ma.log 2>&1 &
  $C mount --server unix:/tmp/sq/data/calm.sock mb > mb.log 2>&1 &
  for i in 1 2 3 4 5 6 7 8 9 10; do mountpoint -q mb && mountpoint -q ma && break; sleep 0.5; done
  python3 $P sqlite-init ma/app.db > /dev/null
  t0=$(date +%s.%N); python3 $P sqlite ma/app.db w0 1000 >/dev/null; t1=$(date +%s.%N)
  python3 $P sqlite ma/app.db w0 1000 >/dev/null & python3 $P sqlite mb/app.db w1 1000 > /dev/null; wait %4 2>/dev/null; wait $!; t2=$(date +%s.%N)
  echo "$C one-mount $(echo "$t1 - $t0" | bc) two-mounts $(echo "$t2 - $t1" | bc)"
  umount ma mb; kill $S; wait
done
done
