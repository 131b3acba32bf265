"""Per arm, mode, op and clients: the range of ops/s over the rounds, and each arm's median
against the first arm's.   summarize.py ab.txt"""
import json, statistics, sys
rates = {}
arms = []
for line in open(sys.argv[1]):
    name, _, body = line.partition(" ")
    if name not in arms:
        arms.append(name)
    for r in json.loads(body)["results"]:
        if r["mode"] == "kernel-tmpfs":
            continue
        key = (r["mode"], r["op"], r["clients"])
        rates.setdefault(key, {}).setdefault(name, []).append(r["ops_per_sec"])
print("| mode | op | clients | " + " | ".join(f"{a} ops/s" for a in arms)
      + " | " + " | ".join(f"{a} / {arms[0]} (medians)" for a in arms[1:]) + " |")
print("|---" * (3 + 2 * len(arms) - 1) + "|")
for key in sorted(rates):
    by = rates[key]
    cells = [f"{min(by[a]):,.0f}–{max(by[a]):,.0f}".replace(",", " ") for a in arms]
    base = statistics.median(by[arms[0]])
    ratios = [f"{statistics.median(by[a]) / base:.3f}" for a in arms[1:]]
    print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells + ratios) + " |")
