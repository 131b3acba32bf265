//! How a node leaves the namespace: one of its links dropped, the inode and its xattrs and
//! chunks destroyed with its last, or kept as an orphan of the caller's session while the
//! caller's mount has it open (`super::orphans`).

use calm_store::WriteTxn;

use crate::ctx::*;
use crate::layout::{Inode, orphan_key, xattr_key};
use crate::outcome::Outcome;
use crate::types::*;

/// Removes an inode and its xattrs.
pub(crate) fn destroy<T: WriteTxn>(ctx: &mut Ctx<'_, T>, inode: &Inode) -> Outcome<()> {
    for name in xattr_names(ctx.txn, inode.handle)? {
        ctx.txn.delete(&xattr_key(inode.handle, &name))?;
    }
    ctx.remove(inode.handle);
    if inode.kind == Kind::Dir && ctx.quota.trees(ctx.txn)? > 0 {
        // A directory with a tree limit takes it along (it is empty: nothing is counted).
        let tree = crate::quota::QuotaTarget::tree(inode.handle);
        if ctx.quota.has_tree(ctx.txn, inode.handle)? {
            let now = ctx.now;
            ctx.quota
                .set(ctx.txn, tree, Default::default(), None, now)?;
        }
    }
    // A directory counts in the trees above it; a file left them with its last name.
    let usage = crate::quota::usage_of(inode.kind, inode.size).negated();
    ctx.charge(inode.uid, inode.gid, inode.parent, usage)?;
    if inode.kind == Kind::File {
        ctx.file_bytes_delta -= inode.size as i64;
        crate::ops::data::truncate_chunks(ctx, inode.handle, 0)?;
    }
    Ok(())
}

/// Drops one link of a non-directory, its name in `dir`; destroys it when none is left, unless
/// it is a file the caller's mount has open (one of `keep`): then it is kept as an orphan of
/// the caller's session, and its handle returned.
pub(crate) fn drop_link<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
    dir: Handle,
    keep: &[Handle],
) -> Outcome<Option<Handle>> {
    debug_assert!(inode.kind != Kind::Dir);
    inode.nlink -= 1;
    if inode.nlink == 0 && inode.parent != 0 {
        let usage = crate::quota::usage_of(inode.kind, inode.size).negated();
        ctx.charge_trees(dir, usage)?;
    }
    crate::links::removed(ctx.txn, &mut inode, dir)?;
    if inode.nlink == 0 {
        if inode.kind == Kind::File && keep.contains(&inode.handle) {
            return keep_orphan(ctx, inode);
        }
        destroy(ctx, &inode)?;
    } else {
        inode.ctime_ns = ctx.now;
        ctx.store(inode);
    }
    Ok(None)
}

/// Keeps `inode` (no name left, `nlink` 0) as an orphan of the caller's session.
pub(crate) fn keep_orphan<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
) -> Outcome<Option<Handle>> {
    let session = ctx.caller.session;
    if session == 0 {
        // No session to end it: nothing would ever release it.
        destroy(ctx, &inode)?;
        return Ok(None);
    }
    let handle = inode.handle;
    inode.ctime_ns = ctx.now;
    ctx.store(inode);
    ctx.txn.put(&orphan_key(handle), &session.to_le_bytes())?;
    Ok(Some(handle))
}
