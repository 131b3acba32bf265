"""Programs a person runs (programs.py REPO DIR), in DIR: sqlite (one writer, 1 000
transactions of one insert each, rollback journal), `git clone` of the repository REPO (its
objects copied, not linked) and `git status` in the clone (twice). Prints
`sqlite_ms_per_txn X clone_s Y status_s Z status2_s W`.
"""
import os
import sqlite3
import subprocess
import sys
import time

repo, d = sys.argv[1], sys.argv[2]
db = sqlite3.connect(os.path.join(d, "db"), isolation_level=None)
db.execute("PRAGMA journal_mode=DELETE")
db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
start = time.perf_counter()
for i in range(1000):
    db.execute("BEGIN")
    db.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 100))
    db.execute("COMMIT")
sqlite_ms = (time.perf_counter() - start) * 1000 / 1000
db.close()


def timed(*args, cwd=None):
    start = time.perf_counter()
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


clone = timed("git", "clone", "--quiet", "--no-local", repo, os.path.join(d, "clone"))
status = timed("git", "status", "--porcelain", cwd=os.path.join(d, "clone"))
status2 = timed("git", "status", "--porcelain", cwd=os.path.join(d, "clone"))
print("sqlite_ms_per_txn %.3f clone_s %.3f status_s %.3f status2_s %.3f"
      % (sqlite_ms, clone, status, status2))
