//! `calm-meta`: the POSIX namespace over a [`calm_store::Store`].
//!
//! [`Meta`] is the namespace's face: reads (lookup, getattr, readdir, xattrs, statfs) run at
//! once on a store snapshot, on the caller's thread; mutations go to the group committer
//! ([`commit`]) and their futures complete once the commit that holds them is durable.
//!
//! What it deliberately does not know: the wire (gRPC lives in calm-server), errno beyond the
//! mapping table in [`error`], the bytes of files (only which object ranges make them up:
//! [`slices`]; calm-data moves the bytes), permissions (the
//! FUSE client checks them with the attributes it gets, as `default_permissions` does), and
//! clocks other than the committer's `now`.
//!
//! Opening a store reads the superblock and bumps the epoch: a constant amount of work,
//! whatever the number of files. Nothing is ever scanned at start.

pub mod alloc;
pub mod changelog;
pub mod commit;
pub mod compaction;
pub(crate) mod ctx;
pub mod data;
pub mod fsck;
mod housekeeping;
pub mod layout;
pub mod links;
pub mod ops;
pub mod outcome;
pub mod perm;
pub mod place;
pub mod requests;
pub mod upgrade;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::thread::JoinHandle;

use calm_changelog::{Mask, Record, User, UserId};
use calm_store::{ReadTxn, Store, WriteTxn, decode_counter};
use tokio::sync::{mpsc, oneshot};

pub use crate::commit::{CommitStats, FOLLOWERS_WAITING_MAX, MetaOptions, SHARED_BATCH_OPS_MAX};
pub use crate::data::{Garbage, MAP_RECORDS_MAX};
pub use crate::error::{MetaError, Result};
use crate::layout::*;
use crate::ops::{Done, Op};
pub use crate::types::*;
pub use calm_types::FileMap;
pub use calm_types::{Caller, Groups, attr as types, error, slices};

/// The namespace, open on a store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Meta<S: Store> {
    store: Arc<S>,
    queue: Option<mpsc::Sender<commit::Request>>,
    committer: Option<JoinHandle<()>>,
    /// Dropping it stops the housekeeping thread (changelog GC, request-record sweeps).
    housekeeping_stop: Option<std::sync::mpsc::Sender<()>>,
    housekeeping: Option<JoinHandle<()>>,
    /// The index of the last changelog record committed (published before the answers;
    /// followers woken after them).
    last_index: Arc<commit::LastIndex>,
    stats: Arc<CommitStats>,
    epoch: u64,
    /// Where names are kept.
    names: layout::NameHash,
    /// The store is shared with other servers (reads cross the network).
    shared: bool,
}

/// How a follow read waits (a long poll, never a timer that polls): see
/// [`Meta::changelog_follow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    /// Longest to wait when no record is there yet.
    pub wait: std::time::Duration,
    /// Answer when this many records are there…
    pub min_records: usize,
    /// …or, when some are, this long after the call, whichever is sooner.
    pub linger: std::time::Duration,
}

impl Follow {
    /// Lingers up to [`CL_FOLLOW_LINGER`] for [`CL_FOLLOW_BATCH_RECORDS`] records, and up to
    /// `wait` for a first one (what `calm changelog read --follow` does).
    pub fn batching(wait: std::time::Duration) -> Follow {
        Follow {
            wait,
            min_records: CL_FOLLOW_BATCH_RECORDS,
            linger: CL_FOLLOW_LINGER,
        }
    }
}

/// A batching follower's records per answer, by default.
pub const CL_FOLLOW_BATCH_RECORDS: usize = 1024;
/// A batching follower's linger, by default: inside the 10 ms the changelog's commit-to-read
/// goal allows (the bench's following reader: p99 6.1–7.0 ms at 1–64 clients), and a wake-up
/// every 5 ms instead of every 1 ms. Each wake-up of a follower costs the server's cores a
/// reader's turn (on a VM, waking an idle vCPU). Measured on weak evidence
/// (docs/benchmarks/2026-11-23): with 1 ms, the writes' rate with a following reader was 0.968
/// of the rate without a changelog (mean of 8 runs at 1–16 clients), with 5 ms 0.978; two full
/// runs with 5 ms then gave 0.981 and 0.969.
pub const CL_FOLLOW_LINGER: std::time::Duration = std::time::Duration::from_millis(5);

/// Most records one changelog read returns.
pub const CL_READ_RECORDS_MAX: usize = 65_536;
/// Most encoded bytes one changelog read returns (under the 4 MiB gRPC message limit).
pub const CL_READ_BYTES_MAX: usize = 3 << 20;

/// The changelog's readers as a snapshot sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogUsers {
    /// Index of the last record written (0: none yet).
    pub last: u64,
    /// Index of the first record still stored (`last + 1` when none is).
    pub first: u64,
    pub users: Vec<User>,
}

impl<S: Store> std::fmt::Debug for Meta<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("epoch", &self.epoch).finish()
    }
}

/// Figures for `calm status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaStatus {
    pub epoch: u64,
    pub inodes: u64,
    pub file_bytes: u64,
    pub handle_high_water: u64,
    pub store_bytes: u64,
    pub commits: u64,
    pub ops_committed: u64,
    pub failed_commits: u64,
    pub largest_batch: u64,
    pub commit_ns_total: u64,
    /// Index of the last changelog record.
    pub changelog_last: u64,
    /// Index of the first changelog record still stored.
    pub changelog_first: u64,
    pub changelog_readers: u64,
    /// Records purged since the server started.
    pub changelog_purged: u64,
    /// What the store counts of its own work (see `Store::figures`).
    pub store_figures: Vec<(&'static str, u64)>,
}

fn counter<R: ReadTxn>(view: &R, key: &[u8]) -> Result<u64> {
    match view.get(key)? {
        Some(bytes) => Ok(decode_counter(key, &bytes)?),
        None => Ok(0),
    }
}

impl<S: Store> Meta<S> {
    /// Opens the namespace on `store`, formatting an empty store. Reads a constant number of
    /// keys and commits one small transaction (the epoch bump).
    pub fn open(store: S, options: MetaOptions) -> Result<Self> {
        let store = Arc::new(store);
        upgrade::names(&*store)?;
        // A shared store may see another server open at the same moment: run again on a
        // conflict.
        let mut tries = 0;
        let (opened, cl) = loop {
            match open_txn(&*store, &options)? {
                Some(opened) => break opened,
                None if tries < commit::CONFLICT_RETRIES_MAX => tries += 1,
                None => {
                    return Err(MetaError::Busy(
                        "opening: the store kept conflicting with other servers".into(),
                    ));
                }
            }
        };

        let (sender, receiver) = mpsc::channel(options.queue_ops_max);
        let last_sender = Arc::new(commit::LastIndex::new(cl.last));
        let stats = Arc::new(CommitStats::default());
        let plan = housekeeping::Plan::new(&options);
        // Another server's records: a follower publishes the last index they reach.
        let commits = store.watch_commits()?;
        let shared = store.shared();
        let committer = {
            let store = store.clone();
            let stats = stats.clone();
            let last_sender = last_sender.clone();
            std::thread::Builder::new()
                .name("calm-commit".into())
                .spawn(move || {
                    commit::run(store, receiver, options, opened, cl, last_sender, stats)
                })
                .map_err(|e| MetaError::Io(format!("starting the committer: {e}")))?
        };
        let (housekeeping_stop, housekeeping) = if plan.idle() {
            (None, None)
        } else {
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let queue = sender.downgrade();
            let store = Arc::downgrade(&store);
            let thread = std::thread::Builder::new()
                .name("calm-housekeep".into())
                .spawn(move || housekeeping::run(store, queue, stopped, plan))
                .map_err(|e| MetaError::Io(format!("starting the housekeeping thread: {e}")))?;
            (Some(stop), Some(thread))
        };
        let last_sender_for_meta = last_sender.clone();
        if let Some(commits) = commits {
            let store = Arc::downgrade(&store);
            std::thread::Builder::new()
                .name("calm-follow".into())
                .spawn(move || follow_commits(store, commits, last_sender))
                .map_err(|e| MetaError::Io(format!("starting the commit follower: {e}")))?;
        }
        Ok(Self {
            store,
            queue: Some(sender),
            committer: Some(committer),
            housekeeping_stop,
            housekeeping,
            last_index: last_sender_for_meta,
            stats,
            epoch: opened.generation,
            names: opened.names,
            shared,
        })
    }

    /// Runs a read. On a shared store a read waits for the network: inside a multi-threaded
    /// tokio runtime the worker hands its other tasks over first, so that many reads can be in
    /// flight at once (on a local store a read is too short for that to pay).
    fn blocking<T>(&self, read: impl FnOnce() -> T) -> T {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if self.shared && multi_thread {
            tokio::task::block_in_place(read)
        } else {
            read()
        }
    }

    /// The namespace's name hash key and identity: what the other clusters of a namespace
    /// over several are formatted with ([`place::Place::namespace`]).
    pub fn namespace_keys(&self) -> Result<place::NamespaceKeys> {
        place::namespace_keys(&self.store.snapshot()?)
    }

    /// The store under the namespace.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// This opening's epoch: the generation of inodes created now.
    /// Whether the store is shared with other servers (etcd).
    pub fn shared(&self) -> bool {
        self.store.shared()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    async fn submit(&self, op: Op) -> Result<Done> {
        self.apply_as(Caller::default(), op).await
    }

    /// Applies a mutation on behalf of `caller` (recorded in its changelog record).
    pub async fn apply_as(&self, caller: Caller, op: Op) -> Result<Done> {
        self.apply_request(caller, op, None).await
    }

    /// [`Meta::apply_as`], for a request with an id: applied at most once, however often it
    /// is sent (`requests`).
    pub async fn apply_request(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
    ) -> Result<Done> {
        self.apply_request_in_dir(caller, op, id)
            .await
            .map(|(done, _)| done)
    }

    /// [`Meta::apply_request`], with the attributes of the directory whose names the mutation
    /// changed (make, link, unlink, rmdir, a rename inside one directory) as they were right
    /// after it: what a client that keeps that directory's attributes takes instead of asking
    /// again. `None` for other mutations and for a request answered from its record.
    pub async fn apply_request_in_dir(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
    ) -> Result<(Done, Option<Attr>)> {
        let (reply, answer) = oneshot::channel();
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| MetaError::Io("namespace is shutting down".into()))?;
        queue
            .send(commit::Request {
                op,
                caller,
                id,
                reply,
            })
            .await
            .map_err(|_| MetaError::Io("committer stopped".into()))?;
        answer
            .await
            .map_err(|_| MetaError::Io("committer stopped before answering".into()))?
    }

    async fn submit_attr(&self, op: Op) -> Result<Attr> {
        match self.submit(op).await? {
            Done::Attr(attr) => Ok(attr),
            _ => unreachable!("operation answers with attributes"),
        }
    }

    async fn submit_unit(&self, op: Op) -> Result<()> {
        self.submit(op).await.map(|_| ())
    }

    // ----- reads -----

    pub fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(ops::load(&snap, handle)?.attr())
        })
    }

    /// [`Meta::getattr`] on a snapshot that may miss another server's change of the last
    /// moments ([`Store::snapshot_recent`]): for the lock service's checks, not for answers.
    pub fn getattr_recent(&self, handle: Handle) -> Result<Attr> {
        self.blocking(|| {
            let snap = self.store.snapshot_recent()?;
            Ok(ops::load(&snap, handle)?.attr())
        })
    }

    /// The directories holding names of `handle`, sorted (none for the root, an unlinked
    /// file kept open, or a file made before format 4 that was not renamed since).
    pub fn parents(&self, handle: Handle) -> Result<Vec<Handle>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            let mut parents = links::parents(&snap, &inode)?;
            parents.sort_unstable();
            Ok(parents)
        })
    }

    /// The entry `name` of directory `parent`; "." is the directory, ".." its parent.
    pub fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.lookup_as(&Caller::default(), parent, name)
    }

    /// [`Meta::lookup`] for `caller`, who needs search permission on `parent`.
    pub fn lookup_as(&self, caller: &Caller, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let dir = ops::load_dir(&snap, parent)?;
            perm::may_lookup(caller, &dir.owner())?;
            let child = match name {
                b"." => parent,
                b".." => dir.parent,
                _ => {
                    ops::check_name(name)?;
                    ops::get_dentry(&snap, &self.names, parent, name)?
                        .ok_or(MetaError::NotFound)?
                        .child
                }
            };
            Ok(ops::load(&snap, child)?.attr())
        })
    }

    pub fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            if inode.kind != Kind::Symlink {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(inode.target)
        })
    }

    /// Up to `limit` entries of directory `dir` (at most [`READDIR_ENTRIES_MAX`]) after
    /// `after_cookie` (0 = from the start). Resuming with the last entry's cookie continues
    /// exactly where the listing stopped, whatever was created or removed in between.
    pub fn readdir(&self, dir: Handle, after_cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.readdir_as(&Caller::default(), dir, after_cookie, limit)
    }

    /// [`Meta::readdir`] for `caller`, who needs read permission on `dir`.
    pub fn readdir_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load_dir(&snap, dir)?;
            perm::permission(caller, &inode.owner(), perm::MAY_READ)?;
            readdir_entries(&snap, dir, after_cookie, limit)
        })
    }

    /// [`Meta::readdir_as`] with each entry's attributes, read on the same snapshot (what a
    /// lookup of each name would answer; READDIRPLUS). A caller who may read `dir` but not
    /// search it gets the entries without attributes, as its lookups would be refused.
    pub fn readdir_plus_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load_dir(&snap, dir)?;
            perm::permission(caller, &inode.owner(), perm::MAY_READ)?;
            let entries = readdir_entries(&snap, dir, after_cookie, limit)?;
            let searchable = perm::may_lookup(caller, &inode.owner()).is_ok();
            entries
                .into_iter()
                .map(|entry| {
                    let attr = match searchable {
                        true => Some(ops::load(&snap, entry.handle)?.attr()),
                        false => None,
                    };
                    Ok((entry, attr))
                })
                .collect()
        })
    }

    pub fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.getxattr_as(&Caller::default(), handle, name)
    }

    /// [`Meta::getxattr`] for `caller` (the namespace's rules: `crate::perm::may_get_xattr`).
    pub fn getxattr_as(&self, caller: &Caller, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            perm::may_get_xattr(caller, &inode.owner(), name)?;
            match snap.get(&xattr_key(handle, name))? {
                Some(value) => Ok(value.into_owned()),
                None => Err(MetaError::NoData),
            }
        })
    }

    pub fn listxattr(&self, handle: Handle) -> Result<Vec<Vec<u8>>> {
        self.listxattr_as(&Caller::default(), handle)
    }

    /// [`Meta::listxattr`] for `caller`: `trusted.*` names only for the superuser.
    pub fn listxattr_as(&self, caller: &Caller, handle: Handle) -> Result<Vec<Vec<u8>>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            ops::load(&snap, handle)?;
            let mut names = ops::xattr_names(&snap, handle)?;
            names.retain(|name| perm::lists_xattr(caller, name));
            Ok(names)
        })
    }

    pub fn statfs(&self) -> Result<StatFs> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(StatFs {
                inodes: counter(&snap, KEY_INODES)?,
                file_bytes: counter(&snap, KEY_FILE_BYTES)?,
                store_bytes: self.store.size_bytes()?,
                name_len_max: NAME_LEN_MAX as u32,
            })
        })
    }

    pub fn status(&self) -> Result<MetaStatus> {
        use std::sync::atomic::Ordering::Relaxed;
        let changelog = self.changelog_users()?;
        let snap = self.store.snapshot()?;
        Ok(MetaStatus {
            epoch: self.epoch,
            inodes: counter(&snap, KEY_INODES)?,
            file_bytes: counter(&snap, KEY_FILE_BYTES)?,
            handle_high_water: counter(&snap, KEY_HWM)?,
            store_bytes: self.store.size_bytes()?,
            commits: self.stats.commits.load(Relaxed),
            ops_committed: self.stats.ops.load(Relaxed),
            failed_commits: self.stats.failed_commits.load(Relaxed),
            largest_batch: self.stats.largest_batch.load(Relaxed),
            commit_ns_total: self.stats.commit_ns_total.load(Relaxed),
            changelog_last: self.changelog_last(),
            changelog_first: changelog.first,
            changelog_readers: changelog.users.len() as u64,
            changelog_purged: self.stats.cl_purged.load(Relaxed),
            store_figures: self.store.figures(),
        })
    }

    // ----- mutations (durable when they return) -----

    /// Creates a file, directory, symlink or special file named `name` in `parent`. With
    /// `exclusive` false and a regular file already there, returns it (open with O_CREAT).
    pub async fn make(
        &self,
        parent: Handle,
        name: &[u8],
        node: NewNode,
        exclusive: bool,
    ) -> Result<Attr> {
        self.submit_attr(Op::Make {
            parent,
            name: name.to_vec(),
            node,
            exclusive,
        })
        .await
    }

    pub async fn create(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, NewNode::file(mode, 0, 0), true)
            .await
    }

    pub async fn mkdir(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, NewNode::dir(mode, 0, 0), true)
            .await
    }

    pub async fn symlink(&self, parent: Handle, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.make(parent, name, NewNode::symlink(target, 0, 0), true)
            .await
    }

    /// A new name `name` in `parent` for the inode `handle`.
    pub async fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.submit_attr(Op::Link {
            handle,
            parent,
            name: name.to_vec(),
        })
        .await
    }

    pub async fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::Unlink {
            parent,
            name: name.to_vec(),
            keep: Vec::new(),
        })
        .await
    }

    /// Every orphan (a file open on a mount after its last name went) with the session that
    /// keeps it (see [`orphans`]).
    pub fn orphans(&self) -> Result<Vec<(Handle, u64)>> {
        self.blocking(|| ops::orphans::list(&self.store.snapshot()?))
    }

    /// Destroys orphan `handle` whatever its session (which ended).
    pub async fn release_orphan(&self, handle: Handle) -> Result<()> {
        self.submit_unit(Op::ReleaseOrphan {
            handle,
            any_session: true,
        })
        .await
    }

    pub async fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::Rmdir {
            parent,
            name: name.to_vec(),
        })
        .await
    }

    /// Renames with Linux's `renameat2` semantics; `flags` takes [`RENAME_NOREPLACE`] or
    /// [`RENAME_EXCHANGE`].
    pub async fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.submit_unit(Op::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
            keep: Vec::new(),
        })
        .await
    }

    pub async fn setattr(&self, handle: Handle, attr: SetAttr) -> Result<Attr> {
        self.submit_attr(Op::SetAttr { handle, attr }).await
    }

    /// Sets an xattr; `flags` takes [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub async fn setxattr(
        &self,
        handle: Handle,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.submit_unit(Op::SetXattr {
            handle,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        })
        .await
    }

    pub async fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::RemoveXattr {
            handle,
            name: name.to_vec(),
        })
        .await
    }

    // ----- changelog -----

    async fn submit_user(&self, op: Op) -> Result<User> {
        match self.submit(op).await? {
            Done::User(user) => Ok(user),
            _ => unreachable!("changelog operation answers with its reader"),
        }
    }

    /// Registers a changelog reader; it gets every record written from now on whose type is
    /// in `mask`.
    pub async fn changelog_register(&self, name: &str, mask: Mask) -> Result<User> {
        self.submit_user(Op::ClRegister {
            name: name.to_string(),
            mask,
        })
        .await
    }

    /// Deregisters a reader; what only it still needed is purged in the background.
    pub async fn changelog_deregister(&self, id: UserId) -> Result<User> {
        self.submit_user(Op::ClDeregister { id }).await
    }

    /// Marks every record up to `index` (0: the last) processed by `id`. Returns at once; the
    /// purge of what every reader has cleared runs in the background.
    pub async fn changelog_clear(&self, id: UserId, index: u64) -> Result<User> {
        self.submit_user(Op::ClClear { id, index }).await
    }

    pub async fn changelog_set_mask(&self, id: UserId, mask: Mask) -> Result<User> {
        self.submit_user(Op::ClMask { id, mask }).await
    }

    /// The readers, and the first and last indices, on a snapshot.
    pub fn changelog_users(&self) -> Result<ChangelogUsers> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let state = changelog::ClState::load(
                &snap,
                calm_changelog::ChangelogConfig::default(),
                self.shared,
            )?;
            Ok(ChangelogUsers {
                last: state.last,
                first: state.first,
                users: state.registry.users().cloned().collect(),
            })
        })
    }

    /// Records from index `from` on, at most `max_records` (and [`CL_READ_RECORDS_MAX`]) and
    /// about `max_bytes` encoded bytes (and [`CL_READ_BYTES_MAX`]; at least one record).
    /// With `reader`, starts after what it has cleared and skips types outside its mask.
    pub fn changelog_read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
    ) -> Result<Vec<Record>> {
        let mut batch = ReadBatch::new(max_records, max_bytes);
        self.changelog_read_more(from, reader, &mut batch, false)?;
        Ok(batch.records)
    }

    /// Reads records from index `from` on into `batch` until it is full or the log ends;
    /// returns the index to go on from (past every record visited, those outside the
    /// reader's mask included).
    ///
    /// With `recent`, on a snapshot that sees this server's commits and those of others it
    /// has been told of ([`Store::snapshot_recent`]: no round trip on a shared store), for a
    /// follower that knows which records to expect.
    fn changelog_read_more(
        &self,
        from: u64,
        reader: Option<UserId>,
        batch: &mut ReadBatch,
        recent: bool,
    ) -> Result<u64> {
        if batch.full() {
            return Ok(from);
        }
        self.blocking(|| {
            let snap = if recent {
                self.store.snapshot_recent()?
            } else {
                self.store.snapshot()?
            };
            let (mut from, mask) = (from, reader_mask(&snap, reader)?);
            if let Some((cleared, _)) = mask {
                from = from.max(cleared + 1);
            }
            let mut next = from;
            let mut bad = None;
            snap.log_visit(from, &mut |index, value| {
                match Record::decode(index, value) {
                    Ok(record) => {
                        next = index + 1;
                        if mask.is_none_or(|(_, m)| m.contains(record.kind)) {
                            batch.bytes += value.len();
                            batch.records.push(record);
                        }
                    }
                    Err(error) => {
                        bad = Some(MetaError::Corrupt(format!(
                            "changelog record {index}: {error}"
                        )));
                        return ControlFlow::Break(());
                    }
                }
                if batch.full() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            match bad {
                Some(error) => Err(error),
                None => Ok(next),
            }
        })
    }

    /// [`Meta::changelog_read`] of the records this server knows of (up to
    /// [`Meta::changelog_last`]): none without a read when `from` is past them, else on a
    /// recent snapshot (no round trip on a shared store), and on a full one only when the
    /// recent one lacks some. For a follower woken by [`Meta::changelog_wait`].
    pub fn changelog_read_known(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
    ) -> Result<Vec<Record>> {
        let last = self.changelog_last();
        let mut batch = ReadBatch::new(max_records, max_bytes);
        if from > last {
            return Ok(batch.records);
        }
        self.changelog_read_known_more(from, last, reader, &mut batch)?;
        Ok(batch.records)
    }

    /// [`Meta::changelog_read_more`] of records known to reach `upto`: on a recent snapshot,
    /// and on a full one only when the recent one lacks some.
    fn changelog_read_known_more(
        &self,
        from: u64,
        upto: u64,
        reader: Option<UserId>,
        batch: &mut ReadBatch,
    ) -> Result<u64> {
        let next = self.changelog_read_more(from, reader, batch, true)?;
        if next <= upto {
            return self.changelog_read_more(next, reader, batch, false);
        }
        Ok(next)
    }

    /// [`Meta::changelog_read`] for a follower: when fewer than `follow.min_records` records
    /// are there, waits for them up to `follow.linger` after the call; past that, answers with
    /// what is there, or, when nothing is, waits up to `follow.wait` for the first record.
    /// Each wait sleeps until a commit reaches the index it needs or its time is up (records
    /// of types outside the reader's mask count there, so it may read again and go on).
    ///
    /// A follower that keeps up is so woken once a linger (by its timer, or by a full batch),
    /// not on every group commit; an idle one sleeps until the next record (no polling).
    pub async fn changelog_follow(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
        follow: Follow,
    ) -> Result<Vec<Record>> {
        let mut last = self.changelog_last();
        let mut batch = ReadBatch::new(max_records, max_bytes);
        // Each read after a wait goes on from where the one before stopped: a record is
        // decoded once per call, however many times the follower wakes. A follower that has
        // read every record this server knows of waits for the next without reading (a
        // record committed elsewhere a moment ago is told to this server within moments, and
        // wakes it).
        let mut next = if from > last && !follow.wait.is_zero() {
            from
        } else {
            self.changelog_read_more(from, reader, &mut batch, false)?
        };
        let min_records = follow.min_records.clamp(1, batch.max_records);
        if batch.records.len() >= min_records || batch.full() || follow.wait.is_zero() {
            return Ok(batch.records);
        }
        let called = tokio::time::Instant::now();
        let deadline = called + follow.wait;
        let linger_end = (called + follow.linger).min(deadline);
        loop {
            let now = tokio::time::Instant::now();
            let lingering = now < linger_end;
            if !lingering && !batch.records.is_empty() {
                break;
            }
            let (until, index) = if lingering {
                (
                    linger_end,
                    last + (min_records - batch.records.len()) as u64,
                )
            } else {
                (deadline, last + 1)
            };
            let left = until.saturating_duration_since(now);
            if left.is_zero() {
                break;
            }
            let reached = self.changelog_wait_until(index, left).await?;
            if reached != last {
                last = reached;
                next = self.changelog_read_known_more(next, reached, reader, &mut batch)?;
                if batch.records.len() >= min_records || batch.full() {
                    break;
                }
            }
        }
        Ok(batch.records)
    }

    /// The index of the last record committed.
    pub fn changelog_last(&self) -> u64 {
        self.last_index.get()
    }

    /// Waits until a record after `after` is committed, or `timeout` passes; returns the last
    /// index then. For follow mode (a long poll): no fixed-interval polling.
    pub async fn changelog_wait(&self, after: u64, timeout: std::time::Duration) -> Result<u64> {
        self.changelog_wait_until(after.saturating_add(1), timeout)
            .await
    }

    /// Waits until the last index is at least `index`, or `timeout` passes; returns the last
    /// index then. The waiter is woken once, when a commit reaches `index`. Busy when
    /// [`FOLLOWERS_WAITING_MAX`] followers wait already.
    pub async fn changelog_wait_until(
        &self,
        index: u64,
        timeout: std::time::Duration,
    ) -> Result<u64> {
        self.last_index.wait_until(index, timeout).await
    }

    /// Stops taking mutations, lets the committer finish what is queued, and returns the
    /// store. Dropping a `Meta` does the same.
    pub fn shutdown(mut self) -> Arc<S> {
        self.stop();
        self.store.clone()
    }

    fn stop(&mut self) {
        self.housekeeping_stop.take();
        if let Some(thread) = self.housekeeping.take() {
            let _ = thread.join();
        }
        self.queue.take();
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
    }
}

/// The records of one read so far, and its limits (clamped to the namespace's).
struct ReadBatch {
    records: Vec<Record>,
    /// Encoded bytes of `records`.
    bytes: usize,
    max_records: usize,
    max_bytes: usize,
}

impl ReadBatch {
    fn new(max_records: usize, max_bytes: usize) -> ReadBatch {
        ReadBatch {
            records: Vec::new(),
            bytes: 0,
            max_records: max_records.clamp(1, CL_READ_RECORDS_MAX),
            max_bytes: max_bytes.clamp(1, CL_READ_BYTES_MAX),
        }
    }

    /// No record more is taken (at least one is, whatever its size).
    fn full(&self) -> bool {
        self.records.len() >= self.max_records || self.bytes >= self.max_bytes
    }
}

/// A reader's cleared index and mask, if `reader` is given.
fn reader_mask<R: ReadTxn>(view: &R, reader: Option<UserId>) -> Result<Option<(u64, Mask)>> {
    let Some(id) = reader else {
        return Ok(None);
    };
    let bytes = view.get(&cl_user_key(id))?.ok_or(MetaError::NotFound)?;
    let user = User::decode(id, &bytes)
        .ok_or_else(|| MetaError::Corrupt(format!("changelog reader cl{id} does not decode")))?;
    Ok(Some((user.cleared, user.mask)))
}

impl<S: Store> Drop for Meta<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The opening transaction: formats an empty store, bumps the epoch, reads the changelog
/// state. `None`: another writer of a shared store committed first; run it again.
fn open_txn<S: Store>(
    store: &S,
    options: &MetaOptions,
) -> Result<Option<(commit::Opened, changelog::ClState)>> {
    let mut txn = store.begin()?;
    match txn.get(KEY_FORMAT)? {
        Some(format) => {
            let version = check_format(&format)?;
            if version < FORMAT_VERSION {
                // Versions 1 to 3 differ only by lacking keys that later ones add as they go;
                // before version 4 no non-directory recorded its parent: those are the
                // handles below today's high-water mark.
                if version < 4 {
                    let mark = match txn.get(KEY_HWM)? {
                        Some(bytes) => calm_store::decode_counter(KEY_HWM, &bytes)?,
                        None => 0,
                    };
                    txn.put(KEY_PARENTS_FROM, &mark.to_le_bytes())?;
                }
                txn.put(KEY_FORMAT, &format_value())?;
            }
        }
        None => {
            if txn.any_in(b"", b"")? {
                return Err(MetaError::Corrupt(
                    "the store holds data but no calm superblock".into(),
                ));
            }
            format_store(&mut txn, options.place.as_ref())?;
        }
    }
    place::check(&txn, options.place.as_ref())?;
    match (txn.get(KEY_OBJECTS)?, &options.objects_url) {
        (Some(kept), Some(given)) if kept.as_ref() != given.as_bytes() => {
            return Err(MetaError::Invalid(format!(
                "this namespace keeps its file contents in {}; it cannot move to {given}",
                String::from_utf8_lossy(&kept)
            )));
        }
        (Some(_), _) => {}
        (None, given) => {
            if let Some(url) = given.as_ref().or(options.objects_url_default.as_ref()) {
                txn.put(KEY_OBJECTS, url.as_bytes())?;
            }
        }
    }
    if txn.get(KEY_NAMESPACE_ID)?.is_none() {
        txn.put(KEY_NAMESPACE_ID, &random_id())?;
    }
    let names = match txn.get(KEY_NAME_HASH)? {
        Some(key) => layout::NameHash::from_value(&key)?,
        None => {
            return Err(MetaError::Corrupt(
                "the store has no name hash key (Snamehash)".into(),
            ));
        }
    };
    let epoch = txn.add(KEY_EPOCH, 1)?;
    let cl = changelog::ClState::load(&txn, options.changelog, store.shared())?;
    let opened = commit::Opened {
        generation: epoch,
        names,
    };
    match txn.commit() {
        Ok(()) => Ok(Some((opened, cl))),
        Err(calm_store::StoreError::Conflict) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// For a shared store: after each burst of commits by anyone, reads the last changelog index
/// on a snapshot and publishes it (monotonic), so that followers and watches see the records
/// other servers write. Ends when the namespace is gone.
fn follow_commits<S: Store>(
    store: std::sync::Weak<S>,
    commits: std::sync::mpsc::Receiver<()>,
    last_index: Arc<commit::LastIndex>,
) {
    loop {
        match commits.recv_timeout(std::time::Duration::from_secs(1)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if store.strong_count() == 0 {
                    return;
                }
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(store) = store.upgrade() else { return };
        // A shared store keeps the last index in its counter (see `ClState::counted`). The
        // store tells of a commit once a recent snapshot sees it: no round trip for it.
        let reached = store.snapshot_recent().and_then(|snap| {
            snap.get(KEY_CL_LAST)?
                .map(|bytes| calm_store::decode_counter(KEY_CL_LAST, &bytes))
                .transpose()
        });
        drop(store);
        match reached {
            Ok(Some(reached)) => {
                last_index.publish(reached);
                last_index.wake_followers();
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "following the store's commits"),
        }
    }
}

/// Writes the superblock and the root directory of an empty store.
/// 16 bytes no other namespace has: the standard library's per-process random hash keys
/// (seeded by the operating system), over the time and the process id.
pub(crate) fn random_id() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut id = [0u8; 16];
    for half in id.chunks_mut(8) {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_i64(commit::now_ns());
        hasher.write_u32(std::process::id());
        half.copy_from_slice(&hasher.finish().to_le_bytes());
    }
    id
}

/// A store formatted at a `place` takes its cluster's ranges of handles and slice ids, and
/// cluster 0's name hash key and identity when given.
fn format_store<T: WriteTxn>(txn: &mut T, place: Option<&place::Place>) -> Result<()> {
    let now = commit::now_ns();
    txn.put(KEY_FORMAT, &format_value())?;
    let namespace = place.and_then(|p| p.namespace);
    match namespace {
        Some(keys) => {
            txn.put(KEY_NAME_HASH, &keys.name_key)?;
            txn.put(KEY_NAMESPACE_ID, &keys.id)?;
        }
        None => txn.put(KEY_NAME_HASH, &random_id())?,
    }
    // Handle 0 is never used and 1 is the root: the first allocation starts at 2 (or at the
    // first handle of the store's cluster).
    let first = place.map_or(ROOT + 1, place::Place::first_handle);
    txn.put(KEY_HWM, &first.to_le_bytes())?;
    if let Some(place) = place {
        txn.put(KEY_PLACE, &place.encode())?;
        if place.first_slice_id() > 0 {
            txn.put(KEY_SLICE_NEXT, &place.first_slice_id().to_le_bytes())?;
        }
    }
    let root = Inode {
        handle: ROOT,
        kind: Kind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        generation: 1,
        size: 0,
        rdev: 0,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        parent: ROOT,
        entries: 0,
        target: Vec::new(),
    };
    txn.put(&inode_key(ROOT), &root.encode())?;
    txn.add(KEY_INODES, 1)?;
    txn.add(KEY_FILE_BYTES, 0)?;
    Ok(())
}

/// Up to `limit` (at most [`READDIR_ENTRIES_MAX`]) entries of directory `dir` after cookie
/// `after_cookie`, on `snap`: in hash order, each with its cookie (see [`layout::NameHash`]).
fn readdir_entries<R: ReadTxn>(
    snap: &R,
    dir: Handle,
    after_cookie: u64,
    limit: usize,
) -> Result<Vec<DirEntry>> {
    let limit = limit.min(READDIR_ENTRIES_MAX);
    let mut entries: Vec<DirEntry> = Vec::with_capacity(limit.min(256));
    if limit == 0 {
        return Ok(entries);
    }
    let (from_hash, skip) = layout::cookie_position(after_cookie);
    let (_, end) = layout::entries_range(dir);
    let start = layout::entries_from(dir, from_hash);
    // The hash of the last name visited and its rank among the names sharing that hash.
    let mut group: Option<(u64, u64)> = None;
    let mut corrupt = None;
    snap.visit(&start, &end, &mut |key, value| {
        let Some((_, hash, name)) = layout::entry_key_parts(key) else {
            corrupt = Some(MetaError::Corrupt(format!(
                "directory {dir}: name key of {} bytes",
                key.len()
            )));
            return ControlFlow::Break(());
        };
        let rank = match group {
            Some((last, rank)) if last == hash => rank + 1,
            _ => 0,
        };
        group = Some((hash, rank));
        if hash == from_hash && rank < skip {
            return ControlFlow::Continue(());
        }
        // A page never ends among names that share the last cookie of their hash (256 names
        // with one hash: never by chance), or resuming would return them again and again.
        let shares_cookie = rank >= layout::COOKIE_GROUP_NAMES;
        if entries.len() >= limit && !shares_cookie {
            return ControlFlow::Break(());
        }
        match Dentry::decode(value) {
            Ok(dentry) => entries.push(DirEntry {
                name: name.to_vec(),
                handle: dentry.child,
                kind: dentry.kind,
                cookie: layout::cookie_of(hash, rank),
            }),
            Err(error) => {
                corrupt = Some(error);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    match corrupt {
        Some(error) => Err(error),
        None => Ok(entries),
    }
}
