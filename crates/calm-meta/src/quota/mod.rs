//! Quotas kept in the transaction of every change: usage per user, per group and per directory
//! tree with a limit, limits judged before a mutation writes anything.
//!
//! Keys (docs/design/store-layout.md): `A kind id` → usage (bytes, inodes, directories: three
//! i64 le), `B kind id` → limits and the times soft limits were passed ([`Stored`]),
//! `Nquota_trees` → how many trees have a limit. `kind` is `u`, `g` or `d`
//! ([`QuotaKind::tag`]), `id` a u64 be (a uid, a gid, a directory's handle).
//!
//! A user's and a group's usage is kept always (so that a limit set later is exact at once); a
//! tree's only while it has a limit (setting one counts the tree, [`count`]). Which trees a
//! change counts in: the trees with a limit whose directory is the changed inode's directory
//! or above it (its chain, [`Quotas::chain`]). A directory moves only between directories of
//! one chain, a file with several names keeps them in one chain, so a chain changes only when
//! a tree limit is set or removed (`crate::ops::rename`, `crate::ops::names::link`).
//!
//! Who is held to what: a tree's limits hold for every caller (a tree's quota is the size of
//! a project's space, which the superuser's jobs fill as anyone's); a user's and a group's do
//! not hold for the superuser, as on Linux (CAP_SYS_RESOURCE).

pub mod count;

use std::collections::HashMap;

use calm_store::{ReadTxn, WriteTxn};

use crate::error::MetaError;
use crate::outcome::Outcome;
use crate::types::*;
pub use calm_types::quota::{
    QuotaKind, QuotaLimits, QuotaMismatch, QuotaReport, QuotaTarget, QuotaUsage, TREE_QUOTAS_MAX,
};

/// A quota's usage: `A kind id`.
pub const TAG_USAGE: u8 = b'A';
/// A quota's limits: `B kind id`.
pub const TAG_LIMITS: u8 = b'B';
/// Counter: trees with a limit.
pub const KEY_QUOTA_TREES: &[u8] = b"Nquota_trees";
/// Counter: how many times a tree limit was set or removed (the only changes of a chain):
/// chains remembered at one value hold while it stays.
pub const KEY_QUOTA_GENERATION: &[u8] = b"Nquota_gen";
/// Directories whose chains the committer remembers between groups at most.
pub const CHAINS_KEPT_MAX: usize = 65_536;

pub fn usage_key(target: QuotaTarget) -> [u8; 10] {
    key(TAG_USAGE, target)
}

pub fn limits_key(target: QuotaTarget) -> [u8; 10] {
    key(TAG_LIMITS, target)
}

fn key(tag: u8, target: QuotaTarget) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[0] = tag;
    k[1] = target.kind.tag();
    k[2..].copy_from_slice(&target.id.to_be_bytes());
    k
}

/// The quota a `A` or `B` key names.
pub fn key_target(key: &[u8]) -> Option<QuotaTarget> {
    if key.len() != 10 {
        return None;
    }
    Some(QuotaTarget {
        kind: QuotaKind::from_tag(key[1])?,
        id: u64::from_be_bytes(key[2..10].try_into().ok()?),
    })
}

pub fn encode_usage(usage: &QuotaUsage) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&usage.bytes.to_le_bytes());
    v[8..16].copy_from_slice(&usage.inodes.to_le_bytes());
    v[16..].copy_from_slice(&usage.dirs.to_le_bytes());
    v
}

pub fn decode_usage(value: &[u8]) -> Result<QuotaUsage, MetaError> {
    if value.len() != 24 {
        return Err(MetaError::Corrupt(format!(
            "a quota usage record of {} bytes (24 expected)",
            value.len()
        )));
    }
    let at = |i: usize| i64::from_le_bytes(value[i..i + 8].try_into().expect("8 bytes"));
    Ok(QuotaUsage {
        bytes: at(0),
        inodes: at(8),
        dirs: at(16),
    })
}

/// A quota's limits as kept: what was set, and since when each soft limit is passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    pub limits: QuotaLimits,
    /// ns since the epoch; 0: bytes are not past the soft limit.
    pub bytes_over_since_ns: i64,
    /// ns since the epoch; 0: inodes are not past the soft limit.
    pub inodes_over_since_ns: i64,
}

impl Stored {
    pub const LEN: usize = 56;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let l = &self.limits;
        let mut v = [0u8; Self::LEN];
        for (i, n) in [l.bytes, l.inodes, l.soft_bytes, l.soft_inodes, l.grace_s]
            .into_iter()
            .enumerate()
        {
            v[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
        }
        v[40..48].copy_from_slice(&self.bytes_over_since_ns.to_le_bytes());
        v[48..].copy_from_slice(&self.inodes_over_since_ns.to_le_bytes());
        v
    }

    pub fn decode(value: &[u8]) -> Result<Stored, MetaError> {
        if value.len() != Self::LEN {
            return Err(MetaError::Corrupt(format!(
                "a quota limits record of {} bytes ({} expected)",
                value.len(),
                Self::LEN
            )));
        }
        let u = |i: usize| u64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().expect("8"));
        Ok(Stored {
            limits: QuotaLimits {
                bytes: u(0),
                inodes: u(1),
                soft_bytes: u(2),
                soft_inodes: u(3),
                grace_s: u(4),
            },
            bytes_over_since_ns: u(5) as i64,
            inodes_over_since_ns: u(6) as i64,
        })
    }

    /// The report of this quota with `usage`.
    pub fn report(&self, target: QuotaTarget, usage: QuotaUsage) -> QuotaReport {
        QuotaReport {
            target,
            limits: self.limits,
            usage,
            bytes_over_since_ns: self.bytes_over_since_ns,
            inodes_over_since_ns: self.inodes_over_since_ns,
        }
    }
}

/// One dimension of a quota: its hard and soft limits and when the soft one was passed.
#[derive(Debug, Clone, Copy)]
struct Dimension {
    what: &'static str,
    hard: u64,
    soft: u64,
    over_since_ns: i64,
}

/// Whether growing one dimension from `before` to `after` at `now` passes a limit: the why
/// of the refusal, or `None`.
fn passes(dim: Dimension, grace_s: u64, before: i64, after: i64, now: i64) -> Option<String> {
    if after <= before {
        return None;
    }
    if dim.hard > 0 && after > dim.hard as i64 {
        return Some(format!(
            "{} {after} past the hard limit {}",
            dim.what, dim.hard
        ));
    }
    let grace_ns = (grace_s as i64).saturating_mul(1_000_000_000);
    if dim.soft > 0
        && after > dim.soft as i64
        && dim.over_since_ns != 0
        && now.saturating_sub(dim.over_since_ns) > grace_ns
    {
        return Some(format!(
            "{} {after} past the soft limit {} for more than its grace of {grace_s} s",
            dim.what, dim.soft
        ));
    }
    None
}

/// The soft limit's clock after usage became `after`: started when first past, stopped when
/// back under.
fn over_since(soft: u64, after: i64, was: i64, now: i64) -> i64 {
    if soft > 0 && after > soft as i64 {
        if was == 0 { now.max(1) } else { was }
    } else {
        0
    }
}

/// Judges a change of usage against `stored` at `now`: the refusal, or what the stored
/// record becomes (its soft-limit clocks moved).
pub fn judge(
    target: QuotaTarget,
    stored: &Stored,
    before: QuotaUsage,
    after: QuotaUsage,
    now: i64,
) -> Result<Stored, MetaError> {
    let l = &stored.limits;
    let bytes = Dimension {
        what: "bytes",
        hard: l.bytes,
        soft: l.soft_bytes,
        over_since_ns: stored.bytes_over_since_ns,
    };
    let inodes = Dimension {
        what: "inodes",
        hard: l.inodes,
        soft: l.soft_inodes,
        over_since_ns: stored.inodes_over_since_ns,
    };
    for (dim, b, a) in [
        (bytes, before.bytes, after.bytes),
        (inodes, before.inodes, after.inodes),
    ] {
        if let Some(why) = passes(dim, l.grace_s, b, a, now) {
            return Err(MetaError::QuotaExceeded(format!("{target}: {why}")));
        }
    }
    Ok(Stored {
        limits: *l,
        bytes_over_since_ns: over_since(l.soft_bytes, after.bytes, bytes.over_since_ns, now),
        inodes_over_since_ns: over_since(l.soft_inodes, after.inodes, inodes.over_since_ns, now),
    })
}

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
    chains: HashMap<Handle, Vec<Handle>>,
}

/// The quotas of one group commit: each quota it touches, read once, and the chains of the
/// directories it changed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Quotas {
    entries: HashMap<QuotaTarget, Entry>,
    chains: HashMap<Handle, Vec<Handle>>,
    /// Trees with a limit, once read.
    trees: Option<u64>,
    /// The generation of chains, once read, and whether this group changed it.
    generation: Option<u64>,
    generation_changed: bool,
    /// The chains the last group left, used once the generation is read and found the same.
    inherited: Option<Chains>,
}

impl Quotas {
    /// A group's quotas, starting from the chains the last group left.
    pub(crate) fn with_chains(chains: Chains) -> Quotas {
        Quotas {
            inherited: Some(chains),
            ..Quotas::default()
        }
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

    pub(crate) fn cached_chain(&self, dir: Handle) -> Option<&Vec<Handle>> {
        self.chains.get(&dir)
    }

    pub(crate) fn remember_chain(&mut self, dir: Handle, chain: Vec<Handle>) {
        self.chains.insert(dir, chain);
    }

    /// Adds `delta` to each of `targets`, judging growth against their limits first (all of
    /// them before any is changed): a refusal changes nothing. `exempt`: the caller is not
    /// held to user and group limits.
    pub(crate) fn charge<T: ReadTxn>(
        &mut self,
        txn: &T,
        targets: &[QuotaTarget],
        delta: QuotaUsage,
        exempt: bool,
        now: i64,
    ) -> Outcome<()> {
        if delta.is_zero() {
            return Ok(());
        }
        let grows = delta.bytes > 0 || delta.inodes > 0;
        let mut judged = Vec::new();
        for target in targets {
            let entry = self.entry(txn, *target)?;
            let (Some(stored), Some(base)) = (entry.stored, entry.base) else {
                continue;
            };
            let before = base.plus(entry.delta);
            let after = before.plus(delta);
            let held = grows && !(exempt && target.kind != QuotaKind::Tree);
            // Shrinking (or exempt) is judged as no growth: never refused, but the soft
            // clocks follow the usage.
            let from = if held { before } else { after };
            let next = judge(*target, &stored, from, after, now)?;
            judged.push((*target, next));
        }
        for target in targets {
            let entry = self.entries.get_mut(target).expect("read above");
            entry.delta = entry.delta.plus(delta);
        }
        for (target, next) in judged {
            let entry = self.entries.get_mut(&target).expect("read above");
            if entry.stored != Some(next) {
                entry.stored = Some(next);
                entry.stored_dirty = true;
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
        let trees_before = match txn.get(KEY_QUOTA_TREES)? {
            Some(v) => calm_store::decode_counter(KEY_QUOTA_TREES, &v)?,
            None => 0,
        };
        if let Some(trees) = self.trees
            && trees != trees_before
        {
            if trees == 0 {
                txn.delete(KEY_QUOTA_TREES)?;
            } else {
                txn.put(KEY_QUOTA_TREES, &trees.to_le_bytes())?;
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

/// `target`'s usage in the store (none kept: nothing).
pub fn read_usage<R: ReadTxn + ?Sized>(view: &R, target: QuotaTarget) -> Outcome<QuotaUsage> {
    Ok(match view.get(&usage_key(target))? {
        Some(v) => decode_usage(&v)?,
        None => QuotaUsage::default(),
    })
}

/// `target`'s report on `view`: its limits (none: all 0) and usage.
pub fn report<R: ReadTxn + ?Sized>(view: &R, target: QuotaTarget) -> Outcome<QuotaReport> {
    let stored = match view.get(&limits_key(target))? {
        Some(v) => Stored::decode(&v)?,
        None => Stored::default(),
    };
    Ok(stored.report(target, read_usage(view, target)?))
}

/// What one inode counts for: itself, its bytes if a regular file.
pub(crate) fn usage_of(kind: Kind, size: u64) -> QuotaUsage {
    QuotaUsage {
        bytes: if kind == Kind::File { size as i64 } else { 0 },
        inodes: 1,
        dirs: i64::from(kind == Kind::Dir),
    }
}

#[cfg(test)]
mod tests;
