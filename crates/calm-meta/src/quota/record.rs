//! The records of quotas: their keys, usage and limits as stored, and the judgement of a
//! change of usage against limits (pure).

use calm_store::ReadTxn;

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
