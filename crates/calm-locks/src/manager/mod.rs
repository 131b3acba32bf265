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
use crate::range::LockKind;
use crate::ranges::{Lock, RangeLocks};
use crate::treap::Treap;

mod consistency;
mod sessions;
mod types;
mod waits;

pub use types::*;

/// Internal owner number; 0 is nobody.
type OwnerIdx = u64;
/// Whom a lock owner's locks count against (a user's uid): [`Limits::locks_per_account_max`].
pub type Account = u32;
const NOBODY: OwnerIdx = 0;

#[derive(Debug, Clone)]
struct OwnerState {
    session: SessionId,
    owner: Owner,
    /// Whose locks these are, when they count against an account's limit.
    account: Option<Account>,
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
    /// Most locks it may hold (at most [`Limits::locks_per_session_max`]).
    locks_max: u64,
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
    /// Locks held, by account (accounts holding none absent).
    accounts: BTreeMap<Account, u64>,
    /// Waiting requests to look at again, in arrival order.
    work: BTreeSet<WaitId>,
    events: Vec<Event>,
    counts: Counts,
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
            accounts: BTreeMap::new(),
            work: BTreeSet::new(),
            events: Vec::new(),
            counts: Counts::default(),
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

    /// Lock requests by how they ended, and sessions expired, since the manager was made.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// What happened to waiting requests since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    // ---- sessions ----

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
        self.set_for(session, None, request, wait)
    }

    /// [`LockManager::set`] for `account`: the locks of the request's owner count against
    /// that account's [`Limits::locks_per_account_max`] (the account of the owner's first
    /// lock, while it holds or waits for some), over every session.
    pub fn set_for(
        &mut self,
        session: SessionId,
        account: Option<Account>,
        request: Request,
        wait: bool,
    ) -> Result<Outcome, LockError> {
        self.live(session)?;
        // A set can add two locks (splitting one of the other type in three).
        self.room_for(session, request.owner, account, 2)?;
        let owner = self.owner_of(session, request.owner, account);
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
                self.counts.conflicts += 1;
                return Err(LockError::Conflict(self.holder(conflict, request.scope)));
            }
            if self.would_deadlock(owner, request) {
                self.counts.deadlocks += 1;
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
        self.counts.granted += 1;
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
        // Unlocking the middle of a lock leaves two.
        self.room_for(session, owner, None, 1)?;
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

    /// Refuses (ENOLCK) a request that may add `more` locks past the session's, the owner's
    /// account's (`account` for an owner not known yet) or the manager's limit.
    fn room_for(
        &self,
        session: SessionId,
        owner: Owner,
        account: Option<Account>,
        more: u64,
    ) -> Result<(), LockError> {
        let state = &self.sessions[&session];
        if state.locks + more > state.locks_max {
            return Err(LockError::TooManyLocks {
                limit: state.locks_max,
            });
        }
        if self.locks + more > self.limits.locks_max {
            return Err(LockError::TooManyLocks {
                limit: self.limits.locks_max,
            });
        }
        let account = match self.owner_idx.get(&(session, owner)) {
            Some(idx) => self.owners[idx].account,
            None => account,
        };
        if let Some(account) = account {
            let held = self.accounts.get(&account).copied().unwrap_or(0);
            if held + more > self.limits.locks_per_account_max {
                return Err(LockError::TooManyLocks {
                    limit: self.limits.locks_per_account_max,
                });
            }
        }
        Ok(())
    }

    fn owner_of(&mut self, session: SessionId, owner: Owner, account: Option<Account>) -> OwnerIdx {
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
                account,
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
        if let Some(account) = state.account {
            let held = self.accounts.entry(account).or_default();
            *held = *held + after - before;
            if *held == 0 {
                self.accounts.remove(&account);
            }
        }
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
}
