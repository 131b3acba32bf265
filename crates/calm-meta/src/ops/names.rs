//! Names: creating a node (file, directory, symlink, device, fifo, socket), a hard link, and
//! removing a name (unlink, rmdir).

use calm_store::WriteTxn;

use calm_changelog::{RecordType, flags as cl_flags};

use super::remove::{drop_link, removed};
use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::Inode;
use crate::outcome::{Done, Outcome};
use crate::types::*;

pub(crate) fn make_record_type(kind: Kind) -> RecordType {
    match kind {
        Kind::File => RecordType::Create,
        Kind::Dir => RecordType::Mkdir,
        Kind::Symlink => RecordType::Softlink,
        _ => RecordType::Mknod,
    }
}

pub(crate) fn make<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    parent: Handle,
    name: &[u8],
    node: &NewNode,
    exclusive: bool,
) -> Outcome<Done> {
    if is_dot(name) {
        return Err(MetaError::Exists.into());
    }
    check_name(name)?;
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_lookup(&ctx.caller, &dir.owner())?;
    if let Some(existing) = get_dentry(ctx.txn, &ctx.names, parent, name)? {
        return open_existing(ctx, existing.child, node, exclusive);
    }
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    crate::perm::may_make(&ctx.caller, node.kind)?;
    let (uid, gid, mode, before_umask) = new_owner(ctx, &dir, node);
    let acls = super::acls::for_new_node(ctx, &dir, node.kind, mode, before_umask)?;
    check_node(node, &dir)?;
    // A handle granted in advance: the next of its grant, naming no node yet.
    let granted = match node.granted {
        Some(granted) => Some((granted.handle, super::grants::check(ctx, granted)?)),
        None => None,
    };
    // The last check: the quotas it counts in (it changes nothing when it refuses).
    let usage = crate::quota::usage_of(node.kind, 0);
    ctx.charge_make((uid, gid), parent, usage, node.share)?;

    // Checks done; writes from here on.
    let handle = match granted {
        Some((handle, grant)) => {
            super::grants::take(ctx, grant)?;
            handle
        }
        None => ctx.alloc.allocate(ctx.txn)?,
    };
    let mut inode = new_inode(ctx, node, handle, parent, (uid, gid, acls.mode));
    acls.write(ctx, &mut inode)?;
    let is_dir = node.kind == Kind::Dir;
    add_entry(ctx.txn, &ctx.names, &mut dir, name, handle, node.kind)?;
    if is_dir {
        dir.nlink += 1;
    }
    touch(&mut dir, ctx.now);
    ctx.store(dir);
    let attr = inode.attr();
    let kind = make_record_type(node.kind);
    ctx.record(kind, 0, handle, inode.generation, parent, name, None)?;
    ctx.store(inode);
    ctx.inode_delta += 1;
    ctx.born.push(handle);
    // A directory made to be held: room for its holder's makes in it, where quotas limit them.
    if is_dir && node.share == calm_types::Share::Ask {
        ctx.set_aside_share(handle, (uid, gid))?;
    }
    Ok(Done::Attr(attr))
}

/// A make of a name already there: refused, but for open(O_CREAT) without O_EXCL of a name
/// that is not a directory, which opens what is there.
fn open_existing<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    existing: Handle,
    node: &NewNode,
    exclusive: bool,
) -> Outcome<Done> {
    if exclusive || node.kind != Kind::File {
        return Err(MetaError::Exists.into());
    }
    let inode = ctx.load(existing)?;
    if inode.kind == Kind::Dir {
        return Err(MetaError::IsDir.into());
    }
    Ok(Done::Attr(inode.attr()))
}

/// The new node's owner and mode as the directory and the caller decide them, and under a
/// default ACL the mode as asked for (it stands in for the umask), with the same owner rules.
fn new_owner<T: WriteTxn>(
    ctx: &Ctx<'_, T>,
    dir: &Inode,
    node: &NewNode,
) -> (u32, u32, u32, Option<u32>) {
    let owner = dir.owner();
    let (uid, gid, mode) = crate::perm::new_owner(
        &ctx.caller,
        &owner,
        node.kind,
        node.uid,
        node.gid,
        node.mode & MODE_PERMISSION_MASK,
    );
    let before_umask = node.mode_before_umask.map(|asked| {
        let asked = asked & MODE_PERMISSION_MASK;
        crate::perm::new_owner(&ctx.caller, &owner, node.kind, node.uid, node.gid, asked).2
    });
    (uid, gid, mode, before_umask)
}

/// What a node of its kind may be: a symlink's target within its limits, a directory where
/// its parent has room for one more link.
fn check_node(node: &NewNode, dir: &Inode) -> Result<(), MetaError> {
    match node.kind {
        Kind::Symlink => {
            if node.target.is_empty() {
                return Err(MetaError::NotFound);
            }
            if node.target.len() > SYMLINK_LEN_MAX {
                return Err(MetaError::NameTooLong);
            }
            if node.target.contains(&0) {
                return Err(MetaError::Invalid(
                    "a symlink target may not contain NUL".into(),
                ));
            }
        }
        Kind::Dir if dir.nlink >= LINK_COUNT_MAX => return Err(MetaError::TooManyLinks),
        _ => {}
    }
    Ok(())
}

/// The inode of a node made now in `parent`, owned and moded as decided.
fn new_inode<T: WriteTxn>(
    ctx: &Ctx<'_, T>,
    node: &NewNode,
    handle: Handle,
    parent: Handle,
    (uid, gid, mode): (u32, u32, u32),
) -> Inode {
    let is_symlink = node.kind == Kind::Symlink;
    let is_device = matches!(node.kind, Kind::CharDevice | Kind::BlockDevice);
    Inode {
        handle,
        kind: node.kind,
        mode,
        uid,
        gid,
        nlink: if node.kind == Kind::Dir { 2 } else { 1 },
        generation: ctx.generation,
        size: if is_symlink {
            node.target.len() as u64
        } else {
            0
        },
        rdev: if is_device { node.rdev } else { 0 },
        atime_ns: ctx.now,
        mtime_ns: ctx.now,
        ctime_ns: ctx.now,
        // Every node records the directory of its (first) name: `crate::links`.
        parent,
        entries: 0,
        target: if is_symlink {
            node.target.clone()
        } else {
            Vec::new()
        },
        acls: 0,
        access_acl: None,
    }
}

pub(crate) fn link<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    parent: Handle,
    name: &[u8],
) -> Outcome<Done> {
    if is_dot(name) {
        return Err(MetaError::Exists.into());
    }
    check_name(name)?;
    let mut inode = ctx.load(handle)?;
    if inode.kind == Kind::Dir {
        return Err(MetaError::NotPermitted("hard link to a directory".into()).into());
    }
    if inode.nlink == 0 {
        // An orphan (open, without a name) gets no new name, as on Linux.
        return Err(MetaError::NotFound.into());
    }
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_lookup(&ctx.caller, &dir.owner())?;
    if get_dentry(ctx.txn, &ctx.names, parent, name)?.is_some() {
        return Err(MetaError::Exists.into());
    }
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    crate::perm::may_link(&ctx.caller, &inode.owner())?;
    if inode.nlink >= LINK_COUNT_MAX {
        return Err(MetaError::TooManyLinks.into());
    }
    if ctx.chain(inode.parent)? != ctx.chain(parent)? {
        return Err(MetaError::CrossDevice(
            "a file's names are all in the trees of the same quotas".into(),
        )
        .into());
    }

    add_entry(ctx.txn, &ctx.names, &mut dir, name, handle, inode.kind)?;
    touch(&mut dir, ctx.now);
    ctx.store(dir);
    inode.nlink += 1;
    crate::links::added(ctx.txn, &mut inode, parent)?;
    inode.ctime_ns = ctx.now;
    let attr = inode.attr();
    let generation = inode.generation;
    ctx.store(inode);
    ctx.record(
        RecordType::Hardlink,
        0,
        handle,
        generation,
        parent,
        name,
        None,
    )?;
    Ok(Done::Attr(attr))
}

pub(crate) fn unlink<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    parent: Handle,
    name: &[u8],
    keep: &[Handle],
) -> Outcome<Done> {
    if is_dot(name) {
        return Err(MetaError::IsDir.into());
    }
    check_name(name)?;
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_lookup(&ctx.caller, &dir.owner())?;
    let dentry = get_dentry(ctx.txn, &ctx.names, parent, name)?.ok_or(MetaError::NotFound)?;
    if dentry.kind == Kind::Dir {
        return Err(MetaError::IsDir.into());
    }
    let inode = ctx.load(dentry.child)?;
    crate::perm::may_delete(&ctx.caller, &dir.owner(), &inode.owner())?;

    remove_entry(ctx.txn, &ctx.names, &mut dir, name)?;
    touch(&mut dir, ctx.now);
    ctx.store(dir);
    let flags = if inode.nlink == 1 {
        cl_flags::LAST_LINK
    } else {
        0
    };
    let (target, generation) = (inode.handle, inode.generation);
    let orphan = drop_link(ctx, inode, parent, name, keep)?;
    ctx.record(
        RecordType::Unlink,
        flags,
        target,
        generation,
        parent,
        name,
        None,
    )?;
    Ok(orphan.map_or(Done::Nothing, Done::Orphaned))
}

pub(crate) fn rmdir<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    parent: Handle,
    name: &[u8],
) -> Outcome<Done> {
    match name {
        b"." => return Err(MetaError::Invalid("rmdir of '.'".into()).into()),
        b".." => return Err(MetaError::NotEmpty.into()),
        _ => check_name(name)?,
    }
    let mut dir = ctx.load_dir(parent)?;
    crate::perm::may_lookup(&ctx.caller, &dir.owner())?;
    let dentry = get_dentry(ctx.txn, &ctx.names, parent, name)?.ok_or(MetaError::NotFound)?;
    if dentry.kind != Kind::Dir {
        return Err(MetaError::NotDir.into());
    }
    let child = ctx.load(dentry.child)?;
    crate::perm::may_delete(&ctx.caller, &dir.owner(), &child.owner())?;
    if child.entries > 0 {
        return Err(MetaError::NotEmpty.into());
    }

    remove_entry(ctx.txn, &ctx.names, &mut dir, name)?;
    dir.nlink -= 1;
    touch(&mut dir, ctx.now);
    ctx.store(dir);
    let (target, generation) = (child.handle, child.generation);
    removed(ctx, child, parent, name)?;
    let flags = cl_flags::LAST_LINK;
    ctx.record(
        RecordType::Rmdir,
        flags,
        target,
        generation,
        parent,
        name,
        None,
    )?;
    Ok(Done::Nothing)
}
