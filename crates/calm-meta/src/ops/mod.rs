//! Namespace mutations as deterministic functions of (transaction state, operation, `now`).
//!
//! The rule that keeps failed operations from leaving partial state: every function does all
//! of its checks (reads only) first, and only then writes. A check that fails returns
//! [`Failure::Meta`] with nothing written, so the other operations of the same group commit go
//! on. A store error ([`Failure::Store`]) can happen mid-write; the committer then drops the
//! whole transaction, so again nothing of it remains.
//!
//! No clock, thread or channel in here: the committer passes `now` and the generation in.
//!
//! This module is the dispatcher ([`apply`]); each family of operations has a file of its own
//! below it, over the shared [`Ctx`] and [`Outcome`](crate::outcome).

use calm_store::WriteTxn;

use calm_changelog::RecordType;

use crate::types::*;

pub mod acls;
pub mod attrs;
pub mod clone;
pub mod data;
pub mod grants;
pub mod names;
pub mod op;
pub mod orphans;
pub mod quota;
pub mod read_ahead;
pub mod remove;
pub mod rename;
pub mod trash;

pub use op::Op;

pub use crate::ctx::{Ctx, check_name, get_dentry, load, load_dir, xattr_names};
pub(crate) use crate::outcome::Outcome;
pub use crate::outcome::{Done, Failure};
pub(crate) use read_ahead::{keys_read_first, reads_after_entries};

use attrs::{removexattr, setattr, setattr_record_type, setxattr};
use names::{link, make, make_record_type, rmdir, unlink};

/// The one directory whose names `op` changes (a rename between two directories changes two:
/// none is named), whose attributes its answer carries (`crate::commit::Answer`).
pub fn changed_dir(op: &Op) -> Option<Handle> {
    match op {
        Op::Make { parent, .. }
        | Op::Clone { parent, .. }
        | Op::Link { parent, .. }
        | Op::Unlink { parent, .. }
        | Op::Rmdir { parent, .. } => Some(*parent),
        Op::Rename {
            parent, new_parent, ..
        } if parent == new_parent => Some(*parent),
        _ => None,
    }
}

/// The changelog record type a mutation writes when it succeeds (before it is applied:
/// the backlog check needs it).
pub fn record_type(op: &Op) -> Option<RecordType> {
    Some(match op {
        Op::Make { node, .. } => make_record_type(node.kind),
        Op::Link { .. } => RecordType::Hardlink,
        Op::Unlink { .. } => RecordType::Unlink,
        Op::Rmdir { .. } => RecordType::Rmdir,
        Op::Rename { .. } => RecordType::Rename,
        Op::SetAttr { attr, .. } => setattr_record_type(attr),
        Op::SetXattr { .. } | Op::RemoveXattr { .. } => RecordType::Xattr,
        Op::Write { .. } | Op::Append { .. } => RecordType::Mtime,
        Op::ClRegister { .. }
        | Op::ClDeregister { .. }
        | Op::ClClear { .. }
        | Op::ClMask { .. }
        | Op::ClGc
        | Op::ForgetRequests { .. }
        | Op::ForgetGrants { .. }
        | Op::Compact { .. }
        | Op::AllocSlices { .. }
        | Op::Grant { .. }
        | Op::GcDone { .. }
        | Op::Collected { .. }
        | Op::ReleaseOrphan { .. }
        | Op::ClaimOrphans { .. }
        | Op::TrashPurge { .. }
        // A clone makes room for the records of its nodes' kinds itself.
        | Op::Clone { .. }
        | Op::CloneEntries { .. }
        // A restore makes room for the record of its node's kind itself.
        | Op::TrashRestore { .. }
        | Op::SetQuota { .. } => return None,
    })
}

/// Applies one mutation in `ctx.txn`, with its changelog record.
pub fn apply<T: WriteTxn>(ctx: &mut Ctx<'_, T>, op: &Op) -> Outcome<Done> {
    if let Some(kind) = record_type(op) {
        let now = ctx.now;
        ctx.cl.make_room(ctx.txn, kind, now, &ctx.caller)?;
    }
    match op {
        Op::Make {
            parent,
            name,
            node,
            exclusive,
        } => make(ctx, *parent, name, node, *exclusive),
        Op::Link {
            handle,
            parent,
            name,
        } => link(ctx, *handle, *parent, name),
        Op::Unlink { parent, name, keep } => unlink(ctx, *parent, name, keep),
        Op::Rmdir { parent, name } => rmdir(ctx, *parent, name),
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
            keep,
        } => rename::rename(ctx, *parent, name, *new_parent, new_name, *flags, keep),
        Op::SetAttr { handle, attr } => setattr(ctx, *handle, attr),
        Op::SetQuota { target, limits } => quota::set_quota(ctx, *target, *limits),
        Op::SetXattr {
            handle,
            name,
            value,
            flags,
        } => setxattr(ctx, *handle, name, value, *flags),
        Op::RemoveXattr { handle, name } => removexattr(ctx, *handle, name),
        Op::ClRegister { name, mask } => {
            let now = ctx.now;
            ctx.cl.register(ctx.txn, name, *mask, now).map(Done::User)
        }
        Op::ClDeregister { id } => ctx.cl.deregister(ctx.txn, *id).map(Done::User),
        Op::ClClear { id, index } => {
            let now = ctx.now;
            ctx.cl.clear(ctx.txn, *id, *index, now).map(Done::User)
        }
        Op::ClMask { id, mask } => ctx.cl.set_mask(ctx.txn, *id, *mask).map(Done::User),
        Op::Write {
            handle,
            slices,
            end,
            inline,
        } => data::write(ctx, *handle, slices, *end, inline),
        Op::Append {
            handle,
            id,
            size,
            inline,
        } => data::append(ctx, *handle, *id, *size, inline.as_deref()),
        Op::Compact {
            handle,
            chunk,
            read,
            kept,
            slice,
            inline,
        } => data::compact(
            ctx,
            *handle,
            *chunk,
            read,
            kept,
            slice.as_ref(),
            inline.as_deref(),
        ),
        Op::AllocSlices { count } => data::alloc_slices(ctx, *count),
        Op::Grant { client, count } => grants::grant(ctx, *client, *count),
        Op::GcDone { entries } => data::gc_done(ctx, entries),
        Op::Collected { ids, on } => data::collected(ctx, ids, *on),
        Op::ReleaseOrphan {
            handle,
            any_session,
        } => orphans::release(ctx, *handle, *any_session),
        Op::ClaimOrphans { handles } => orphans::claim(ctx, handles),
        Op::TrashRestore { handle } => trash::restore(ctx, *handle),
        Op::Clone { src, parent, name } => clone::node(ctx, *src, *parent, name),
        Op::CloneEntries {
            src,
            dst,
            after,
            max,
        } => clone::entries(ctx, *src, *dst, after, *max as usize),
        Op::TrashPurge { handle, removed_at } => trash::purge(ctx, *handle, *removed_at),
        Op::ClGc => {
            let now = ctx.now;
            ctx.cl.gc_idle(ctx.txn, now).map(|_| Done::Nothing)
        }
        Op::ForgetRequests { keys } => crate::requests::forget(ctx, keys),
        Op::ForgetGrants {
            keys,
            before_ns,
            unknown_ns,
        } => grants::forget(ctx, keys, *before_ns, *unknown_ns),
    }
}
