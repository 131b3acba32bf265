//! Model-based test of the whole manager: record and flock locks of several owners in two
//! sessions on two resources, blocking and non-blocking requests, unlock, release, cancel,
//! session close and fencing, run side by side with a simple model that keeps a byte array per
//! owner and one list of waiting requests in arrival order, and settles by granting the first
//! grantable waiting request until none is left. Every answer, every event and the whole lock
//! set are compared after every step, and the manager's own consistency check (which includes
//! "no waiting request could be granted now") must pass.

use std::collections::{BTreeMap, BTreeSet};

use calm_locks::{
    Event, Holder, Limits, LockError, LockKind, LockManager, Outcome, Owner, Range, Request, Scope,
    SessionId,
};
use proptest::prelude::*;

const SIZE: usize = 24;
const RESOURCES: u64 = 2;
const LEASE_MS: u64 = 1_000;

/// Locks an account may hold in the model: small, so that the limit is met.
const ACCOUNT_LOCKS_MAX: u64 = 6;

/// The account an owner's locks count against (two owners each, over both sessions).
fn account(n: u8) -> u32 {
    u32::from(n % 2)
}

/// An owner inside a session slot.
fn owner(n: u8) -> Owner {
    match n {
        0 => Owner::Process { pid: 100 },
        1 => Owner::Process { pid: 101 },
        2 => Owner::File { file: 7 },
        _ => Owner::File { file: 8 },
    }
}

#[derive(Debug, Clone)]
enum Op {
    Set {
        slot: usize,
        owner: u8,
        resource: u64,
        scope: Option<(u64, u64)>,
        kind: LockKind,
        wait: bool,
    },
    Unlock {
        slot: usize,
        owner: u8,
        resource: u64,
        scope: Option<(u64, u64)>,
    },
    Test {
        slot: usize,
        owner: u8,
        resource: u64,
        scope: Option<(u64, u64)>,
        kind: LockKind,
    },
    Release {
        slot: usize,
        owner: u8,
        resource: Option<u64>,
    },
    Cancel(usize),
    Close(usize),
    /// The resource's locks moved to another server: everything on it is dropped.
    Drop(u64),
}

fn kind() -> impl Strategy<Value = LockKind> {
    prop_oneof![Just(LockKind::Read), Just(LockKind::Write)]
}

fn scope() -> impl Strategy<Value = Option<(u64, u64)>> {
    prop_oneof![
        5 => (0..SIZE as u64, 0..8u64)
            .prop_map(|(a, len)| Some((a, (a + len).min(SIZE as u64 - 1)))),
        1 => Just(None),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..2usize;
    let who = 0..4u8;
    let resource = 1..=RESOURCES;
    prop_oneof![
        8 => (slot.clone(), who.clone(), resource.clone(), scope(), kind(), any::<bool>())
            .prop_map(|(slot, owner, resource, scope, kind, wait)| Op::Set { slot, owner, resource, scope, kind, wait }),
        3 => (slot.clone(), who.clone(), resource.clone(), scope())
            .prop_map(|(slot, owner, resource, scope)| Op::Unlock { slot, owner, resource, scope }),
        2 => (slot.clone(), who.clone(), resource.clone(), scope(), kind())
            .prop_map(|(slot, owner, resource, scope, kind)| Op::Test { slot, owner, resource, scope, kind }),
        1 => (slot.clone(), who.clone(), prop::option::of(resource.clone()))
            .prop_map(|(slot, owner, resource)| Op::Release { slot, owner, resource }),
        2 => (0..4usize).prop_map(Op::Cancel),
        1 => slot.prop_map(Op::Close),
        1 => resource.clone().prop_map(Op::Drop),
    ]
}

type Key = (SessionId, Owner);

fn to_scope(scope: Option<(u64, u64)>) -> Scope {
    match scope {
        Some((start, end)) => Scope::Range(Range { start, end }),
        None => Scope::WholeFile,
    }
}

#[derive(Default, Clone)]
struct Held {
    bytes: [Option<LockKind>; SIZE],
    flock: Option<LockKind>,
}

#[derive(Default)]
struct Model {
    /// (resource, owner) → what it holds.
    held: BTreeMap<(u64, Key), Held>,
    /// Waiting requests in arrival order.
    queue: Vec<(u64, Key, Request)>,
    next_wait: u64,
}

impl Model {
    fn holds_anything(&self, key: Key) -> bool {
        self.held.iter().any(|((_, k), h)| {
            *k == key && (h.flock.is_some() || h.bytes.iter().any(Option::is_some))
        })
    }

    /// Owners holding a lock that `request` by `key` conflicts with.
    fn blockers(&self, key: Key, request: &Request) -> BTreeSet<Key> {
        let mut out = BTreeSet::new();
        for ((resource, other), held) in &self.held {
            if *resource != request.resource || *other == key {
                continue;
            }
            let hit = match request.scope {
                Scope::WholeFile => held.flock.is_some_and(|k| k.conflicts_with(request.kind)),
                Scope::Range(r) => (r.start..=r.end).any(|x| {
                    held.bytes[x as usize].is_some_and(|k| k.conflicts_with(request.kind))
                }),
            };
            if hit {
                out.insert(*other);
            }
        }
        out
    }

    fn overlaps(a: &Request, b: &Request) -> bool {
        a.resource == b.resource
            && match (a.scope, b.scope) {
                (Scope::WholeFile, Scope::WholeFile) => true,
                (Scope::Range(x), Scope::Range(y)) => x.start <= y.end && y.start <= x.end,
                _ => false,
            }
    }

    fn queued_ahead(&self, upto: usize, key: Key, request: &Request) -> bool {
        self.queue[..upto].iter().any(|(_, k, r)| {
            *k != key && Self::overlaps(r, request) && r.kind.conflicts_with(request.kind)
        })
    }

    fn grantable(&self, upto: usize, key: Key, request: &Request) -> bool {
        self.blockers(key, request).is_empty()
            && (self.holds_anything(key) || !self.queued_ahead(upto, key, request))
    }

    fn apply(&mut self, key: Key, request: &Request, value: Option<LockKind>) {
        let held = self.held.entry((request.resource, key)).or_default();
        match request.scope {
            Scope::WholeFile => held.flock = value,
            Scope::Range(r) => {
                for x in r.start..=r.end {
                    held.bytes[x as usize] = value;
                }
            }
        }
    }

    fn deadlock(&self, key: Key, request: &Request) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Key> = self.blockers(key, request).into_iter().collect();
        while let Some(k) = stack.pop() {
            if k == key {
                return true;
            }
            if !seen.insert(k) {
                continue;
            }
            for (_, waiter, r) in &self.queue {
                if *waiter == k {
                    stack.extend(self.blockers(k, r));
                }
            }
        }
        false
    }

    /// Grants the first grantable waiting request until none is left.
    fn settle(&mut self, events: &mut Vec<Event>) {
        loop {
            let next = (0..self.queue.len()).find(|i| {
                let (_, key, request) = &self.queue[*i];
                self.grantable(*i, *key, request)
            });
            let Some(i) = next else { return };
            let (wait, key, request) = self.queue.remove(i);
            self.apply(key, &request, Some(request.kind));
            events.push(Event::Granted(wait));
        }
    }

    /// Locks held by the owners of account `a`, over every session.
    fn account_locks(&self, a: u32) -> u64 {
        self.holders()
            .iter()
            .filter(|(_, h)| (0..4).any(|o| owner(o) == h.owner && account(o) == a))
            .count() as u64
    }

    /// Whether the manager knows `key` (it holds or waits for a lock).
    fn known(&self, key: Key) -> bool {
        self.holds_anything(key) || self.queue.iter().any(|(_, k, _)| *k == key)
    }

    fn count(&self, key: Key, resource: Option<u64>) -> u64 {
        self.holders()
            .iter()
            .filter(|(r, h)| (h.session, h.owner) == key && resource.is_none_or(|x| x == *r))
            .count() as u64
    }

    fn release(&mut self, key: Key, resource: Option<u64>) {
        for ((r, k), held) in self.held.iter_mut() {
            if *k == key && resource.is_none_or(|x| x == *r) {
                *held = Held::default();
            }
        }
    }

    /// Every lock, as the manager lists them: maximal runs of one type per owner.
    fn holders(&self) -> Vec<(u64, Holder)> {
        let mut out = Vec::new();
        for ((resource, (session, owner)), held) in &self.held {
            let mut x = 0;
            while x < SIZE {
                let Some(kind) = held.bytes[x] else {
                    x += 1;
                    continue;
                };
                let start = x;
                while x < SIZE && held.bytes[x] == Some(kind) {
                    x += 1;
                }
                let range = Range {
                    start: start as u64,
                    end: x as u64 - 1,
                };
                out.push((
                    *resource,
                    Holder {
                        session: *session,
                        owner: *owner,
                        scope: Scope::Range(range),
                        kind,
                    },
                ));
            }
            if let Some(kind) = held.flock {
                out.push((
                    *resource,
                    Holder {
                        session: *session,
                        owner: *owner,
                        scope: Scope::WholeFile,
                        kind,
                    },
                ));
            }
        }
        out.sort();
        out
    }
}

fn sorted(mut events: Vec<Event>) -> Vec<(u64, bool)> {
    let mut out: Vec<(u64, bool)> = events
        .drain(..)
        .map(|e| match e {
            Event::Granted(w) => (w, true),
            Event::Refused(w, _) => (w, false),
        })
        .collect();
    out.sort();
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn manager_matches_the_model(ops in prop::collection::vec(op(), 1..80)) {
        let limits = Limits { locks_per_account_max: ACCOUNT_LOCKS_MAX, ..Limits::default() };
        let mut real = LockManager::new(limits, 1);
        let mut model = Model { next_wait: 1, ..Model::default() };
        let mut slots = [real.open_session(0, LEASE_MS).unwrap(), real.open_session(0, LEASE_MS).unwrap()];
        let mut fenced: Vec<SessionId> = Vec::new();
        for op in &ops {
            let mut expected = Vec::new();
            match op.clone() {
                Op::Set { slot, owner: o, resource, scope, kind, wait } => {
                    let key = (slots[slot], owner(o));
                    let request = Request { resource, owner: owner(o), scope: to_scope(scope), kind };
                    let answer = real.set_for(slots[slot], Some(account(o)), request, wait);
                    let blockers = model.blockers(key, &request);
                    if model.account_locks(account(o)) + 2 > ACCOUNT_LOCKS_MAX {
                        prop_assert_eq!(answer, Err(LockError::TooManyLocks { limit: ACCOUNT_LOCKS_MAX }), "{:?}", op);
                    } else if !blockers.is_empty() {
                        if wait {
                            if model.deadlock(key, &request) {
                                prop_assert_eq!(answer, Err(LockError::Deadlock), "{:?}", op);
                            } else {
                                prop_assert_eq!(answer, Ok(Outcome::Waiting(model.next_wait)), "{:?}", op);
                                model.queue.push((model.next_wait, key, request));
                                model.next_wait += 1;
                            }
                        } else {
                            match answer {
                                Err(LockError::Conflict(holder)) => {
                                    prop_assert!(blockers.contains(&(holder.session, holder.owner)), "{:?}: {:?}", op, holder);
                                    prop_assert!(model.holders().contains(&(resource, holder)), "{:?}: {:?} not held", op, holder);
                                }
                                other => prop_assert!(false, "{:?}: expected a conflict, got {:?}", op, other),
                            }
                        }
                    } else if !model.holds_anything(key) && model.queued_ahead(model.queue.len(), key, &request) {
                        if wait {
                            prop_assert_eq!(answer, Ok(Outcome::Waiting(model.next_wait)), "{:?}", op);
                            model.queue.push((model.next_wait, key, request));
                            model.next_wait += 1;
                        } else {
                            prop_assert_eq!(answer, Err(LockError::Queued), "{:?}", op);
                        }
                    } else {
                        prop_assert_eq!(answer, Ok(Outcome::Granted), "{:?}", op);
                        model.apply(key, &request, Some(kind));
                    }
                }
                Op::Unlock { slot, owner: o, resource, scope } => {
                    let key = (slots[slot], owner(o));
                    let request = Request { resource, owner: owner(o), scope: to_scope(scope), kind: LockKind::Read };
                    let answer = real.unlock(slots[slot], resource, owner(o), to_scope(scope));
                    if model.known(key) && model.account_locks(account(o)) + 1 > ACCOUNT_LOCKS_MAX {
                        prop_assert_eq!(answer, Err(LockError::TooManyLocks { limit: ACCOUNT_LOCKS_MAX }), "{:?}", op);
                    } else {
                        prop_assert_eq!(answer, Ok(()), "{:?}", op);
                        model.apply(key, &request, None);
                    }
                }
                Op::Test { slot, owner: o, resource, scope, kind } => {
                    let key = (slots[slot], owner(o));
                    let request = Request { resource, owner: owner(o), scope: to_scope(scope), kind };
                    let blockers = model.blockers(key, &request);
                    match real.test(slots[slot], request).unwrap() {
                        Some(holder) => {
                            prop_assert!(blockers.contains(&(holder.session, holder.owner)), "{:?}: {:?}", op, holder);
                            prop_assert!(model.holders().contains(&(resource, holder)));
                        }
                        None => prop_assert!(blockers.is_empty(), "{:?} missed a conflict", op),
                    }
                }
                Op::Release { slot, owner: o, resource } => {
                    let key = (slots[slot], owner(o));
                    prop_assert_eq!(real.release(slots[slot], owner(o), resource), Ok(model.count(key, resource)));
                    model.release(key, resource);
                }
                Op::Cancel(i) => {
                    match model.queue.get(i).map(|(w, _, _)| *w) {
                        Some(wait) => {
                            prop_assert!(real.cancel(wait));
                            model.queue.retain(|(w, _, _)| *w != wait);
                        }
                        None => prop_assert!(!real.cancel(model.next_wait + 5)),
                    }
                }
                Op::Drop(resource) => {
                    let dropped = model
                        .holders()
                        .iter()
                        .filter(|(r, _)| *r == resource)
                        .count() as u64;
                    prop_assert_eq!(real.drop_resource(resource, LockError::Moved), dropped);
                    for (wait, _, request) in &model.queue {
                        if request.resource == resource {
                            expected.push(Event::Refused(*wait, LockError::Moved));
                        }
                    }
                    model.queue.retain(|(_, _, request)| request.resource != resource);
                    model.held.retain(|(r, _), _| *r != resource);
                    prop_assert!(real.resources().iter().all(|r| *r != resource));
                }
                Op::Close(slot) => {
                    let session = slots[slot];
                    prop_assert_eq!(real.close_session(session), Ok(()));
                    for (wait, key, _) in &model.queue {
                        if key.0 == session {
                            expected.push(Event::Refused(*wait, LockError::Fenced(session)));
                        }
                    }
                    model.queue.retain(|(_, key, _)| key.0 != session);
                    model.held.retain(|(_, key), _| key.0 != session);
                    fenced.push(session);
                    slots[slot] = real.open_session(0, LEASE_MS).unwrap();
                }
            }
            model.settle(&mut expected);
            prop_assert_eq!(sorted(real.take_events()), sorted(expected), "events after {:?}", op);
            let mut real_locks = Vec::new();
            for resource in 1..=RESOURCES {
                for holder in real.locks(resource) {
                    real_locks.push((resource, holder));
                }
            }
            real_locks.sort();
            prop_assert_eq!(real_locks, model.holders(), "locks after {:?}", op);
            let waiting: Vec<u64> = (1..=RESOURCES).flat_map(|r| real.waiting(r)).map(|w| w.wait).collect::<BTreeSet<_>>().into_iter().collect();
            let model_waiting: Vec<u64> = model.queue.iter().map(|(w, _, _)| *w).collect();
            prop_assert_eq!(waiting, model_waiting, "waiting after {:?}", op);
            if let Err(e) = real.check_consistency() {
                prop_assert!(false, "inconsistent after {:?}: {}", op, e);
            }
            for old in &fenced {
                let request = Request { resource: 1, owner: owner(0), scope: Scope::WholeFile, kind: LockKind::Read };
                prop_assert_eq!(real.set(*old, request, false), Err(LockError::Fenced(*old)));
            }
        }
    }
}
