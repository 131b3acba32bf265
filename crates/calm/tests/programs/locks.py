#!/usr/bin/env python3
"""fcntl and flock locks on a calm mount, from several processes. Usage: locks.py DIR.

Each check asserts its own outcome and prints "ok NAME"; any failure raises (non-zero exit).
"""
import errno
import fcntl
import multiprocessing as mp
import os
import signal
import struct
import sys
import time

DIR = sys.argv[1]
PROCS, ROUNDS = 4, 50


def path(name):
    return os.path.join(DIR, name)


def bump(name, use_flock):
    """Read-modify-write of a counter, ROUNDS times, under an exclusive lock."""
    for _ in range(ROUNDS):
        with open(path(name), "r+") as f:
            if use_flock:
                fcntl.flock(f, fcntl.LOCK_EX)
            else:
                fcntl.lockf(f, fcntl.LOCK_EX)
            value = int(f.read() or "0")
            time.sleep(0.0005)  # widen the window a missing lock would leave
            f.seek(0)
            f.write(str(value + 1))
            f.flush()
            os.fsync(f.fileno())
            # closing releases the lock


def counter(use_flock):
    name = "counter-flock" if use_flock else "counter-lockf"
    with open(path(name), "w") as f:
        f.write("0")
    procs = [mp.Process(target=bump, args=(name, use_flock)) for _ in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    with open(path(name)) as f:
        total = int(f.read())
    assert total == PROCS * ROUNDS, f"{name}: {total} != {PROCS * ROUNDS}: lost updates"
    print(f"ok {name} {total}")


def hold(name, start, length, ready, release):
    with open(path(name), "r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX, length, start)
        ready.set()
        release.wait(30)


def getlk_and_waits():
    name = "held"
    open(path(name), "w").close()
    ready, release = mp.Event(), mp.Event()
    holder = mp.Process(target=hold, args=(name, 10, 10, ready, release))
    holder.start()
    assert ready.wait(10)
    with open(path(name), "r+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 15)
            raise AssertionError("a conflicting lock was granted")
        except OSError as e:
            assert e.errno in (errno.EAGAIN, errno.EACCES), e
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 0)  # beside it: granted
        # F_GETLK names the holder, its range and its pid.
        probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        typ, _, start, length, pid = struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, probe))
        assert (typ, start, length, pid) == (fcntl.F_WRLCK, 10, 10, holder.pid), (typ, start, length, pid)
        print("ok getlk")

        # A blocking wait is interrupted by a signal (EINTR), and leaves nothing behind.
        class Alarm(Exception):
            pass

        def on_alarm(*_):
            raise Alarm()

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        began = time.time()
        try:
            fcntl.lockf(f, fcntl.LOCK_EX, 1, 12)
            raise AssertionError("granted while held")
        except Alarm:
            pass
        assert time.time() - began < 5, "the interrupt took too long"
        print("ok interrupted")

        # A blocking wait is granted when the holder lets go.
        threading_release = mp.Process(target=lambda: (time.sleep(0.3), release.set()))
        threading_release.start()
        began = time.time()
        fcntl.lockf(f, fcntl.LOCK_EX, 1, 12)
        waited = time.time() - began
        assert waited >= 0.2, waited
        print("ok waited")
        threading_release.join()
    holder.join()


def cycle_side(name, mine, theirs, ready, go, result):
    with open(path(name), "r+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX, 1, mine)
        ready.set()
        go.wait(10)
        try:
            fcntl.lockf(f, fcntl.LOCK_EX, 1, theirs)
            result.put("granted")
            time.sleep(0.2)
        except OSError as e:
            result.put("EDEADLK" if e.errno == errno.EDEADLK else errno.errorcode[e.errno])


def deadlock():
    name = "cycle"
    open(path(name), "w").close()
    result = mp.Queue()
    ready_a, ready_b, go = mp.Event(), mp.Event(), mp.Event()
    a = mp.Process(target=cycle_side, args=(name, 0, 1, ready_a, go, result))
    b = mp.Process(target=cycle_side, args=(name, 1, 0, ready_b, go, result))
    a.start()
    b.start()
    assert ready_a.wait(10) and ready_b.wait(10)
    go.set()
    outcomes = sorted([result.get(timeout=20), result.get(timeout=20)])
    a.join()
    b.join()
    # One side is told EDEADLK; the other is then granted when that side exits.
    assert outcomes == ["EDEADLK", "granted"], outcomes
    print("ok deadlock")


def ofd():
    name = "ofd"
    open(path(name), "w").close()
    one = os.open(path(name), os.O_RDWR)
    two = os.open(path(name), os.O_RDWR)
    lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 10, 0)
    fcntl.fcntl(one, fcntl.F_OFD_SETLK, lock)
    try:
        fcntl.fcntl(two, fcntl.F_OFD_SETLK, lock)
        raise AssertionError("two open file descriptions shared an OFD lock")
    except OSError as e:
        assert e.errno in (errno.EAGAIN, errno.EACCES), e
    os.close(one)  # the lock ends with its open file description
    fcntl.fcntl(two, fcntl.F_OFD_SETLK, lock)
    os.close(two)
    print("ok ofd")


def flock_independent():
    name = "both"
    open(path(name), "w").close()
    with open(path(name), "r+") as f, open(path(name), "r+") as g:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
            raise AssertionError("two flock holders")
        except OSError as e:
            assert e.errno == errno.EWOULDBLOCK, e
        # POSIX locks do not see flock locks.
        fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("ok flock-independent")


if __name__ == "__main__":
    mp.set_start_method("fork")
    counter(use_flock=False)
    counter(use_flock=True)
    getlk_and_waits()
    deadlock()
    ofd()
    flock_independent()
