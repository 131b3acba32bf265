//! The compactor: keeps the records of every chunk bounded, so that no file ever stops taking
//! writes because of how often it was written (`calm_meta::compaction` says what a compaction
//! replaces and when it is worth it).
//!
//! A write that leaves a chunk past [`CHUNK_SLICES_COMPACT`] records queues it; compactions
//! run in the background, [`COMPACTIONS_IN_FLIGHT_MAX`] at once, one at a time per chunk. A
//! compaction reads the chunk's records, writes the new slice block by block (at most one
//! block of [`BLOCK_BYTES`] in memory, and the object reads that fill it in flight, each
//! object read once per block where its visible pieces are dense), and commits it over the
//! records it read: records
//! written meanwhile stay on top, so writers never starve it. A write refused because its chunk
//! holds `CHUNK_SLICES_MAX` records waits for a compaction of that chunk and is tried again,
//! up to [`WRITE_ROOM_WAIT_MAX`]: the writer is slowed, not failed.
//!
//! Small appends keep their bytes inline in whatever chunk they land in. Once appends have
//! moved on to the next chunk, the chunk they left has its inline records merged into an
//! object (a flush, `calm_meta::compaction::plan_flush`): the metadata store holds the
//! inline bytes of a file's first chunk and of the chunk its end is in, not of every chunk
//! a log ever passed through.

use calm_types::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use calm_data::{DataError, Objects};
use calm_meta::compaction::{CHUNK_SLICES_COMPACT, plan, plan_flush};
use calm_meta::slices::{
    BLOCK_BYTES, CHUNK_BYTES, CHUNK_SLICES_MAX, INLINE, INLINE_FILE_BYTES_MAX,
    INLINE_SLICE_BYTES_MAX, Piece, Slice, Source, blocks, is_inline, pieces_in, view,
};
use calm_meta::{Meta, MetaError};
use calm_store::Store;
use tokio::sync::{Notify, Semaphore, mpsc};

/// Chunks waiting for a background compaction; past it a request is dropped (the chunk's next
/// write asks again).
pub const COMPACT_QUEUE_MAX: usize = 4096;
/// A compaction's place in the map of chunks being compacted: taken before it waits for the
/// chunk, left when it ends or is dropped (its caller went away), so that the map holds only
/// chunks that someone compacts or waits for.
struct Running<'a> {
    map: &'a Mutex<HashMap<ChunkId, Arc<tokio::sync::Mutex<()>>>>,
    key: ChunkId,
    chunk_lock: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> Running<'a> {
    fn enter(map: &'a Mutex<HashMap<ChunkId, Arc<tokio::sync::Mutex<()>>>>, key: ChunkId) -> Self {
        let chunk_lock = lock(map).entry(key).or_default().clone();
        Running {
            map,
            key,
            chunk_lock,
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        // The map's and ours (clones are made under the map's mutex): nobody else waits.
        if Arc::strong_count(&self.chunk_lock) == 2 {
            map.remove(&self.key);
        }
    }
}

/// Compactions running at once (each holds at most one block of its new slice in memory).
pub const COMPACTIONS_IN_FLIGHT_MAX: usize = 4;
/// Object reads in flight while one block of a new slice is filled.
pub const COMPACT_READS_IN_FLIGHT_MAX: usize = 16;
/// Times a compaction reads its chunk again when the chunk changed under it (a truncate, a
/// compaction by another server) before it leaves the chunk to its next write.
pub const COMPACT_ATTEMPTS_MAX: usize = 4;
/// Longest a write waits for room in its chunk before it is refused as busy.
pub const WRITE_ROOM_WAIT_MAX: Duration = Duration::from_secs(30);

/// Figures of the compactor, read by status.
#[derive(Debug, Default)]
pub struct CompactStats {
    /// Compactions committed since start.
    pub compacted: AtomicU64,
    /// Bytes of the new slices they wrote.
    pub merged_bytes: AtomicU64,
    /// Records they replaced.
    pub records_replaced: AtomicU64,
    /// Compactions that failed (the object store's error; the chunk's next write asks again).
    pub failed: AtomicU64,
    /// Writes that had to wait for room in their chunk, since start; waiting now; the longest
    /// wait in milliseconds.
    pub room_waits: AtomicU64,
    pub room_waiting: AtomicU64,
    pub room_wait_ms_max: AtomicU64,
    /// The most records a write left in one chunk since start.
    pub chunk_records_max: AtomicU64,
}

/// A chunk of a file: `(handle, chunk index)`.
type ChunkId = (u64, u64);

/// A compaction asked for: of chunk `chunk` of file `handle`, to bound its records, or, with
/// `flush`, to move its inline bytes into an object (the file's end has left the chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Job {
    handle: u64,
    chunk: u64,
    flush: bool,
}

/// The compactor of one server.
#[derive(Debug)]
pub struct Compactor {
    objects: Objects,
    queue: mpsc::Sender<Job>,
    /// Jobs in the queue (each once).
    queued: Mutex<HashSet<Job>>,
    /// One lock per chunk being compacted: a second compaction of it waits for the first.
    running: Mutex<HashMap<ChunkId, Arc<tokio::sync::Mutex<()>>>>,
    wake_deleter: Arc<Notify>,
    pub stats: CompactStats,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.locked()
}

fn data_error(error: DataError) -> MetaError {
    match error {
        // An object a record named is gone: the chunk changed since it was read (and the
        // deleter's delay passed). Read again.
        DataError::Missing(what) => {
            MetaError::Busy(format!("an object of the chunk is gone: {what}"))
        }
        other => MetaError::Io(format!("object store: {other}")),
    }
}

impl Compactor {
    /// Starts the background compactions on the current runtime.
    pub fn start<S: Store>(
        meta: Weak<Meta<S>>,
        objects: Objects,
        wake_deleter: Arc<Notify>,
    ) -> Arc<Compactor> {
        let (queue, receiver) = mpsc::channel(COMPACT_QUEUE_MAX);
        let compactor = Arc::new(Compactor {
            objects,
            queue,
            queued: Mutex::new(HashSet::new()),
            running: Mutex::new(HashMap::new()),
            wake_deleter,
            stats: CompactStats::default(),
        });
        tokio::spawn(background(Arc::downgrade(&compactor), meta, receiver));
        compactor
    }

    /// A write placed records in these chunks of `handle`: queue the ones that hold more than
    /// [`CHUNK_SLICES_COMPACT`].
    pub fn written<S: Store>(&self, meta: &Meta<S>, handle: u64, chunks: &[u64]) {
        for chunk in chunks {
            let Ok(records) = meta.chunk_record_count(handle, *chunk) else {
                continue;
            };
            self.stats
                .chunk_records_max
                .fetch_max(records as u64, Ordering::Relaxed);
            if records > CHUNK_SLICES_COMPACT {
                self.enqueue(Job {
                    handle,
                    chunk: *chunk,
                    flush: false,
                });
            }
        }
    }

    /// An append placed its bytes at `[start, end)` of `handle`: when they are the first of
    /// a chunk, the chunk before it, which the file's end has left, has its inline bytes moved
    /// into an object. The first chunk keeps its own: it is the head of a small file, where
    /// inline bytes belong.
    pub fn appended<S: Store>(&self, meta: &Meta<S>, handle: u64, start: u64, end: u64) {
        let chunk = end.saturating_sub(1) / CHUNK_BYTES;
        let opens_chunk = start / CHUNK_BYTES != chunk || start.is_multiple_of(CHUNK_BYTES);
        if chunk < 2 || !opens_chunk {
            return;
        }
        let before = chunk - 1;
        if meta
            .read_chunk(handle, before)
            .is_ok_and(|read| read.records.iter().any(|r| is_inline(r.id)))
        {
            self.enqueue(Job {
                handle,
                chunk: before,
                flush: true,
            });
        }
    }

    /// Queues `job` unless it is queued already; dropped when the queue is full (the chunk's
    /// next write asks again).
    fn enqueue(&self, job: Job) {
        if lock(&self.queued).insert(job) && self.queue.try_send(job).is_err() {
            lock(&self.queued).remove(&job);
        }
    }

    /// Of `chunks` of `handle`, those with no room for `adding` more records.
    pub fn full<S: Store>(
        &self,
        meta: &Meta<S>,
        handle: u64,
        chunks: &[u64],
        adding: usize,
    ) -> Vec<u64> {
        chunks
            .iter()
            .copied()
            .filter(|chunk| {
                meta.chunk_record_count(handle, *chunk)
                    .is_ok_and(|n| n + adding > CHUNK_SLICES_MAX)
            })
            .collect()
    }

    /// Compacts `chunks` of `handle` now, for a write that found no room in them (see
    /// [`WRITE_ROOM_WAIT_MAX`] for how long its caller keeps trying). True when a compaction
    /// was committed (by this call, or by the one it waited for).
    pub async fn make_room<S: Store>(
        &self,
        meta: &Meta<S>,
        handle: u64,
        chunks: &[u64],
    ) -> Result<bool, MetaError> {
        let started = Instant::now();
        self.stats.room_waits.fetch_add(1, Ordering::Relaxed);
        self.stats.room_waiting.fetch_add(1, Ordering::Relaxed);
        let mut result = Ok(false);
        for chunk in chunks {
            let before = self.stats.compacted.load(Ordering::Relaxed);
            let job = Job {
                handle,
                chunk: *chunk,
                flush: false,
            };
            match self.compact(meta, job).await {
                Ok(done) => {
                    let any = done || self.stats.compacted.load(Ordering::Relaxed) > before;
                    result = result.map(|earlier| earlier || any);
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.stats.room_waiting.fetch_sub(1, Ordering::Relaxed);
        self.stats
            .room_wait_ms_max
            .fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        result
    }

    /// Runs `job` if the chunk's records call for it (after any compaction of the chunk
    /// already running). True when a compaction was committed.
    async fn compact<S: Store>(&self, meta: &Meta<S>, job: Job) -> Result<bool, MetaError> {
        let running = Running::enter(&self.running, (job.handle, job.chunk));
        let result = {
            let _held = running.chunk_lock.lock().await;
            self.compact_alone(meta, job).await
        };
        drop(running);
        match &result {
            Ok(true) => {
                self.stats.compacted.fetch_add(1, Ordering::Relaxed);
                // The replaced records' objects are in the deletion queue now.
                self.wake_deleter.notify_one();
            }
            Ok(false) => {}
            Err(_) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// [`Compactor::compact`] with the chunk's lock held.
    async fn compact_alone<S: Store>(&self, meta: &Meta<S>, job: Job) -> Result<bool, MetaError> {
        let Job {
            handle,
            chunk,
            flush,
        } = job;
        let mut inline_allowed = !flush;
        for _ in 0..COMPACT_ATTEMPTS_MAX {
            let read = match meta.read_chunk(handle, chunk) {
                Ok(read) => read,
                Err(MetaError::NotFound) => return Ok(false),
                Err(error) => return Err(error),
            };
            let plan = if flush {
                plan_flush(&read.records)
            } else if read.records.len() > CHUNK_SLICES_COMPACT {
                plan(&read.records, false)
            } else {
                None
            };
            let Some(plan) = plan else {
                return Ok(false);
            };
            let new = match plan.merge {
                None => None,
                Some((pos, len)) => {
                    let inline = inline_allowed
                        && len <= INLINE_SLICE_BYTES_MAX
                        && chunk == 0
                        && u64::from(pos) + u64::from(len) <= INLINE_FILE_BYTES_MAX;
                    match self
                        .write_slice(meta, &read.records, pos, len, inline)
                        .await
                    {
                        Ok(new) => Some(new),
                        Err(MetaError::Busy(_)) => continue,
                        Err(error) => return Err(error),
                    }
                }
            };
            let (slice, inline) = match &new {
                Some((slice, inline)) => (Some(*slice), inline.clone()),
                None => (None, None),
            };
            let replaced = plan.dropped.len() as u64;
            let result = meta
                .compact(handle, chunk, read.value, plan.kept, slice, inline)
                .await;
            if result.is_err()
                && let Some(slice) = slice.filter(|s| !is_inline(s.id))
            {
                // Named by no record: gone at once.
                if let Err(error) = self.objects.delete(slice.id, slice.size).await {
                    tracing::warn!(id = slice.id, %error, "deleting an unused compaction");
                }
            }
            match result {
                Ok(()) => {
                    self.stats
                        .merged_bytes
                        .fetch_add(slice.map_or(0, |s| u64::from(s.len)), Ordering::Relaxed);
                    self.stats
                        .records_replaced
                        .fetch_add(replaced, Ordering::Relaxed);
                    return Ok(true);
                }
                // The chunk changed other than by new records on top: read it again.
                Err(MetaError::Busy(_)) => continue,
                // The file's inline bytes are at their limit: as an object.
                Err(MetaError::NotSupported(_)) => inline_allowed = false,
                Err(MetaError::NotFound) => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(false)
    }

    /// Writes the new slice of a compaction: the visible bytes of `records` over `[pos, pos +
    /// len)`, inline (returned) or as an object (written and made durable).
    async fn write_slice<S: Store>(
        &self,
        meta: &Meta<S>,
        records: &[Slice],
        pos: u32,
        len: u32,
        inline: bool,
    ) -> Result<(Slice, Option<Vec<u8>>), MetaError> {
        let view = view(records);
        let id = meta.alloc_slices(1).await?;
        let slice = |id| Slice {
            id,
            size: len,
            off: 0,
            len,
            pos,
        };
        if inline {
            let bytes = self.fill(meta, &view, pos, len).await?;
            return Ok((slice(id | INLINE), Some(bytes)));
        }
        let written = async {
            for (block, block_len) in blocks(len) {
                let from = pos + block * BLOCK_BYTES as u32;
                let data = self.fill(meta, &view, from, block_len).await?;
                self.objects
                    .put_block(id, block, bytes::Bytes::from(data))
                    .await
                    .map_err(data_error)?;
            }
            self.objects.sync(id, len).await.map_err(data_error)
        };
        match written.await {
            Ok(()) => Ok((slice(id), None)),
            Err(error) => {
                let _ = self.objects.delete(id, len).await;
                Err(error)
            }
        }
    }

    /// The visible bytes of a chunk (`view`) over `[from, from + len)`.
    async fn fill<S: Store>(
        &self,
        meta: &Meta<S>,
        view: &[Piece],
        from: u32,
        len: u32,
    ) -> Result<Vec<u8>, MetaError> {
        use futures::StreamExt;
        let pieces = pieces_in(view, from, from + len);
        let mut inline_ids: Vec<u64> = pieces
            .iter()
            .filter_map(|p| match p.source {
                Source::Object { id, .. } if is_inline(id) => Some(id),
                _ => None,
            })
            .collect();
        inline_ids.sort_unstable();
        inline_ids.dedup();
        let inline: HashMap<u64, Vec<u8>> = match meta.inline_bytes(&inline_ids) {
            Ok(bytes) => bytes.into_iter().collect(),
            Err(MetaError::NotFound) => {
                return Err(MetaError::Busy("inline bytes of the chunk are gone".into()));
            }
            Err(error) => return Err(error),
        };
        let mut data = vec![0u8; len as usize];
        for piece in &pieces {
            if let Source::Object { id, off, .. } = piece.source
                && is_inline(id)
            {
                let at = (piece.pos - from) as usize;
                let bytes = inline
                    .get(&id)
                    .and_then(|b| b.get(off as usize..(off + piece.len) as usize))
                    .ok_or_else(|| {
                        MetaError::Corrupt(format!(
                            "inline slice {id:#x} is shorter than its record"
                        ))
                    })?;
                data[at..at + bytes.len()].copy_from_slice(bytes);
            }
        }
        let objects = &self.objects;
        let mut fetched = futures::stream::iter(object_reads(&pieces, from))
            .map(|read| async move {
                objects
                    .read(read.id, read.size, read.off, read.len)
                    .await
                    .map(|bytes| (read, bytes))
            })
            .buffer_unordered(COMPACT_READS_IN_FLIGHT_MAX);
        // Each read is copied into place as it comes: what is held is the reads in flight.
        while let Some(done) = fetched.next().await {
            let (read, bytes) = done.map_err(data_error)?;
            for (at, skip, n) in read.parts {
                let (at, skip, n) = (at as usize, skip as usize, n as usize);
                data[at..at + n].copy_from_slice(&bytes[skip..skip + n]);
            }
        }
        Ok(data)
    }
}

/// Bytes a read of one object may fetch beyond twice the bytes it uses: about what the object
/// store's checksummed pieces add to any read.
const READ_SLACK_BYTES: u64 = 64 << 10;

/// One object read of a compaction's fill: `len` bytes of object `id` (of `size`) from `off`,
/// and where its parts go: `(where in the range, where in the read, how many bytes)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectRead {
    id: u64,
    size: u32,
    off: u32,
    len: u32,
    parts: Vec<(u32, u32, u32)>,
}

/// The object reads that fill a range starting at chunk position `from` from its visible
/// `pieces`: the pieces of one object are read at once when the span they cover is at most
/// twice their bytes (plus [`READ_SLACK_BYTES`]), so an older merged slice seen through the
/// gaps between many small writes is read once, not once per gap, and no read fetches much
/// more than it uses.
fn object_reads(pieces: &[Piece], from: u32) -> Vec<ObjectRead> {
    /// An object's size, and its pieces: (where in the range, where in the object, bytes).
    type Pieces = (u32, Vec<(u32, u32, u32)>);
    let mut by_object: std::collections::BTreeMap<u64, Pieces> = Default::default();
    for piece in pieces {
        if let Source::Object { id, size, off } = piece.source
            && !is_inline(id)
        {
            let entry = by_object.entry(id).or_insert((size, Vec::new()));
            entry.1.push((piece.pos - from, off, piece.len));
        }
    }
    let mut out = Vec::new();
    for (id, (size, parts)) in by_object {
        let lo = parts.iter().map(|p| p.1).min().unwrap_or(0);
        let hi = parts.iter().map(|p| p.1 + p.2).max().unwrap_or(0);
        let used: u64 = parts.iter().map(|p| u64::from(p.2)).sum();
        if u64::from(hi - lo) <= 2 * used + READ_SLACK_BYTES {
            out.push(ObjectRead {
                id,
                size,
                off: lo,
                len: hi - lo,
                parts: parts
                    .iter()
                    .map(|(at, off, n)| (*at, off - lo, *n))
                    .collect(),
            });
        } else {
            out.extend(parts.iter().map(|(at, off, n)| ObjectRead {
                id,
                size,
                off: *off,
                len: *n,
                parts: vec![(*at, 0, *n)],
            }));
        }
    }
    out
}

/// Takes queued chunks and compacts them, [`COMPACTIONS_IN_FLIGHT_MAX`] at once.
async fn background<S: Store>(
    compactor: Weak<Compactor>,
    meta: Weak<Meta<S>>,
    mut queue: mpsc::Receiver<Job>,
) {
    let permits = Arc::new(Semaphore::new(COMPACTIONS_IN_FLIGHT_MAX));
    while let Some(job) = queue.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (Some(compactor), Some(meta)) = (compactor.upgrade(), meta.upgrade()) else {
            return;
        };
        lock(&compactor.queued).remove(&job);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = compactor.compact(&meta, job).await {
                let Job { handle, chunk, .. } = job;
                tracing::warn!(handle, chunk, %error, "compacting a chunk");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_meta::slices::view;
    use proptest::prelude::*;

    fn byte(id: u64, at: u32) -> u8 {
        (id.wrapping_mul(31).wrapping_add(u64::from(at)) % 251) as u8 + 1
    }

    proptest! {
        /// Reads planned for a range fill it exactly as one read per piece would, and fetch
        /// from each object at most twice the bytes used from it plus the slack.
        #[test]
        fn object_reads_fill_the_range_and_fetch_little_more_than_they_use(
            raw in prop::collection::vec((0u32..4000, 1u32..600, 0u64..4, 0u32..50), 1..60),
            from in 0u32..2000,
        ) {
            const LEN: u32 = 2000;
            let records: Vec<Slice> = raw
                .iter()
                .map(|(pos, len, id, off)| Slice {
                    // Ids 1..=4: several records of one object, at offsets of their own.
                    id: id + 1,
                    size: 10_000,
                    off: *off + pos,
                    len: *len,
                    pos: *pos,
                })
                .collect();
            let pieces = pieces_in(&view(&records), from, from + LEN);
            let mut want = vec![0u8; LEN as usize];
            let mut used: HashMap<u64, u64> = HashMap::new();
            for piece in &pieces {
                if let Source::Object { id, off, .. } = piece.source {
                    for i in 0..piece.len {
                        want[(piece.pos - from + i) as usize] = byte(id, off + i);
                    }
                    *used.entry(id).or_default() += u64::from(piece.len);
                }
            }
            let mut got = vec![0u8; LEN as usize];
            let mut fetched: HashMap<u64, u64> = HashMap::new();
            for read in object_reads(&pieces, from) {
                *fetched.entry(read.id).or_default() += u64::from(read.len);
                for (at, skip, n) in read.parts {
                    prop_assert!(skip + n <= read.len);
                    for i in 0..n {
                        got[(at + i) as usize] = byte(read.id, read.off + skip + i);
                    }
                }
            }
            prop_assert_eq!(got, want);
            for (id, bytes) in fetched {
                prop_assert!(bytes <= 2 * used[&id] + READ_SLACK_BYTES, "object {}", id);
            }
        }
    }

    /// An object seen through a hundred small gaps is read once.
    #[tokio::test]
    async fn a_compaction_dropped_while_waiting_leaves_no_place_in_the_map() {
        let map = Mutex::new(HashMap::new());
        let key = (7, 0);
        let first = Running::enter(&map, key);
        let held = first.chunk_lock.clone().lock_owned().await;
        // A second compaction of the chunk waits for the first; its caller goes away.
        let waiting = async {
            let second = Running::enter(&map, key);
            let _held = second.chunk_lock.lock().await;
        };
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), waiting)
                .await
                .is_err()
        );
        assert_eq!(lock(&map).len(), 1, "the first still runs");
        drop(held);
        drop(first);
        assert!(lock(&map).is_empty(), "{:?}", lock(&map).keys());
        // A dropped one that ran alone leaves nothing either.
        drop(Running::enter(&map, key));
        assert!(lock(&map).is_empty());
    }

    #[test]
    fn an_object_seen_through_many_gaps_is_read_once() {
        let mut records = vec![Slice {
            id: 1,
            size: 1 << 20,
            off: 0,
            len: 1 << 20,
            pos: 0,
        }];
        records.extend((0..100).map(|i| Slice {
            id: 100 + i,
            size: 100,
            off: 0,
            len: 100,
            pos: i as u32 * 10_000,
        }));
        let pieces = pieces_in(&view(&records), 0, 1 << 20);
        let reads = object_reads(&pieces, 0);
        assert_eq!(reads.iter().filter(|r| r.id == 1).count(), 1);
        assert_eq!(reads.len(), 101);
    }
}
