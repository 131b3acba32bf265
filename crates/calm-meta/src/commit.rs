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

use calm_store::{Store, WriteTxn};
use tokio::sync::{mpsc, oneshot};

use crate::alloc::HandleAllocator;
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
}

impl Default for MetaOptions {
    fn default() -> Self {
        Self {
            handle_chunk: crate::alloc::HANDLE_CHUNK_DEFAULT,
            queue_ops_max: 65_536,
            batch_ops_max: 8192,
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
}

pub(crate) struct Request {
    pub op: Op,
    pub reply: oneshot::Sender<Result<Done, MetaError>>,
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The committer thread's loop; returns when every sender is gone and the queue is drained.
pub(crate) fn run<S: Store>(
    store: Arc<S>,
    mut queue: mpsc::Receiver<Request>,
    options: MetaOptions,
    generation: u64,
    stats: Arc<CommitStats>,
) {
    let mut alloc = HandleAllocator::new(options.handle_chunk);
    let mut batch: Vec<Request> = Vec::with_capacity(options.batch_ops_max);
    let mut results: Vec<Result<Done, MetaError>> = Vec::with_capacity(options.batch_ops_max);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < options.batch_ops_max {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let outcome = commit_batch(&*store, &mut alloc, generation, &batch, &mut results);
        match outcome {
            Ok(()) => {
                alloc.committed();
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
                stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                results.clear();
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Applies `batch` in one transaction and commits it. On a store failure nothing of the batch
/// remains and every operation gets the error.
fn commit_batch<S: Store>(
    store: &S,
    alloc: &mut HandleAllocator,
    generation: u64,
    batch: &[Request],
    results: &mut Vec<Result<Done, MetaError>>,
) -> Result<(), MetaError> {
    let mut txn = store.begin()?;
    let mut ctx = Ctx::new(&mut txn, alloc, now_ns(), generation);
    for request in batch {
        match ops::apply(&mut ctx, &request.op) {
            Ok(done) => results.push(Ok(done)),
            Err(Failure::Meta(error)) => results.push(Err(error)),
            Err(Failure::Store(error)) => return Err(error.into()),
        }
    }
    ctx.flush().map_err(MetaError::from)?;
    txn.commit()?;
    Ok(())
}
