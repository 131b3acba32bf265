//! Group commit: one thread owns the write side of the store. Callers queue mutations; the
//! thread takes everything queued (up to [`MetaOptions::batch_ops_max`]), applies it in one
//! write transaction, commits once (one fsync for the whole group) and only then answers each
//! caller. So concurrent operations share one durable commit, and an acknowledged operation is
//! durable; or, on a store opened to flush later (`calm_store::CommitSync::Within`), written
//! and durable within the store's bound or at [`crate::Meta::sync`].
//!
//! While a group is being committed, the next one gathers in the queue: the more callers, the
//! larger the groups, and the fsync cost per operation falls as load rises.

use calm_types::sync::Locked;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use calm_changelog::ChangelogConfig;
use calm_store::{Store, WriteTxn};
use tokio::sync::{mpsc, oneshot};

pub use calm_lockfree::last_index::FOLLOWERS_WAITING_MAX;
pub(crate) use calm_lockfree::last_index::LastIndex;

use crate::Caller;
use crate::alloc::HandleAllocator;
use crate::changelog::ClState;
use crate::error::MetaError;
use crate::ops::{self, Ctx, Done, Failure, Op};
use crate::quota::Shares;
use crate::replaced::Replaced;

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
    /// The object store for file contents, as given by the operator: kept when the namespace
    /// is created; refused when it differs from the one a namespace already has.
    pub objects_url: Option<String>,
    /// The object store a namespace created without `objects_url` gets.
    pub objects_url_default: Option<String>,
    /// How long a request record is kept for a client that sends the request again
    /// (`requests.rs`); zero: until the client acknowledges it.
    pub request_records_kept: std::time::Duration,
    /// The store's place in a namespace over several metadata clusters (`crate::place`);
    /// `None`: a namespace of this store alone.
    pub place: Option<crate::place::Place>,
    /// How long removed files and directories stay in the trash (`crate::ops::trash`); zero:
    /// there is no trash, a removal is final.
    pub trash_kept: std::time::Duration,
    /// Nodes that lose their last name younger than this skip the trash (`crate::young`);
    /// zero: none do.
    pub trash_min_age: std::time::Duration,
    /// How long a grant of handles nobody used is kept (`ops::grants`).
    pub grants_unused_kept: std::time::Duration,
}

impl Default for MetaOptions {
    fn default() -> Self {
        Self {
            handle_chunk: crate::alloc::HANDLE_CHUNK_DEFAULT,
            queue_ops_max: 65_536,
            batch_ops_max: 8192,
            changelog: ChangelogConfig::default(),
            objects_url: None,
            objects_url_default: None,
            request_records_kept: crate::requests::RECORDS_KEPT_DEFAULT,
            place: None,
            trash_kept: std::time::Duration::ZERO,
            trash_min_age: crate::young::TRASH_MIN_AGE_DEFAULT,
            grants_unused_kept: crate::ops::grants::GRANT_UNUSED_KEPT,
        }
    }
}

/// Most operations per group on a shared store such as etcd: a group is one transaction of
/// the store, a create writes about five keys, and etcd's default limit is 128 operations per
/// transaction. (A group over the store's limits is cut in halves anyway.)
pub const SHARED_BATCH_OPS_MAX: usize = 16;

pub use crate::commit_stats::{CommitDistributions, CommitStats};
use crate::commit_stats::{GROUP_SIZE_BOUNDS, bucket};

pub(crate) struct Request {
    pub op: Op,
    pub caller: Caller,
    /// Applied at most once, however often it is sent (`crate::requests`).
    pub id: Option<crate::requests::RequestId>,
    pub reply: oneshot::Sender<Answer>,
    /// When it was made: a store that bounds a transaction's time counts it from the oldest
    /// request of the group (`Store::begin_within`), so that time spent queued behind groups
    /// that waited on the store counts against the request's bound.
    pub queued: std::time::Instant,
    /// When the change was answered where it was made (a mount's directory held, which sends
    /// it after): its times, instead of the group's.
    pub at: Option<i64>,
}

/// What a mutation answers: what it did, and the attributes of the one directory whose names
/// it changed, as they were right after it ([`ops::changed_dir`]; `None` for other mutations
/// and for a request answered from its record).
pub(crate) type Answer = Result<(Done, Option<crate::Attr>), MetaError>;

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// What the opening of the namespace decided, for every group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opened {
    /// Given to inodes created now (the opening's epoch).
    pub generation: u64,
    /// Where names are kept.
    pub names: crate::layout::NameHash,
    /// Removed files and directories go to the trash (`crate::ops::trash`).
    pub trash: bool,
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
    opened: Opened,
    mut cl: ClState,
    (last_index, replaced, shares): (Arc<LastIndex>, Arc<Mutex<Replaced>>, Arc<Shares>),
    stats: Arc<CommitStats>,
) {
    let shared = store.shared();
    stats.cl_first.fetch_max(cl.first, Ordering::Relaxed);
    let mut alloc = HandleAllocator::new(options.handle_chunk);
    let mut batch: Vec<Request> = Vec::with_capacity(options.batch_ops_max);
    let mut results: Vec<Answer> = Vec::with_capacity(options.batch_ops_max);
    let mut cleaned = crate::requests::Cleaned::default();
    let mut chains = crate::quota::Chains::default();
    let mut young = crate::young::YoungFiles::new(match opened.trash {
        true => options.trash_min_age,
        false => std::time::Duration::ZERO,
    });
    loop {
        let first = if cl.purge_pending() {
            match queue.try_recv() {
                Ok(request) => request,
                Err(mpsc::error::TryRecvError::Empty) => {
                    purge_alone(&*store, &mut cl, &stats);
                    stats.cl_first.fetch_max(cl.first, Ordering::Relaxed);
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
        let mut group = Group {
            store: &*store,
            alloc: &mut alloc,
            cl: &mut cl,
            cleaned: &mut cleaned,
            chains: &mut chains,
            young: &mut young,
            replaced: &replaced,
            shares: &shares,
            opened,
            shared,
            last_index: &last_index,
            stats: &stats,
        };
        group.commit_or_split(&mut batch, &mut results);
        stats.cl_first.fetch_max(cl.first, Ordering::Relaxed);
    }
}

/// Most times a group is run again after a conflict with another server's commit (a shared
/// store) before its operations are answered with the error.
pub const CONFLICT_RETRIES_MAX: u32 = 1000;

/// What committing one group needs from the committer.
struct Group<'c, S: Store> {
    store: &'c S,
    alloc: &'c mut HandleAllocator,
    cl: &'c mut ClState,
    /// Up to where each client's request records are deleted (changed after a commit only).
    cleaned: &'c mut crate::requests::Cleaned,
    /// Which limited trees each directory is in, as the last group committed left them.
    chains: &'c mut crate::quota::Chains,
    /// The nodes this committer made lately (they skip the trash: `crate::young`).
    young: &'c mut crate::young::YoungFiles,
    /// Small files replaced lately, readable by handle a moment more (`crate::replaced`).
    replaced: &'c Mutex<Replaced>,
    /// The quota shares set aside for held directories (`crate::quota::shares`).
    shares: &'c Arc<Shares>,
    opened: Opened,
    /// Other processes write the store too (see [`Store::shared`]).
    shared: bool,
    last_index: &'c LastIndex,
    stats: &'c CommitStats,
}

/// Why a group did not commit.
enum GroupError {
    /// Another writer committed first (a shared store): run the group again.
    Conflict,
    /// The group's transaction is over a limit of the store (too many writes or bytes for one
    /// transaction): commit it in smaller parts.
    TooLarge(MetaError),
    /// Every operation of the group gets this error.
    Failed(MetaError),
    /// Applying the group panicked (a bug): nothing of it was written. A group of several
    /// operations is cut in halves and each runs again, so only the operation that panics is
    /// refused; it gets an I/O error, and the committer goes on with the next group.
    Panicked(String),
}

impl From<calm_store::StoreError> for GroupError {
    fn from(error: calm_store::StoreError) -> Self {
        match error {
            calm_store::StoreError::Conflict => GroupError::Conflict,
            calm_store::StoreError::Limit(_) => GroupError::TooLarge(error.into()),
            other => GroupError::Failed(other.into()),
        }
    }
}

impl From<MetaError> for GroupError {
    fn from(error: MetaError) -> Self {
        GroupError::Failed(error)
    }
}

impl<S: Store> Group<'_, S> {
    /// Commits `batch` and answers every request of it (draining it). A group over the
    /// store's transaction limits is cut in halves, each committed on its own (a single
    /// operation over them is refused alone); a group that lost a conflict runs again.
    fn commit_or_split(&mut self, batch: &mut Vec<Request>, results: &mut Vec<Answer>) {
        let started = std::time::Instant::now();
        match self.commit_group(batch, results) {
            Ok(()) => self.answer(batch, results, started),
            Err(GroupError::TooLarge(_) | GroupError::Panicked(_)) if batch.len() > 1 => {
                let mut second = batch.split_off(batch.len() / 2);
                self.commit_or_split(batch, results);
                self.commit_or_split(&mut second, results);
            }
            Err(error) => self.refuse(batch, results, error),
        }
    }

    /// Applies and commits `batch` in one transaction, again on the new state after each
    /// conflict with another server's commit (up to [`CONFLICT_RETRIES_MAX`] times); on a
    /// failure nothing of it is written and the committer's state is as before.
    fn commit_group(
        &mut self,
        batch: &mut [Request],
        results: &mut Vec<Answer>,
    ) -> Result<(), GroupError> {
        let mut conflicts = 0;
        let mut deleted = Vec::new();
        loop {
            let before = self.cl.clone();
            results.clear();
            deleted.clear();
            // A panic while applying one operation must not take the only writer down with it:
            // the transaction is dropped as it unwinds (nothing of the group is written) and
            // the state below is put back as after any failed group.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                commit_batch(
                    self.store,
                    self.alloc,
                    self.cl,
                    (&*self.cleaned, &mut deleted),
                    (
                        &mut *self.chains,
                        &mut *self.young,
                        self.replaced,
                        self.shares,
                    ),
                    self.opened,
                    self.shared,
                    batch,
                    results,
                    self.stats,
                )
            }))
            .unwrap_or_else(|panic| Err(GroupError::Panicked(panic_message(&*panic))));
            let Err(error) = outcome else {
                self.alloc.committed();
                for &(client, acked) in &deleted {
                    self.cleaned.committed(client, acked);
                }
                return Ok(());
            };
            self.alloc.aborted();
            *self.cl = before;
            if !matches!(error, GroupError::Conflict) || conflicts >= CONFLICT_RETRIES_MAX {
                return Err(error);
            }
            conflicts += 1;
            // Another server's commit landed first: back off a little (it is likely to commit
            // again) and run the group on the new state.
            std::thread::sleep(std::time::Duration::from_micros(
                50 * u64::from(conflicts.min(40)),
            ));
        }
    }

    /// A group committed: its figures counted, every request answered.
    fn answer(
        &mut self,
        batch: &mut Vec<Request>,
        results: &mut Vec<Answer>,
        started: std::time::Instant,
    ) {
        let reached = self.cl.last;
        // The index is published before the answers (a caller that reads the last index after
        // its answer sees its own record), followers are woken after them (waking a reader must
        // not delay anyone's answer).
        self.last_index.publish(reached);
        let stats = self.stats;
        stats.commits.fetch_add(1, Ordering::Relaxed);
        stats.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats
            .largest_batch
            .fetch_max(batch.len() as u64, Ordering::Relaxed);
        let ns = started.elapsed().as_nanos() as u64;
        stats.commit_ns_total.fetch_add(ns, Ordering::Relaxed);
        stats.group_sizes[bucket(&GROUP_SIZE_BOUNDS, batch.len() as u64)]
            .fetch_add(1, Ordering::Relaxed);
        stats.commit_ns.observe(ns);
        for (request, result) in batch.drain(..).zip(results.drain(..)) {
            // A caller that went away no longer needs its answer; the work is durable.
            let _ = request.reply.send(result);
        }
        self.last_index.wake_followers();
    }

    /// A group refused whole (nothing of it written): every request is answered with why.
    fn refuse(&mut self, batch: &mut Vec<Request>, results: &mut Vec<Answer>, error: GroupError) {
        let error = match error {
            GroupError::Conflict => MetaError::Busy(format!(
                "the store kept conflicting with other writers ({CONFLICT_RETRIES_MAX} tries)"
            )),
            GroupError::TooLarge(error) | GroupError::Failed(error) => error,
            GroupError::Panicked(message) => {
                tracing::error!(
                    "the server failed while applying a request ({message}); it is refused, \
                     nothing of it was written, and the server goes on"
                );
                MetaError::Io(format!(
                    "the server failed while applying this request ({message}); nothing of it \
                     was written"
                ))
            }
        };
        self.stats.failed_commits.fetch_add(1, Ordering::Relaxed);
        results.clear();
        for request in batch.drain(..) {
            let _ = request.reply.send(Err(error.clone()));
        }
    }
}

/// Applies `batch` in one transaction, with its changelog records and a purge step, and
/// commits it. On a store failure nothing of the batch remains and every operation gets the
/// error; the caller puts the changelog state back.
///
/// On a shared store, when another server committed since this one's last commit, the
/// changelog state (readers, last index) is read again from the transaction first: the other
/// server may have appended records or changed readers (and if one commits after this read,
/// this transaction's commit fails with a conflict).
///
/// `cleaned`: up to where each client's request records are known deleted, and where the
/// clients whose acknowledged records this transaction deletes are noted (for after the
/// commit).
#[allow(clippy::too_many_arguments)]
fn commit_batch<S: Store>(
    store: &S,
    alloc: &mut HandleAllocator,
    cl: &mut ClState,
    cleaned: (&crate::requests::Cleaned, &mut Vec<(u64, u64)>),
    (chains, young, replaced, shares): (
        &mut crate::quota::Chains,
        &mut crate::young::YoungFiles,
        &Mutex<Replaced>,
        &Arc<Shares>,
    ),
    opened: Opened,
    shared: bool,
    batch: &[Request],
    results: &mut Vec<Answer>,
    stats: &CommitStats,
) -> Result<(), GroupError> {
    let (cleaned, deleted) = cleaned;
    let acked: Vec<_> = batch
        .iter()
        .map(|request| request.id.map(|id| cleaned.range(id)))
        .collect();
    let oldest = batch.iter().map(|request| request.queued).min();
    let mut txn = store.begin_within(oldest.unwrap_or_else(std::time::Instant::now))?;
    if shared && txn.written_by_others() {
        cl.reload(&txn)?;
    }
    if shared {
        read_ahead(&txn, cl.last, &opened, batch, &acked)?;
    }
    let mut ctx = Ctx::new(
        &mut txn,
        alloc,
        cl,
        now_ns(),
        opened.generation,
        opened.names,
    );
    ctx.quota = crate::quota::Quotas::with_chains(std::mem::take(chains), shares.clone());
    ctx.young = Some(&*young);
    ctx.trash = opened.trash;
    let group_now = ctx.now;
    for (request, acked) in batch.iter().zip(&acked) {
        ctx.caller = request.caller.clone();
        ctx.now = request.at.unwrap_or(group_now);
        match apply_one(&mut ctx, request, acked.as_ref(), deleted) {
            Ok(answer) => results.push(Ok(answer)),
            Err(Failure::Meta(error)) => results.push(Err(error)),
            Err(Failure::Store(error)) => return Err(error.into()),
        }
    }
    let kept = ctx.quota.take_chains();
    ctx.now = group_now;
    let (born, gone, now) = (
        std::mem::take(&mut ctx.born),
        std::mem::take(&mut ctx.gone),
        ctx.now,
    );
    let last_maps = std::mem::take(&mut ctx.replaced);
    let share_changes = ctx.quota.take_share_changes();
    ctx.flush().map_err(failure)?;
    let purged = cl
        .purge_step(&mut txn, store.writes_max())
        .map_err(failure)?;
    txn.commit()?;
    *chains = kept;
    if let Some((shares, changes)) = share_changes {
        shares.apply(changes);
    }
    for handle in gone {
        young.forget(handle);
    }
    for handle in born {
        young.born(handle, now);
    }
    if !last_maps.is_empty() {
        let mut kept = replaced.locked();
        for file in last_maps {
            kept.keep(file, now);
        }
    }
    stats.cl_purged.fetch_add(purged, Ordering::Relaxed);
    Ok(())
}

/// Reads ahead, on a shared store, what the group's operations read first (with the records
/// their requests delete) in one round trip, then what the entries just read name in a second,
/// instead of one round trip per operation.
fn read_ahead<T: WriteTxn>(
    txn: &T,
    cl_last: u64,
    opened: &Opened,
    batch: &[Request],
    acked: &[Option<(crate::requests::RecordKey, crate::requests::RecordKey)>],
) -> Result<(), GroupError> {
    let (mut keys, mut ranges) = (Vec::new(), Vec::new());
    for (request, acked) in batch.iter().zip(acked) {
        if let (Some(id), Some((start, end))) = (request.id, acked) {
            keys.push(crate::requests::key(id.client, id.seq).to_vec());
            ranges.push((start.to_vec(), end.to_vec()));
        }
        ops::keys_read_first(&request.op, &opened.names, &mut keys);
    }
    // The log's tail (empty), which the first record appended checks.
    ranges.push((calm_store::log_key(cl_last + 1).to_vec(), Vec::new()));
    txn.prefetch(&keys, &ranges)?;
    let (mut keys, mut ranges) = (Vec::new(), Vec::new());
    for request in batch {
        ops::reads_after_entries(txn, &opened.names, &request.op, &mut keys, &mut ranges);
    }
    if !keys.is_empty() || !ranges.is_empty() {
        txn.prefetch(&keys, &ranges)?;
    }
    Ok(())
}

/// Applies one request of a group: a request sent before and applied is answered as it was
/// then; one applied now is recorded with its answer (and the records its client acknowledged
/// deleted, noted in `deleted`). The answer, with the attributes of the directory it changed.
fn apply_one<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    request: &Request,
    acked: Option<&(crate::requests::RecordKey, crate::requests::RecordKey)>,
    deleted: &mut Vec<(u64, u64)>,
) -> crate::outcome::Outcome<(Done, Option<crate::Attr>)> {
    let dir_after =
        |ctx: &Ctx<'_, T>| ops::changed_dir(&request.op).and_then(|h| ctx.cached_attr(h));
    let (Some(id), Some(acked)) = (request.id, acked) else {
        return ops::apply(ctx, &request.op).map(|done| (done, dir_after(ctx)));
    };
    if let Some(done) = crate::requests::replay(ctx, id)? {
        return Ok((done, None));
    }
    let done = ops::apply(ctx, &request.op)?;
    if let Some(upto) = crate::requests::record(ctx, id, &done, acked)? {
        deleted.push((id.client, upto));
    }
    Ok((done, dir_after(ctx)))
}

/// The text a panic carried, if it was text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic without a message".to_string(),
    }
}

fn failure(failure: Failure) -> GroupError {
    match failure {
        Failure::Meta(error) => GroupError::Failed(error),
        Failure::Store(error) => error.into(),
    }
}

/// One purge step in a transaction of its own (the committer has nothing else to do).
///
/// On a shared store, a server purges alone only while the store's last commit is its own:
/// a server that others commit around (it is not the one committing the namespace's
/// mutations) would conflict with their commits at every step, so it leaves the purge to the
/// steps their groups carry, and to itself once it commits last again.
fn purge_alone<S: Store>(store: &S, cl: &mut ClState, stats: &CommitStats) {
    let before = cl.clone();
    let outcome = (|| -> Result<u64, MetaError> {
        let mut txn = store.begin()?;
        if store.shared() && txn.written_by_others() {
            cl.reload(&txn)?;
            cl.defer_purge();
            return Ok(0);
        }
        let purged = cl
            .purge_step(&mut txn, store.writes_max())
            .map_err(MetaError::from)?;
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
