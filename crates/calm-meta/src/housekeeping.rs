//! The housekeeping thread: on a timer, it asks the committer for a changelog GC pass (when
//! idle readers are to be collected), sweeps the request records older than they are kept
//! (`requests.rs`) and the grants of handles unused for as long as they are kept
//! (`ops::grants`), and purges the entries of the trash older than it keeps them
//! (`ops::trash`). Ends when the namespace stops it or is gone.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use calm_store::Store;
use tokio::sync::{mpsc, oneshot};

use crate::Caller;
use crate::commit::{self, now_ns};
use crate::ops::Op;
use crate::ops::grants::{self, grant_key};
use crate::requests;

/// Longest pause between two sweeps of the request records.
const SWEEP_PERIOD_MAX: Duration = Duration::from_secs(60);
/// Longest pause between two sweeps of the grants of handles.
const GRANT_SWEEP_PERIOD_MAX: Duration = Duration::from_secs(300);
/// Pause between two passes of the trash's expiry (each visits at most
/// [`crate::ops::trash::EXPIRY_ENTRIES_PER_PASS`] entries) when the last found nothing
/// expired; a pass that purged entries is followed at once.
pub const TRASH_PASS_EVERY: Duration = Duration::from_secs(10);

/// What the thread does, and how often.
pub(crate) struct Plan {
    /// Changelog GC passes, if idle readers are collected at all.
    pub changelog_every: Option<Duration>,
    /// Request records older than this are deleted (`None`: kept until acknowledged).
    pub records_kept: Option<Duration>,
    /// Entries of the trash older than this are purged (`None`: no trash).
    pub trash_kept: Option<Duration>,
    /// Grants of handles unused for this long are deleted (`None`: kept).
    pub grants_kept: Option<Duration>,
}

impl Plan {
    pub fn new(options: &commit::MetaOptions) -> Plan {
        let config = &options.changelog;
        Plan {
            changelog_every: (config.idle_time_max_ns > 0 || config.idle_records_max > 0)
                .then(|| Duration::from_nanos(config.gc_interval_min_ns.max(1_000_000) as u64)),
            records_kept: (!options.request_records_kept.is_zero())
                .then_some(options.request_records_kept),
            trash_kept: (!options.trash_kept.is_zero()).then_some(options.trash_kept),
            grants_kept: (!options.grants_unused_kept.is_zero())
                .then_some(options.grants_unused_kept),
        }
    }

    pub fn idle(&self) -> bool {
        self.changelog_every.is_none()
            && self.records_kept.is_none()
            && self.trash_kept.is_none()
            && self.grants_kept.is_none()
    }

    /// A sweep of the grants every quarter of the time they are kept, at most five minutes
    /// apart.
    fn grants_every(&self) -> Option<Duration> {
        self.grants_kept
            .map(|kept| (kept / 4).min(GRANT_SWEEP_PERIOD_MAX))
    }

    fn trash_every(&self) -> Option<Duration> {
        self.trash_kept.map(|kept| kept.min(TRASH_PASS_EVERY))
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
    let mut next_trash = plan.trash_every().map(|every| start + every);
    let mut next_grants = plan.grants_every().map(|every| start + every);
    let mut cursor: Vec<u8> = requests::key(0, 0).to_vec();
    let mut grants_from: Vec<u8> = grant_key(0, 0).to_vec();
    // Grants written before they kept a time count as used when this thread began.
    let started_ns = now_ns();
    let mut trash_from = 0;
    loop {
        let Some(wake) = [next_gc, next_sweep, next_trash, next_grants]
            .into_iter()
            .flatten()
            .min()
        else {
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
        if let Some(at) = next_grants
            && at <= now
        {
            next_grants = plan.grants_every().map(|every| now + every);
            let Some(store) = store.upgrade() else { return };
            let kept = plan.grants_kept.unwrap_or_default();
            match sweep_grants(&store, &queue, &grants_from, kept, started_ns) {
                Ok(next) => grants_from = next.unwrap_or_else(|| grant_key(0, 0).to_vec()),
                Err(error) => tracing::warn!(%error, "sweeping unused grants of handles"),
            }
        }
        if let Some(at) = next_trash
            && at <= now
        {
            next_trash = plan.trash_every().map(|every| now + every);
            let Some(store) = store.upgrade() else { return };
            let kept = plan.trash_kept.unwrap_or_default();
            match expire_trash(&store, &queue, trash_from, kept) {
                Ok((next, purged)) => {
                    trash_from = next.unwrap_or(0);
                    // Entries expire as fast as files are removed: while a pass finds some,
                    // the next goes at once (from the start again after the last page), so
                    // the expiry keeps up with any rate of removals instead of one page per
                    // pause. Only a pass that found nothing expired waits.
                    if purged > 0 {
                        next_trash = Some(now);
                    }
                }
                Err(error) => tracing::warn!(%error, "purging expired entries of the trash"),
            }
        }
    }
}

/// One pass of the trash's expiry from handle `from`; returns where the next pass starts and
/// how many entries it purged.
fn expire_trash<S: Store>(
    store: &Arc<S>,
    queue: &mpsc::WeakSender<commit::Request>,
    from: u64,
    kept: Duration,
) -> crate::Result<(Option<u64>, usize)> {
    let before_ns = now_ns().saturating_sub(i64::try_from(kept.as_nanos()).unwrap_or(i64::MAX));
    let (old, next) = {
        let view = store.snapshot()?;
        crate::ops::trash::expired(&view, from, before_ns)?
    };
    let stopped = || crate::MetaError::Io("the committer stopped".into());
    let mut answers = Vec::with_capacity(old.len());
    for &(handle, removed_at) in &old {
        let op = Op::TrashPurge {
            handle,
            removed_at: Some(removed_at),
        };
        answers.push(submit(queue, op).ok_or_else(stopped)?);
    }
    for answer in answers {
        match answer.blocking_recv().map_err(|_| stopped())? {
            // Restored or purged meanwhile.
            Ok(_) | Err(crate::MetaError::NotFound) => {}
            Err(error) => return Err(error),
        }
    }
    if !old.is_empty() {
        tracing::info!(entries = old.len(), "purged expired entries of the trash");
    }
    Ok((next, old.len()))
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
        queued: std::time::Instant::now(),
        at: None,
    };
    queue.blocking_send(request).ok()?;
    Some(answer)
}

/// One pass over the grants of handles: reads up to `GRANT_SWEEP_KEYS_MAX` from `from` and
/// deletes those unused for `kept`; returns where the next pass starts.
fn sweep_grants<S: Store>(
    store: &Arc<S>,
    queue: &mpsc::WeakSender<commit::Request>,
    from: &[u8],
    kept: Duration,
    unknown_ns: i64,
) -> crate::Result<Option<Vec<u8>>> {
    let before_ns = ago_ns(kept);
    let (old, next) = grants::expired(&store.snapshot()?, from, before_ns, unknown_ns)?;
    let forget = |keys: &[[u8; 17]]| Op::ForgetGrants {
        keys: keys.to_vec(),
        before_ns,
        unknown_ns,
    };
    apply_all(
        queue,
        old.chunks(grants::GRANT_FORGETS_PER_OP_MAX).map(forget),
    )?;
    if !old.is_empty() {
        tracing::info!(grants = old.len(), "forgot grants of handles unused");
    }
    Ok(next)
}

/// One pass: reads up to `SWEEP_KEYS_MAX` records from `cursor` and deletes the expired
/// ones; returns where the next pass starts.
fn sweep<S: Store>(
    store: &Arc<S>,
    queue: &mpsc::WeakSender<commit::Request>,
    cursor: &[u8],
    kept: Duration,
) -> crate::Result<Option<Vec<u8>>> {
    let (old, next) = requests::expired(&store.snapshot()?, cursor, ago_ns(kept))?;
    let forget = |keys: &[[u8; 17]]| Op::ForgetRequests {
        keys: keys.to_vec(),
    };
    apply_all(queue, old.chunks(requests::FORGETS_PER_OP_MAX).map(forget))?;
    if !old.is_empty() {
        tracing::info!(records = old.len(), "forgot expired request records");
    }
    Ok(next)
}

/// The time `ago` before now, in ns since the epoch.
fn ago_ns(ago: Duration) -> i64 {
    now_ns().saturating_sub(i64::try_from(ago.as_nanos()).unwrap_or(i64::MAX))
}

/// Applies `ops` one after the other, each once the one before was answered.
fn apply_all(
    queue: &mpsc::WeakSender<commit::Request>,
    ops: impl Iterator<Item = Op>,
) -> crate::Result<()> {
    let stopped = || crate::MetaError::Io("the committer stopped".into());
    for op in ops {
        let answer = submit(queue, op).ok_or_else(stopped)?;
        answer.blocking_recv().map_err(|_| stopped())??;
    }
    Ok(())
}
