//! `calm serve`: open the store, start the committer, listen, print the ready line, serve
//! until SIGINT or SIGTERM, then drain and close the store cleanly.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use calm_changelog::{BacklogPolicy, ChangelogConfig};
use calm_meta::{Meta, MetaOptions};
use calm_server::{ServerInfo, lock_data_dir};
use calm_store::lmdb::{LmdbOptions, LmdbStore};

/// The server's flags shared by `calm serve` and `calm mount --embedded`: the commit path,
/// changelog limits and GC, watch limits.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Most changelog records some reader has not cleared yet.
    #[arg(long, default_value_t = 1 << 32)]
    changelog_backlog_max: u64,
    /// At the backlog limit: `gc` deregisters the most lagging reader (logged, with a MARK
    /// record), `refuse` refuses mutations with ENOSPC before applying anything.
    #[arg(long, default_value = "gc", value_parser = ["gc", "refuse"])]
    changelog_backlog_policy: String,
    /// Deregister a reader that has not cleared for this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    changelog_idle_max_s: u64,
    /// Deregister a reader this many records behind (0: never).
    #[arg(long, default_value_t = 0)]
    changelog_idle_records_max: u64,
    /// Changes one watcher may have queued (coalesced per object) before it is told to resync.
    #[arg(long, default_value_t = calm_watch::Limits::default().queue_max)]
    watch_queue_max: usize,
    /// Most watchers at once.
    #[arg(long, default_value_t = calm_watch::Limits::default().watchers_max)]
    watchers_max: usize,
    /// Run the idle-reader GC at most this often, in seconds.
    #[arg(long, default_value_t = 3600)]
    changelog_gc_interval_s: u64,
    /// The object store of file contents, for a namespace being created: file:///DIR or
    /// s3://BUCKET[/PREFIX][?endpoint=URL&region=R] (credentials from the AWS environment
    /// variables). Default: DATA/objects. A namespace keeps the store it was created with.
    #[arg(long)]
    pub objects: Option<String>,
    /// Seconds an object no file names any more waits before the deleter removes it (a mount
    /// that opened the file before it changed may still read it meanwhile).
    #[arg(long, default_value_t = 60)]
    pub delete_delay_s: u64,
    /// Seconds after a start that mounts have to claim the files they keep open without a
    /// name; past it the server destroys the unclaimed ones.
    #[arg(long, default_value_t = calm_server::orphans::CLAIM_GRACE_DEFAULT.as_secs())]
    pub orphan_claim_grace_s: u64,
    /// Also listen on ADDR (may be given more than once): HOST:PORT, with TLS when
    /// --tls-cert is given (required beyond loopback; plain TCP on loopback serves only the
    /// superuser's connections), or unix:PATH. The Unix socket next to the store
    /// (DATA/calm.sock) is always served: it tells the server who each local client is.
    #[arg(long)]
    pub listen: Vec<String>,
    /// The server's certificate chain for TCP listeners (PEM; `calm certs` makes one).
    #[arg(long, requires_all = ["tls_key", "tls_client_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long)]
    pub tls_key: Option<std::path::PathBuf>,
    /// The CA whose certificates clients must present (PEM).
    #[arg(long)]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// Clients with a mount certificate (mount:NAME) act as nobody (65534) for their uid 0.
    #[arg(long)]
    pub root_squash: bool,
    /// Commit with LMDB's own synchronous commit instead of the write-ahead log (the default:
    /// one sequential write and fdatasync per commit, LMDB's pages written back at
    /// checkpoints, the changelog's records in segment files beside the B-tree).
    #[arg(long)]
    pub no_wal: bool,
    /// With --store: the lease of this server's membership among the namespace's servers, in
    /// milliseconds (etcd rounds it up to whole seconds): when the server dies, its files'
    /// locks move to the others this long after its last renewal.
    #[arg(long, default_value_t = calm_server::cluster::SERVER_LEASE_MS_DEFAULT)]
    pub server_lease_ms: u64,
    /// With --store: the longest a server that took files over waits for their clients to
    /// reclaim their locks before it grants new ones, in milliseconds.
    #[arg(long, default_value_t = calm_server::cluster::GRACE_MS_MAX_DEFAULT)]
    pub grace_ms_max: u64,
    /// With --store: the address the other servers' clients reach this server at (default:
    /// the first --listen address, else the Unix socket).
    #[arg(long)]
    pub advertise: Option<String>,
}

impl ServerArgs {
    pub fn watch_limits(&self) -> calm_watch::Limits {
        calm_watch::Limits {
            queue_max: self.watch_queue_max.max(1),
            watchers_max: self.watchers_max,
            ..calm_watch::Limits::default()
        }
    }

    /// The namespace options for the object store: the one given, or `default_dir` when the
    /// namespace is created without one.
    fn objects_options(&self, default_dir: &Path) -> anyhow::Result<(Option<String>, String)> {
        if let Some(url) = &self.objects {
            calm_data::ObjectsUrl::parse(url).map_err(|e| anyhow!(e))?;
        }
        let dir = std::path::absolute(default_dir)
            .with_context(|| format!("resolving {}", default_dir.display()))?;
        Ok((
            self.objects.clone(),
            calm_data::ObjectsUrl::file(&dir.join("objects")),
        ))
    }

    /// The data tasks of a server on `meta`: its object store opened from the URL the
    /// namespace keeps.
    pub fn data_options<S: calm_store::Store>(
        &self,
        meta: &Meta<S>,
    ) -> anyhow::Result<Option<calm_server::data::DataOptions>> {
        let Some(url) = meta
            .objects_url()
            .context("reading the namespace's object store")?
        else {
            return Ok(None);
        };
        let objects = calm_data::Objects::open(&url)
            .with_context(|| format!("opening the object store {url}"))?;
        Ok(Some(calm_server::data::DataOptions {
            objects,
            delete_delay: std::time::Duration::from_secs(self.delete_delay_s),
            orphan_claim_grace: std::time::Duration::from_secs(self.orphan_claim_grace_s),
        }))
    }

    fn config(&self) -> ChangelogConfig {
        let ns = |s: u64| (s.min(i64::MAX as u64 / 1_000_000_000) * 1_000_000_000) as i64;
        ChangelogConfig {
            backlog_records_max: self.changelog_backlog_max,
            policy: match self.changelog_backlog_policy.as_str() {
                "refuse" => BacklogPolicy::Refuse,
                _ => BacklogPolicy::GcMostLagging,
            },
            idle_time_max_ns: ns(self.changelog_idle_max_s),
            idle_records_max: self.changelog_idle_records_max,
            gc_interval_min_ns: ns(self.changelog_gc_interval_s.max(1)),
            ..ChangelogConfig::default()
        }
    }
}

/// An open store and namespace, the data directory locked against a second server.
pub struct Embedded {
    _lock: std::fs::File,
    pub meta: Arc<Meta<LmdbStore>>,
    data: std::path::PathBuf,
    watch_limits: calm_watch::Limits,
    data_options: Option<calm_server::data::DataOptions>,
    auth: calm_server::auth::Auth,
}

impl Embedded {
    pub fn open(data: &Path, changelog: &ServerArgs) -> anyhow::Result<Embedded> {
        calm_server::private_files();
        let lock = lock_data_dir(data).map_err(|e| anyhow!(e))?;
        let options = LmdbOptions {
            wal: !changelog.no_wal,
            ..LmdbOptions::default()
        };
        let (objects_url, objects_url_default) = changelog.objects_options(data)?;
        let store = LmdbStore::open(data, &options)
            .with_context(|| format!("opening the store in {}", data.display()))?;
        let meta = Meta::open(
            store,
            MetaOptions {
                changelog: changelog.config(),
                objects_url,
                objects_url_default: Some(objects_url_default),
                ..MetaOptions::default()
            },
        )
        .with_context(|| format!("opening the namespace in {}", data.display()))?;
        let data_options = changelog.data_options(&meta)?;
        Ok(Embedded {
            _lock: lock,
            meta: Arc::new(meta),
            data: data.to_path_buf(),
            watch_limits: changelog.watch_limits(),
            data_options,
            auth: changelog.auth(),
        })
    }

    pub fn info(&self, started: Instant) -> ServerInfo {
        ServerInfo {
            data_dir: self.data.display().to_string(),
            started,
            ready_ms: started.elapsed().as_millis() as u64,
            watch_limits: self.watch_limits,
            data: self.data_options.clone(),
            auth: self.auth.clone(),
            cluster: None,
        }
    }

    /// Drains queued work and closes the store cleanly (every server task must be done).
    pub fn close(self) -> anyhow::Result<()> {
        let meta = Arc::into_inner(self.meta).ok_or_else(|| anyhow!("namespace still in use"))?;
        let store =
            Arc::into_inner(meta.shutdown()).ok_or_else(|| anyhow!("store still in use"))?;
        store.close();
        Ok(())
    }
}

impl ServerArgs {
    /// The Unix socket `socket` and every --listen address, bound; and their addresses as
    /// clients name them.
    pub async fn listeners(
        &self,
        socket: &Path,
    ) -> anyhow::Result<(Vec<calm_server::listen::Listener>, Vec<String>)> {
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(Arc::new(
                calm_server::tls::TlsServer::new(cert, key, ca).map_err(|e| anyhow!(e))?,
            )),
            _ => None,
        };
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        let socket = format!("unix:{}", socket.display());
        for addr in std::iter::once(&socket).chain(&self.listen) {
            let tls = if addr.starts_with("unix:") {
                None
            } else {
                tls.clone()
            };
            let (listener, name) = calm_server::listen::bind(addr, tls)
                .await
                .map_err(|e| anyhow!(e))?;
            listeners.push(listener);
            addrs.push(name);
        }
        Ok((listeners, addrs))
    }

    pub fn auth(&self) -> calm_server::auth::Auth {
        calm_server::auth::Auth {
            root_squash: self.root_squash,
            ..Default::default()
        }
    }
}

/// Where the Unix socket of a store in `data` is.
pub fn socket_of(data: &Path) -> std::path::PathBuf {
    data.join(calm_server::SOCKET_FILE)
}

pub fn run(data: &Path, changelog: &ServerArgs, started: Instant) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let embedded = Embedded::open(data, changelog)?;
    let (listeners, addrs) = runtime.block_on(changelog.listeners(&socket_of(data)))?;
    let info = embedded.info(started);
    println!("{}", calm_server::ready_line(info.ready_ms, &addrs));
    std::io::stdout().flush()?;

    runtime.block_on(calm_server::serve(
        embedded.meta.clone(),
        info,
        listeners,
        shutdown_signal(),
    ))?;
    drop(runtime);
    embedded.close()?;
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// `calm serve --store etcd://…`: the namespace on an etcd cluster, which other servers may
/// serve at the same time. Nothing is kept locally, so there is no data directory to lock.
pub fn run_etcd(
    url: &str,
    socket_dir: &Path,
    changelog: &ServerArgs,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let options = calm_store_etcd::EtcdOptions::from_url(url).map_err(|e| anyhow!(e))?;
    let store = calm_store_etcd::EtcdStore::connect(options)
        .with_context(|| format!("connecting to {url}"))?;
    // The default object store is in --data, as `--objects`'s help says (a namespace keeps
    // the store it was created with: the first server's).
    let (objects_url, objects_url_default) = changelog.objects_options(socket_dir)?;
    let meta = Meta::open(
        store,
        MetaOptions {
            changelog: changelog.config(),
            batch_ops_max: calm_meta::SHARED_BATCH_OPS_MAX,
            objects_url,
            objects_url_default: Some(objects_url_default),
            ..MetaOptions::default()
        },
    )
    .with_context(|| format!("opening the namespace on {url}"))?;
    let data = changelog.data_options(&meta)?;
    let meta = Arc::new(meta);
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    // Nothing of the namespace is kept in --data: only the Unix socket is there.
    calm_server::private_files();
    for fixed in calm_server::secure_data_dir(socket_dir).map_err(|e| anyhow!(e))? {
        tracing::warn!("data directory open to others: {fixed}");
    }
    let (listeners, addrs) = runtime.block_on(changelog.listeners(&socket_of(socket_dir)))?;
    let info = ServerInfo {
        data_dir: url.to_string(),
        started,
        ready_ms: started.elapsed().as_millis() as u64,
        watch_limits: changelog.watch_limits(),
        data,
        auth: changelog.auth(),
        cluster: Some(calm_server::cluster::ClusterOptions {
            address: changelog.advertise.clone().unwrap_or_else(|| {
                addrs
                    .iter()
                    .find(|a| !a.starts_with("unix:"))
                    .or(addrs.first())
                    .cloned()
                    .unwrap_or_default()
            }),
            lease_ms: changelog.server_lease_ms,
            grace_ms_max: changelog.grace_ms_max,
        }),
    };
    println!("{}", calm_server::ready_line(info.ready_ms, &addrs));
    std::io::stdout().flush()?;
    runtime.block_on(calm_server::serve(
        meta.clone(),
        info,
        listeners,
        shutdown_signal(),
    ))?;
    drop(runtime);
    drop(meta);
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
