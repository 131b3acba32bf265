//! Rename: the one mutation that touches two directories, with RENAME_NOREPLACE and
//! RENAME_EXCHANGE, the loop check of a directory moved under itself, and a replaced target
//! dropped (or kept as an orphan).

use std::collections::BTreeMap;

use calm_store::WriteTxn;

use calm_changelog::record::RenameRef;
use calm_changelog::{RecordType, flags as cl_flags};

use super::remove::{drop_link, removed};
use crate::ctx::*;
use crate::error::MetaError;
use crate::layout::Inode;
use crate::outcome::{Done, Outcome};
use crate::types::*;

/// Whether `ancestor` is `start` or lies on the path from `start` up to the root.
pub(crate) fn is_ancestor<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    ancestor: Handle,
    start: Handle,
) -> Outcome<bool> {
    let mut at = start;
    // A chain longer than every handle ever allocated is a cycle: corruption.
    for _ in 0..u32::MAX {
        if at == ancestor {
            return Ok(true);
        }
        if at == ROOT {
            return Ok(false);
        }
        at = ctx.load(at)?.parent;
    }
    Err(MetaError::Corrupt(format!(
        "directory parent chain from {start} does not reach the root"
    ))
    .into())
}

/// Inodes loaded once and changed in place during one rename, where the same inode can play
/// several roles (source and destination parent are often the same directory).
struct Staged {
    inodes: BTreeMap<Handle, Inode>,
}

impl Staged {
    fn new() -> Self {
        Self {
            inodes: BTreeMap::new(),
        }
    }

    fn load<T: WriteTxn>(&mut self, ctx: &mut Ctx<'_, T>, handle: Handle) -> Outcome<&mut Inode> {
        match self.inodes.entry(handle) {
            std::collections::btree_map::Entry::Occupied(entry) => Ok(entry.into_mut()),
            std::collections::btree_map::Entry::Vacant(entry) => {
                Ok(entry.insert(ctx.load(handle)?))
            }
        }
    }

    fn get(&mut self, handle: Handle) -> &mut Inode {
        self.inodes.get_mut(&handle).expect("staged before use")
    }

    fn flush<T: WriteTxn>(self, ctx: &mut Ctx<'_, T>) {
        for inode in self.inodes.into_values() {
            ctx.store(inode);
        }
    }
}

/// The change of `nlink` a rename causes in `dir`, to check against the limit beforehand.
pub(crate) fn nlink_after(nlink: u32, delta: i64) -> Result<u32, MetaError> {
    let after = nlink as i64 + delta;
    if after > LINK_COUNT_MAX as i64 {
        return Err(MetaError::TooManyLinks);
    }
    Ok(after as u32)
}

pub(crate) fn rename<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    sp: Handle,
    sname: &[u8],
    dp: Handle,
    dname: &[u8],
    flags: u32,
    keep: &[Handle],
) -> Outcome<Done> {
    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 {
        return Err(MetaError::Invalid(format!("unsupported rename flags {flags:#x}")).into());
    }
    let exchange = flags & RENAME_EXCHANGE != 0;
    if exchange && flags & RENAME_NOREPLACE != 0 {
        return Err(
            MetaError::Invalid("RENAME_NOREPLACE and RENAME_EXCHANGE together".into()).into(),
        );
    }
    for name in [sname, dname] {
        if is_dot(name) {
            return Err(MetaError::Busy("rename of '.' or '..'".into()).into());
        }
        check_name(name)?;
    }
    let mut staged = Staged::new();
    for dir in [sp, dp] {
        let inode = staged.load(ctx, dir)?;
        let (dir, in_trash) = (inode.owner(), inode.nlink == 0);
        if dir.kind != Kind::Dir {
            return Err(MetaError::NotDir.into());
        }
        if in_trash {
            // In the trash: nothing moves into or out of it.
            return Err(MetaError::NotFound.into());
        }
        crate::perm::may_lookup(&ctx.caller, &dir)?;
    }
    let src = get_dentry(ctx.txn, &ctx.names, sp, sname)?.ok_or(MetaError::NotFound)?;
    let dst = get_dentry(ctx.txn, &ctx.names, dp, dname)?;
    if exchange && dst.is_none() {
        return Err(MetaError::NotFound.into());
    }
    // Who may: the source's name goes (sticky rules), the destination's name is made or
    // replaced (sticky rules again), and a directory that changes parent rewrites its "..".
    let sp_owner = staged.get(sp).owner();
    let dp_owner = staged.get(dp).owner();
    let src_owner = staged.load(ctx, src.child)?.owner();
    crate::perm::may_delete(&ctx.caller, &sp_owner, &src_owner)?;
    match &dst {
        Some(dst) => {
            let dst_owner = staged.load(ctx, dst.child)?.owner();
            crate::perm::may_delete(&ctx.caller, &dp_owner, &dst_owner)?;
            if exchange && dst.kind == Kind::Dir && sp != dp {
                crate::perm::permission(&ctx.caller, &dst_owner, crate::perm::MAY_WRITE)?;
            }
        }
        None => crate::perm::may_change_dir(&ctx.caller, &dp_owner)?,
    }
    if src.kind == Kind::Dir && sp != dp {
        crate::perm::permission(&ctx.caller, &src_owner, crate::perm::MAY_WRITE)?;
    }
    if sp == dp && sname == dname {
        return Ok(Done::Nothing);
    }
    if let Some(dst) = &dst {
        if dst.child == src.child {
            // Two links to the same inode: POSIX says do nothing and succeed.
            return Ok(Done::Nothing);
        }
        if flags & RENAME_NOREPLACE != 0 {
            return Err(MetaError::Exists.into());
        }
    }
    let src_is_dir = src.kind == Kind::Dir;
    let dst_is_dir = dst.is_some_and(|d| d.kind == Kind::Dir);
    if let (Some(dst), false) = (&dst, exchange) {
        if src_is_dir && !dst_is_dir {
            return Err(MetaError::NotDir.into());
        }
        if !src_is_dir && dst_is_dir {
            return Err(MetaError::IsDir.into());
        }
        if dst_is_dir && staged.load(ctx, dst.child)?.entries > 0 {
            return Err(MetaError::NotEmpty.into());
        }
    }
    if src_is_dir && sp != dp && is_ancestor(ctx, src.child, dp)? {
        return Err(MetaError::Invalid("a directory cannot move under itself".into()).into());
    }
    if exchange && dst_is_dir && sp != dp && is_ancestor(ctx, dst.expect("exchange").child, sp)? {
        return Err(MetaError::Invalid("a directory cannot move under itself".into()).into());
    }
    // Subdirectory counts (nlink) of both parents after the move.
    let (mut sp_delta, mut dp_delta) = (0i64, 0i64);
    if src_is_dir && sp != dp {
        sp_delta -= 1;
        dp_delta += 1;
    }
    if dst_is_dir {
        if exchange {
            if sp != dp {
                dp_delta -= 1;
                sp_delta += 1;
            }
        } else {
            dp_delta -= 1; // the replaced directory goes away
        }
    }
    let sp_nlink = nlink_after(staged.get(sp).nlink, sp_delta)?;
    let dp_nlink = if sp == dp {
        nlink_after(staged.get(dp).nlink, sp_delta + dp_delta)?
    } else {
        nlink_after(staged.get(dp).nlink, dp_delta)?
    };
    staged.load(ctx, src.child)?;
    if let Some(dst) = &dst {
        staged.load(ctx, dst.child)?;
    }
    // The last check: the quotas of the trees a name leaves and enters.
    if sp != dp && ctx.chain(sp)? != ctx.chain(dp)? {
        let src_inode = staged.get(src.child).clone();
        if src_is_dir || exchange || src_inode.nlink > 1 {
            return Err(MetaError::CrossDevice(
                "a directory, a file with several names or an exchange moves only between \
                 directories under the same quotas (copy it, as mv does across file systems)"
                    .into(),
            )
            .into());
        }
        let usage = crate::ctx::node_usage(ctx.txn, &src_inode)?;
        ctx.charge_move(sp, dp, usage)?;
    }

    // Checks done; writes from here on.
    let now = ctx.now;
    remove_entry(ctx.txn, &ctx.names, staged.get(sp), sname)?;
    if dst.is_some() {
        remove_entry(ctx.txn, &ctx.names, staged.get(dp), dname)?;
    }
    add_entry(
        ctx.txn,
        &ctx.names,
        staged.get(dp),
        dname,
        src.child,
        src.kind,
    )?;
    if src_is_dir {
        staged.get(src.child).parent = dp;
    } else {
        crate::links::moved(ctx.txn, staged.get(src.child), sp, dp)?;
    }
    staged.get(src.child).ctime_ns = now;
    let source_generation = staged.get(src.child).generation;
    let mut flags = 0;
    let mut rename_from = RenameRef {
        source_parent: sp,
        source_name: sname,
        overwritten: 0,
        overwritten_generation: 0,
    };
    if let Some(dst) = &dst {
        let replaced = staged.get(dst.child);
        rename_from.overwritten = dst.child;
        rename_from.overwritten_generation = replaced.generation;
        if exchange {
            flags |= cl_flags::EXCHANGE;
        } else {
            flags |= cl_flags::OVERWRITE;
            if dst_is_dir || replaced.nlink == 1 {
                flags |= cl_flags::LAST_LINK;
            }
        }
    }
    let mut orphan = None;
    if let Some(dst) = dst {
        if exchange {
            add_entry(
                ctx.txn,
                &ctx.names,
                staged.get(sp),
                sname,
                dst.child,
                dst.kind,
            )?;
            if dst_is_dir {
                staged.get(dst.child).parent = sp;
            } else {
                crate::links::moved(ctx.txn, staged.get(dst.child), dp, sp)?;
            }
            staged.get(dst.child).ctime_ns = now;
        } else {
            let replaced = staged.inodes.remove(&dst.child).expect("staged");
            if dst_is_dir {
                removed(ctx, replaced, dp, dname)?;
            } else {
                keep_last_contents(ctx, &replaced, keep)?;
                orphan = drop_link(ctx, replaced, dp, dname, keep)?;
            }
        }
    }
    if sp == dp {
        staged.get(sp).nlink = dp_nlink;
    } else {
        staged.get(sp).nlink = sp_nlink;
        staged.get(dp).nlink = dp_nlink;
    }
    touch(staged.get(sp), now);
    touch(staged.get(dp), now);
    staged.flush(ctx);
    ctx.record(
        RecordType::Rename,
        flags,
        src.child,
        source_generation,
        dp,
        dname,
        Some(rename_from),
    )?;
    Ok(orphan.map_or(Done::Nothing, Done::Orphaned))
}

/// Keeps what `replaced` holds, a file about to lose its last name to this rename unless it
/// stays as an orphan, for a moment after the commit (`crate::replaced`): only a small file
/// whose bytes are all beside its records (no object the deleter could take).
fn keep_last_contents<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    replaced: &Inode,
    keep: &[Handle],
) -> Outcome<()> {
    if replaced.kind != Kind::File
        || replaced.nlink != 1
        || keep.contains(&replaced.handle)
        || replaced.size > crate::replaced::REPLACED_FILE_BYTES_MAX
    {
        return Ok(());
    }
    let map = crate::file_map::map_of(&*ctx.txn, replaced.attr(), 0, usize::MAX)?;
    let objects = map
        .chunks
        .iter()
        .flat_map(|(_, slices)| slices)
        .any(|slice| slice.id != crate::slices::HOLE && !crate::slices::is_inline(slice.id));
    if !map.more && !objects {
        let owner = replaced.owner();
        ctx.replaced
            .push(crate::replaced::ReplacedFile { map, owner });
    }
    Ok(())
}
