#!/bin/sh
# SIGTERM to a server with a mount holding a lock; prints how long it took to exit.
# Run in a private mount namespace: BIN=target/debug/calm ETCD=etcd://HOST:PORT unshare -m --propagation private sh stop-with-mount.sh
# (without ETCD: the local store).
BIN=${BIN:-target/debug/calm}; D=$(mktemp -d); mkdir -p $D/a
$BIN serve ${ETCD:+--store "$ETCD/term$$"} --data $D/data > $D/serve.log 2>&1 & P=$!
for i in $(seq 100); do [ -S $D/data/calm.sock ] && break; sleep 0.1; done
$BIN mount --server unix:$D/data/calm.sock $D/a > $D/a.log 2>&1 & M=$!
for i in $(seq 100); do mountpoint -q $D/a && break; sleep 0.1; done
echo hi > $D/a/f; python3 -c "
import fcntl; f=open('$D/a/f','r+'); fcntl.lockf(f, fcntl.LOCK_EX); print('locked')" 
s=$(date +%s.%N); kill -TERM $P; for i in $(seq 300); do kill -0 $P 2>/dev/null || break; sleep 0.1; done; e=$(date +%s.%N)
echo "exit after $(echo "$e-$s"|bc) s"; kill -0 $P 2>/dev/null && echo STILL RUNNING && kill -9 $P
umount -l $D/a; kill $M; tail -3 $D/serve.log
