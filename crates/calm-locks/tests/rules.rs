//! Named conformance tests, one per rule of the lock manager: owners and what F_GETLK reports,
//! flock beside record locks, waiting in arrival order, wake-ups, cancel, deadlock detection,
//! leases, fencing and limits.

use calm_locks::{
    Event, Limits, LockError, LockKind, LockManager, Outcome, Owner, Range, Request, Scope,
    SessionId, Stats,
};

const LEASE_MS: u64 = 10_000;
const P1: Owner = Owner::Process { pid: 1001 };
const P2: Owner = Owner::Process { pid: 1002 };
const P3: Owner = Owner::Process { pid: 1003 };
const F1: Owner = Owner::File { file: 1 };
const F2: Owner = Owner::File { file: 2 };

fn range(start: u64, end: u64) -> Scope {
    Scope::Range(Range { start, end })
}

fn req(resource: u64, owner: Owner, scope: Scope, kind: LockKind) -> Request {
    Request {
        resource,
        owner,
        scope,
        kind,
    }
}

fn manager() -> (LockManager, SessionId) {
    let mut m = LockManager::new(Limits::default(), 1);
    let s = m.open_session(0, LEASE_MS).unwrap();
    (m, s)
}

fn granted(m: &mut LockManager, s: SessionId, r: Request) {
    assert_eq!(m.set(s, r, false), Ok(Outcome::Granted), "{r:?}");
}

fn waits(m: &mut LockManager, s: SessionId, r: Request) -> u64 {
    match m.set(s, r, true) {
        Ok(Outcome::Waiting(w)) => w,
        other => panic!("{r:?} should wait, got {other:?}"),
    }
}

#[test]
fn getlk_reports_the_pid_of_a_process_and_minus_one_for_an_open_file() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Write));
    granted(&mut m, s, req(1, F1, range(20, 29), LockKind::Write));
    let h = m
        .test(s, req(1, P2, range(5, 5), LockKind::Read))
        .unwrap()
        .unwrap();
    assert_eq!((h.owner, h.owner.pid(), h.scope), (P1, 1001, range(0, 9)));
    let h = m
        .test(s, req(1, P2, range(25, 25), LockKind::Read))
        .unwrap()
        .unwrap();
    assert_eq!((h.owner, h.owner.pid()), (F1, -1));
    // A process's POSIX lock and an open file's OFD lock conflict even in one session.
    assert!(matches!(
        m.set(s, req(1, F1, range(0, 0), LockKind::Read), false),
        Err(LockError::Conflict(_))
    ));
    assert_eq!(
        m.test(s, req(1, P1, range(0, 9), LockKind::Write)),
        Ok(None),
        "own locks never conflict"
    );
}

#[test]
fn flock_and_record_locks_are_independent() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, F1, Scope::WholeFile, LockKind::Write));
    granted(&mut m, s, req(1, F2, range(0, 100), LockKind::Write));
    assert!(matches!(
        m.set(s, req(1, F2, Scope::WholeFile, LockKind::Read), false),
        Err(LockError::Conflict(h)) if h.owner == F1 && h.scope == Scope::WholeFile
    ));
    m.unlock(s, 1, F1, Scope::WholeFile).unwrap();
    granted(&mut m, s, req(1, F2, Scope::WholeFile, LockKind::Read));
    assert_eq!(m.locks(1).len(), 2);
}

#[test]
fn a_stream_of_readers_cannot_starve_a_writer() {
    let (mut m, s) = manager();
    let whole = range(0, 99);
    granted(&mut m, s, req(1, P1, whole, LockKind::Read));
    let writer = waits(&mut m, s, req(1, P2, whole, LockKind::Write));
    // New readers hold nothing and arrive after the writer: they queue behind it, even though
    // the held read lock alone would let them in. Non-blocking ones are refused.
    assert_eq!(
        m.set(s, req(1, P3, range(10, 10), LockKind::Read), false),
        Err(LockError::Queued)
    );
    let reader = waits(&mut m, s, req(1, P3, range(10, 10), LockKind::Read));
    // F_GETLK still reports only held locks.
    assert_eq!(
        m.test(s, req(1, P3, range(10, 10), LockKind::Read)),
        Ok(None)
    );
    m.unlock(s, 1, P1, whole).unwrap();
    assert_eq!(m.take_events(), vec![Event::Granted(writer)]);
    m.unlock(s, 1, P2, whole).unwrap();
    assert_eq!(m.take_events(), vec![Event::Granted(reader)]);
    m.check_consistency().unwrap();
}

#[test]
fn an_owner_holding_a_lock_passes_waiters_that_may_wait_for_it() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Read));
    let writer = waits(&mut m, s, req(1, P2, range(0, 19), LockKind::Write));
    // P1 extends its read lock: it holds what the writer waits for, so queueing it behind the
    // writer would deadlock both. It goes ahead, as on Linux.
    granted(&mut m, s, req(1, P1, range(0, 19), LockKind::Read));
    m.release(s, P1, None).unwrap();
    assert_eq!(m.take_events(), vec![Event::Granted(writer)]);
}

#[test]
fn a_waiter_wakes_only_for_a_release_that_overlaps_its_range() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Write));
    granted(&mut m, s, req(1, P1, range(100, 199), LockKind::Write));
    let w = waits(&mut m, s, req(1, P2, range(150, 160), LockKind::Write));
    m.unlock(s, 1, P1, range(0, 9)).unwrap();
    m.unlock(s, 1, P1, range(100, 149)).unwrap();
    m.unlock(s, 1, P1, range(161, 199)).unwrap();
    assert_eq!(
        m.take_events(),
        vec![],
        "no overlap with what it waits for: still waiting"
    );
    assert_eq!(m.waiting(1).len(), 1);
    m.unlock(s, 1, P1, range(155, 155)).unwrap();
    assert_eq!(m.take_events(), vec![], "part of its range is still held");
    m.unlock(s, 1, P1, range(150, 160)).unwrap();
    assert_eq!(m.take_events(), vec![Event::Granted(w)]);
    m.check_consistency().unwrap();
}

#[test]
fn a_downgrade_lets_waiting_readers_in() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Write));
    let r = waits(&mut m, s, req(1, P2, range(5, 5), LockKind::Read));
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Read));
    assert_eq!(m.take_events(), vec![Event::Granted(r)]);
    granted(&mut m, s, req(2, F1, Scope::WholeFile, LockKind::Write));
    let r = waits(&mut m, s, req(2, F2, Scope::WholeFile, LockKind::Read));
    granted(&mut m, s, req(2, F1, Scope::WholeFile, LockKind::Read));
    assert_eq!(m.take_events(), vec![Event::Granted(r)]);
}

#[test]
fn a_cancelled_waiter_leaves_nothing_behind() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 9), LockKind::Read));
    let before = (m.locks(1), m.stats());
    let w = waits(&mut m, s, req(1, P2, range(0, 9), LockKind::Write));
    // A reader queued behind the writer goes once the writer is cancelled.
    let r = waits(&mut m, s, req(1, P3, range(5, 5), LockKind::Read));
    assert!(m.cancel(w));
    assert!(!m.cancel(w), "already gone");
    assert_eq!(m.take_events(), vec![Event::Granted(r)]);
    m.release(s, P3, None).unwrap();
    assert_eq!((m.locks(1), m.stats()), before);
    m.check_consistency().unwrap();
}

#[test]
fn two_and_three_owner_cycles_are_deadlocks() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, s, req(1, P2, range(1, 1), LockKind::Write));
    waits(&mut m, s, req(1, P1, range(1, 1), LockKind::Write));
    assert_eq!(
        m.set(s, req(1, P2, range(0, 0), LockKind::Write), true),
        Err(LockError::Deadlock)
    );

    // Three owners, three resources, and one of them a flock lock.
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, s, req(2, P2, range(0, 0), LockKind::Read));
    granted(&mut m, s, req(3, P3, Scope::WholeFile, LockKind::Write));
    waits(&mut m, s, req(2, P1, range(0, 5), LockKind::Write)); // P1 → P2
    waits(&mut m, s, req(3, P2, Scope::WholeFile, LockKind::Read)); // P2 → P3
    let before = (m.locks(1), m.waiting(1), m.stats());
    assert_eq!(
        m.set(s, req(1, P3, range(0, 0), LockKind::Read), true),
        Err(LockError::Deadlock)
    ); // P3 → P1
    assert_eq!(
        (m.locks(1), m.waiting(1), m.stats()),
        before,
        "refused: nothing changed"
    );
    m.check_consistency().unwrap();
}

#[test]
fn no_false_deadlock() {
    let (mut m, s) = manager();
    // A chain P3 → P2 → P1 is not a cycle, and neither is waiting on two holders of which
    // only the other one waits.
    granted(&mut m, s, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, s, req(1, P2, range(1, 1), LockKind::Write));
    let w2 = waits(&mut m, s, req(1, P2, range(0, 0), LockKind::Write));
    let w3 = waits(&mut m, s, req(1, P3, range(1, 1), LockKind::Write));
    // Shared read locks held by two owners, both wanted by a third: no cycle.
    granted(&mut m, s, req(2, P1, range(0, 9), LockKind::Read));
    granted(&mut m, s, req(2, P2, range(0, 9), LockKind::Read));
    let w3b = waits(&mut m, s, req(2, P3, range(0, 9), LockKind::Write));
    assert_eq!(m.stats().waits, 3);
    m.release(s, P1, None).unwrap();
    assert_eq!(m.take_events(), vec![Event::Granted(w2)]);
    m.release(s, P2, None).unwrap();
    let mut events = m.take_events();
    events.sort_by_key(|e| match e {
        Event::Granted(w) | Event::Refused(w, _) => *w,
    });
    assert_eq!(events, vec![Event::Granted(w3), Event::Granted(w3b)]);
    m.check_consistency().unwrap();
}

#[test]
fn an_expired_lease_releases_everything_wakes_waiters_and_fences_the_session() {
    let mut m = LockManager::new(Limits::default(), 1);
    let a = m.open_session(0, 1_000).unwrap();
    let b = m.open_session(0, 5_000).unwrap();
    granted(&mut m, a, req(1, P1, range(0, 9), LockKind::Write));
    granted(&mut m, a, req(1, P1, range(20, 29), LockKind::Read));
    granted(&mut m, a, req(2, F1, Scope::WholeFile, LockKind::Read));
    granted(&mut m, b, req(3, P2, range(0, 0), LockKind::Write));
    let own_wait = waits(&mut m, a, req(3, P1, range(0, 0), LockKind::Write));
    let w_write = waits(&mut m, b, req(1, P3, range(25, 25), LockKind::Write));
    let w_flock = waits(&mut m, b, req(2, F2, Scope::WholeFile, LockKind::Write));
    assert_eq!(m.renew(a, 900), Ok(1_900));
    assert_eq!(m.expire(1_899), vec![]);
    assert_eq!(m.next_deadline(), Some(1_900));
    assert_eq!(m.expire(1_900), vec![a]);
    let mut events = m.take_events();
    events.sort_by_key(|e| match e {
        Event::Granted(w) | Event::Refused(w, _) => *w,
    });
    assert_eq!(
        events,
        vec![
            Event::Refused(own_wait, LockError::Fenced(a)),
            Event::Granted(w_write),
            Event::Granted(w_flock)
        ]
    );
    assert!(m.locks(1).iter().all(|h| h.session == b));
    // The session comes back: refused, with the reason.
    let r = req(1, P1, range(0, 0), LockKind::Read);
    assert_eq!(m.set(a, r, false), Err(LockError::Fenced(a)));
    assert_eq!(m.renew(a, 1_901), Err(LockError::Fenced(a)));
    assert!(LockError::Fenced(a).to_string().contains("expired"));
    // A renewal after the deadline is refused even before `expire` runs.
    assert_eq!(m.renew(b, 5_001), Err(LockError::Fenced(b)));
    assert_eq!(m.stats(), Stats::default());
    // A session id from before a restart (below the new base) is fenced too.
    let m = LockManager::new(Limits::default(), 1 << 32);
    assert_eq!(m.test(a, r), Err(LockError::Fenced(a)));
    assert_eq!(m.test(1 << 40, r), Err(LockError::NoSuchSession(1 << 40)));
}

#[test]
fn limits_are_enforced_and_named() {
    let limits = Limits {
        sessions_max: 1,
        locks_per_session_max: 4,
        waits_per_session_max: 1,
        ..Limits::default()
    };
    let mut m = LockManager::new(limits, 1);
    assert!(matches!(
        m.open_session(0, 1),
        Err(LockError::BadLease { .. })
    ));
    let s = m.open_session(0, LEASE_MS).unwrap();
    assert_eq!(
        m.open_session(0, LEASE_MS),
        Err(LockError::TooManySessions { limit: 1 })
    );
    granted(&mut m, s, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, s, req(1, P1, range(2, 2), LockKind::Write));
    waits(&mut m, s, req(1, P2, range(0, 0), LockKind::Write));
    assert_eq!(
        m.set(s, req(1, P3, range(0, 0), LockKind::Write), true),
        Err(LockError::TooManyWaits { limit: 1 })
    );
    granted(&mut m, s, req(1, P1, range(4, 4), LockKind::Write));
    // A set may split a lock in three, so it needs room for two more.
    assert_eq!(
        m.set(s, req(1, P1, range(6, 6), LockKind::Write), false),
        Err(LockError::TooManyLocks { limit: 4 })
    );
    m.check_consistency().unwrap();
}

#[test]
fn a_session_opened_with_fewer_locks_is_held_to_them_and_others_are_not() {
    let limits = Limits {
        locks_per_session_max: 8,
        ..Limits::default()
    };
    let mut m = LockManager::new(limits, 1);
    let small = m.open_session_with(0, LEASE_MS, 3).unwrap();
    let full = m.open_session(0, LEASE_MS).unwrap();
    // Never more than the manager's own limit, whatever is asked.
    let asked_more = m.open_session_with(0, LEASE_MS, 1 << 40).unwrap();
    granted(&mut m, small, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, small, req(1, P1, range(2, 2), LockKind::Write));
    // A set needs room for two more (it may split a lock in three).
    assert_eq!(
        m.set(small, req(1, P1, range(4, 4), LockKind::Write), false),
        Err(LockError::TooManyLocks { limit: 3 })
    );
    for i in 0..6 {
        granted(
            &mut m,
            full,
            req(2, P2, range(2 * i, 2 * i), LockKind::Write),
        );
    }
    for i in 0..7 {
        granted(
            &mut m,
            asked_more,
            req(3, P3, range(2 * i, 2 * i), LockKind::Write),
        );
    }
    assert_eq!(
        m.set(
            asked_more,
            req(3, P3, range(20, 20), LockKind::Write),
            false
        ),
        Err(LockError::TooManyLocks { limit: 8 })
    );
    m.check_consistency().unwrap();
}

#[test]
fn locks_in_all_are_bounded_whatever_each_session_may_hold() {
    let limits = Limits {
        locks_per_session_max: 100,
        locks_max: 5,
        ..Limits::default()
    };
    let mut m = LockManager::new(limits, 1);
    let a = m.open_session(0, LEASE_MS).unwrap();
    let b = m.open_session(0, LEASE_MS).unwrap();
    granted(&mut m, a, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, a, req(1, P1, range(2, 2), LockKind::Write));
    granted(&mut m, b, req(2, P2, range(0, 0), LockKind::Write));
    // Three held: a set needs room for two more, which would make five.
    granted(&mut m, b, req(2, P2, range(2, 2), LockKind::Write));
    assert_eq!(
        m.set(b, req(2, P2, range(4, 4), LockKind::Write), false),
        Err(LockError::TooManyLocks { limit: 5 })
    );
    assert_eq!(
        m.set(a, req(3, P1, range(0, 0), LockKind::Read), false),
        Err(LockError::TooManyLocks { limit: 5 })
    );
    // Room comes back when locks go.
    m.unlock(a, 1, P1, range(0, 2)).unwrap();
    granted(&mut m, b, req(2, P2, range(4, 4), LockKind::Write));
    m.check_consistency().unwrap();
}

#[test]
fn requests_are_counted_by_how_they_ended() {
    let (mut m, s) = manager();
    granted(&mut m, s, req(1, P1, range(0, 0), LockKind::Write));
    granted(&mut m, s, req(1, P2, range(1, 1), LockKind::Write));
    assert!(matches!(
        m.set(s, req(1, P3, range(0, 0), LockKind::Write), false),
        Err(LockError::Conflict(_))
    ));
    waits(&mut m, s, req(1, P1, range(1, 1), LockKind::Write));
    assert_eq!(
        m.set(s, req(1, P2, range(0, 0), LockKind::Write), true),
        Err(LockError::Deadlock)
    );
    m.release(s, P2, None).unwrap();
    // A session of a 100 ms lease, never renewed, expires; the test's own (10 s) does not.
    let t = m.open_session(0, 100).unwrap();
    assert_eq!(m.expire(1_000), vec![t]);
    let counts = m.counts();
    assert_eq!(
        (
            counts.granted,
            counts.granted_after_wait,
            counts.conflicts,
            counts.deadlocks,
            counts.expired
        ),
        (2, 1, 1, 1, 1)
    );
}
