//! Quota shares: room set aside, in the quotas that limit the makes in a directory a mount
//! holds, for that mount to fill by itself (docs/design/mount.md, "Directories held"). Every
//! growth of a quota is judged with the room the other shares set aside counted as used, so a
//! share is room nobody else can take: the holder's makes, answered before the server saw
//! them, are never refused for a quota, and no quota is ever passed.
//!
//! A share is named by the directory it was set aside for (its pool); the directories the
//! holder makes in it draw from the same pool. It counts inodes only: a make adds no bytes.
//!
//! Kept in memory: a share lives no longer than the holds it serves, which end with the
//! server. The committer judges with the shares as they are plus what its group did to them,
//! and changes them only once its group committed ([`ShareChanges`]); the server releases a
//! share when the last directory drawing from it is given back ([`Shares::release`]), at any
//! time, which only gives room back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use calm_types::sync::Locked;

use super::record::QuotaTarget;
use crate::types::Handle;

/// Inodes one share sets aside at most (half the room left, up to this).
pub const SHARE_INODES_MAX: u64 = 1024;
/// Shares kept at once on a server; past it a new share sets nothing aside (its directory is
/// not held).
pub const SHARES_MAX: usize = 1 << 16;
/// A share no hold draws from this long after it was set aside (its mkdir's answer never came:
/// the client went away) gives its room back ([`Shares::sweep`]).
pub const SHARE_UNCLAIMED_MAX: Duration = Duration::from_secs(30);
/// An unclaimed share is forgotten this long after it was set aside (until then a late answer
/// finds it empty, and holds nothing).
pub const SHARE_FORGOTTEN_AFTER: Duration = Duration::from_secs(600);

/// One share: the quotas it is set aside in, and the room left in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pool {
    pub(crate) targets: Vec<QuotaTarget>,
    pub(crate) left: u64,
}

#[derive(Debug, Default)]
struct Inner {
    pools: HashMap<Handle, Pool>,
    /// When each share was set aside.
    made: HashMap<Handle, Instant>,
    /// Per quota: the room every pool sets aside in it.
    set_aside: HashMap<QuotaTarget, u64>,
}

impl Inner {
    fn add(&mut self, pool: Handle, share: Pool) {
        for target in &share.targets {
            *self.set_aside.entry(*target).or_default() += share.left;
        }
        self.pools.insert(pool, share);
    }

    fn take(&mut self, pool: Handle, n: u64) -> u64 {
        let Some(share) = self.pools.get_mut(&pool) else {
            return 0;
        };
        let n = n.min(share.left);
        share.left -= n;
        for target in &share.targets {
            if let Some(total) = self.set_aside.get_mut(target) {
                *total -= n;
                if *total == 0 {
                    self.set_aside.remove(target);
                }
            }
        }
        n
    }
}

/// The quota shares of one store's server.
#[derive(Debug, Default)]
pub struct Shares {
    inner: Mutex<Inner>,
}

impl Shares {
    /// The room every share sets aside in `target`.
    pub(crate) fn set_aside(&self, target: QuotaTarget) -> u64 {
        self.inner
            .locked()
            .set_aside
            .get(&target)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn pool(&self, pool: Handle) -> Option<Pool> {
        self.inner.locked().pools.get(&pool).cloned()
    }

    /// The room left in the share set aside for directory `pool`: `None` where it has none.
    pub fn left(&self, pool: Handle) -> Option<u64> {
        self.inner.locked().pools.get(&pool).map(|p| p.left)
    }

    /// Gives back what is left of the share of `pool` (none: nothing).
    pub fn release(&self, pool: Handle) {
        let mut inner = self.inner.locked();
        let left = inner.pools.get(&pool).map_or(0, |p| p.left);
        inner.take(pool, left);
        inner.pools.remove(&pool);
        inner.made.remove(&pool);
    }

    /// Gives back the room of the shares set aside more than [`SHARE_UNCLAIMED_MAX`] before
    /// `now` that no hold draws from (`claimed` says which do), and forgets them after
    /// [`SHARE_FORGOTTEN_AFTER`]: returns how many gave room back.
    pub fn sweep(&self, claimed: impl Fn(Handle) -> bool, now: Instant) -> usize {
        let mut inner = self.inner.locked();
        let age = |made: &Instant| now.saturating_duration_since(*made);
        let unclaimed: Vec<(Handle, Duration)> = inner
            .made
            .iter()
            .filter(|(pool, made)| age(made) > SHARE_UNCLAIMED_MAX && !claimed(**pool))
            .map(|(pool, made)| (*pool, age(made)))
            .collect();
        let mut swept = 0;
        for (pool, age) in unclaimed {
            let left = inner.pools.get(&pool).map_or(0, |p| p.left);
            if left > 0 {
                inner.take(pool, left);
                swept += 1;
            }
            if age > SHARE_FORGOTTEN_AFTER {
                inner.pools.remove(&pool);
                inner.made.remove(&pool);
            }
        }
        swept
    }

    /// Shares kept.
    pub fn count(&self) -> usize {
        self.inner.locked().pools.len()
    }

    /// Room set aside, summed over the quotas (for checks).
    pub fn total_set_aside(&self) -> u64 {
        self.inner.locked().set_aside.values().sum()
    }

    /// What a group that committed did to the shares.
    pub(crate) fn apply(&self, changes: ShareChanges) {
        let mut inner = self.inner.locked();
        let now = Instant::now();
        for (pool, mut share) in changes.made {
            // Kept empty past the limit: its directory is not held, and nothing is set aside.
            if inner.pools.len() >= SHARES_MAX {
                share.left = 0;
            }
            inner.add(pool, share);
            inner.made.insert(pool, now);
        }
        for (pool, n) in changes.drawn {
            inner.take(pool, n);
        }
    }
}

/// What one group does to the shares: applied once it committed, so that a group that fails
/// (and is tried again) sets nothing aside and draws nothing.
#[derive(Debug, Default, Clone)]
pub(crate) struct ShareChanges {
    /// Shares set aside by this group (their room before its own draws).
    made: Vec<(Handle, Pool)>,
    /// Room each pool gave to this group's makes.
    drawn: HashMap<Handle, u64>,
}

impl ShareChanges {
    /// Whether nothing was done.
    pub(crate) fn is_empty(&self) -> bool {
        self.made.is_empty() && self.drawn.is_empty()
    }

    /// Share `pool` as this group sees it: as kept, or made by it, less what it drew.
    pub(crate) fn pool(&self, shares: &Shares, pool: Handle) -> Option<Pool> {
        let mut share = match self.made.iter().find(|(p, _)| *p == pool) {
            Some((_, share)) => share.clone(),
            None => shares.pool(pool)?,
        };
        share.left = share
            .left
            .saturating_sub(self.drawn.get(&pool).copied().unwrap_or(0));
        Some(share)
    }

    /// The room every share sets aside in `target`, as this group sees it.
    pub(crate) fn set_aside(&self, shares: &Shares, target: QuotaTarget) -> u64 {
        let made: u64 = self
            .made
            .iter()
            .filter(|(_, s)| s.targets.contains(&target))
            .map(|(_, s)| s.left)
            .sum();
        let drawn: u64 = self
            .drawn
            .iter()
            .filter_map(|(pool, n)| {
                let share = self.pool_targets(shares, *pool)?;
                share.contains(&target).then_some(*n)
            })
            .sum();
        (shares.set_aside(target) + made).saturating_sub(drawn)
    }

    fn pool_targets(&self, shares: &Shares, pool: Handle) -> Option<Vec<QuotaTarget>> {
        match self.made.iter().find(|(p, _)| *p == pool) {
            Some((_, share)) => Some(share.targets.clone()),
            None => shares.pool(pool).map(|s| s.targets),
        }
    }

    pub(crate) fn make(&mut self, pool: Handle, share: Pool) {
        self.made.push((pool, share));
    }

    pub(crate) fn draw(&mut self, pool: Handle) {
        *self.drawn.entry(pool).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// A share for pool with room on some of three quotas.
        Make(u8, u8, u64),
        Draw(u8),
        Release(u8),
        /// The group so far commits (else it is dropped at the end).
        Commit,
        Fail,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..6, 1u8..8, 0u64..5).prop_map(|(p, t, n)| Step::Make(p, t, n)),
            (0u8..6).prop_map(Step::Draw),
            (0u8..6).prop_map(Step::Release),
            Just(Step::Commit),
            Just(Step::Fail),
        ]
    }

    fn targets(mask: u8) -> Vec<QuotaTarget> {
        (0..3u32)
            .filter(|i| mask & (1 << i) != 0)
            .map(QuotaTarget::user)
            .collect()
    }

    proptest! {
        /// The shares as a plain list of pools: each quota's room set aside is the sum of
        /// the room left in the pools set aside in it, through groups that commit or fail and
        /// releases between them.
        #[test]
        fn room_set_aside_is_the_sum_of_the_pools(steps in prop::collection::vec(step(), 1..60)) {
            let shares = Shares::default();
            let mut model: HashMap<Handle, Pool> = HashMap::new();
            let mut pending: HashMap<Handle, Pool> = HashMap::new();
            let mut group = ShareChanges::default();
            // Pools released: a pool is a directory's handle, never given to another.
            let mut released = std::collections::HashSet::new();
            for step in steps {
                match step {
                    Step::Make(p, mask, n) => {
                        let pool = Handle::from(p);
                        if group.pool(&shares, pool).is_none() && !released.contains(&pool) {
                            let share = Pool { targets: targets(mask), left: n };
                            group.make(pool, share.clone());
                            pending.insert(pool, share);
                        }
                    }
                    Step::Draw(p) => {
                        let pool = Handle::from(p);
                        if group.pool(&shares, pool).is_some_and(|s| s.left > 0) {
                            group.draw(pool);
                            pending
                                .entry(pool)
                                .or_insert_with(|| model[&pool].clone())
                                .left -= 1;
                        }
                    }
                    Step::Release(p) => {
                        let pool = Handle::from(p);
                        // The server releases a share only once the group that made it
                        // answered.
                        if group.made.iter().any(|(made, _)| *made == pool) {
                            continue;
                        }
                        shares.release(pool);
                        released.insert(pool);
                        model.remove(&pool);
                        pending.remove(&pool);
                    }
                    Step::Commit => {
                        shares.apply(std::mem::take(&mut group));
                        model.extend(pending.drain());
                    }
                    Step::Fail => {
                        group = ShareChanges::default();
                        pending.clear();
                    }
                }
                for i in 0..3u32 {
                    let target = QuotaTarget::user(i);
                    let want: u64 = model
                        .values()
                        .filter(|s| s.targets.contains(&target))
                        .map(|s| s.left)
                        .sum();
                    prop_assert_eq!(shares.set_aside(target), want);
                    let seen: u64 = model
                        .iter()
                        .filter(|(p, _)| !pending.contains_key(p))
                        .chain(pending.iter())
                        .filter(|(_, s)| s.targets.contains(&target))
                        .map(|(_, s)| s.left)
                        .sum();
                    prop_assert_eq!(group.set_aside(&shares, target), seen);
                }
                for (pool, share) in &model {
                    prop_assert_eq!(shares.left(*pool), Some(share.left));
                }
                prop_assert_eq!(shares.count(), model.len());
            }
        }
    }

    #[test]
    fn a_share_no_hold_claims_gives_its_room_back_then_is_forgotten() {
        let shares = Shares::default();
        let mut group = ShareChanges::default();
        let targets = vec![QuotaTarget::user(1)];
        for pool in [1, 2] {
            let share = Pool {
                targets: targets.clone(),
                left: 5,
            };
            group.make(pool, share);
        }
        shares.apply(group);
        let start = Instant::now();
        assert_eq!(shares.sweep(|_| false, start), 0, "too young");
        let later = start + SHARE_UNCLAIMED_MAX + Duration::from_secs(1);
        // Share 2 is drawn from by a hold: kept.
        assert_eq!(shares.sweep(|pool| pool == 2, later), 1);
        assert_eq!(shares.left(1), Some(0), "empty, but still known");
        assert_eq!(shares.left(2), Some(5));
        assert_eq!(shares.set_aside(targets[0]), 5);
        let much_later = start + SHARE_FORGOTTEN_AFTER + Duration::from_secs(1);
        assert_eq!(shares.sweep(|pool| pool == 2, much_later), 0);
        assert_eq!(shares.left(1), None);
        assert_eq!(shares.count(), 1);
    }
}
