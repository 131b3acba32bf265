//! The server's part of the data plane, in the background: the deleter (removes the objects
//! of the deletion queue once they have waited their delay, then the queue entries) and the
//! compactor (rewrites a chunk's visible bytes as one slice once it holds too many records).
//! Neither is on a client's path: a client's write commits, and compaction follows.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use calm_data::Objects;
use calm_meta::slices::{
    CHUNK_SLICES_COMPACT, HOLE, INLINE, INLINE_FILE_BYTES_MAX, INLINE_SLICE_BYTES_MAX, Slice,
    Source, blocks, extent, is_inline, view,
};
use calm_meta::{Meta, MetaError};
use calm_store::Store;
use tokio::sync::{Notify, mpsc};

/// Entries the deleter takes from the queue at once.
pub const DELETE_BATCH_MAX: usize = 1024;
/// Objects deleted at once.
pub const DELETES_IN_FLIGHT_MAX: usize = 16;
/// Chunks waiting for compaction; past it a hint is dropped (the next write gives it again).
pub const COMPACT_QUEUE_MAX: usize = 4096;

/// How the data tasks behave.
#[derive(Debug, Clone)]
pub struct DataOptions {
    pub objects: Objects,
    /// How long an object stays in the deletion queue before it is deleted: a mount that
    /// read a file's map just before it changed may still read the object meanwhile.
    pub delete_delay: Duration,
    /// After a start, how long mounts of the previous run have to claim the files they keep
    /// open without a name (crate::orphans).
    pub orphan_claim_grace: Duration,
}

/// Figures of the data tasks, read by status.
#[derive(Debug, Default)]
pub struct DataStats {
    pub deleted: AtomicU64,
    pub compacted: AtomicU64,
}

/// The data tasks of one server.
#[derive(Debug)]
pub struct DataTasks {
    pub options: DataOptions,
    pub stats: Arc<DataStats>,
    compact: mpsc::Sender<(u64, u64)>,
    wake_deleter: Arc<Notify>,
}

impl DataTasks {
    /// Starts the deleter and the compactor on the current runtime.
    pub fn start<S: Store>(meta: Arc<Meta<S>>, options: DataOptions) -> Arc<DataTasks> {
        let (compact, queue) = mpsc::channel(COMPACT_QUEUE_MAX);
        let stats = Arc::new(DataStats::default());
        let wake_deleter = Arc::new(Notify::new());
        tokio::spawn(deleter(
            Arc::downgrade(&meta),
            options.clone(),
            stats.clone(),
            wake_deleter.clone(),
        ));
        tokio::spawn(compactor(
            Arc::downgrade(&meta),
            options.objects.clone(),
            stats.clone(),
            queue,
            wake_deleter.clone(),
        ));
        Arc::new(DataTasks {
            options,
            stats,
            compact,
            wake_deleter,
        })
    }

    /// A write placed records in these chunks of `handle`: compact the ones that hold too
    /// many.
    pub fn written<S: Store>(&self, meta: &Meta<S>, handle: u64, chunks: &[u64]) {
        for chunk in chunks {
            if let Ok(records) = meta.chunk_record_count(handle, *chunk)
                && records > CHUNK_SLICES_COMPACT
            {
                let _ = self.compact.try_send((handle, *chunk));
            }
        }
    }

    /// Something may have been queued for deletion.
    pub fn queued(&self) {
        self.wake_deleter.notify_one();
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Deletes what has waited its delay; sleeps until woken or the delay's end.
async fn deleter<S: Store>(
    meta: std::sync::Weak<Meta<S>>,
    options: DataOptions,
    stats: Arc<DataStats>,
    wake: Arc<Notify>,
) {
    let delay_ns = options.delete_delay.as_nanos() as u64;
    loop {
        let Some(strong) = meta.upgrade() else { return };
        let due = now_ns().saturating_sub(delay_ns);
        let batch = strong.garbage(u64::MAX, DELETE_BATCH_MAX);
        drop(strong);
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, "reading the deletion queue");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let ripe: Vec<_> = batch
            .iter()
            .filter(|g| g.queued_ns <= due)
            .copied()
            .collect();
        if ripe.is_empty() {
            // Sleep until the oldest entry is due, or something new is queued.
            let wait = batch.first().map_or(Duration::from_secs(60), |g| {
                Duration::from_nanos(
                    g.queued_ns
                        .saturating_add(delay_ns)
                        .saturating_sub(now_ns()),
                )
                .max(Duration::from_millis(10))
            });
            let _ = tokio::time::timeout(wait, wake.notified()).await;
            continue;
        }
        let deleted: Vec<(u64, u64)> = futures_lite_buffered(&options.objects, &ripe).await;
        if deleted.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let count = deleted.len() as u64;
        let Some(strong) = meta.upgrade() else { return };
        match strong.garbage_deleted(deleted).await {
            Ok(()) => {
                stats.deleted.fetch_add(count, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(%error, "clearing deleted objects from the queue");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Deletes the objects of `ripe`, [`DELETES_IN_FLIGHT_MAX`] at once; returns the entries
/// whose objects are gone.
async fn futures_lite_buffered(objects: &Objects, ripe: &[calm_meta::Garbage]) -> Vec<(u64, u64)> {
    use futures::StreamExt;
    futures::stream::iter(ripe.iter().copied())
        .map(|g| async move {
            match objects.delete(g.id, g.size).await {
                Ok(()) => Some((g.queued_ns, g.id)),
                Err(error) => {
                    tracing::warn!(id = g.id, %error, "deleting an object");
                    None
                }
            }
        })
        .buffer_unordered(DELETES_IN_FLIGHT_MAX)
        .filter_map(|x| async move { x })
        .collect()
        .await
}

async fn compactor<S: Store>(
    meta: std::sync::Weak<Meta<S>>,
    objects: Objects,
    stats: Arc<DataStats>,
    mut queue: mpsc::Receiver<(u64, u64)>,
    wake_deleter: Arc<Notify>,
) {
    while let Some((handle, chunk)) = queue.recv().await {
        let Some(meta) = meta.upgrade() else { return };
        match compact(&meta, &objects, handle, chunk).await {
            Ok(true) => {
                stats.compacted.fetch_add(1, Ordering::Relaxed);
                // The chunk's old objects are in the deletion queue now.
                wake_deleter.notify_one();
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(handle, chunk, %error, "compacting a chunk");
            }
        }
    }
}

/// Rewrites chunk `chunk` of `handle` as one slice. `false`: nothing to do (or it changed
/// meanwhile; a later write asks again).
pub async fn compact<S: Store>(
    meta: &Meta<S>,
    objects: &Objects,
    handle: u64,
    chunk: u64,
) -> Result<bool, String> {
    let read = meta.read_chunk(handle, chunk).map_err(|e| e.to_string())?;
    let (records, value) = (read.records, read.value);
    if records.len() <= CHUNK_SLICES_COMPACT {
        return Ok(false);
    }
    let inline: HashMap<u64, Vec<u8>> = read.inline.into_iter().collect();
    let len = extent(&records) as u32;
    let mut data = vec![0u8; len as usize];
    for piece in view(&records) {
        if let Source::Object { id, size, off } = piece.source {
            let at = piece.pos as usize..(piece.pos + piece.len) as usize;
            if is_inline(id) {
                let bytes = inline
                    .get(&id)
                    .and_then(|b| b.get(off as usize..(off + piece.len) as usize))
                    .ok_or_else(|| format!("inline slice {id:#x} is shorter than its record"))?;
                data[at].copy_from_slice(bytes);
                continue;
            }
            let bytes = objects
                .read(id, size, off, piece.len)
                .await
                .map_err(|e| e.to_string())?;
            data[at].copy_from_slice(&bytes);
        }
    }
    let id = meta.alloc_slices(1).await.map_err(|e| e.to_string())?;
    // A small chunk at the start of its file stays inline: no object to write.
    if u64::from(len) <= u64::from(INLINE_SLICE_BYTES_MAX)
        && (chunk * calm_meta::slices::CHUNK_BYTES + u64::from(len)) <= INLINE_FILE_BYTES_MAX
    {
        let slice = Slice {
            id: id | INLINE,
            size: len,
            off: 0,
            len,
            pos: 0,
        };
        return match meta.compact(handle, chunk, value, slice, Some(data)).await {
            Ok(()) => Ok(true),
            Err(MetaError::Busy(_) | MetaError::NotFound) => Ok(false),
            Err(error) => Err(error.to_string()),
        };
    }
    for (b, block_len) in blocks(len) {
        let start = b as usize * calm_meta::slices::BLOCK_BYTES as usize;
        objects
            .put_block(
                id,
                b,
                bytes::Bytes::copy_from_slice(&data[start..start + block_len as usize]),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    objects.sync(id, len).await.map_err(|e| e.to_string())?;
    let slice = Slice {
        id,
        size: len,
        off: 0,
        len,
        pos: 0,
    };
    debug_assert_ne!(slice.id, HOLE);
    match meta.compact(handle, chunk, value, slice, None).await {
        Ok(()) => Ok(true),
        Err(MetaError::Busy(_) | MetaError::NotFound) => {
            // Never named by any record: gone at once.
            let _ = objects.delete(id, len).await;
            Ok(false)
        }
        Err(error) => {
            let _ = objects.delete(id, len).await;
            Err(error.to_string())
        }
    }
}
