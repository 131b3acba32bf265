//! A server put together from its configuration: the namespace opened on a store the caller
//! chose (the embedded LMDB store in a locked data directory, or etcd), its object store, its
//! listeners (the Unix socket beside the store, and TCP with or without TLS), and, on a shared
//! store, its place among the namespace's servers. `calm serve` and `calm mount --embedded`
//! build a [`ServerConfig`] from their flags and call [`Assembled::open`]; what went wrong
//! comes back as a [`ServerError`] that names it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_changelog::ChangelogConfig;
use calm_meta::{Meta, MetaError, MetaOptions};
use calm_store::Store;

use crate::data::DataOptions;
use crate::listen::Listener;
use crate::peers::PeersOptions;
use crate::{SOCKET_FILE, Server, ServerInfo};

/// What a server is made of, as its operator configured it.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Changelog limits and reader GC.
    pub changelog: ChangelogConfig,
    /// Limits of the watch fan-out.
    pub watch_limits: calm_watch::Limits,
    /// Limits of the lock manager.
    pub lock_limits: calm_locks::Limits,
    /// The object store of file contents for a namespace being created (a URL); `None`: the
    /// `objects` directory of the data directory. A namespace keeps the store it was created
    /// with.
    pub objects: Option<String>,
    /// How long an object no file names waits before it is deleted.
    pub delete_delay: Duration,
    /// After a start, how long mounts have to claim the files they keep open without a name.
    pub orphan_claim_grace: Duration,
    /// Addresses served beside the Unix socket: `HOST:PORT` or `unix:PATH`.
    pub listen: Vec<String>,
    /// The certificate, key and client CA of TCP listeners.
    pub tls: Option<TlsFiles>,
    /// Mount certificates' uid 0 acts as nobody.
    pub root_squash: bool,
    /// Several servers share the store (etcd): this server's part among them.
    pub shared: Option<SharedConfig>,
    /// Metadata backups into the object store: every so often, and how many are kept (their
    /// dump is written in the data directory first).
    pub backups: Option<(Duration, usize)>,
    /// How long what is removed stays in the trash (zero: no trash, a removal is final).
    pub trash_kept: Duration,
    /// What loses its last name younger than this skips the trash (a program's scratch file);
    /// zero: nothing does.
    pub trash_min_age: Duration,
    /// Where to serve Prometheus's metrics (`HOST:PORT`; `None`: not served).
    pub metrics: Option<String>,
}

/// The PEM files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// A server's part among the servers of one namespace.
#[derive(Debug, Clone)]
pub struct SharedConfig {
    /// The lease of its membership, in milliseconds.
    pub lease_ms: u64,
    /// The longest it waits for clients to reclaim the locks of files it took over.
    pub grace_ms_max: u64,
    /// Where the other servers' clients reach it (default: its first TCP listener, else its
    /// Unix socket).
    pub advertise: Option<String>,
}

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("data directory {}: {reason}", dir.display())]
    DataDir { dir: PathBuf, reason: String },
    #[error("object store {url}: {reason}")]
    Objects { url: String, reason: String },
    #[error("opening the namespace: {0}")]
    Namespace(#[from] MetaError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("listening on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("serving: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("the namespace is still in use after the server stopped")]
    StillInUse,
    #[error("opening the store in {}: {reason}", dir.display())]
    Store { dir: PathBuf, reason: String },
}

impl ServerConfig {
    /// Checks what can be checked before anything is opened or created (the object store's
    /// URL), so that a mistake leaves no store behind.
    pub fn check(&self) -> Result<(), ServerError> {
        if let Some(url) = &self.objects {
            calm_data::ObjectsUrl::parse(url).map_err(|e| ServerError::Objects {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// The namespace options for this configuration: the object store named for a new
    /// namespace (checked), or `data_dir/objects`.
    fn meta_options(&self, data_dir: &Path) -> Result<MetaOptions, ServerError> {
        self.check()?;
        let dir = std::path::absolute(data_dir).map_err(|e| ServerError::DataDir {
            dir: data_dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(MetaOptions {
            changelog: self.changelog,
            batch_ops_max: match self.shared {
                Some(_) => calm_meta::SHARED_BATCH_OPS_MAX,
                None => MetaOptions::default().batch_ops_max,
            },
            objects_url: self.objects.clone(),
            objects_url_default: Some(calm_data::ObjectsUrl::file(&dir.join("objects"))),
            trash_kept: self.trash_kept,
            trash_min_age: self.trash_min_age,
            ..MetaOptions::default()
        })
    }

    /// The deleter's and compactor's object store: the one the namespace keeps, claimed as
    /// the namespace's (refused when it is another's), and deleting only while it stays so.
    async fn data_options<S: Store>(
        &self,
        meta: &Meta<S>,
    ) -> Result<Option<DataOptions>, ServerError> {
        let Some(url) = meta.objects_url()? else {
            return Ok(None);
        };
        let refused = |e: calm_data::DataError| ServerError::Objects {
            url: url.clone(),
            reason: e.to_string(),
        };
        let objects = calm_data::Objects::open(&url).map_err(refused)?;
        let objects = match meta.objects_owner()? {
            Some(claim) => {
                match objects.claim(&claim).await {
                    Ok(()) => {}
                    Err(e @ calm_data::DataError::Taken(_)) => return Err(refused(e)),
                    // Claimed before the first deletion; the metadata is served meanwhile.
                    Err(error) => tracing::warn!(%error, "claiming the object store"),
                }
                objects.fenced(claim)
            }
            None => objects,
        };
        Ok(Some(DataOptions {
            objects,
            delete_delay: self.delete_delay,
            orphan_claim_grace: self.orphan_claim_grace,
        }))
    }

    fn auth(&self) -> crate::auth::Auth {
        crate::auth::Auth {
            root_squash: self.root_squash,
            ..Default::default()
        }
    }

    /// The Unix socket in `data_dir` and every other address, bound; and their names as
    /// clients give them (the socket first).
    async fn listeners(
        &self,
        data_dir: &Path,
    ) -> Result<(Vec<Listener>, Vec<String>), ServerError> {
        let tls = match &self.tls {
            Some(files) => Some(Arc::new(
                crate::tls::TlsServer::new(&files.cert, &files.key, &files.client_ca)
                    .map_err(ServerError::Tls)?,
            )),
            None => None,
        };
        let socket = format!("unix:{}", data_dir.join(SOCKET_FILE).display());
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for addr in std::iter::once(&socket).chain(&self.listen) {
            let tls = if addr.starts_with("unix:") {
                None
            } else {
                tls.clone()
            };
            let (listener, name) =
                crate::listen::bind(addr, tls)
                    .await
                    .map_err(|reason| ServerError::Listen {
                        addr: addr.clone(),
                        reason,
                    })?;
            listeners.push(listener);
            addrs.push(name);
        }
        Ok((listeners, addrs))
    }
}

/// A server ready to serve: its namespace open, its listeners bound.
#[allow(missing_debug_implementations)] // holds bound listeners
pub struct Assembled<S: Store> {
    pub meta: Arc<Meta<S>>,
    pub info: ServerInfo,
    listeners: Vec<Listener>,
    /// The addresses served, as clients name them (the Unix socket first).
    pub addrs: Vec<String>,
    /// The metrics endpoint's listener, bound at the opening, and the registry it serves.
    metrics: Option<(std::net::TcpListener, calm_metrics::Registry)>,
}

impl<S: Store> Assembled<S> {
    /// Opens the namespace on `store` and binds the listeners: the Unix socket in `data_dir`
    /// (which holds nothing else on a shared store), and `config.listen`. `name` is what
    /// `calm status` shows as the store (the data directory, or the etcd URL).
    pub async fn open(
        store: S,
        config: &ServerConfig,
        data_dir: &Path,
        name: String,
        started: Instant,
    ) -> Result<Assembled<S>, ServerError> {
        let meta = Meta::open(store, config.meta_options(data_dir)?)?;
        let data = config.data_options(&meta).await?;
        let (listeners, addrs) = config.listeners(data_dir).await?;
        let peers = config.shared.as_ref().map(|shared| PeersOptions {
            address: shared.advertise.clone().unwrap_or_else(|| {
                addrs
                    .iter()
                    .find(|a| !a.starts_with("unix:"))
                    .or(addrs.first())
                    .cloned()
                    .unwrap_or_default()
            }),
            lease_ms: shared.lease_ms,
            grace_ms_max: shared.grace_ms_max,
        });
        let info = ServerInfo {
            data_dir: name,
            started,
            ready_ms: started.elapsed().as_millis() as u64,
            watch_limits: config.watch_limits,
            lock_limits: config.lock_limits,
            data,
            auth: config.auth(),
            peers,
            backups: config
                .backups
                .map(|(every, keep)| crate::backup::BackupPolicy {
                    every,
                    keep,
                    staging: data_dir.to_path_buf(),
                }),
            // Alone on a store of its own: its lock sessions written down beside it.
            lock_ledger: (config.shared.is_none() && !meta.store().shared())
                .then(|| data_dir.join(crate::ledger::LEDGER_FILE)),
        };
        let metrics = match &config.metrics {
            Some(addr) => Some((
                calm_metrics::bind(addr).map_err(|e| ServerError::Listen {
                    addr: format!("{addr} (--metrics)"),
                    reason: e.to_string(),
                })?,
                calm_metrics::Registry::new(),
            )),
            None => None,
        };
        Ok(Assembled {
            meta: Arc::new(meta),
            info,
            listeners,
            addrs,
            metrics,
        })
    }

    /// The line to print once the server accepts requests ([`crate::ready_line`]).
    pub fn ready_line(&self) -> String {
        crate::ready_line(self.info.ready_ms, &self.addrs)
    }

    /// Starts every service and task, and returns them with the listeners to serve on (for a
    /// caller that also calls the services in its own process, as an embedded mount does).
    pub async fn start(self) -> (Server<S>, Vec<Listener>, Arc<Meta<S>>) {
        let mut server = Server::start(self.meta.clone(), self.info).await;
        if let Some((listener, registry)) = self.metrics {
            server = match server.with_metrics(&registry) {
                Ok(server) => server,
                Err(error) => panic!("the metrics' families are fixed and unique: {error}"),
            };
            match calm_metrics::serve(listener, registry) {
                Ok(endpoint) => {
                    tracing::info!("metrics at http://{}/metrics", endpoint.addr);
                    server.keep(endpoint);
                }
                Err(error) => tracing::warn!(%error, "serving the metrics"),
            }
        }
        (server, self.listeners, self.meta)
    }

    /// Where the metrics are served, if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The registry the metrics endpoint serves, if there is one: a mount in the same process
    /// shows its figures beside the server's.
    pub fn registry(&self) -> Option<calm_metrics::Registry> {
        self.metrics.as_ref().map(|(_, registry)| registry.clone())
    }

    /// Serves until `shutdown` completes, then returns the namespace (see [`close`]).
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<Arc<Meta<S>>, ServerError> {
        let (server, listeners, meta) = self.start().await;
        server.serve(listeners, shutdown).await?;
        Ok(meta)
    }
}

/// Drains the committer and hands the store back, once every task of the server is done with
/// the namespace.
pub fn close<S: Store>(meta: Arc<Meta<S>>) -> Result<Arc<S>, ServerError> {
    let meta = Arc::into_inner(meta).ok_or(ServerError::StillInUse)?;
    Ok(meta.shutdown())
}

/// The embedded store in `data`, for this process alone: the directory made private and
/// locked (the lock is held while the returned file is open), then the store `open` opens in
/// it.
pub fn open_embedded<S, E: std::fmt::Display>(
    data: &Path,
    open: impl FnOnce(&Path) -> Result<S, E>,
) -> Result<(std::fs::File, S), ServerError> {
    crate::private_files();
    let lock = crate::lock_data_dir(data).map_err(|reason| ServerError::DataDir {
        dir: data.to_path_buf(),
        reason,
    })?;
    let store = open(data).map_err(|e| ServerError::Store {
        dir: data.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((lock, store))
}

/// The store of `meta` once its server has stopped ([`close`]), for the store's own close.
pub fn take_store<S: Store>(meta: Arc<Meta<S>>) -> Result<S, ServerError> {
    Arc::into_inner(close(meta)?).ok_or(ServerError::StillInUse)
}
