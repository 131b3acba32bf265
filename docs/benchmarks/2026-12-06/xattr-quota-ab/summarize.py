"""Medians of run.sh's lines per arm, operation and quotas, and B's median over A's."""
import statistics
import sys
from collections import defaultdict

rates = defaultdict(list)
for line in open(sys.argv[1]):
    arm, op, quotas, rate = line.split()
    rates[(arm, op, quotas)].append(float(rate))
print(f"{'op':8} {'quotas':6} {'A median':>10} {'B median':>10} {'B/A':>7} {'runs':>5}")
for op in ["create", "write", "unlink"]:
    for quotas in ["on", "off"]:
        a = rates[("A", op, quotas)]
        b = rates[("B", op, quotas)]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{op:8} {quotas:6} {ma:10.0f} {mb:10.0f} {mb / ma:7.3f} {len(a):5}")
