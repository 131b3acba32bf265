//! After a restart of a server that decides its files' locks alone: the grace in which the
//! clients that held locks before take them again, before anyone may take a new one.
//!
//! Locks live in memory; a server that restarts has none. The sessions that were open when it
//! stopped are known (the server records each session, with the identity that opened it and
//! its lease, before it may hold anything). Until every one of them has reported its reclaim
//! done, or the longest of their leases has passed (a live client notices the restart well
//! within its lease, at its next renewal), only reclaims (from an identity that had one of
//! those sessions), unlocks and releases are let in; every other request waits (`Grace`, sent
//! again by the client). Once the grace is over a reclaim is refused (`Late`): another client
//! may have taken and given back the lock since, and its holder must learn that it lost it
//! (as an NFSv4 server refuses a reclaim after its grace).
//!
//! Pure and deterministic: time is given.

use std::collections::{BTreeMap, BTreeSet};

use crate::manager::SessionId;
use crate::peers::Owner;

/// A session that was open when the server stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survivor {
    pub session: SessionId,
    /// The identity that opened it: the only one that may reclaim through it.
    pub owner: Owner,
    pub lease_ms: u64,
}

/// Most sessions a grace waits for (a server has at most 65 536 open; a restart during a
/// grace adds the previous life's).
pub const SURVIVORS_MAX: usize = 1 << 20;

/// Time past the longest lease a grace lasts at most: a client's renewal that was on its way
/// when the server came back.
pub const GRACE_MARGIN_MS: u64 = 1_000;

/// What a request may do during (and after) a grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Yes,
    /// A new lock while clients still reclaim: wait.
    Grace,
    /// A reclaim after the grace, or from an identity that had no session before: refused,
    /// the lock is lost.
    Late,
}

/// What a grace counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryCounts {
    /// Sessions it waited for.
    pub survivors: u64,
    /// Of those, the ones that reported their reclaim done.
    pub reported: u64,
    /// Whether it ended because every one reported (else: its deadline).
    pub ended_reported: bool,
    /// How long it lasted, in milliseconds (0 while it runs).
    pub grace_ms: u64,
}

/// The grace after a restart.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// Sessions that have not reported their reclaim done.
    pending: BTreeMap<SessionId, Owner>,
    /// Who may reclaim.
    reclaimers: BTreeSet<Owner>,
    started_ms: u64,
    deadline_ms: u64,
    counts: RecoveryCounts,
    over: bool,
}

impl Recovery {
    /// The grace for `survivors`, from `now_ms`; without any, none.
    pub fn new(survivors: &[Survivor], now_ms: u64) -> Recovery {
        let survivors = &survivors[..survivors.len().min(SURVIVORS_MAX)];
        let longest = survivors.iter().map(|s| s.lease_ms).max().unwrap_or(0);
        let pending: BTreeMap<SessionId, Owner> = survivors
            .iter()
            .map(|s| (s.session, s.owner.clone()))
            .collect();
        Recovery {
            reclaimers: pending.values().cloned().collect(),
            counts: RecoveryCounts {
                survivors: pending.len() as u64,
                ..RecoveryCounts::default()
            },
            over: pending.is_empty(),
            pending,
            started_ms: now_ms,
            deadline_ms: now_ms
                .saturating_add(longest)
                .saturating_add(GRACE_MARGIN_MS),
        }
    }

    /// Whether the grace runs at `now_ms`.
    pub fn active(&self, now_ms: u64) -> bool {
        !self.over && !self.pending.is_empty() && now_ms < self.deadline_ms
    }

    /// Ends the grace once it is over at `now_ms`; true the one time it does.
    pub fn tick(&mut self, now_ms: u64) -> bool {
        if self.over || self.active(now_ms) {
            return false;
        }
        self.over = true;
        self.counts.ended_reported = self.pending.is_empty();
        self.counts.grace_ms = now_ms.saturating_sub(self.started_ms);
        true
    }

    /// Whether a request may go on at `now_ms`: `reclaim`, the identity of a client taking
    /// again a lock it held before the restart; `release`, an unlock or a release.
    pub fn admit(&self, now_ms: u64, reclaim: Option<&str>, release: bool) -> Admission {
        let active = self.active(now_ms);
        match (reclaim, active) {
            (Some(owner), true) if self.reclaimers.contains(owner) => Admission::Yes,
            (Some(_), _) => Admission::Late,
            (None, true) if !release => Admission::Grace,
            (None, _) => Admission::Yes,
        }
    }

    /// Client `owner` reclaimed what `sessions` held. Counts for the sessions it opened; true
    /// when the grace still ran (the client's reclaims were in time).
    pub fn reported(&mut self, sessions: &[SessionId], owner: &str, now_ms: u64) -> bool {
        if !self.active(now_ms) {
            return false;
        }
        for session in sessions {
            if self.pending.get(session).is_some_and(|o| o == owner) {
                self.pending.remove(session);
                self.counts.reported += 1;
            }
        }
        self.tick(now_ms);
        true
    }

    /// When the grace ends at the latest (None once it is over).
    pub fn deadline(&self) -> Option<u64> {
        (!self.over).then_some(self.deadline_ms)
    }

    /// Survivors that have not reported.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn counts(&self) -> RecoveryCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survivor(session: SessionId, owner: &str, lease_ms: u64) -> Survivor {
        Survivor {
            session,
            owner: owner.to_string(),
            lease_ms,
        }
    }

    #[test]
    fn without_survivors_there_is_no_grace() {
        let mut recovery = Recovery::new(&[], 0);
        assert!(!recovery.active(0));
        assert!(!recovery.tick(0), "nothing to end");
        assert_eq!(recovery.admit(0, None, false), Admission::Yes);
        assert_eq!(recovery.admit(0, Some("uid:0"), false), Admission::Late);
        assert_eq!(recovery.deadline(), None);
    }

    #[test]
    fn new_locks_wait_until_every_survivor_reported() {
        let survivors = [
            survivor(1, "mount:a", 10_000),
            survivor(2, "mount:b", 5_000),
        ];
        let mut recovery = Recovery::new(&survivors, 100);
        assert_eq!(recovery.deadline(), Some(100 + 10_000 + GRACE_MARGIN_MS));
        assert_eq!(recovery.admit(200, None, false), Admission::Grace);
        assert_eq!(
            recovery.admit(200, None, true),
            Admission::Yes,
            "unlocks go on"
        );
        assert_eq!(recovery.admit(200, Some("mount:a"), false), Admission::Yes);
        assert_eq!(
            recovery.admit(200, Some("uid:1000"), false),
            Admission::Late
        );
        // A report counts only for the sessions its sender opened.
        assert!(recovery.reported(&[1, 2], "mount:a", 300));
        assert_eq!(recovery.admit(300, None, false), Admission::Grace);
        assert!(recovery.reported(&[2], "mount:b", 400));
        assert!(!recovery.active(400));
        assert!(!recovery.tick(500), "ended by the last report");
        assert_eq!(recovery.admit(400, None, false), Admission::Yes);
        assert_eq!(recovery.admit(400, Some("mount:a"), false), Admission::Late);
        let counts = recovery.counts();
        assert_eq!(
            (
                counts.survivors,
                counts.reported,
                counts.ended_reported,
                counts.grace_ms
            ),
            (2, 2, true, 300)
        );
        assert!(!recovery.reported(&[1], "mount:a", 500), "too late");
    }

    #[test]
    fn the_grace_ends_at_the_longest_lease_whoever_did_not_report() {
        let mut recovery = Recovery::new(&[survivor(1, "mount:a", 10_000)], 0);
        let end = 10_000 + GRACE_MARGIN_MS;
        assert_eq!(recovery.admit(end - 1, None, false), Admission::Grace);
        assert_eq!(recovery.admit(end, None, false), Admission::Yes);
        assert_eq!(recovery.admit(end, Some("mount:a"), false), Admission::Late);
        assert!(recovery.tick(end));
        assert!(!recovery.tick(end + 1));
        let counts = recovery.counts();
        assert!(!counts.ended_reported);
        assert_eq!(counts.grace_ms, end);
    }
}
