//! `calm serve`: open the store, start the committer, listen, print the ready line, serve
//! until SIGINT or SIGTERM, then drain and close the store cleanly.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use calm_changelog::{BacklogPolicy, ChangelogConfig};
use calm_server::assembly::{SharedConfig, TlsFiles};
use calm_server::assembly::{open_embedded, take_store};
use calm_server::{Assembled, ServerConfig};
use calm_store::lmdb::LmdbStore;

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
    /// Locks one user may hold on this server, through every mount and session of theirs
    /// (a lock request past it answers ENOLCK); root's are held to the server's limit only.
    #[arg(long, default_value_t = calm_locks::Limits::default().locks_per_account_max,
          value_parser = clap::value_parser!(u64).range(1..=calm_locks::Limits::default().locks_max))]
    locks_per_user: u64,
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
    /// Nobody acts as the superuser through a certificate: mounts (mount:NAME) act as nobody
    /// (65534) for their uid 0, and a user:0 certificate acts as nobody.
    #[arg(long)]
    pub root_squash: bool,
    /// Commit with LMDB's own synchronous commit instead of the write-ahead log (the default:
    /// one sequential write and fdatasync per commit, LMDB's pages written back at
    /// checkpoints, the changelog's records in segment files beside the B-tree).
    #[arg(long)]
    pub no_wal: bool,
    /// Answer a change only once it is on the disk (one fdatasync per commit, shared by the
    /// changes committed together). By default a change is answered once written to the
    /// write-ahead log, and is on the disk within --sync-within-ms, or as soon as a client
    /// asks (a mount's fsync, fdatasync, O_SYNC or O_DSYNC write, fsync of a directory): a
    /// killed server loses nothing; a power cut loses at most the changes of those last
    /// milliseconds, and keeps every change answered before them. A mount given --sync also
    /// answers no change itself (as with --no-hold): each is on the server when it returns.
    #[arg(long)]
    pub sync: bool,
    /// The most a change answered stays only in memory before it is on the disk, in ms
    /// (without --sync; 1 to 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub sync_within_ms: u64,
    /// With --store: the lease of this server's membership among the namespace's servers, in
    /// milliseconds (etcd rounds it up to whole seconds): when the server dies, its files'
    /// locks move to the others this long after its last renewal.
    #[arg(long, default_value_t = calm_server::peers::SERVER_LEASE_MS_DEFAULT)]
    pub server_lease_ms: u64,
    /// With --store: the longest a server that took files over waits for their clients to
    /// reclaim their locks before it grants new ones, in milliseconds.
    #[arg(long, default_value_t = calm_server::peers::GRACE_MS_MAX_DEFAULT)]
    pub grace_ms_max: u64,
    /// With --store: the address the other servers' clients reach this server at (default:
    /// the first --listen address, else the Unix socket).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Write a dump of the metadata into the object store (under backups/, beside the file
    /// contents) this often, in hours (fractions allowed); 0: never. `calm load` makes a new
    /// store from one after the metadata was lost. At least a second, at most ten years.
    #[arg(long, default_value_t = 1.0, value_parser = crate::numbers::backup_hours)]
    pub backup_every_hours: f64,
    /// Backups kept in the object store; after each new one the oldest beyond this are removed.
    #[arg(long, default_value_t = 24)]
    pub backup_keep: usize,
    /// Keep what is removed (unlinked, replaced by a rename, rmdir'd) in a trash this many
    /// hours (fractions allowed) before it is destroyed; `calm trash` lists, restores and
    /// purges it. What is in the trash counts in its owner's quota until purged. 0: no trash,
    /// a removal is final. At most ten years.
    #[arg(long, default_value_t = 24.0, value_parser = crate::numbers::hours)]
    pub trash_hours: f64,
    /// A file or directory removed less than this many seconds after it was made skips the
    /// trash: a program's scratch file (a database's journal, an editor's temporary copy), not
    /// a person's work. 0: everything removed goes to the trash. At most a day.
    #[arg(long, default_value_t = 10.0, value_parser = crate::numbers::seconds)]
    pub trash_min_age_s: f64,
    /// Serve Prometheus's metrics at http://ADDR/metrics (HOST:PORT; port 0: one the kernel
    /// picks, said in the log): a server's requests by method with their latency and errors,
    /// commits, locks, the changelog, watchers, the deletion queue, the trash, backups; a
    /// mount's requests from the kernel by kind with their latency and errors, its object
    /// store requests, caches and buffered writes.
    #[arg(long)]
    pub metrics: Option<String>,
}

impl ServerArgs {
    /// The embedded store in `dir`, with the write-ahead log unless `--no-wal`.
    pub fn open_lmdb(&self, dir: &Path) -> Result<LmdbStore, calm_store::StoreError> {
        let sync = match self.sync {
            true => calm_store::CommitSync::EveryCommit,
            false => calm_store::CommitSync::Within(Duration::from_millis(self.sync_within_ms)),
        };
        crate::stores::open_serving(dir, !self.no_wal, sync)
    }

    /// The server's configuration from these flags; `shared` when several servers serve the
    /// store (etcd).
    pub fn config(&self, shared: bool) -> ServerConfig {
        let ns = |s: u64| (s.min(i64::MAX as u64 / 1_000_000_000) * 1_000_000_000) as i64;
        ServerConfig {
            changelog: ChangelogConfig {
                backlog_records_max: self.changelog_backlog_max,
                policy: match self.changelog_backlog_policy.as_str() {
                    "refuse" => BacklogPolicy::Refuse,
                    _ => BacklogPolicy::GcMostLagging,
                },
                idle_time_max_ns: ns(self.changelog_idle_max_s),
                idle_records_max: self.changelog_idle_records_max,
                gc_interval_min_ns: ns(self.changelog_gc_interval_s.max(1)),
                ..ChangelogConfig::default()
            },
            watch_limits: calm_watch::Limits {
                queue_max: self.watch_queue_max.max(1),
                watchers_max: self.watchers_max,
                ..calm_watch::Limits::default()
            },
            lock_limits: calm_locks::Limits {
                locks_per_account_max: self.locks_per_user,
                ..calm_locks::Limits::default()
            },
            objects: self.objects.clone(),
            delete_delay: Duration::from_secs(self.delete_delay_s),
            orphan_claim_grace: Duration::from_secs(self.orphan_claim_grace_s),
            listen: self.listen.clone(),
            tls: match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
                (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: ca.clone(),
                }),
                _ => None,
            },
            root_squash: self.root_squash,
            backups: (self.backup_every_hours > 0.0 && self.backup_every_hours.is_finite()).then(
                || {
                    (
                        Duration::from_secs_f64((self.backup_every_hours * 3600.0).max(1.0)),
                        self.backup_keep.max(1),
                    )
                },
            ),
            trash_kept: if self.trash_hours > 0.0 && self.trash_hours.is_finite() {
                Duration::from_secs_f64((self.trash_hours * 3600.0).max(0.001))
            } else {
                Duration::ZERO
            },
            trash_min_age: if self.trash_min_age_s > 0.0 && self.trash_min_age_s.is_finite() {
                Duration::from_secs_f64(self.trash_min_age_s)
            } else {
                Duration::ZERO
            },
            metrics: self.metrics.clone(),
            shared: shared.then(|| SharedConfig {
                lease_ms: self.server_lease_ms,
                grace_ms_max: self.grace_ms_max,
                advertise: self.advertise.clone(),
            }),
        }
    }
}

/// The embedded store in `data`, the directory locked against a second server (for as long as
/// the returned file lives).
pub fn run(data: &Path, args: &ServerArgs, started: Instant) -> anyhow::Result<ExitCode> {
    let config = args.config(false);
    config.check()?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let (_lock, store) = open_embedded(data, |dir| args.open_lmdb(dir))?;
    let name = data.display().to_string();
    let server = runtime.block_on(Assembled::open(store, &config, data, name, started))?;
    let stop = {
        let _inside = runtime.enter();
        shutdown_signal()
    };
    ready(&server.ready_line())?;
    let meta = runtime.block_on(server.serve(stop))?;
    drop(runtime);
    take_store(meta)?.close();
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// `calm serve --store etcd://…`: the namespace on an etcd cluster, which other servers may
/// serve at the same time. Nothing is kept locally: `socket_dir` holds only the Unix socket.
pub fn run_etcd(
    url: &str,
    socket_dir: &Path,
    args: &ServerArgs,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let config = args.config(true);
    config.check()?;
    let store = crate::stores::connect_etcd(url)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    calm_server::private_files();
    for fixed in calm_server::secure_data_dir(socket_dir).map_err(|e| anyhow!(e))? {
        tracing::warn!("data directory open to others: {fixed}");
    }
    let server = runtime.block_on(Assembled::open(
        store,
        &config,
        socket_dir,
        url.to_string(),
        started,
    ))?;
    let stop = {
        let _inside = runtime.enter();
        shutdown_signal()
    };
    ready(&server.ready_line())?;
    let meta = runtime.block_on(server.serve(stop))?;
    drop(runtime);
    drop(meta);
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Prints the ready line at once (scripts wait for it).
fn ready(line: &str) -> anyhow::Result<()> {
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}

/// Completes at SIGTERM or SIGINT. The handlers are installed by this call (inside a runtime),
/// not when the future is first polled: a signal sent as soon as the ready line is read then
/// stops the process cleanly instead of killing it.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}
