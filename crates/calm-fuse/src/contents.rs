//! File contents through the mount: one [`FileData`] per file this mount uses, over the
//! namespace's shared object store.
//!
//! - A write is buffered in memory (pending slices); blocks that fill up are uploaded at once,
//!   at most [`UPLOADS_IN_FLIGHT_MAX`] at a time. Buffered bytes are bounded: past
//!   [`MountOptions::write_buffer_bytes`] for the whole mount, or a quarter of it for one file,
//!   the writer commits first.
//! - A commit (close, fsync, unlock, before a truncate or an attribute change) uploads what is
//!   left, waits for every upload, and only then sends the records to the server in one write
//!   (with the size, mtime and changelog record): metadata never names an object that is not
//!   completely written. fsync also syncs the objects of a local store before that commit.
//! - A commit of small writes (at most [`Contents::inline_bytes_max`] in all, in the file's
//!   first chunk (64 MiB), none uploaded yet) sends their bytes with the records instead: the server keeps
//!   them beside the records, in the same transaction, and no object is written (one durable
//!   write instead of an object's, its directory's and the metadata's).
//! - A read follows the file's map (read from the server at each open: close-to-open), with
//!   this mount's pending writes over it.
//!
//! [`MountOptions::write_buffer_bytes`]: crate::MountOptions::write_buffer_bytes

use calm_types::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use calm_client::Client;
use calm_data::{DataError, FileData, Objects, Part, Upload};
use calm_types::slices::is_object;
use calm_types::{Attr, Handle, MetaError};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Records of one chunk a file's map keeps in this mount from its own commits before it is
/// read again from the server (twice what the server keeps once compaction caught up).
pub const MAP_CHUNK_RECORDS_MAX: usize = 2 * calm_types::slices::CHUNK_SLICES_COMPACT_ALWAYS;

/// Blocks uploaded at once by one mount.
pub const UPLOADS_IN_FLIGHT_MAX: usize = 16;
/// Object reads in flight for one read request.
pub const READS_IN_FLIGHT_MAX: usize = 16;
/// Slice ids asked for at once.
pub const IDS_PER_ALLOC: u64 = 4096;
/// Files whose state (map, version) a mount keeps after their last close, for the page cache
/// kept across opens of an unchanged file; past it the closed ones are forgotten.
pub const FILES_KEPT_MAX: usize = 65_536;
/// Objects of one file committed without being made durable (a close, not an fsync) past
/// which the next commit syncs them.
pub const UNSYNCED_OBJECTS_MAX: usize = 1024;
/// Default bound of the bytes a mount buffers for writes not committed yet.
pub const WRITE_BUFFER_BYTES_DEFAULT: u64 = 256 << 20;

/// What identifies a version of a file's contents: a change of any of them means another
/// writer (or this mount) changed it.
type Version = (i64, i64, u64);

mod commit;
mod read;

pub(crate) use commit::Failed;
pub use commit::IN_DOUBT_MS_MAX;
use commit::{final_refusal, sync_objects, wait_uploads};

fn version(attr: &Attr) -> Version {
    (attr.mtime_ns, attr.ctime_ns, attr.size)
}

fn data_errno(error: &DataError) -> i32 {
    error.errno()
}

fn meta_errno(error: &MetaError) -> i32 {
    error.errno()
}

/// One file's contents on this mount.
#[derive(Debug, Default)]
struct FileState {
    data: FileData,
    /// The map is loaded (else the next read fetches it).
    loaded: bool,
    /// Uploads of pending slices' blocks still running.
    uploads: Vec<JoinHandle<Result<(), DataError>>>,
    /// The version this mount's page cache holds (kept across opens when unchanged).
    cached: Option<Version>,
    /// Open files of it on this mount.
    opens: usize,
    /// Objects of a local store committed at a close, not synced yet: an fsync (through any
    /// descriptor) makes them durable, and so does the background sync that follows the last
    /// close. At most [`UNSYNCED_OBJECTS_MAX`].
    unsynced: Vec<(u64, u32)>,
    /// A commit whose answer never came: sent again, as it was, before anything newer.
    in_doubt: Option<commit::Sent>,
    /// The attributes read with the map at the last open that asked the server (what an open
    /// answered from this mount's copy answers).
    attr: Option<Attr>,
}

/// Errors owed to open files (by FUSE file handle) whose writes a refused commit dropped,
/// each told once, at the file's next fsync, close or write.
#[derive(Debug, Default)]
struct Owed {
    /// The open files of regular files (only those may be owed an error).
    open: HashSet<u64>,
    errors: HashMap<u64, i32>,
}

type File = Arc<tokio::sync::Mutex<FileState>>;

/// The mount's file contents.
#[derive(Debug)]
pub struct Contents {
    objects: Objects,
    files: Mutex<HashMap<Handle, File>>,
    /// Files another client changed since this mount loaded their map: the next read loads
    /// it again (see [`Contents::changed_elsewhere`]).
    changed: Mutex<HashSet<Handle>>,
    /// Sizes of files with pending writes (what stat answers on this mount).
    dirty_sizes: Mutex<HashMap<Handle, u64>>,
    /// Since when each file has had pending writes (`crate::behind` commits the old ones).
    dirty_since: Mutex<HashMap<Handle, Instant>>,
    /// Files held and cut short here, not yet on the server: the size reads stop at.
    cut_here: Mutex<HashMap<Handle, u64>>,
    /// Files whose pending writes dropped setuid and setgid, with whether every writer was in
    /// the file's group (see [`Contents::drop_privileges`]).
    dropped_privileges: Mutex<HashMap<Handle, bool>>,
    ids: tokio::sync::Mutex<(u64, u64)>,
    uploads: Arc<Semaphore>,
    buffered: AtomicU64,
    buffer_max: u64,
    /// Most bytes one commit sends inline (0: never).
    inline_bytes_max: u64,
    owed: Mutex<Owed>,
}

impl Contents {
    pub fn new(objects: Objects, write_buffer_bytes: u64, inline_bytes_max: u64) -> Contents {
        Contents {
            inline_bytes_max: inline_bytes_max.min(calm_types::slices::INLINE_WRITE_BYTES_MAX),
            objects,
            files: Mutex::new(HashMap::new()),
            changed: Mutex::new(HashSet::new()),
            dirty_sizes: Mutex::new(HashMap::new()),
            dirty_since: Mutex::new(HashMap::new()),
            cut_here: Mutex::new(HashMap::new()),
            dropped_privileges: Mutex::new(HashMap::new()),
            ids: tokio::sync::Mutex::new((0, 0)),
            uploads: Arc::new(Semaphore::new(UPLOADS_IN_FLIGHT_MAX)),
            buffered: AtomicU64::new(0),
            buffer_max: write_buffer_bytes.max(1 << 20),
            owed: Mutex::new(Owed::default()),
        }
    }

    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Bytes written and not committed yet, and the most that are buffered before a write
    /// waits.
    pub fn buffered(&self) -> (u64, u64) {
        (self.buffered.load(Ordering::Relaxed), self.buffer_max)
    }

    fn file(&self, handle: Handle) -> File {
        self.files.locked().entry(handle).or_default().clone()
    }

    /// Another client changed the contents of `handle` (None: maybe of every file; the change
    /// stream says so, before the kernel's pages are dropped): a read that starts from now on
    /// loads the map again, so that no page the kernel caches afterwards is older than the
    /// change. Without waiting (the stream never waits for a file's commit).
    pub fn changed_elsewhere(&self, handle: Option<Handle>) {
        let files = self.files.locked();
        let mut changed = self.changed.locked();
        match handle {
            Some(handle) if files.contains_key(&handle) => {
                changed.insert(handle);
            }
            Some(_) => {}
            None => changed.extend(files.keys().copied()),
        }
    }

    /// The files with writes pending since `cutoff` or before.
    pub fn dirty_before(&self, cutoff: Instant) -> Vec<Handle> {
        let since = self.dirty_since.locked();
        let due = since.iter().filter(|(_, at)| **at <= cutoff);
        due.map(|(handle, _)| *handle).collect()
    }

    /// The size of `handle` with this mount's pending writes, when it has any.
    pub fn dirty_size(&self, handle: Handle) -> Option<u64> {
        self.dirty_sizes.locked().get(&handle).copied()
    }

    /// A write of `handle` that is about to be buffered drops the file's setuid and setgid
    /// (the kernel says so for a writer without the superuser's privilege; `writer_in_group`:
    /// whether the writer is in the file's group, which keeps a setgid without group execute):
    /// stat answers the mode without them right away, as Linux does, while the server drops
    /// them when the write is committed.
    pub fn drop_privileges(&self, handle: Handle, writer_in_group: bool) {
        let mut dropped = self.dropped_privileges.locked();
        let in_group = dropped.entry(handle).or_insert(true);
        *in_group &= writer_in_group;
    }

    /// `mode`, the server's mode of `handle`, as this mount's pending writes leave it.
    pub fn pending_mode(&self, handle: Handle, mode: u32) -> u32 {
        match self.dropped_privileges.locked().get(&handle) {
            Some(in_group) => calm_types::attr::mode_after_unprivileged_write(mode, *in_group),
            None => mode,
        }
    }

    fn publish_size(&self, handle: Handle, data: &FileData) {
        let mut sizes = self.dirty_sizes.locked();
        if data.is_dirty() {
            sizes.insert(handle, data.size());
            let mut since = self.dirty_since.locked();
            since.entry(handle).or_insert_with(Instant::now);
        } else {
            sizes.remove(&handle);
            self.dirty_since.locked().remove(&handle);
            // Committed: the server's mode has the privileges dropped already.
            self.dropped_privileges.locked().remove(&handle);
        }
    }

    async fn next_ids(&self, count: u64, client: &Client) -> Result<Vec<u64>, i32> {
        let mut pool = self.ids.lock().await;
        let mut out = Vec::with_capacity(count as usize);
        while (out.len() as u64) < count {
            if pool.0 == pool.1 {
                let first = client
                    .alloc_slices(IDS_PER_ALLOC)
                    .await
                    .map_err(|e| meta_errno(&e))?;
                *pool = (first, first + IDS_PER_ALLOC);
            }
            out.push(pool.0);
            pool.0 += 1;
        }
        Ok(out)
    }

    /// An open of regular file `handle`: its map and attributes read on one snapshot (what
    /// this open reads is the file as committed now: close-to-open), and whether the kernel may
    /// keep the pages it has of the file (it is unchanged since this mount last saw it).
    ///
    /// The map is read while the file's state is held: a commit of this mount's writes to the
    /// file cannot land between the read and the refresh, so the refresh never puts back a map
    /// older than what this mount itself committed (another process of the mount would then
    /// read, and overwrite, the bytes before that commit).
    ///
    /// With `copy`, the server is asked to let this mount keep a copy of the file: the answer
    /// says whether it did ([`crate::copies`]).
    pub async fn open(
        &self,
        client: &Client,
        handle: Handle,
        copy: bool,
    ) -> Result<(Attr, bool, bool), MetaError> {
        let file = self.file(handle);
        let mut state = file.lock().await;
        // The map read next is newer than any change seen before it (a change seen while it is
        // read stays marked; a read that fails leaves the mark as it was).
        let was_changed = self.changed.locked().remove(&handle);
        let read = match copy {
            true => client.read_map_keeping(handle).await,
            false => client.read_map(handle).await.map(|map| (map, false)),
        };
        let (map, granted) = match read {
            Ok(read) => read,
            Err(error) => {
                if was_changed {
                    self.changed.locked().insert(handle);
                }
                if state.opens == 0 && !state.data.is_dirty() && !state.loaded {
                    drop(state);
                    self.files.locked().remove(&handle);
                }
                return Err(error);
            }
        };
        state.opens += 1;
        state.data.refresh(map.attr.size, map.chunks, map.inline);
        state.loaded = true;
        let now = version(&map.attr);
        let keep = state.cached == Some(now) && !state.data.is_dirty();
        state.cached = Some(now);
        state.attr = Some(map.attr.clone());
        Ok((map.attr, keep, granted))
    }

    /// An open of `handle` answered from this mount's copy, which the caller checked: the
    /// attributes read with its map, if the map is loaded and unchanged since, the kernel's
    /// pages are of it, and nothing of the file is pending here (else `None`: ask the server).
    pub(crate) async fn open_kept(&self, handle: Handle) -> Option<Attr> {
        let file = self.files.locked().get(&handle)?.clone();
        let mut state = file.lock().await;
        let unchanged = state.loaded
            && state.cached.is_some()
            && !state.data.is_dirty()
            && !self.changed.locked().contains(&handle);
        let attr = state.attr.clone().filter(|_| unchanged)?;
        state.opens += 1;
        Some(attr)
    }

    /// A file created by this mount (empty, open).
    /// (A create without O_EXCL may find a file another process made meanwhile: one with
    /// bytes has its map read at the first read.)
    pub async fn created(&self, attr: &Attr) {
        let file = self.file(attr.handle);
        let mut state = file.lock().await;
        if !state.data.is_dirty() {
            state.data = FileData::new(attr.size, Vec::new(), Vec::new());
            // An empty file has no records (none reaches past the size).
            state.loaded = attr.size == 0;
        }
        state.cached = Some(version(attr));
        state.opens += 1;
    }

    /// `fh` is an open file of a regular file: a refused commit of bytes written through it
    /// is owed to it.
    pub fn opened_as(&self, fh: u64) {
        self.owed.locked().open.insert(fh);
    }

    /// The error owed to the open file `fh` (a refused commit dropped bytes written through
    /// it), if any: told once.
    pub fn take_error(&self, fh: u64) -> Option<i32> {
        let mut owed = self.owed.locked();
        if owed.errors.is_empty() {
            return None;
        }
        owed.errors.remove(&fh)
    }

    /// Owes `errno` to the open files of `writers` but `told` (which the caller answers).
    fn owe(&self, writers: &[u64], errno: i32, told: Option<u64>) -> usize {
        let mut owed = self.owed.locked();
        let mut count = 0;
        for writer in writers {
            if Some(*writer) != told && owed.open.contains(writer) {
                owed.errors.entry(*writer).or_insert(errno);
                count += 1;
            }
        }
        if let Some(told) = told {
            owed.errors.remove(&told);
        }
        count
    }

    /// The open file `fh` of `handle` was released (the kernel's last reference to it): what
    /// it was owed goes with it, and at the file's last close on this mount its state is
    /// forgotten when the mount keeps too many.
    pub async fn released(&self, handle: Handle, fh: u64) -> Vec<Handle> {
        {
            let mut owed = self.owed.locked();
            owed.open.remove(&fh);
            owed.errors.remove(&fh);
        }
        self.closed(handle).await
    }

    /// The last close on this mount of an open file: forgets the file's state when the mount
    /// keeps too many (the files forgotten).
    pub async fn closed(&self, handle: Handle) -> Vec<Handle> {
        let file = self.file(handle);
        {
            let mut state = file.lock().await;
            state.opens = state.opens.saturating_sub(1);
            if state.opens == 0 {
                // Kept files hold no inline bytes: memory stays bounded by the open ones.
                state.data.forget_inline();
                if !state.unsynced.is_empty() {
                    // Made durable soon after the last close, as a kernel writes back dirty
                    // pages; an fsync meanwhile waits for it (it holds the file's state).
                    let (file, objects) = (file.clone(), self.objects.clone());
                    tokio::spawn(async move {
                        let mut state = file.lock().await;
                        if let Err(errno) = sync_objects(&objects, &mut state.unsynced).await {
                            tracing::warn!(handle, errno, "syncing a closed file's objects");
                        }
                    });
                }
            }
        }
        let mut files = self.files.locked();
        let mut forgotten = Vec::new();
        if files.len() > FILES_KEPT_MAX {
            files.retain(|handle, f| {
                let keep = f.try_lock().map_or(true, |s| {
                    s.opens > 0 || s.data.is_dirty() || !s.unsynced.is_empty()
                });
                if !keep {
                    forgotten.push(*handle);
                }
                keep
            });
            self.changed.locked().retain(|h| files.contains_key(h));
        }
        forgotten
    }

    /// The kernel forgot `handle` (and so the pages it had of it): its state goes, unless the
    /// file is open, has writes pending or objects to sync, or is busy (then it stays until
    /// the mount keeps too many). Never waits. Whether it went.
    pub fn forgotten(&self, handle: Handle) -> bool {
        let mut files = self.files.locked();
        let idle = files.get(&handle).is_some_and(|f| {
            f.try_lock().is_ok_and(|s| {
                s.opens == 0 && !s.data.is_dirty() && s.unsynced.is_empty() && s.uploads.is_empty()
            })
        });
        if idle {
            files.remove(&handle);
            self.changed.locked().remove(&handle);
        }
        idle
    }

    /// Another mount may have changed `handle` (a lock was granted): the next read fetches its
    /// map again, and its pages are not kept.
    pub async fn invalidate(&self, handle: Handle) {
        let file = self.file(handle);
        let mut state = file.lock().await;
        state.loaded = false;
        state.cached = None;
    }

    /// The file changed through this mount (truncate, append): as [`Contents::invalidate`],
    /// and what the page cache holds is this version.
    pub async fn changed(&self, attr: &Attr) {
        let file = self.file(attr.handle);
        let mut state = file.lock().await;
        self.cut_here.locked().remove(&attr.handle);
        state.data.resized(attr.size);
        state.loaded = false;
        state.cached = Some(version(attr));
    }

    /// `handle`, held here with no write pending, was cut to `size` (no larger than it was)
    /// and the server not told yet: reads stop there until [`Contents::changed`] says the
    /// server's size.
    pub fn cut_here(&self, handle: Handle, size: u64) {
        self.cut_here.locked().insert(handle, size);
    }

    /// The size of `handle` as its last commit or map here left it (`None` while its state is
    /// in use, or was never made here).
    pub fn size_known(&self, handle: Handle) -> Option<u64> {
        let file = self.files.locked().get(&handle)?.clone();
        let state = file.try_lock().ok()?;
        Some(state.data.size())
    }

    /// The size `handle` was cut to here was refused by the server (or the file is gone):
    /// reads follow the server's map again.
    pub fn uncut(&self, handle: Handle) {
        self.cut_here.locked().remove(&handle);
        self.changed_elsewhere(Some(handle));
    }

    /// The size `handle` was cut to here, if it was.
    fn size_cut_here(&self, handle: Handle) -> Option<u64> {
        self.cut_here.locked().get(&handle).copied()
    }

    /// Buffers a write at `offset` through the open file `fh`.
    pub async fn write(
        &self,
        client: &Client,
        handle: Handle,
        offset: u64,
        data: &[u8],
        fh: u64,
    ) -> Result<(), i32> {
        if offset.saturating_add(data.len() as u64) > calm_types::FILE_SIZE_MAX {
            return Err(libc::EFBIG);
        }
        // Over the mount's bound: commit the other files' pending writes first.
        if self.buffered.load(Ordering::Relaxed) + data.len() as u64 > self.buffer_max {
            self.commit_all_but(client, handle).await?;
        }
        let file = self.file(handle);
        let mut state = file.lock().await;
        if state.data.wants_commit(self.buffer_max / 4) {
            self.commit_locked(client, handle, &mut state, false, Some(fh))
                .await
                .map_err(Failed::errno)?;
        }
        // Enough ids for the slices this write may start (one per chunk it touches).
        let chunks = calm_types::slices::split(offset, data.len() as u64).len() as u64;
        let ids = self.next_ids(chunks, client).await?;
        self.buffer(handle, &mut state, offset, data, ids, fh)?;
        Ok(())
    }

    /// [`Contents::write`] done at once, on the calling thread, when nothing stands in its way
    /// (no commit running on the file, the buffers under their bounds, slice ids at hand):
    /// `data` is copied once, into the buffer. False: nothing was done; go through
    /// [`Contents::write`]. Needs the runtime's context (it may start uploads).
    pub fn try_write_now(&self, handle: Handle, offset: u64, data: &[u8], fh: u64) -> bool {
        if offset.saturating_add(data.len() as u64) > calm_types::FILE_SIZE_MAX
            || self.buffered.load(Ordering::Relaxed) + data.len() as u64 > self.buffer_max
        {
            return false;
        }
        let file = self.file(handle);
        let Ok(mut state) = file.try_lock() else {
            return false;
        };
        if state.data.wants_commit(self.buffer_max / 4) {
            return false;
        }
        let chunks = calm_types::slices::split(offset, data.len() as u64).len() as u64;
        let ids = {
            let Ok(mut pool) = self.ids.try_lock() else {
                return false;
            };
            if pool.1 - pool.0 < chunks {
                return false;
            }
            let ids: Vec<u64> = (pool.0..pool.0 + chunks).collect();
            pool.0 += chunks;
            ids
        };
        self.buffer(handle, &mut state, offset, data, ids, fh)
            .is_ok()
    }

    /// Puts a write into the file's pending slices (`ids` for the slices it may start, one
    /// per chunk) and starts the uploads of the blocks it filled.
    fn buffer(
        &self,
        handle: Handle,
        state: &mut FileState,
        offset: u64,
        data: &[u8],
        ids: Vec<u64>,
        fh: u64,
    ) -> Result<(), i32> {
        let before = state.data.pending_bytes();
        // One id per chunk the write touches, at least what it needs.
        let Some(uploads) = state.data.write(offset, data, &ids, fh) else {
            tracing::error!(handle, offset, "a write was given too few slice ids");
            return Err(libc::EIO);
        };
        let grown = state.data.pending_bytes() - before;
        self.buffered.fetch_add(grown, Ordering::Relaxed);
        for upload in uploads {
            state.uploads.push(self.upload(upload));
        }
        self.publish_size(handle, &state.data);
        Ok(())
    }

    /// An O_APPEND write: committed pending writes first, then `data` placed whole at the
    /// file's end by the server, whatever other mounts append meanwhile: small appends inline
    /// (with their bytes), others as one object.
    pub async fn append(
        &self,
        client: &Client,
        handle: Handle,
        data: &[u8],
        fh: u64,
    ) -> Result<(), i32> {
        let size = u32::try_from(data.len())
            .ok()
            .filter(|s| u64::from(*s) <= calm_types::slices::CHUNK_BYTES)
            .ok_or(libc::EFBIG)?;
        if size == 0 {
            return Ok(());
        }
        let file = self.file(handle);
        let mut state = file.lock().await;
        self.commit_locked(client, handle, &mut state, false, Some(fh))
            .await
            .map_err(Failed::errno)?;
        let inline = self.inline_bytes_max > 0 && u64::from(size) <= self.inline_bytes_max;
        let mut placed = None;
        if inline {
            let id = self.next_ids(1, client).await?[0] | calm_types::slices::INLINE;
            match client.append(handle, id, size, Some(data.to_vec())).await {
                Ok(attr) => placed = Some(attr),
                // Not where inline bytes may be (another mount appended meanwhile, or the
                // file's inline bytes are at their limit): as an object.
                Err(MetaError::NotSupported(_)) => {}
                Err(error) => return Err(stale_errno(&error)),
            }
        }
        let attr = match placed {
            Some(attr) => attr,
            None => self.append_object(client, handle, data, size).await?,
        };
        state.data.resized(attr.size);
        state.loaded = false;
        state.cached = Some(version(&attr));
        Ok(())
    }

    /// `data` uploaded as one object, then placed at the file's end.
    async fn append_object(
        &self,
        client: &Client,
        handle: Handle,
        data: &[u8],
        size: u32,
    ) -> Result<Attr, i32> {
        let id = self.next_ids(1, client).await?[0];
        let mut uploads = Vec::new();
        for (b, len) in calm_types::slices::blocks(size) {
            let start = b as usize * calm_types::slices::BLOCK_BYTES as usize;
            uploads.push(self.upload(Upload {
                id,
                block: b,
                data: Bytes::copy_from_slice(&data[start..start + len as usize]),
            }));
        }
        if let Err(errno) = wait_uploads(uploads).await {
            self.delete_unnamed(&[(id, size)]).await;
            return Err(errno);
        }
        match client.append(handle, id, size, None).await {
            Ok(attr) => Ok(attr),
            Err(error) => {
                if final_refusal(&error) {
                    self.delete_unnamed(&[(id, size)]).await;
                }
                Err(stale_errno(&error))
            }
        }
    }

    /// Deletes objects this mount wrote that no record will name (their commit failed for
    /// good); what cannot be deleted now is left to `calm gc`.
    async fn delete_unnamed(&self, objects: &[(u64, u32)]) {
        for (id, size) in objects.iter().filter(|(id, _)| is_object(*id)) {
            if let Err(error) = self.objects.delete(*id, *size).await {
                tracing::warn!(id, %error, "deleting an object no file names");
            }
        }
    }

    fn upload(&self, upload: Upload) -> JoinHandle<Result<(), DataError>> {
        let objects = self.objects.clone();
        let permits = self.uploads.clone();
        tokio::spawn(async move {
            // The semaphore is never closed; were it, the upload would fail, not the mount.
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| DataError::Unavailable("the upload limiter is closed".into()))?;
            objects
                .put_block(upload.id, upload.block, upload.data)
                .await
        })
    }
}

/// The errno of an operation on an open file: one that is gone (another mount removed its
/// last name; this mount keeps the files it removes while open) is stale, as NFS says.
fn stale_errno(error: &MetaError) -> i32 {
    match error {
        MetaError::NotFound => libc::ESTALE,
        other => other.errno(),
    }
}
