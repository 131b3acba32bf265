#!/bin/bash
# rem.sh LABEL ENV...: creates/unlinks/small files through a remote mount (separate process) of an embedded mount's server
label=$1; shift
cd "$(dirname "$0")" && cc -O2 -pthread -o /tmp/mk mk.c && mkdir -p /tmp/w && cd /tmp/w || exit 1
fusermount3 -u /tmp/w/mnt 2>/dev/null; fusermount3 -u /tmp/w/mnt2 2>/dev/null; sleep 0.3
DATA=${DATA:-/tmp/w/data}; rm -rf $DATA; mkdir -p /tmp/w/mnt /tmp/w/mnt2
B=${CALM_BIN:-/work/main/target/release/calm}
$B mount /tmp/w/mnt --embedded $DATA > /tmp/w/mount.log 2>&1 &
mp=$!
for i in $(seq 50); do grep -q mounted /tmp/w/mount.log && break; sleep 0.1; done
env "$@" $B mount /tmp/w/mnt2 --server unix:$DATA/calm.sock > /tmp/w/mount2.log 2>&1 &
mp2=$!
for i in $(seq 50); do grep -q mounted /tmp/w/mount2.log && break; sleep 0.1; done
N=${N:-20000}
for t in ${THREADS:-16}; do
  mkdir /tmp/w/mnt2/c$t /tmp/w/mnt2/s$t
  echo "$label $(/tmp/mk /tmp/w/mnt2/c$t create $t $N)"
  echo "$label $(/tmp/mk /tmp/w/mnt2/c$t stat $t $N)"
  echo "$label $(/tmp/mk /tmp/w/mnt2/c$t unlink $t $N)"
  echo "$label $(/tmp/mk /tmp/w/mnt2/s$t small $t $N)"
done
kill -TERM $mp2; wait $mp2
kill -TERM $mp; wait $mp
