//! Orphans: regular files that lost their last name while the mount that removed it still had
//! them open. As on a local file system, such a file stays whole (readable, writable, its
//! objects kept) until its last close: the unlink (or the rename over it) keeps the inode with
//! `nlink` 0 and writes `H handle → session, directory, name` in the same transaction, naming
//! the mount's lock session and where the file's last name was. The file is destroyed (its
//! objects queued for deletion), or moved to the trash when the namespace keeps one
//! (`super::trash`), when that mount closes it
//! ([`Op::ReleaseOrphan`](crate::ops::Op::ReleaseOrphan)), or when the session ends without
//! doing so (the server's sweeper: a mount killed, or its lease lost). A mount that opens a new
//! session after losing its old one (a restarted server) claims its orphans back.
//!
//! Until then it counts in its owners' quotas and in the trees above the directory its last
//! name was in (it holds its bytes, and may grow), unless that directory is removed meanwhile:
//! then in no tree.
//!
//! Only the mount that removes the name knows the file is open (it says so in the request's
//! `keep` list); another mount's open files are not known to the server (see
//! docs/design/data.md, "Unlinked but open").

use calm_store::{ReadTxn, WriteTxn};

use super::remove::{destroy, removed};
use crate::ctx::Ctx;
use crate::error::{MetaError, Result};
use crate::layout::{ORPHAN_END, OrphanRecord, TAG_ORPHAN, key_handle, orphan_key};
use crate::outcome::{Done, Outcome};
use crate::types::Handle;

/// Orphans one claim may name.
pub const CLAIM_HANDLES_MAX: usize = 65_536;

/// Destroys orphan `handle` if it is the caller's session's (or, with `any_session`, whoever's).
/// Not an orphan (released already): nothing to do.
pub(crate) fn release<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    any_session: bool,
) -> Outcome<Done> {
    let key = orphan_key(handle);
    let Some(value) = ctx.txn.get(&key)?.map(|v| v.into_owned()) else {
        return Ok(Done::Nothing);
    };
    let record = OrphanRecord::decode(&value)?;
    if !any_session && record.session != ctx.caller.session {
        return Err(
            MetaError::NotPermitted(format!("orphan {handle} belongs to another session")).into(),
        );
    }
    let inode = ctx.load(handle)?;
    // It leaves the trees it counted in while open.
    let tree_dir = ctx.live_dir(record.tree_dir())?;
    if tree_dir != 0 && ctx.quota.trees(ctx.txn)? > 0 {
        let usage = crate::ctx::node_usage(ctx.txn, &inode)?.negated();
        ctx.charge_trees(tree_dir, usage)?;
    }
    ctx.txn.delete(&key)?;
    match record.place {
        Some((dir, name)) => removed(ctx, inode, dir, &name)?,
        None => destroy(ctx, &inode)?,
    }
    Ok(Done::Nothing)
}

/// The caller's session takes over the orphans among `handles`.
pub(crate) fn claim<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handles: &[Handle]) -> Outcome<Done> {
    let session = ctx.caller.session;
    if session == 0 {
        return Err(MetaError::Invalid("claiming orphans needs a session".into()).into());
    }
    if handles.len() > CLAIM_HANDLES_MAX {
        return Err(MetaError::Invalid(format!(
            "at most {CLAIM_HANDLES_MAX} orphans in one claim"
        ))
        .into());
    }
    for handle in handles {
        let key = orphan_key(*handle);
        if let Some(mut value) = ctx.txn.get(&key)?.map(|v| v.into_owned()) {
            value[..8].copy_from_slice(&session.to_le_bytes());
            ctx.txn.put(&key, &value)?;
        }
    }
    Ok(Done::Nothing)
}

/// Every orphan, with its session.
pub fn list<R: ReadTxn>(snap: &R) -> Result<Vec<(Handle, u64)>> {
    let mut out = Vec::new();
    let mut failed = None;
    snap.visit(&[TAG_ORPHAN], ORPHAN_END, &mut |key, value| {
        match (key_handle(key), OrphanRecord::decode(value)) {
            (Some(handle), Ok(record)) => out.push((handle, record.session)),
            (None, _) => failed = Some(MetaError::Corrupt(format!("orphan key {key:?}"))),
            (_, Err(e)) => failed = Some(e),
        }
        std::ops::ControlFlow::Continue(())
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
