//! How a node leaves the namespace: one of its links dropped, and with its last either the
//! inode and its xattrs and chunks destroyed, or the node moved to the trash (`super::trash`)
//! when the namespace keeps one, or kept as an orphan of the caller's session while the
//! caller's mount has it open (`super::orphans`).

use calm_store::WriteTxn;

use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::{
    Inode, ORPHAN_END, OrphanRecord, TAG_ORPHAN, TrashEntry, key_handle, orphan_key, trash_key,
    xattr_key,
};
use crate::outcome::Outcome;
use crate::types::*;

/// Takes what an inode counts in its owners' quotas (and, for a directory, in the trees above
/// it: a file left them with its last name) away. A directory's own tree limit stays while it
/// is in the trash (it is empty: its tree counts nothing), so that a restore brings it back
/// with its limit and what is restored below it is held to it; it goes with the directory
/// ([`erase`]).
pub(crate) fn uncharge<T: WriteTxn>(ctx: &mut Ctx<'_, T>, inode: &Inode) -> Outcome<()> {
    let usage = node_usage(ctx.txn, inode)?.negated();
    if inode.kind == Kind::Dir {
        ctx.charge(inode.uid, inode.gid, inode.parent, usage)
    } else {
        ctx.charge_owners(inode.uid, inode.gid, usage)
    }
}

/// Removes an inode with its xattrs and chunks (its objects queued for deletion) and a
/// directory's own tree limit, its quota usage already taken away.
pub(crate) fn erase<T: WriteTxn>(ctx: &mut Ctx<'_, T>, inode: &Inode) -> Outcome<()> {
    if inode.kind == Kind::Dir && ctx.quota.trees(ctx.txn)? > 0 {
        let tree = crate::quota::QuotaTarget::tree(inode.handle);
        if ctx.quota.has_tree(ctx.txn, inode.handle)? {
            let now = ctx.now;
            ctx.quota
                .set(ctx.txn, tree, Default::default(), None, now)?;
        }
    }
    for name in xattr_names(ctx.txn, inode.handle)? {
        ctx.txn.delete(&xattr_key(inode.handle, &name))?;
    }
    ctx.remove(inode.handle);
    if inode.kind == Kind::File {
        ctx.file_bytes_delta -= inode.size as i64;
        crate::ops::data::truncate_chunks(ctx, inode.handle, 0)?;
    }
    Ok(())
}

/// Removes an inode and its xattrs, and what it counted in the quotas.
pub(crate) fn destroy<T: WriteTxn>(ctx: &mut Ctx<'_, T>, inode: &Inode) -> Outcome<()> {
    uncharge(ctx, inode)?;
    erase(ctx, inode)
}

/// A node that lost its last name (`name` in `dir`): to the trash when the namespace keeps
/// one, else destroyed.
pub(crate) fn removed<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    inode: Inode,
    dir: Handle,
    name: &[u8],
) -> Outcome<()> {
    // A node made moments ago is a program's scratch, not a person's work (`crate::young`).
    let young = ctx
        .young
        .is_some_and(|young| young.is_young(inode.handle, ctx.now));
    if inode.kind == Kind::Dir {
        orphans_lose_their_dir(ctx, inode.handle)?;
    }
    if ctx.trash && !young {
        to_trash(ctx, inode, dir, name)
    } else {
        ctx.gone.push(inode.handle);
        destroy(ctx, &inode)
    }
}

/// Orphans whose last name was in directory `dir`, which leaves the namespace, count in no
/// tree from now on: what they count leaves the trees above it (and its own), and their records
/// say so. Only where some tree has a limit: the orphans are read whole, and are few.
fn orphans_lose_their_dir<T: WriteTxn>(ctx: &mut Ctx<'_, T>, dir: Handle) -> Outcome<()> {
    if ctx.quota.trees(ctx.txn)? == 0 {
        return Ok(());
    }
    let mut found = Vec::new();
    let mut bad = None;
    ctx.txn
        .visit(&[TAG_ORPHAN], ORPHAN_END, &mut |key, value| {
            match (key_handle(key), OrphanRecord::decode(value)) {
                (Some(handle), Ok(record)) if record.tree_dir() == dir => {
                    found.push((handle, record))
                }
                (Some(_), Ok(_)) => {}
                (None, _) => bad = Some(MetaError::Corrupt(format!("orphan key {key:?}"))),
                (_, Err(e)) => bad = Some(e),
            }
            std::ops::ControlFlow::Continue(())
        })?;
    if let Some(e) = bad {
        return Err(e.into());
    }
    for (handle, mut record) in found {
        let inode = ctx.load(handle)?;
        let usage = node_usage(ctx.txn, &inode)?.negated();
        ctx.charge_trees(dir, usage)?;
        if let Some(place) = &mut record.place {
            place.0 = 0;
        }
        ctx.txn.put(&orphan_key(handle), &record.encode())?;
    }
    Ok(())
}

/// Drops one link of a non-directory, its `name` in `dir`; removes it ([`removed`]) when none is
/// left, unless it is a file the caller's mount has open (one of `keep`): then it is kept as an
/// orphan of the caller's session, and its handle returned.
pub(crate) fn drop_link<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
    dir: Handle,
    name: &[u8],
    keep: &[Handle],
) -> Outcome<Option<Handle>> {
    debug_assert!(inode.kind != Kind::Dir);
    inode.nlink -= 1;
    // An open file whose last name goes stays in its trees until its last close: it still
    // holds its bytes, and may grow.
    let orphan = inode.nlink == 0
        && inode.kind == Kind::File
        && ctx.caller.session != 0
        && keep.contains(&inode.handle);
    // A file made before format 4 that was never renamed counts in no tree (its directory is
    // not known), nor does it as an orphan.
    let in_trees = inode.parent != 0;
    // Its xattrs are read only where a tree limit could count them.
    if inode.nlink == 0 && !orphan && in_trees && ctx.quota.trees(ctx.txn)? > 0 {
        let usage = node_usage(ctx.txn, &inode)?.negated();
        ctx.charge_trees(dir, usage)?;
    }
    crate::links::removed(ctx.txn, &mut inode, dir)?;
    if orphan {
        let tree_dir = if in_trees { dir } else { 0 };
        return keep_orphan(ctx, inode, tree_dir, name);
    }
    if inode.nlink == 0 {
        removed(ctx, inode, dir, name)?;
    } else {
        inode.ctime_ns = ctx.now;
        ctx.store(inode);
    }
    Ok(None)
}

/// Keeps `inode` (no name left, `nlink` 0, its last name `name` in `dir`, whose trees it still
/// counts in) as an orphan of the caller's session.
fn keep_orphan<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
    dir: Handle,
    name: &[u8],
) -> Outcome<Option<Handle>> {
    let handle = inode.handle;
    inode.ctime_ns = ctx.now;
    ctx.store(inode);
    let record = OrphanRecord {
        session: ctx.caller.session,
        place: Some((dir, name.to_vec())),
    };
    ctx.txn.put(&orphan_key(handle), &record.encode())?;
    Ok(Some(handle))
}

/// Moves `inode`, whose last name was `name` in `dir` (already removed; a file's usage of the
/// trees above that directory with it), to the trash. It stays in its owners' quotas until it
/// is purged: a removal that parked bytes in the trash would otherwise be a way around every
/// limit.
pub(crate) fn to_trash<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
    dir: Handle,
    name: &[u8],
) -> Outcome<()> {
    if inode.kind == Kind::Dir {
        let usage = node_usage(ctx.txn, &inode)?.negated();
        ctx.charge_trees(inode.parent, usage)?;
    }
    let entry = TrashEntry {
        deleted_ns: ctx.now,
        size: if inode.kind == Kind::File {
            inode.size
        } else {
            0
        },
        parent: dir,
        name: name.to_vec(),
    };
    ctx.txn.put(&trash_key(inode.handle), &entry.encode())?;
    ctx.trash_entries_delta += 1;
    ctx.trash_bytes_delta += entry.size as i64;
    inode.nlink = 0;
    inode.ctime_ns = ctx.now;
    ctx.store(inode);
    Ok(())
}
