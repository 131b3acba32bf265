//! Waiting requests: queued in arrival order per resource, looked at again only when a range
//! they overlap changes, granted when nothing (held or queued ahead) conflicts, and refused
//! with EDEADLK when waiting would close a cycle of the wait-for graph.

use super::*;

impl LockManager {
    pub(super) fn enqueue(
        &mut self,
        owner: OwnerIdx,
        request: Request,
    ) -> Result<WaitId, LockError> {
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
    pub(super) fn unqueue(&mut self, wait: WaitId) -> Waiter {
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
    pub(super) fn trigger(&mut self, resource: ResourceId, scope: Scope) {
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
    pub(super) fn queued_ahead(
        &self,
        before: Option<WaitId>,
        owner: OwnerIdx,
        request: Request,
    ) -> bool {
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
    pub(super) fn run(&mut self) {
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
            self.counts.granted_after_wait += 1;
            self.events.push(Event::Granted(wait));
        }
    }

    /// Whether `owner` waiting for `request` would close a cycle: some holder of a lock it
    /// conflicts with waits, directly or through others, for a lock of `owner`.
    pub(super) fn would_deadlock(&self, owner: OwnerIdx, request: Request) -> bool {
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
}
