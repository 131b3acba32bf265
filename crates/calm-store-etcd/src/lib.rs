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
use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::retention::{HOLD_LEASE_S, HistoryHold};
use crate::retry::retrying;
use crate::retry::store_error;
pub use crate::txn::{EtcdSnapshot, EtcdTxn};
use calm_store::{Result, Store, StoreError};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions};

mod cache;
mod commit;
mod endpoints;
mod follow;
pub mod history;
pub(crate) mod log;
mod options;
mod reads;
mod registry;
mod retention;
mod retry;
mod txn;

pub use options::{EtcdOptions, EtcdTls, PASSWORD_ENV};

/// etcd's default `--max-txn-ops`: operations one transaction may carry.
pub const TXN_OPS_MAX_DEFAULT: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 1_572_864;
/// Bytes a request spends beyond its keys and values (framing, per-operation headers), per
/// operation, counted against the request limit so that a transaction we send is never refused
/// for its size.
pub(crate) const OP_OVERHEAD_BYTES: usize = 16;
/// Longest a write transaction waits for the read cache's watch to deliver this store's own
/// last commit before it asks etcd for the current revision instead (see
/// [`EtcdStore::watched_base`]).
pub const BEGIN_WATCHED_WAIT: Duration = Duration::from_millis(2);
/// After a commit that met another server's, how long write transactions begin at a revision
/// read from etcd rather than at the watch's last commit.
pub const BEGIN_READ_AFTER_CONFLICT: Duration = Duration::from_secs(1);
/// Most times a read is sent again at a newer revision of the same data, after history was
/// compacted under it ([`EtcdStore::call_at`]); past them it is a conflict.
pub(crate) const COMPACTED_READS_MAX: usize = 4;
/// Most values one write transaction remembers from its reads.
pub(crate) const READ_CACHE_KEYS_MAX: usize = 4096;
/// Most ranges one transaction keeps read ahead.
pub(crate) const PREFETCH_RANGES_MAX: usize = 1024;
/// Most pairs of one range read ahead: a range with more is visited page by page as before.
pub(crate) const PREFETCH_RANGE_PAIRS_MAX: i64 = 64;

/// What a transaction reads ahead.
pub(crate) enum Ahead {
    Key(Vec<u8>),
    Range(RangeBounds),
}

/// A key and its value.
pub(crate) type Pair = (Vec<u8>, Vec<u8>);

/// A range's `[start, end)`, as calm names it.
pub(crate) type RangeBounds = (Vec<u8>, Vec<u8>);

/// Key-value pairs, in key order.
pub(crate) type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Most pairs fetched per range request of a visit.
pub(crate) const VISIT_PAGE_PAIRS_MAX: i64 = 512;
/// Pairs of the first page of a visit (values can be up to `VALUE_LEN_MAX`); later pages are
/// sized from the largest pair seen so that a page carries about `VISIT_PAGE_BYTES`.
pub(crate) const VISIT_PAGE_PAIRS_FIRST: i64 = 16;
pub(crate) const VISIT_PAGE_BYTES: usize = 4 << 20;
/// Largest range answer accepted. A page over it (pairs far larger than the ones before) is
/// fetched again in halves.
pub(crate) const RANGE_ANSWER_BYTES_MAX: usize = 64 << 20;
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
    /// How long each attempt of a request took, answered or not.
    pub latencies: calm_store::latency::LatencyCounts,
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

pub(crate) struct Inner {
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
    /// History before this revision is known compacted (by this store, another server or an
    /// operator): nothing begins a read below it ([`EtcdStore::watched_base`]).
    compacted_below: std::sync::atomic::AtomicI64,
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

    /// History before `revision` is compacted: a read there fails, so none begins there.
    pub(crate) fn compacted_before(&self, revision: i64) {
        self.compacted_below.fetch_max(revision, Ordering::Relaxed);
    }

    /// Whether reads at `revision` are known to fail, history there being compacted.
    pub(crate) fn known_compacted(&self, revision: i64) -> bool {
        revision < self.compacted_below.load(Ordering::Relaxed)
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

pub(crate) fn random_u64() -> u64 {
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
                compacted_below: std::sync::atomic::AtomicI64::new(0),
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

    /// [`Self::call`] for a read at `revision` (`request` is given the revision to read at).
    ///
    /// When the cluster answers that history there is compacted, that is noted (nothing
    /// begins there again), and the commit key is read: if no calm commit came after
    /// `revision`, calm's data is the same at the cluster's current revision, and the read is
    /// sent again there (the revision moved without calm: a lease ran out, a hold was let go,
    /// another program wrote, and then history was compacted). Else the answer is a
    /// conflict: the transaction runs again on the new state.
    fn call_at<T, F, Fut>(&self, revision: i64, request: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Client, i64) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
    {
        let inner = self.inner.clone();
        self.run(async move {
            let mut at = revision;
            for _ in 0..COMPACTED_READS_MAX {
                let error = match retrying(&inner, |client| request(client, at)).await {
                    Ok(answer) => return Ok(answer),
                    Err(error) if crate::retry::compacted_away(&error) => error,
                    Err(error) => return Err(store_error(error)),
                };
                inner.compacted_before(at + 1);
                let (now, seq_modified) = crate::follow::read_commit_key(&inner)
                    .await
                    .map_err(store_error)?;
                if seq_modified > revision {
                    return Err(store_error(error));
                }
                at = now;
            }
            Err(StoreError::Conflict)
        })
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
}

impl Store for EtcdStore {
    type Snapshot<'s> = EtcdSnapshot<'s>;
    type Txn<'s> = EtcdTxn<'s>;

    fn hold_reads(&self) -> Result<Option<Box<dyn Send>>> {
        Ok(Some(Box::new(self.hold_history()?)))
    }

    fn request_latencies(&self) -> Option<calm_store::latency::Latencies> {
        Some(self.inner.stats.latencies.read())
    }

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
            Some(revision) if revision >= own && !self.inner.known_compacted(revision) => {
                Ok(EtcdSnapshot {
                    store: self,
                    revision,
                    cached: true,
                })
            }
            _ => self.snapshot(),
        }
    }

    fn begin(&self) -> Result<EtcdTxn<'_>> {
        self.begin_within(Instant::now())
    }

    /// The transaction's commit is sent until `retry_ms_max` after `since` (not after now):
    /// work queued behind a transaction that waited on the cluster has its bound counted from
    /// when it was asked for. Past it, nothing is sent.
    fn begin_within(&self, since: Instant) -> Result<EtcdTxn<'_>> {
        let retry_ms_max = self.inner.options.retry_ms_max;
        let deadline = since + Duration::from_millis(retry_ms_max);
        let past = || {
            StoreError::Io(format!(
                "etcd did not answer within the retry limit ({retry_ms_max} ms, retry-ms-max) \
                 of the request; nothing was written"
            ))
        };
        if Instant::now() >= deadline {
            return Err(past());
        }
        let (revision, seq_modified, cached, watched) = match self.watched_base() {
            Some(applied) => (applied, applied, true, true),
            None => {
                let (revision, seq_modified) = self.revision()?;
                let cached = self.inner.cache.ready_for(seq_modified);
                (revision, seq_modified, cached, false)
            }
        };
        if Instant::now() >= deadline {
            // The read of the revision took the rest of the time.
            return Err(past());
        }
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
            purged: Vec::new(),
            log_tail: None,
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

    /// The cluster's operations per transaction, less the commit key's.
    fn writes_max(&self) -> Option<usize> {
        Some(self.inner.options.txn_ops_max.saturating_sub(1))
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
