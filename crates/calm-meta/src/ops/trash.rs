//! The trash: when the namespace keeps one (`MetaOptions::trash_kept`), a file or directory
//! that loses its last name (unlink, rmdir, a rename over it, an orphan's last close) is not
//! destroyed but kept: its inode stays, with `nlink` 0 and no name, and an `E handle` key says
//! when it was removed, its size then, and the directory and name it had. It counts in its
//! owners' quotas until it is purged (in no tree: it left them with its name) and in the trash's
//! own counters; nothing is made
//! in a directory in the trash, and nothing in the trash is changed (`Ctx::load_changeable`), so
//! what is restored is what was removed. A restore names it again in its old directory (under
//! a new name when the old one is taken; in the root when the directory is gone) in one
//! transaction, logged as a create; a purge, or the expiry of what is older than the trash keeps,
//! destroys it and queues its objects for deletion.
//!
//! A directory is restored before what was in it (a restore into a directory that is itself
//! in the trash is refused, saying so): `calm trash restore` restores the directories above an
//! entry first, and what was removed below a directory with it.

use std::ops::ControlFlow;

use calm_store::{ReadTxn, WriteTxn};

use super::names::make_record_type;
use super::remove::erase;
use crate::ctx::*;
use crate::error::{MetaError, Result};
use crate::layout::{Inode, TRASH_END, TrashEntry, key_handle, trash_key};
use crate::outcome::{Done, Outcome};
use crate::types::*;

/// Entries one listing answers at most (the caller goes on from the handle answered).
pub const LIST_ENTRIES_MAX: usize = 10_000;
/// Entries of the trash one listing reads at most, whoever asks (a user's own entries are
/// found among everyone's).
pub const LIST_SCAN_MAX: usize = 4_096;

fn entry<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Option<TrashEntry>> {
    match view.get(&trash_key(handle))? {
        Some(value) => Ok(Some(TrashEntry::decode(&value)?)),
        None => Ok(None),
    }
}

/// Only its owner or the superuser restores or purges an entry.
fn may_take(caller: &crate::Caller, inode: &Inode) -> Outcome<()> {
    if caller.is_root() || caller.uid == inode.uid {
        return Ok(());
    }
    Err(MetaError::NotPermitted(format!(
        "entry {} of the trash is user {}'s",
        inode.handle, inode.uid
    ))
    .into())
}

/// The name a restore gives when `name` is taken: `name.restored-HANDLE`, cut to fit.
pub fn restored_name(name: &[u8], handle: Handle) -> Vec<u8> {
    let tail = format!(".restored-{handle}");
    let keep = name.len().min(NAME_LEN_MAX - tail.len());
    let mut out = name[..keep].to_vec();
    out.extend_from_slice(tail.as_bytes());
    out
}

/// Restores entry `handle`: names it again where it was (see the module). Answers its
/// attributes, its directory and the name it got.
pub(crate) fn restore<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handle: Handle) -> Outcome<Done> {
    let Some(entry) = entry(ctx.txn, handle)? else {
        return Err(MetaError::NotFound.into());
    };
    let mut inode = ctx.load(handle)?;
    may_take(&ctx.caller, &inode)?;
    let parent = match ctx.load(entry.parent) {
        Ok(dir) if dir.kind == Kind::Dir && dir.nlink > 0 => entry.parent,
        Ok(dir) if dir.kind == Kind::Dir => {
            return Err(MetaError::Invalid(format!(
                "entry {handle} was in directory {}, which is in the trash too: restore it first",
                entry.parent
            ))
            .into());
        }
        Ok(_) | Err(crate::outcome::Failure::Meta(MetaError::NotFound)) => crate::ROOT,
        Err(other) => return Err(other),
    };
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    let mut name = entry.name.clone();
    if get_dentry(ctx.txn, &ctx.names, parent, &name)?.is_some() {
        name = restored_name(&entry.name, handle);
        if get_dentry(ctx.txn, &ctx.names, parent, &name)?.is_some() {
            return Err(MetaError::Exists.into());
        }
    }
    let is_dir = inode.kind == Kind::Dir;
    if is_dir && dir.nlink >= LINK_COUNT_MAX {
        return Err(MetaError::TooManyLinks.into());
    }
    let kind = make_record_type(inode.kind);
    ctx.cl
        .make_room(ctx.txn, kind, ctx.now, &ctx.caller.clone())?;
    // The last check: the trees it counts in again (it changes nothing when it refuses); its
    // owners' quotas counted it all along.
    let usage = crate::ctx::node_usage(ctx.txn, &inode)?;
    ctx.charge_trees(parent, usage)?;

    // Checks done; writes from here on.
    ctx.txn.delete(&trash_key(handle))?;
    ctx.trash_entries_delta -= 1;
    ctx.trash_bytes_delta -= entry.size as i64;
    add_entry(ctx.txn, &ctx.names, &mut dir, &name, handle, inode.kind)?;
    if is_dir {
        dir.nlink += 1;
        inode.nlink = 2;
    } else {
        inode.nlink = 1;
    }
    inode.parent = parent;
    inode.ctime_ns = ctx.now;
    touch(&mut dir, ctx.now);
    ctx.store(dir);
    let attr = inode.attr();
    ctx.record(kind, 0, handle, inode.generation, parent, &name, None)?;
    ctx.store(inode);
    Ok(Done::Restored { attr, parent, name })
}

/// Destroys entry `handle` (its objects queued for deletion): asked for, or expired. With
/// `removed_at`, only the entry removed at that time (an expiry found it so; an entry restored
/// and removed again since is another).
pub(crate) fn purge<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    removed_at: Option<i64>,
) -> Outcome<Done> {
    let Some(entry) = entry(ctx.txn, handle)? else {
        return Err(MetaError::NotFound.into());
    };
    if removed_at.is_some_and(|at| at != entry.deleted_ns) {
        return Ok(Done::Nothing);
    }
    let inode = ctx.load(handle)?;
    may_take(&ctx.caller, &inode)?;
    ctx.txn.delete(&trash_key(handle))?;
    ctx.trash_entries_delta -= 1;
    ctx.trash_bytes_delta -= entry.size as i64;
    let usage = crate::ctx::node_usage(ctx.txn, &inode)?.negated();
    ctx.charge_owners(inode.uid, inode.gid, usage)?;
    erase(ctx, &inode)?;
    Ok(Done::Nothing)
}

/// An entry of the trash as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub handle: Handle,
    pub entry: TrashEntry,
    pub kind: Kind,
    pub uid: u32,
    pub gid: u32,
}

/// Up to `max` entries of the trash with a handle above `after` (only those of `uid`'s nodes
/// when given), in handle order, and where the next page begins (`None`: the trash's end was
/// reached). A page reads at most [`LIST_SCAN_MAX`] entries, whoever asks and whatever it
/// finds: a user whose own entries are few among another's many gets pages with few entries
/// or none, each of a bounded cost, and goes on from the handle answered.
pub fn list<R: ReadTxn + ?Sized>(
    view: &R,
    after: Handle,
    max: usize,
    uid: Option<u32>,
) -> Result<(Vec<Listed>, Option<Handle>)> {
    let mut found = Vec::new();
    let mut failed = None;
    let start = trash_key(after.saturating_add(1));
    view.visit(&start, TRASH_END, &mut |key, value| {
        match (key_handle(key), TrashEntry::decode(value)) {
            (Some(handle), Ok(entry)) => found.push((handle, entry)),
            (None, _) => failed = Some(MetaError::Corrupt(format!("trash key {key:?}"))),
            (_, Err(e)) => failed = Some(e),
        }
        if failed.is_some() || found.len() >= LIST_SCAN_MAX {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let mut next = (found.len() >= LIST_SCAN_MAX).then(|| found.last().map(|(h, _)| *h));
    let mut out = Vec::new();
    for (handle, entry) in found {
        let inode = crate::ctx::load(view, handle).map_err(|f| match f {
            crate::outcome::Failure::Meta(MetaError::NotFound) => {
                MetaError::Corrupt(format!("trash entry {handle} has no inode"))
            }
            other => other.into(),
        })?;
        if uid.is_some_and(|u| u != inode.uid) {
            continue;
        }
        out.push(Listed {
            handle,
            entry,
            kind: inode.kind,
            uid: inode.uid,
            gid: inode.gid,
        });
        if out.len() >= max {
            next = Some(Some(handle));
            break;
        }
    }
    Ok((out, next.flatten()))
}

/// One expiry pass's finds: entries removed before the limit (handle, when removed), and the
/// handle the next pass starts at (`None`: the end of the trash was reached).
pub type Expired = (Vec<(Handle, i64)>, Option<Handle>);

/// Entries to visit per expiry pass.
pub const EXPIRY_ENTRIES_PER_PASS: usize = 4096;

/// One pass of the expiry: of up to [`EXPIRY_ENTRIES_PER_PASS`] entries with a handle from
/// `from` on, those removed before `before_ns` (handle, when removed); and where the next pass
/// starts (`None`: the end of the trash was reached).
pub fn expired<R: ReadTxn + ?Sized>(view: &R, from: Handle, before_ns: i64) -> Result<Expired> {
    let mut old = Vec::new();
    let mut seen = 0usize;
    let mut next = None;
    let mut failed = None;
    view.visit(&trash_key(from), TRASH_END, &mut |key, value| {
        let Some(handle) = key_handle(key) else {
            failed = Some(MetaError::Corrupt(format!("trash key {key:?}")));
            return ControlFlow::Break(());
        };
        if seen == EXPIRY_ENTRIES_PER_PASS {
            next = Some(handle);
            return ControlFlow::Break(());
        }
        seen += 1;
        match TrashEntry::decode(value) {
            Ok(entry) if entry.deleted_ns < before_ns => old.push((handle, entry.deleted_ns)),
            Ok(_) => {}
            Err(e) => {
                failed = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok((old, next)),
    }
}
