//! The server's part of the data plane, in the background: the deleter (removes the objects
//! of the deletion queue once they have waited their delay, then the queue entries) and the
//! compactor ([`crate::compactor`]). Neither is on a client's path: a client's write commits,
//! and compaction follows (unless the write's chunk is full: then it waits for one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use calm_data::Objects;
use calm_meta::Meta;
use calm_store::Store;
use tokio::sync::Notify;

use crate::compactor::Compactor;

/// Entries the deleter takes from the queue at once.
pub const DELETE_BATCH_MAX: usize = 1024;
/// Objects deleted at once.
pub const DELETES_IN_FLIGHT_MAX: usize = 16;

/// How the data tasks behave.
#[derive(Debug, Clone)]
pub struct DataOptions {
    pub objects: Objects,
    /// How long an object stays in the deletion queue before it is deleted: a mount that
    /// read a file's map just before it changed may still read the object meanwhile.
    pub delete_delay: Duration,
    /// After a start, how long mounts of the previous run have to claim the files they keep
    /// open without a name (the server's sweep of orphans).
    pub orphan_claim_grace: Duration,
}

/// Figures of the deleter, read by status.
#[derive(Debug, Default)]
pub struct DataStats {
    pub deleted: AtomicU64,
}

/// The data tasks of one server.
#[derive(Debug)]
pub struct DataTasks {
    pub options: DataOptions,
    pub stats: Arc<DataStats>,
    pub compactor: Arc<Compactor>,
    /// What the metadata backups did (the server's protection service reports them).
    pub backups: Arc<crate::backup::BackupStats>,
    wake_deleter: Arc<Notify>,
}

impl DataTasks {
    /// Starts the deleter and the compactor on the current runtime.
    pub fn start<S: Store>(meta: Arc<Meta<S>>, options: DataOptions) -> Arc<DataTasks> {
        let stats = Arc::new(DataStats::default());
        let wake_deleter = Arc::new(Notify::new());
        tokio::spawn(deleter(
            Arc::downgrade(&meta),
            options.clone(),
            stats.clone(),
            wake_deleter.clone(),
        ));
        let compactor = Compactor::start(
            Arc::downgrade(&meta),
            options.objects.clone(),
            wake_deleter.clone(),
        );
        Arc::new(DataTasks {
            options,
            stats,
            compactor,
            backups: Arc::default(),
            wake_deleter,
        })
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

/// How often the deleter says that its object store was taken over.
const TAKEN_SAID_EVERY: Duration = Duration::from_secs(60);

/// Shortest sleep of the deleter between two reads of the deletion queue.
const DELETER_SLEEP_MIN: Duration = Duration::from_millis(10);

/// Deletes what has waited its delay; sleeps until woken or the delay's end.
async fn deleter<S: Store>(
    meta: std::sync::Weak<Meta<S>>,
    options: DataOptions,
    stats: Arc<DataStats>,
    wake: Arc<Notify>,
) {
    let delay_ns = options.delete_delay.as_nanos() as u64;
    let mut taken_said = None;
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
            match batch.first() {
                // Nothing queued is due before the oldest entry: sleep until then (what is
                // queued meanwhile is due later; reading the queue on each would be wasted).
                Some(oldest) => {
                    let due_in = oldest
                        .queued_ns
                        .saturating_add(delay_ns)
                        .saturating_sub(now_ns());
                    tokio::time::sleep(Duration::from_nanos(due_in).max(DELETER_SLEEP_MIN)).await;
                }
                // Sleep until something is queued, then until it is due (another server's
                // entries are found within a minute).
                None => {
                    if tokio::time::timeout(Duration::from_secs(60), wake.notified())
                        .await
                        .is_ok()
                    {
                        tokio::time::sleep(options.delete_delay.max(DELETER_SLEEP_MIN)).await;
                    }
                }
            }
            continue;
        }
        // An object store another namespace took over: nothing to delete, said once a minute.
        if let Err(error) = options.objects.check_owner().await {
            if taken_said.is_none_or(|at: std::time::Instant| at.elapsed() >= TAKEN_SAID_EVERY) {
                tracing::error!(%error, "the deletion queue waits");
                taken_said = Some(std::time::Instant::now());
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            continue;
        }
        // The removals that queued them are durable before their objects go (a store may
        // answer a commit before it is on the medium).
        let Some(strong) = meta.upgrade() else { return };
        let synced = strong.sync().await;
        drop(strong);
        if let Err(error) = synced {
            tracing::warn!(%error, "the deletion queue waits");
            tokio::time::sleep(Duration::from_secs(1)).await;
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
