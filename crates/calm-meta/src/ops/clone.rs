//! Clones: a copy of a file, or of a directory's entries, made of metadata alone. A cloned
//! file gets an inode of its own with the source's slice records: the objects they name are
//! now named once more each (their `R` count), so the copies share every byte already written
//! and a later write to either (new objects, always) never changes the other; an object is
//! deleted when the last record naming it goes. Inline slices, which belong to one record, are
//! copied under new ids.
//!
//! A tree is cloned one request per directory ([`entries`]: up to a limit of entries each,
//! the store's transaction size): the top is made by [`node`] (a directory empty), then each
//! directory's entries are cloned into its copy, subdirectories as empty copies the caller goes
//! on with. Each request is whole or nothing; a clone cut short leaves the directories done so
//! far.
//!
//! Who may, as `cp -r` would: the caller reads the source (directories read and searched) and
//! writes the destination's directory; devices are the superuser's. The owner: the superuser
//! keeps each node's (as `cp -a` does), anyone else owns the copies (as `cp -r` gives them,
//! setuid and setgid taken off files, and file capabilities, as a write takes them). Modes,
//! times, xattrs and ACLs are kept; hard links inside
//! a cloned tree become separate files.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use calm_store::WriteTxn;

use super::names::make_record_type;
use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::{
    Dentry, Inode, KEY_SLICE_NEXT, chunk_key, entries_range, entry_key_parts, inline_key, ref_key,
    xattr_key,
};
use crate::outcome::{Done, Outcome};
use crate::perm::{MAY_EXEC, MAY_READ, S_ISGID, S_ISUID};
use crate::quota::QuotaUsage;
use crate::slices::{HOLE, INLINE, encode_chunk, is_inline};
use crate::types::*;

/// Entries one request clones at most on a local store.
pub const CLONE_ENTRIES_MAX: usize = 4096;
/// Entries one request clones at most on a shared store (a transaction of etcd holds 128
/// operations by default; a file takes four or more).
pub const CLONE_ENTRIES_SHARED_MAX: usize = 8;

/// What the caller's copy of `node` is owned by, and its mode.
fn owner_of_copy(caller: &crate::Caller, node: &Inode) -> (u32, u32, u32) {
    if caller.is_root() || (caller.uid == node.uid && caller.gid == node.gid) {
        return (node.uid, node.gid, node.mode);
    }
    let mode = if node.kind == Kind::Dir {
        node.mode & !S_ISUID
    } else {
        node.mode & !(S_ISUID | S_ISGID)
    };
    (caller.uid, caller.gid, mode)
}

/// The checks a node's copy needs: it is live, the caller may read it and make its kind.
fn may_copy<T: WriteTxn>(ctx: &Ctx<'_, T>, node: &Inode) -> Outcome<()> {
    if node.nlink == 0 {
        // In the trash, or open without a name.
        return Err(MetaError::NotFound.into());
    }
    let mask = match node.kind {
        Kind::Dir => MAY_READ | MAY_EXEC,
        Kind::File => MAY_READ,
        _ => 0,
    };
    if mask != 0 {
        crate::perm::permission(&ctx.caller, &node.owner(), mask)?;
    }
    crate::perm::may_make(&ctx.caller, node.kind)?;
    Ok(())
}

/// Clones node `src` as `name` in directory `parent`: a file, symlink or other node whole, a
/// directory empty (its entries are [`entries`]'s).
pub(crate) fn node<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    src: Handle,
    parent: Handle,
    name: &[u8],
) -> Outcome<Done> {
    if is_dot(name) {
        return Err(MetaError::Exists.into());
    }
    check_name(name)?;
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_lookup(&ctx.caller, &dir.owner())?;
    if get_dentry(ctx.txn, &ctx.names, parent, name)?.is_some() {
        return Err(MetaError::Exists.into());
    }
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    let node = ctx.load(src)?;
    may_copy(ctx, &node)?;
    if node.kind == Kind::Dir && super::rename::is_ancestor(ctx, src, parent)? {
        // Its copy would be among its own entries, cloned again and again without end.
        return Err(MetaError::Invalid("a directory cannot be cloned into itself".into()).into());
    }
    if node.kind == Kind::Dir && dir.nlink >= LINK_COUNT_MAX {
        return Err(MetaError::TooManyLinks.into());
    }
    let kind = make_record_type(node.kind);
    ctx.cl
        .make_room(ctx.txn, kind, ctx.now, &ctx.caller.clone())?;
    let (uid, gid, _) = owner_of_copy(&ctx.caller, &node);
    let usage = usage_of(ctx, &node)?;
    ctx.charge(uid, gid, parent, usage)?;

    // Checks done; writes from here on.
    let copy = copy(ctx, &node, &mut dir, name)?;
    ctx.store(dir);
    Ok(Done::Attr(copy.attr()))
}

/// What the copy of `node` counts in the quotas: itself, a file's bytes, the xattrs it gets.
fn usage_of<T: WriteTxn>(ctx: &Ctx<'_, T>, node: &Inode) -> Outcome<QuotaUsage> {
    let mut usage = crate::quota::usage_of(
        node.kind,
        if node.kind == Kind::File {
            node.size
        } else {
            0
        },
    );
    for (name, value) in copied_xattrs(ctx, node)? {
        usage.bytes += xattr_charge(&name, value.len()) as i64;
    }
    Ok(usage)
}

/// The xattrs `node`'s copy gets: all of them, but file capabilities on a user's copy (a
/// write takes them away; only the superuser's copy is as `cp -a` keeps it).
fn copied_xattrs<T: WriteTxn>(ctx: &Ctx<'_, T>, node: &Inode) -> Outcome<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in xattr_names(ctx.txn, node.handle)? {
        if name == CAPABILITY_XATTR && !ctx.caller.is_root() {
            continue;
        }
        if let Some(value) = ctx.txn.get(&xattr_key(node.handle, &name))? {
            out.push((name, value.into_owned()));
        }
    }
    Ok(out)
}

/// Clones up to `max` entries of directory `src` after its name key `after` (empty: from the
/// first) into directory `dst`. Answers the subdirectories made (source, copy), to be cloned
/// in turn, and where to go on (`None`: every entry is done).
pub(crate) fn entries<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    src: Handle,
    dst: Handle,
    after: &[u8],
    max: usize,
) -> Outcome<Done> {
    let max = max.clamp(1, CLONE_ENTRIES_MAX);
    let source = ctx.load_dir(src)?;
    if super::rename::is_ancestor(ctx, src, dst)? {
        return Err(MetaError::Invalid("a directory cannot be cloned into itself".into()).into());
    }
    crate::perm::permission(&ctx.caller, &source.owner(), MAY_READ | MAY_EXEC)?;
    let mut dir = ctx.load_dir(dst)?;
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    let (found, more) = page_of_entries(ctx, src, after, max)?;
    // Every check first: the names are free, each node may be copied, the quotas hold them.
    let nodes = checked_nodes(ctx, &dir, dst, &found)?;

    // Checks done; writes from here on.
    let mut dirs = Vec::new();
    for ((_, name, _), node) in found.iter().zip(&nodes) {
        if ctx.caller.is_root() {
            let usage = usage_of(ctx, node)?;
            ctx.charge_owners(node.uid, node.gid, usage)?;
        }
        let copy = copy(ctx, node, &mut dir, name)?;
        if node.kind == Kind::Dir {
            dirs.push((node.handle, copy.handle));
        }
    }
    ctx.store(dir);
    let next = more
        .then(|| found.last().map(|(key, _, _)| key.clone()))
        .flatten();
    Ok(Done::Cloned {
        dirs,
        next,
        entries: found.len() as u64,
    })
}

/// An entry of a directory: its name key, its name, what it names.
type Entry = (Vec<u8>, Vec<u8>, Dentry);

/// Up to `max` entries of directory `src` after its name key `after` (empty: from the
/// first), and whether more follow.
fn page_of_entries<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    src: Handle,
    after: &[u8],
    max: usize,
) -> Outcome<(Vec<Entry>, bool)> {
    let (start, end) = entries_range(src);
    if !after.is_empty() && (after < &start[..] || after >= &end[..]) {
        return Err(MetaError::Invalid("where to go on is not a name of the source".into()).into());
    }
    let mut found: Vec<Entry> = Vec::new();
    let mut bad = None;
    let mut more = false;
    let from: Vec<u8> = if after.is_empty() {
        start.to_vec()
    } else {
        let mut next = after.to_vec();
        next.push(0);
        next
    };
    ctx.txn.visit(&from, &end, &mut |key, value| {
        if found.len() == max {
            more = true;
            return ControlFlow::Break(());
        }
        match (entry_key_parts(key), Dentry::decode(value)) {
            (Some((_, _, name)), Ok(dentry)) => {
                found.push((key.to_vec(), name.to_vec(), dentry));
                ControlFlow::Continue(())
            }
            (_, Err(e)) => {
                bad = Some(e);
                ControlFlow::Break(())
            }
            (None, _) => {
                bad = Some(MetaError::Corrupt(format!("name key {key:?}")));
                ControlFlow::Break(())
            }
        }
    })?;
    match bad {
        Some(e) => Err(e.into()),
        None => Ok((found, more)),
    }
}

/// The nodes the entries name, once each may be copied into `dir` (`dst`): its names free,
/// its links within the limit, room in the changelog, the quotas charged.
fn checked_nodes<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    dir: &Inode,
    dst: Handle,
    found: &[Entry],
) -> Outcome<Vec<Inode>> {
    let mut nodes = Vec::with_capacity(found.len());
    let mut total = QuotaUsage::default();
    let mut subdirs = 0u32;
    for (_, name, dentry) in found {
        if get_dentry(ctx.txn, &ctx.names, dst, name)?.is_some() {
            return Err(MetaError::Exists.into());
        }
        let node = ctx.load(dentry.child)?;
        may_copy(ctx, &node)?;
        total = total.plus(usage_of(ctx, &node)?);
        subdirs += u32::from(node.kind == Kind::Dir);
        nodes.push(node);
    }
    if dir.nlink.saturating_add(subdirs) > LINK_COUNT_MAX {
        return Err(MetaError::TooManyLinks.into());
    }
    for kind in [Kind::File, Kind::Dir, Kind::Symlink, Kind::Fifo] {
        if nodes
            .iter()
            .any(|n| make_record_type(n.kind) == make_record_type(kind))
        {
            ctx.cl.make_room(
                ctx.txn,
                make_record_type(kind),
                ctx.now,
                &ctx.caller.clone(),
            )?;
        }
    }
    if ctx.caller.is_root() {
        // Owners are not held to their limits for the superuser; the trees are, at once.
        ctx.charge_trees(dst, total)?;
    } else {
        let (uid, gid) = (ctx.caller.uid, ctx.caller.gid);
        ctx.charge(uid, gid, dst, total)?;
    }
    Ok(nodes)
}

/// Writes the copy of `node` as `name` in `dir` (checked, charged): a new inode, its xattrs,
/// its slice records with the objects they name counted once more, its name, its record.
fn copy<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    node: &Inode,
    dir: &mut Inode,
    name: &[u8],
) -> Outcome<Inode> {
    let handle = ctx.alloc.allocate(ctx.txn)?;
    let (uid, gid, mode) = owner_of_copy(&ctx.caller, node);
    let is_dir = node.kind == Kind::Dir;
    let mut copy = node.clone();
    copy.handle = handle;
    copy.generation = ctx.generation;
    copy.uid = uid;
    copy.gid = gid;
    copy.mode = mode;
    copy.nlink = if is_dir { 2 } else { 1 };
    copy.parent = dir.handle;
    copy.entries = 0;
    copy.ctime_ns = ctx.now;
    for (name, value) in copied_xattrs(ctx, node)? {
        ctx.txn.put(&xattr_key(handle, &name), &value)?;
    }
    if node.kind == Kind::File {
        copy_records(ctx, node.handle, handle)?;
        ctx.file_bytes_delta += node.size as i64;
    }
    add_entry(ctx.txn, &ctx.names, dir, name, handle, node.kind)?;
    if is_dir {
        dir.nlink += 1;
    }
    touch(dir, ctx.now);
    let kind = make_record_type(node.kind);
    ctx.record(kind, 0, handle, copy.generation, dir.handle, name, None)?;
    ctx.inode_delta += 1;
    ctx.store(copy.clone());
    Ok(copy)
}

/// Copies `src`'s slice records to `dst`: each object named once more, inline bytes under new
/// ids.
fn copy_records<T: WriteTxn>(ctx: &mut Ctx<'_, T>, src: Handle, dst: Handle) -> Outcome<()> {
    let chunks = super::data::chunks_from(ctx.txn, src, 0)?;
    let mut named: BTreeMap<u64, i64> = BTreeMap::new();
    for (chunk, mut slices) in chunks {
        for slice in &mut slices {
            if slice.id == HOLE {
                continue;
            }
            if is_inline(slice.id) {
                let bytes = ctx
                    .txn
                    .get(&inline_key(slice.id))?
                    .ok_or_else(|| {
                        MetaError::Corrupt(format!("inline slice {:#x} has no bytes", slice.id))
                    })?
                    .into_owned();
                let next = super::data::slice_next(ctx.txn)?;
                ctx.txn.put(KEY_SLICE_NEXT, &(next + 1).to_le_bytes())?;
                slice.id = next | INLINE;
                ctx.txn.put(&inline_key(slice.id), &bytes)?;
            } else {
                *named.entry(slice.id).or_default() += 1;
            }
        }
        ctx.txn
            .put(&chunk_key(dst, chunk), &encode_chunk(&slices))?;
    }
    for (id, more) in named {
        // No count kept: one record named it.
        let had = ctx.txn.get(&ref_key(id))?.is_some();
        ctx.txn
            .add(&ref_key(id), if had { more } else { 1 + more })?;
    }
    Ok(())
}
