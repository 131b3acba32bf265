//! The manager's invariants, checked from scratch (for tests and the model): every owner's
//! and session's counts, every waiter's place, every index.

use super::*;

impl LockManager {
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
        let mut per_account: BTreeMap<Account, u64> = BTreeMap::new();
        for state in self.owners.values() {
            if let Some(account) = state.account
                && state.held > 0
            {
                *per_account.entry(account).or_default() += state.held;
            }
        }
        if per_account != self.accounts {
            return Err(format!(
                "locks by account {per_account:?}, counted {:?}",
                self.accounts
            ));
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
