//! `calm-store-etcd`: the [`Store`] backend on an etcd cluster, for a namespace that outgrows
//! one machine or is served by several calm servers at once.
//!
//! Mapping (written down in `docs/design/etcd.md`):
//! - a calm key `k` is the etcd key `PREFIX/d/k`; the keyspace of one calm file system is the
//!   etcd range `[PREFIX/d/, PREFIX/e)`, so several file systems can share a cluster;
//! - a snapshot is an etcd revision `R`: every read of it is a range read at `R`;
//! - a write transaction reads at its start revision `R`, keeps its writes in memory, and
//!   commits as one etcd `Txn` that puts and deletes them only if the commit key
//!   `PREFIX/seq` has not been modified after `R`, and that rewrites the commit key with a
//!   token naming this commit. Every calm commit writes the commit key, so the compare fails
//!   exactly when any other calm commit landed after `R`: transactions are serializable, and
//!   a failed compare is [`StoreError::Conflict`] (the caller runs the transaction again);
//! - etcd's limits are checked before anything is sent (operations per transaction, request
//!   bytes: [`EtcdOptions`]) and the server's own refusals (too many operations, request too
//!   large, space quota) map to [`StoreError::Limit`] or [`StoreError::Full`]. A `Txn` is
//!   atomic in etcd: a refused transaction wrote nothing;
//! - an unavailable cluster (a member down, a leader election) is retried for up to
//!   [`EtcdOptions::retry_ms_max`]. A commit whose answer was lost is sent again unchanged: the
//!   compare lets at most one of the copies apply, and the commit key's token tells whether
//!   one did. If the last copy fails, the commit is settled before the error is returned (the
//!   commit key is moved on, so that no copy still in flight can apply later).
//!
//! calm-store's trait is synchronous; etcd-client is asynchronous. The store runs its own
//! small tokio runtime, and each call waits for its request on the calling thread (which may
//! be a thread of another runtime: the request runs on the store's).

use calm_types::sync::Locked;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::ops::{Bound, ControlFlow};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_store::{ReadTxn, Result, Store, StoreError, Visitor, WriteTxn, check_limits};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, GetResponse, SortOrder,
    SortTarget, Txn, TxnOp, WatchOptions,
};

mod cache;
pub mod cluster;
mod endpoints;
pub mod history;
mod options;
mod registry;

pub use options::{EtcdOptions, EtcdTls, PASSWORD_ENV};

/// etcd's default `--max-txn-ops`: operations one transaction may carry.
pub const TXN_OPS_MAX_DEFAULT: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 1_572_864;
/// Bytes a request spends beyond its keys and values (framing, per-operation headers), per
/// operation, counted against the request limit so that a transaction we send is never refused
/// for its size.
const OP_OVERHEAD_BYTES: usize = 16;
/// Longest a write transaction waits for the read cache's watch to deliver this store's own
/// last commit before it asks etcd for the current revision instead (see
/// [`EtcdStore::watched_base`]).
pub const BEGIN_WATCHED_WAIT: Duration = Duration::from_millis(2);
/// After a commit that met another server's, how long write transactions begin at a revision
/// read from etcd rather than at the watch's last commit.
pub const BEGIN_READ_AFTER_CONFLICT: Duration = Duration::from_secs(1);
/// Most values one write transaction remembers from its reads.
const READ_CACHE_KEYS_MAX: usize = 4096;
/// Most ranges one transaction keeps read ahead.
const PREFETCH_RANGES_MAX: usize = 1024;
/// Most pairs of one range read ahead: a range with more is visited page by page as before.
const PREFETCH_RANGE_PAIRS_MAX: i64 = 64;

/// What a transaction reads ahead.
enum Ahead {
    Key(Vec<u8>),
    Range(RangeBounds),
}

/// A key and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// Most pairs fetched per range request of a visit.
const VISIT_PAGE_PAIRS_MAX: i64 = 512;
/// Pairs of the first page of a visit (values can be up to `VALUE_LEN_MAX`); later pages are
/// sized from the largest pair seen so that a page carries about `VISIT_PAGE_BYTES`.
const VISIT_PAGE_PAIRS_FIRST: i64 = 16;
const VISIT_PAGE_BYTES: usize = 4 << 20;
/// Largest range answer accepted. A page over it (pairs far larger than the ones before) is
/// fetched again in halves.
const RANGE_ANSWER_BYTES_MAX: usize = 64 << 20;
const _: () = assert!(
    (VISIT_PAGE_PAIRS_FIRST as usize) * (calm_store::VALUE_LEN_MAX + calm_store::KEY_LEN_MAX + 64)
        < RANGE_ANSWER_BYTES_MAX
);

/// Counts of what the store did, for status and benchmarks.
#[derive(Debug, Default)]
pub struct EtcdStats {
    pub commits: AtomicU64,
    pub conflicts: AtomicU64,
    /// Requests sent again after the cluster did not answer.
    pub retries: AtomicU64,
    /// Compactions of the cluster's history this store made.
    pub compactions: AtomicU64,
    /// The revision history was last compacted to, by this store or another (0: not yet).
    pub compacted_revision: std::sync::atomic::AtomicI64,
    /// Linearizable reads of the commit key that began a snapshot or a transaction (one may
    /// serve several callers waiting at once).
    pub revision_reads: AtomicU64,
    /// Reads of one key the read cache could not answer.
    pub key_reads: AtomicU64,
    /// Reads of a range of keys (a page of a listing or a scan).
    pub range_reads: AtomicU64,
    /// Read-ahead requests: the keys and ranges an operation will read, in one request.
    pub read_aheads: AtomicU64,
    /// Write transactions begun at the last commit the read cache's watch delivered, without
    /// a read of the commit key.
    pub watched_begins: AtomicU64,
}

struct Inner {
    /// Always `Some` until dropped (taken to shut it down without blocking).
    runtime: Option<tokio::runtime::Runtime>,
    /// The cluster's members, one in use.
    endpoints: endpoints::Endpoints,
    options: EtcdOptions,
    /// `PREFIX/d/`: the start of the data range.
    data: Vec<u8>,
    /// `PREFIX/e`: the end of the data range.
    data_end: Vec<u8>,
    /// `PREFIX/seq`: the commit key.
    seq: Vec<u8>,
    /// `PREFIX/h/`: the holds on history of long readers (`EtcdStore::hold_history`).
    holds: Vec<u8>,
    /// Names this store's commits in the commit key's value (with a counter).
    writer: u64,
    commit_counter: AtomicU64,
    /// The revision of this store's last commit (0: none yet).
    own_commit_revision: std::sync::atomic::AtomicI64,
    /// Until when write transactions begin at a revision read from etcd: set when a commit
    /// met another server's ([`BEGIN_READ_AFTER_CONFLICT`]).
    begin_read_until: Mutex<Option<Instant>>,
    /// Receivers of [`Store::watch_commits`], told after the read cache's watch applied a
    /// commit.
    commit_watchers: Mutex<Vec<std::sync::mpsc::SyncSender<()>>>,
    stats: EtcdStats,
    /// Pairs read, kept exact by a watch of the data and the commit key.
    cache: cache::ReadCache,
    /// Reads of the commit key, shared by the snapshots and transactions that begin together.
    revisions: cache::RevisionReads,
}

impl Inner {
    /// A fresh value for the commit key: this store's id and the count of its commits.
    fn next_token(&self) -> Vec<u8> {
        let count = self.commit_counter.fetch_add(1, Ordering::Relaxed);
        [self.writer.to_le_bytes(), count.to_le_bytes()].concat()
    }

    /// Tells the receivers of [`Store::watch_commits`] (each once, however many commits
    /// since it last looked); forgets those gone.
    fn commits_applied(&self) {
        let mut watchers = self.commit_watchers.locked();
        watchers.retain(|sender| {
            !matches!(
                sender.try_send(()),
                Err(std::sync::mpsc::TrySendError::Disconnected(()))
            )
        });
    }

    /// The compare of every commit: no calm commit landed after `revision`.
    fn unchanged_since(&self, revision: i64) -> Compare {
        Compare::mod_revision(self.seq.clone(), CompareOp::Less, revision + 1)
    }

    /// A commit met another server's: the next transactions begin at a revision read from
    /// etcd, where they see it.
    fn met_other_commit(&self) {
        let until = Instant::now() + BEGIN_READ_AFTER_CONFLICT;
        *self.begin_read_until.locked() = Some(until);
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime lives as long as the store")
            .handle()
    }
}

impl Drop for Inner {
    /// The last clone may go away inside some asynchronous context (a server's task): a
    /// runtime dropped there would panic, so it is shut down in the background.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// How long a hold on history outlives its holder (renewed every third of it while held).
pub const HOLD_LEASE_S: u64 = 60;

/// History kept from the revision it names while this lives ([`EtcdStore::hold_history`]).
pub struct HistoryHold {
    store: EtcdStore,
    lease: i64,
    revision: i64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for HistoryHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryHold")
            .field("lease", &self.lease)
            .field("revision", &self.revision)
            .finish()
    }
}

impl HistoryHold {
    /// The revision history is kept from.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl Drop for HistoryHold {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let lease = self.lease;
        // Revoked: the hold goes at once (else with its lease).
        if let Err(error) = self
            .store
            .call(move |mut client| async move { client.lease_revoke(lease).await })
        {
            tracing::warn!(%error, "etcd: letting go of a hold on history");
        }
    }
}

/// A calm store on an etcd cluster. Cheap to clone; every clone shares one connection.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    /// The registry of servers, made at its first use and shared by every clone.
    registry: Arc<std::sync::OnceLock<Arc<registry::EtcdRegistry>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.options.endpoints)
            .field("prefix", &self.inner.options.prefix)
            .finish()
    }
}

/// Whether an error means "the cluster did not answer (this time)": worth sending again.
fn transient(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        E::TransportError(_) | E::IoError(_) => true,
        // The connection to the member broke under the request (the member died, or closed
        // it): tonic reports it as a status of code Unknown whose source is the transport's
        // error.
        E::GRpcStatus(status) if broken_connection(status) => true,
        E::GRpcStatus(status) => {
            let message = status.message();
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) || message.contains("leader changed")
                || message.contains("no leader")
                || message.contains("timed out")
                || message.contains("not capable")
                || message.contains("too many requests")
                || message.contains("future revision")
        }
        _ => false,
    }
}

/// Whether `status` stands for a connection that broke rather than an answer of etcd's: an
/// I/O or transport error in its source chain.
fn broken_connection(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<std::io::Error>() || error.is::<tonic::transport::Error>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The cluster's refusals this store names: what etcd says, whether it means "full" (else a
/// limit), and what the operator can change.
const REFUSALS: &[(&str, bool, &str)] = &[
    (
        "database space exceeded",
        true,
        "the cluster's --quota-backend-bytes",
    ),
    (
        "too many operations in txn",
        false,
        "the cluster's --max-txn-ops is below this store's txn-ops-max",
    ),
    (
        "message length too large",
        false,
        "an answer larger than this store accepts",
    ),
    (
        "request is too large",
        false,
        "the cluster's --max-request-bytes is below this store's request-bytes-max",
    ),
];

/// Whether the cluster answered that the revision asked for is compacted away.
fn compacted_away(error: &etcd_client::Error) -> bool {
    error
        .to_string()
        .contains("required revision has been compacted")
}

/// Whether the cluster refused a request for its space quota.
fn out_of_space(error: &etcd_client::Error) -> bool {
    error.to_string().contains(REFUSALS[0].0)
}

/// Maps an error the cluster gave to the seam's errors.
fn store_error(error: etcd_client::Error) -> StoreError {
    let text = error.to_string();
    if let Some((_, full, hint)) = REFUSALS.iter().find(|(says, _, _)| text.contains(says)) {
        let message = format!("etcd: {text} ({hint})");
        return if *full {
            StoreError::Full(message)
        } else {
            StoreError::Limit(message)
        };
    }
    if compacted_away(&error) {
        // The snapshot's revision was compacted away: the transaction can be run again on a
        // newer one.
        StoreError::Conflict
    } else {
        StoreError::Io(format!("etcd: {text}"))
    }
}

fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

impl EtcdStore {
    /// Connects to the cluster (retrying for up to `retry_ms_max` while it does not answer).
    pub fn connect(options: EtcdOptions) -> Result<EtcdStore> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Io("etcd: no endpoints".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("calm-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io(format!("starting the etcd runtime: {e}")))?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(options.attempt_ms_max))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &options.tls {
            let read = |path: &std::path::Path| {
                std::fs::read(path)
                    .map_err(|e| StoreError::Io(format!("etcd TLS: {}: {e}", path.display())))
            };
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            connect = connect.with_tls(config);
        }
        if let Some((user, password)) = &options.user {
            // etcd's simple tokens expire (5 min by default): the client logs in again.
            connect = connect
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let endpoints = endpoints::Endpoints::new(options.endpoints.clone(), connect);
        let base = options.prefix.as_bytes().to_vec();
        let key = |suffix: &[u8]| [base.as_slice(), suffix].concat();
        let store = EtcdStore {
            inner: Arc::new(Inner {
                data: key(b"/d/"),
                data_end: key(b"/e"),
                seq: key(b"/seq"),
                holds: key(b"/h/"),
                writer: random_u64(),
                commit_counter: AtomicU64::new(0),
                own_commit_revision: std::sync::atomic::AtomicI64::new(0),
                begin_read_until: Mutex::new(None),
                commit_watchers: Mutex::new(Vec::new()),
                stats: EtcdStats::default(),
                cache: cache::ReadCache::default(),
                revisions: cache::RevisionReads::default(),
                runtime: Some(runtime),
                endpoints,
                options,
            }),
            registry: Arc::default(),
        };
        // One read proves the cluster answers (and has a leader) before the store is used.
        let (revision, seq_modified) = store.revision()?;
        store.follow_changes(revision, seq_modified);
        store.keep_history_short();
        Ok(store)
    }

    /// Keeps every calm store of this namespace from compacting the cluster's history past its
    /// current revision until the hold is dropped: for a reader of one snapshot that may take
    /// longer than the history kept (fsck of a large namespace). The hold is a key under a
    /// lease of [`HOLD_LEASE_S`], renewed while held, so a holder that dies lets go by itself.
    pub fn hold_history(&self) -> Result<HistoryHold> {
        let (revision, _) = self.revision_now()?;
        let ttl = HOLD_LEASE_S as i64;
        let lease = self
            .call(move |mut client| async move { client.lease_grant(ttl, None).await })?
            .id();
        let key = [
            &self.inner.holds[..],
            format!("{:016x}", random_u64()).as_bytes(),
        ]
        .concat();
        self.call(move |mut client| {
            let key = key.clone();
            async move {
                client
                    .put(
                        key,
                        revision.to_string(),
                        Some(etcd_client::PutOptions::new().with_lease(lease)),
                    )
                    .await
            }
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let inner = Arc::downgrade(&self.inner);
        self.inner.handle().spawn(async move {
            let renew = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(HOLD_LEASE_S / 3)).await;
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let renewed = retrying(&inner, |mut client| async move {
                        let (mut keeper, _) = client.lease_keep_alive(lease).await?;
                        keeper.keep_alive().await
                    })
                    .await;
                    if let Err(error) = renewed {
                        tracing::warn!(%error, "etcd: renewing a hold on history");
                    }
                }
            };
            tokio::select! {
                _ = renew => {}
                _ = stopped => {}
            }
        });
        Ok(HistoryHold {
            store: self.clone(),
            lease,
            revision,
            stop: Some(stop),
        })
    }

    /// Compacts the cluster's history, every [`history::period`], to what was current
    /// `history_kept` ago (see [`history`]); until the store is dropped.
    fn keep_history_short(&self) {
        let kept = self.inner.options.history_kept;
        if kept.is_zero() {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        self.inner.handle().spawn(async move {
            let started = Instant::now();
            let mut history = history::History::new(kept);
            loop {
                tokio::time::sleep(history::period(kept)).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                // One read: the holds of long readers (`EtcdStore::hold_history`), which history
                // is not compacted past, and in its header the cluster's revision.
                let holds = inner.holds.clone();
                let read = retrying(&inner, |mut client| {
                    let holds = holds.clone();
                    async move {
                        client
                            .get(holds, Some(GetOptions::new().with_prefix()))
                            .await
                    }
                })
                .await;
                let response = match read {
                    Ok(response) => response,
                    Err(error) => {
                        tracing::debug!(%error, "etcd: reading the revision to compact to");
                        continue;
                    }
                };
                let revision = response.header().map_or(0, |h| h.revision());
                let Some(to) = history.observe(started.elapsed(), revision) else {
                    continue;
                };
                let to = response
                    .kvs()
                    .iter()
                    .filter_map(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<i64>().ok())
                    .fold(to, i64::min);
                if to <= history.compacted_to() {
                    continue;
                }
                let compacted = retrying(&inner, |mut client| async move {
                    client.compact(to, None).await
                })
                .await;
                match compacted {
                    Ok(_) => {
                        inner.stats.compactions.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(revision = to, "etcd: history compacted");
                    }
                    // Another server of the namespace (or the operator) compacted further.
                    Err(error) if compacted_away(&error) => {}
                    Err(error) => {
                        tracing::warn!(%error, revision = to, "etcd: compacting the history");
                        continue;
                    }
                }
                history.compacted(to);
                inner
                    .stats
                    .compacted_revision
                    .fetch_max(to, Ordering::Relaxed);
            }
        });
    }

    /// How many hold the store's connection: its clones, and its background work while that
    /// works (not while it waits). What a test checks to see that the last clone dropped ends
    /// the store's work.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    pub fn options(&self) -> &EtcdOptions {
        &self.inner.options
    }

    pub fn stats(&self) -> &EtcdStats {
        &self.inner.stats
    }

    /// Runs `request` on the store's runtime, again while the cluster does not answer, and
    /// waits for it on this thread.
    fn call<T, F, Fut>(&self, request: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
    {
        let inner = self.inner.clone();
        self.run(async move { retrying(&inner, request).await.map_err(store_error) })
    }

    /// Runs `future` on the store's runtime and waits for it on this thread.
    fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.inner.handle().spawn(async move {
            let _ = sender.send(future.await);
        });
        receiver
            .recv()
            .map_err(|_| StoreError::Io("etcd: the store's runtime stopped".into()))?
    }

    /// The cluster's current revision and the commit key's modification revision, from a
    /// linearizable read of the commit key sent after this call began (shared with the calls
    /// that wait for one at the same time).
    fn revision(&self) -> Result<(i64, i64)> {
        self.inner
            .revisions
            .get(|| self.revision_now().map_err(|e| e.to_string()))
            .map_err(StoreError::Io)
    }

    /// Where a write transaction may begin without a round trip: the last commit the read
    /// cache's watch delivered, once that is at or past this store's own last commit (waiting
    /// at most [`BEGIN_WATCHED_WAIT`] for it). Its reads then see every commit up to there,
    /// and its commit compares the commit key with that revision as with any other: a commit
    /// of another server the watch had not delivered yet fails it with a conflict, and the
    /// transactions of the next [`BEGIN_READ_AFTER_CONFLICT`] begin at a revision read from
    /// etcd. With one server committing (clients send it every mutation), its transactions
    /// begin on its own last commit, and a group costs etcd its reads ahead and its commit.
    fn watched_base(&self) -> Option<i64> {
        let inner = &self.inner;
        {
            let mut until = inner.begin_read_until.locked();
            match *until {
                Some(at) if Instant::now() < at => return None,
                Some(_) => *until = None,
                None => {}
            }
        }
        let own = inner.own_commit_revision.load(Ordering::Acquire);
        let applied = inner.cache.reached(own, BEGIN_WATCHED_WAIT)?;
        inner.stats.watched_begins.fetch_add(1, Ordering::Relaxed);
        Some(applied)
    }

    /// Hits and misses of the read cache.
    pub fn cache_counts(&self) -> (u64, u64) {
        (
            self.inner.cache.hits.load(Ordering::Relaxed),
            self.inner.cache.misses.load(Ordering::Relaxed),
        )
    }

    /// Starts the watch that keeps the read cache exact: every pair a commit changes is
    /// removed, then the commit counts as applied; from `revision` + 1, the state at
    /// `revision` being that of the commit at `seq_modified`.
    ///
    /// The task holds the store only while it works, not while it waits for the watch: the
    /// last clone of the store dropped ends it (with the store's runtime).
    fn follow_changes(&self, revision: i64, seq_modified: i64) {
        let weak = Arc::downgrade(&self.inner);
        self.inner.cache.start(seq_modified);
        let start = self.inner.data.clone();
        // The data range and the commit key after it: `/d/` .. `/seq` inclusive.
        let end = [self.inner.seq.as_slice(), b"\0"].concat();
        self.inner.handle().spawn(async move {
            let mut from = revision + 1;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let options = WatchOptions::new()
                    .with_range(end.clone())
                    .with_start_revision(from);
                let (member, client) = inner.endpoints.client().await;
                let watched = match client {
                    Ok(mut client) => client.watch(start.clone(), Some(options)).await,
                    Err(error) => Err(error),
                };
                let mut stream = match watched {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%error, "etcd: watching changes for the read cache");
                        inner.endpoints.failed(member);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                drop(inner);
                while let Ok(Some(response)) = stream.message().await {
                    let Some(inner) = weak.upgrade() else { return };
                    if response.compact_revision() > 0 {
                        // History is gone: what the cache holds cannot be vouched for.
                        inner.cache.stop();
                        from = response.compact_revision();
                        tracing::warn!(
                            from,
                            "etcd: the read cache's watch was compacted past; starting over"
                        );
                        break;
                    }
                    let mut changed = Vec::new();
                    let mut committed = 0;
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        from = from.max(kv.mod_revision() + 1);
                        if kv.key() == inner.seq.as_slice() {
                            committed = committed.max(kv.mod_revision());
                        } else {
                            let value = match event.event_type() {
                                EventType::Put => Some(kv.value().to_vec()),
                                EventType::Delete => None,
                            };
                            changed.push((kv.key().to_vec(), value, kv.mod_revision()));
                        }
                    }
                    if !changed.is_empty() || committed > 0 {
                        inner.cache.applied(changed, committed);
                    }
                    if committed > 0 {
                        inner.commits_applied();
                    }
                    if response.canceled() {
                        break;
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                if !inner.cache.following() {
                    // Start over from the present, with an empty cache.
                    let seq = inner.seq.clone();
                    let read = retrying(&inner, |mut client| {
                        let seq = seq.clone();
                        async move { client.get(seq, None).await }
                    })
                    .await;
                    if let Ok(response) = read {
                        let revision = response.header().map_or(0, |h| h.revision());
                        let seq_modified = response.kvs().first().map_or(0, |kv| kv.mod_revision());
                        inner.cache.start(seq_modified);
                        from = revision + 1;
                        // Commits may have gone by unseen.
                        inner.commits_applied();
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    /// [`Self::revision`], read now.
    fn revision_now(&self) -> Result<(i64, i64)> {
        self.inner
            .stats
            .revision_reads
            .fetch_add(1, Ordering::Relaxed);
        let seq = self.inner.seq.clone();
        let response = self.call(move |mut client| {
            let seq = seq.clone();
            async move { client.get(seq, None).await }
        })?;
        let revision = response.header().map_or(0, |h| h.revision());
        let seq_modified = response.kvs().first().map_or(0, |kv| kv.mod_revision());
        Ok((revision, seq_modified))
    }

    fn data_key(&self, key: &[u8]) -> Vec<u8> {
        [self.inner.data.as_slice(), key].concat()
    }

    /// The etcd end of a calm range end (empty: the end of this file system's keyspace).
    fn data_end(&self, end: &[u8]) -> Vec<u8> {
        if end.is_empty() {
            self.inner.data_end.clone()
        } else {
            self.data_key(end)
        }
    }

    /// The value of `key` at `revision`, from the read cache when `cached` (the snapshot's
    /// commit has been applied to it), else from etcd (and then kept in the cache).
    fn get_cached(&self, key: &[u8], revision: i64, cached: bool) -> Result<Option<Vec<u8>>> {
        let full = self.data_key(key);
        if cached && let Some(value) = self.inner.cache.get(&full, revision) {
            return Ok(value);
        }
        let value = self.get_at(key, revision)?;
        self.inner.cache.put(full, value.clone(), revision);
        Ok(value)
    }

    fn get_at(&self, key: &[u8], revision: i64) -> Result<Option<Vec<u8>>> {
        self.inner.stats.key_reads.fetch_add(1, Ordering::Relaxed);
        let key = self.data_key(key);
        let mut response = self.call(move |mut client| {
            let key = key.clone();
            async move {
                client
                    .get(key, Some(at_revision(GetOptions::new(), revision)))
                    .await
            }
        })?;
        Ok(response
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.into_key_value().1))
    }

    /// Up to `limit` pairs of `[start, end)` at `revision`, ascending or descending; the keys
    /// without the data prefix; and whether more remain.
    fn range_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        limit: i64,
        descending: bool,
    ) -> Result<(Vec<Pair>, bool)> {
        self.inner.stats.range_reads.fetch_add(1, Ordering::Relaxed);
        let (start, end) = (self.data_key(start), self.data_end(end));
        let mut response: GetResponse = self.call(move |client| {
            let (start, end) = (start.clone(), end.clone());
            async move {
                let mut options =
                    at_revision(GetOptions::new().with_range(end), revision).with_limit(limit);
                if descending {
                    options = options.with_sort(SortTarget::Key, SortOrder::Descend);
                }
                client
                    .kv_client()
                    .max_decoding_message_size(RANGE_ANSWER_BYTES_MAX)
                    .get(start, Some(options))
                    .await
            }
        })?;
        let more = response.more();
        let skip = self.inner.data.len();
        let pairs = response
            .take_kvs()
            .into_iter()
            .map(|kv| {
                let (key, value) = kv.into_key_value();
                (key[skip..].to_vec(), value)
            })
            .collect();
        Ok((pairs, more))
    }

    /// Visits `[start, end)` at `revision` in pages, with the pairs of `overlay` (a
    /// transaction's writes: `None` deletes) merged in.
    fn visit_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        visit: &mut Visitor<'_>,
    ) -> Result<usize> {
        self.visit_known(start, end, revision, overlay, None, visit)
    }

    /// [`EtcdStore::visit_at`], with every stored pair of the range already `known` (read at
    /// `revision`) when given.
    fn visit_known(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        known: Option<Pairs>,
        visit: &mut Visitor<'_>,
    ) -> Result<usize> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let mut pending = overlay
            .range((Bound::Included(start.to_vec()), upper))
            .peekable();
        let mut visited = 0;
        let mut from = start.to_vec();
        let mut more_pages = known.is_none();
        let mut page_pairs = VISIT_PAGE_PAIRS_FIRST;
        let mut page: std::vec::IntoIter<(Vec<u8>, Vec<u8>)> =
            known.unwrap_or_default().into_iter();
        let mut next_remote = None;
        loop {
            if next_remote.is_none() {
                next_remote = page.next();
                if next_remote.is_none() && more_pages {
                    let (pairs, more) = match self.range_at(&from, end, revision, page_pairs, false)
                    {
                        Err(StoreError::Limit(_)) if page_pairs > 1 => {
                            page_pairs /= 2;
                            continue;
                        }
                        other => other?,
                    };
                    if let Some((last, _)) = pairs.last() {
                        from = [last.as_slice(), &[0]].concat();
                    }
                    let largest = pairs
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 64)
                        .max()
                        .unwrap_or(1);
                    page_pairs =
                        ((VISIT_PAGE_BYTES / largest) as i64).clamp(1, VISIT_PAGE_PAIRS_MAX);
                    more_pages = more && !pairs.is_empty();
                    page = pairs.into_iter();
                    next_remote = page.next();
                }
            }
            // The smaller key of the two sources goes first; on a tie the transaction's write
            // wins and the stored pair is dropped.
            let take_overlay = match (&next_remote, pending.peek()) {
                (None, None) => return Ok(visited),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((key, _)), Some((written, _))) => written.as_slice() <= key.as_slice(),
            };
            let flow = if take_overlay {
                let (key, value) = pending.next().expect("peeked");
                if next_remote.as_ref().is_some_and(|(k, _)| k == key) {
                    next_remote = None;
                }
                match value {
                    Some(value) => {
                        visited += 1;
                        visit(key, value)
                    }
                    None => ControlFlow::Continue(()),
                }
            } else {
                let (key, value) = next_remote.take().expect("checked");
                visited += 1;
                visit(&key, &value)
            };
            if flow.is_break() {
                return Ok(visited);
            }
        }
    }

    /// The greatest pair of `[start, end)` at `revision` that `overlay` does not delete, or the
    /// greatest one `overlay` writes, whichever is greater. etcd sorts a descending range after
    /// reading all of it: O(range) on the server, so calm's hot paths do not use it on etcd
    /// (appends probe forward; the changelog's last index is a counter there).
    fn last_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let written = overlay
            .range((Bound::Included(start.to_vec()), upper))
            .rev()
            .find_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.clone())));
        let mut stored = None;
        let mut below = end.to_vec();
        'pages: loop {
            let (pairs, more) = self.range_at(start, &below, revision, 16, true)?;
            for (key, value) in &pairs {
                if !matches!(overlay.get(key), Some(None)) {
                    stored = Some((key.clone(), value.clone()));
                    break 'pages;
                }
            }
            match pairs.last() {
                Some((key, _)) if more => below = key.clone(),
                _ => break,
            }
        }
        Ok(match (stored, written) {
            (Some(s), Some(w)) => Some(if w.0 >= s.0 { w } else { s }),
            (s, w) => s.or(w),
        })
    }
}

/// A read at `revision`. History at a revision is immutable, so any member that has applied
/// it can answer alone (a serializable read, no round through the leader); one that has not
/// yet answers "future revision", and the read is sent again.
fn at_revision(options: GetOptions, revision: i64) -> GetOptions {
    options.with_revision(revision).with_serializable()
}

/// Sends `request` until it gets an answer, while the cluster is unavailable and
/// `retry_ms_max` has not passed; each attempt is bounded by `attempt_ms_max` and by the time
/// left.
async fn retrying<T, F, Fut>(
    inner: &Inner,
    request: F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    retrying_until(inner, None, request).await
}

/// [`retrying`], within `until` when given: the deadline of a larger piece of work that this
/// request is part of (a commit, within its transaction's), which bounds every attempt, the
/// first too (past it, the request fails without being sent).
async fn retrying_until<T, F, Fut>(
    inner: &Inner,
    until: Option<Instant>,
    request: F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let timed_out = || {
        etcd_client::Error::GRpcStatus(tonic::Status::new(
            tonic::Code::DeadlineExceeded,
            "etcd request timed out",
        ))
    };
    let deadline =
        until.unwrap_or_else(|| Instant::now() + Duration::from_millis(inner.options.retry_ms_max));
    if until.is_some() && Instant::now() >= deadline {
        return Err(timed_out());
    }
    let attempt = Duration::from_millis(inner.options.attempt_ms_max);
    let mut pause = Duration::from_millis(20);
    let mut first = until.is_none();
    // Members tried since the last pause: a member that does not answer is skipped at once,
    // the pause comes after every member was tried.
    let mut tried = 0;
    loop {
        // The first attempt has its whole time; a later one no more than is left before the
        // deadline, so that a request fails within `retry_ms_max` of its start.
        let budget = match std::mem::replace(&mut first, false) {
            true => attempt,
            false => attempt.min(deadline.saturating_duration_since(Instant::now())),
        };
        let (used, client) = inner.endpoints.client().await;
        let outcome = match client {
            Err(error) => Err(error),
            Ok(client) => match tokio::time::timeout(budget, request(client)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(timed_out()),
            },
        };
        match outcome {
            Err(error) if transient(&error) && Instant::now() < deadline => {
                inner.stats.retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%error, member = used, "etcd did not answer; sending again");
                inner.endpoints.failed(used);
                tried += 1;
                if tried >= inner.endpoints.len() {
                    tried = 0;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
            Err(error) => {
                // What the caller will see as EIO: said here, with the reason.
                if transient(&error) {
                    tracing::warn!(%error, retry_ms_max = inner.options.retry_ms_max,
                        "etcd did not answer within the retry limit");
                } else if compacted_away(&error) {
                    // Expected: a compaction another server made first, or a read at a
                    // revision compacted under it (run again as a conflict).
                    tracing::debug!(%error, "etcd: history compacted already");
                } else {
                    tracing::warn!(%error, "etcd refused a request");
                }
                return Err(error);
            }
            ok => return ok,
        }
    }
}

/// A consistent view: every read is at one revision.
#[derive(Debug)]
pub struct EtcdSnapshot<'s> {
    store: &'s EtcdStore,
    revision: i64,
    /// The read cache has applied every commit up to this snapshot's.
    cached: bool,
}

const NO_WRITES: &BTreeMap<Vec<u8>, Option<Vec<u8>>> = &BTreeMap::new();

impl ReadTxn for EtcdSnapshot<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        Ok(self
            .store
            .get_cached(key, self.revision, self.cached)?
            .map(Cow::Owned))
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        self.store
            .visit_at(start, end, self.revision, NO_WRITES, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.store.last_at(start, end, self.revision, NO_WRITES)
    }
}

/// A write transaction: reads at its start revision, writes kept here until commit.
#[derive(Debug)]
pub struct EtcdTxn<'s> {
    store: &'s EtcdStore,
    /// `retry_ms_max` after the transaction began: its commit is sent (and sent again) until
    /// then, and settling a lost commit's answer takes at most as long again.
    deadline: Instant,
    revision: i64,
    /// The commit key's modification revision when the transaction began.
    seq_modified: i64,
    /// The read cache has applied every commit up to the transaction's start.
    cached: bool,
    /// Begun at the watch's last commit ([`EtcdStore::watched_base`]), not at a revision read
    /// from etcd: a commit that writes nothing checks that no commit came after it.
    watched: bool,
    /// No stored key (at `revision`) is at or above this one: appends above it need no probe.
    append_floor: Option<Vec<u8>>,
    /// Values read at `revision` (which never change): a key read, then deleted or read again
    /// by the same group of operations costs one round trip, not two.
    read: std::cell::RefCell<std::collections::HashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Writes in key order; `None` is a delete.
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Whole ranges read ahead at `revision` (`WriteTxn::prefetch`), by `[start, end)`.
    ranges: std::cell::RefCell<std::collections::HashMap<RangeBounds, Pairs>>,
}

/// A range's `[start, end)`, as calm names it.
type RangeBounds = (Vec<u8>, Vec<u8>);
/// Key-value pairs, in key order.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

impl EtcdTxn<'_> {
    /// `key`'s value at the transaction's revision when a whole range read ahead holds it
    /// (`Some(None)`: the range holds no such key); `None` when no such range covers it. A
    /// group deletes what it read ahead as ranges (request records, xattrs, chunks): each
    /// delete, which reports whether the key existed, is answered here, not by a round trip.
    fn in_range_read_ahead(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let ranges = self.ranges.borrow();
        let (_, pairs) = ranges.iter().find(|((start, end), _)| {
            key >= start.as_slice() && (end.is_empty() || key < end.as_slice())
        })?;
        let at = pairs.binary_search_by(|(k, _)| k.as_slice().cmp(key));
        Some(at.ok().map(|at| pairs[at].1.clone()))
    }
}

impl ReadTxn for EtcdTxn<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        match self.writes.get(key) {
            Some(Some(value)) => Ok(Some(Cow::Borrowed(value))),
            Some(None) => Ok(None),
            None => {
                if let Some(known) = self.read.borrow().get(key) {
                    return Ok(known.clone().map(Cow::Owned));
                }
                if let Some(known) = self.in_range_read_ahead(key) {
                    return Ok(known.map(Cow::Owned));
                }
                let value = self.store.get_cached(key, self.revision, self.cached)?;
                let mut read = self.read.borrow_mut();
                if read.len() < READ_CACHE_KEYS_MAX {
                    read.insert(key.to_vec(), value.clone());
                }
                Ok(value.map(Cow::Owned))
            }
        }
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        let known = self
            .ranges
            .borrow()
            .get(&(start.to_vec(), end.to_vec()))
            .cloned();
        self.store
            .visit_known(start, end, self.revision, &self.writes, known, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.store.last_at(start, end, self.revision, &self.writes)
    }
}

impl WriteTxn for EtcdTxn<'_> {
    /// The greatest key of the keyspace is not asked of etcd (a descending range is sorted on
    /// the server after reading the whole range): a forward probe for any stored key at or
    /// above `key`, once per transaction, and this transaction's own writes.
    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        let refuse = |above: &[u8]| {
            StoreError::Limit(format!(
                "append of {key:?}, which is not above the greatest key {above:?}"
            ))
        };
        if let Some((written, _)) = self.writes.range(key.to_vec()..).find(|(_, v)| v.is_some()) {
            return Err(refuse(written));
        }
        let covered = self
            .append_floor
            .as_deref()
            .is_some_and(|floor| key >= floor);
        if !covered {
            // The first stored key at or above: from a range read ahead that covers it (the
            // tail of the log, read with the transaction's first reads), else read now.
            let ahead = self
                .ranges
                .borrow()
                .iter()
                .find(|((start, end), _)| end.is_empty() && start.as_slice() <= key)
                .map(|(_, pairs)| {
                    pairs
                        .iter()
                        .find(|(k, _)| k.as_slice() >= key)
                        .map(|(k, _)| k.clone())
                });
            let first = match ahead {
                Some(first) => first,
                None => {
                    let (stored, _) = self.store.range_at(key, b"", self.revision, 1, false)?;
                    stored.into_iter().next().map(|(k, _)| k)
                }
            };
            if let Some(above) = &first {
                if !matches!(self.writes.get(above), Some(None)) {
                    return Err(refuse(above));
                }
                // The stored key above is deleted by this transaction: ask the slow way.
                if let Some((last, _)) = self.last_in(b"", b"")?
                    && last.as_slice() >= key
                {
                    return Err(refuse(&last));
                }
            } else {
                self.append_floor = Some(key.to_vec());
            }
        }
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn prefetch(&self, keys: &[Vec<u8>], ranges: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let wanted: Vec<Vec<u8>> = {
            let read = self.read.borrow();
            let mut seen = std::collections::HashSet::new();
            keys.iter()
                .filter(|k| {
                    !self.writes.contains_key(*k) && !read.contains_key(*k) && seen.insert(*k)
                })
                .take(READ_CACHE_KEYS_MAX.saturating_sub(read.len()))
                .cloned()
                .collect()
        };
        let mut missing = Vec::new();
        for key in wanted {
            let full = self.store.data_key(&key);
            match self
                .cached
                .then(|| self.store.inner.cache.get(&full, self.revision))
            {
                Some(Some(value)) => {
                    self.read.borrow_mut().insert(key, value);
                }
                _ => missing.push(key),
            }
        }
        let ranges: Vec<&RangeBounds> = {
            let known = self.ranges.borrow();
            ranges
                .iter()
                .filter(|r| !known.contains_key(*r))
                .take(PREFETCH_RANGES_MAX.saturating_sub(known.len()))
                .collect()
        };
        // Keys and ranges in one etcd transaction: one round trip, each read at this revision.
        let wanted: Vec<Ahead> = missing
            .into_iter()
            .map(Ahead::Key)
            .chain(ranges.into_iter().map(|r| Ahead::Range(r.clone())))
            .collect();
        for chunk in wanted.chunks(self.store.inner.options.txn_ops_max.max(1)) {
            let operations: Vec<TxnOp> = chunk
                .iter()
                .map(|ahead| match ahead {
                    Ahead::Key(key) => TxnOp::get(
                        self.store.data_key(key),
                        Some(at_revision(GetOptions::new(), self.revision)),
                    ),
                    Ahead::Range((start, end)) => TxnOp::get(
                        self.store.data_key(start),
                        Some(
                            at_revision(GetOptions::new(), self.revision)
                                .with_range(self.store.data_end(end))
                                .with_limit(PREFETCH_RANGE_PAIRS_MAX),
                        ),
                    ),
                })
                .collect();
            let stats = &self.store.inner.stats;
            stats.read_aheads.fetch_add(1, Ordering::Relaxed);
            let response = self.store.call(move |mut client| {
                let operations = operations.clone();
                async move { client.txn(Txn::new().and_then(operations)).await }
            })?;
            for (ahead, op) in chunk.iter().zip(response.op_responses()) {
                let etcd_client::TxnOpResponse::Get(get) = op else {
                    continue;
                };
                match ahead {
                    Ahead::Key(key) => {
                        let value = get.kvs().first().map(|kv| kv.value().to_vec());
                        self.store.inner.cache.put(
                            self.store.data_key(key),
                            value.clone(),
                            self.revision,
                        );
                        self.read.borrow_mut().insert(key.clone(), value);
                    }
                    // Only a whole range is kept; a larger one is visited as before.
                    Ahead::Range(bounds) if !get.more() => {
                        let data = self.store.inner.data.len();
                        let pairs = get
                            .kvs()
                            .iter()
                            .map(|kv| (kv.key()[data..].to_vec(), kv.value().to_vec()))
                            .collect();
                        self.ranges.borrow_mut().insert(bounds.clone(), pairs);
                    }
                    Ahead::Range(_) => {}
                }
            }
        }
        Ok(())
    }

    fn written_by_others(&self) -> bool {
        self.seq_modified != self.store.inner.own_commit_revision.load(Ordering::Relaxed)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_limits(key, b"")?;
        let existed = self.get(key)?.is_some();
        self.writes.insert(key.to_vec(), None);
        Ok(existed)
    }

    fn commit(self) -> Result<()> {
        if self.writes.is_empty() {
            // What the transaction answered (a refusal: nothing to write) holds at the
            // present only if no commit came after its revision.
            if self.watched && self.store.revision()?.1 != self.seq_modified {
                self.store
                    .inner
                    .stats
                    .conflicts
                    .fetch_add(1, Ordering::Relaxed);
                self.store.inner.met_other_commit();
                return Err(StoreError::Conflict);
            }
            return Ok(());
        }
        let inner = &self.store.inner;
        let options = &inner.options;
        // The commit key's write counts as one operation.
        let ops = self.writes.len() + 1;
        if ops > options.txn_ops_max {
            return Err(StoreError::Limit(format!(
                "a transaction of {ops} writes exceeds the etcd cluster's limit of {} \
                 operations per transaction (txn-ops-max); nothing was written",
                options.txn_ops_max
            )));
        }
        let bytes: usize = self
            .writes
            .iter()
            .map(|(k, v)| inner.data.len() + k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
            + ops * OP_OVERHEAD_BYTES
            + inner.seq.len() * 2
            + 16;
        if bytes > options.request_bytes_max {
            return Err(StoreError::Limit(format!(
                "a transaction of {bytes} bytes exceeds the etcd cluster's limit of {} bytes \
                 per request (request-bytes-max); nothing was written",
                options.request_bytes_max
            )));
        }
        let token = inner.next_token();
        let mut operations: Vec<TxnOp> = self
            .writes
            .into_iter()
            .map(|(key, value)| {
                let key = [inner.data.as_slice(), &key].concat();
                match value {
                    Some(value) => TxnOp::put(key, value, None),
                    None => TxnOp::delete(key, None),
                }
            })
            .collect();
        operations.push(TxnOp::put(inner.seq.clone(), token.clone(), None));
        let txn = Txn::new()
            .when([inner.unchanged_since(self.revision)])
            .and_then(operations);
        let shared = inner.clone();
        let (revision, deadline) = (self.revision, self.deadline);
        self.store
            .run(async move { commit(&shared, txn, token, revision, deadline).await })
    }
}

/// Sends a commit until `deadline` (its transaction's); on a lost answer sends it again
/// unchanged and asks the commit key whether one of the copies applied.
async fn commit(
    inner: &Inner,
    txn: Txn,
    token: Vec<u8>,
    revision: i64,
    deadline: Instant,
) -> Result<()> {
    let answered_once = std::sync::atomic::AtomicBool::new(false);
    let lost = std::sync::atomic::AtomicBool::new(false);
    let response = retrying_until(inner, Some(deadline), |mut client| {
        let txn = txn.clone();
        if answered_once.swap(true, Ordering::Relaxed) {
            lost.store(true, Ordering::Relaxed);
        }
        async move { client.txn(txn).await }
    })
    .await;
    let response = match response {
        Ok(response) => response,
        Err(error) if lost.load(Ordering::Relaxed) => {
            // A copy whose answer was lost may still be on its way to being applied: settle it
            // before answering, so that a commit reported failed never applies later.
            return match fence(inner, &token, revision).await? {
                Settled::Applied => {
                    inner.stats.commits.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Settled::NotApplied => Err(store_error(error)),
                Settled::Unknown(why) => Err(StoreError::Io(format!(
                    "etcd: a commit's answer was lost and whether it applied could not be \
                     settled ({why})"
                ))),
            };
        }
        // etcd applies the transaction that crosses the space quota and then answers it with
        // "database space exceeded" (and raises its alarm): whether it applied is in the
        // commit key, which the alarm leaves readable.
        Err(error) if out_of_space(&error) && applied(inner, &token, None).await? => {
            inner.stats.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Err(error) => return Err(store_error(error)),
    };
    if response.succeeded() {
        inner.stats.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(header) = response.header() {
            inner
                .own_commit_revision
                .store(header.revision(), Ordering::Relaxed);
        }
        return Ok(());
    }
    if lost.load(Ordering::Relaxed) && applied(inner, &token, None).await? {
        // An earlier copy applied; this one found the commit key moved by it.
        inner.stats.commits.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    inner.stats.conflicts.fetch_add(1, Ordering::Relaxed);
    inner.met_other_commit();
    Err(StoreError::Conflict)
}

/// What became of a commit whose answer was lost.
enum Settled {
    Applied,
    /// It did not apply and no copy of it ever can.
    NotApplied,
    Unknown(String),
}

/// Settles a commit that started at `revision` and whose answer was lost: moves the commit key
/// on if no commit landed since (then no copy of the lost commit, which compares against
/// `revision`, can apply any more), or else reads the key's token.
async fn fence(inner: &Inner, token: &[u8], revision: i64) -> Result<Settled> {
    let seq = inner.seq.clone();
    let fence_token = inner.next_token();
    // The fence and the reads of what it found share one `retry_ms_max`.
    let deadline = Instant::now() + Duration::from_millis(inner.options.retry_ms_max);
    let fenced = retrying_until(inner, Some(deadline), |mut client| {
        let txn = Txn::new()
            .when([inner.unchanged_since(revision)])
            .and_then([TxnOp::put(seq.clone(), fence_token.clone(), None)]);
        async move { client.txn(txn).await }
    })
    .await;
    match fenced {
        Ok(response) if response.succeeded() => Ok(Settled::NotApplied),
        // With the space alarm raised no write applies any more, the lost copy's included:
        // what the commit key names is final.
        Err(error) if out_of_space(&error) => Ok(if applied(inner, token, Some(deadline)).await? {
            Settled::Applied
        } else {
            Settled::NotApplied
        }),
        Ok(_) => Ok(if applied(inner, token, Some(deadline)).await? {
            Settled::Applied
        } else {
            // Another commit landed after `revision`: the lost one compares false forever.
            Settled::NotApplied
        }),
        Err(error) => Ok(Settled::Unknown(error.to_string())),
    }
}

/// Whether the commit key names `token`: the commit it stands for applied. (A later commit by
/// anyone rewrites the key, but a later commit could only compare true after seeing ours.)
async fn applied(inner: &Inner, token: &[u8], until: Option<Instant>) -> Result<bool> {
    let seq = inner.seq.clone();
    let response = retrying_until(inner, until, |mut client| {
        let seq = seq.clone();
        async move { client.get(seq, None).await }
    })
    .await
    .map_err(store_error)?;
    Ok(response.kvs().first().is_some_and(|kv| kv.value() == token))
}

impl Store for EtcdStore {
    type Snapshot<'s> = EtcdSnapshot<'s>;
    type Txn<'s> = EtcdTxn<'s>;

    fn figures(&self) -> Vec<(&'static str, u64)> {
        let stats = &self.inner.stats;
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let (hits, misses) = self.cache_counts();
        let (pairs, bytes) = self.inner.cache.held();
        vec![
            ("commits", load(&stats.commits)),
            ("conflicts", load(&stats.conflicts)),
            ("retries", load(&stats.retries)),
            ("revision reads", load(&stats.revision_reads)),
            ("begun on the watch", load(&stats.watched_begins)),
            ("key reads", load(&stats.key_reads)),
            ("range reads", load(&stats.range_reads)),
            ("read-aheads", load(&stats.read_aheads)),
            ("cache hits", hits),
            ("cache misses", misses),
            ("cache pairs", pairs as u64),
            ("cache bytes", bytes as u64),
            ("history compactions", load(&stats.compactions)),
            (
                "compacted to revision",
                stats.compacted_revision.load(Ordering::Relaxed).max(0) as u64,
            ),
        ]
    }

    fn snapshot(&self) -> Result<EtcdSnapshot<'_>> {
        let (revision, seq_modified) = self.revision()?;
        Ok(EtcdSnapshot {
            store: self,
            revision,
            cached: self.inner.cache.ready_for(seq_modified),
        })
    }

    /// At the last commit the read cache's watch applied, when that is at or past this
    /// store's own last commit: no round trip, and every read a cache hit or one read at that
    /// revision. Another server's commit not yet delivered by the watch is not seen.
    fn snapshot_recent(&self) -> Result<EtcdSnapshot<'_>> {
        let own = self.inner.own_commit_revision.load(Ordering::Acquire);
        match self.inner.cache.applied_revision() {
            Some(revision) if revision >= own => Ok(EtcdSnapshot {
                store: self,
                revision,
                cached: true,
            }),
            _ => self.snapshot(),
        }
    }

    fn begin(&self) -> Result<EtcdTxn<'_>> {
        let deadline = Instant::now() + Duration::from_millis(self.inner.options.retry_ms_max);
        let (revision, seq_modified, cached, watched) = match self.watched_base() {
            Some(applied) => (applied, applied, true, true),
            None => {
                let (revision, seq_modified) = self.revision()?;
                let cached = self.inner.cache.ready_for(seq_modified);
                (revision, seq_modified, cached, false)
            }
        };
        Ok(EtcdTxn {
            store: self,
            deadline,
            revision,
            seq_modified,
            cached,
            watched,
            append_floor: None,
            read: Default::default(),
            ranges: Default::default(),
            writes: BTreeMap::new(),
        })
    }

    /// The size of the etcd database of the member that answers: shared by every file system
    /// on the cluster and by etcd's history, but one request (counting this file system's
    /// pairs would read all of them).
    fn size_bytes(&self) -> Result<u64> {
        let status = self.call(|mut client| async move { client.status().await })?;
        Ok(status.db_size().max(0) as u64)
    }

    fn shared(&self) -> bool {
        true
    }

    fn registry(&self) -> Option<Arc<dyn calm_store::registry::Registry>> {
        let registry = self
            .registry
            .get_or_init(|| Arc::new(registry::EtcdRegistry::new(self.inner.clone())));
        Some(registry.clone())
    }

    /// Told by the read cache's watch once it has applied a commit (so that a recent snapshot
    /// taken then sees it), and when the watch starts over after losing track.
    fn watch_commits(&self) -> Result<Option<std::sync::mpsc::Receiver<()>>> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.inner.commit_watchers.locked().push(sender);
        Ok(Some(receiver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_sent_again_an_answer_is_not() {
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(transient(&etcd_client::Error::GRpcStatus(broken)));
        for (code, message) in [
            (tonic::Code::Unavailable, "connection refused"),
            (tonic::Code::Unknown, "etcdserver: leader changed"),
            (tonic::Code::Unknown, "etcdserver: request timed out"),
        ] {
            let status = tonic::Status::new(code, message);
            assert!(
                transient(&etcd_client::Error::GRpcStatus(status)),
                "{message}"
            );
        }
        for (code, message) in [
            (tonic::Code::Unknown, "transport error"),
            (
                tonic::Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
        ] {
            let status = tonic::Status::new(code, message);
            assert!(
                !transient(&etcd_client::Error::GRpcStatus(status)),
                "{message}"
            );
        }
    }
}
