//! The kernel's cache of this mount, kept exact: names and attributes are given to the kernel
//! for long (`--ttl-ms`, a minute by default) because the mount follows every change of the
//! namespace (a watch of everything, `calm.v1.Watch` with `all`) and tells the kernel to drop
//! what another client changed (FUSE notify_inval_entry and notify_inval_inode), on a thread
//! of its own, about a millisecond after the change committed. The rules and their reasons:
//! `docs/design/mount.md`, "Caches".
//!
//! - [`plan`] (pure): what a change makes stale: entries (parent, name), attributes, or
//!   attributes and pages.
//! - [`Coherence`]: what the kernel holds (lookup counts, from entry replies and forgets), the
//!   TTL each reply may carry, and the invalidations themselves.
//! - [`follow`]: the task that reads the watch and hands the invalidations over; a stream that
//!   falls behind (resync) or breaks drops the kernel's whole cache.
//!
//! Races, and why none leaves a stale entry behind:
//! - An entry: the kernel holds a directory's lock (shared) while it looks a name up in it and
//!   installs the answer, and an entry invalidation takes that lock, so it waits for lookups in
//!   flight and finds what they installed.
//! - Attributes of an inode the kernel holds: the kernel ignores a reply's attributes when an
//!   invalidation of the inode came after the request was sent (`attr_version`).
//! - Attributes of an inode the kernel does not hold yet (a lookup in flight): the reply marks
//!   the inode as held before it is sent, then checks whether a change of it was seen since the
//!   request began ([`Ticket`]); the invalidation marks the change first, then checks whether
//!   the inode is held. One of the two sees the other: either the reply goes out with a TTL of
//!   0, or the invalidation is sent, and repeated for [`RETRY_FOR`] while the kernel has not
//!   installed the inode yet.

use calm_types::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::listings::Listings;
use calm_changelog::{Record, RecordType};
use calm_client::{Client, WatchEvent, WatchWhat};
use calm_lockfree::changes::Changes;
use calm_types::{Attr, Handle, ROOT};
use fuser::INodeNo;

/// Slots of the table of recent changes per handle (hashed; a collision only makes a reply
/// be cached for 0 s).
pub const CHANGED_SLOTS: usize = 1 << 16;
/// How long an attribute invalidation is repeated while the kernel has yet to install the
/// inode it is about (a lookup in flight).
pub const RETRY_FOR: Duration = Duration::from_millis(100);
/// Interval of those repetitions.
const RETRY_EVERY: Duration = Duration::from_millis(1);
/// TTL of replies while the mount does not follow the server's changes (the watch broke and
/// is being made again, or the server does not let this client watch).
pub const TTL_UNFOLLOWED: Duration = Duration::from_secs(1);
/// The extended attribute the kernel asks for before a write(2) to a file whose attributes it
/// fetched since its last write (whether the write must drop file capabilities).
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";
/// The extended attributes the kernel asks for on its own, not because a program did: file
/// capabilities before a write, and the POSIX ACLs it checks a caller's permission with
/// (access) and gives a new file (default) whenever the caller is not the owner. Their absence
/// is kept per file, see [`Coherence::lacks`].
pub const KERNEL_XATTRS: [&[u8]; 3] = [
    CAPABILITY_XATTR,
    b"system.posix_acl_access",
    b"system.posix_acl_default",
];
/// Absences of one of [`KERNEL_XATTRS`] on one file the mount keeps, at most (beyond, the
/// kernel's questions about other files go to the server).
pub const ABSENT_XATTRS_MAX: usize = 1 << 16;

/// Which of [`KERNEL_XATTRS`] `name` is, if any.
pub fn kernel_xattr(name: &[u8]) -> Option<KernelXattr> {
    KERNEL_XATTRS
        .iter()
        .position(|kept| *kept == name)
        .map(|at| KernelXattr(at as u8))
}

/// One of [`KERNEL_XATTRS`], by its place there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelXattr(u8);
/// Directories whose attributes the mount keeps from the answers to its own changes of their
/// names, at most (beyond, the kernel's questions about other directories go to the server).
pub const DIR_ATTRS_MAX: usize = 1 << 14;
/// Wait before a broken watch is made again, growing to [`REWATCH_MAX`].
const REWATCH_FIRST: Duration = Duration::from_millis(50);
const REWATCH_MAX: Duration = Duration::from_secs(2);

mod listed;

/// What a change makes stale in a kernel's cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stale {
    /// The name `name` in directory `parent` (it was removed, or now names another inode).
    Entry { parent: Handle, name: Vec<u8> },
    /// The inode's attributes (a directory's include its listing).
    Attrs(Handle),
    /// The inode's attributes and its cached pages (its contents changed).
    Contents(Handle),
}

impl Stale {
    fn handle(&self) -> Handle {
        match self {
            Stale::Entry { parent, .. } => *parent,
            Stale::Attrs(handle) | Stale::Contents(handle) => *handle,
        }
    }
}

/// What `record` makes stale in the cache of a kernel that did not make the change. A new name
/// invalidates its entry too: the kernel may hold the name's absence (a lookup that found
/// nothing, see [`Coherence::absence_ttl`]).
pub fn plan(record: &Record, out: &mut Vec<Stale>) {
    use RecordType as T;
    let entry = |parent: Handle, name: &[u8]| Stale::Entry {
        parent,
        name: name.to_vec(),
    };
    match record.kind {
        T::Create | T::Mkdir | T::Softlink | T::Mknod => {
            out.push(entry(record.parent, &record.name));
            out.push(Stale::Attrs(record.parent));
        }
        T::Hardlink => {
            out.push(entry(record.parent, &record.name));
            out.push(Stale::Attrs(record.parent));
            out.push(Stale::Attrs(record.target));
        }
        T::Unlink | T::Rmdir => {
            out.push(entry(record.parent, &record.name));
            out.push(Stale::Attrs(record.parent));
            out.push(Stale::Attrs(record.target));
        }
        T::Rename => {
            out.push(entry(record.parent, &record.name));
            out.push(Stale::Attrs(record.parent));
            out.push(Stale::Attrs(record.target));
            if let Some(from) = &record.rename {
                out.push(entry(from.source_parent, &from.source_name));
                if from.source_parent != record.parent {
                    out.push(Stale::Attrs(from.source_parent));
                }
                if from.overwritten != 0 {
                    out.push(Stale::Attrs(from.overwritten));
                }
            }
        }
        T::Trunc | T::Mtime | T::Layout => out.push(Stale::Contents(record.target)),
        T::Setattr | T::Xattr | T::Ctime | T::Atime => out.push(Stale::Attrs(record.target)),
        T::Mark | T::RenameTo | T::Open | T::Close | T::Hsm | T::Migrate => {}
    }
}

/// When a request began, for the TTL of its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    changes: u64,
    follows: bool,
}

/// What a batch of changes asks of the invalidating thread.
#[derive(Debug)]
enum Work {
    /// Drop these, after which every change up to the index is dealt with.
    Drop(Vec<Stale>, u64),
    /// Drop everything the kernel holds: every change up to the index is dealt with.
    DropAll(u64),
}

/// Figures of the cache, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Invalidations sent to the kernel.
    pub invalidations: u64,
    /// Times the whole cache was dropped (the stream fell behind or broke).
    pub dropped_all: u64,
    /// Lookups of names not there answered by the mount (`Coherence::known_absent`).
    pub absences_known: u64,
}

/// The mount's side of the kernel's cache.
#[derive(Debug)]
pub struct Coherence {
    /// TTL of replies while the changes are followed.
    ttl: Duration,
    /// The watch is live: replies may carry `ttl`.
    follows: AtomicBool,
    /// The watch this mount follows the changes through (0: none now).
    watch_id: AtomicU64,
    /// Inodes the kernel holds, with their lookup counts (entry replies minus forgets).
    held: Mutex<HashMap<Handle, u64>>,
    /// The changes seen so far, which a reply is checked against ([`Ticket`]).
    changes: Changes,
    notifier: OnceLock<fuser::Notifier>,
    work: Mutex<Option<std::sync::mpsc::Sender<Work>>>,
    invalidations: AtomicU64,
    dropped_all: AtomicU64,
    /// Every change up to this changelog index has been dealt with (its invalidations sent).
    applied: AtomicU64,
    /// Woken whenever `applied` moves (see [`Coherence::wait_passed`]).
    applied_moved: tokio::sync::Notify,
    /// Which of [`KERNEL_XATTRS`] the server said files have not, with no change of them seen
    /// since.
    absent_xattrs: Mutex<HashSet<(Handle, KernelXattr)>>,
    /// Directories' attributes as the server's answer to this mount's last change of their
    /// names gave them, with no change of them seen since ([`Coherence::dir_attr`]).
    dir_attrs: Mutex<HashMap<Handle, Attr>>,
    /// Directories whose every name this mount knows (it made them, and nothing but this
    /// mount changed their names since): a lookup of a name not there is answered here.
    listings: Mutex<Listings>,
    /// Lookups answered that way.
    absences_known: AtomicU64,
}

impl Coherence {
    /// A cache whose replies carry `ttl` while the changes are followed.
    pub fn new(ttl: Duration) -> Arc<Coherence> {
        Arc::new(Coherence {
            ttl,
            follows: AtomicBool::new(false),
            watch_id: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            changes: Changes::new(CHANGED_SLOTS),
            notifier: OnceLock::new(),
            work: Mutex::new(None),
            invalidations: AtomicU64::new(0),
            dropped_all: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            applied_moved: tokio::sync::Notify::new(),
            absent_xattrs: Mutex::new(HashSet::new()),
            dir_attrs: Mutex::new(HashMap::new()),
            listings: Mutex::new(Listings::default()),
            absences_known: AtomicU64::new(0),
        })
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            invalidations: self.invalidations.load(Ordering::Relaxed),
            dropped_all: self.dropped_all.load(Ordering::Relaxed),
            absences_known: self.absences_known.load(Ordering::Relaxed),
        }
    }

    /// Whether the mount follows the server's changes now.
    pub fn follows(&self) -> bool {
        self.follows.load(Ordering::SeqCst)
    }

    /// Whether every change up to changelog index `index` has been dealt with: what the
    /// kernel holds is not older than that (e.g. after a lock grant answered with `index`,
    /// nothing the previous holder wrote is left in the kernel's pages).
    pub fn passed(&self, index: u64) -> bool {
        self.follows() && self.applied.load(Ordering::SeqCst) >= index
    }

    /// Waits up to `within` for [`Coherence::passed`] of `index`, and says whether it did.
    /// The stream is usually about a millisecond behind the server's last commit: a mount that
    /// waits that long keeps its caches of a file nobody else changed, instead of fetching it
    /// all again.
    pub async fn wait_passed(&self, index: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let moved = self.applied_moved.notified();
            tokio::pin!(moved);
            // Registered before the check: a move between the two is not missed.
            moved.as_mut().enable();
            if self.passed(index) {
                return true;
            }
            if !self.follows() {
                return false;
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return self.passed(index);
            }
        }
    }

    fn applied_up_to(&self, index: u64) {
        self.applied.fetch_max(index, Ordering::SeqCst);
        self.applied_moved.notify_waiters();
    }

    /// Taken when a request begins; see [`Coherence::reply_ttl`].
    /// The watch this mount follows the changes through, while it does (else 0): the server
    /// lets a mount hold a directory that has names only where this is the only one.
    pub fn watch_id(&self) -> u64 {
        self.watch_id.load(Ordering::SeqCst)
    }

    pub fn ticket(&self) -> Ticket {
        Ticket {
            follows: self.follows(),
            changes: self.changes.now(),
        }
    }

    /// The TTL of a reply about `handle` to a request that began at `ticket`: the long one
    /// while the changes are followed, none if the handle changed since the request began
    /// (the reply may predate the change), [`TTL_UNFOLLOWED`] otherwise.
    pub fn reply_ttl(&self, ticket: Ticket, handle: Handle) -> Duration {
        if self.changes.since(ticket.changes, handle) {
            return Duration::ZERO;
        }
        if ticket.follows && self.follows() {
            self.ttl
        } else {
            TTL_UNFOLLOWED.min(self.ttl)
        }
    }

    /// The TTL of a reply that a name is not in `parent`, to a request that began at
    /// `ticket`: as long as an entry's while the changes are followed (a name made there by
    /// another client invalidates the absence, as a removal does a name), none while they are
    /// not (no invalidation would come). Lookups of names that are not there are what a
    /// database (`DB-wal`), a compiler's include path or an interpreter's module path ask
    /// most; each kept absence is a round trip to the server saved.
    pub fn absence_ttl(&self, ticket: Ticket, parent: Handle) -> Duration {
        if !ticket.follows || !self.follows() {
            return Duration::ZERO;
        }
        self.reply_ttl(ticket, parent)
    }

    /// An entry reply about `handle` is about to be sent: the kernel will hold it once more.
    /// Returns the reply's TTL.
    pub fn entered(&self, ticket: Ticket, handle: Handle) -> Duration {
        *self.held.locked().entry(handle).or_insert(0) += 1;
        self.reply_ttl(ticket, handle)
    }

    /// The kernel forgot `lookups` of its lookups of `handle`.
    /// True when the kernel holds the inode no more.
    pub fn forget(&self, handle: Handle, lookups: u64) -> bool {
        let mut held = self.held.locked();
        match held.get_mut(&handle) {
            Some(count) => {
                *count = count.saturating_sub(lookups);
                if *count == 0 {
                    held.remove(&handle);
                    self.forget_absent_xattrs(&[handle]);
                    self.dir_attrs.locked().remove(&handle);
                    self.listings.locked().forget(handle);
                    return true;
                }
                false
            }
            None => true,
        }
    }

    fn holds(&self, handle: Handle) -> bool {
        handle == ROOT || self.held.locked().contains_key(&handle)
    }

    /// Notes the changes of `stale` (before the kernel is told: see the module's races).
    fn mark(&self, stale: &[Stale]) {
        self.changes.mark(stale.iter().map(Stale::handle));
        let handles: Vec<Handle> = stale.iter().map(Stale::handle).collect();
        self.forget_absent_xattrs(&handles);
        let mut dir_attrs = self.dir_attrs.locked();
        for s in stale {
            dir_attrs.remove(&s.handle());
        }
    }

    /// Notes that anything may have changed (replies in flight are not cached).
    fn mark_all(&self) {
        self.changes.mark_all();
        self.absent_xattrs.locked().clear();
        self.dir_attrs.locked().clear();
        self.listings.locked().clear();
    }

    /// A request of this mount was answered early (its caller was killed) while its change
    /// went on to be made: the kernel dropped the answer, so it does not know the change (a
    /// rename it did not move, a name it did not make), and this mount's record of it is
    /// skipped as its own. Drops the kernel's whole cache, as when the changes could not be
    /// followed (rare: a change of a process killed while it waited).
    pub fn kernel_missed_a_change(&self) {
        self.mark_all();
        self.send(Work::DropAll(0));
    }

    fn forget_absent_xattrs(&self, handles: &[Handle]) {
        let mut absent = self.absent_xattrs.locked();
        if absent.is_empty() {
            return;
        }
        for handle in handles {
            for at in 0..KERNEL_XATTRS.len() {
                absent.remove(&(*handle, KernelXattr(at as u8)));
            }
        }
    }

    /// Whether `handle` is known to have no `xattr`, so the mount answers the kernel's
    /// question itself. The kernel asks for file capabilities before a write whenever it
    /// fetched the file's attributes since its last one (and a write makes the next fstat fetch
    /// them), and for the ACLs of each directory on a path and of the file each time a caller
    /// that is not their owner goes through them after their attributes were refreshed: both
    /// cost a database several round trips to the server per transaction. Exact as the kernel's
    /// attributes are: any change of the file by another client drops the knowledge when the
    /// change stream brings it, as does this mount's own change of the file's extended
    /// attributes ([`Coherence::changed_here`]; a chmod adds no ACL to a file that has none).
    pub fn lacks(&self, handle: Handle, xattr: KernelXattr) -> bool {
        self.follows() && self.absent_xattrs.locked().contains(&(handle, xattr))
    }

    /// The server answered a request that began at `ticket` that `handle` has no `xattr`: kept
    /// unless the file changed since the request began (the answer may predate the change) or
    /// the changes are not followed.
    pub fn absent(&self, ticket: Ticket, handle: Handle, xattr: KernelXattr) {
        if !ticket.follows || self.reply_ttl(ticket, handle).is_zero() || !self.follows() {
            return;
        }
        let mut absent = self.absent_xattrs.locked();
        if absent.len() < ABSENT_XATTRS_MAX {
            absent.insert((handle, xattr));
        }
        drop(absent);
        // A change noted while inserting: undo (the mark may have run before the insert).
        if self.reply_ttl(ticket, handle).is_zero() {
            self.absent_xattrs.locked().remove(&(handle, xattr));
        }
    }

    /// This mount is changing (or changed) `handle`'s extended attributes, or the names of the
    /// directory `handle`: what is kept of them goes, and answers from the server to requests
    /// begun before are not kept. Called before the change is sent (and, for a change whose
    /// answer brings no attributes to keep, again once it is answered).
    pub fn changed_here(&self, handle: Handle) {
        self.mark(&[Stale::Attrs(handle)]);
    }

    /// The attributes of directory `dir` as the server's answer to this mount's own last
    /// change of its names gave them, while nothing changed it since. The kernel asks for a
    /// directory's attributes after each change of its names (it dropped them, and checks
    /// permissions on them for the next change): a create and an unlink cost three requests to
    /// the server instead of five. Exact as the kernel's attributes are: a change by another
    /// client drops them when its record arrives, and every change this mount makes drops them
    /// before it is sent ([`Coherence::changed_here`], [`Coherence::dirs_changed_here`]) and
    /// keeps the answer's ([`Coherence::dir_changed`]).
    pub fn dir_attr(&self, dir: Handle) -> Option<Attr> {
        if !self.follows() {
            return None;
        }
        self.dir_attrs.locked().get(&dir).cloned()
    }

    /// The server answered a change of `attr.handle`'s names, made by a request that began at
    /// `ticket` (after [`Coherence::changed_here`] of the directory), with the directory's
    /// attributes right after it: kept unless the directory changed since the request began,
    /// this mount renamed or removed a directory since, or the changes are not followed.
    pub fn dir_changed(&self, ticket: Ticket, attr: Attr) {
        let dir = attr.handle;
        let fresh = |cache: &Self| {
            ticket.follows
                && cache.follows()
                && !cache.reply_ttl(ticket, dir).is_zero()
                && !cache.changes.dirs_since(ticket.changes)
        };
        if attr.kind != calm_types::Kind::Dir || !fresh(self) {
            return;
        }
        let mut dir_attrs = self.dir_attrs.locked();
        if dir_attrs.len() < DIR_ATTRS_MAX || dir_attrs.contains_key(&dir) {
            dir_attrs.insert(dir, attr);
        }
        drop(dir_attrs);
        // A change noted while inserting: undo (the mark may have run before the insert).
        if !fresh(self) {
            self.dir_attrs.locked().remove(&dir);
        }
    }

    /// This mount changes `handle`'s attributes (a setattr): what is kept of them as a
    /// directory's goes. Called before the change is sent and again once it is answered (the
    /// kernel holds the inode's lock meanwhile, so no change of the directory's names by this
    /// mount is answered in between).
    pub fn forget_dir_attr(&self, handle: Handle) {
        self.dir_attrs.locked().remove(&handle);
    }

    /// This mount renames or removes a name that may be a directory's (whose own attributes,
    /// and its parent's link count, change): no directory's attributes are kept from answers
    /// to requests begun before. Called before the change is sent and again once it is
    /// answered.
    pub fn dirs_changed_here(&self) {
        self.changes.mark_dirs();
        self.dir_attrs.locked().clear();
    }

    fn send(&self, work: Work) {
        if let Some(sender) = self.work.locked().as_ref() {
            let _ = sender.send(work);
        }
    }

    /// Starts the thread that tells the kernel, once the session exists; `notifier` tells the
    /// kernel. Returns whether the kernel can drop its whole cache at once (otherwise the
    /// mount keeps short TTLs: after falling behind it could not drop every entry).
    pub fn start(self: &Arc<Self>, notifier: fuser::Notifier) -> bool {
        // A new epoch on a cache still empty is harmless, and says whether the kernel knows
        // epochs (an older one answers EINVAL).
        let epochs = match notifier.inc_epoch() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    %e,
                    "this kernel cannot drop its whole FUSE cache at once (Linux 6.16): \
                     names and attributes are cached for at most {} ms",
                    TTL_UNFOLLOWED.as_millis()
                );
                false
            }
        };
        let _ = self.notifier.set(notifier);
        let (sender, receiver) = std::sync::mpsc::channel();
        *self.work.locked() = Some(sender);
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("calm-inval".into())
            .spawn(move || invalidate(me, receiver));
        if let Err(e) = spawned {
            tracing::warn!(%e, "starting the cache invalidation thread");
            return false;
        }
        epochs
    }

    /// What tells the kernel (once the session exists).
    pub(crate) fn notifier(&self) -> Option<fuser::Notifier> {
        self.notifier.get().cloned()
    }

    /// Stops the invalidation thread (the session ended).
    pub fn stop(&self) {
        self.work.locked().take();
        self.follows.store(false, Ordering::SeqCst);
        self.applied_moved.notify_waiters();
    }

    /// Tells the kernel to drop one stale thing; false when the kernel does not hold it (yet).
    fn drop_one(&self, notifier: &fuser::Notifier, stale: &Stale) -> bool {
        let result = match stale {
            Stale::Entry { parent, name } => {
                use std::os::unix::ffi::OsStrExt;
                notifier.inval_entry(INodeNo(*parent), std::ffi::OsStr::from_bytes(name))
            }
            // A negative offset: attributes only.
            Stale::Attrs(handle) => notifier.inval_inode(INodeNo(*handle), -1, 0),
            Stale::Contents(handle) => notifier.inval_inode(INodeNo(*handle), 0, 0),
        };
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(()) => true,
            // The kernel does not hold it (fuser turns ENOENT into Ok for invalidations; kept
            // for a kernel that says so differently).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => {
                tracing::warn!(?stale, %e, "invalidating the kernel's cache");
                true
            }
        }
    }

    /// Drops everything the kernel holds: every entry (a new epoch), and the attributes and
    /// pages of every inode held.
    fn drop_all(&self, notifier: &fuser::Notifier) {
        self.dropped_all.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = notifier.inc_epoch() {
            tracing::warn!(%e, "dropping the kernel's cached names");
        }
        let held: Vec<Handle> = self.held.locked().keys().copied().collect();
        for handle in std::iter::once(ROOT).chain(held) {
            self.drop_one(notifier, &Stale::Contents(handle));
        }
    }
}

/// The invalidation thread: tells the kernel what went stale, in the order the changes came.
/// A thread of its own, never a request's: an entry invalidation waits for lookups in flight in
/// its directory, and a contents invalidation for pages locked by reads, both of which the
/// request threads must be free to answer.
fn invalidate(cache: std::sync::Weak<Coherence>, work: std::sync::mpsc::Receiver<Work>) {
    // Attribute invalidations of inodes the kernel was about to install, to repeat.
    let mut retry: Vec<(Stale, Instant)> = Vec::new();
    loop {
        let next = if retry.is_empty() {
            work.recv().map_err(|_| true)
        } else {
            work.recv_timeout(RETRY_EVERY)
                .map_err(|e| matches!(e, std::sync::mpsc::RecvTimeoutError::Disconnected))
        };
        let Some(cache) = cache.upgrade() else {
            return;
        };
        let Some(notifier) = cache.notifier.get() else {
            return;
        };
        match next {
            Err(true) => return,
            Err(false) => {}
            Ok(Work::DropAll(upto)) => {
                retry.clear();
                cache.drop_all(notifier);
                cache.applied_up_to(upto);
            }
            Ok(Work::Drop(stale, upto)) => {
                for s in stale {
                    let held = match &s {
                        Stale::Entry { parent, .. } => cache.holds(*parent),
                        Stale::Attrs(handle) | Stale::Contents(handle) => cache.holds(*handle),
                    };
                    if held && !cache.drop_one(notifier, &s) && !matches!(s, Stale::Entry { .. }) {
                        retry.push((s, Instant::now() + RETRY_FOR));
                    }
                }
                cache.applied_up_to(upto);
            }
        }
        let now = Instant::now();
        retry.retain(|(s, until)| {
            *until > now && cache.holds(s.handle()) && !cache.drop_one(notifier, s)
        });
    }
}

/// Follows every change of the namespace for `cache` through `client` (a watch of everything,
/// from now), until the mount ends; `own_session` names this mount's lock session, whose
/// changes its kernel made itself; `contents_changed` is told of every file whose contents
/// another client changed (None: of every file, the stream fell behind or broke), before the
/// kernel's pages are dropped (the mount's own copy of the file's map must not fill the
/// kernel's pages again with the old bytes). Returns the
/// following task once the first watch is made; None when it could not be (the mount then
/// keeps [`TTL_UNFOLLOWED`]).
pub async fn follow(
    cache: Arc<Coherence>,
    client: Client,
    own_session: impl Fn() -> u64 + Send + 'static,
    contents_changed: impl Fn(Option<Handle>) + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let mut watch = match client.watch(WatchWhat::All, 0).await {
        Ok(watch) => watch,
        Err(e) => {
            tracing::warn!(
                %e,
                "the mount cannot follow the server's changes: names and attributes are \
                 cached for at most {} ms",
                TTL_UNFOLLOWED.as_millis()
            );
            return None;
        }
    };
    cache.watch_id.store(watch.id(), Ordering::SeqCst);
    cache.follows.store(true, Ordering::SeqCst);
    Some(tokio::spawn(async move {
        let mut wait = REWATCH_FIRST;
        loop {
            match watch.next_batch().await {
                Ok(Some(events)) => {
                    wait = REWATCH_FIRST;
                    apply(&cache, &events, own_session(), &contents_changed);
                    continue;
                }
                Ok(None) => tracing::warn!("the server ended the watch of its changes"),
                Err(e) => tracing::warn!(%e, "following the server's changes"),
            }
            if cache.work.locked().is_none() {
                return; // the mount ended
            }
            // Nothing is known of what changes meanwhile: short TTLs and an empty cache
            // until the watch is back (from where it broke: what changed in between comes
            // first, or a resync).
            cache.follows.store(false, Ordering::SeqCst);
            cache.watch_id.store(0, Ordering::SeqCst);
            cache.mark_all();
            contents_changed(None);
            cache.send(Work::DropAll(0));
            let from = watch.passed() + 1;
            loop {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(REWATCH_MAX);
                if cache.work.locked().is_none() {
                    return;
                }
                match client.watch(WatchWhat::All, from).await {
                    Ok(again) => {
                        cache.watch_id.store(again.id(), Ordering::SeqCst);
                        watch = again;
                        break;
                    }
                    Err(e) => tracing::debug!(%e, "watching the server's changes again"),
                }
            }
            cache.follows.store(true, Ordering::SeqCst);
        }
    }))
}

/// Applies a batch of events: what other clients changed is marked and handed to the
/// invalidation thread, once per stale thing; a resync drops everything.
fn apply(
    cache: &Coherence,
    events: &[WatchEvent],
    own_session: u64,
    contents_changed: &dyn Fn(Option<Handle>),
) {
    let mut stale = Vec::new();
    let mut upto = 0;
    for event in events {
        match event {
            WatchEvent::Change(record) => {
                upto = upto.max(record.index);
                // This mount's own changes are in its kernel's cache already.
                if own_session == 0 || record.session != own_session {
                    plan(record, &mut stale);
                }
            }
            WatchEvent::Resync { from } => {
                cache.mark_all();
                contents_changed(None);
                stale.clear();
                // What follows starts at `from`: everything before is in what is dropped.
                cache.send(Work::DropAll(from.saturating_sub(1)));
            }
            WatchEvent::Progress { index } => upto = upto.max(*index),
        }
    }
    let mut seen = HashSet::with_capacity(stale.len());
    stale.retain(|s| seen.insert(s.clone()));
    if !stale.is_empty() {
        cache.mark(&stale);
        // After the mark: a directory made here and kept meanwhile is undone by its maker's
        // second look (`Coherence::made_dir_here`).
        cache.others_changed(&stale);
        for s in &stale {
            if let Stale::Contents(handle) = s {
                contents_changed(Some(*handle));
            }
        }
    }
    if !stale.is_empty() || upto > 0 {
        cache.send(Work::Drop(stale, upto));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_changelog::record::RenameFrom;

    fn record(kind: RecordType, target: Handle, parent: Handle, name: &[u8]) -> Record {
        Record {
            index: 1,
            kind,
            flags: 0,
            time_ns: 0,
            target,
            generation: 0,
            parent,
            name: name.to_vec(),
            session: 7,
            uid: 0,
            gid: 0,
            rename: None,
        }
    }

    fn planned(record: &Record) -> Vec<Stale> {
        let mut out = Vec::new();
        plan(record, &mut out);
        out
    }

    fn entry(parent: Handle, name: &[u8]) -> Stale {
        Stale::Entry {
            parent,
            name: name.to_vec(),
        }
    }

    #[test]
    fn what_each_change_makes_stale() {
        use RecordType as T;
        assert_eq!(
            planned(&record(T::Create, 10, 2, b"f")),
            [entry(2, b"f"), Stale::Attrs(2)],
            "a new name: its absence, and the directory"
        );
        for kind in [T::Mkdir, T::Softlink, T::Mknod] {
            assert_eq!(
                planned(&record(kind, 10, 2, b"n")),
                [entry(2, b"n"), Stale::Attrs(2)]
            );
        }
        assert_eq!(
            planned(&record(T::Hardlink, 10, 2, b"l")),
            [entry(2, b"l"), Stale::Attrs(2), Stale::Attrs(10)]
        );
        assert_eq!(
            planned(&record(T::Unlink, 10, 2, b"f")),
            [entry(2, b"f"), Stale::Attrs(2), Stale::Attrs(10)]
        );
        assert_eq!(
            planned(&record(T::Rmdir, 11, 2, b"d")),
            [entry(2, b"d"), Stale::Attrs(2), Stale::Attrs(11)]
        );
        let mut rename = record(T::Rename, 10, 3, b"to");
        rename.rename = Some(RenameFrom {
            source_parent: 2,
            source_name: b"from".to_vec(),
            overwritten: 12,
            overwritten_generation: 0,
        });
        assert_eq!(
            planned(&rename),
            [
                entry(3, b"to"),
                Stale::Attrs(3),
                Stale::Attrs(10),
                entry(2, b"from"),
                Stale::Attrs(2),
                Stale::Attrs(12)
            ]
        );
        for kind in [T::Trunc, T::Mtime] {
            assert_eq!(planned(&record(kind, 10, 0, b"")), [Stale::Contents(10)]);
        }
        for kind in [T::Setattr, T::Xattr, T::Ctime, T::Atime] {
            assert_eq!(planned(&record(kind, 10, 0, b"")), [Stale::Attrs(10)]);
        }
        assert!(planned(&record(T::Mark, 0, 0, b"note")).is_empty());
    }

    #[test]
    fn a_reply_is_cached_long_only_while_followed_and_unchanged_since_its_request() {
        let cache = Coherence::new(Duration::from_secs(60));
        let early = cache.ticket();
        assert_eq!(
            cache.reply_ttl(early, 10),
            TTL_UNFOLLOWED,
            "not followed yet"
        );
        cache.follows.store(true, Ordering::SeqCst);
        assert_eq!(
            cache.reply_ttl(early, 10),
            TTL_UNFOLLOWED,
            "asked before the changes were followed"
        );
        let ticket = cache.ticket();
        assert_eq!(cache.entered(ticket, 10), Duration::from_secs(60));
        assert!(cache.holds(10));
        cache.mark(&[Stale::Attrs(10)]);
        assert_eq!(
            cache.reply_ttl(ticket, 10),
            Duration::ZERO,
            "changed while the request was out"
        );
        assert_eq!(cache.reply_ttl(ticket, 11), Duration::from_secs(60));
        assert_eq!(cache.reply_ttl(cache.ticket(), 10), Duration::from_secs(60));
        cache.forget(10, 1);
        assert!(!cache.holds(10));
        assert!(cache.holds(ROOT), "the root is always held");
    }

    #[test]
    fn an_absence_is_kept_only_while_followed_and_its_directory_unchanged_since_the_request() {
        let cache = Coherence::new(Duration::from_secs(60));
        assert_eq!(
            cache.absence_ttl(cache.ticket(), 2),
            Duration::ZERO,
            "not followed: no invalidation would come"
        );
        cache.follows.store(true, Ordering::SeqCst);
        let ticket = cache.ticket();
        assert_eq!(cache.absence_ttl(ticket, 2), Duration::from_secs(60));
        cache.mark(&[entry(2, b"f"), Stale::Attrs(2)]);
        assert_eq!(
            cache.absence_ttl(ticket, 2),
            Duration::ZERO,
            "a name made in the directory while the lookup was out"
        );
        assert_eq!(
            cache.absence_ttl(cache.ticket(), 2),
            Duration::from_secs(60)
        );
        let ticket = cache.ticket();
        cache.follows.store(false, Ordering::SeqCst);
        assert_eq!(
            cache.absence_ttl(ticket, 2),
            Duration::ZERO,
            "the changes stopped being followed while the lookup was out"
        );
    }

    #[test]
    fn a_batch_skips_the_mounts_own_changes_and_a_resync_drops_everything() {
        let cache = Coherence::new(Duration::from_secs(60));
        let (sender, receiver) = std::sync::mpsc::channel();
        *cache.work.locked() = Some(sender);
        let own = record(RecordType::Setattr, 10, 0, b"");
        let mut other = own.clone();
        other.session = 8;
        other.target = 11;
        let events = [
            WatchEvent::Change(own.clone()),
            WatchEvent::Change(other.clone()),
            WatchEvent::Change(other),
        ];
        apply(&cache, &events, 7, &|_| {});
        match receiver.try_recv() {
            Ok(Work::Drop(stale, upto)) => {
                assert_eq!(stale, [Stale::Attrs(11)], "once, not own");
                assert_eq!(upto, 1, "dealt with up to the batch's last index");
            }
            other => panic!("{other:?}"),
        }
        cache.follows.store(true, Ordering::SeqCst);
        let ticket = cache.ticket();
        apply(&cache, &[WatchEvent::Resync { from: 5 }], 7, &|_| {});
        assert!(matches!(receiver.try_recv(), Ok(Work::DropAll(4))));
        assert_eq!(
            cache.reply_ttl(ticket, 99),
            Duration::ZERO,
            "asked before the resync"
        );
        assert!(receiver.try_recv().is_err());
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_grant_the_stream_has_passed_waits_for_nothing() {
        let cache = Coherence::new(Duration::from_secs(60));
        cache.follows.store(true, Ordering::SeqCst);
        cache.applied_up_to(10);
        let started = Instant::now();
        assert!(runtime().block_on(cache.wait_passed(10, Duration::from_secs(30))));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_grant_ahead_of_the_stream_waits_until_the_stream_passes_it() {
        let cache = Coherence::new(Duration::from_secs(60));
        cache.follows.store(true, Ordering::SeqCst);
        cache.applied_up_to(3);
        let mover = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                for index in 4..=12 {
                    std::thread::sleep(Duration::from_millis(2));
                    cache.applied_up_to(index);
                }
            })
        };
        let started = Instant::now();
        assert!(runtime().block_on(cache.wait_passed(12, Duration::from_secs(30))));
        assert!(cache.passed(12));
        assert!(started.elapsed() < Duration::from_secs(10));
        mover.join().expect("mover");
    }

    #[test]
    fn a_grant_the_stream_does_not_reach_in_time_is_not_passed() {
        let cache = Coherence::new(Duration::from_secs(60));
        cache.follows.store(true, Ordering::SeqCst);
        cache.applied_up_to(3);
        let started = Instant::now();
        assert!(!runtime().block_on(cache.wait_passed(4, Duration::from_millis(20))));
        assert!(started.elapsed() >= Duration::from_millis(20));
        // A mount that does not follow the changes never counts a grant as passed.
        cache.follows.store(false, Ordering::SeqCst);
        assert!(!runtime().block_on(cache.wait_passed(3, Duration::from_secs(30))));
    }
    #[test]
    fn a_files_known_lack_of_kernel_xattrs_lasts_until_anything_changes_it() {
        let cache = Coherence::new(Duration::from_secs(60));
        let cap = kernel_xattr(CAPABILITY_XATTR).expect("kept");
        let (sender, _receiver) = std::sync::mpsc::channel();
        *cache.work.locked() = Some(sender);
        cache.absent(cache.ticket(), 10, cap);
        assert!(!cache.lacks(10, cap), "not kept while not followed");

        cache.follows.store(true, Ordering::SeqCst);
        cache.absent(cache.ticket(), 10, cap);
        assert!(cache.lacks(10, cap));
        assert!(!cache.lacks(11, cap));
        let acl = kernel_xattr(b"system.posix_acl_access").expect("kept");
        assert!(!cache.lacks(10, acl), "only what the server said");
        cache.absent(cache.ticket(), 10, acl);
        assert!(cache.lacks(10, acl));
        assert_eq!(kernel_xattr(b"user.note"), None, "a program's own question");

        // Another client's change of the file (any: its extended attributes are among them).
        let mut other = record(RecordType::Xattr, 10, 0, b"");
        other.session = 8;
        apply(&cache, &[WatchEvent::Change(other.clone())], 7, &|_| {});
        assert!(!cache.lacks(10, cap), "changed by another client");
        assert!(!cache.lacks(10, acl), "every kind goes");

        // An answer to a request that began before a change is not kept.
        let before = cache.ticket();
        apply(&cache, &[WatchEvent::Change(other.clone())], 7, &|_| {});
        cache.absent(before, 10, cap);
        assert!(!cache.lacks(10, cap), "the answer may predate the change");

        // This mount's own change of its extended attributes.
        cache.absent(cache.ticket(), 10, cap);
        let during = cache.ticket();
        cache.changed_here(10);
        assert!(!cache.lacks(10, cap), "changed here");
        cache.absent(during, 10, cap);
        assert!(!cache.lacks(10, cap), "asked while this mount changed it");

        // A resync, and the kernel forgetting the file.
        cache.absent(cache.ticket(), 10, cap);
        cache.absent(cache.ticket(), 12, cap);
        apply(&cache, &[WatchEvent::Resync { from: 5 }], 7, &|_| {});
        assert!(!cache.lacks(10, cap) && !cache.lacks(12, cap));
        let ticket = cache.ticket();
        cache.entered(ticket, 12);
        cache.absent(ticket, 12, cap);
        assert!(cache.lacks(12, cap));
        assert!(cache.forget(12, 1));
        assert!(!cache.lacks(12, cap), "forgotten by the kernel");

        // Known while followed only.
        cache.absent(cache.ticket(), 13, cap);
        cache.follows.store(false, Ordering::SeqCst);
        assert!(!cache.lacks(13, cap));
    }

    #[test]
    fn what_is_known_of_kernel_xattrs_is_bounded() {
        let cache = Coherence::new(Duration::from_secs(60));
        let cap = kernel_xattr(CAPABILITY_XATTR).expect("kept");
        cache.follows.store(true, Ordering::SeqCst);
        let ticket = cache.ticket();
        for handle in 100..100 + ABSENT_XATTRS_MAX as u64 + 10 {
            cache.absent(ticket, handle, cap);
        }
        assert_eq!(cache.absent_xattrs.locked().len(), ABSENT_XATTRS_MAX);
        assert!(cache.lacks(100, cap));
        assert!(!cache.lacks(100 + ABSENT_XATTRS_MAX as u64, cap));
    }
}
