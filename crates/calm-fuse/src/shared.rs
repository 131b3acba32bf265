//! What a mount knows beside the server, shared by every request task: its open files, the
//! last attributes seen, lock owners, releases in progress and unlinked files it keeps open.

use calm_types::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use calm_client::Client;
use calm_types::{Attr, Caller, Handle, Kind};
use fuser::{Errno, FileHandle, INodeNo, Request};

use calm_metrics::{counter_family, gauge_family};

use crate::contents::Contents;
use crate::locks::LockForwarder;

/// A file this mount has open.
#[derive(Debug)]
pub(crate) struct OpenFile {
    /// A regular file (its contents go through [`Contents`]).
    pub(crate) is_file: bool,
    /// Opened with O_APPEND: every write goes to the end of the file as the server sees it.
    pub(crate) append: bool,
    /// Opened for writing (no open of the file is answered from a copy meanwhile).
    pub(crate) writable: bool,
    /// Lock owners that locked through this open file: their locks on the file end with it.
    pub(crate) owners: Mutex<HashSet<u64>>,
    /// Who opened it for writing: who commits its writes when they waited long
    /// (`crate::behind`).
    pub(crate) writer: Option<Client>,
}

/// What this mount knows of a file beyond the server.
#[derive(Debug, Default)]
pub(crate) struct Inode {
    /// This mount's open files of it.
    pub(crate) files: Vec<Arc<OpenFile>>,
    /// The last attributes seen (for an unlinked file still open).
    pub(crate) attr: Option<Attr>,
    /// Owners of POSIX locks taken here (released by the flush of a close).
    pub(crate) lock_owners: HashSet<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) inodes: HashMap<Handle, Inode>,
    pub(crate) files: HashMap<u64, Arc<OpenFile>>,
    pub(crate) next_fh: u64,
    /// Releases whose locks are still being given back, per file. The kernel sends a release
    /// without waiting for it (after close(2) has returned), so a lock request that follows a
    /// close waits for these first: it must not overtake the release of the closed file's
    /// OFD or flock lock.
    pub(crate) releasing: HashMap<Handle, u32>,
    /// Files that lost their last name while open here: the server keeps them (orphans of
    /// this mount's session) until their last close here.
    pub(crate) orphans: HashSet<Handle>,
    /// Lock owners whose locks on a file were lost (the server restarted and did not give them
    /// back): every read, write, fsync and lock request through an open file they locked
    /// through answers EIO, until it is closed.
    pub(crate) lost: HashMap<Handle, HashSet<u64>>,
}

impl State {
    /// Of `owners`, those that locked through `file` (of `handle`, being released), the ones
    /// whose locks end with it: not one that has locked since through another open file of
    /// the same inode. That owner is a process (POSIX locks are the process's, and the flush of
    /// its close gave back what it held then) or an open file at the address of the closed one;
    /// its later lock must outlive this release, which over FUSE over io_uring can reach the
    /// mount after that lock request (the kernel sends a release without waiting for it).
    pub(crate) fn owners_ending_with(
        &self,
        handle: Handle,
        file: &Arc<OpenFile>,
        mut owners: Vec<u64>,
    ) -> Vec<u64> {
        let Some(inode) = self.inodes.get(&handle) else {
            return owners;
        };
        let others: Vec<&Arc<OpenFile>> = inode
            .files
            .iter()
            .filter(|other| !Arc::ptr_eq(other, file))
            .collect();
        owners.retain(|owner| !others.iter().any(|o| o.owners.locked().contains(owner)));
        owners
    }

    /// Whether this mount has `handle` open.
    pub(crate) fn is_open(&self, handle: Handle) -> bool {
        self.inodes
            .get(&handle)
            .is_some_and(|i| !i.files.is_empty())
    }
}

/// Open files named in an unlink or rename so that the server keeps the one that loses its
/// last name; past it, the name is looked up first and only its file is named.
pub const KEEP_HANDLES_MAX: usize = 4096;

/// The shared part, which request tasks hold.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) contents: Contents,
    pub(crate) locks: Arc<LockForwarder>,
    pub(crate) state: Mutex<State>,
    /// Signalled when a release has given back its locks.
    pub(crate) released: tokio::sync::Notify,
    /// The supplementary groups of the processes calling.
    pub(crate) groups: crate::groups::CallerGroups,
    /// The jobs of the processes calling (when the mount sends them).
    pub(crate) jobs: crate::jobs::CallerJobs,
    /// What the kernel holds, and the TTL of each reply.
    pub(crate) cache: Arc<crate::cache::Coherence>,
    /// sqlite's shared-memory files, which another mount may not use at the same time.
    pub(crate) shm: crate::shm::SharedMemoryFiles,
    /// `MountOptions::append_through_cache`.
    pub(crate) append_through_cache: bool,
    /// The mount's counters (the FUSE session reports each reply to them).
    pub(crate) metrics: Arc<crate::metrics::MountMetrics>,
    /// Requests that wait, with their callers (an interrupt of one finds it).
    pub(crate) waiting: Arc<crate::interrupts::Waiting>,
    /// The files this mount holds (`crate::holding`).
    pub(crate) holding: crate::holding::Holding,
    /// `MountOptions::hold_files`.
    pub(crate) hold_files: bool,
    /// The copies this mount keeps (`crate::copies`).
    pub(crate) copies: crate::copies::Copies,
    /// The lock session the stream of recalls was last opened for (0: none yet): what the
    /// mount gives back, it gives back as that session.
    pub(crate) stream_session: std::sync::atomic::AtomicU64,
    /// `MountOptions::keep_copies`.
    pub(crate) keep_copies: bool,
    /// Files held with nothing kept, and copies, to be given back together (`crate::recalls`).
    pub(crate) returns: Mutex<crate::holding::Returns>,
    /// Something was queued in `returns`.
    pub(crate) returns_queued: Arc<tokio::sync::Notify>,
    /// Something queued in `returns` is waited for (asked back by the server): sent at once,
    /// not gathered with what later closes give back.
    pub(crate) returns_wanted: Arc<tokio::sync::Notify>,
    /// The directories this mount holds, and its handles granted in advance (`crate::dirs`).
    pub(crate) dirs: crate::dirs::Dirs,
    /// Handles granted in advance were used (`crate::local`).
    pub(crate) handles_wanted: Arc<tokio::sync::Notify>,
}

impl Shared {
    /// The mount's state, also after a request task panicked while holding it (the state is
    /// kept consistent between awaits, and a panic never leaves it half-changed).
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Files and directories this mount has open.
    pub(crate) fn open_files(&self) -> usize {
        self.state().files.len()
    }

    /// What the mount holds, as Prometheus is shown it at each scrape: invalidations, writes
    /// buffered, caches, open files, the object store's requests.
    pub(crate) fn figures(&self) -> Vec<calm_metrics::MetricFamily> {
        let cache = self.cache.stats();
        let (buffered, buffer_max) = self.contents.buffered();
        let (blocks, headers) = self.contents.objects().cached_bytes();
        let objects = self.contents.objects().meter().families("mount");
        let mut families = vec![
            counter_family(
                "calm_mount_invalidations_total",
                "Names, attributes and pages the mount told the kernel to forget because another client changed them.",
                &[(&[], cache.invalidations as f64)],
            ),
            counter_family(
                "calm_mount_cache_drops_total",
                "Times the mount dropped the kernel's whole cache (it fell behind the server's changes, or lost their stream).",
                &[(&[], cache.dropped_all as f64)],
            ),
            gauge_family(
                "calm_mount_buffered_bytes",
                "Bytes written to the mount and not committed yet.",
                &[(&[], buffered as f64)],
            ),
            gauge_family(
                "calm_mount_buffered_max_bytes",
                "Most bytes the mount buffers before a write waits (--write-buffer-mib).",
                &[(&[], buffer_max as f64)],
            ),
            gauge_family(
                "calm_mount_block_cache_bytes",
                "Bytes kept in memory of a remote object store: whole blocks, and verified block headers.",
                &[
                    (&[("kind", "blocks")], blocks as f64),
                    (&[("kind", "headers")], headers as f64),
                ],
            ),
            counter_family(
                "calm_mount_server_moves_total",
                "Times the mount moved to another server of its namespace because the one in use stopped answering.",
                &[(&[], self.client.server_moves() as f64)],
            ),
            gauge_family(
                "calm_mount_open_files",
                "Files and directories the mount has open.",
                &[(&[], self.open_files() as f64)],
            ),
        ];
        families.extend(self.holding_figures());
        families.extend(objects);
        families
    }

    /// What the mount holds and answers itself: copies, held files' kept changes, held
    /// directories and the makes and removals answered in them.
    fn holding_figures(&self) -> Vec<calm_metrics::MetricFamily> {
        let mut families = vec![
            gauge_family(
                "calm_mount_copies",
                "Files whose opens the mount answers itself (the server asks for the copy back before another client's change of the file is answered).",
                &[(&[], self.copies.count() as f64)],
            ),
            counter_family(
                "calm_mount_kept_changes_total",
                "Changes of files the mount holds (mode, owner, times, size) answered by the mount, sent at their close, fsync or recall.",
                &[
                    (&[("kind", "all")], self.holding.kept_count().0 as f64),
                    (&[("kind", "size")], self.holding.kept_count().1 as f64),
                ],
            ),
            counter_family(
                "calm_mount_opens_from_copies_total",
                "Opens the mount answered from its copy of the file, without asking the server.",
                &[(&[], self.copies.opens_answered() as f64)],
            ),
            gauge_family(
                "calm_mount_may_hold",
                "1 while the mount may hold files and directories (it follows the server's changes and its stream of recalls is open), else 0.",
                &[(
                    &[],
                    f64::from(u8::from(self.holding.may_ask() && self.cache.follows())),
                )],
            ),
            gauge_family(
                "calm_mount_held_dirs",
                "Directories whose makes and removals the mount answers itself, sending them after.",
                &[(&[], self.dirs.count() as f64)],
            ),
        ];
        if let Some(outbox) = self.client.outbox() {
            let (queued, sent, batches, refused) = outbox.figures();
            families.push(counter_family(
                "calm_mount_answered_here_total",
                "Makes and removals the mount answered itself, in directories it holds.",
                &[(&[], queued as f64)],
            ));
            families.push(counter_family(
                "calm_mount_answered_here_sent_total",
                "Of those, the ones sent to the server, in ordered batches, and the ones it refused.",
                &[
                    (&[("kind", "sent")], sent as f64),
                    (&[("kind", "batches")], batches as f64),
                    (&[("kind", "refused")], refused as f64),
                ],
            ));
        }
        families
    }

    /// The client acting for the process behind `req`: its uid, gid and supplementary groups
    /// (the server decides what it may do).
    pub(crate) fn caller(&self, req: &Request) -> Client {
        self.client
            .with_caller(Caller {
                session: self.locks.session(),
                uid: req.uid(),
                gid: req.gid(),
                groups: self.groups.of(req.pid()),
            })
            .with_job(self.jobs.of(req.pid()))
    }

    /// The regular files open here that the server must keep if `parent/name` is the last
    /// name of one of them (see [`State::orphans`]).
    pub(crate) async fn keep_for(
        &self,
        client: &Client,
        parent: Handle,
        name: &[u8],
    ) -> Vec<Handle> {
        let open: Vec<Handle> = {
            let state = self.state();
            state
                .inodes
                .iter()
                .filter(|(_, i)| i.files.iter().any(|f| f.is_file))
                .map(|(h, _)| *h)
                .take(KEEP_HANDLES_MAX + 1)
                .collect()
        };
        if open.len() <= KEEP_HANDLES_MAX {
            return open;
        }
        match client.lookup(parent, name).await {
            Ok(attr) if self.is_open(attr.handle) => vec![attr.handle],
            _ => Vec::new(),
        }
    }

    pub(crate) fn is_open(&self, handle: Handle) -> bool {
        self.state().is_open(handle)
    }

    /// The server kept `orphan` for this mount: remember it until its last close here, or
    /// release it now if that close came first.
    pub(crate) async fn kept(&self, client: &Client, orphan: Option<Handle>) {
        let Some(handle) = orphan else {
            return;
        };
        let closed = {
            let mut state = self.state();
            let open = state.is_open(handle);
            if open {
                state.orphans.insert(handle);
            }
            !open
        };
        if closed {
            self.release_orphan(client, handle).await;
        }
    }

    pub(crate) async fn release_orphan(&self, client: &Client, handle: Handle) {
        if let Err(e) = client.release_orphan(handle).await {
            // The server destroys it when this mount's session ends.
            tracing::warn!(handle, %e, "releasing an unlinked file");
        }
    }

    /// Whether the open file `fh` of `handle` was locked through by an owner whose lock on it
    /// was lost.
    pub(crate) fn lock_lost(&self, handle: Handle, fh: u64) -> bool {
        let state = self.state();
        let Some(lost) = state.lost.get(&handle) else {
            return false;
        };
        state
            .files
            .get(&fh)
            .is_some_and(|file| file.owners.locked().iter().any(|o| lost.contains(o)))
    }

    /// Whether a lock of any process on `handle` was lost here (and not settled since, or not
    /// even noted yet).
    pub(crate) fn any_lock_lost(&self, handle: Handle) -> bool {
        self.locks.lost_untaken(handle)
            || self
                .state()
                .lost
                .get(&handle)
                .is_some_and(|l| !l.is_empty())
    }

    /// Follows the locks the mount loses: their files are marked, and their writes not
    /// committed yet dropped (made under a lock another process may hold now), their writers
    /// told.
    pub(crate) async fn follow_lost(shared: std::sync::Weak<Shared>, locks: Arc<LockForwarder>) {
        loop {
            locks.lost_changed().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            // Taken under the state's lock: a lost lock is never in neither place
            // (`Shared::any_lock_lost`).
            let files: HashSet<Handle> = {
                let mut state = shared.state();
                let lost = locks.take_lost();
                let files = lost.iter().map(|(handle, _)| *handle).collect();
                for (handle, owner) in lost {
                    state.lost.entry(handle).or_default().insert(owner);
                }
                files
            };
            for handle in files {
                tracing::warn!(handle, "a lock on the file was lost: its holders are told");
                shared.contents.lose(handle).await;
            }
        }
    }

    /// After the lock session was replaced (the server restarted, or the lease was lost), the
    /// new session claims this mount's orphans.
    pub(crate) async fn claim_orphans(shared: std::sync::Weak<Shared>, locks: Arc<LockForwarder>) {
        loop {
            locks.replaced().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            shared.claim_for_new_session().await;
        }
    }

    pub(crate) async fn claim_for_new_session(&self) {
        let handles: Vec<Handle> = {
            let state = self.state();
            state.orphans.iter().copied().collect()
        };
        if handles.is_empty() {
            return;
        }
        let client = self.client.with_caller(Caller {
            session: self.locks.session(),
            ..Caller::default()
        });
        if let Err(e) = client.claim_orphans(handles).await {
            tracing::warn!(%e, "claiming unlinked open files for the new session");
        }
    }

    /// `attr` as this mount sees it: the changes it kept of a file it holds, a dirty file's
    /// size counting its pending writes, and its mode the privileges they dropped.
    pub(crate) fn local_view(&self, mut attr: Attr) -> Attr {
        self.holding.local_view(&mut attr);
        if let Some(size) = self.contents.dirty_size(attr.handle) {
            attr.size = attr.size.max(size);
            attr.mode = self.contents.pending_mode(attr.handle, attr.mode);
        }
        let mut state = self.state();
        if let Some(inode) = state.inodes.get_mut(&attr.handle) {
            inode.attr = Some(attr.clone());
        }
        attr
    }

    /// The write `req` makes to `handle` drops the file's setuid and setgid ([`Contents::
    /// drop_privileges`]): whether the writer is in the file's group decides setgid.
    pub(crate) fn drop_privileges(&self, req: &Request, handle: Handle) {
        let gid = self
            .state()
            .inodes
            .get(&handle)
            .and_then(|inode| inode.attr.as_ref().map(|attr| attr.gid));
        let in_group =
            gid.is_some_and(|gid| req.gid() == gid || self.groups.of(req.pid()).contains(gid));
        self.contents.drop_privileges(handle, in_group);
    }

    /// Commits a file's pending writes (records, size and mtime) to the server, for the open
    /// file `fh` when the caller has one (which is told, too, what a refused commit dropped of
    /// what it wrote); with `sync`, durable objects first.
    pub(crate) async fn push_as(
        &self,
        client: &Client,
        handle: Handle,
        fh: Option<u64>,
        sync: bool,
    ) -> Result<(), Errno> {
        // A lock on the file this mount may have lost is found out before the writes land.
        self.locks.confirm(handle).await;
        if let Some(fh) = fh
            && self.lock_lost(handle, fh)
        {
            return Err(Errno::EIO);
        }
        self.contents
            .commit(client, handle, sync, fh)
            .await
            .map_err(Errno::from_i32)
    }

    /// [`Shared::push_as`] without making objects durable (a close, an unlock, a truncate).
    pub(crate) async fn push(
        &self,
        client: &Client,
        handle: Handle,
        fh: Option<u64>,
    ) -> Result<(), Errno> {
        self.push_as(client, handle, fh, false).await
    }

    /// Drops the kernel's pages and attributes of `handle` (another mount may have changed
    /// it). On a thread of its own: the kernel waits for the file's pages that are locked,
    /// some by reads and writes this mount's runtime has yet to answer.
    pub(crate) async fn drop_kernel_cache(&self, handle: Handle) {
        let Some(notifier) = self.cache.notifier() else {
            return;
        };
        let dropped =
            tokio::task::spawn_blocking(move || notifier.inval_inode(INodeNo(handle), 0, 0)).await;
        match dropped {
            Ok(Err(e)) if e.raw_os_error() != Some(libc::ENOENT) => {
                tracing::warn!(handle, %e, "dropping the kernel's cache of a file");
            }
            Err(e) => tracing::warn!(handle, %e, "dropping the kernel's cache of a file"),
            _ => {}
        }
    }

    /// Waits until no release of `handle` is still giving back locks.
    pub(crate) async fn after_releases(&self, handle: Handle) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.state().releasing.contains_key(&handle) {
                return;
            }
            released.await;
        }
    }

    pub(crate) fn open_file(&self, attr: &Attr, flags: i32, opener: &Client) -> Result<u64, Errno> {
        let mut state = self.state();
        state.next_fh += 1;
        let fh = state.next_fh;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let file = Arc::new(OpenFile {
            is_file: attr.kind == Kind::File,
            append: flags & libc::O_APPEND != 0,
            writable,
            owners: Mutex::new(HashSet::new()),
            writer: writable.then(|| opener.clone()),
        });
        state.files.insert(fh, file.clone());
        if file.is_file {
            self.contents.opened_as(fh);
        }
        let inode = state.inodes.entry(attr.handle).or_default();
        inode.files.push(file);
        inode.attr = Some(attr.clone());
        Ok(fh)
    }

    /// Who opened `handle` for writing here, the first of them (`None`: nobody).
    pub(crate) fn writer_of(&self, handle: Handle) -> Option<Client> {
        let state = self.state();
        let files = &state.inodes.get(&handle)?.files;
        files.iter().find_map(|f| f.writer.clone())
    }

    /// Whether this mount has `handle` open for writing.
    pub(crate) fn has_writers(&self, handle: Handle) -> bool {
        self.state()
            .inodes
            .get(&handle)
            .is_some_and(|inode| inode.files.iter().any(|f| f.writable))
    }

    pub(crate) fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.state().files.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_file(owners: &[u64]) -> Arc<OpenFile> {
        Arc::new(OpenFile {
            is_file: true,
            append: false,
            writable: true,
            owners: Mutex::new(owners.iter().copied().collect()),
            writer: None,
        })
    }

    #[test]
    fn a_release_keeps_the_locks_of_an_owner_that_locked_since_through_another_open_file() {
        let (old, new) = (open_file(&[7, 9]), open_file(&[7]));
        let mut state = State::default();
        state.inodes.entry(5).or_default().files = vec![old.clone(), new];
        // Owner 7 (a process) locked again through the new open file before the old one's
        // release came: only owner 9's locks end with the old file.
        assert_eq!(state.owners_ending_with(5, &old, vec![7, 9]), vec![9]);
        // Another file's open files do not count.
        assert_eq!(state.owners_ending_with(6, &old, vec![7, 9]), vec![7, 9]);
        // Alone, the old file's owners all end with it.
        state.inodes.get_mut(&5).expect("inode").files = vec![old.clone()];
        assert_eq!(state.owners_ending_with(5, &old, vec![7, 9]), vec![7, 9]);
    }
}
