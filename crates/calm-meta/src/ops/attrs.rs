//! Attributes and extended attributes: setattr (mode, owner, size, times) and
//! setxattr/removexattr, with their permission rules and changelog records.

use calm_store::WriteTxn;

use calm_changelog::RecordType;

use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::xattr_key;
use crate::outcome::{Done, Outcome};
use crate::types::*;

/// One record per setattr, named after the weightiest change: a size change is TRUNC, an
/// owner or mode change SATTR, then MTIME and ATIME. (A setattr that changes nothing writes
/// no record; one that names a change time is refused.)
pub(crate) fn setattr_record_type(attr: &SetAttr) -> RecordType {
    if attr.size.is_some() {
        RecordType::Trunc
    } else if attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some() {
        RecordType::Setattr
    } else if attr.mtime.is_some() {
        RecordType::Mtime
    } else {
        RecordType::Atime
    }
}

pub(crate) fn resolve(time: SetTime, now: i64) -> i64 {
    match time {
        SetTime::Now => now,
        SetTime::At(ns) => ns,
    }
}

pub(crate) fn setattr<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    attr: &SetAttr,
) -> Outcome<Done> {
    if attr.ctime.is_some() {
        return Err(MetaError::Invalid(
            "a file's change time is the time of its last change: it cannot be set".into(),
        )
        .into());
    }
    let mut inode = ctx.load_changeable(handle)?;
    if *attr == SetAttr::default() {
        // Nothing to change (as utimensat with both times omitted): the attributes as they
        // are, with no new change time and no record.
        return Ok(Done::Attr(inode.attr()));
    }
    let mode = crate::perm::setattr(&ctx.caller, &inode.owner(), attr)?;
    if let Some(size) = attr.size {
        match inode.kind {
            Kind::Dir => return Err(MetaError::IsDir.into()),
            Kind::File => {}
            _ => return Err(MetaError::Invalid("size of a non-regular file".into()).into()),
        }
        if size > FILE_SIZE_MAX {
            return Err(MetaError::FileTooBig.into());
        }
    }

    // The last checks: the quotas a new owner or size counts in.
    let owner = (attr.uid.unwrap_or(inode.uid), attr.gid.unwrap_or(inode.gid));
    let chowned_too = owner != (inode.uid, inode.gid) && attr.size.is_some();
    // Two charges: the first undone when the second refuses.
    let before = chowned_too.then(|| ctx.quota.clone());
    if let Err(refused) = charge_setattr(ctx, &inode, owner, attr.size) {
        if let Some(before) = before {
            ctx.quota = before;
        }
        return Err(refused);
    }

    // A chown or a truncate of a file drops its file capabilities, as Linux's killpriv does.
    let chowned =
        attr.uid.is_some_and(|u| u != inode.uid) || attr.gid.is_some_and(|g| g != inode.gid);
    let resized = attr.size.is_some_and(|s| s != inode.size);
    if inode.kind == Kind::File && (chowned || resized) {
        kill_capability(ctx, handle)?;
    }
    if attr.mode.is_some() {
        super::acls::chmod(&mut inode, mode);
    }
    inode.mode = mode & MODE_PERMISSION_MASK;
    if let Some(uid) = attr.uid {
        inode.uid = uid;
    }
    if let Some(gid) = attr.gid {
        inode.gid = gid;
    }
    if let Some(size) = attr.size
        && size != inode.size
    {
        if size < inode.size {
            crate::ops::data::truncate_chunks(ctx, handle, size)?;
        }
        ctx.file_bytes_delta += size as i64 - inode.size as i64;
        inode.size = size;
        if attr.mtime.is_none() {
            inode.mtime_ns = ctx.now;
        }
    }
    if let Some(atime) = attr.atime {
        inode.atime_ns = resolve(atime, ctx.now);
    }
    if let Some(mtime) = attr.mtime {
        inode.mtime_ns = resolve(mtime, ctx.now);
    }
    inode.ctime_ns = ctx.now;
    let kind = setattr_record_type(attr);
    let attr = inode.attr();
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(kind, 0, handle, generation, parent, b"", None)?;
    Ok(Done::Attr(attr))
}

/// Moves a file's usage to its new owner, and charges its new size.
fn charge_setattr<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    inode: &crate::layout::Inode,
    owner: (u32, u32),
    size: Option<u64>,
) -> Outcome<()> {
    if owner != (inode.uid, inode.gid) {
        let usage = node_usage(ctx.txn, inode)?;
        ctx.charge_owner_change((inode.uid, inode.gid), owner, usage)?;
    }
    if let Some(size) = size
        && size != inode.size
    {
        let resized = crate::quota::QuotaUsage {
            bytes: size as i64 - inode.size as i64,
            ..Default::default()
        };
        let dir = ctx.tree_dir(inode)?;
        ctx.charge(owner.0, owner.1, dir, resized)?;
    }
    Ok(())
}

/// Charges `bytes` of xattrs to `inode`'s owners and the trees above it (the root is below
/// none).
fn charge_xattr<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    inode: &crate::layout::Inode,
    bytes: i64,
) -> Outcome<()> {
    if bytes == 0 {
        return Ok(());
    }
    let usage = crate::quota::QuotaUsage {
        bytes,
        ..Default::default()
    };
    if inode.handle == crate::ROOT {
        return ctx.charge_owners(inode.uid, inode.gid, usage);
    }
    let dir = ctx.tree_dir(inode)?;
    ctx.charge(inode.uid, inode.gid, dir, usage)
}

pub(crate) fn setxattr<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    name: &[u8],
    value: &[u8],
    flags: u32,
) -> Outcome<Done> {
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
        return Err(MetaError::Invalid(format!("unsupported setxattr flags {flags:#x}")).into());
    }
    if flags == XATTR_CREATE | XATTR_REPLACE {
        return Err(MetaError::Invalid("XATTR_CREATE and XATTR_REPLACE together".into()).into());
    }
    check_xattr_name(name)?;
    if value.len() > XATTR_VALUE_LEN_MAX {
        return Err(MetaError::TooBig.into());
    }
    if let Some(bit) = crate::acl::acl_bit(name) {
        return super::acls::set_acl(ctx, handle, bit, Some(value), flags);
    }
    let mut inode = ctx.load_changeable(handle)?;
    crate::perm::may_set_xattr(&ctx.caller, &inode.owner(), name)?;
    let key = xattr_key(handle, name);
    let old_len = ctx.txn.get(&key)?.map(|v| v.len());
    let exists = old_len.is_some();
    if exists && flags & XATTR_CREATE != 0 {
        return Err(MetaError::Exists.into());
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(MetaError::NoData.into());
    }
    if !exists {
        room_for_xattr_name(ctx.txn, &inode, name)?;
    }
    // Its bytes count in the owner's quotas, and in the inode's own limit.
    let grown = xattr_charge(name, value.len()) as i64
        - old_len.map_or(0, |len| xattr_charge(name, len) as i64);
    if grown > 0 && xattr_bytes(ctx.txn, handle)? + grown as u64 > XATTR_INODE_BYTES_MAX {
        return Err(MetaError::NoSpace(format!(
            "the extended attributes of one file hold at most {XATTR_INODE_BYTES_MAX} bytes"
        ))
        .into());
    }
    charge_xattr(ctx, &inode, grown)?;

    ctx.txn.put(&key, value)?;
    inode.ctime_ns = ctx.now;
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(RecordType::Xattr, 0, handle, generation, parent, name, None)?;
    Ok(Done::Nothing)
}

pub(crate) fn removexattr<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    name: &[u8],
) -> Outcome<Done> {
    check_xattr_name(name)?;
    if let Some(bit) = crate::acl::acl_bit(name) {
        return super::acls::set_acl(ctx, handle, bit, None, 0);
    }
    let mut inode = ctx.load_changeable(handle)?;
    crate::perm::may_set_xattr(&ctx.caller, &inode.owner(), name)?;
    let key = xattr_key(handle, name);
    let Some(old_len) = ctx.txn.get(&key)?.map(|v| v.len()) else {
        return Err(MetaError::NoData.into());
    };
    charge_xattr(ctx, &inode, -(xattr_charge(name, old_len) as i64))?;

    ctx.txn.delete(&key)?;
    inode.ctime_ns = ctx.now;
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(RecordType::Xattr, 0, handle, generation, parent, name, None)?;
    Ok(Done::Nothing)
}
