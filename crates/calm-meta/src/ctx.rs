//! What the mutations of one group commit work with ([`Ctx`]: the transaction, the allocator,
//! the changelog, the caller, and an overlay of the inodes the group touched), and the reads
//! and writes of inodes, entries and xattrs every family of operations shares.

use std::collections::HashMap;
use std::ops::ControlFlow;

use calm_store::{ReadTxn, WriteTxn};

use calm_changelog::RecordType;
use calm_changelog::record::{RecordRef, RenameRef};

use crate::Caller;
use crate::alloc::HandleAllocator;
use crate::changelog::ClState;
use crate::error::MetaError;
use crate::layout::{
    Dentry, Inode, KEY_FILE_BYTES, KEY_INODES, KEY_TRASH_BYTES, KEY_TRASH_ENTRIES, NameHash,
    inode_key, orphan_key, xattr_range,
};
use crate::outcome::Outcome;
use crate::quota::{Chain, QuotaTarget, QuotaUsage, Quotas};
use crate::types::*;

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
    pub(crate) inode_delta: i64,
    pub(crate) file_bytes_delta: i64,
    /// Removed files and directories go to the trash instead of being destroyed.
    pub trash: bool,
    /// The nodes the committer made lately: those skip the trash (`crate::young`).
    pub(crate) young: Option<&'a crate::young::YoungFiles>,
    /// Nodes this group made, and removed for good.
    pub(crate) born: Vec<Handle>,
    pub(crate) gone: Vec<Handle>,
    /// Small files this group replaced by a rename, as they were (`crate::replaced`).
    pub(crate) replaced: Vec<crate::replaced::ReplacedFile>,
    pub(crate) trash_entries_delta: i64,
    pub(crate) trash_bytes_delta: i64,
    /// The quotas this group touched.
    pub(crate) quota: Quotas,
    /// Default ACLs of directories this group made nodes in (`None`: the directory has none),
    /// read once per group (`crate::ops::acls`).
    pub(crate) default_acls: HashMap<Handle, Option<std::sync::Arc<crate::acl::Acl>>>,
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
            trash: false,
            young: None,
            born: Vec::new(),
            gone: Vec::new(),
            replaced: Vec::new(),
            trash_entries_delta: 0,
            trash_bytes_delta: 0,
            quota: Quotas::default(),
            default_acls: HashMap::new(),
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

    /// A directory, as this group sees it; one in the trash (`nlink` 0) is not found: nothing
    /// is made in it, nothing moved into or out of it.
    pub(crate) fn load_dir(&mut self, handle: Handle) -> Outcome<Inode> {
        let inode = self.load(handle)?;
        if inode.kind != Kind::Dir {
            return Err(MetaError::NotDir.into());
        }
        if inode.nlink == 0 {
            return Err(MetaError::NotFound.into());
        }
        Ok(inode)
    }

    /// An inode to be changed (its attributes, xattrs or contents): one in the trash is not,
    /// for it has to stay as it was removed until it is restored; an orphan (open on the mount
    /// that removed its name) is.
    pub(crate) fn load_changeable(&mut self, handle: Handle) -> Outcome<Inode> {
        let inode = self.load(handle)?;
        if inode.nlink == 0
            && (inode.kind == Kind::Dir || self.txn.get(&orphan_key(handle))?.is_none())
        {
            return Err(MetaError::Stale.into());
        }
        Ok(inode)
    }

    /// Adds `delta` to the usage of the owner `uid`/`gid` only (not of any tree).
    pub(crate) fn charge_owners(&mut self, uid: u32, gid: u32, delta: QuotaUsage) -> Outcome<()> {
        let owners = QuotaTarget::owners(uid, gid);
        let (exempt, now) = (self.caller.is_root(), self.now);
        self.quota
            .charge(self.txn, &owners, &[], delta, exempt, now)
    }

    /// The directory whose trees a change of `inode`'s usage counts in: its parent, or, for an
    /// open file with no name left (an orphan), the directory its last name was in while that
    /// directory is in the namespace.
    pub(crate) fn tree_dir(&mut self, inode: &Inode) -> Outcome<Handle> {
        if inode.nlink > 0 || inode.kind != Kind::File || self.quota.trees(self.txn)? == 0 {
            return Ok(inode.parent);
        }
        let Some(value) = self.txn.get(&orphan_key(inode.handle))? else {
            return Ok(0);
        };
        let dir = crate::layout::OrphanRecord::decode(&value)?.tree_dir();
        self.live_dir(dir)
    }

    /// `dir` while it is a directory in the namespace (not removed, not in the trash), else 0.
    pub(crate) fn live_dir(&mut self, dir: Handle) -> Outcome<Handle> {
        if dir == 0 {
            return Ok(0);
        }
        match self.load(dir) {
            Ok(found) if found.kind == Kind::Dir && found.nlink > 0 => Ok(dir),
            Ok(_) | Err(crate::outcome::Failure::Meta(MetaError::NotFound)) => Ok(0),
            Err(other) => Err(other),
        }
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

    /// Removes inode `handle` (the caller deletes its xattrs and chunks), counting it gone.
    pub(crate) fn remove(&mut self, handle: Handle) {
        self.inodes.insert(
            handle,
            Cached {
                inode: None,
                dirty: true,
            },
        );
        self.inode_delta -= 1;
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

    /// Writes the inodes the group changed so far into the transaction (they stay in the
    /// overlay, clean): for a read of the transaction itself, such as counting a tree.
    pub(crate) fn write_back(&mut self) -> Outcome<()> {
        for (handle, cached) in self.inodes.iter_mut().filter(|(_, c)| c.dirty) {
            match &cached.inode {
                Some(inode) => put_inode(self.txn, inode)?,
                None => {
                    self.txn.delete(&inode_key(*handle))?;
                }
            }
            cached.dirty = false;
        }
        Ok(())
    }

    /// The directories with a tree limit among `dir` and the directories above it, nearest
    /// first (none for 0: an inode with no directory).
    pub(crate) fn chain(&mut self, dir: Handle) -> Outcome<Chain> {
        if dir == 0 || self.quota.trees(self.txn)? == 0 {
            return Ok(Chain::from([]));
        }
        if let Some(chain) = self.quota.cached_chain(dir) {
            return Ok(chain);
        }
        let mut chain = Vec::new();
        let mut at = dir;
        // A chain longer than every handle ever allocated is a cycle: corruption.
        for _ in 0..u32::MAX {
            if let Some(above) = self.quota.cached_chain(at) {
                chain.extend_from_slice(&above);
                break;
            }
            if self.quota.has_tree(self.txn, at)? {
                chain.push(at);
            }
            if at == crate::ROOT {
                break;
            }
            at = self.load(at)?.parent;
        }
        if at != crate::ROOT && self.quota.cached_chain(at).is_none() {
            return Err(MetaError::Corrupt(format!(
                "directory parent chain from {dir} does not reach the root"
            ))
            .into());
        }
        let chain = Chain::from(chain);
        self.quota.remember_chain(dir, chain.clone());
        Ok(chain)
    }

    /// Adds `delta` to the usage of the owner `uid`/`gid` and of the trees above directory
    /// `dir`, refusing growth past a limit (then nothing is changed).
    pub(crate) fn charge(
        &mut self,
        uid: u32,
        gid: u32,
        dir: Handle,
        delta: QuotaUsage,
    ) -> Outcome<()> {
        let chain = self.chain(dir)?;
        let owners = QuotaTarget::owners(uid, gid);
        let (exempt, now) = (self.caller.is_root(), self.now);
        self.quota
            .charge(self.txn, &owners, &chain, delta, exempt, now)
    }

    /// Charges a make by `uid`/`gid` in `parent` as [`Ctx::charge`] does, drawing from the
    /// quota share `share` names where the make may (`crate::quota::shares`).
    pub(crate) fn charge_make(
        &mut self,
        (uid, gid): (u32, u32),
        parent: Handle,
        delta: QuotaUsage,
        share: calm_types::Share,
    ) -> Outcome<()> {
        let draw = match share {
            calm_types::Share::Draw(pool) => {
                let limited = self.make_limited(uid, gid, parent)?;
                self.quota.may_draw(pool, &limited).then_some(pool)
            }
            _ => None,
        };
        self.quota.drawing(draw);
        let charged = self.charge(uid, gid, parent, delta);
        self.quota.drawing(None);
        charged?;
        if let Some(pool) = draw {
            self.quota.drew(pool);
        }
        Ok(())
    }

    /// The quotas with an inode limit that a make by `uid`/`gid` in `dir` is held to.
    fn make_limited(&mut self, uid: u32, gid: u32, dir: Handle) -> Outcome<Vec<QuotaTarget>> {
        let chain = self.chain(dir)?;
        let mut targets = QuotaTarget::owners(uid, gid).to_vec();
        targets.extend(chain.iter().map(|d| QuotaTarget::tree(*d)));
        let exempt = self.caller.is_root();
        self.quota.inode_limited(self.txn, &targets, exempt)
    }

    /// Sets a quota share aside for the makes by `uid`/`gid` in directory `dir`, just made:
    /// the room set aside, or `None` where no quota limits those makes.
    pub(crate) fn set_aside_share(
        &mut self,
        dir: Handle,
        (uid, gid): (u32, u32),
    ) -> Outcome<Option<u64>> {
        let limited = self.make_limited(uid, gid, dir)?;
        if limited.is_empty() {
            return Ok(None);
        }
        self.quota.set_aside(self.txn, dir, limited).map(Some)
    }

    /// Adds `delta` to the usage of the trees above directory `dir` only.
    pub(crate) fn charge_trees(&mut self, dir: Handle, delta: QuotaUsage) -> Outcome<()> {
        let chain = self.chain(dir)?;
        let now = self.now;
        self.quota.charge(self.txn, &[], &chain, delta, false, now)
    }

    /// Moves `usage` from the owner `from` to the owner `to` (a chown), refusing it past a
    /// limit of the new owner.
    pub(crate) fn charge_owner_change(
        &mut self,
        from: (u32, u32),
        to: (u32, u32),
        usage: QuotaUsage,
    ) -> Outcome<()> {
        let (exempt, now) = (self.caller.is_root(), self.now);
        let (gained, lost) = QuotaTarget::owners_changed(from, to);
        self.quota
            .charge(self.txn, &gained, &[], usage, exempt, now)?;
        self.quota
            .charge(self.txn, &lost, &[], usage.negated(), exempt, now)
    }

    /// Moves `usage` from the trees above directory `from` to those above `to` (a file
    /// renamed between directories), refusing it past a limit of a tree it enters.
    pub(crate) fn charge_move(
        &mut self,
        from: Handle,
        to: Handle,
        usage: QuotaUsage,
    ) -> Outcome<()> {
        let (left, entered) = (self.chain(from)?, self.chain(to)?);
        let gained: Vec<Handle> = entered
            .iter()
            .filter(|d| !left.contains(d))
            .copied()
            .collect();
        let lost: Vec<Handle> = left
            .iter()
            .filter(|d| !entered.contains(d))
            .copied()
            .collect();
        let now = self.now;
        self.quota
            .charge(self.txn, &[], &gained, usage, false, now)?;
        self.quota
            .charge(self.txn, &[], &lost, usage.negated(), false, now)
    }

    /// Writes what the group changed: every dirty inode once, the counters once.
    pub fn flush(self) -> Outcome<()> {
        self.quota.flush(self.txn)?;
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
        if self.trash_entries_delta != 0 {
            self.txn.add(KEY_TRASH_ENTRIES, self.trash_entries_delta)?;
        }
        if self.trash_bytes_delta != 0 {
            self.txn.add(KEY_TRASH_BYTES, self.trash_bytes_delta)?;
        }
        Ok(())
    }
}

pub(crate) fn is_dot(name: &[u8]) -> bool {
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

pub(crate) fn check_xattr_name(name: &[u8]) -> Result<(), MetaError> {
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

/// The ACL of `handle` kept under `name`, when there is one.
pub fn read_acl<R: ReadTxn + ?Sized>(
    view: &R,
    handle: Handle,
    name: &[u8],
) -> Outcome<Option<crate::acl::Acl>> {
    match view.get(&crate::layout::xattr_key(handle, name))? {
        Some(bytes) => Ok(Some(crate::acl::Acl::decode(&bytes).map_err(|e| {
            MetaError::Corrupt(format!("the ACL of inode {handle}: {e}"))
        })?)),
        None => Ok(None),
    }
}

/// Whether a new xattr `name` fits in `inode`'s listing ([`XATTR_LIST_BYTES_MAX`]).
pub(crate) fn room_for_xattr_name<R: ReadTxn + ?Sized>(
    view: &R,
    inode: &Inode,
    name: &[u8],
) -> Outcome<()> {
    let listed: usize = inode_xattr_names(view, inode)?
        .iter()
        .map(|n| n.len() + 1)
        .sum();
    if listed + name.len() + 1 > XATTR_LIST_BYTES_MAX {
        return Err(MetaError::NoSpace(format!(
            "xattr names of one inode exceed {XATTR_LIST_BYTES_MAX} bytes"
        ))
        .into());
    }
    Ok(())
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

/// The names of every xattr of `inode`, in order: its `X` keys, and its access ACL when it
/// has one (kept in the record).
pub fn inode_xattr_names<R: ReadTxn + ?Sized>(view: &R, inode: &Inode) -> Outcome<Vec<Vec<u8>>> {
    let mut names = xattr_names(view, inode.handle)?;
    if inode.access_acl.is_some() {
        let access = crate::acl::ACCESS_XATTR;
        let at = names.partition_point(|n| n.as_slice() < access);
        names.insert(at, access.to_vec());
    }
    Ok(names)
}

/// What an xattr counts in its owner's bytes and in its inode's limit: its name and its value;
/// nothing for a directory's default ACL (bounded by the ACL's own limits) and file
/// capabilities (one value, which every write takes away without reading it first).
pub(crate) fn xattr_charge(name: &[u8], value_len: usize) -> u64 {
    if name == crate::acl::DEFAULT_XATTR || name == CAPABILITY_XATTR {
        return 0;
    }
    (name.len() + value_len) as u64
}

/// Bytes of `handle`'s extended attributes as the quotas count them ([`xattr_charge`]).
pub fn xattr_bytes<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<u64> {
    let (start, end) = xattr_range(handle);
    let mut bytes = 0;
    view.visit(&start, &end, &mut |key, value| {
        bytes += xattr_charge(&key[9..], value.len());
        ControlFlow::Continue(())
    })?;
    Ok(bytes)
}

/// The directory whose trees orphan `handle` counts in: the one its last name was in, while it
/// is a directory in the namespace; 0 (none) when it was removed, or when `handle` is no
/// orphan.
pub(crate) fn orphan_tree_dir<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Handle> {
    let Some(value) = view.get(&orphan_key(handle))? else {
        return Ok(0);
    };
    let dir = crate::layout::OrphanRecord::decode(&value)?.tree_dir();
    if dir == 0 {
        return Ok(0);
    }
    Ok(match view.get(&inode_key(dir))? {
        Some(value) => {
            let inode = Inode::decode(dir, &value)?;
            if inode.kind == Kind::Dir && inode.nlink > 0 {
                dir
            } else {
                0
            }
        }
        None => 0,
    })
}

/// What `inode` counts in the quotas: itself, a file's bytes, its xattrs' bytes.
pub(crate) fn node_usage<R: ReadTxn + ?Sized>(
    view: &R,
    inode: &Inode,
) -> Outcome<crate::quota::QuotaUsage> {
    let mut usage = crate::quota::usage_of(inode.kind, inode.size);
    usage.bytes += xattr_bytes(view, inode.handle)? as i64;
    Ok(usage)
}

/// The names of every `X` key of `handle`.
pub fn xattr_names<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Vec<Vec<u8>>> {
    let (start, end) = xattr_range(handle);
    let mut names = Vec::new();
    view.visit(&start, &end, &mut |key, _| {
        names.push(key[9..].to_vec());
        ControlFlow::Continue(())
    })?;
    Ok(names)
}

pub(crate) fn put_inode<T: WriteTxn>(txn: &mut T, inode: &Inode) -> Outcome<()> {
    txn.put(&inode_key(inode.handle), &inode.encode())?;
    Ok(())
}

pub(crate) fn add_entry<T: WriteTxn>(
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

pub(crate) fn remove_entry<T: WriteTxn>(
    txn: &mut T,
    names: &NameHash,
    dir: &mut Inode,
    name: &[u8],
) -> Outcome<()> {
    txn.delete(&names.entry_key(dir.handle, name))?;
    dir.entries -= 1;
    Ok(())
}

pub(crate) fn touch(inode: &mut Inode, now: i64) {
    inode.mtime_ns = now;
    inode.ctime_ns = now;
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

/// The xattr holding a file's capabilities, which a write, truncate or chown takes away.
pub(crate) const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Drops `handle`'s file capabilities (the mount asks the kernel to leave this to the
/// server: FUSE_HANDLE_KILLPRIV_V2, so that a write does not cost a getxattr round trip).
pub(crate) fn kill_capability<T: WriteTxn>(ctx: &mut Ctx<'_, T>, handle: Handle) -> Outcome<()> {
    ctx.txn
        .delete(&crate::layout::xattr_key(handle, CAPABILITY_XATTR))?;
    Ok(())
}
