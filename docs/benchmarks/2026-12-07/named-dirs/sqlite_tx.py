# One writer, N transactions of one insert each, rollback journal (sqlite's default: the
# journal is made and removed in the database's directory at each transaction).
#   sqlite_tx.py DB N
import sqlite3, sys, time
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db)
c.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
c.commit()
t = time.time()
for _ in range(n):
    c.execute("INSERT INTO t (v) VALUES (?)", ("x" * 100,))
    c.commit()
print("sqlite_ms_per_tx", round((time.time() - t) * 1000 / n, 3))
