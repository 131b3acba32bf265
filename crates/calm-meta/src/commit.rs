//! Group commit: one thread owns the write side of the store. Callers queue mutations; the
//! thread takes everything queued (up to [`MetaOptions::batch_ops_max`]), applies it in one
//! write transaction, commits once (one fsync for the whole group) and only then answers each
//! caller. So concurrent operations share one durable commit, and an acknowledged operation is
//! durable.
//!
//! While a group is being committed, the next one gathers in the queue: the more callers, the
//! larger the groups, and the fsync cost per operation falls as load rises.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use calm_changelog::ChangelogConfig;
use calm_store::{Store, WriteTxn};
use tokio::sync::{mpsc, oneshot, watch};

use crate::alloc::HandleAllocator;
use crate::changelog::{Caller, ClState};
use crate::error::MetaError;
use crate::ops::{self, Ctx, Done, Failure, Op};

/// Tunables of the namespace, each with its unit.
#[derive(Debug, Clone)]
pub struct MetaOptions {
    /// Handles reserved per high-water-mark bump.
    pub handle_chunk: u64,
    /// Mutations waiting for the committer before callers are made to wait (backpressure).
    pub queue_ops_max: usize,
    /// Most mutations in one group commit.
    pub batch_ops_max: usize,
    /// Changelog limits and GC.
    pub changelog: ChangelogConfig,
}

impl Default for MetaOptions {
    fn default() -> Self {
        Self {
            handle_chunk: crate::alloc::HANDLE_CHUNK_DEFAULT,
            queue_ops_max: 65_536,
            batch_ops_max: 8192,
            changelog: ChangelogConfig::default(),
        }
    }
}

/// Figures of the committer, read by status.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub commits: AtomicU64,
    pub ops: AtomicU64,
    pub failed_commits: AtomicU64,
    pub largest_batch: AtomicU64,
    pub commit_ns_total: AtomicU64,
    /// Changelog records purged.
    pub cl_purged: AtomicU64,
}

pub(crate) struct Request {
    pub op: Op,
    pub caller: Caller,
    pub reply: oneshot::Sender<Result<Done, MetaError>>,
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The committer thread's loop; returns when every sender is gone and the queue is drained.
///
/// Changelog purge: while records wait to be purged, each group's transaction also deletes up
/// to [`crate::changelog::PURGE_RECORDS_PER_STEP`] of them (no extra commit under load), and
/// an idle committer purges in transactions of its own. Either way the purge never runs
/// inside the call that cleared the records.
pub(crate) fn run<S: Store>(
    store: Arc<S>,
    mut queue: mpsc::Receiver<Request>,
    options: MetaOptions,
    generation: u64,
    mut cl: ClState,
    last_index: watch::Sender<u64>,
    stats: Arc<CommitStats>,
) {
    let mut alloc = HandleAllocator::new(options.handle_chunk);
    let mut batch: Vec<Request> = Vec::with_capacity(options.batch_ops_max);
    let mut results: Vec<Result<Done, MetaError>> = Vec::with_capacity(options.batch_ops_max);
    loop {
        let first = if cl.purge_pending() {
            match queue.try_recv() {
                Ok(request) => request,
                Err(mpsc::error::TryRecvError::Empty) => {
                    purge_alone(&*store, &mut cl, &stats);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        } else {
            match queue.blocking_recv() {
                Some(request) => request,
                None => break,
            }
        };
        batch.push(first);
        while batch.len() < options.batch_ops_max {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let before = cl.clone();
        let outcome = commit_batch(
            &*store,
            &mut alloc,
            &mut cl,
            generation,
            &batch,
            &mut results,
            &stats,
        );
        match outcome {
            Ok(()) => {
                alloc.committed();
                last_index.send_if_modified(|last| std::mem::replace(last, cl.last) != cl.last);
                stats.commits.fetch_add(1, Ordering::Relaxed);
                stats.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
                stats
                    .largest_batch
                    .fetch_max(batch.len() as u64, Ordering::Relaxed);
                stats
                    .commit_ns_total
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                for (request, result) in batch.drain(..).zip(results.drain(..)) {
                    // A caller that went away no longer needs its answer; the work is durable.
                    let _ = request.reply.send(result);
                }
            }
            Err(error) => {
                alloc.aborted();
                cl = before;
                stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                results.clear();
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Applies `batch` in one transaction, with its changelog records and a purge step, and
/// commits it. On a store failure nothing of the batch remains and every operation gets the
/// error; the caller puts the changelog state back.
#[allow(clippy::too_many_arguments)]
fn commit_batch<S: Store>(
    store: &S,
    alloc: &mut HandleAllocator,
    cl: &mut ClState,
    generation: u64,
    batch: &[Request],
    results: &mut Vec<Result<Done, MetaError>>,
    stats: &CommitStats,
) -> Result<(), MetaError> {
    let mut txn = store.begin()?;
    let mut ctx = Ctx::new(&mut txn, alloc, cl, now_ns(), generation);
    for request in batch {
        ctx.caller = request.caller;
        match ops::apply(&mut ctx, &request.op) {
            Ok(done) => results.push(Ok(done)),
            Err(Failure::Meta(error)) => results.push(Err(error)),
            Err(Failure::Store(error)) => return Err(error.into()),
        }
    }
    ctx.flush().map_err(MetaError::from)?;
    let purged = cl.purge_step(&mut txn).map_err(MetaError::from)?;
    txn.commit()?;
    stats.cl_purged.fetch_add(purged, Ordering::Relaxed);
    Ok(())
}

/// One purge step in a transaction of its own (the committer has nothing else to do).
fn purge_alone<S: Store>(store: &S, cl: &mut ClState, stats: &CommitStats) {
    let before = cl.clone();
    let outcome = (|| -> Result<u64, MetaError> {
        let mut txn = store.begin()?;
        let purged = cl.purge_step(&mut txn).map_err(MetaError::from)?;
        txn.commit()?;
        Ok(purged)
    })();
    match outcome {
        Ok(purged) => {
            stats.cl_purged.fetch_add(purged, Ordering::Relaxed);
        }
        Err(error) => {
            // Nothing is lost: the records stay until a later step deletes them. Wait for the
            // next request rather than spin on a failing store.
            tracing::warn!(%error, "changelog purge step failed");
            *cl = before;
            cl.defer_purge();
        }
    }
}
