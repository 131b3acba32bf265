//! What a server shows Prometheus (`calm serve --metrics ADDR`): every gRPC request counted
//! and timed by method, its failures by calm's error name, where it is answered (a tower layer
//! around the services: atomics only, the method's counters found in a table made at start),
//! and each call of a batch (`Meta.Batch`, how mounts send most calls) as the method it stands
//! for; and at each scrape what `calm status` shows, read from the counters the parts keep.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use calm_metrics::{Registry, Scrape, TimedSet, counter_family, gauge_family};
use calm_proto::pb;
use tonic::codegen::http;

/// Error names a failed request is counted under: calm's errors by their stable code, then a
/// refusal without a calm code (a transport, decoding or identity failure), then anything
/// else.
fn error_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = calm_types::error::CODES
        .iter()
        .map(|(_, _, name)| *name)
        .collect();
    names.extend(["Refused", "other"]);
    names
}

/// The error index of a response: 0-based calm code, then "Refused" for a gRPC status without
/// one; `None`: it succeeded.
fn failure_of(headers: &http::HeaderMap) -> Option<usize> {
    let status = headers.get("grpc-status")?.to_str().ok()?;
    if status == "0" {
        return None;
    }
    let code = headers
        .get(calm_proto::ERROR_CODE_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    Some(error_index(code.unwrap_or(0)))
}

/// The error index of calm code `code` (0: none, a refusal without a calm code).
pub(crate) fn error_index(code: usize) -> usize {
    let codes = calm_types::error::CODES.len();
    match code {
        1.. if code <= codes => code - 1,
        _ => codes,
    }
}

/// Counts one call answered without a request of its own (a batch's call, a call of a mount in
/// this process) under `method`: its time, and its failure by calm code (`None`: it
/// succeeded; `Some(0)`: refused without a calm code).
pub(crate) fn count_call(
    requests: &TimedSet,
    method: &str,
    failed: Option<u32>,
    took: std::time::Duration,
) {
    let timed = requests.op(method);
    if let Some(code) = failed {
        timed.failed(error_index(code as usize));
    }
    timed.observe(took);
}

/// Counts and times the requests of the services it wraps.
#[derive(Debug, Clone)]
pub struct RequestsLayer {
    pub(crate) set: TimedSet,
}

impl RequestsLayer {
    pub fn new(registry: &Registry) -> Result<RequestsLayer, String> {
        let set = TimedSet::new(
            registry,
            "calm_server_requests",
            "requests the server answered",
            calm_proto::methods::METHODS,
            &error_names(),
        )
        .map_err(|e| format!("registering the request metrics: {e}"))?;
        Ok(RequestsLayer { set })
    }
}

impl<S> tower::Layer<S> for RequestsLayer {
    type Service = Requests<S>;

    fn layer(&self, inner: S) -> Requests<S> {
        Requests {
            inner,
            set: self.set.clone(),
        }
    }
}

/// The service [`RequestsLayer`] makes.
#[derive(Debug, Clone)]
pub struct Requests<S> {
    inner: S,
    set: TimedSet,
}

impl<S, B, R> tower::Service<http::Request<B>> for Requests<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let timed = self
            .set
            .op(request.uri().path().trim_start_matches('/'))
            .clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            match &answer {
                Ok(response) => {
                    if let Some(error) = failure_of(response.headers()) {
                        timed.failed(error);
                    }
                }
                Err(_) => timed.failed(usize::MAX),
            }
            timed.observe(started.elapsed());
            answer
        })
    }
}

/// What `status` shows, as metric families.
pub fn status_families(s: &pb::StatusReply) -> Vec<calm_metrics::MetricFamily> {
    let none: &[(&str, &str)] = &[];
    let gauge =
        |name: &str, help: &str, value: u64| gauge_family(name, help, &[(none, value as f64)]);
    let counter =
        |name: &str, help: &str, value: u64| counter_family(name, help, &[(none, value as f64)]);
    let mut out = vec![
        gauge(
            "calm_inodes",
            "Inodes in the namespace (the trash's included).",
            s.inodes,
        ),
        gauge(
            "calm_file_bytes",
            "Bytes of the namespace's regular files.",
            s.file_bytes,
        ),
        gauge(
            "calm_store_bytes",
            "Bytes the metadata store takes.",
            s.store_bytes,
        ),
        counter(
            "calm_commits_total",
            "Commit groups written since start.",
            s.commits,
        ),
        counter(
            "calm_committed_operations_total",
            "Mutations those commit groups carried.",
            s.ops_committed,
        ),
        counter(
            "calm_commit_failures_total",
            "Commit groups the store refused (their mutations were answered with the error).",
            s.failed_commits,
        ),
        counter_family(
            "calm_commit_seconds_total",
            "Time spent writing commit groups.",
            &[(none, s.commit_ns_total as f64 / 1e9)],
        ),
        gauge(
            "calm_commit_group_operations_max",
            "The largest commit group since start.",
            s.largest_batch,
        ),
        gauge(
            "calm_lock_sessions",
            "Lock sessions open (a mount has one).",
            s.lock_sessions,
        ),
        gauge(
            "calm_locks_held",
            "Byte-range and whole-file locks held.",
            s.locks,
        ),
        gauge("calm_lock_waits", "Lock requests waiting.", s.lock_waits),
        gauge(
            "calm_locked_files",
            "Files with a lock or a waiter.",
            s.locked_files,
        ),
        gauge(
            "calm_changelog_last_index",
            "Index of the last changelog record.",
            s.changelog_last,
        ),
        gauge(
            "calm_changelog_first_index",
            "Index of the first changelog record still kept (readers behind it lost records).",
            s.changelog_first,
        ),
        gauge(
            "calm_changelog_readers",
            "Registered changelog readers.",
            s.changelog_readers,
        ),
        counter(
            "calm_changelog_purged_records_total",
            "Changelog records purged since start.",
            s.changelog_purged,
        ),
        gauge(
            "calm_deletion_queue_objects",
            "Objects waiting to be deleted.",
            s.objects_queued,
        ),
        counter(
            "calm_objects_deleted_total",
            "Objects deleted since start.",
            s.objects_deleted,
        ),
        counter(
            "calm_chunks_compacted_total",
            "Chunks compacted since start.",
            s.chunks_compacted,
        ),
        counter(
            "calm_compaction_failures_total",
            "Compactions that failed (the object store's error).",
            s.compaction_failures,
        ),
        gauge(
            "calm_holds",
            "Files mounts hold now (answering their own chmod, chown and utimens).",
            s.holds,
        ),
        counter(
            "calm_holds_recalled_total",
            "Files held that were asked back because another client wanted them.",
            s.holds_recalled,
        ),
        counter(
            "calm_holds_taken_total",
            "Files held taken from mounts that did not give them back in time.",
            s.holds_taken,
        ),
        gauge(
            "calm_copies",
            "Copies of files mounts keep now (answering their opens without asking).",
            s.copies,
        ),
        counter(
            "calm_copies_recalled_total",
            "Copies asked back because another client changed the file.",
            s.copies_recalled,
        ),
        counter(
            "calm_copies_taken_total",
            "Copies taken from mounts that did not give them back in time.",
            s.copies_taken,
        ),
        gauge(
            "calm_watchers",
            "Watch streams open (every mount has one).",
            s.watchers,
        ),
        counter(
            "calm_watch_resyncs_total",
            "Times a watcher fell behind and was told to resync.",
            s.watch_resyncs,
        ),
        gauge(
            "calm_watch_queued_changes",
            "Changes queued for watchers (mounts' caches, watch streams) now, in all.",
            s.watch_queued,
        ),
        gauge(
            "calm_watch_queued_changes_max",
            "Changes queued for the watcher furthest behind now (past its queue's bound it is told to resync).",
            s.watch_queued_max,
        ),
        gauge(
            "calm_heap_bytes",
            "The server's heap: bytes allocated now.",
            s.heap_in_use_bytes,
        ),
        gauge(
            "calm_block_cache_bytes",
            "Blocks of a remote object store kept in memory.",
            s.cached_block_bytes,
        ),
        counter(
            "calm_backups_total",
            "Metadata backups written since start.",
            s.backups_made,
        ),
        counter(
            "calm_backup_failures_total",
            "Metadata backups that failed since start.",
            s.backups_failed,
        ),
        gauge(
            "calm_backup_last_timestamp_seconds",
            "When the last metadata backup was written (0: none yet).",
            s.backup_last_ms / 1000,
        ),
        gauge(
            "calm_trash_entries",
            "Files and directories in the trash.",
            s.trash_entries,
        ),
        gauge(
            "calm_trash_bytes",
            "Bytes of the files in the trash.",
            s.trash_bytes,
        ),
        gauge(
            "calm_uptime_seconds",
            "Seconds since the server started.",
            s.uptime_ms / 1000,
        ),
    ];
    if !s.store.is_empty() {
        let values: Vec<(Vec<(&str, &str)>, f64)> = s
            .store
            .iter()
            .map(|f| (vec![("figure", f.name.as_str())], f.value as f64))
            .collect();
        let values: Vec<(&[(&str, &str)], f64)> =
            values.iter().map(|(l, v)| (l.as_slice(), *v)).collect();
        out.push(counter_family(
            "calm_store_figures_total",
            "What a shared store counts of its own work (etcd requests, retries), by figure.",
            &values,
        ));
    }
    out
}

/// The distributions of commit groups: mutations per group, seconds per group.
pub fn commit_families(d: &calm_meta::CommitDistributions) -> Vec<calm_metrics::MetricFamily> {
    use calm_meta::commit_stats::GROUP_SIZE_BOUNDS;
    let sizes: Vec<f64> = GROUP_SIZE_BOUNDS.iter().map(|b| *b as f64).collect();
    let seconds: Vec<f64> = calm_store::latency::LATENCY_NS_BOUNDS
        .iter()
        .map(|b| *b as f64 / 1e9)
        .collect();
    vec![
        calm_metrics::histogram_of(
            "calm_commit_group_operations",
            "Mutations per commit group (each group is one durable write of the store).",
            &sizes,
            &d.sizes,
            d.ops as f64,
        ),
        calm_metrics::histogram_of(
            "calm_commit_group_seconds",
            "How long commit groups took to be written and made durable.",
            &seconds,
            &d.durations,
            d.ns as f64 / 1e9,
        ),
    ]
}

/// A distribution of durations as a histogram in seconds.
fn seconds_family(
    name: &str,
    help: &str,
    l: &calm_store::latency::Latencies,
) -> calm_metrics::MetricFamily {
    let bounds: Vec<f64> = calm_store::latency::LATENCY_NS_BOUNDS
        .iter()
        .map(|ns| *ns as f64 / 1e9)
        .collect();
    calm_metrics::histogram_of(name, help, &bounds, &l.cumulative, l.sum_ns as f64 / 1e9)
}

/// How long the requests to a shared store's cluster (etcd) took.
pub fn store_request_family(l: &calm_store::latency::Latencies) -> calm_metrics::MetricFamily {
    seconds_family(
        "calm_store_requests_seconds",
        "How long each request to the shared store's cluster (etcd) took, answered or not (a request sent again counts each time; the retries: calm_store_figures_total{figure=\"retries\"}).",
        l,
    )
}

/// What the embedded store's write-ahead log counts: its syncs, bytes and checkpoints.
pub fn store_log_families(
    log: &calm_store::latency::LogFigures,
) -> Vec<calm_metrics::MetricFamily> {
    vec![
        seconds_family(
            "calm_store_wal_sync_seconds",
            "How long each commit group's write-ahead log record took to reach the disk (its fdatasync alone; the whole group: calm_commit_group_seconds).",
            &log.syncs,
        ),
        counter_family(
            "calm_store_wal_written_bytes_total",
            "Bytes written to the write-ahead log (records with their headers).",
            &[(&[], log.bytes as f64)],
        ),
        seconds_family(
            "calm_store_checkpoint_seconds",
            "How long each checkpoint took (the metadata file made durable so that the write-ahead log can start again; one every 4 MiB of changes).",
            &log.checkpoints,
        ),
    ]
}

/// Lock requests by how they ended, and sessions ended by their lease.
pub fn lock_families(c: &calm_locks::Counts) -> Vec<calm_metrics::MetricFamily> {
    vec![
        counter_family(
            "calm_lock_grants_total",
            "Locks granted, when asked (waited=\"no\") or after waiting (waited=\"yes\").",
            &[
                (&[("waited", "no")], c.granted as f64),
                (&[("waited", "yes")], c.granted_after_wait as f64),
            ],
        ),
        counter_family(
            "calm_lock_refusals_total",
            "Lock requests refused: for a conflicting lock (a request that would not wait), or because waiting would have deadlocked.",
            &[
                (&[("reason", "conflict")], c.conflicts as f64),
                (&[("reason", "deadlock")], c.deadlocks as f64),
            ],
        ),
        counter_family(
            "calm_lock_sessions_expired_total",
            "Lock sessions ended because their lease ran out (a mount that died or lost the server): their locks were released.",
            &[(&[], c.expired as f64)],
        ),
    ]
}

/// Which server decides each file's locks, among several: the view, takeovers and their grace,
/// refusals for where a file is decided, locks moved.
pub fn peers_families(f: &crate::peers::PeersFigures) -> Vec<calm_metrics::MetricFamily> {
    let c = &f.counts;
    let refused: Vec<[(&str, &str); 1]> = crate::decider_counts::REFUSALS
        .iter()
        .map(|r| [("reason", *r)])
        .collect();
    let refused: Vec<(&[(&str, &str)], f64)> = refused
        .iter()
        .zip(f.refused)
        .map(|(l, n)| (&l[..], n as f64))
        .collect();
    let gauge =
        |name: &str, help: &str, value: usize| gauge_family(name, help, &[(&[][..], value as f64)]);
    vec![
        gauge(
            "calm_peers_servers",
            "Servers in the view this server decides locks by (a file's locks are decided by one of them).",
            f.servers,
        ),
        gauge(
            "calm_peers_deciding",
            "1 when this server's membership is confirmed and it decides its files' locks, 0 when it decides none (its lease lapsed, or it is not in the view).",
            f.deciding as usize,
        ),
        counter_family(
            "calm_peers_view_changes_total",
            "Times the view of servers changed (one came or went) and files' locks moved between servers.",
            &[(&[], c.views_changed as f64)],
        ),
        counter_family(
            "calm_peers_locks_moved_total",
            "Locks and waiting requests this server dropped because their file moved to another server (their clients take them again there).",
            &[(&[], f.locks_moved as f64)],
        ),
        counter_family(
            "calm_peers_takeovers_total",
            "Takeovers begun: files came to this server from others, and their clients may reclaim their locks here first (a grace period).",
            &[(&[], c.takeovers as f64)],
        ),
        gauge(
            "calm_peers_takeovers_in_grace",
            "Takeovers whose grace period is not over: new locks on their files wait.",
            f.takeovers_active,
        ),
        counter_family(
            "calm_peers_takeovers_ended_total",
            "Takeovers ended, by how: every client reported its reclaims (reclaimed), the longest grace ran out (deadline), this server left the view (left).",
            &[
                (&[("how", "reclaimed")], c.ended_reclaimed as f64),
                (&[("how", "deadline")], c.ended_deadline as f64),
                (&[("how", "left")], c.ended_left as f64),
            ],
        ),
        counter_family(
            "calm_peers_grace_seconds_total",
            "Seconds of grace of the takeovers ended, from each one's start to its end (divided by the takeovers ended: the average grace).",
            &[(&[], c.grace_ms as f64 / 1000.0)],
        ),
        counter_family(
            "calm_peers_lock_refusals_total",
            "Lock requests refused for where their file is decided: another server decides it (moved; the client asks that one), it is in a takeover's grace (grace; only reclaims pass), this server decides nothing now (lapsed).",
            &refused,
        ),
    ]
}

/// Changelog readers shown by name in the metrics: the ones furthest behind.
pub const READERS_SHOWN: usize = 64;

/// How far each changelog reader is behind the last record (the furthest behind first, at
/// most [`READERS_SHOWN`]).
pub fn reader_families(users: &calm_meta::ChangelogUsers) -> Vec<calm_metrics::MetricFamily> {
    let mut lags: Vec<(String, u64)> = users
        .users
        .iter()
        .map(|u| (format!("cl{}", u.id), users.last.saturating_sub(u.cleared)))
        .collect();
    lags.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    lags.truncate(READERS_SHOWN);
    let labels: Vec<[(&str, &str); 1]> =
        lags.iter().map(|(r, _)| [("reader", r.as_str())]).collect();
    let values: Vec<(&[(&str, &str)], f64)> = labels
        .iter()
        .zip(&lags)
        .map(|(l, (_, lag))| (&l[..], *lag as f64))
        .collect();
    vec![gauge_family(
        "calm_changelog_reader_lag_records",
        "Changelog records each registered reader has not cleared yet (the 64 furthest behind).",
        &values,
    )]
}

/// Share of a hard limit past which a quota counts as near it.
pub const QUOTA_NEAR: f64 = 0.9;

/// How many quotas are near their hard limit (bytes or inodes at [`QUOTA_NEAR`] of it or
/// more) and past their soft limit, by kind of quota.
pub fn quota_families(quotas: &[calm_types::QuotaReport]) -> Vec<calm_metrics::MetricFamily> {
    let kinds = calm_types::QuotaKind::ALL.map(calm_types::QuotaKind::word);
    let mut near = [0u64; calm_types::QuotaKind::ALL.len()];
    let mut over_soft = [0u64; calm_types::QuotaKind::ALL.len()];
    for q in quotas {
        let kind = q.target.kind.index();
        let (l, u) = (&q.limits, &q.usage);
        let near_of = |limit: u64, used: i64| limit > 0 && used as f64 >= QUOTA_NEAR * limit as f64;
        if near_of(l.bytes, u.bytes) || near_of(l.inodes, u.inodes) {
            near[kind] += 1;
        }
        if q.bytes_over_since_ns != 0 || q.inodes_over_since_ns != 0 {
            over_soft[kind] += 1;
        }
    }
    let labels: Vec<[(&str, &str); 1]> = kinds.iter().map(|k| [("kind", *k)]).collect();
    let values = |counts: &[u64; 3]| -> Vec<(&[(&str, &str)], f64)> {
        labels
            .iter()
            .zip(counts)
            .map(|(l, c)| (&l[..], *c as f64))
            .collect()
    };
    vec![
        gauge_family(
            "calm_quotas_near_limit",
            "Quotas whose bytes or inodes reached 90 % of their hard limit, by kind (user, group, tree).",
            &values(&near),
        ),
        gauge_family(
            "calm_quotas_over_soft_limit",
            "Quotas past their soft limit (in their grace period, or past it), by kind.",
            &values(&over_soft),
        ),
    ]
}

/// Registers the server's figures, read from `status` at each scrape.
pub fn scrape_status(
    scrape: &Scrape,
    status: impl Fn() -> Option<pb::StatusReply> + Send + Sync + 'static,
) {
    let status = Arc::new(status);
    scrape.add(move || {
        status()
            .map(|s| {
                let mut families = status_families(&s);
                families.extend(crate::load::families(&s));
                families
            })
            .unwrap_or_default()
    });
}
