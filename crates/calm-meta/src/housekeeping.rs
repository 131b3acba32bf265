//! The housekeeping thread: on a timer, it asks the committer for a changelog GC pass (when
//! idle readers are to be collected) and sweeps the request records older than they are kept
//! (`requests.rs`). Ends when the namespace stops it or is gone.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use calm_store::Store;
use tokio::sync::{mpsc, oneshot};

use crate::Caller;
use crate::commit::{self, now_ns};
use crate::ops::Op;
use crate::requests;

/// Longest pause between two sweeps of the request records.
const SWEEP_PERIOD_MAX: Duration = Duration::from_secs(60);

/// What the thread does, and how often.
pub(crate) struct Plan {
    /// Changelog GC passes, if idle readers are collected at all.
    pub changelog_every: Option<Duration>,
    /// Request records older than this are deleted (`None`: kept until acknowledged).
    pub records_kept: Option<Duration>,
}

impl Plan {
    pub fn new(options: &commit::MetaOptions) -> Plan {
        let config = &options.changelog;
        Plan {
            changelog_every: (config.idle_time_max_ns > 0 || config.idle_records_max > 0)
                .then(|| Duration::from_nanos(config.gc_interval_min_ns.max(1_000_000) as u64)),
            records_kept: (!options.request_records_kept.is_zero())
                .then_some(options.request_records_kept),
        }
    }

    pub fn idle(&self) -> bool {
        self.changelog_every.is_none() && self.records_kept.is_none()
    }

    /// A sweep every quarter of the time records are kept, at most a minute apart.
    fn sweep_every(&self) -> Option<Duration> {
        self.records_kept
            .map(|kept| (kept / 4).min(SWEEP_PERIOD_MAX))
    }
}

/// Runs the plan until `stop` is dropped or the namespace is gone.
pub(crate) fn run<S: Store>(
    store: Weak<S>,
    queue: mpsc::WeakSender<commit::Request>,
    stop: Receiver<()>,
    plan: Plan,
) {
    let start = Instant::now();
    let mut next_gc = plan.changelog_every.map(|every| start + every);
    let mut next_sweep = plan.sweep_every().map(|every| start + every);
    let mut cursor: Vec<u8> = requests::key(0, 0).to_vec();
    loop {
        let Some(wake) = [next_gc, next_sweep].into_iter().flatten().min() else {
            return;
        };
        match stop.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let now = Instant::now();
        if let Some(at) = next_gc
            && at <= now
        {
            next_gc = plan.changelog_every.map(|every| now + every);
            // The committer decides whether a pass is due; nothing waits for the answer.
            if submit(&queue, Op::ClGc).is_none() {
                return;
            }
        }
        if let Some(at) = next_sweep
            && at <= now
        {
            next_sweep = plan.sweep_every().map(|every| now + every);
            let Some(store) = store.upgrade() else { return };
            let kept = plan.records_kept.unwrap_or_default();
            match sweep(&store, &queue, &cursor, kept) {
                Ok(next) => {
                    cursor = next.unwrap_or_else(|| requests::key(0, 0).to_vec());
                }
                Err(error) => tracing::warn!(%error, "sweeping expired request records"),
            }
        }
    }
}

/// Queues `op`; `None` when the committer is gone.
fn submit(
    queue: &mpsc::WeakSender<commit::Request>,
    op: Op,
) -> Option<oneshot::Receiver<commit::Answer>> {
    let queue = queue.upgrade()?;
    let (reply, answer) = oneshot::channel();
    let request = commit::Request {
        op,
        caller: Caller::default(),
        id: None,
        reply,
    };
    queue.blocking_send(request).ok()?;
    Some(answer)
}

/// One pass: reads up to `SWEEP_KEYS_MAX` records from `cursor` and deletes the expired
/// ones; returns where the next pass starts.
fn sweep<S: Store>(
    store: &Arc<S>,
    queue: &mpsc::WeakSender<commit::Request>,
    cursor: &[u8],
    kept: Duration,
) -> crate::Result<Option<Vec<u8>>> {
    let before_ns = now_ns().saturating_sub(i64::try_from(kept.as_nanos()).unwrap_or(i64::MAX));
    let (old, next) = {
        let view = store.snapshot()?;
        requests::expired(&view, cursor, before_ns)?
    };
    for keys in old.chunks(requests::FORGETS_PER_OP_MAX) {
        let answer = submit(
            queue,
            Op::ForgetRequests {
                keys: keys.to_vec(),
            },
        )
        .ok_or_else(|| crate::MetaError::Io("the committer stopped".into()))?;
        answer
            .blocking_recv()
            .map_err(|_| crate::MetaError::Io("the committer stopped".into()))??;
    }
    if !old.is_empty() {
        tracing::info!(records = old.len(), "forgot expired request records");
    }
    Ok(next)
}
