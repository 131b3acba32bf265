"""Medians of run.sh's lines per arm, operation and quotas, B's median over A's, and a 95 %
bootstrap interval of that ratio (samples drawn again with replacement within each arm, 10 000
times; a fixed seed, so that the same input prints the same interval)."""
import random
import statistics
import sys
from collections import defaultdict

rates = defaultdict(list)
for line in open(sys.argv[1]):
    arm, op, quotas, rate = line.split()
    rates[(arm, op, quotas)].append(float(rate))
rng = random.Random(1)
print(f"{'op':8} {'quotas':6} {'A median':>10} {'B median':>10} {'B/A':>7} {'95% interval':>15} {'runs':>5}")
for op in ["create", "write", "unlink"]:
    for quotas in ["on", "off"]:
        a = rates[("A", op, quotas)]
        b = rates[("B", op, quotas)]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratios = sorted(
            statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a)))
            for _ in range(10_000)
        )
        low, high = ratios[250], ratios[9_749]
        print(f"{op:8} {quotas:6} {ma:10.1f} {mb:10.1f} {mb / ma:7.3f} {low:7.3f}-{high:.3f} {len(a):5}")
