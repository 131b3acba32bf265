//! `calm-server`: the gRPC face of the namespace and of the lock manager ([`locks`]).
//!
//! [`MetaService`] turns each RPC into one call on [`calm_meta::Meta`] and each
//! [`calm_meta::MetaError`] into a status with its stable code. Reads run inline on the
//! runtime's threads (an LMDB read is a few microseconds of memory access); mutations await the
//! group committer. Limits: a request or reply larger than [`calm_proto::MESSAGE_BYTES_MAX`] is
//! refused before it is decoded; at most [`STREAMS_PER_CONNECTION_MAX`] requests run at once
//! per connection (a `Batch` is one of them and runs up to
//! [`calm_proto::batch::BATCH_CALLS_MAX`] calls at once: at most 65 536 calls per connection);
//! a message that does not decode gets an `Internal` status and the server
//! goes on serving.
//!
//! What it does not know: how the store is laid out (calm-meta) or what a client does with
//! the answers.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use calm_meta::Meta;
use calm_proto::MESSAGE_BYTES_MAX;
use calm_proto::pb::changelog_server::ChangelogServer;
use calm_proto::pb::locks_server::LocksServer;
use calm_proto::pb::meta_server::MetaServer;
use calm_proto::pb::watch_server::WatchServer;
use calm_store::Store;

pub mod assembly;
use calm_upkeep::{backup, compactor, data};
pub mod auth;
mod batch;
pub mod changelog;
pub mod connections;
pub mod data_dir;
pub mod decider_counts;
pub mod heap;
pub mod holds;
pub mod in_process;
pub mod lease_clock;
pub mod ledger;
pub mod listen;
pub mod load;
mod lock_table;
pub mod locks;
mod meta_answers;
mod meta_holds;
mod meta_names;
mod meta_service;
mod meta_status;
mod meta_write;
pub mod metrics;
pub mod nearest;
pub mod offline;
pub mod orphans;
pub mod peers;
pub mod private_file;
pub mod protect;
mod socket_owner;
pub mod stopping;
pub mod targets;
pub mod tls;
pub mod watch;

pub use assembly::{Assembled, ServerConfig, ServerError};
pub use changelog::ChangelogService;
pub use data_dir::{DATA_DIR_MODE, LOCK_FILE, lock_data_dir, private_files, secure_data_dir};
pub use locks::{LockService, LockTable};
pub use meta_service::MetaService;
pub use watch::{WatchHub, WatchService};

/// Requests one client connection may have in flight at once (a batch counts once, its calls
/// up to `BATCH_CALLS_MAX` more).
pub const STREAMS_PER_CONNECTION_MAX: usize = 1024;

/// Name of the Unix socket a server listens on in its data directory.
pub const SOCKET_FILE: &str = "calm.sock";

/// How long a stopping server lets the requests in flight finish. What never ends by itself
/// (a mount's watch of changes, a lock wait) is ended at once ([`stopping`]); this bounds the
/// others (a commit waiting on its store).
pub const STOP_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a stopping server of several waits to leave their registry (its lease ends its
/// membership anyway when the store does not answer).
pub const LEAVE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The line `calm serve` prints once it accepts requests: `ready in N ms, serving on ADDR`
/// (`and ADDR` for each further listener; the Unix socket first).
pub fn ready_line(ready_ms: u64, addrs: &[String]) -> String {
    format!("ready in {ready_ms} ms, serving on {}", addrs.join(" and "))
}

/// Reads a [`ready_line`] back: the milliseconds and the last address (a TCP listener asked
/// for, when there is one; else the Unix socket).
pub fn parse_ready_line(line: &str) -> Option<(u64, String)> {
    match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["ready", "in", ms, "ms,", "serving", "on", addrs @ ..] => {
            let last = addrs.last().filter(|addr| **addr != "and")?;
            Some((ms.parse().ok()?, last.to_string()))
        }
        _ => None,
    }
}

/// What the service reports about itself in status.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub data_dir: String,
    /// When the process started.
    pub started: Instant,
    /// Milliseconds from start to accepting requests.
    pub ready_ms: u64,
    /// Limits of the watch fan-out (watchers, queue per watcher, handles per watch).
    pub watch_limits: calm_watch::Limits,
    /// Limits of the lock manager (locks per session, per user, in all).
    pub lock_limits: calm_locks::Limits,
    /// The object store and the deleter's delay (absent: no deleter or compactor runs, as in
    /// tests of the namespace alone).
    pub data: Option<data::DataOptions>,
    /// How clients become identities (root squash).
    pub auth: auth::Auth,
    /// With a shared store (etcd): this server's part among the servers of the namespace
    /// (`None`: its locks are its own, as on an embedded store).
    pub peers: Option<peers::PeersOptions>,
    /// Metadata backups into the object store (`None`: none).
    pub backups: Option<backup::BackupPolicy>,
    /// Alone on an embedded store: the file where its lock sessions are written down, so that
    /// after a restart their clients take their locks again before anyone else may
    /// (`ledger`). `None`: locks are not recovered after a restart.
    pub lock_ledger: Option<std::path::PathBuf>,
}

impl ServerInfo {
    /// A server of the namespace alone, started now: no object store (no deleter or
    /// compactor), the default limits, no root squash, the only server of its store.
    pub fn plain() -> ServerInfo {
        ServerInfo {
            data_dir: String::new(),
            started: Instant::now(),
            ready_ms: 0,
            watch_limits: calm_watch::Limits::default(),
            lock_limits: calm_locks::Limits::default(),
            data: None,
            auth: auth::Auth::default(),
            peers: None,
            backups: None,
            lock_ledger: None,
        }
    }
}

/// Serves `meta` and its locks on `listener` until `shutdown` completes; then stops
/// accepting, lets the requests in flight finish, and returns. Locks live in memory: they
/// end with the server, and the sessions that held them are fenced by the next one.
pub async fn serve<S: Store>(
    meta: Arc<Meta<S>>,
    info: ServerInfo,
    listener: Vec<listen::Listener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    Server::start(meta, info)
        .await
        .serve(listener, shutdown)
        .await
}

/// Every service of one server, with the tasks that run beside them (lock leases, the
/// orphan sweeper, the deleter and compactor). A client in the same process calls the
/// namespace and lock services directly ([`Server::meta_service`], [`Server::lock_service`]),
/// without a connection; remote clients reach the same services through [`Server::serve`].
#[derive(Debug)]
pub struct Server<S: Store> {
    meta: Arc<MetaService<S>>,
    locks: Arc<LockService<S>>,
    changelog: Arc<ChangelogService<S>>,
    watch: Arc<WatchService<S>>,
    targets: Arc<targets::TargetRegistry>,
    protect: Arc<protect::ProtectService<S>>,
    table: Arc<LockTable>,
    leases: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    /// Sweeps idle users and jobs out of the load tables.
    load_sweeper: tokio::task::JoinHandle<()>,
    /// Gives back the room of quota shares no hold claimed.
    share_sweeper: Option<tokio::task::JoinHandle<()>>,
    /// The metadata backups, when asked for.
    backups: Option<tokio::task::JoinHandle<()>>,
    /// The membership task, with several servers on one store.
    peers: Option<tokio::task::JoinHandle<()>>,
    /// Counts and times the requests, when metrics are served.
    requests: Option<metrics::RequestsLayer>,
    /// Connections and their requests by listener and identity kind, refusals by limit.
    connections: Arc<connections::Connections>,
    /// The metrics endpoint, served as long as the server.
    endpoint: Option<calm_metrics::Endpoint>,
}

impl<S: Store> Server<S> {
    /// Starts the services of `meta` and their tasks (on the current runtime).
    pub async fn start(meta: Arc<Meta<S>>, info: ServerInfo) -> Server<S> {
        let registry = info.peers.as_ref().and(meta.store().registry());
        let mut table = LockTable::with_registry(info.lock_limits, meta.epoch(), registry);
        if let Some(path) = &info.lock_ledger
            && let Err(e) = table.keep_ledger(path)
        {
            // Locks still work; a restart after this one would not wait for their reclaims.
            tracing::error!(%e, path = %path.display(), "opening the ledger of lock sessions");
        }
        let table = Arc::new(table);
        let leases = tokio::spawn(table.clone().run_leases());
        let peers = match (&info.peers, table.has_peers()) {
            (Some(options), true) => {
                let owners = info.auth.sessions.clone();
                Some(tokio::spawn(peers::run(
                    table.clone(),
                    options.clone(),
                    owners,
                )))
            }
            _ => None,
        };
        let watch_limits = info.watch_limits;
        let data = info
            .data
            .clone()
            .map(|options| data::DataTasks::start(meta.clone(), options));
        let sweeper = tokio::spawn(orphans::sweep(meta.clone(), table.clone(), data.clone()));
        let backups = match (&info.backups, &data) {
            (Some(policy), Some(data)) => Some(tokio::spawn(backup::run_backups(
                meta.clone(),
                data.options.objects.clone(),
                policy.clone(),
                data.backups.clone(),
            ))),
            _ => None,
        };
        let auth = Arc::new(info.auth.clone());
        let hub = WatchHub::new(meta.clone(), watch_limits);
        hub.clear_only_when_committing(table.clone());
        let objects = data.as_ref().map(|d| d.options.objects.clone());
        let holds = info
            .peers
            .is_none()
            .then(|| Arc::new(holds::Holds::default().with_shares(meta.shares().clone())));
        let mut service = MetaService::new(meta.clone(), auth.clone(), table.clone(), info, data);
        service.watch = Some(hub.clone());
        service.holds = holds.clone();
        let service = Arc::new(service);
        let load_sweeper = tokio::spawn(service.loads.clone().sweep());
        let share_sweeper = holds
            .clone()
            .map(|holds| tokio::spawn(holds.keep_sweeping_shares()));
        let locks = Arc::new(LockService::new(meta.clone(), table.clone(), auth.clone()));
        if let Err(e) = hub.resume().await {
            tracing::warn!(%e, "resuming the watch feed");
        }
        Server {
            protect: Arc::new(
                protect::ProtectService::new(meta.clone(), auth.clone(), objects).holding(holds),
            ),
            meta: service,
            locks,
            changelog: Arc::new(ChangelogService::new(meta, auth.clone())),
            watch: Arc::new(WatchService::new(hub, auth.clone())),
            targets: Arc::new(targets::TargetRegistry::with_registry(
                auth,
                table.registry.clone(),
            )),
            table,
            leases,
            sweeper,
            load_sweeper,
            share_sweeper,
            backups,
            peers,
            requests: None,
            connections: Arc::default(),
            endpoint: None,
        }
    }

    /// Keeps the metrics endpoint running as long as the server serves.
    pub fn keep(&mut self, endpoint: calm_metrics::Endpoint) {
        self.endpoint = Some(endpoint);
    }

    /// Shows this server's figures in `registry`: its requests counted and timed by method as
    /// they are served, and what `calm status` shows, read at each scrape.
    pub fn with_metrics(mut self, registry: &calm_metrics::Registry) -> Result<Self, String> {
        let requests = metrics::RequestsLayer::new(registry)?;
        // Calls in batches are counted where the batch dispatches them.
        let _ = self.meta.metrics.set(requests.set.clone());
        self.requests = Some(requests);
        let scrape = calm_metrics::Scrape::new(registry, "server")
            .map_err(|e| format!("registering the server's figures: {e}"))?;
        let service = self.meta.clone();
        metrics::scrape_status(&scrape, move || service.status_now().ok());
        // Commit groups' sizes and durations, and a shared store's requests.
        let meta = self.meta.meta.clone();
        scrape.add(move || {
            let mut families = metrics::commit_families(&meta.commit_distributions());
            if let Some(latencies) = meta.store_latencies() {
                families.push(metrics::store_request_family(&latencies));
            }
            if let Some(log) = meta.store_log() {
                families.extend(metrics::store_log_families(&log));
            }
            families
        });
        // Connections by listener and identity kind, refusals by limit.
        let connections = self.connections.clone();
        scrape.add(move || connections.families());
        // Lock requests by how they ended.
        let table = self.table.clone();
        scrape.add(move || {
            let mut families = metrics::lock_families(&table.counts());
            if let Some(figures) = table.peers_figures() {
                families.extend(metrics::peers_families(&figures));
            }
            families
        });
        // Each changelog reader's lag (the laggiest, at most READERS_SHOWN).
        let meta = self.meta.meta.clone();
        scrape.add(move || match meta.changelog_users() {
            Ok(users) => metrics::reader_families(&users),
            Err(_) => Vec::new(),
        });
        // Quotas near or past their limits, for alerts (at most the listing's bound).
        let meta = self.meta.meta.clone();
        scrape.add(move || {
            let root = calm_types::Caller::default();
            match meta.quotas(&root, false) {
                Ok(quotas) => metrics::quota_families(&quotas),
                Err(_) => Vec::new(),
            }
        });
        // The server's own requests to the object store (deletions, compactions, backups).
        if let Some(data) = &self.meta.data {
            let objects = data.options.objects.clone();
            scrape.add(move || objects.meter().families("server"));
        }
        Ok(self)
    }

    /// The namespace service, for a client in this process.
    pub fn meta_service(&self) -> Arc<MetaService<S>> {
        self.meta.clone()
    }

    /// The lock service, for a client in this process.
    pub fn lock_service(&self) -> Arc<LockService<S>> {
        self.locks.clone()
    }

    /// The namespace service for a client in this process, each call counted in the request
    /// metrics and the load as a request from a connection is.
    pub fn counted_meta_service(&self) -> Arc<in_process::CountedMeta<S>> {
        Arc::new(in_process::CountedMeta::new(self.meta.clone()))
    }

    /// The lock service for a client in this process, each call counted as a request from a
    /// connection is.
    pub fn counted_lock_service(&self) -> Arc<in_process::CountedLocks<S>> {
        Arc::new(in_process::CountedLocks::new(
            self.locks.clone(),
            self.meta.clone(),
        ))
    }

    /// The watch service, for a client in this process.
    pub fn watch_service(&self) -> Arc<WatchService<S>> {
        self.watch.clone()
    }

    /// Serves every service on `listeners` until `shutdown` completes; then stops accepting,
    /// lets the requests in flight finish (for [`STOP_WAIT_MAX`] at most), stops the server's
    /// tasks, leaves the servers' registry and returns.
    pub async fn serve(
        self,
        listeners: Vec<listen::Listener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let service = MetaServer::from_arc(self.meta.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let locks = LocksServer::from_arc(self.locks.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let watch = WatchServer::from_arc(self.watch.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let targets = calm_proto::pb::targets_server::TargetsServer::from_arc(self.targets.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let protect = calm_proto::pb::protect_server::ProtectServer::from_arc(self.protect.clone());
        let changelog = ChangelogServer::from_arc(self.changelog.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        // Each connection comes with its peer (listen.rs; TCP with TCP_NODELAY: replies are
        // small and latency-bound, and Nagle's algorithm would hold one back until the
        // client's delayed ACK whenever a previous segment is unacknowledged).
        let (incoming, accepting) = listen::incoming(listeners, self.connections.clone());
        let asked = Arc::new(tokio::sync::Notify::new());
        let shutdown = {
            let asked = asked.clone();
            let stopping = [
                self.table.stopping.clone(),
                self.watch.hub().stopping.clone(),
            ];
            async move {
                shutdown.await;
                // Watches and lock waits end now: their clients go on elsewhere.
                for stopping in &stopping {
                    stopping.begin();
                }
                asked.notify_one();
            }
        };
        let serving = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(STREAMS_PER_CONNECTION_MAX)
            .http2_keepalive_interval(Some(listen::KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(listen::KEEPALIVE_TIMEOUT))
            .layer(tower::util::option_layer(self.requests.clone()))
            .layer(load::LoadLayer {
                loads: self.meta.loads.clone(),
                connections: self.connections.clone(),
            })
            .add_service(service)
            .add_service(locks)
            .add_service(changelog)
            .add_service(watch)
            .add_service(targets)
            .add_service(protect)
            .serve_with_incoming_shutdown(incoming, shutdown);
        // Requests in flight get STOP_WAIT_MAX to finish; anything still open then is cut.
        let served = tokio::select! {
            served = serving => served,
            _ = async {
                asked.notified().await;
                tokio::time::sleep(STOP_WAIT_MAX).await;
            } => {
                tracing::info!(
                    "stopping: requests still open after {STOP_WAIT_MAX:?} are cut"
                );
                Ok(())
            }
        };
        for task in accepting {
            task.abort();
        }
        self.leases.abort();
        self.sweeper.abort();
        self.load_sweeper.abort();
        if let Some(task) = self.share_sweeper {
            task.abort();
        }
        if let Some(task) = self.backups {
            task.abort();
        }
        if let Some(task) = self.peers {
            // Stop deciding first, then leave: the others take the files over at once rather
            // than after the lease.
            task.abort();
            self.table.lapse();
            if let Some(registry) = self.table.registry.clone() {
                let leave = tokio::task::spawn_blocking(move || registry.leave());
                match tokio::time::timeout(LEAVE_WAIT_MAX, leave).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(e))) => tracing::warn!(%e, "leaving the registry of servers"),
                    Ok(Err(e)) => tracing::warn!(%e, "leaving the registry of servers"),
                    Err(_) => tracing::warn!(
                        "leaving the registry of servers took over {LEAVE_WAIT_MAX:?}: the \
                         membership ends with its lease"
                    ),
                }
            }
        }
        served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_every_address_and_reads_back_the_last() {
        let addrs = [
            "unix:/d/calm.sock".to_string(),
            "127.0.0.1:7420".to_string(),
        ];
        let line = ready_line(12, &addrs);
        assert_eq!(
            line,
            "ready in 12 ms, serving on unix:/d/calm.sock and 127.0.0.1:7420"
        );
        assert_eq!(
            parse_ready_line(&line),
            Some((12, "127.0.0.1:7420".to_string()))
        );
        assert_eq!(
            parse_ready_line(&ready_line(3, &addrs[..1])),
            Some((3, "unix:/d/calm.sock".to_string()))
        );
        for bad in [
            "ready in 12 ms, serving on",
            "ready in x ms, serving on a",
            "ready in 1 ms, serving on a and",
            "mounted at /m",
        ] {
            assert_eq!(parse_ready_line(bad), None, "{bad}");
        }
    }
}
