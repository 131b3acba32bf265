# One of two sqlite writers of one database: N transactions of one insert each (rollback
# journal, sqlite's default), waiting up to 60 s for the other's lock. Prints its seconds.
#   writer.py DB N
import sqlite3, sys, time
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db, timeout=60)
t = time.time()
for _ in range(n):
    c.execute("INSERT INTO t (v) VALUES (?)", ("x" * 100,))
    c.commit()
print(round(time.time() - t, 3))
