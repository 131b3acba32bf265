//! Commits of a file's pending writes, and what their writers are told when one fails.
//!
//! - A commit takes the file's pending slices (uploaded first, or their bytes inline) and
//!   sends their records to the server under one request id. When the answer does not come
//!   (the server is gone, or holds the connection without answering, past the client's
//!   bound), the mount does not know whether the server applied it: the commit is kept as it
//!   was sent ([`Sent`], in [`FileState::in_doubt`]) and the next commit of the file sends it
//!   again first, the same records under the same id, before anything written later. A server
//!   that applied it answers as it did the first time (its record of the request outlives any
//!   outage a mount waits through, also a restart), one that did not applies it now: never
//!   twice, never refused for naming what it placed already.
//! - A commit refused for good (the file is gone, a quota or the store is full, permission
//!   was taken away) drops the writes it held and nothing else. Every open file that had bytes
//!   in it is told, once, at its next fsync, close or write (as Linux reports a failed
//!   write-back to every open file of the page it failed on), besides the caller who asked for
//!   the commit.

use super::*;
use std::time::{Duration, Instant};

use calm_client::failover::HeldRequest;
use calm_data::InlineCommit;
use calm_types::SetAttr;
use calm_types::slices::Slice;

/// Longest a commit whose answer never came is sent again, in milliseconds: half of what a
/// server keeps a request's record (an hour), so that a late send is always recognized.
/// Past it the writes are given up (their writers told EIO); their objects are left to
/// `calm gc`, which deletes only what no record names.
pub const IN_DOUBT_MS_MAX: u64 = 30 * 60 * 1000;

/// Why a commit did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
    /// Refused for good: the writes it held are dropped, and their writers told.
    Refused(i32),
    /// Not done now (the server could not be reached, was busy, or an object could not be made
    /// durable): everything is kept and sent again at the next commit.
    Kept(i32),
}

impl Failed {
    pub(crate) fn errno(self) -> i32 {
        match self {
            Failed::Refused(errno) | Failed::Kept(errno) => errno,
        }
    }
}

/// A commit on its way: the records of the file's first `slices` pending slices (with their
/// bytes when inline), the size the file reaches, and the request id every send of it
/// carries.
#[derive(Debug)]
pub(super) struct Sent {
    request: Option<HeldRequest>,
    records: Vec<(u64, Slice)>,
    end: u64,
    slices: usize,
    inline: Option<InlineCommit>,
    /// A send of it may have been applied (its answer never came): its objects are never
    /// deleted by the mount, whatever a later send is answered.
    doubtful: bool,
    first_sent: Instant,
}

impl Sent {
    /// The commit of the pending slices `commit` takes, their bytes inline (the slices are
    /// closed to further writes).
    fn inline(client: &Client, state: &mut FileState, commit: InlineCommit) -> Sent {
        state.data.close_first(commit.slices);
        Sent {
            request: client.hold_request(),
            records: commit.records.clone(),
            end: state.data.pending_end(),
            slices: commit.slices,
            inline: Some(commit),
            doubtful: false,
            first_sent: Instant::now(),
        }
    }
}

/// How one send of a commit ended.
enum Answer {
    /// Applied; with whether the change of attributes sent with it was too.
    Committed(bool),
    /// The server keeps no more inline bytes for the file: send the writes as objects.
    NotInline,
    Refused(i32),
    Kept(i32),
}

impl Contents {
    /// Commits `handle`'s pending writes (with `sync`, their objects made durable first) for
    /// the open file `fh`, when the caller has one: its answer is the commit's, or else the
    /// error of an earlier commit that dropped bytes `fh` wrote (told once).
    pub async fn commit(
        &self,
        client: &Client,
        handle: Handle,
        sync: bool,
        fh: Option<u64>,
    ) -> Result<(), i32> {
        let Some(file) = self.files.locked().get(&handle).cloned() else {
            return fh.and_then(|fh| self.take_error(fh)).map_or(Ok(()), Err);
        };
        let mut state = file.lock().await;
        let committed = self
            .commit_locked(client, handle, &mut state, sync, fh)
            .await;
        let owed = fh.and_then(|fh| self.take_error(fh));
        match committed {
            Err(failed) => Err(failed.errno()),
            Ok(()) => owed.map_or(Ok(()), Err),
        }
    }

    /// Commits `handle`'s pending writes with `then`, a change of the file's attributes, in
    /// one request where the writes go in one inline commit and nothing is in doubt (a small
    /// file's close): whether `then` was applied. Otherwise the writes are committed as
    /// [`Contents::commit`] does, and `then` is left to its caller (`false`).
    pub async fn commit_then(
        &self,
        client: &Client,
        handle: Handle,
        fh: Option<u64>,
        then: &SetAttr,
    ) -> Result<bool, i32> {
        let Some(file) = self.files.locked().get(&handle).cloned() else {
            return fh.and_then(|fh| self.take_error(fh)).map_or(Ok(false), Err);
        };
        let mut state = file.lock().await;
        let one = match state.in_doubt.is_none() && state.uploads.is_empty() {
            true => state.data.inline_commit(self.inline_bytes_max),
            false => None,
        };
        let committed = match one {
            Some(commit) => {
                let sent = Sent::inline(client, &mut state, commit);
                let answer = self
                    .send(client, handle, &mut state, sent, false, fh, Some(then))
                    .await;
                match answer {
                    Answer::Committed(changed) => Ok(changed),
                    // The file's inline bytes are full: as objects, alone.
                    Answer::NotInline => self
                        .commit_locked(client, handle, &mut state, false, fh)
                        .await
                        .map(|()| false),
                    Answer::Refused(errno) => Err(Failed::Refused(errno)),
                    Answer::Kept(errno) => Err(Failed::Kept(errno)),
                }
            }
            None => self
                .commit_locked(client, handle, &mut state, false, fh)
                .await
                .map(|()| false),
        };
        let owed = fh.and_then(|fh| self.take_error(fh));
        match committed {
            Err(failed) => Err(failed.errno()),
            Ok(changed) => owed.map_or(Ok(changed), Err),
        }
    }

    /// Commits what other files than `except` have pending (the mount's buffers are full). A
    /// refusal is not this writer's: it goes to those files' writers.
    pub(super) async fn commit_all_but(&self, client: &Client, except: Handle) -> Result<(), i32> {
        let dirty: Vec<Handle> = self
            .dirty_sizes
            .locked()
            .keys()
            .copied()
            .filter(|h| *h != except)
            .collect();
        for handle in dirty {
            let Some(file) = self.files.locked().get(&handle).cloned() else {
                continue;
            };
            let mut state = file.lock().await;
            match self
                .commit_locked(client, handle, &mut state, false, None)
                .await
            {
                Ok(()) | Err(Failed::Refused(_)) => {}
                Err(Failed::Kept(errno)) => return Err(errno),
            }
        }
        Ok(())
    }

    /// Commits everything pending of the file `state` holds: a commit left in doubt first,
    /// as it was sent, then the rest. A refusal drops only what the refused commit held.
    pub(super) async fn commit_locked(
        &self,
        client: &Client,
        handle: Handle,
        state: &mut FileState,
        sync: bool,
        fh: Option<u64>,
    ) -> Result<(), Failed> {
        if sync {
            // What earlier closes committed goes first: an fsync covers every byte written.
            sync_objects(&self.objects, &mut state.unsynced)
                .await
                .map_err(Failed::Kept)?;
        }
        let mut refused = None;
        let mut inline = self.inline_bytes_max > 0;
        loop {
            let sent = match state.in_doubt.take() {
                Some(sent) => sent,
                None => match self.prepare(client, handle, state, inline, fh).await {
                    Ok(Some(sent)) => sent,
                    Ok(None) => break,
                    Err(Failed::Refused(errno)) => {
                        refused = Some(errno);
                        break;
                    }
                    Err(kept) => return Err(kept),
                },
            };
            match self.send(client, handle, state, sent, sync, fh, None).await {
                Answer::Committed(_) => {}
                Answer::NotInline => inline = false,
                Answer::Refused(errno) => refused = Some(errno),
                Answer::Kept(errno) => return Err(Failed::Kept(errno)),
            }
        }
        refused.map_or(Ok(()), |errno| Err(Failed::Refused(errno)))
    }

    /// The next commit of everything pending: inline when it may be, else as objects
    /// (uploaded here). None when nothing is pending. An upload that failed drops the writes
    /// (the store is unreachable or full: `Refused`).
    async fn prepare(
        &self,
        client: &Client,
        handle: Handle,
        state: &mut FileState,
        inline: bool,
        fh: Option<u64>,
    ) -> Result<Option<Sent>, Failed> {
        if !state.data.is_dirty() && state.uploads.is_empty() {
            return Ok(None);
        }
        if inline
            && state.uploads.is_empty()
            && let Some(commit) = state.data.inline_commit(self.inline_bytes_max)
        {
            return Ok(Some(Sent::inline(client, state, commit)));
        }
        let (n, mut uploads) = state.data.seal();
        let single = match (state.uploads.is_empty(), uploads.len()) {
            (true, 1) => uploads.pop(),
            _ => None,
        };
        let uploaded = if let Some(upload) = single {
            // One block and nothing in flight (a small file): uploaded here rather than by a
            // task of its own, which would cost two thread switches.
            let _permit = self.uploads.acquire().await;
            self.objects
                .put_block(upload.id, upload.block, upload.data)
                .await
                .map_err(|error| {
                    tracing::warn!(%error, "uploading a block");
                    data_errno(&error)
                })
        } else {
            for upload in uploads {
                state.uploads.push(self.upload(upload));
            }
            wait_uploads(std::mem::take(&mut state.uploads)).await
        };
        if let Err(errno) = uploaded {
            // The writes are lost, and their writers told; nothing will name the objects
            // written so far, so they go now.
            return Err(self.refuse(handle, state, n, errno, fh, true).await);
        }
        if n == 0 {
            return Ok(None);
        }
        Ok(Some(Sent {
            request: client.hold_request(),
            records: state.data.records(n),
            end: state.data.pending_end(),
            slices: n,
            inline: None,
            doubtful: false,
            first_sent: Instant::now(),
        }))
    }

    /// Sends `sent` (again, when it was in doubt) and applies the answer; with `then`, that
    /// change of the file's attributes in the same request.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        client: &Client,
        handle: Handle,
        state: &mut FileState,
        mut sent: Sent,
        sync: bool,
        fh: Option<u64>,
        then: Option<&SetAttr>,
    ) -> Answer {
        if sent.first_sent.elapsed() >= Duration::from_millis(IN_DOUBT_MS_MAX) {
            tracing::error!(
                handle,
                minutes = IN_DOUBT_MS_MAX / 60_000,
                "a commit whose answer never came was sent again for too long: its writes are \
                 given up, and their writers told"
            );
            return Answer::Refused(
                self.refuse(handle, state, sent.slices, libc::EIO, fh, false)
                    .await
                    .errno(),
            );
        }
        if sync && sent.inline.is_none() {
            for (_, slice) in &sent.records {
                match self.objects.sync(slice.id, slice.size).await {
                    Ok(()) => {}
                    // Gone before any commit named it: collected by an online gc (the server
                    // refuses to name it, ESTALE), so the writes can never land.
                    Err(DataError::Missing(_)) => {
                        let delete = !sent.doubtful;
                        let failed = self
                            .refuse(handle, state, sent.slices, libc::ESTALE, fh, delete)
                            .await;
                        return Answer::Refused(failed.errno());
                    }
                    Err(error) => {
                        state.in_doubt = Some(sent);
                        return Answer::Kept(data_errno(&error));
                    }
                }
            }
        }
        let bytes = sent
            .inline
            .as_ref()
            .map(|commit| commit.bytes.clone())
            .unwrap_or_default();
        let answer = client
            .write_held(
                sent.request.as_ref(),
                handle,
                &sent.records,
                sent.end,
                bytes,
                then,
            )
            .await;
        match answer {
            Ok(attr) => {
                let changed = then.is_some_and(|change| shows(&attr, change));
                self.committed(handle, state, sent, &attr, sync);
                if state.unsynced.len() >= UNSYNCED_OBJECTS_MAX
                    && let Err(errno) = sync_objects(&self.objects, &mut state.unsynced).await
                {
                    return Answer::Kept(errno);
                }
                Answer::Committed(changed)
            }
            // The file's inline bytes are at their limit (nothing was applied).
            Err(MetaError::NotSupported(_)) if sent.inline.is_some() => Answer::NotInline,
            Err(error) if final_refusal(&error) => {
                let delete = !sent.doubtful;
                let failed = self
                    .refuse(handle, state, sent.slices, stale_errno(&error), fh, delete)
                    .await;
                Answer::Refused(failed.errno())
            }
            Err(error) => {
                // Perhaps applied, perhaps not: sent again, as it is, before anything else.
                sent.doubtful = true;
                state.in_doubt = Some(sent);
                Answer::Kept(meta_errno(&error))
            }
        }
    }

    /// `sent` was applied: its slices join the file's records.
    fn committed(
        &self,
        handle: Handle,
        state: &mut FileState,
        sent: Sent,
        attr: &Attr,
        sync: bool,
    ) {
        let bytes = state.data.pending_bytes_of(sent.slices);
        match sent.inline {
            Some(commit) => state.data.committed_inline(commit, attr.size),
            None => {
                state.data.committed(sent.slices, attr.size);
                if !sync && self.objects.is_local() {
                    let written = sent.records.iter().map(|(_, s)| s);
                    let objects = written.filter(|s| is_object(s.id));
                    state.unsynced.extend(objects.map(|s| (s.id, s.size)));
                }
            }
        }
        state.cached = Some(version(attr));
        bound_map(state);
        self.buffered.fetch_sub(bytes, Ordering::Relaxed);
        self.publish_size(handle, &state.data);
    }

    /// A lock this mount held on `handle` was lost: the writes not committed yet (made under
    /// it) are dropped, their writers owed EIO. A commit in doubt may have landed: its objects
    /// are left for `calm gc`.
    pub async fn lose(&self, handle: Handle) {
        let Some(file) = self.files.locked().get(&handle).cloned() else {
            return;
        };
        let mut state = file.lock().await;
        let doubtful = state.in_doubt.take().is_some();
        let pending = state.data.pending_count();
        if pending > 0 {
            self.refuse(handle, &mut state, pending, libc::EIO, None, !doubtful)
                .await;
        }
        state.loaded = false;
        state.cached = None;
    }

    /// Drops the first `n` pending writes of the file (their commit was refused with `errno`):
    /// every open file that wrote bytes in them, but the caller's `fh` (told by its answer),
    /// is owed the error. With `delete`, the objects they were to become go now (none may be
    /// named: no send of the commit was ever perhaps applied).
    async fn refuse(
        &self,
        handle: Handle,
        state: &mut FileState,
        n: usize,
        errno: i32,
        fh: Option<u64>,
        delete: bool,
    ) -> Failed {
        let writers = state.data.writers(n);
        let bytes = state.data.pending_bytes_of(n);
        let dropped = state.data.discard_first(n);
        if delete {
            self.delete_unnamed(&dropped).await;
        }
        self.buffered.fetch_sub(bytes, Ordering::Relaxed);
        self.publish_size(handle, &state.data);
        let told = self.owe(&writers, errno, fh);
        tracing::warn!(
            handle,
            errno,
            bytes,
            other_files_told = told,
            "a commit was refused: its writes are dropped"
        );
        Failed::Refused(errno)
    }
}

/// Makes durable every object of `unsynced` (a local store's: fdatasync of its files and
/// directories), and forgets those that are; the first failure is the error, and what was not
/// synced stays listed for the next try.
pub(super) async fn sync_objects(
    objects: &Objects,
    unsynced: &mut Vec<(u64, u32)>,
) -> Result<(), i32> {
    while let Some(&(id, size)) = unsynced.last() {
        match objects.sync(id, size).await {
            // Deleted since (the file was removed or rewritten): nothing to make durable.
            Ok(()) | Err(DataError::Missing(_)) => {}
            Err(e) => {
                tracing::warn!(id, %e, "syncing an object");
                return Err(data_errno(&e));
            }
        }
        unsynced.pop();
    }
    Ok(())
}

/// After a commit: a file written for long, and never read, would keep every record it
/// committed in this mount's map while the server compacts its own; past
/// [`MAP_CHUNK_RECORDS_MAX`] in a chunk, the map is dropped (pending writes stay) and the next
/// read loads the server's, compacted one.
fn bound_map(state: &mut FileState) {
    if !state.data.chunks_over(MAP_CHUNK_RECORDS_MAX).is_empty() {
        state.data.resized(state.data.committed_size());
        state.loaded = false;
    }
}

/// Whether the server refused a commit for good: trying the same records again cannot
/// succeed, so the writes are dropped. A busy server, or one that could not be reached (I/O),
/// may take them on the next try.
pub(super) fn final_refusal(error: &MetaError) -> bool {
    !matches!(error, MetaError::Busy(_) | MetaError::Io(_))
}

pub(super) async fn wait_uploads(
    uploads: Vec<JoinHandle<Result<(), DataError>>>,
) -> Result<(), i32> {
    let mut first_error = None;
    for upload in uploads {
        let result = match upload.await {
            Ok(result) => result,
            Err(e) => Err(DataError::Unavailable(format!("upload task: {e}"))),
        };
        if let Err(error) = result {
            tracing::warn!(%error, "uploading a block");
            first_error.get_or_insert(data_errno(&error));
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Whether `attr` shows `change` applied (a change the mount kept holds exact times).
fn shows(attr: &Attr, change: &SetAttr) -> bool {
    let time = |t: Option<calm_types::SetTime>, ns: i64| match t {
        Some(calm_types::SetTime::At(at)) => at == ns,
        Some(calm_types::SetTime::Now) => false,
        None => true,
    };
    change.mode.is_none_or(|m| m & 0o7777 == attr.mode & 0o7777)
        && change.uid.is_none_or(|u| u == attr.uid)
        && change.gid.is_none_or(|g| g == attr.gid)
        && time(change.atime, attr.atime_ns)
        && time(change.mtime, attr.mtime_ns)
}
