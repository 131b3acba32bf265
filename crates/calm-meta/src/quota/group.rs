//! The quotas of one group commit ([`Quotas`]): each quota the group touches read once and
//! written once at its end, growth judged before it is added; and the chains of directories,
//! kept from one group to the next ([`Chains`]) while no tree limit changes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use calm_store::{ReadTxn, WriteTxn};

use super::record::{
    CHAINS_KEPT_MAX, KEY_QUOTA_GENERATION, KEY_QUOTA_TREES, QuotaKind, QuotaLimits, QuotaReport,
    QuotaTarget, QuotaUsage, Stored, encode_usage, judge, limits_key, read_usage, usage_key,
};
use super::shares::{Pool, ShareChanges, Shares};
use crate::outcome::Outcome;
use crate::types::*;

/// A hasher for the small keys of a group's maps (handles, quotas): a multiply-rotate per
/// word, much cheaper than the standard library's keyed hash on the committer's hot path.
/// The keys are the namespace's own handles and ids, not chosen to collide.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Fast = BuildHasherDefault<WordHasher>;

/// Which limited trees a directory is in: shared, cloned by a reference count.
pub(crate) type Chain = Arc<[Handle]>;

/// One quota as a group commit sees it: read at most once, written once at the end.
#[derive(Debug, Clone)]
struct Entry {
    stored: Option<Stored>,
    /// Usage in the store, when read (it is read only where there is a limit to judge).
    base: Option<QuotaUsage>,
    /// What this group added.
    delta: QuotaUsage,
    stored_dirty: bool,
    /// The usage record is rewritten whole (a tree just counted) or removed.
    reset: Option<Option<QuotaUsage>>,
}

/// The chains of directories, as of one value of [`KEY_QUOTA_GENERATION`]: what the committer
/// keeps from one group to the next.
#[derive(Debug, Default, Clone)]
pub struct Chains {
    generation: u64,
    chains: HashMap<Handle, Chain, Fast>,
}

/// The quotas of one group commit: each quota it touches, read once, and the chains of the
/// directories it changed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Quotas {
    entries: HashMap<QuotaTarget, Entry, Fast>,
    chains: HashMap<Handle, Chain, Fast>,
    /// Trees with a limit, once read.
    trees: Option<u64>,
    /// The generation of chains, once read, and whether this group changed it.
    generation: Option<u64>,
    generation_changed: bool,
    /// The chains the last group left, used once the generation is read and found the same.
    inherited: Option<Chains>,
    /// The quota shares (none: this group judges without them) and what it did to them.
    shares: Option<Arc<Shares>>,
    share_changes: ShareChanges,
    /// The share the make being judged draws from.
    drawing: Option<Handle>,
}

impl Quotas {
    /// A group's quotas, starting from the chains the last group left, judged with `shares`.
    pub(crate) fn with_chains(chains: Chains, shares: Arc<Shares>) -> Quotas {
        Quotas {
            inherited: Some(chains),
            shares: Some(shares),
            ..Quotas::default()
        }
    }

    /// What this group did to the shares, to apply once it committed.
    pub(crate) fn take_share_changes(&mut self) -> Option<(Arc<Shares>, ShareChanges)> {
        let changes = std::mem::take(&mut self.share_changes);
        let shares = self.shares.clone()?;
        (!changes.is_empty()).then_some((shares, changes))
    }

    /// The room the shares set aside in `target`.
    fn set_aside_for_others(&self, target: QuotaTarget) -> i64 {
        match &self.shares {
            Some(shares) => self.share_changes.set_aside(shares, target) as i64,
            None => 0,
        }
    }

    /// The quotas the share the make being judged draws from is set aside in.
    fn own_share_targets(&self) -> Vec<QuotaTarget> {
        let (Some(shares), Some(pool)) = (&self.shares, self.drawing) else {
            return Vec::new();
        };
        self.share_changes
            .pool(shares, pool)
            .map_or_else(Vec::new, |share| share.targets)
    }

    /// The quotas among `targets` with an inode limit that holds for this make (`exempt`:
    /// the caller is not held to user and group limits).
    pub(crate) fn inode_limited<T: ReadTxn>(
        &mut self,
        txn: &T,
        targets: &[QuotaTarget],
        exempt: bool,
    ) -> Outcome<Vec<QuotaTarget>> {
        let mut limited = Vec::new();
        for target in targets {
            if exempt && target.kind != QuotaKind::Tree {
                continue;
            }
            let entry = self.entry(txn, *target)?;
            if entry
                .stored
                .is_some_and(|s| s.limits.inodes > 0 || s.limits.soft_inodes > 0)
            {
                limited.push(*target);
            }
        }
        Ok(limited)
    }

    /// Whether a make counted in exactly `limited` may draw from share `pool`: it has room,
    /// and the make counts in the quotas it was set aside in.
    pub(crate) fn may_draw(&self, pool: Handle, limited: &[QuotaTarget]) -> bool {
        let Some(shares) = &self.shares else {
            return false;
        };
        self.share_changes
            .pool(shares, pool)
            .is_some_and(|share| share.left > 0 && share.targets == limited)
    }

    /// Judges the next charge as a make drawing from `pool` (`None`: from no share).
    pub(crate) fn drawing(&mut self, pool: Option<Handle>) {
        self.drawing = pool;
    }

    /// A make drew one inode from share `pool`.
    pub(crate) fn drew(&mut self, pool: Handle) {
        self.share_changes.draw(pool);
    }

    /// Sets aside, for directory `pool` just made, half the inodes left in each of
    /// `limited` (at most [`super::shares::SHARE_INODES_MAX`]): room no other make takes. Returns
    /// the room set aside (0: none left).
    pub(crate) fn set_aside<T: ReadTxn>(
        &mut self,
        txn: &T,
        pool: Handle,
        limited: Vec<QuotaTarget>,
    ) -> Outcome<u64> {
        let Some(shares) = self.shares.clone() else {
            return Ok(0);
        };
        let mut room = i64::MAX;
        for target in &limited {
            let entry = self.entry(txn, *target)?;
            let (Some(stored), Some(base)) = (entry.stored, entry.base) else {
                continue;
            };
            let used = base.plus(entry.delta).inodes;
            let limits = stored.limits;
            // A soft limit is room up to it: the share never needs its grace.
            let cap = [limits.inodes, limits.soft_inodes]
                .into_iter()
                .filter(|l| *l > 0)
                .min()
                .unwrap_or(u64::MAX) as i64;
            let aside = self.share_changes.set_aside(&shares, *target) as i64;
            room = room.min(cap.saturating_sub(used).saturating_sub(aside));
        }
        let room = room.max(0) as u64;
        let left = room.div_ceil(2).min(super::shares::SHARE_INODES_MAX);
        self.share_changes.make(
            pool,
            Pool {
                targets: limited,
                left,
            },
        );
        Ok(left)
    }

    /// The chains to keep for the next group (when this one commits).
    pub(crate) fn take_chains(&mut self) -> Chains {
        match self.generation {
            Some(generation) if self.chains.len() <= CHAINS_KEPT_MAX => Chains {
                generation,
                chains: std::mem::take(&mut self.chains),
            },
            Some(_) => Chains::default(),
            None => self.inherited.take().unwrap_or_default(),
        }
    }

    fn entry<T: ReadTxn>(&mut self, txn: &T, target: QuotaTarget) -> Outcome<&mut Entry> {
        use std::collections::hash_map::Entry as Slot;
        match self.entries.entry(target) {
            Slot::Occupied(slot) => Ok(slot.into_mut()),
            Slot::Vacant(slot) => {
                let stored = match txn.get(&limits_key(target))? {
                    Some(v) => Some(Stored::decode(&v)?),
                    None => None,
                };
                let base = match stored {
                    Some(_) => Some(read_usage(txn, target)?),
                    None => None,
                };
                Ok(slot.insert(Entry {
                    stored,
                    base,
                    delta: QuotaUsage::default(),
                    stored_dirty: false,
                    reset: None,
                }))
            }
        }
    }

    /// How many trees have a limit.
    pub(crate) fn trees<T: ReadTxn>(&mut self, txn: &T) -> Outcome<u64> {
        if let Some(n) = self.trees {
            return Ok(n);
        }
        let counter = |key: &[u8]| -> Outcome<u64> {
            Ok(match txn.get(key)? {
                Some(v) => calm_store::decode_counter(key, &v)?,
                None => 0,
            })
        };
        let (n, generation) = (counter(KEY_QUOTA_TREES)?, counter(KEY_QUOTA_GENERATION)?);
        self.trees = Some(n);
        self.generation = Some(generation);
        if let Some(inherited) = self.inherited.take()
            && inherited.generation == generation
        {
            self.chains = inherited.chains;
        }
        Ok(n)
    }

    /// Whether directory `dir` has a tree limit.
    pub(crate) fn has_tree<T: ReadTxn>(&mut self, txn: &T, dir: Handle) -> Outcome<bool> {
        Ok(self.entry(txn, QuotaTarget::tree(dir))?.stored.is_some())
    }

    pub(crate) fn cached_chain(&self, dir: Handle) -> Option<Chain> {
        self.chains.get(&dir).cloned()
    }

    pub(crate) fn remember_chain(&mut self, dir: Handle, chain: Chain) {
        self.chains.insert(dir, chain);
    }

    /// Adds `delta` to each of `owners` and of the trees of `trees`, judging growth against
    /// their limits first (all of them before any is changed): a refusal changes nothing.
    /// `exempt`: the caller is not held to user and group limits.
    pub(crate) fn charge<T: ReadTxn>(
        &mut self,
        txn: &T,
        owners: &[QuotaTarget],
        trees: &[Handle],
        delta: QuotaUsage,
        exempt: bool,
        now: i64,
    ) -> Outcome<()> {
        if delta.is_zero() {
            return Ok(());
        }
        let grows = delta.bytes > 0 || delta.inodes > 0;
        let held = |target: QuotaTarget| grows && !(exempt && target.kind != QuotaKind::Tree);
        let all = || {
            owners
                .iter()
                .copied()
                .chain(trees.iter().map(|d| QuotaTarget::tree(*d)))
        };
        // A make drawing from its share takes room set aside for it: not judged again in
        // the quotas the share is set aside in.
        let own = self.own_share_targets();
        for target in all() {
            if own.contains(&target) {
                continue;
            }
            // Growth takes no room the shares set aside: judged as if it were used.
            let aside = match delta.inodes > 0 && held(target) {
                true => self.set_aside_for_others(target),
                false => 0,
            };
            let entry = self.entry(txn, target)?;
            if let (Some(stored), Some(base), true) = (entry.stored, entry.base, held(target)) {
                let mut before = base.plus(entry.delta);
                before.inodes += aside;
                judge(target, &stored, before, before.plus(delta), now)?;
            }
        }
        for target in all() {
            let entry = self.entries.get_mut(&target).expect("read above");
            let before = entry.base.map(|base| base.plus(entry.delta));
            entry.delta = entry.delta.plus(delta);
            if let (Some(stored), Some(before)) = (entry.stored, before) {
                // Shrinking (or exempt) is judged as no growth: never refused, but the soft
                // clocks follow the usage.
                let after = before.plus(delta);
                let from = if held(target) { before } else { after };
                let next = judge(target, &stored, from, after, now)?;
                if next != stored {
                    entry.stored = Some(next);
                    entry.stored_dirty = true;
                }
            }
        }
        Ok(())
    }

    /// Sets (or, with no limit, removes) `target`'s limits. A tree newly limited gets
    /// `counted` as its usage. Returns the report.
    pub(crate) fn set<T: ReadTxn>(
        &mut self,
        txn: &T,
        target: QuotaTarget,
        limits: QuotaLimits,
        counted: Option<QuotaUsage>,
        now: i64,
    ) -> Outcome<QuotaReport> {
        let trees = self.trees(txn)?;
        let entry = self.entry(txn, target)?;
        let had = entry.stored.is_some();
        let usage = match (counted, entry.base) {
            (Some(counted), _) => counted,
            (None, Some(base)) => base.plus(entry.delta),
            (None, None) => read_usage(txn, target)?.plus(entry.delta),
        };
        if limits.is_none() {
            entry.stored = None;
            entry.stored_dirty = had;
            if target.kind == QuotaKind::Tree && had {
                entry.reset = Some(None);
                entry.delta = QuotaUsage::default();
                entry.base = None;
                self.trees = Some(trees - 1);
                self.chains_changed();
            }
            return Ok(Stored::default().report(target, usage));
        }
        let old = entry.stored.unwrap_or_default();
        let fresh = Stored {
            limits,
            bytes_over_since_ns: old.bytes_over_since_ns,
            inodes_over_since_ns: old.inodes_over_since_ns,
        };
        // The soft clocks as the new limits see the usage now (a limit set below the usage
        // refuses growth from now on, not what is there).
        let next = judge(target, &fresh, usage, usage, now)?;
        entry.stored = Some(next);
        entry.stored_dirty = true;
        entry.base = Some(usage);
        entry.delta = QuotaUsage::default();
        if let Some(counted) = counted {
            entry.reset = Some(Some(counted));
        }
        if target.kind == QuotaKind::Tree && !had {
            self.trees = Some(trees + 1);
            self.chains_changed();
        }
        Ok(next.report(target, usage))
    }

    /// A tree limit was set or removed: every chain may differ.
    fn chains_changed(&mut self) {
        self.chains.clear();
        self.generation = Some(self.generation.unwrap_or(0) + 1);
        self.generation_changed = true;
    }

    /// Writes what the group changed: each usage and limits record once, the tree count.
    pub(crate) fn flush<T: WriteTxn>(self, txn: &mut T) -> Outcome<()> {
        if let (true, Some(generation)) = (self.generation_changed, self.generation) {
            txn.put(KEY_QUOTA_GENERATION, &generation.to_le_bytes())?;
        }
        // The count of limited trees changes with the generation, and only then.
        if let (true, Some(trees)) = (self.generation_changed, self.trees) {
            match trees {
                0 => {
                    txn.delete(KEY_QUOTA_TREES)?;
                }
                _ => txn.put(KEY_QUOTA_TREES, &trees.to_le_bytes())?,
            }
        }
        for (target, entry) in self.entries {
            if entry.stored_dirty {
                match entry.stored {
                    Some(stored) => txn.put(&limits_key(target), &stored.encode())?,
                    None => {
                        txn.delete(&limits_key(target))?;
                    }
                }
            }
            let usage = match entry.reset {
                Some(None) => {
                    txn.delete(&usage_key(target))?;
                    continue;
                }
                Some(Some(counted)) => counted.plus(entry.delta),
                None if entry.delta.is_zero() => continue,
                None => match entry.base {
                    Some(base) => base.plus(entry.delta),
                    None => read_usage(txn, target)?.plus(entry.delta),
                },
            };
            // A tree untracked (no limit) keeps no usage; a user's or group's that reaches
            // nothing is removed, so the records are those who own something.
            if usage.is_zero() && target.kind != QuotaKind::Tree
                || target.kind == QuotaKind::Tree && entry.stored.is_none()
            {
                txn.delete(&usage_key(target))?;
            } else {
                txn.put(&usage_key(target), &encode_usage(&usage))?;
            }
        }
        Ok(())
    }
}
