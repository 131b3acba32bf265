# usage: python3 smaps-growth.py SMAPS_A SMAPS_B — anonymous memory by kind of mapping, and
# the mappings that grew most, from one /proc/PID/smaps copy to a later one.
import sys, re
def parse(path):
    maps = []
    cur = None
    for line in open(path):
        m = re.match(r'^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$', line)
        if m:
            cur = {"start": int(m.group(1),16), "end": int(m.group(2),16), "perm": m.group(3), "name": m.group(4).strip(), "Anonymous": 0, "Rss": 0}
            maps.append(cur)
        else:
            k = line.split(":")[0]
            if k in ("Anonymous", "Rss") and cur is not None:
                cur[k] = int(line.split()[1])
    return maps
def kind(m):
    size = (m["end"]-m["start"])>>10
    if m["name"]: return m["name"] if m["name"].startswith("[") else "file"
    return f"anon {size} kB"
a = parse(sys.argv[1]); b = parse(sys.argv[2])
def summary(ms):
    out = {}
    for m in ms:
        k = kind(m)
        if k == "file": continue
        c, anon = out.get(k, (0, 0))
        out[k] = (c+1, anon + m["Anonymous"])
    return out
sa, sb = summary(a), summary(b)
tot_a = sum(v[1] for v in sa.values()); tot_b = sum(v[1] for v in sb.values())
print(f"anonymous total {tot_a} -> {tot_b} kB")
for k in sorted(set(sa)|set(sb), key=lambda k: -(sb.get(k,(0,0))[1]-sa.get(k,(0,0))[1])):
    ca, aa = sa.get(k,(0,0)); cb, ab = sb.get(k,(0,0))
    if aa != ab or ca != cb:
        print(f"{k:24s} maps {ca}->{cb}  anon {aa}->{ab} kB")
# per mapping growth by address
bya = {m["start"]: m for m in a}
grow = []
for m in b:
    old = bya.get(m["start"])
    d = m["Anonymous"] - (old["Anonymous"] if old else 0)
    if d > 0: grow.append((d, hex(m["start"]), (m["end"]-m["start"])>>10, m["perm"], m["name"], old is None))
for g in sorted(grow, reverse=True)[:12]: print(g)
