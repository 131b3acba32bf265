#!/usr/bin/env python3
"""The headline figures of run-rest.sh's reports, before and after, as a Markdown table.

usage: summarize.py DIR   (the directory run-rest.sh wrote: NAME-{before,after}-{1,2}.json)
Each row: the figure, its two runs before and after, after ÷ before (of the means), and the
spread of the two runs of one build (the larger of the two builds'): a ratio within 1 ± that
spread is no change this method can see."""
import json
import statistics
import sys

D = sys.argv[1]


def load(name, which, run):
    with open(f"{D}/{name}-{which}-{run}.json") as fh:
        return json.load(fh)


def mount(d):
    out = {}
    for r in d["results"]:
        if r["fs"] == "calm" and r["op"] in ("create", "stat-cached", "unlink", "small-write", "lock-unlock"):
            out[f"calm {r['op']} ×{r['threads']} (ops/s)"] = r["ops_per_sec"]
    return out


def data(d):
    return {f"calm-file {r['case']} ×{r['threads']} ({'MB/s' if 'mb_per_sec' in r else 'ops/s'})":
            r.get("mb_per_sec", r.get("ops_per_sec"))
            for r in d["results"] if r["fs"] == "calm-file"}


def storm(d):
    out = {f"calm watcher's CPU share, {m['mounts']} mounts": m["watcher_share"]
           for m in d["mounts"] if m["watcher"] == "calm"}
    for n in d["namespace"]:
        out[f"creates/s with {n['watchers']} watchers"] = n["ops_per_sec"]
    return out


def changelog(d):
    return {f"{r['op']} ×{r['clients']}, reader on÷off": r["ratio"] for r in d["results"]} | {
        "reader records/s": d["reader_records_per_sec"]}


def transport(d):
    best = {}
    for r in d["results"]:
        best[r["transport"]] = max(best.get(r["transport"], 0), r["stats_per_sec"])
    return {f"{t} stats/s (best round)": v for t, v in best.items()}


def startup(d):
    r = d["results"][0]
    return {"restart (ms)": r["restart_ms"], "restart after kill -9 (ms)": r["restart_after_kill_ms"],
            "scan rebuild (ms)": r["scan_rebuild_ms"]}


def appends(d):
    return {"direct appends/s": d["direct"], "page-cache appends/s": d["through_cache"]} | {
        f"torn of {t['records']}, {t['mount']}": t["torn"] for t in d["tearing"]}


def soak(d):
    out = {}
    names = ["append", "fsync-write", "sqlite", "create+unlink"]
    for i, name in enumerate(names):
        out[f"{name} ops/s (mean of periods)"] = statistics.mean(p["workloads"][i]["ops_per_s"] for p in d["periods"])
    return out


def servers(d):
    return {f"{r['servers']} server(s) {r['op']} (ops/s)": r["ops_per_sec"] for r in d["results"]}


def churn(d):
    return {f"{r['servers']} server(s) create+unlink pairs/s (mean)": statistics.mean(p["pairs_per_sec"] for p in r["periods"])
            for r in d["rounds"]}


def clusters(d):
    return {f"{r['clusters']} cluster(s) creates/s": r["creates_per_second"] for r in d}


FIGURES = [("mount", mount), ("data", data), ("storm", storm), ("changelog", changelog),
           ("transport", transport), ("startup", startup), ("appends", appends), ("soak", soak),
           ("servers", servers), ("churn", churn), ("clusters", clusters)]

print("| benchmark | figure | before (2 runs) | after (2 runs) | after ÷ before | spread of one build |")
print("|---|---|---|---|---|---|")
for name, figures in FIGURES:
    try:
        runs = {(w, r): figures(load(name, w, r)) for w in ("before", "after") for r in (1, 2)}
    except (OSError, ValueError, KeyError) as e:
        print(f"| {name} | (no report: {e}) | | | | |")
        continue
    for key in runs[("before", 1)]:
        b = [runs[("before", r)].get(key) for r in (1, 2)]
        a = [runs[("after", r)].get(key) for r in (1, 2)]
        if None in a + b:
            continue
        mb, ma = statistics.mean(b), statistics.mean(a)
        ratio = ma / mb if mb else float("nan")
        spread = max(abs(b[0] - b[1]) / mb if mb else 0, abs(a[0] - a[1]) / ma if ma else 0)
        fmt = lambda v: f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        print(f"| {name} | {key} | {fmt(b[0])} · {fmt(b[1])} | {fmt(a[0])} · {fmt(a[1])} | {ratio:.2f} | {spread:.2f} |")
