#!/usr/bin/env python3
"""Long-lived files, as programs use them: a log appended line by line, a database file under
small fsync'd writes, a sqlite database under many transactions, a file rewritten in place.
Each command does its work and prints one line the test checks; any failed system call is
reported (with how many operations had succeeded before it) and ends the program with status 1.

  append FILE TAG COUNT                 COUNT lines, each one write(2) with O_APPEND
  check-appends FILE TAG:COUNT...       every line whole, each writer's lines all there, in order
  fsync-writes FILE MODEL SEED COUNT PARITY
                                        COUNT small writes into the pages of FILE whose index has
                                        PARITY, each followed by fsync; the pages written go to
                                        MODEL (outside the mount)
  check-pages FILE MODEL...             FILE's bytes equal the models' pages over zeros
  sqlite DB TAG COUNT                   COUNT transactions (rollback journal), one row each
  check-sqlite DB TAG:COUNT...          integrity_check, and each writer's rows exactly
  rewrite FILE SEED FROM COUNT          rewrites FILE in place COUNT times (versions FROM…);
                                        prints the digest of the last version
  digest FILE                           the digest of FILE's bytes
"""

import hashlib
import os
import random
import sqlite3
import sys
import time

PAGE = 4096
FILE_PAGES = 1024  # a 4 MiB file


def fail(what, done, error):
    print(f"FAILED {what} after {done} successful operations: {error}")
    sys.exit(1)


def line(tag, i):
    # Lengths from 12 to about 200 bytes: many lines cross a page boundary.
    pad = chr(ord("a") + i % 26) * ((i * 7919) % 190)
    return f"{tag} {i:07d} {pad}\n".encode()


def append(path, tag, count):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(count):
        data = line(tag, i)
        try:
            written = os.write(fd, data)
        except OSError as error:
            fail("append", i, error)
        if written != len(data):
            fail("append", i, f"short write: {written} of {len(data)} bytes")
    try:
        os.close(fd)
    except OSError as error:
        fail("close", count, error)
    print(f"appended {count}")


def check_appends(path, expected):
    counts = {tag: int(n) for tag, n in (e.split(":") for e in expected)}
    seen = {tag: 0 for tag in counts}
    torn = 0
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    else:
        torn += 1
    for text in lines:
        parts = text.split(b" ", 2)
        try:
            tag, i = parts[0].decode(), int(parts[1])
        except (IndexError, ValueError, UnicodeDecodeError):
            torn += 1
            continue
        if tag not in seen or line(tag, i) != text + b"\n" or seen[tag] != i:
            torn += 1
            continue
        seen[tag] = i + 1
    missing = sum(counts[t] - seen[t] for t in counts)
    print(f"lines {len(lines)} torn {torn} missing {missing} bytes {len(data)}")
    if torn or missing:
        print("seen by writer: " + " ".join(f"{t}:{n}" for t, n in sorted(seen.items())))


def fsync_writes(path, model_path, seed, count, parity):
    rng = random.Random(seed)
    pages = {}
    fd = os.open(path, os.O_RDWR)
    for i in range(count):
        page = rng.randrange(FILE_PAGES // 2) * 2 + parity
        at = rng.randrange(PAGE - 200)
        piece = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 200)))
        try:
            os.pwrite(fd, piece, page * PAGE + at)
            os.fsync(fd)
        except OSError as error:
            fail("fsync'd write", i, error)
        model = pages.setdefault(page, bytearray(PAGE))
        model[at : at + len(piece)] = piece
    os.close(fd)
    with open(model_path, "wb") as f:
        for page, model in sorted(pages.items()):
            f.write(page.to_bytes(4, "little") + bytes(model))
    print(f"fsynced {count}")


def check_pages(path, model_paths):
    want = bytearray(FILE_PAGES * PAGE)
    for model_path in model_paths:
        with open(model_path, "rb") as f:
            data = f.read()
        for at in range(0, len(data), 4 + PAGE):
            page = int.from_bytes(data[at : at + 4], "little")
            want[page * PAGE : (page + 1) * PAGE] = data[at + 4 : at + 4 + PAGE]
    with open(path, "rb") as f:
        got = f.read()
    bad = [p for p in range(FILE_PAGES) if got[p * PAGE : (p + 1) * PAGE] != want[p * PAGE : (p + 1) * PAGE]]
    print(f"size {len(got)} pages differing {len(bad)}")


def connect(db):
    conn = sqlite3.connect(db, timeout=120, isolation_level=None)
    conn.execute("PRAGMA journal_mode=TRUNCATE")
    return conn


def sqlite_writer(db, tag, count):
    conn = connect(db)
    done = 0
    while done < count:
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO t (tag, seq, payload) VALUES (?, ?, ?)",
                (tag, done, os.urandom(64 + done % 300)),
            )
            conn.execute("UPDATE c SET n = n + 1")
            conn.execute("COMMIT")
            done += 1
        except sqlite3.OperationalError as error:
            if "locked" in str(error) or "busy" in str(error):
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.OperationalError:
                    pass
                time.sleep(0.001)
                continue
            fail("sqlite transaction", done, error)
    conn.close()
    print(f"committed {count}")


def check_sqlite(db, expected):
    conn = connect(db)
    integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    total = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    counter = conn.execute("SELECT n FROM c").fetchone()[0]
    wrong = 0
    for tag, n in (e.split(":") for e in expected):
        seqs = [r[0] for r in conn.execute("SELECT seq FROM t WHERE tag = ? ORDER BY seq", (tag,))]
        if seqs != list(range(int(n))):
            wrong += 1
    print(f"integrity {integrity} rows {total} counter {counter} writers_wrong {wrong}")


def version(seed, v, size):
    return random.Random(f"{seed}-{v}").randbytes(size)


def rewrite(path, seed, first, count, size=256 << 10):
    for v in range(first, first + count):
        data = version(seed, v, size)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(fd, data, 0)
            os.close(fd)
        except OSError as error:
            fail("rewrite", v - first, error)
    print(hashlib.sha256(data).hexdigest())


def digest(path):
    with open(path, "rb") as f:
        print(hashlib.sha256(f.read()).hexdigest())


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "append":
        append(args[0], args[1], int(args[2]))
    elif cmd == "check-appends":
        check_appends(args[0], args[1:])
    elif cmd == "fsync-writes":
        fsync_writes(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    elif cmd == "check-pages":
        check_pages(args[0], args[1:])
    elif cmd == "sqlite-init":
        conn = connect(args[0])
        conn.execute("CREATE TABLE t (tag TEXT, seq INTEGER, payload BLOB)")
        conn.execute("CREATE TABLE c (n INTEGER)")
        conn.execute("INSERT INTO c VALUES (0)")
        conn.close()
        print("created")
    elif cmd == "sqlite":
        sqlite_writer(args[0], args[1], int(args[2]))
    elif cmd == "check-sqlite":
        check_sqlite(args[0], args[1:])
    elif cmd == "rewrite":
        rewrite(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "digest":
        digest(args[0])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
