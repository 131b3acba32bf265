//! The FUSE file system: inode numbers are calm handles (the root is handle 1, FUSE's root
//! inode), every namespace operation is one metadata RPC, file contents go through
//! [`crate::contents::Contents`] to the namespace's shared object store.
//!
//! Sizes and times: a write is buffered and marks the file dirty; it reaches the object store
//! and then the metadata server (records, size and mtime in one commit) at flush (every
//! close), fsync, unlock, release and before any other attribute change, and `getattr` of a
//! dirty file answers with the size its pending writes give it. Other mounts see the new
//! bytes when the writer closes the file and they open it (close-to-open consistency, as NFS),
//! and a lock holder sees what the previous holder wrote (the pages are dropped when a lock is
//! granted, and a holder commits before it unlocks).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use calm_client::Client;
use calm_locks::{LockKind, Range, Scope};
use calm_types::{Attr, Kind, MetaError, NewNode, SetAttr};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, RequestId, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle as Runtime;

use crate::contents::Contents;
use crate::convert::{
    IntoErrno, Refusable, errno, file_attr, file_type, lock_kind, lock_range, node_errno,
    plain_attr, set_time, statvfs, xattr_reply,
};
use crate::locks::LockForwarder;
use crate::shared::{Shared, State};

/// Every byte of a file, as a lock range.
const WHOLE: Range = Range {
    start: 0,
    end: calm_locks::OFFSET_MAX,
};

mod attrs;
mod data;
mod locks;
mod names;
mod options;

pub use options::{
    APPEND_WHOLE_BYTES_MAX, Channel, FUSE_THREADS, FUSE_THREADS_MAX, MountOptions,
    READAHEAD_BYTES_MAX, READDIR_BATCH, TTL_DEFAULT, WRITE_BYTES_MAX, default_cache_dir,
    mount_config,
};

/// A calm mount.
#[derive(Debug)]
pub struct CalmFs {
    shared: Arc<Shared>,
    runtime: Runtime,
}

impl CalmFs {
    /// A mount over `client`, answering requests on `runtime`.
    pub fn new(
        client: Client,
        locks: Arc<LockForwarder>,
        objects: calm_data::Objects,
        options: &MountOptions,
        runtime: Runtime,
    ) -> std::io::Result<CalmFs> {
        let registry = options.metrics.clone().unwrap_or_default();
        let metrics = crate::metrics::MountMetrics::new(registry, options.count_requests)
            .map_err(std::io::Error::other)?;
        let client = crate::local::outbox_client(client, options.hold_files, &runtime);
        let shared = Arc::new(Shared {
            client,
            contents: Contents::new(
                objects,
                options.write_buffer_bytes,
                options.inline_bytes_max,
            ),
            locks,
            state: Mutex::new(State::default()),
            released: tokio::sync::Notify::new(),
            groups: crate::groups::CallerGroups::default(),
            jobs: crate::jobs::CallerJobs::new(options.job_variable.as_deref()),
            cache: crate::cache::Coherence::new(options.ttl),
            shm: crate::shm::SharedMemoryFiles::default(),
            append_through_cache: options.append_through_cache,
            metrics,
            waiting: Arc::default(),
            holding: crate::holding::Holding::default(),
            hold_files: options.hold_files,
            copies: crate::copies::Copies::default(),
            stream_session: Default::default(),
            keep_copies: options.keep_copies,
            returns: Mutex::default(),
            returns_queued: Arc::default(),
            returns_wanted: Arc::default(),
            dirs: crate::dirs::Dirs::default(),
            handles_wanted: Arc::default(),
        });
        let figures = Arc::downgrade(&shared);
        shared
            .metrics
            .scrape(move || figures.upgrade().map(|s| s.figures()).unwrap_or_default())
            .map_err(std::io::Error::other)?;
        runtime.spawn(Shared::claim_orphans(
            Arc::downgrade(&shared),
            shared.locks.clone(),
        ));
        runtime.spawn(Shared::follow_lost(
            Arc::downgrade(&shared),
            shared.locks.clone(),
        ));
        if options.hold_files || options.keep_copies {
            runtime.spawn(Shared::follow_recalls(Arc::downgrade(&shared)));
            runtime.spawn(Shared::send_returns(Arc::downgrade(&shared)));
            runtime.spawn(Shared::keep_handles(Arc::downgrade(&shared)));
        }
        runtime.spawn(Shared::keep_writing_behind(Arc::downgrade(&shared)));
        Ok(CalmFs { shared, runtime })
    }

    /// The part request tasks share (the mount starts its cache once the session exists).
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Runs a request's task: first here, on the FUSE reader thread, as far as it goes
    /// without waiting (an answer from memory or from a snapshot of the store in this process
    /// costs no thread switch); what is left waits on the runtime. A task polled once with a
    /// no-op waker and then spawned is polled again at once, registering its real waker.
    ///
    /// A task that waits is noted with its caller while it runs, so that an interrupt of
    /// `req` finds it ([`crate::interrupts`]).
    fn spawn(
        &self,
        req: &Request,
        interrupter: fuser::ReplyInterrupted,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let mut task = Box::pin(task);
        let _runtime = self.runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_pending() {
            let (unique, waiting) = (req.unique().0, self.shared.waiting.clone());
            let cache = self.shared.cache.clone();
            waiting.begin(unique, req.pid(), interrupter);
            self.runtime.spawn(async move {
                task.await;
                if waiting.answered_early(unique) {
                    cache.kernel_missed_a_change();
                }
                waiting.end(unique);
            });
        }
    }

    /// The shape of most requests: runs `task` (see [`CalmFs::spawn`]) and answers `reply`
    /// with `ok` of its value, or with its error's errno.
    fn answer<R: Refusable, T: 'static, E: IntoErrno>(
        &self,
        req: &Request,
        reply: R,
        task: impl Future<Output = Result<T, E>> + Send + 'static,
        ok: impl FnOnce(R, T) + Send + 'static,
    ) {
        let interrupter = reply.interrupter();
        self.spawn(req, interrupter, async move {
            match task.await {
                Ok(value) => ok(reply, value),
                Err(e) => reply.refuse(e.into_errno()),
            }
        });
    }

    /// Answers an entry request with what `task` found; the kernel holds the inode once
    /// more (see [`crate::cache`]).
    fn entry_task(
        &self,
        req: &Request,
        reply: ReplyEntry,
        task: impl Future<Output = Result<Attr, Errno>> + Send + 'static,
    ) {
        let shared = self.shared.clone();
        let ticket = shared.cache.ticket();
        self.answer(req, reply, task, move |reply, attr| {
            send_entry(&shared, ticket, reply, attr)
        });
    }

    /// Creates a node that is not a regular file (those come with an open: `create`).
    fn make_entry(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        node: NewNode,
        reply: ReplyEntry,
    ) {
        let shared = self.shared.clone();
        self.entry_in_dir(req, parent, name, reply, move |client, name| async move {
            shared.make_node(&client, parent.0, &name, &node).await
        });
    }

    /// Answers an entry request with the node `call` made or linked as `name` in `parent`;
    /// the directory's attributes the server answered with are kept when still current.
    fn entry_in_dir<F>(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEntry,
        call: impl FnOnce(Client, Vec<u8>) -> F + Send + 'static,
    ) where
        F: Future<Output = Result<(Attr, Option<Attr>), MetaError>> + Send + 'static,
    {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let name = name.as_bytes().to_vec();
        shared.cache.changed_here(parent.0);
        let ticket = shared.cache.ticket();
        self.entry_task(req, reply, async move {
            let made = call(client, name.clone()).await;
            let outcome = crate::listings::Outcome::of_make(&made);
            shared.cache.name_added_here(parent.0, &name, outcome);
            let (attr, dir) = made.map_err(|e| errno(&e))?;
            if let Some(dir) = dir {
                shared.cache.dir_changed(ticket, dir);
            }
            if attr.kind == Kind::Dir {
                // A directory made here is empty: its names are known from now.
                shared.cache.made_dir_here(ticket, attr.handle);
            }
            Ok(attr)
        });
    }

    fn empty_task(
        &self,
        req: &Request,
        reply: ReplyEmpty,
        task: impl Future<Output = Result<(), Errno>> + Send + 'static,
    ) {
        self.answer(req, reply, task, |reply, ()| reply.ok());
    }
}

impl Filesystem for CalmFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // fcntl and flock locks come to us (and so to the lock manager) instead of staying in
        // this kernel.
        if let Err(missing) =
            config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS)
        {
            tracing::warn!(?missing, "the kernel does not forward these lock kinds");
        }
        // A read asks for fresh attributes once they expired (or were dropped because another
        // mount changed the file), and drops the pages when the size or mtime changed: without
        // it, a read inside the size the kernel last knew would serve stale pages and size.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA) {
            tracing::warn!(?missing, "the kernel does not refresh attributes on read");
        }
        // The server drops setuid, setgid and file capabilities on write, truncate and chown
        // (calm-meta's perm and ops): the kernel need not ask for it. (It still asks whether a
        // file has capabilities before a write whenever it fetched the file's attributes since
        // the last: the mount answers that itself, `cache::Coherence::lacks`.)
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
            tracing::warn!(
                ?missing,
                "the kernel drops file privileges on writes itself"
            );
        }
        // POSIX ACLs: the kernel checks them beside the mode bits (the server decides again)
        // and keeps them with its inodes, dropping them when the mount invalidates an inode;
        // it passes a new node's mode and umask apart, and the mount sends the server both
        // the mode less the umask and the mode as asked for (a directory's default ACL stands
        // in for the umask; a server that knows no ACL takes the first).
        if let Err(missing) =
            config.add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
        {
            tracing::warn!(?missing, "the kernel does not pass POSIX ACLs through");
        }
        // Listings come with their entries' attributes when the kernel sees they will be
        // looked up (`ls -l`, a tree walk): one request instead of one lookup per name.
        let plus = InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        if let Err(missing) = config.add_capabilities(plus) {
            tracing::warn!(?missing, "the kernel lists directories without attributes");
        }
        // Files opened with O_APPEND use direct I/O (`fs::data::append_direct`): they may
        // still be mapped into memory.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
            tracing::warn!(?missing, "files opened for appending cannot be mapped");
        }
        // Large requests: a sequential stream costs fewer round trips through the kernel
        // (the object store's blocks are 4 MiB).
        if let Err(max) = config.set_max_write(WRITE_BYTES_MAX) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(READAHEAD_BYTES_MAX) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.handle_lookup(req, parent, name, reply)
    }

    // (fuser's batch_forget calls this for each inode.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if self.shared.cache.forget(ino.0, nlookup) {
            // The kernel's pages of it went with its inode: nothing left to keep them for.
            if self.shared.contents.forgotten(ino.0) {
                self.shared.drop_copy(ino.0);
            }
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.handle_getattr(req, ino, reply)
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.handle_setattr(req, ino, mode, uid, gid, size, atime, mtime, ctime, reply)
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.handle_readlink(req, ino, reply)
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.handle_mknod(req, parent, name, mode, umask, rdev, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.handle_mkdir(req, parent, name, mode, umask, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.handle_symlink(req, parent, link_name, target, reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.handle_create(req, parent, name, mode, umask, flags, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.handle_link(req, ino, newparent, newname, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.handle_unlink(req, parent, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.handle_rmdir(req, parent, name, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.handle_rename(req, parent, name, newparent, newname, flags, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.handle_open(req, ino, flags, reply)
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.handle_read(req, ino, fh, offset, size, reply)
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.drop_privileges(req, ino, fh);
        }
        self.handle_write(req, ino, fh, offset, data, reply)
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.handle_flush(req, ino, fh, lock_owner, reply)
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handle_release(req, ino, fh, reply)
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.handle_fsync(req, ino, fh, reply)
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.handle_fallocate(req, ino, fh, offset, length, mode, reply)
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // While the mount follows the server's changes the kernel keeps a directory's listing
        // across opens: another client's change of its entries changes its mtime, whose
        // invalidation (`cache::plan`) makes the kernel list it again; its own changes it
        // notes itself.
        let flags = match self.shared.cache.follows() {
            true => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            false => FopenFlags::empty(),
        };
        reply.opened(FileHandle(0), flags)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.handle_readdir(req, ino, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.handle_readdirplus(req, ino, offset, reply)
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.handle_statfs(req, reply)
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.handle_setxattr(req, ino, name, value, flags, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.handle_getxattr(req, ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.handle_listxattr(req, ino, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.handle_removexattr(req, ino, name, reply)
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        self.handle_getlk(req, ino, lock_owner, start, end, typ, reply)
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        self.handle_setlk(
            req, ino, fh, lock_owner, start, end, typ, pid, sleep, flock, reply,
        )
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // No ioctl is defined on calm files (what a regular file answers on most file systems).
        reply.error(Errno::ENOTTY);
    }

    fn fsyncdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every change the server answered, this directory's names with them, on its disk.
        let (shared, client) = (self.shared.clone(), self.shared.caller(req));
        self.empty_task(req, reply, async move { shared.sync_all(&client).await });
    }

    fn interrupt(&self, _req: &Request, unique: RequestId) {
        // A lock wait ends with EINTR on any signal (F_SETLKW), cancelled at the server, or
        // answered here when the server does not confirm the cancel (a later grant goes back).
        let (locks, waiting) = (self.shared.locks.clone(), self.shared.waiting.clone());
        self.runtime.spawn(async move {
            if !locks.interrupt(unique.0).await {
                waiting.answer_early(unique.0);
            }
        });
        // Any request that waits: a caller being killed is let go at once.
        self.runtime.spawn(crate::interrupts::let_go_when_killed(
            self.shared.waiting.clone(),
            unique.0,
        ));
    }
}

/// Answers an entry request with `attr` (as this mount sees it); the kernel holds the inode
/// once more, for the TTL a request begun at `ticket` may carry (see [`crate::cache`]).
fn send_entry(shared: &Shared, ticket: crate::cache::Ticket, reply: ReplyEntry, attr: Attr) {
    let attr = shared.local_view(attr);
    let ttl = shared.cache.entered(ticket, attr.handle);
    reply.entry(&ttl, &file_attr(&attr), Generation(attr.generation))
}
