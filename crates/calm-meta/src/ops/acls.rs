//! POSIX ACLs in the namespace: setting and removing them (the `system.posix_acl_access` and
//! `system.posix_acl_default` xattrs), keeping an access ACL in step with chmod, and what a
//! new node takes from its directory's default ACL. The rules themselves are `crate::acl`'s;
//! here they meet the store. An access ACL lives in its inode's record (every permission
//! decision reads the inode anyway, so it costs no read of its own); a default ACL is its
//! directory's `X` key, read only to make a node in it, once per commit group.

use std::sync::Arc;

use calm_changelog::RecordType;
use calm_store::WriteTxn;

use crate::acl::{ACL_ACCESS, ACL_DEFAULT, Acl, DEFAULT_XATTR};
use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::{Inode, xattr_key};
use crate::outcome::{Done, Outcome};
use crate::types::*;

/// Sets (`value` Some) or removes (`None`) the ACL `bit` of `handle`, by acl(5) and Linux's
/// rules: the owner or the superuser only; none on a symlink; a default ACL on a directory
/// only (removing one elsewhere is a no-op). An access ACL sets the mode's permission bits
/// (and takes setgid from a caller outside the file's group); one the mode says all of is
/// not kept. The caller checked the name and the flags' form.
pub(crate) fn set_acl<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    bit: u8,
    value: Option<&[u8]>,
    flags: u32,
) -> Outcome<Done> {
    let mut inode = ctx.load_changeable(handle)?;
    crate::perm::may_set_acl(&ctx.caller, &inode.owner())?;
    // An empty value removes, as setxattr(2) of a zero-length ACL does.
    let acl = match value.filter(|v| !v.is_empty()) {
        Some(bytes) => Some(Acl::decode(bytes)?),
        None => None,
    };
    let name = crate::acl::acl_name(bit);
    if bit == ACL_DEFAULT && inode.kind != Kind::Dir {
        return match acl {
            Some(_) => Err(MetaError::Access("a default ACL on a non-directory".into()).into()),
            None => Ok(Done::Nothing),
        };
    }
    let has = inode.acls & bit != 0;
    if has && flags & XATTR_CREATE != 0 {
        return Err(MetaError::Exists.into());
    }
    if !has && flags & XATTR_REPLACE != 0 {
        return Err(MetaError::NoData.into());
    }
    if !has && acl.is_some() {
        room_for_xattr_name(ctx.txn, &inode, name)?;
    }

    // Checks done; writes from here on.
    match acl {
        Some(acl) if bit == ACL_ACCESS => {
            let mut mode = (inode.mode & !0o777) | acl.mode();
            if !ctx.caller.is_root() && !ctx.caller.in_group(inode.gid) {
                mode &= !crate::perm::S_ISGID;
            }
            inode.mode = mode;
            set_access(&mut inode, (!acl.is_mode_only()).then_some(acl));
        }
        None if bit == ACL_ACCESS => set_access(&mut inode, None),
        acl => set_default(ctx, &mut inode, acl)?,
    }
    inode.ctime_ns = ctx.now;
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(RecordType::Xattr, 0, handle, generation, parent, name, None)?;
    Ok(Done::Nothing)
}

/// Gives `inode` its access ACL (kept in its record), or takes it away.
fn set_access(inode: &mut Inode, acl: Option<Acl>) {
    match acl {
        Some(acl) => {
            inode.access_acl = Some(Arc::new(acl));
            inode.acls |= ACL_ACCESS;
        }
        None => {
            inode.access_acl = None;
            inode.acls &= !ACL_ACCESS;
        }
    }
}

/// Writes (or deletes) directory `inode`'s default ACL, and its flag.
fn set_default<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    inode: &mut Inode,
    acl: Option<Acl>,
) -> Outcome<()> {
    let key = xattr_key(inode.handle, DEFAULT_XATTR);
    let acl = acl.map(Arc::new);
    match &acl {
        Some(acl) => {
            ctx.txn.put(&key, &acl.encode())?;
            inode.acls |= ACL_DEFAULT;
        }
        None => {
            if inode.acls & ACL_DEFAULT != 0 {
                ctx.txn.delete(&key)?;
            }
            inode.acls &= !ACL_DEFAULT;
        }
    }
    ctx.default_acls.insert(inode.handle, acl);
    Ok(())
}

/// A chmod of `inode` to `mode`: its access ACL's owner, mask (or group) and other entries
/// take the new bits, as the mode and the ACL say one thing.
pub(crate) fn chmod(inode: &mut Inode, mode: u32) {
    if let Some(acl) = &inode.access_acl {
        let changed = acl.chmod(mode);
        if changed != **acl {
            inode.access_acl = Some(Arc::new(changed));
        }
    }
}

/// Directory `dir`'s default ACL, read once per group.
fn default_of<T: WriteTxn>(ctx: &mut Ctx<'_, T>, dir: &Inode) -> Outcome<Option<Arc<Acl>>> {
    if dir.acls & ACL_DEFAULT == 0 {
        return Ok(None);
    }
    if let Some(known) = ctx.default_acls.get(&dir.handle) {
        return Ok(known.clone());
    }
    let acl = read_acl(ctx.txn, dir.handle, DEFAULT_XATTR)?.ok_or_else(|| {
        MetaError::Corrupt(format!("directory {} has no default ACL", dir.handle))
    })?;
    let acl = Some(Arc::new(acl));
    ctx.default_acls.insert(dir.handle, acl.clone());
    Ok(acl)
}

/// The permission bits and ACLs of a node made in `dir` with `mode` (the umask applied) or,
/// as asked for, `before_umask`: with a default ACL in `dir`, what it gives with the mode as
/// asked for (the umask does not apply); without one, `mode`. Symlinks take neither.
pub(crate) fn for_new_node<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    dir: &Inode,
    kind: Kind,
    mode: u32,
    before_umask: Option<u32>,
) -> Outcome<NewAcls> {
    if kind == Kind::Symlink {
        return Ok(NewAcls {
            mode,
            ..NewAcls::default()
        });
    }
    Ok(match default_of(ctx, dir)? {
        Some(default) => {
            let asked = before_umask.unwrap_or(mode);
            let (mode, access, default) = default.inherit(asked, kind == Kind::Dir);
            NewAcls {
                mode,
                access,
                default,
            }
        }
        None => NewAcls {
            mode,
            ..NewAcls::default()
        },
    })
}

/// What a new node gets: its mode bits and ACLs.
#[derive(Debug, Default)]
pub(crate) struct NewAcls {
    pub mode: u32,
    pub access: Option<Acl>,
    pub default: Option<Acl>,
}

impl NewAcls {
    /// Gives the new node `inode` (made with `acls` 0) its ACLs.
    pub(crate) fn write<T: WriteTxn>(self, ctx: &mut Ctx<'_, T>, inode: &mut Inode) -> Outcome<()> {
        if self.access.is_some() {
            set_access(inode, self.access);
        }
        if self.default.is_some() {
            set_default(ctx, inode, self.default)?;
        }
        Ok(())
    }
}
