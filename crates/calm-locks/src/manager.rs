//! The lock manager: every resource's record and flock locks, the requests waiting for them,
//! and the client sessions that own both. Pure and deterministic: the caller passes `now` where
//! time matters and collects what happened to waiting requests with [`LockManager::take_events`].
//!
//! Waiting (F_SETLKW, flock without LOCK_NB) without polling and without starvation:
//! - a waiting request is looked at again only when something changes on a range it overlaps
//!   (an unlock, a downgrade, a cancelled or granted waiter, the end of a session), never by
//!   a timer and never by the client;
//! - conflicting requests are granted in arrival order: a request that conflicts with an
//!   earlier waiter (overlapping, incompatible types, another owner) queues behind it even when
//!   the held locks would let it in, so a stream of readers cannot starve a writer. An owner
//!   that already holds a lock anywhere skips this rule, because an earlier waiter may be
//!   waiting for that very lock: queueing it would close a cycle no one could see. With the
//!   rule, an owner that waits behind a waiter holds nothing, so nothing waits for it, and every
//!   cycle of the wait-for graph is made of held locks only;
//! - deadlock detection walks that whole graph (owner → holders of every lock its waiting
//!   requests conflict with → their waiting requests …), with no depth cut-off: a request that
//!   would close a cycle gets EDEADLK, and nothing else does.
//!
//! Sessions: every owner lives in a client session with a lease. [`LockManager::expire`]
//! releases every lock of a session whose lease ran out, refuses its waiting requests and wakes
//! what waited for its locks; later requests in that session are refused as fenced. Session
//! ids grow from a base the caller chooses (the server uses its store epoch), so a session of
//! an earlier server life is fenced too, never mistaken for a new one.

use std::collections::{BTreeMap, BTreeSet};

use crate::flock::FlockTable;
use crate::range::{LockKind, OFFSET_MAX, Range};
use crate::ranges::{Lock, RangeLocks};
use crate::treap::Treap;

/// A lockable object: the server uses the inode handle.
pub type ResourceId = u64;
pub type SessionId = u64;
/// A waiting request, numbered in arrival order.
pub type WaitId = u64;

/// Who asks, inside a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A POSIX record-lock owner: one process of the session's client.
    Process { pid: u32 },
    /// An open file description: the owner of OFD record locks and of flock locks.
    File { file: u64 },
}

impl Owner {
    /// The pid F_GETLK reports for a lock of this owner: -1 for an open file description.
    pub fn pid(self) -> i32 {
        match self {
            Owner::Process { pid } => pid as i32,
            Owner::File { .. } => -1,
        }
    }
}

/// What a request locks: a byte range (POSIX and OFD record locks) or the whole file (flock).
/// The two never conflict with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Range(Range),
    WholeFile,
}

impl Scope {
    /// The bytes a change of this scope can matter to, for waking waiters.
    fn span(self) -> Range {
        match self {
            Scope::Range(range) => range,
            Scope::WholeFile => Range {
                start: 0,
                end: OFFSET_MAX,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    pub resource: ResourceId,
    pub owner: Owner,
    pub scope: Scope,
    pub kind: LockKind,
}

/// A held lock as the outside sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub session: SessionId,
    pub owner: Owner,
    pub scope: Scope,
    pub kind: LockKind,
}

/// A waiting request as the outside sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub wait: WaitId,
    pub session: SessionId,
    pub request: Request,
}

/// Named limits. A request past one is refused with an error that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub sessions_max: usize,
    /// Locks one session may hold over all its owners and resources (ENOLCK past it).
    pub locks_per_session_max: u64,
    /// Requests one session may have waiting at once.
    pub waits_per_session_max: u64,
    pub lease_ms_min: u64,
    pub lease_ms_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions_max: 65_536,
            locks_per_session_max: 1 << 24,
            waits_per_session_max: 65_536,
            lease_ms_min: 100,
            lease_ms_max: 600_000,
        }
    }
}

/// Why a request is refused. Expected conditions, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// EAGAIN: a held lock conflicts (F_SETLK, LOCK_NB); here is one.
    Conflict(Holder),
    /// EAGAIN: no held lock conflicts, but an earlier waiting request asked first.
    Queued,
    /// EDEADLK: waiting would close a cycle in the wait-for graph.
    Deadlock,
    /// The session's lease ran out (or it was closed): everything it held is gone.
    Fenced(SessionId),
    NoSuchSession(SessionId),
    /// ENOLCK: the session holds `locks_per_session_max` locks.
    TooManyLocks {
        limit: u64,
    },
    TooManyWaits {
        limit: u64,
    },
    TooManySessions {
        limit: usize,
    },
    /// A lease outside `[lease_ms_min, lease_ms_max]`.
    BadLease {
        min_ms: u64,
        max_ms: u64,
    },
    /// The waiting request was cancelled (EINTR).
    Cancelled,
    /// The file's locks are now decided by another server (several servers on one store).
    Moved,
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Conflict(holder) => write!(
                f,
                "conflicts with a {:?} lock of session {} {:?} on {:?}",
                holder.kind, holder.session, holder.owner, holder.scope
            ),
            LockError::Queued => write!(f, "an earlier waiting request conflicts"),
            LockError::Deadlock => write!(f, "waiting would deadlock"),
            LockError::Fenced(session) => write!(
                f,
                "session {session} has expired or was closed and its locks were released; \
                 open a new session"
            ),
            LockError::NoSuchSession(session) => write!(f, "no session {session}"),
            LockError::TooManyLocks { limit } => {
                write!(f, "the session holds its limit of {limit} locks")
            }
            LockError::TooManyWaits { limit } => {
                write!(f, "the session has its limit of {limit} waiting requests")
            }
            LockError::TooManySessions { limit } => {
                write!(f, "the server has its limit of {limit} sessions")
            }
            LockError::BadLease { min_ms, max_ms } => {
                write!(f, "a lease must be between {min_ms} and {max_ms} ms")
            }
            LockError::Cancelled => write!(f, "the waiting request was cancelled"),
            LockError::Moved => write!(f, "another server decides this file's locks now"),
        }
    }
}

impl std::error::Error for LockError {}

/// What became of a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Granted(WaitId),
    /// Refused after waiting: its session expired or was closed.
    Refused(WaitId, LockError),
}

/// The answer to a request that may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Granted,
    /// Queued; an [`Event`] with this id will say how it ended.
    Waiting(WaitId),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub resources: usize,
    pub locks: u64,
    pub waits: usize,
}

/// Internal owner number; 0 is nobody.
type OwnerIdx = u64;
const NOBODY: OwnerIdx = 0;

#[derive(Debug, Clone)]
struct OwnerState {
    session: SessionId,
    owner: Owner,
    /// Locks held over all resources.
    held: u64,
    /// Resources where it holds at least one lock.
    resources: BTreeSet<ResourceId>,
    waits: BTreeSet<WaitId>,
}

#[derive(Debug, Clone)]
struct SessionState {
    lease_ms: u64,
    deadline_ms: u64,
    owners: BTreeSet<OwnerIdx>,
    locks: u64,
    waits: u64,
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    owner: OwnerIdx,
    request: Request,
}

#[derive(Debug, Clone, Default)]
struct Resource {
    ranges: RangeLocks,
    flock: FlockTable,
    /// Waiting record-lock requests: key `(start, wait id)`, the wait id in the owner slot.
    range_waits: Treap,
    flock_waits: BTreeSet<WaitId>,
}

impl Resource {
    fn is_idle(&self) -> bool {
        self.ranges.is_empty()
            && self.flock.is_empty()
            && self.range_waits.is_empty()
            && self.flock_waits.is_empty()
    }

    fn owned(&self, owner: OwnerIdx) -> u64 {
        self.ranges.owner_len(owner) as u64 + u64::from(self.flock.held_by(owner).is_some())
    }

    /// Calls `visit` with every held lock `kind` on `scope` by `owner` conflicts with.
    fn visit_conflicts(
        &self,
        owner: OwnerIdx,
        scope: Scope,
        kind: LockKind,
        visit: &mut dyn FnMut(OwnerIdx, Scope, LockKind) -> bool,
    ) {
        match scope {
            Scope::Range(range) => self
                .ranges
                .visit_conflicts(owner, range, kind, &mut |lock| {
                    visit(lock.owner, Scope::Range(lock.range), lock.kind)
                }),
            Scope::WholeFile => self
                .flock
                .visit_conflicts(owner, kind, &mut |holder, held| {
                    visit(holder, Scope::WholeFile, held)
                }),
        }
    }

    fn conflict(&self, owner: OwnerIdx, scope: Scope, kind: LockKind) -> Option<Lock> {
        let mut found = None;
        self.visit_conflicts(owner, scope, kind, &mut |holder, scope, kind| {
            found = Some(Lock {
                owner: holder,
                range: scope.span(),
                kind,
            });
            false
        });
        found
    }
}

/// Every lock and waiting request of the server.
#[derive(Debug, Clone)]
pub struct LockManager {
    limits: Limits,
    resources: BTreeMap<ResourceId, Resource>,
    owner_idx: BTreeMap<(SessionId, Owner), OwnerIdx>,
    owners: BTreeMap<OwnerIdx, OwnerState>,
    sessions: BTreeMap<SessionId, SessionState>,
    /// `(deadline_ms, session)` of every session, soonest first.
    deadlines: BTreeSet<(u64, SessionId)>,
    waits: BTreeMap<WaitId, Waiter>,
    /// Every session id below this one was handed out (or belongs to an earlier server life,
    /// below the base): one that is not live is fenced.
    next_session: SessionId,
    next_owner: OwnerIdx,
    next_wait: WaitId,
    locks: u64,
    /// Waiting requests to look at again, in arrival order.
    work: BTreeSet<WaitId>,
    events: Vec<Event>,
}

impl LockManager {
    /// A manager whose session ids start at `session_base` (>= 1); every id below it is
    /// fenced.
    pub fn new(limits: Limits, session_base: SessionId) -> Self {
        let session_base = session_base.max(1);
        LockManager {
            limits,
            resources: BTreeMap::new(),
            owner_idx: BTreeMap::new(),
            owners: BTreeMap::new(),
            sessions: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            waits: BTreeMap::new(),
            next_session: session_base,
            next_owner: NOBODY + 1,
            next_wait: 1,
            locks: 0,
            work: BTreeSet::new(),
            events: Vec::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.sessions.len(),
            resources: self.resources.len(),
            locks: self.locks,
            waits: self.waits.len(),
        }
    }

    /// What happened to waiting requests since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    // ---- sessions ----

    pub fn open_session(&mut self, now_ms: u64, lease_ms: u64) -> Result<SessionId, LockError> {
        self.check_lease(lease_ms)?;
        if self.sessions.len() >= self.limits.sessions_max {
            return Err(LockError::TooManySessions {
                limit: self.limits.sessions_max,
            });
        }
        let session = self.next_session;
        self.next_session += 1;
        let deadline_ms = now_ms.saturating_add(lease_ms);
        self.sessions.insert(
            session,
            SessionState {
                lease_ms,
                deadline_ms,
                owners: BTreeSet::new(),
                locks: 0,
                waits: 0,
            },
        );
        self.deadlines.insert((deadline_ms, session));
        Ok(session)
    }

    fn check_lease(&self, lease_ms: u64) -> Result<(), LockError> {
        if lease_ms < self.limits.lease_ms_min || lease_ms > self.limits.lease_ms_max {
            return Err(LockError::BadLease {
                min_ms: self.limits.lease_ms_min,
                max_ms: self.limits.lease_ms_max,
            });
        }
        Ok(())
    }

    /// Extends the lease to `now_ms + lease_ms`; returns the new deadline. A session whose
    /// deadline has passed is expired here and refused, even if [`Self::expire`] has not run.
    pub fn renew(&mut self, session: SessionId, now_ms: u64) -> Result<u64, LockError> {
        self.live(session)?;
        let state = &self.sessions[&session];
        if state.deadline_ms <= now_ms {
            self.end_session(session, LockError::Fenced(session));
            return Err(LockError::Fenced(session));
        }
        let old = (state.deadline_ms, session);
        let deadline_ms = now_ms.saturating_add(state.lease_ms);
        self.deadlines.remove(&old);
        self.deadlines.insert((deadline_ms, session));
        self.sessions.get_mut(&session).expect("live").deadline_ms = deadline_ms;
        Ok(deadline_ms)
    }

    /// Ends a session now: its locks are released, its waiting requests refused.
    pub fn close_session(&mut self, session: SessionId) -> Result<(), LockError> {
        self.live(session)?;
        self.end_session(session, LockError::Fenced(session));
        Ok(())
    }

    /// Ends every session whose lease ran out by `now_ms`; returns them.
    pub fn expire(&mut self, now_ms: u64) -> Vec<SessionId> {
        let mut expired = Vec::new();
        while let Some(&(deadline_ms, session)) = self.deadlines.first() {
            if deadline_ms > now_ms {
                break;
            }
            self.end_session(session, LockError::Fenced(session));
            expired.push(session);
        }
        expired
    }

    /// The sessions open now, in order.
    pub fn sessions(&self) -> Vec<SessionId> {
        self.sessions.keys().copied().collect()
    }

    /// The soonest lease deadline, for the caller's timer.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first().map(|(deadline_ms, _)| *deadline_ms)
    }

    /// Whether `session` may be used: live, fenced (ended), or never handed out.
    pub fn live(&self, session: SessionId) -> Result<(), LockError> {
        if self.sessions.contains_key(&session) {
            Ok(())
        } else if session < self.next_session {
            Err(LockError::Fenced(session))
        } else {
            Err(LockError::NoSuchSession(session))
        }
    }

    fn end_session(&mut self, session: SessionId, error: LockError) {
        let Some(state) = self.sessions.get(&session) else {
            return;
        };
        let owners: Vec<OwnerIdx> = state.owners.iter().copied().collect();
        self.deadlines.remove(&(state.deadline_ms, session));
        let mut touched = BTreeSet::new();
        for owner in owners {
            let waits: Vec<WaitId> = self.owners[&owner].waits.iter().copied().collect();
            for wait in waits {
                let waiter = self.unqueue(wait);
                self.trigger(waiter.request.resource, waiter.request.scope);
                touched.insert(waiter.request.resource);
                self.events.push(Event::Refused(wait, error));
            }
            self.release_everything(owner);
            self.forget_if_idle(owner);
        }
        self.sessions.remove(&session);
        self.run();
        for resource in touched {
            self.forget_resource_if_idle(resource);
        }
    }

    // ---- requests ----

    /// A held lock that `request` would conflict with (F_GETLK), if any.
    pub fn test(&self, session: SessionId, request: Request) -> Result<Option<Holder>, LockError> {
        self.live(session)?;
        let owner = self
            .owner_idx
            .get(&(session, request.owner))
            .copied()
            .unwrap_or(NOBODY);
        Ok(self.resources.get(&request.resource).and_then(|resource| {
            resource
                .conflict(owner, request.scope, request.kind)
                .map(|lock| self.holder(lock, request.scope))
        }))
    }

    /// Takes a lock. Without `wait`, a conflict is refused at once (F_SETLK, LOCK_NB); with
    /// it, the request waits unless waiting would deadlock (F_SETLKW).
    pub fn set(
        &mut self,
        session: SessionId,
        request: Request,
        wait: bool,
    ) -> Result<Outcome, LockError> {
        self.live(session)?;
        let limit = self.limits.locks_per_session_max;
        // A set can add two locks (splitting one of the other type in three).
        if self.sessions[&session].locks + 2 > limit {
            return Err(LockError::TooManyLocks { limit });
        }
        let owner = self.owner_of(session, request.owner);
        let outcome = self.set_as(owner, request, wait);
        self.forget_if_idle(owner);
        self.forget_resource_if_idle(request.resource);
        outcome
    }

    fn set_as(
        &mut self,
        owner: OwnerIdx,
        request: Request,
        wait: bool,
    ) -> Result<Outcome, LockError> {
        let resource = self.resources.entry(request.resource).or_default();
        if let Some(conflict) = resource.conflict(owner, request.scope, request.kind) {
            if !wait {
                return Err(LockError::Conflict(self.holder(conflict, request.scope)));
            }
            if self.would_deadlock(owner, request) {
                return Err(LockError::Deadlock);
            }
            return self.enqueue(owner, request).map(Outcome::Waiting);
        }
        if self.owners[&owner].held == 0 && self.queued_ahead(None, owner, request) {
            if !wait {
                return Err(LockError::Queued);
            }
            return self.enqueue(owner, request).map(Outcome::Waiting);
        }
        self.apply(owner, request);
        self.run();
        Ok(Outcome::Granted)
    }

    /// Releases `owner`'s locks in `scope` on `resource` (F_UNLCK, LOCK_UN).
    pub fn unlock(
        &mut self,
        session: SessionId,
        resource: ResourceId,
        owner: Owner,
        scope: Scope,
    ) -> Result<(), LockError> {
        self.live(session)?;
        let limit = self.limits.locks_per_session_max;
        // Unlocking the middle of a lock leaves two.
        if self.sessions[&session].locks + 1 > limit {
            return Err(LockError::TooManyLocks { limit });
        }
        let Some(&idx) = self.owner_idx.get(&(session, owner)) else {
            return Ok(());
        };
        let Some(state) = self.resources.get_mut(&resource) else {
            return Ok(());
        };
        let before = state.owned(idx);
        let released = match scope {
            Scope::Range(range) => state.ranges.unlock(idx, range),
            Scope::WholeFile => state.flock.unlock(idx),
        };
        let after = state.owned(idx);
        self.account(idx, resource, before, after);
        if released {
            self.trigger(resource, scope);
        }
        self.run();
        self.forget_if_idle(idx);
        self.forget_resource_if_idle(resource);
        Ok(())
    }

    /// Releases every lock of `owner` on `resource`, or everywhere (a close, the end of a
    /// process). Returns how many locks it held. Its waiting requests stay.
    pub fn release(
        &mut self,
        session: SessionId,
        owner: Owner,
        resource: Option<ResourceId>,
    ) -> Result<u64, LockError> {
        self.live(session)?;
        let Some(&idx) = self.owner_idx.get(&(session, owner)) else {
            return Ok(0);
        };
        let released = match resource {
            Some(resource) => self.release_on(idx, resource),
            None => self.release_everything(idx),
        };
        self.run();
        self.forget_if_idle(idx);
        Ok(released)
    }

    /// Cancels a waiting request (EINTR): it leaves nothing behind, and what queued behind it
    /// is looked at again. Returns whether it was waiting.
    pub fn cancel(&mut self, wait: WaitId) -> bool {
        let Some(waiter) = self.waits.get(&wait).copied() else {
            return false;
        };
        self.unqueue(wait);
        self.trigger(waiter.request.resource, waiter.request.scope);
        self.run();
        self.forget_if_idle(waiter.owner);
        self.forget_resource_if_idle(waiter.request.resource);
        true
    }

    /// Drops every lock on `resource` and refuses its waiting requests with `error`: another
    /// server decides the file's locks now, and their owners take them again there. Returns
    /// how many locks were dropped.
    pub fn drop_resource(&mut self, resource: ResourceId, error: LockError) -> u64 {
        let waits: Vec<WaitId> = self
            .waits
            .iter()
            .filter(|(_, w)| w.request.resource == resource)
            .map(|(wait, _)| *wait)
            .collect();
        let mut owners = BTreeSet::new();
        for wait in waits {
            let waiter = self.unqueue(wait);
            owners.insert(waiter.owner);
            self.events.push(Event::Refused(wait, error));
        }
        if let Some(state) = self.resources.get(&resource) {
            owners.extend(state.ranges.locks().into_iter().map(|lock| lock.owner));
            owners.extend(state.flock.holders().into_iter().map(|(owner, _)| owner));
        }
        let mut dropped = 0;
        for owner in owners {
            dropped += self.release_on(owner, resource);
            self.forget_if_idle(owner);
        }
        self.run();
        self.forget_resource_if_idle(resource);
        dropped
    }

    /// Every resource with a lock or a waiting request.
    pub fn resources(&self) -> Vec<ResourceId> {
        self.resources.keys().copied().collect()
    }

    // ---- listing ----

    /// Every lock held on `resource`: record locks by owner then start, then flock holders.
    pub fn locks(&self, resource: ResourceId) -> Vec<Holder> {
        let Some(state) = self.resources.get(&resource) else {
            return Vec::new();
        };
        let ranges = state
            .ranges
            .locks()
            .into_iter()
            .map(|lock| self.holder(lock, Scope::Range(lock.range)));
        let flock = state.flock.holders().into_iter().map(|(owner, kind)| {
            let lock = Lock {
                owner,
                range: Scope::WholeFile.span(),
                kind,
            };
            self.holder(lock, Scope::WholeFile)
        });
        let mut out: Vec<Holder> = ranges.chain(flock).collect();
        out.sort();
        out
    }

    /// Every waiting request on `resource`, in arrival order.
    pub fn waiting(&self, resource: ResourceId) -> Vec<Waiting> {
        self.waits
            .iter()
            .filter(|(_, w)| w.request.resource == resource)
            .map(|(wait, w)| Waiting {
                wait: *wait,
                session: self.owners[&w.owner].session,
                request: w.request,
            })
            .collect()
    }

    /// The session a waiting request belongs to.
    pub fn wait_session(&self, wait: WaitId) -> Option<SessionId> {
        self.waits.get(&wait).map(|w| self.owners[&w.owner].session)
    }

    // ---- internals ----

    fn holder(&self, lock: Lock, scope: Scope) -> Holder {
        let state = &self.owners[&lock.owner];
        let scope = match scope {
            Scope::Range(_) => Scope::Range(lock.range),
            Scope::WholeFile => Scope::WholeFile,
        };
        Holder {
            session: state.session,
            owner: state.owner,
            scope,
            kind: lock.kind,
        }
    }

    fn owner_of(&mut self, session: SessionId, owner: Owner) -> OwnerIdx {
        if let Some(idx) = self.owner_idx.get(&(session, owner)) {
            return *idx;
        }
        let idx = self.next_owner;
        self.next_owner += 1;
        self.owner_idx.insert((session, owner), idx);
        self.owners.insert(
            idx,
            OwnerState {
                session,
                owner,
                held: 0,
                resources: BTreeSet::new(),
                waits: BTreeSet::new(),
            },
        );
        self.sessions
            .get_mut(&session)
            .expect("live session")
            .owners
            .insert(idx);
        idx
    }

    fn forget_if_idle(&mut self, idx: OwnerIdx) {
        let Some(state) = self.owners.get(&idx) else {
            return;
        };
        if state.held == 0 && state.waits.is_empty() {
            let key = (state.session, state.owner);
            if let Some(session) = self.sessions.get_mut(&state.session) {
                session.owners.remove(&idx);
            }
            self.owner_idx.remove(&key);
            self.owners.remove(&idx);
        }
    }

    fn forget_resource_if_idle(&mut self, resource: ResourceId) {
        if self.resources.get(&resource).is_some_and(Resource::is_idle) {
            self.resources.remove(&resource);
        }
    }

    /// Books a change of `owner`'s lock count on `resource` from `before` to `after`.
    fn account(&mut self, owner: OwnerIdx, resource: ResourceId, before: u64, after: u64) {
        let state = self.owners.get_mut(&owner).expect("known owner");
        let was_empty = state.held == 0;
        state.held = state.held + after - before;
        if after == 0 {
            state.resources.remove(&resource);
        } else {
            state.resources.insert(resource);
        }
        let now_holds = state.held > 0;
        let session = self.sessions.get_mut(&state.session).expect("live session");
        session.locks = session.locks + after - before;
        self.locks = self.locks + after - before;
        if was_empty && now_holds {
            // It may no longer queue behind earlier waiters (see the module comment).
            self.work.extend(state.waits.iter().copied());
        }
    }

    /// Grants `request` to `owner`; the caller has checked that nothing conflicts.
    fn apply(&mut self, owner: OwnerIdx, request: Request) {
        let state = self.resources.get_mut(&request.resource).expect("resource");
        let before = state.owned(owner);
        let gave_up = match request.scope {
            Scope::Range(range) => state.ranges.set(owner, range, request.kind),
            Scope::WholeFile => state
                .flock
                .set(owner, request.kind)
                .map_err(|(holder, kind)| Lock {
                    owner: holder,
                    range: Scope::WholeFile.span(),
                    kind,
                }),
        }
        .expect("apply follows a conflict check");
        let after = state.owned(owner);
        self.account(owner, request.resource, before, after);
        if gave_up {
            self.trigger(request.resource, request.scope);
        }
    }

    fn release_on(&mut self, owner: OwnerIdx, resource: ResourceId) -> u64 {
        let Some(state) = self.resources.get_mut(&resource) else {
            return 0;
        };
        let before = state.owned(owner);
        let released = state.ranges.release_owner(owner);
        let flock = state.flock.unlock(owner);
        self.account(owner, resource, before, 0);
        for lock in &released {
            self.trigger(resource, Scope::Range(lock.range));
        }
        if flock {
            self.trigger(resource, Scope::WholeFile);
        }
        self.forget_resource_if_idle(resource);
        before
    }

    fn release_everything(&mut self, owner: OwnerIdx) -> u64 {
        let resources: Vec<ResourceId> = self.owners[&owner].resources.iter().copied().collect();
        resources
            .into_iter()
            .map(|resource| self.release_on(owner, resource))
            .sum()
    }

    fn enqueue(&mut self, owner: OwnerIdx, request: Request) -> Result<WaitId, LockError> {
        let session = self.owners[&owner].session;
        let limit = self.limits.waits_per_session_max;
        let session_state = self.sessions.get_mut(&session).expect("live session");
        if session_state.waits >= limit {
            return Err(LockError::TooManyWaits { limit });
        }
        session_state.waits += 1;
        let wait = self.next_wait;
        self.next_wait += 1;
        self.waits.insert(wait, Waiter { owner, request });
        self.owners
            .get_mut(&owner)
            .expect("owner")
            .waits
            .insert(wait);
        let state = self.resources.get_mut(&request.resource).expect("resource");
        match request.scope {
            Scope::Range(range) => state.range_waits.insert(range.start, range.end, wait),
            Scope::WholeFile => {
                state.flock_waits.insert(wait);
            }
        }
        Ok(wait)
    }

    /// Takes a waiting request out of every index.
    fn unqueue(&mut self, wait: WaitId) -> Waiter {
        let waiter = self.waits.remove(&wait).expect("waiting");
        let owner = self.owners.get_mut(&waiter.owner).expect("owner");
        owner.waits.remove(&wait);
        let session = self.sessions.get_mut(&owner.session).expect("session");
        session.waits -= 1;
        let state = self
            .resources
            .get_mut(&waiter.request.resource)
            .expect("resource");
        match waiter.request.scope {
            Scope::Range(range) => {
                state.range_waits.remove(range.start, wait);
            }
            Scope::WholeFile => {
                state.flock_waits.remove(&wait);
            }
        }
        self.work.remove(&wait);
        waiter
    }

    /// Marks the waiting requests a change of `scope` on `resource` may concern.
    fn trigger(&mut self, resource: ResourceId, scope: Scope) {
        let Some(state) = self.resources.get(&resource) else {
            return;
        };
        match scope {
            Scope::Range(range) => {
                state
                    .range_waits
                    .visit_overlaps(range.start, range.end, &mut |_, _, wait| {
                        self.work.insert(wait);
                        true
                    });
            }
            Scope::WholeFile => self.work.extend(state.flock_waits.iter().copied()),
        }
    }

    /// Whether a waiting request earlier than `before` (any, when `None`) of another owner
    /// asks for something `request` conflicts with.
    fn queued_ahead(&self, before: Option<WaitId>, owner: OwnerIdx, request: Request) -> bool {
        let Some(state) = self.resources.get(&request.resource) else {
            return false;
        };
        let before = before.unwrap_or(WaitId::MAX);
        let conflicts = |wait: WaitId| {
            let other = &self.waits[&wait];
            other.owner != owner && other.request.kind.conflicts_with(request.kind)
        };
        match request.scope {
            Scope::Range(range) => {
                let mut found = false;
                state
                    .range_waits
                    .visit_overlaps(range.start, range.end, &mut |_, _, wait| {
                        found = wait < before && conflicts(wait);
                        !found
                    });
                found
            }
            Scope::WholeFile => state.flock_waits.range(..before).any(|w| conflicts(*w)),
        }
    }

    /// Looks again at every marked waiting request, in arrival order, and grants those that
    /// can go now. Grants may mark more.
    fn run(&mut self) {
        while let Some(wait) = self.work.pop_first() {
            let Some(waiter) = self.waits.get(&wait).copied() else {
                continue;
            };
            let request = waiter.request;
            let state = &self.resources[&request.resource];
            if state
                .conflict(waiter.owner, request.scope, request.kind)
                .is_some()
            {
                continue;
            }
            if self.owners[&waiter.owner].held == 0
                && self.queued_ahead(Some(wait), waiter.owner, request)
            {
                continue;
            }
            self.unqueue(wait);
            self.apply(waiter.owner, request);
            self.events.push(Event::Granted(wait));
        }
    }

    /// Whether `owner` waiting for `request` would close a cycle: some holder of a lock it
    /// conflicts with waits, directly or through others, for a lock of `owner`.
    fn would_deadlock(&self, owner: OwnerIdx, request: Request) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = Vec::new();
        let push_holders = |stack: &mut Vec<OwnerIdx>,
                            seen: &BTreeSet<OwnerIdx>,
                            asker,
                            request: Request| {
            if let Some(state) = self.resources.get(&request.resource) {
                state.visit_conflicts(asker, request.scope, request.kind, &mut |holder, _, _| {
                    if !seen.contains(&holder) {
                        stack.push(holder);
                    }
                    true
                });
            }
        };
        push_holders(&mut stack, &seen, owner, request);
        while let Some(holder) = stack.pop() {
            if holder == owner {
                return true;
            }
            if !seen.insert(holder) {
                continue;
            }
            for wait in &self.owners[&holder].waits {
                push_holders(&mut stack, &seen, holder, self.waits[wait].request);
            }
        }
        false
    }

    /// Whole-structure consistency (tests, debug): the counts agree with the locks, every
    /// index agrees with the waiting requests, and no waiting request could be granted now
    /// (no lost wake-up).
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut total = 0;
        let mut per_owner: BTreeMap<OwnerIdx, (u64, BTreeSet<ResourceId>)> = BTreeMap::new();
        for (id, state) in &self.resources {
            if state.is_idle() {
                return Err(format!("resource {id} is idle but kept"));
            }
            state.ranges.check_consistency()?;
            for lock in state.ranges.locks() {
                let entry = per_owner.entry(lock.owner).or_default();
                entry.0 += 1;
                entry.1.insert(*id);
                total += 1;
            }
            for (owner, _) in state.flock.holders() {
                let entry = per_owner.entry(owner).or_default();
                entry.0 += 1;
                entry.1.insert(*id);
                total += 1;
            }
            if state.range_waits.len() + state.flock_waits.len()
                != self
                    .waits
                    .values()
                    .filter(|w| w.request.resource == *id)
                    .count()
            {
                return Err(format!("resource {id}: wait indexes disagree"));
            }
        }
        if total != self.locks {
            return Err(format!("{total} locks held, {} counted", self.locks));
        }
        for (idx, state) in &self.owners {
            let (held, resources) = per_owner.remove(idx).unwrap_or_default();
            if held != state.held || resources != state.resources {
                return Err(format!("owner {idx}: held {held} counted {}", state.held));
            }
            if state.held == 0 && state.waits.is_empty() {
                return Err(format!("owner {idx} is idle but kept"));
            }
            if self.owner_idx.get(&(state.session, state.owner)) != Some(idx) {
                return Err(format!("owner {idx} missing from the owner index"));
            }
            if !self.sessions[&state.session].owners.contains(idx) {
                return Err(format!("owner {idx} missing from its session"));
            }
        }
        if !per_owner.is_empty() {
            return Err(format!("locks of unknown owners: {per_owner:?}"));
        }
        for (session, state) in &self.sessions {
            let locks: u64 = state.owners.iter().map(|o| self.owners[o].held).sum();
            let waits: u64 = state
                .owners
                .iter()
                .map(|o| self.owners[o].waits.len() as u64)
                .sum();
            if locks != state.locks || waits != state.waits {
                return Err(format!("session {session}: counts disagree"));
            }
            if !self.deadlines.contains(&(state.deadline_ms, *session)) {
                return Err(format!("session {session} missing from the deadlines"));
            }
        }
        if self.deadlines.len() != self.sessions.len() {
            return Err("deadlines of ended sessions kept".into());
        }
        for (wait, waiter) in &self.waits {
            if !self.owners[&waiter.owner].waits.contains(wait) {
                return Err(format!("wait {wait} missing from its owner"));
            }
            let request = waiter.request;
            let state = &self.resources[&request.resource];
            let blocked = state
                .conflict(waiter.owner, request.scope, request.kind)
                .is_some()
                || (self.owners[&waiter.owner].held == 0
                    && self.queued_ahead(Some(*wait), waiter.owner, request));
            if !blocked {
                return Err(format!("wait {wait} could be granted: a lost wake-up"));
            }
        }
        if !self.work.is_empty() {
            return Err("work left between calls".into());
        }
        Ok(())
    }
}
