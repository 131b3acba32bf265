//! Quotas as calls: setting limits (through the committer, the superuser only), reading a
//! quota, listing them, checking the usage kept against the namespace, and a tree's summary.

use super::*;
use crate::quota::{QuotaKind, QuotaLimits, QuotaMismatch, QuotaReport, QuotaTarget, QuotaUsage};

/// A tree's files, directories and bytes, and how they were had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub usage: QuotaUsage,
    /// The tree has a limit: its usage was read at once, not walked.
    pub kept: bool,
}

/// Whether any quota has a limit.
fn any_quota_limit<R: ReadTxn>(snap: &R) -> Result<bool> {
    let tag = crate::quota::TAG_LIMITS;
    let mut any = false;
    snap.visit(&[tag], &[tag + 1], &mut |_, _| {
        any = true;
        ControlFlow::Break(())
    })?;
    Ok(any)
}

/// Quota reports one listing returns at most.
pub const QUOTA_LIST_MAX: usize = 100_000;

impl<S: Store> Meta<S> {
    /// Sets `target`'s limits (all 0: removes them). A tree limited for the first time is
    /// counted in the same commit.
    pub async fn set_quota(
        &self,
        caller: Caller,
        target: QuotaTarget,
        limits: QuotaLimits,
    ) -> Result<QuotaReport> {
        match self
            .apply_as(caller, Op::SetQuota { target, limits })
            .await?
        {
            Done::Quota(report) => Ok(report),
            other => unreachable!("a quota's setting answers with its report, not {other:?}"),
        }
    }

    /// `target`'s limits and usage: the superuser's for any; a user's for their own uid and
    /// groups, and for the trees of the directories they may read.
    pub fn quota(&self, caller: &Caller, target: QuotaTarget) -> Result<QuotaReport> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            may_see(&snap, caller, target)?;
            Ok(crate::quota::report(&snap, target)?)
        })
    }

    /// Every quota with a limit the caller may see; `all`: also every user and group that
    /// owns something, without a limit. At most [`QUOTA_LIST_MAX`].
    pub fn quotas(&self, caller: &Caller, all: bool) -> Result<Vec<QuotaReport>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let mut targets = Vec::new();
            for tag in [crate::quota::TAG_LIMITS, crate::quota::TAG_USAGE] {
                if tag == crate::quota::TAG_USAGE && !all {
                    continue;
                }
                snap.visit(&[tag], &[tag + 1], &mut |key, _| {
                    if let Some(target) = crate::quota::key_target(key) {
                        targets.push(target);
                    }
                    ControlFlow::Continue(())
                })?;
            }
            targets.sort();
            targets.dedup();
            let mut reports = Vec::new();
            for target in targets {
                if may_see(&snap, caller, target).is_err() {
                    continue;
                }
                if reports.len() == QUOTA_LIST_MAX {
                    break;
                }
                reports.push(crate::quota::report(&snap, target)?);
            }
            Ok(reports)
        })
    }

    /// What a mount that made `handle` may hold of it, read once: a regular file's mode,
    /// owner and times (`Kind::File`: no ACL), or a directory's names (`Kind::Dir`: no ACL,
    /// which decides new nodes' modes; no setgid bit, their group; where quotas limit the
    /// makes in it, the share set aside with its make, [`Meta::shares`]); `None`: nothing.
    pub fn holdable(&self, handle: Handle) -> Result<Option<Kind>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            Ok(match inode.kind {
                _ if inode.acls != 0 => None,
                Kind::File => Some(Kind::File),
                Kind::Dir if inode.mode & 0o2000 == 0 => Some(Kind::Dir),
                _ => None,
            })
        })
    }

    /// What a mount needs to hold directory `handle`, which has names already, read on one
    /// snapshot: its attributes, the directory it is in, and every name in it. `None` where it
    /// may not be held so: not a directory, an ACL, a setuid, setgid or sticky bit (the
    /// server decides what those do), more than `names_max` names, or any quota limit (a
    /// share of the room left is set aside only with a directory's make).
    pub fn dir_to_hold(
        &self,
        handle: Handle,
        names_max: usize,
    ) -> Result<Option<(Attr, Handle, Vec<DirEntry>)>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            let plain = inode.kind == Kind::Dir && inode.acls == 0 && inode.mode & 0o7000 == 0;
            let names_max = names_max.min(READDIR_ENTRIES_MAX);
            if !plain || inode.entries > names_max as u64 || any_quota_limit(&snap)? {
                return Ok(None);
            }
            let names = crate::reads::readdir_entries(&snap, handle, 0, names_max + 1)?;
            if names.len() > names_max {
                return Ok(None);
            }
            Ok(Some((inode.attr(), inode.parent, names)))
        })
    }

    /// Where the usage kept differs from the namespace counted, on one snapshot (the
    /// superuser only: it reads every inode).
    pub fn quota_check(&self, caller: &Caller) -> Result<Vec<QuotaMismatch>> {
        if !caller.is_root() {
            return Err(MetaError::NotPermitted(
                "only the superuser checks quotas".into(),
            ));
        }
        self.blocking(|| Ok(crate::quota::count::check(&self.store.snapshot()?)?))
    }

    /// The files, directories and bytes below directory `dir`: read at once when its tree has
    /// a limit, else walked (the caller must be able to read and search every directory).
    pub fn summary(&self, caller: &Caller, dir: Handle) -> Result<Summary> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load_dir(&snap, dir)?;
            let target = QuotaTarget::tree(dir);
            if snap.get(&crate::quota::limits_key(target))?.is_some() {
                perm::permission(caller, &inode.owner(), perm::MAY_READ)?;
                return Ok(Summary {
                    usage: crate::quota::read_usage(&snap, target)?,
                    kept: true,
                });
            }
            let usage = crate::quota::count::walk(&snap, dir, false, &mut |dir| {
                perm::permission(caller, &dir.owner(), perm::MAY_READ | perm::MAY_EXEC)
            })?;
            Ok(Summary { usage, kept: false })
        })
    }
}

/// Whether `caller` may read `target`'s quota.
fn may_see<R: ReadTxn>(view: &R, caller: &Caller, target: QuotaTarget) -> Result<()> {
    if caller.is_root() {
        return Ok(());
    }
    let own = match target.kind {
        QuotaKind::User => target.id == u64::from(caller.uid),
        QuotaKind::Group => u32::try_from(target.id).is_ok_and(|gid| caller.in_group(gid)),
        QuotaKind::Tree => {
            let dir = ops::load_dir(view, target.id)?;
            return perm::permission(caller, &dir.owner(), perm::MAY_READ);
        }
    };
    if own {
        Ok(())
    } else {
        Err(MetaError::Access(format!(
            "{target}'s quota is its own or the superuser's"
        )))
    }
}
