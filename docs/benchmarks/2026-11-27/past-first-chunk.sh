#!/usr/bin/env bash
# Appends into a fresh file and into one already 64 MiB long (past its first chunk), one mount
# of one server; CALM names the binary. Prints appends per second of each 15 s round.
D=$(mktemp -d /tmp/past64.XXXX); mkdir $D/m
${CALM:-calm} serve --data $D/data --listen 127.0.0.1:0 > $D/s.log 2>&1 &
sleep 1; A=$(sed -n 's/.* and //p' $D/s.log)
${CALM:-calm} mount $D/m --server $A > $D/m.log 2>&1 &
sleep 1
python3 - $D/m <<'P'
import os, sys, time
m = sys.argv[1]
def run(name, start):
    p = os.path.join(m, name)
    with open(p, 'wb') as f:
        f.truncate(start)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    t = time.time(); n = 0
    while time.time() - t < 15:
        os.write(fd, b'x' * 99 + b'\n'); n += 1
    os.close(fd)
    print(name, 'from byte', start, round(n / 15), 'appends/s', flush=True)
for r in range(2):
    run(f'small{r}', 0)
    run(f'big{r}', 64 << 20)
P
ls $D/data/objects 2>/dev/null | head -2; find $D/data -type f | wc -l
fusermount3 -u $D/m; kill %1; wait; rm -rf $D
