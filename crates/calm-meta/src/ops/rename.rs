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
use crate::layout::{Dentry, Inode};
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

/// One rename once its names are read: from `sname` in `sp` (the entry `src`) to `dname` in
/// `dp` (the entry `dst`, if a name is there), swapping the two with `exchange`.
struct Move<'a> {
    sp: Handle,
    sname: &'a [u8],
    dp: Handle,
    dname: &'a [u8],
    src: Dentry,
    dst: Option<Dentry>,
    exchange: bool,
}

impl Move<'_> {
    fn src_is_dir(&self) -> bool {
        self.src.kind == Kind::Dir
    }

    fn dst_is_dir(&self) -> bool {
        self.dst.is_some_and(|d| d.kind == Kind::Dir)
    }
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
    let exchange = checked_flags(flags, sname, dname)?;
    let mut staged = Staged::new();
    load_parents(ctx, &mut staged, sp, dp)?;
    let src = get_dentry(ctx.txn, &ctx.names, sp, sname)?.ok_or(MetaError::NotFound)?;
    let dst = get_dentry(ctx.txn, &ctx.names, dp, dname)?;
    if exchange && dst.is_none() {
        return Err(MetaError::NotFound.into());
    }
    let m = Move {
        sp,
        sname,
        dp,
        dname,
        src,
        dst,
        exchange,
    };
    may_rename(ctx, &mut staged, &m)?;
    if sp == dp && sname == dname {
        return Ok(Done::Nothing);
    }
    if let Some(dst) = &m.dst {
        if dst.child == src.child {
            // Two links to the same inode: POSIX says do nothing and succeed.
            return Ok(Done::Nothing);
        }
        if flags & RENAME_NOREPLACE != 0 {
            return Err(MetaError::Exists.into());
        }
    }
    fits(ctx, &mut staged, &m)?;
    let (sp_nlink, dp_nlink) = parent_links(&mut staged, &m)?;
    staged.load(ctx, src.child)?;
    if let Some(dst) = &m.dst {
        staged.load(ctx, dst.child)?;
    }
    // The last check: the quotas of the trees a name leaves and enters.
    charge_quotas(ctx, &mut staged, &m)?;

    // Checks done; writes from here on.
    move_source(ctx, &mut staged, &m)?;
    let source_generation = staged.get(src.child).generation;
    let (record_flags, rename_from) = what_was_replaced(&mut staged, &m);
    let orphan = settle_destination(ctx, &mut staged, &m, keep)?;
    if sp == dp {
        staged.get(sp).nlink = dp_nlink;
    } else {
        staged.get(sp).nlink = sp_nlink;
        staged.get(dp).nlink = dp_nlink;
    }
    let now = ctx.now;
    touch(staged.get(sp), now);
    touch(staged.get(dp), now);
    staged.flush(ctx);
    ctx.record(
        RecordType::Rename,
        record_flags,
        src.child,
        source_generation,
        dp,
        dname,
        Some(rename_from),
    )?;
    Ok(orphan.map_or(Done::Nothing, Done::Orphaned))
}

/// The flags a rename may take and the names it may move: whether it is an exchange.
fn checked_flags(flags: u32, sname: &[u8], dname: &[u8]) -> Result<bool, MetaError> {
    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 {
        return Err(MetaError::Invalid(format!(
            "unsupported rename flags {flags:#x}"
        )));
    }
    let exchange = flags & RENAME_EXCHANGE != 0;
    if exchange && flags & RENAME_NOREPLACE != 0 {
        return Err(MetaError::Invalid(
            "RENAME_NOREPLACE and RENAME_EXCHANGE together".into(),
        ));
    }
    for name in [sname, dname] {
        if is_dot(name) {
            return Err(MetaError::Busy("rename of '.' or '..'".into()));
        }
        check_name(name)?;
    }
    Ok(exchange)
}

/// Both parents: directories, out of the trash, searchable by the caller.
fn load_parents<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    staged: &mut Staged,
    sp: Handle,
    dp: Handle,
) -> Outcome<()> {
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
    Ok(())
}

/// Who may: the source's name goes (sticky rules), the destination's name is made or
/// replaced (sticky rules again), and a directory that changes parent rewrites its "..".
fn may_rename<T: WriteTxn>(ctx: &mut Ctx<'_, T>, staged: &mut Staged, m: &Move) -> Outcome<()> {
    let sp_owner = staged.get(m.sp).owner();
    let dp_owner = staged.get(m.dp).owner();
    let src_owner = staged.load(ctx, m.src.child)?.owner();
    crate::perm::may_delete(&ctx.caller, &sp_owner, &src_owner)?;
    match &m.dst {
        Some(dst) => {
            let dst_owner = staged.load(ctx, dst.child)?.owner();
            crate::perm::may_delete(&ctx.caller, &dp_owner, &dst_owner)?;
            if m.exchange && dst.kind == Kind::Dir && m.sp != m.dp {
                crate::perm::permission(&ctx.caller, &dst_owner, crate::perm::MAY_WRITE)?;
            }
        }
        None => crate::perm::may_change_dir(&ctx.caller, &dp_owner)?,
    }
    if m.src_is_dir() && m.sp != m.dp {
        crate::perm::permission(&ctx.caller, &src_owner, crate::perm::MAY_WRITE)?;
    }
    Ok(())
}

/// What replaces what fits: a directory only an empty directory, a file only a file, and no
/// directory moves under itself.
fn fits<T: WriteTxn>(ctx: &mut Ctx<'_, T>, staged: &mut Staged, m: &Move) -> Outcome<()> {
    let (src_is_dir, dst_is_dir) = (m.src_is_dir(), m.dst_is_dir());
    if let (Some(dst), false) = (&m.dst, m.exchange) {
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
    let under_itself = || MetaError::Invalid("a directory cannot move under itself".into());
    if src_is_dir && m.sp != m.dp && is_ancestor(ctx, m.src.child, m.dp)? {
        return Err(under_itself().into());
    }
    if m.exchange
        && dst_is_dir
        && m.sp != m.dp
        && is_ancestor(ctx, m.dst.expect("exchange").child, m.sp)?
    {
        return Err(under_itself().into());
    }
    Ok(())
}

/// The subdirectory counts (nlink) of both parents after the move, within the limit.
fn parent_links(staged: &mut Staged, m: &Move) -> Result<(u32, u32), MetaError> {
    let (mut sp_delta, mut dp_delta) = (0i64, 0i64);
    if m.src_is_dir() && m.sp != m.dp {
        sp_delta -= 1;
        dp_delta += 1;
    }
    if m.dst_is_dir() {
        if m.exchange {
            if m.sp != m.dp {
                dp_delta -= 1;
                sp_delta += 1;
            }
        } else {
            dp_delta -= 1; // the replaced directory goes away
        }
    }
    let sp_nlink = nlink_after(staged.get(m.sp).nlink, sp_delta)?;
    let dp_nlink = if m.sp == m.dp {
        nlink_after(staged.get(m.dp).nlink, sp_delta + dp_delta)?
    } else {
        nlink_after(staged.get(m.dp).nlink, dp_delta)?
    };
    Ok((sp_nlink, dp_nlink))
}

/// A name that leaves the trees its quotas count for others: only a file of one name moves
/// so, its usage charged to the trees it enters and given back by those it leaves.
fn charge_quotas<T: WriteTxn>(ctx: &mut Ctx<'_, T>, staged: &mut Staged, m: &Move) -> Outcome<()> {
    if m.sp == m.dp || ctx.chain(m.sp)? == ctx.chain(m.dp)? {
        return Ok(());
    }
    let src_inode = staged.get(m.src.child).clone();
    if m.src_is_dir() || m.exchange || src_inode.nlink > 1 {
        return Err(MetaError::CrossDevice(
            "a directory, a file with several names or an exchange moves only between \
             directories under the same quotas (copy it, as mv does across file systems)"
                .into(),
        )
        .into());
    }
    let usage = crate::ctx::node_usage(ctx.txn, &src_inode)?;
    ctx.charge_move(m.sp, m.dp, usage)?;
    Ok(())
}

/// The names change: the source's goes, the destination's is dropped and made again for the
/// source, which learns its new parent.
fn move_source<T: WriteTxn>(ctx: &mut Ctx<'_, T>, staged: &mut Staged, m: &Move) -> Outcome<()> {
    remove_entry(ctx.txn, &ctx.names, staged.get(m.sp), m.sname)?;
    if m.dst.is_some() {
        remove_entry(ctx.txn, &ctx.names, staged.get(m.dp), m.dname)?;
    }
    add_entry(
        ctx.txn,
        &ctx.names,
        staged.get(m.dp),
        m.dname,
        m.src.child,
        m.src.kind,
    )?;
    if m.src_is_dir() {
        staged.get(m.src.child).parent = m.dp;
    } else {
        crate::links::moved(ctx.txn, staged.get(m.src.child), m.sp, m.dp)?;
    }
    staged.get(m.src.child).ctime_ns = ctx.now;
    Ok(())
}

/// The changelog's flags and reference of the rename, read before the destination is settled
/// (a replaced file's last link is told by its count before it drops).
fn what_was_replaced<'a>(staged: &mut Staged, m: &Move<'a>) -> (u16, RenameRef<'a>) {
    let mut flags = 0;
    let mut rename_from = RenameRef {
        source_parent: m.sp,
        source_name: m.sname,
        overwritten: 0,
        overwritten_generation: 0,
    };
    if let Some(dst) = &m.dst {
        let replaced = staged.get(dst.child);
        rename_from.overwritten = dst.child;
        rename_from.overwritten_generation = replaced.generation;
        if m.exchange {
            flags |= cl_flags::EXCHANGE;
        } else {
            flags |= cl_flags::OVERWRITE;
            if m.dst_is_dir() || replaced.nlink == 1 {
                flags |= cl_flags::LAST_LINK;
            }
        }
    }
    (flags, rename_from)
}

/// The destination's inode: moved to the source's name in an exchange, else replaced (a
/// directory removed, a file's link dropped); the file kept as an orphan, if it is.
fn settle_destination<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    staged: &mut Staged,
    m: &Move,
    keep: &[Handle],
) -> Outcome<Option<Handle>> {
    let Some(dst) = m.dst else {
        return Ok(None);
    };
    if m.exchange {
        add_entry(
            ctx.txn,
            &ctx.names,
            staged.get(m.sp),
            m.sname,
            dst.child,
            dst.kind,
        )?;
        if m.dst_is_dir() {
            staged.get(dst.child).parent = m.sp;
        } else {
            crate::links::moved(ctx.txn, staged.get(dst.child), m.dp, m.sp)?;
        }
        staged.get(dst.child).ctime_ns = ctx.now;
        return Ok(None);
    }
    let replaced = staged.inodes.remove(&dst.child).expect("staged");
    if m.dst_is_dir() {
        removed(ctx, replaced, m.dp, m.dname)?;
        return Ok(None);
    }
    keep_last_contents(ctx, &replaced, keep)?;
    drop_link(ctx, replaced, m.dp, m.dname, keep)
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
