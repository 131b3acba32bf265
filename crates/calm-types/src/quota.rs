//! Quotas: how much a user, a group or a directory tree may use, and how much it uses.
//!
//! Usage counts inodes (every kind) and bytes (the sizes of regular files). A user's and a
//! group's usage is that of the inodes they own, over the whole namespace; a tree's is that of
//! every inode below its directory (not the directory itself, which counts in the trees above
//! it). A file with several names counts once, in the one tree all its names are in (a link or
//! a rename that would put its names in two trees is refused).

use std::fmt;

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaKind {
    /// The inodes a uid owns.
    User,
    /// The inodes a gid owns.
    Group,
    /// The inodes below a directory.
    Tree,
}

impl QuotaKind {
    /// Every kind, in the order of [`QuotaKind::index`]: what a table of counts by kind (a
    /// metric's label values) walks. A new kind is added here and in the matches below.
    pub const ALL: [QuotaKind; 3] = [QuotaKind::User, QuotaKind::Group, QuotaKind::Tree];

    /// Its place in [`QuotaKind::ALL`].
    pub fn index(self) -> usize {
        match self {
            QuotaKind::User => 0,
            QuotaKind::Group => 1,
            QuotaKind::Tree => 2,
        }
    }

    /// The byte the store and the wire name it by.
    pub fn tag(self) -> u8 {
        match self {
            QuotaKind::User => b'u',
            QuotaKind::Group => b'g',
            QuotaKind::Tree => b'd',
        }
    }

    pub fn from_tag(tag: u8) -> Option<Self> {
        Some(match tag {
            b'u' => QuotaKind::User,
            b'g' => QuotaKind::Group,
            b'd' => QuotaKind::Tree,
            _ => return None,
        })
    }

    /// The word users read and type for it: a metric's label value, a table's, the name of a
    /// command's flag (`--user`, `--group`; a tree is named by its path).
    pub fn word(self) -> &'static str {
        match self {
            QuotaKind::User => "user",
            QuotaKind::Group => "group",
            QuotaKind::Tree => "tree",
        }
    }
}

/// One quota: a uid, a gid, or a directory's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaTarget {
    pub kind: QuotaKind,
    pub id: u64,
}

impl QuotaTarget {
    pub fn user(uid: u32) -> Self {
        Self {
            kind: QuotaKind::User,
            id: u64::from(uid),
        }
    }

    pub fn group(gid: u32) -> Self {
        Self {
            kind: QuotaKind::Group,
            id: u64::from(gid),
        }
    }

    pub fn tree(dir: u64) -> Self {
        Self {
            kind: QuotaKind::Tree,
            id: dir,
        }
    }

    /// The quotas that count an inode by who owns it: its user's and its group's. The one
    /// place that says so (a new kind of owner is added here).
    pub fn owners(uid: u32, gid: u32) -> [Self; 2] {
        [Self::user(uid), Self::group(gid)]
    }

    /// The owners' quotas a change of owner from `from` to `to` (uid, gid) moves an inode
    /// between: those it comes into, and those it leaves.
    pub fn owners_changed(from: (u32, u32), to: (u32, u32)) -> (Vec<Self>, Vec<Self>) {
        let (was, will) = (Self::owners(from.0, from.1), Self::owners(to.0, to.1));
        let moved = || was.iter().zip(&will).filter(|(was, will)| was != will);
        (
            moved().map(|(_, will)| *will).collect(),
            moved().map(|(was, _)| *was).collect(),
        )
    }
}

impl fmt::Display for QuotaTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            QuotaKind::Tree => write!(f, "the tree of directory {}", self.id),
            owner => write!(f, "{} {}", owner.word(), self.id),
        }
    }
}

/// The limits of one quota; 0 is "no limit". A hard limit is never passed; past a soft
/// limit, growth goes on for `grace_s` seconds, then is refused as at a hard one until usage
/// falls back under the soft limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    pub bytes: u64,
    pub inodes: u64,
    pub soft_bytes: u64,
    pub soft_inodes: u64,
    pub grace_s: u64,
}

impl QuotaLimits {
    /// Whether no limit is set (setting this removes the quota).
    pub fn is_none(&self) -> bool {
        self.bytes == 0 && self.inodes == 0 && self.soft_bytes == 0 && self.soft_inodes == 0
    }
}

/// What a quota's owner uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaUsage {
    /// Sum of the sizes of the regular files counted.
    pub bytes: i64,
    /// Inodes counted, of every kind.
    pub inodes: i64,
    /// Of those, directories (kept for trees only: users and groups report 0).
    pub dirs: i64,
}

impl QuotaUsage {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    pub fn plus(self, other: QuotaUsage) -> QuotaUsage {
        QuotaUsage {
            bytes: self.bytes + other.bytes,
            inodes: self.inodes + other.inodes,
            dirs: self.dirs + other.dirs,
        }
    }

    pub fn negated(self) -> QuotaUsage {
        QuotaUsage {
            bytes: -self.bytes,
            inodes: -self.inodes,
            dirs: -self.dirs,
        }
    }
}

/// A quota as `calm quota get` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaReport {
    pub target: QuotaTarget,
    pub limits: QuotaLimits,
    pub usage: QuotaUsage,
    /// When bytes went past the soft limit (ns since the epoch; 0: they are not past it).
    pub bytes_over_since_ns: i64,
    /// When inodes went past the soft limit (ns since the epoch; 0: they are not past it).
    pub inodes_over_since_ns: i64,
}

/// A difference `calm quota check` found between the usage kept and the usage counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaMismatch {
    pub target: QuotaTarget,
    pub kept: QuotaUsage,
    pub counted: QuotaUsage,
}

impl fmt::Display for QuotaMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (k, c) = (&self.kept, &self.counted);
        write!(
            f,
            "the quota of {}: usage kept {} bytes, {} inodes, {} directories; counted {} bytes, \
             {} inodes, {} directories",
            self.target, k.bytes, k.inodes, k.dirs, c.bytes, c.inodes, c.dirs
        )
    }
}

/// Tree quotas a namespace holds at most (each is looked up on the path of every change below
/// it).
pub const TREE_QUOTAS_MAX: u64 = 100_000;

#[cfg(test)]
mod owner_tests {
    use super::QuotaTarget;

    #[test]
    fn a_change_of_owner_moves_only_the_owners_that_changed() {
        let (user, group) = (QuotaTarget::user, QuotaTarget::group);
        assert_eq!(QuotaTarget::owners(5, 6), [user(5), group(6)]);
        assert_eq!(
            QuotaTarget::owners_changed((1, 2), (1, 2)),
            (vec![], vec![])
        );
        assert_eq!(
            QuotaTarget::owners_changed((1, 2), (3, 2)),
            (vec![user(3)], vec![user(1)])
        );
        assert_eq!(
            QuotaTarget::owners_changed((1, 2), (1, 4)),
            (vec![group(4)], vec![group(2)])
        );
        assert_eq!(
            QuotaTarget::owners_changed((1, 2), (3, 4)),
            (vec![user(3), group(4)], vec![user(1), group(2)])
        );
    }
}
