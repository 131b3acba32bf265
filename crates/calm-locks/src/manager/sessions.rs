//! Sessions: opened with a lease, renewed, closed, expired when the lease ran out; ending one
//! releases every lock of its owners, refuses their waiting requests and wakes what waited
//! for their locks.

use super::*;

impl LockManager {
    pub fn open_session(&mut self, now_ms: u64, lease_ms: u64) -> Result<SessionId, LockError> {
        self.open_session_with(now_ms, lease_ms, self.limits.locks_per_session_max)
    }

    /// [`LockManager::open_session`] for a session that may hold at most `locks_max` locks
    /// (and never more than [`Limits::locks_per_session_max`]): a client trusted less is
    /// given less.
    pub fn open_session_with(
        &mut self,
        now_ms: u64,
        lease_ms: u64,
        locks_max: u64,
    ) -> Result<SessionId, LockError> {
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
                locks_max: locks_max.min(self.limits.locks_per_session_max),
                waits: 0,
            },
        );
        self.deadlines.insert((deadline_ms, session));
        Ok(session)
    }

    pub(super) fn check_lease(&self, lease_ms: u64) -> Result<(), LockError> {
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
            self.counts.expired += 1;
            expired.push(session);
        }
        expired
    }

    /// The locks `session` holds and the most it may hold, if it is open.
    pub fn session_locks(&self, session: SessionId) -> Option<(u64, u64)> {
        self.sessions
            .get(&session)
            .map(|state| (state.locks, state.locks_max))
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

    pub(super) fn end_session(&mut self, session: SessionId, error: LockError) {
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
}
