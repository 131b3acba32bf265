#!/usr/bin/env python3
"""The mount durability A/B as a table: for each shape, calm's rate in each arm over its rounds
(min-max), and its ratio to ext4 measured in the same run.

Usage: summarize.py DIR (holding mount-default-N.json and mount-store-sync-N.json)."""
import glob
import json
import sys

here = sys.argv[1] if len(sys.argv) > 1 else "."
SHAPES = [("create", 1), ("create", 16), ("unlink", 1), ("unlink", 16), ("rename", 1),
          ("small-write", 1), ("small-read", 1), ("small-read", 16), ("stat-cold", 1),
          ("tar-extract", 1), ("sqlite-writers", 1)]


PROGRAMS = ("tar-extract", "sqlite-writers")


def rate(run, fs, op, threads):
    """Operations per second; for a program, runs per second (1 / its seconds)."""
    for r in run["results"]:
        if r["fs"] == fs and r["op"] == op and r["threads"] == threads:
            return 1.0 / r["seconds"] if op in PROGRAMS else r["ops_per_sec"]
    return None


def span(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


arms = {arm: [json.load(open(p)) for p in sorted(glob.glob(f"{here}/mount-{arm}-*.json"))
              if open(p).read().strip()]
        for arm in ("default", "store-sync")}
print("| shape | threads | fs | default: calm/s (x ext4) | --store-sync: calm/s (x ext4) |")
print("|---|---|---|---|---|")
for op, threads in SHAPES:
    for fs in ("calm", "calm-remote"):
        cells = []
        for arm in ("default", "store-sync"):
            rates = [rate(run, fs, op, threads) for run in arms[arm]]
            ratios = [rate(run, fs, op, threads) / rate(run, "ext4", op, threads)
                      for run in arms[arm]
                      if rate(run, fs, op, threads) and rate(run, "ext4", op, threads)]
            if op in PROGRAMS:
                secs = [1 / r for r in rates if r]
                cells.append(f"{span(secs, lambda v: f'{v:.2f} s')} "
                             f"({span([1 / r for r in ratios], lambda v: f'{v:.1f}x slower')})")
            else:
                cells.append(f"{span(rates, lambda v: f'{v:,.0f}')} "
                             f"({span(ratios, lambda v: f'{v:.2f}')})")
        print(f"| {op} | {threads} | {fs} | {cells[0]} | {cells[1]} |")
