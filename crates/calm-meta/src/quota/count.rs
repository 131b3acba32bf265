//! Counting usage from the namespace itself: a tree when a limit is first set on it, and
//! everything when `calm quota check` or `calm fsck` compares what is kept with what is there.

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;

use calm_store::ReadTxn;

use super::record::{QuotaKind, QuotaMismatch, QuotaTarget, QuotaUsage, TAG_LIMITS, TAG_USAGE};
use super::record::{decode_usage, key_target};
use crate::error::MetaError;
use crate::layout::{
    Dentry, Inode, ORPHAN_END, TAG_INODE, TAG_ORPHAN, entries_range, inode_key, key_handle,
};
use crate::outcome::Outcome;
use crate::types::*;

/// Entries a tree may hold for a limit to be set on it: the count runs inside one commit,
/// which holds the other writers back while it runs.
pub const TREE_COUNT_ENTRIES_MAX: u64 = 10_000_000;

/// What [`try_visit`] calls for each pair: an error stops it.
type Each<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), MetaError> + 'a;

/// Calls `each` for every pair with `start <= key < end`, until it fails: its error is the
/// answer.
fn try_visit<R: ReadTxn + ?Sized>(
    view: &R,
    start: &[u8],
    end: &[u8],
    each: &mut Each<'_>,
) -> Outcome<()> {
    let mut bad = None;
    view.visit(start, end, &mut |key, value| match each(key, value) {
        Ok(()) => ControlFlow::Continue(()),
        Err(error) => {
            bad = Some(error);
            ControlFlow::Break(())
        }
    })?;
    match bad {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

fn inode<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Inode> {
    match view.get(&inode_key(handle))? {
        Some(v) => Ok(Inode::decode(handle, &v)?),
        None => {
            Err(MetaError::Corrupt(format!("a name leads to inode {handle}, which is gone")).into())
        }
    }
}

/// The usage of everything below directory `dir` (not `dir` itself): each inode once. Refused when a file has names both
/// inside and outside the tree (it could not count in one tree only), or past
/// [`TREE_COUNT_ENTRIES_MAX`] entries.
pub fn tree<R: ReadTxn + ?Sized>(view: &R, dir: Handle) -> Outcome<QuotaUsage> {
    walk(view, dir, true, &mut |_| Ok(()))
}

/// Walks the tree below `dir` as [`tree`] counts it. `whole`: refuse a file with names
/// outside the tree. `enter` is asked before each directory is read (the tree's own first).
pub fn walk<R: ReadTxn + ?Sized>(
    view: &R,
    dir: Handle,
    whole: bool,
    enter: &mut dyn FnMut(&Inode) -> Result<(), MetaError>,
) -> Outcome<QuotaUsage> {
    enter(&inode(view, dir)?)?;
    let mut usage = QuotaUsage::default();
    let mut dirs: HashSet<Handle> = HashSet::from([dir]);
    let mut todo = vec![dir];
    let mut linked: Vec<Inode> = Vec::new();
    let mut counted_links: HashSet<Handle> = HashSet::new();
    let mut entries = 0u64;
    while let Some(at) = todo.pop() {
        let (start, end) = entries_range(at);
        let mut children: Vec<Dentry> = Vec::new();
        try_visit(view, &start, &end, &mut |_, value| {
            children.push(Dentry::decode(value)?);
            Ok(())
        })?;
        entries += children.len() as u64;
        if entries > TREE_COUNT_ENTRIES_MAX {
            return Err(MetaError::Invalid(format!(
                "the tree holds more than {TREE_COUNT_ENTRIES_MAX} entries: a limit is set \
                 on smaller trees only"
            ))
            .into());
        }
        for dentry in children {
            let child = inode(view, dentry.child)?;
            if child.kind == Kind::Dir {
                enter(&child)?;
                todo.push(child.handle);
                dirs.insert(child.handle);
            } else {
                if child.nlink > 1 && !counted_links.insert(child.handle) {
                    continue; // seen already, under another of its names
                }
                if whole {
                    if child.parent == 0 {
                        // Made before format 4 and never renamed: its directory is not
                        // known, so no change of it reaches a tree's usage.
                        continue;
                    }
                    if child.nlink > 1 {
                        linked.push(child.clone());
                    }
                }
            }
            usage = usage.plus(crate::ctx::node_usage(view, &child)?);
        }
    }
    // Open files whose last name was in the tree count in it until their last close.
    let mut orphans = Vec::new();
    try_visit(view, &[TAG_ORPHAN], ORPHAN_END, &mut |key, _| {
        orphans.push(
            key_handle(key).ok_or_else(|| MetaError::Corrupt(format!("orphan key {key:?}")))?,
        );
        Ok(())
    })?;
    for handle in orphans {
        if dirs.contains(&crate::ctx::orphan_tree_dir(view, handle)?) {
            usage = usage.plus(crate::ctx::node_usage(view, &inode(view, handle)?)?);
        }
    }
    for file in linked {
        for parent in crate::links::parents(view, &file)? {
            if !dirs.contains(&parent) {
                return Err(MetaError::Invalid(format!(
                    "file {} has names inside the tree and outside it (in directory \
                     {parent}): a file counts in one tree only; remove the outside names \
                     first",
                    file.handle
                ))
                .into());
            }
        }
    }
    Ok(usage)
}

/// Every user's and group's usage counted from the inodes (those in the trash and the open
/// files with no name too: they hold their bytes until purged or closed), and every limited
/// tree's from its names and its open files with none.
pub fn everything<R: ReadTxn + ?Sized>(view: &R) -> Outcome<BTreeMap<QuotaTarget, QuotaUsage>> {
    let mut counted: BTreeMap<QuotaTarget, QuotaUsage> = BTreeMap::new();
    try_visit(view, &[TAG_INODE], &[TAG_INODE + 1], &mut |key, value| {
        let handle =
            key_handle(key).ok_or_else(|| MetaError::Corrupt(format!("inode key {key:?}")))?;
        let inode = Inode::decode(handle, value)?;
        let usage = crate::ctx::node_usage(view, &inode)?;
        for target in QuotaTarget::owners(inode.uid, inode.gid) {
            let sum = counted.entry(target).or_default();
            *sum = sum.plus(usage);
        }
        Ok(())
    })?;
    let mut trees = Vec::new();
    view.visit(&[TAG_LIMITS], &[TAG_LIMITS + 1], &mut |key, _| {
        if let Some(target) = key_target(key)
            && target.kind == QuotaKind::Tree
        {
            trees.push(target);
        }
        ControlFlow::Continue(())
    })?;
    for target in trees {
        counted.insert(target, tree(view, target.id)?);
    }
    Ok(counted)
}

/// Every usage record kept.
pub fn kept<R: ReadTxn + ?Sized>(view: &R) -> Outcome<BTreeMap<QuotaTarget, QuotaUsage>> {
    let mut kept = BTreeMap::new();
    try_visit(view, &[TAG_USAGE], &[TAG_USAGE + 1], &mut |key, value| {
        let target = key_target(key)
            .ok_or_else(|| MetaError::Corrupt(format!("quota usage key {key:?}")))?;
        kept.insert(target, decode_usage(value)?);
        Ok(())
    })?;
    Ok(kept)
}

/// Where the usage kept differs from the usage counted, on one snapshot.
pub fn check<R: ReadTxn + ?Sized>(view: &R) -> Outcome<Vec<QuotaMismatch>> {
    let counted = everything(view)?;
    let kept = kept(view)?;
    let mut targets: Vec<QuotaTarget> = counted.keys().chain(kept.keys()).copied().collect();
    targets.sort();
    targets.dedup();
    Ok(targets
        .into_iter()
        .filter_map(|target| {
            let kept = kept.get(&target).copied().unwrap_or_default();
            let counted = counted.get(&target).copied().unwrap_or_default();
            (kept != counted).then_some(QuotaMismatch {
                target,
                kept,
                counted,
            })
        })
        .collect())
}
