//! Namespace mutations as deterministic functions of (transaction state, operation, `now`).
//!
//! The rule that keeps failed operations from leaving partial state: every function does all
//! of its checks (reads only) first, and only then writes. A check that fails returns
//! [`Failure::Meta`] with nothing written, so the other operations of the same group commit go
//! on. A store error ([`Failure::Store`]) can happen mid-write; the committer then drops the
//! whole transaction, so again nothing of it remains.
//!
//! No clock, thread or channel in here: the committer passes `now` and the generation in.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;

use calm_store::{ReadTxn, StoreError, WriteTxn};

use calm_changelog::record::{RecordRef, RenameRef};
use calm_changelog::{Mask, RecordType, User, UserId, flags as cl_flags};

use crate::slices::Slice;

use crate::Caller;
use crate::alloc::HandleAllocator;
use crate::changelog::ClState;
use crate::error::MetaError;
use crate::layout::{
    Dentry, Inode, KEY_FILE_BYTES, KEY_INODES, NameHash, chunk_key, chunk_range, inode_key,
    xattr_key, xattr_range,
};
use crate::types::*;

/// A mutation of the namespace, as the committer receives it.
#[derive(Debug, Clone)]
pub enum Op {
    Make {
        parent: Handle,
        name: Vec<u8>,
        node: NewNode,
        exclusive: bool,
    },
    Link {
        handle: Handle,
        parent: Handle,
        name: Vec<u8>,
    },
    /// Removes a name. A regular file that loses its last name and is one of `keep` (files
    /// the caller's mount has open) is kept as an orphan of the caller's session
    /// (crate::orphans) instead of being destroyed.
    Unlink {
        parent: Handle,
        name: Vec<u8>,
        keep: Vec<Handle>,
    },
    Rmdir {
        parent: Handle,
        name: Vec<u8>,
    },
    Rename {
        parent: Handle,
        name: Vec<u8>,
        new_parent: Handle,
        new_name: Vec<u8>,
        flags: u32,
        /// As for [`Op::Unlink`]: a replaced file the caller has open is kept.
        keep: Vec<Handle>,
    },
    SetAttr {
        handle: Handle,
        attr: SetAttr,
    },
    SetXattr {
        handle: Handle,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    RemoveXattr {
        handle: Handle,
        name: Vec<u8>,
    },
    /// Changelog: register a reader.
    ClRegister {
        name: String,
        mask: Mask,
    },
    ClDeregister {
        id: UserId,
    },
    /// Changelog: `id` has processed every record up to `index` (0: up to the last).
    ClClear {
        id: UserId,
        index: u64,
    },
    ClMask {
        id: UserId,
        mask: Mask,
    },
    /// Changelog: deregister readers idle past the limits, if a GC pass is due.
    ClGc,
    /// Deletes expired request records (`requests::expired` found them).
    ForgetRequests {
        keys: Vec<[u8; 17]>,
    },
    /// File contents: place slice records (written objects, or holes) in a file's chunks and
    /// make the size at least `end` (and at least the end of every record); sets mtime.
    Write {
        handle: Handle,
        slices: Vec<(u64, Slice)>,
        end: u64,
        /// The bytes of the write's inline slices (`crate::slices::INLINE`), by id.
        inline: Vec<(u64, Vec<u8>)>,
    },
    /// File contents: place the whole of object `id` (`size` bytes) at the file's current end;
    /// with `inline`, `id` is an inline slice's and these are its bytes (not supported where
    /// the file's inline bytes may not be: the writer sends an object instead).
    Append {
        handle: Handle,
        id: u64,
        size: u32,
        inline: Option<Vec<u8>>,
    },
    /// File contents: a compaction of a chunk (`crate::compaction`). The records it read,
    /// `read` as stored, must still begin the chunk (else busy: it changed meanwhile); they are
    /// replaced by `kept` (some of them, in order) and `slice`, a new slice holding the
    /// chunk's visible bytes over its range, and records added since stay on top.
    Compact {
        handle: Handle,
        chunk: u64,
        read: Vec<u8>,
        kept: Vec<Slice>,
        slice: Option<Slice>,
        /// The new slice's bytes, when it is inline.
        inline: Option<Vec<u8>>,
    },
    /// Hands out `count` new slice ids.
    AllocSlices {
        count: u64,
    },
    /// The objects of these deletion-queue entries `(queued_ns, id)` are deleted.
    GcDone {
        entries: Vec<(u64, u64)>,
    },
    /// Orphan `handle` is closed: destroy it, if it is the caller's session's (or anyone's,
    /// with `any_session`: its session ended).
    ReleaseOrphan {
        handle: Handle,
        any_session: bool,
    },
    /// The caller's session (a mount's new one, after its old one was lost) takes over these
    /// orphans.
    ClaimOrphans {
        handles: Vec<Handle>,
    },
}

/// What a successful mutation returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Attr(Attr),
    Nothing,
    User(User),
    /// The first of the slice ids handed out.
    Ids(u64),
    /// The file lost its last name and is kept as an orphan of the caller's session.
    Orphaned(Handle),
}

/// Why a mutation failed.
#[derive(Debug)]
pub enum Failure {
    /// The namespace said no; nothing was written.
    Meta(MetaError),
    /// The store failed; the transaction must be dropped.
    Store(StoreError),
}

impl From<MetaError> for Failure {
    fn from(error: MetaError) -> Self {
        Failure::Meta(error)
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Store(error)
    }
}

impl From<Failure> for MetaError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Meta(error) => error,
            Failure::Store(error) => error.into(),
        }
    }
}

pub(crate) type Outcome<T> = Result<T, Failure>;

/// What the mutations of one group commit work with: the transaction, the allocator, the
/// group's `now`, and an overlay of the inodes the group touched. Each inode is read from the
/// store at most once and written at most once per group (a directory receiving a thousand
/// creates in one group is rewritten once), and the counters are summed and written once.
#[allow(missing_debug_implementations)] // holds a transaction, which has nothing to show
pub struct Ctx<'a, T> {
    pub txn: &'a mut T,
    pub alloc: &'a mut HandleAllocator,
    /// The commit's time, in ns since the epoch.
    pub now: i64,
    /// Generation given to inodes created now.
    pub generation: u64,
    /// The changelog's state: readers, indices.
    pub cl: &'a mut ClState,
    /// Who asks for the operation being applied.
    pub caller: Caller,
    /// Where names are kept.
    pub names: NameHash,
    /// Inodes read or changed by this group; `None` = removed.
    inodes: HashMap<Handle, Cached>,
    inode_delta: i64,
    pub(crate) file_bytes_delta: i64,
}

struct Cached {
    inode: Option<Inode>,
    dirty: bool,
}

impl<'a, T: WriteTxn> Ctx<'a, T> {
    pub fn new(
        txn: &'a mut T,
        alloc: &'a mut HandleAllocator,
        cl: &'a mut ClState,
        now: i64,
        generation: u64,
        names: NameHash,
    ) -> Self {
        Self {
            txn,
            alloc,
            now,
            generation,
            cl,
            caller: Caller::default(),
            names,
            inodes: HashMap::new(),
            inode_delta: 0,
            file_bytes_delta: 0,
        }
    }

    /// The inode `handle` as this group sees it.
    pub(crate) fn load(&mut self, handle: Handle) -> Outcome<Inode> {
        if let Some(cached) = self.inodes.get(&handle) {
            return cached
                .inode
                .clone()
                .ok_or_else(|| MetaError::NotFound.into());
        }
        let inode = load(self.txn, handle)?;
        self.inodes.insert(
            handle,
            Cached {
                inode: Some(inode.clone()),
                dirty: false,
            },
        );
        Ok(inode)
    }

    fn load_dir(&mut self, handle: Handle) -> Outcome<Inode> {
        let inode = self.load(handle)?;
        if inode.kind != Kind::Dir {
            return Err(MetaError::NotDir.into());
        }
        Ok(inode)
    }

    /// The attributes of `handle` as the group has them so far, if the group read it.
    pub(crate) fn cached_attr(&self, handle: Handle) -> Option<Attr> {
        self.inodes.get(&handle)?.inode.as_ref().map(Inode::attr)
    }

    pub(crate) fn store(&mut self, inode: Inode) {
        self.inodes.insert(
            inode.handle,
            Cached {
                inode: Some(inode),
                dirty: true,
            },
        );
    }

    /// Appends a changelog record of the operation being applied (if some reader wants its
    /// type), in the group's transaction.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        kind: RecordType,
        flags: u16,
        target: Handle,
        generation: u64,
        parent: Handle,
        name: &[u8],
        rename: Option<RenameRef<'_>>,
    ) -> Outcome<()> {
        let record = RecordRef {
            kind,
            flags,
            time_ns: self.now,
            target,
            generation,
            parent,
            name,
            session: self.caller.session,
            uid: self.caller.uid,
            gid: self.caller.gid,
            rename,
        };
        self.cl.append(self.txn, record)
    }

    /// Writes what the group changed: every dirty inode once, the counters once.
    pub fn flush(self) -> Outcome<()> {
        for (handle, cached) in self.inodes {
            match cached {
                Cached { dirty: false, .. } => {}
                Cached {
                    inode: Some(inode), ..
                } => put_inode(self.txn, &inode)?,
                Cached { inode: None, .. } => {
                    self.txn.delete(&inode_key(handle))?;
                }
            }
        }
        if self.inode_delta != 0 {
            self.txn.add(KEY_INODES, self.inode_delta)?;
        }
        if self.file_bytes_delta != 0 {
            self.txn.add(KEY_FILE_BYTES, self.file_bytes_delta)?;
        }
        Ok(())
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Checks a name for a directory entry (not "." or "..", which each caller treats itself).
pub fn check_name(name: &[u8]) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(MetaError::NotFound);
    }
    if name.len() > NAME_LEN_MAX {
        return Err(MetaError::NameTooLong);
    }
    if name.iter().any(|b| *b == b'/' || *b == 0) {
        return Err(MetaError::Invalid(
            "a name may not contain '/' or NUL".into(),
        ));
    }
    Ok(())
}

fn check_xattr_name(name: &[u8]) -> Result<(), MetaError> {
    if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX || name.contains(&0) {
        return Err(MetaError::Range);
    }
    Ok(())
}

pub fn load<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Inode> {
    match view.get(&inode_key(handle))? {
        Some(bytes) => Ok(Inode::decode(handle, &bytes)?),
        None => Err(MetaError::NotFound.into()),
    }
}

pub fn load_dir<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Inode> {
    let inode = load(view, handle)?;
    if inode.kind != Kind::Dir {
        return Err(MetaError::NotDir.into());
    }
    Ok(inode)
}

pub fn get_dentry<R: ReadTxn + ?Sized>(
    view: &R,
    names: &NameHash,
    parent: Handle,
    name: &[u8],
) -> Outcome<Option<Dentry>> {
    match view.get(&names.entry_key(parent, name))? {
        Some(bytes) => Ok(Some(Dentry::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The names of every xattr of `handle`.
pub fn xattr_names<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Vec<Vec<u8>>> {
    let (start, end) = xattr_range(handle);
    let mut names = Vec::new();
    view.visit(&start, &end, &mut |key, _| {
        names.push(key[9..].to_vec());
        ControlFlow::Continue(())
    })?;
    Ok(names)
}

/// Whether `ancestor` is `start` or lies on the path from `start` up to the root.
fn is_ancestor<T: WriteTxn>(
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

fn put_inode<T: WriteTxn>(txn: &mut T, inode: &Inode) -> Outcome<()> {
    txn.put(&inode_key(inode.handle), &inode.encode())?;
    Ok(())
}

fn add_entry<T: WriteTxn>(
    txn: &mut T,
    names: &NameHash,
    dir: &mut Inode,
    name: &[u8],
    child: Handle,
    kind: Kind,
) -> Outcome<()> {
    dir.entries += 1;
    txn.put(
        &names.entry_key(dir.handle, name),
        &Dentry { child, kind }.encode(),
    )?;
    Ok(())
}

fn remove_entry<T: WriteTxn>(
    txn: &mut T,
    names: &NameHash,
    dir: &mut Inode,
    name: &[u8],
) -> Outcome<()> {
    txn.delete(&names.entry_key(dir.handle, name))?;
    dir.entries -= 1;
    Ok(())
}

fn touch(inode: &mut Inode, now: i64) {
    inode.mtime_ns = now;
    inode.ctime_ns = now;
}

/// Removes an inode and its xattrs.
pub(crate) fn destroy<T: WriteTxn>(ctx: &mut Ctx<'_, T>, inode: &Inode) -> Outcome<()> {
    for name in xattr_names(ctx.txn, inode.handle)? {
        ctx.txn.delete(&xattr_key(inode.handle, &name))?;
    }
    ctx.inodes.insert(
        inode.handle,
        Cached {
            inode: None,
            dirty: true,
        },
    );
    ctx.inode_delta -= 1;
    if inode.kind == Kind::File {
        ctx.file_bytes_delta -= inode.size as i64;
        crate::data_ops::truncate_chunks(ctx, inode.handle, 0)?;
    }
    Ok(())
}

/// Drops one link of a non-directory, its name in `dir`; destroys it when none is left, unless
/// it is a file the caller's mount has open (one of `keep`): then it is kept as an orphan of
/// the caller's session, and its handle returned.
fn drop_link<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: Inode,
    dir: Handle,
    keep: &[Handle],
) -> Outcome<Option<Handle>> {
    debug_assert!(inode.kind != Kind::Dir);
    inode.nlink -= 1;
    crate::links::removed(ctx.txn, &mut inode, dir)?;
    if inode.nlink == 0 {
        if inode.kind == Kind::File && keep.contains(&inode.handle) {
            return crate::orphans::keep(ctx, inode);
        }
        destroy(ctx, &inode)?;
    } else {
        inode.ctime_ns = ctx.now;
        ctx.store(inode);
    }
    Ok(None)
}

/// The one directory whose names `op` changes (a rename between two directories changes two:
/// none is named), whose attributes its answer carries (`crate::commit::Answer`).
pub fn changed_dir(op: &Op) -> Option<Handle> {
    match op {
        Op::Make { parent, .. }
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
        | Op::Compact { .. }
        | Op::AllocSlices { .. }
        | Op::GcDone { .. }
        | Op::ReleaseOrphan { .. }
        | Op::ClaimOrphans { .. } => return None,
    })
}

fn make_record_type(kind: Kind) -> RecordType {
    match kind {
        Kind::File => RecordType::Create,
        Kind::Dir => RecordType::Mkdir,
        Kind::Symlink => RecordType::Softlink,
        _ => RecordType::Mknod,
    }
}

/// One record per setattr, named after the weightiest change: a size change is TRUNC, an
/// owner or mode change SATTR, then MTIME, ATIME, and CTIME for a change of ctime alone.
fn setattr_record_type(attr: &SetAttr) -> RecordType {
    if attr.size.is_some() {
        RecordType::Trunc
    } else if attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some() {
        RecordType::Setattr
    } else if attr.mtime.is_some() {
        RecordType::Mtime
    } else if attr.atime.is_some() {
        RecordType::Atime
    } else {
        RecordType::Ctime
    }
}

/// The keys `op` reads before it can know of any other: its directories and their entries, or
/// the inode it changes. A group's committer fetches them for all its operations at once.
pub(crate) fn keys_read_first(op: &Op, names: &NameHash, keys: &mut Vec<Vec<u8>>) {
    let mut entry = |parent: Handle, name: &[u8]| {
        keys.push(inode_key(parent).to_vec());
        keys.push(names.entry_key(parent, name));
    };
    match op {
        Op::Make { parent, name, .. }
        | Op::Unlink { parent, name, .. }
        | Op::Rmdir { parent, name } => entry(*parent, name),
        Op::Link {
            handle,
            parent,
            name,
        } => {
            entry(*parent, name);
            keys.push(inode_key(*handle).to_vec());
        }
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => {
            entry(*parent, name);
            entry(*new_parent, new_name);
        }
        Op::SetAttr { handle, .. }
        | Op::SetXattr { handle, .. }
        | Op::RemoveXattr { handle, .. }
        | Op::Write { handle, .. }
        | Op::Append { handle, .. } => keys.push(inode_key(*handle).to_vec()),
        _ => {}
    }
}

/// What `op` reads once its entries are known (read ahead by [`keys_read_first`]): the inode
/// of a name it removes or moves, and the xattrs and chunks of one it may destroy. A group's
/// committer reads them for all its operations at once, as a second step.
pub(crate) fn reads_after_entries<R: ReadTxn>(
    view: &R,
    names: &NameHash,
    op: &Op,
    keys: &mut Vec<Vec<u8>>,
    ranges: &mut Vec<(Vec<u8>, Vec<u8>)>,
) {
    let mut named = |parent: Handle, name: &[u8], destroyed: bool| {
        // A name that is not there, or does not decode, is the operation's own error.
        let Ok(Some(dentry)) = get_dentry(view, names, parent, name) else {
            return;
        };
        keys.push(inode_key(dentry.child).to_vec());
        if destroyed {
            let (start, end) = xattr_range(dentry.child);
            ranges.push((start.to_vec(), end.to_vec()));
            if dentry.kind == Kind::File {
                let (_, end) = chunk_range(dentry.child);
                ranges.push((chunk_key(dentry.child, 0).to_vec(), end.to_vec()));
            }
        }
    };
    match op {
        Op::Unlink { parent, name, .. } | Op::Rmdir { parent, name } => named(*parent, name, true),
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => {
            named(*parent, name, false);
            named(*new_parent, new_name, true);
        }
        _ => {}
    }
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
        } => rename(ctx, *parent, name, *new_parent, new_name, *flags, keep),
        Op::SetAttr { handle, attr } => setattr(ctx, *handle, attr),
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
        } => crate::data_ops::write(ctx, *handle, slices, *end, inline),
        Op::Append {
            handle,
            id,
            size,
            inline,
        } => crate::data_ops::append(ctx, *handle, *id, *size, inline.as_deref()),
        Op::Compact {
            handle,
            chunk,
            read,
            kept,
            slice,
            inline,
        } => crate::data_ops::compact(
            ctx,
            *handle,
            *chunk,
            read,
            kept,
            slice.as_ref(),
            inline.as_deref(),
        ),
        Op::AllocSlices { count } => crate::data_ops::alloc_slices(ctx, *count),
        Op::GcDone { entries } => crate::data_ops::gc_done(ctx, entries),
        Op::ReleaseOrphan {
            handle,
            any_session,
        } => crate::orphans::release(ctx, *handle, *any_session),
        Op::ClaimOrphans { handles } => crate::orphans::claim(ctx, handles),
        Op::ClGc => {
            let now = ctx.now;
            ctx.cl.gc_idle(ctx.txn, now).map(|_| Done::Nothing)
        }
        Op::ForgetRequests { keys } => crate::requests::forget(ctx, keys),
    }
}

fn make<T: WriteTxn>(
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
        if exclusive || node.kind != Kind::File {
            return Err(MetaError::Exists.into());
        }
        // open(O_CREAT) without O_EXCL of an existing name opens what is there.
        let inode = ctx.load(existing.child)?;
        if inode.kind == Kind::Dir {
            return Err(MetaError::IsDir.into());
        }
        return Ok(Done::Attr(inode.attr()));
    }
    crate::perm::may_change_dir(&ctx.caller, &dir.owner())?;
    let (uid, gid, mode) = crate::perm::new_owner(
        &ctx.caller,
        &dir.owner(),
        node.kind,
        node.uid,
        node.gid,
        node.mode & MODE_PERMISSION_MASK,
    );
    match node.kind {
        Kind::Symlink => {
            if node.target.is_empty() {
                return Err(MetaError::NotFound.into());
            }
            if node.target.len() > SYMLINK_LEN_MAX {
                return Err(MetaError::NameTooLong.into());
            }
            if node.target.contains(&0) {
                return Err(
                    MetaError::Invalid("a symlink target may not contain NUL".into()).into(),
                );
            }
        }
        Kind::Dir if dir.nlink >= LINK_COUNT_MAX => return Err(MetaError::TooManyLinks.into()),
        _ => {}
    }

    // Checks done; writes from here on.
    let handle = ctx.alloc.allocate(ctx.txn)?;
    let is_dir = node.kind == Kind::Dir;
    let is_device = matches!(node.kind, Kind::CharDevice | Kind::BlockDevice);
    let inode = Inode {
        handle,
        kind: node.kind,
        mode,
        uid,
        gid,
        nlink: if is_dir { 2 } else { 1 },
        generation: ctx.generation,
        size: if node.kind == Kind::Symlink {
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
        target: if node.kind == Kind::Symlink {
            node.target.clone()
        } else {
            Vec::new()
        },
    };
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
    Ok(Done::Attr(attr))
}

fn link<T: WriteTxn>(
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

fn unlink<T: WriteTxn>(
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
    let orphan = drop_link(ctx, inode, parent, keep)?;
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

fn rmdir<T: WriteTxn>(ctx: &mut Ctx<'_, T>, parent: Handle, name: &[u8]) -> Outcome<Done> {
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
    destroy(ctx, &child)?;
    let flags = cl_flags::LAST_LINK;
    ctx.record(
        RecordType::Rmdir,
        flags,
        child.handle,
        child.generation,
        parent,
        name,
        None,
    )?;
    Ok(Done::Nothing)
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
fn nlink_after(nlink: u32, delta: i64) -> Result<u32, MetaError> {
    let after = nlink as i64 + delta;
    if after > LINK_COUNT_MAX as i64 {
        return Err(MetaError::TooManyLinks);
    }
    Ok(after as u32)
}

fn rename<T: WriteTxn>(
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
        let dir = staged.load(ctx, dir)?.owner();
        if dir.kind != Kind::Dir {
            return Err(MetaError::NotDir.into());
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
                destroy(ctx, &replaced)?;
            } else {
                orphan = drop_link(ctx, replaced, dp, keep)?;
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

/// The directory an attribute change's record names: one holding a name of the inode (with
/// several, watchers find the others through `crate::links`); 0 for the root, an orphan, or a
/// file made before format 4.
pub(crate) fn record_parent(inode: &Inode) -> Handle {
    if inode.handle == crate::ROOT {
        0
    } else {
        inode.parent
    }
}

fn resolve(time: SetTime, now: i64) -> i64 {
    match time {
        SetTime::Now => now,
        SetTime::At(ns) => ns,
    }
}

/// The xattr holding a file's capabilities, which a write, truncate or chown takes away.
pub(crate) const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Drops `handle`'s file capabilities (the mount asks the kernel to leave this to the
/// server: FUSE_HANDLE_KILLPRIV_V2, so that a write does not cost a getxattr round trip).
pub(crate) fn kill_capability<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handle: Handle) -> Outcome<()> {
    ctx.txn
        .delete(&crate::layout::xattr_key(handle, CAPABILITY_XATTR))?;
    Ok(())
}

fn setattr<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handle: Handle, attr: &SetAttr) -> Outcome<Done> {
    let mut inode = ctx.load(handle)?;
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

    // A chown or a truncate of a file drops its file capabilities, as Linux's killpriv does.
    let chowned =
        attr.uid.is_some_and(|u| u != inode.uid) || attr.gid.is_some_and(|g| g != inode.gid);
    let resized = attr.size.is_some_and(|s| s != inode.size);
    if inode.kind == Kind::File && (chowned || resized) {
        kill_capability(ctx, handle)?;
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
            crate::data_ops::truncate_chunks(ctx, handle, size)?;
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
    inode.ctime_ns = attr.ctime.unwrap_or(ctx.now);
    let kind = setattr_record_type(attr);
    let attr = inode.attr();
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(kind, 0, handle, generation, parent, b"", None)?;
    Ok(Done::Attr(attr))
}

fn setxattr<T: WriteTxn>(
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
    let mut inode = ctx.load(handle)?;
    crate::perm::may_set_xattr(&ctx.caller, &inode.owner(), name)?;
    let key = xattr_key(handle, name);
    let exists = ctx.txn.get(&key)?.is_some();
    if exists && flags & XATTR_CREATE != 0 {
        return Err(MetaError::Exists.into());
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(MetaError::NoData.into());
    }
    if !exists {
        let listed: usize = xattr_names(ctx.txn, handle)?
            .iter()
            .map(|n| n.len() + 1)
            .sum();
        if listed + name.len() + 1 > XATTR_LIST_BYTES_MAX {
            return Err(MetaError::NoSpace(format!(
                "xattr names of one inode exceed {XATTR_LIST_BYTES_MAX} bytes"
            ))
            .into());
        }
    }

    ctx.txn.put(&key, value)?;
    inode.ctime_ns = ctx.now;
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(RecordType::Xattr, 0, handle, generation, parent, name, None)?;
    Ok(Done::Nothing)
}

fn removexattr<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handle: Handle, name: &[u8]) -> Outcome<Done> {
    check_xattr_name(name)?;
    let mut inode = ctx.load(handle)?;
    crate::perm::may_set_xattr(&ctx.caller, &inode.owner(), name)?;
    let key = xattr_key(handle, name);
    if ctx.txn.get(&key)?.is_none() {
        return Err(MetaError::NoData.into());
    }

    ctx.txn.delete(&key)?;
    inode.ctime_ns = ctx.now;
    let (generation, parent) = (inode.generation, record_parent(&inode));
    ctx.store(inode);
    ctx.record(RecordType::Xattr, 0, handle, generation, parent, name, None)?;
    Ok(Done::Nothing)
}
