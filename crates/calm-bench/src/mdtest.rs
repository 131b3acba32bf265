//! mdtest-style metadata rates: C clients create N/C files each, then stat them, then unlink
//! them; as in mdtest, all clients work in one shared directory, or (`unique_dir`, mdtest's
//! `-u`) each in a directory of its own. Three modes in one run:
//! - `inprocess`: C tasks calling [`calm_meta::Meta`] directly (durable group commit on LMDB);
//! - `grpc`: C clients, each with its own connection, against a server in this process;
//! - `kernel-tmpfs`: the baseline, C threads doing the same on the kernel's tmpfs
//!   (`/dev/shm`), which keeps nothing across a crash.
//!
//! With `--store etcd://…` the two calm modes run on etcd as well, beside the same modes on
//! LMDB in the same run (each row names its store).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use calm_meta::ops::{Done, Op};
use calm_meta::{Caller, Handle, Meta, MetaError, MetaOptions, NewNode, ROOT};
use calm_store::Store;
use calm_store::lmdb::{LmdbOptions, LmdbStore};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct MdtestOptions {
    /// Client counts to run, one round each.
    pub clients: Vec<usize>,
    /// Files per round (split evenly across clients).
    pub files: u64,
    /// Where calm's stores are made.
    pub dir: PathBuf,
    /// Where the kernel baseline runs (a tmpfs).
    pub tmpfs_dir: PathBuf,
    /// One directory per client (mdtest -u) instead of one shared directory.
    pub unique_dir: bool,
    /// An `etcd://` URL: run calm's modes on it too (under a fresh key prefix).
    pub etcd: Option<String>,
    /// Run calm's LMDB modes a second time with LMDB's own synchronous commit (store
    /// "lmdb-sync"; "lmdb" commits through the write-ahead log).
    pub lmdb_sync: bool,
    /// Measure what the permission checks cost: calm's LMDB modes act as an unprivileged
    /// caller (uid 1000, 16 supplementary groups, in directories it owns), `check_pairs` times
    /// with the checks and without, alternately (rows with `checks` "on" and "off").
    pub check_cost: bool,
    /// Rounds with and without the checks (each a pair, in turn).
    pub check_pairs: usize,
    /// The A/A run of `check_cost` or `metrics_cost`: what is measured stays on in both arms
    /// (the second arm's rows say "aa"), so the cost it reports is the method's noise.
    pub check_calibrate: bool,
    /// Measure what the server's metrics cost: calm's LMDB modes `check_pairs` times with a
    /// server counting its requests (`calm serve --metrics`) and without, alternately (rows
    /// "on" and "off"); the in-process mode, which no metrics count, is the control.
    pub metrics_cost: bool,
    /// The gRPC server of this arm counts its requests.
    pub server_metrics: bool,
}

/// The unprivileged caller of `--check-cost`.
pub(crate) fn unprivileged() -> Caller {
    Caller {
        session: 0,
        uid: 1000,
        gid: 1000,
        groups: calm_meta::Groups::new((2000..2016).collect()),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MdtestResult {
    pub mode: &'static str,
    /// "lmdb", "etcd", or "tmpfs" for the kernel baseline.
    pub store: &'static str,
    pub op: &'static str,
    /// "shared" (one directory for all clients) or "unique" (one per client).
    pub dirs: &'static str,
    pub clients: usize,
    pub files: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// Processor time of this whole process (clients, server, the kernel's work for them)
    /// per operation, in µs: less noisy than the rate on a shared machine, where another
    /// tenant's load slows the rate but is not this process's processor time.
    pub cpu_us_per_op: f64,
    /// With `--check-cost`: "on" or "off" (the permission checks); otherwise "on" (the
    /// caller is the superuser, whose checks pass at once).
    pub checks: &'static str,
}

const OPS: [&str; 3] = ["create", "stat", "unlink"];

/// File `i` of client `c`: distinct across clients, so a shared directory works too.
fn name(c: usize, i: u64) -> Vec<u8> {
    format!("file.{c}.{i}").into_bytes()
}

fn dirs_label(options: &MdtestOptions) -> &'static str {
    if options.unique_dir {
        "unique"
    } else {
        "shared"
    }
}

fn dir_count(options: &MdtestOptions, clients: usize) -> usize {
    if options.unique_dir { clients } else { 1 }
}

/// How long a phase took, and the processor time this process spent meanwhile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Took {
    pub seconds: f64,
    pub cpu: std::time::Duration,
}

impl Took {
    /// Times `work`, wall-clock and processor.
    pub(crate) fn of<T>(work: impl FnOnce() -> T) -> (T, std::time::Duration) {
        let cpu = crate::procs::own_cpu();
        let done = work();
        (done, crate::procs::own_cpu().saturating_sub(cpu))
    }
}

/// [`phase`], with the processor time this process spent during it.
pub(crate) async fn timed_phase<F, Fut>(
    clients: usize,
    per_client: u64,
    op: F,
) -> Result<Took, String>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), MetaError>> + Send,
{
    let cpu = crate::procs::own_cpu();
    let seconds = phase(clients, per_client, op).await?;
    Ok(Took {
        seconds,
        cpu: crate::procs::own_cpu().saturating_sub(cpu),
    })
}

/// Runs `op(client, i)` for i in 0..per_client on `clients` concurrent tasks; returns seconds.
pub(crate) async fn phase<F, Fut>(clients: usize, per_client: u64, op: F) -> Result<f64, String>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), MetaError>> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let op = op.clone();
            tokio::spawn(async move {
                for i in 0..per_client {
                    op(c, i).await?;
                }
                Ok::<_, MetaError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(started.elapsed().as_secs_f64())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn row(
    mode: &'static str,
    store: &'static str,
    op: &'static str,
    dirs: &'static str,
    clients: usize,
    files: u64,
    took: Took,
) -> MdtestResult {
    let Took { seconds, cpu } = took;
    MdtestResult {
        mode,
        store,
        op,
        dirs,
        clients,
        files,
        seconds,
        ops_per_sec: files as f64 / seconds.max(1e-9),
        cpu_us_per_op: cpu.as_secs_f64() * 1e6 / files.max(1) as f64,
        checks: "on",
    }
}

/// A gRPC server on 127.0.0.1 (a free port) in this process, for the gRPC runs.
pub(crate) struct InProcessServer {
    pub addr: String,
    /// The namespace and lock services, for clients in this process.
    pub local: calm_client::InProcess,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl InProcessServer {
    pub async fn start<S: Store>(meta: Arc<Meta<S>>) -> Result<InProcessServer, String> {
        InProcessServer::start_with_data(meta, None).await
    }

    /// A server that counts its requests for Prometheus when `metrics` (`calm serve
    /// --metrics`; nothing scrapes them: what is measured is the counting).
    pub async fn start_counting<S: Store>(
        meta: Arc<Meta<S>>,
        metrics: bool,
    ) -> Result<InProcessServer, String> {
        InProcessServer::start_full(meta, None, metrics).await
    }

    /// A server that also runs the data tasks (deleter, compactor) as `calm serve` does.
    pub async fn start_with_data<S: Store>(
        meta: Arc<Meta<S>>,
        data: Option<calm_upkeep::data::DataOptions>,
    ) -> Result<InProcessServer, String> {
        InProcessServer::start_full(meta, data, false).await
    }

    async fn start_full<S: Store>(
        meta: Arc<Meta<S>>,
        data: Option<calm_upkeep::data::DataOptions>,
        metrics: bool,
    ) -> Result<InProcessServer, String> {
        // Loopback TCP: the benchmark runs as root, whose connections a plain TCP listener
        // takes.
        let (listener, addr) = calm_server::listen::bind("127.0.0.1:0", None).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let info = calm_server::ServerInfo {
            data,
            ..calm_server::ServerInfo::plain()
        };
        let mut server = calm_server::Server::start(meta, info).await;
        if metrics {
            server = server.with_metrics(&calm_metrics::Registry::new())?;
        }
        let local = calm_client::InProcess {
            meta: server.counted_meta_service(),
            locks: server.counted_lock_service(),
            watch: server.watch_service(),
        };
        let task = tokio::spawn(server.serve(vec![listener], async {
            let _ = stopped.await;
        }));
        Ok(InProcessServer {
            addr,
            local,
            stop,
            task,
        })
    }

    /// Stops accepting, lets requests in flight finish, and waits for the server.
    pub async fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

pub(crate) fn open_meta(
    dir: &std::path::Path,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_with(dir, false)
}

/// [`open_meta`], with the write-ahead log when `wal`.
pub(crate) fn open_meta_with(
    dir: &std::path::Path,
    wal: bool,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_store(dir, wal, None)
}

/// [`open_meta`] with the write-ahead log (as `calm serve`), its file contents in `objects`
/// (default: the work directory).
pub(crate) fn open_meta_objects(
    dir: &std::path::Path,
    objects: Option<&str>,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_store(dir, true, objects)
}

/// [`open_meta`] with the write-ahead log, keeping what is removed in a trash for `trash_kept`
/// (zero: no trash).
pub(crate) fn open_meta_trash(
    dir: &std::path::Path,
    trash_kept: std::time::Duration,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_options(dir, true, None, trash_kept)
}

fn open_meta_store(
    dir: &std::path::Path,
    wal: bool,
    objects: Option<&str>,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_options(dir, wal, objects, std::time::Duration::ZERO)
}

/// [`open_meta_with`], the store's commits on the disk as `sync` says.
pub(crate) fn open_meta_synced(
    dir: &std::path::Path,
    wal: bool,
    sync: calm_store::CommitSync,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    open_meta_full(dir, wal, None, std::time::Duration::ZERO, sync)
}

fn open_meta_options(
    dir: &std::path::Path,
    wal: bool,
    objects: Option<&str>,
    trash_kept: std::time::Duration,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    let every = calm_store::CommitSync::EveryCommit;
    open_meta_full(dir, wal, objects, trash_kept, every)
}

fn open_meta_full(
    dir: &std::path::Path,
    wal: bool,
    objects: Option<&str>,
    trash_kept: std::time::Duration,
    sync: calm_store::CommitSync,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    let work = tempfile::Builder::new()
        .prefix("calm-bench-mdtest-")
        .tempdir_in(dir)
        .map_err(|e| format!("making a directory in {}: {e}", dir.display()))?;
    let options = LmdbOptions {
        wal,
        sync,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(work.path(), &options).map_err(|e| e.to_string())?;
    // File contents (for the benchmarks through a mount) in the work directory.
    let objects = objects
        .map(str::to_string)
        .unwrap_or_else(|| format!("file://{}/objects", work.path().display()));
    let meta = Meta::open(
        store,
        MetaOptions {
            objects_url_default: Some(objects),
            trash_kept,
            // Every removal goes to the trash, as before young files skipped it: what the
            // benchmarks measure is what keeping them costs.
            trash_min_age: std::time::Duration::ZERO,
            ..MetaOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok((work, Arc::new(meta)))
}

/// `caller` makes a directory (`dir`) or a file with permission bits `mode` named `name` in
/// `parent`.
async fn make_as<S: Store>(
    meta: &Meta<S>,
    caller: &Caller,
    parent: Handle,
    name: Vec<u8>,
    (dir, mode): (bool, u32),
) -> Result<Handle, MetaError> {
    let node = match dir {
        true => NewNode::dir(mode, caller.uid, caller.gid),
        false => NewNode::file(mode, caller.uid, caller.gid),
    };
    let op = Op::Make {
        parent,
        name,
        node,
        exclusive: true,
    };
    match meta.apply_as(caller.clone(), op).await? {
        Done::Attr(attr) => Ok(attr.handle),
        other => Err(MetaError::Io(format!("a make answered {other:?}"))),
    }
}

/// The superuser's directory `top` (0777), where every caller may make its directories.
pub(crate) async fn shared_top<S: Store>(meta: &Meta<S>) -> Result<Handle, String> {
    make_as(
        meta,
        &Caller::default(),
        ROOT,
        b"top".to_vec(),
        (true, 0o777),
    )
    .await
    .map_err(|e| e.to_string())
}

async fn inprocess<S: Store>(
    options: &MdtestOptions,
    clients: usize,
    per_client: u64,
    (store, meta): (&'static str, Arc<Meta<S>>),
    caller: &Caller,
) -> Result<Vec<MdtestResult>, String> {
    let mut dirs: Vec<Handle> = Vec::new();
    // The caller's directories, in one of the superuser's where everyone may make them.
    let top = shared_top(&meta).await?;
    for c in 0..dir_count(options, clients) {
        let name = format!("dir.{c}").into_bytes();
        dirs.push(
            make_as(&meta, caller, top, name, (true, 0o755))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let dirs = Arc::new(dirs);
    let files = per_client * clients as u64;
    let (m, d, who) = (meta.clone(), dirs.clone(), caller.clone());
    let create = timed_phase(clients, per_client, move |c, i| {
        let (m, d, who) = (m.clone(), d.clone(), who.clone());
        async move {
            make_as(&m, &who, d[c % d.len()], name(c, i), (false, 0o644))
                .await
                .map(|_| ())
        }
    })
    .await?;
    let (m, d, who) = (meta.clone(), dirs.clone(), caller.clone());
    let stat = timed_phase(clients, per_client, move |c, i| {
        let (m, d, who) = (m.clone(), d.clone(), who.clone());
        async move { m.lookup_as(&who, d[c % d.len()], &name(c, i)).map(|_| ()) }
    })
    .await?;
    let (m, d, who) = (meta.clone(), dirs.clone(), caller.clone());
    let unlink = timed_phase(clients, per_client, move |c, i| {
        let (m, d, who) = (m.clone(), d.clone(), who.clone());
        async move {
            let op = Op::Unlink {
                parent: d[c % d.len()],
                name: name(c, i),
                keep: Vec::new(),
            };
            m.apply_as(who, op).await.map(|_| ())
        }
    })
    .await?;
    Ok([create, stat, unlink]
        .iter()
        .zip(OPS)
        .map(|(s, op)| {
            row(
                "inprocess",
                store,
                op,
                dirs_label(options),
                clients,
                files,
                *s,
            )
        })
        .collect())
}

async fn grpc<S: Store>(
    options: &MdtestOptions,
    clients: usize,
    per_client: u64,
    (store, meta): (&'static str, Arc<Meta<S>>),
    caller: &Caller,
) -> Result<Vec<MdtestResult>, String> {
    let server = InProcessServer::start_counting(meta.clone(), options.server_metrics).await?;
    let addr = server.addr.clone();
    let mut conns = Vec::new();
    let mut dirs = Vec::new();
    let top = shared_top(&meta).await?;
    for c in 0..clients {
        // The benchmark is the superuser of this machine on loopback: it may act for the
        // caller it names.
        let client = calm_client::Client::connect(&addr)
            .await
            .map_err(|e| e.to_string())?
            .with_caller(caller.clone());
        if c < dir_count(options, clients) {
            dirs.push(
                client
                    .mkdir(top, format!("dir.{c}").as_bytes(), 0o755)
                    .await
                    .map_err(|e| e.to_string())?
                    .handle,
            );
        }
        conns.push(client);
    }
    let (conns, dirs) = (Arc::new(conns), Arc::new(dirs));
    let files = per_client * clients as u64;
    let (k, d) = (conns.clone(), dirs.clone());
    let create = timed_phase(clients, per_client, move |c, i| {
        let (k, d) = (k.clone(), d.clone());
        async move {
            k[c].create(d[c % d.len()], &name(c, i), 0o644)
                .await
                .map(|_| ())
        }
    })
    .await?;
    let (k, d) = (conns.clone(), dirs.clone());
    let stat = timed_phase(clients, per_client, move |c, i| {
        let (k, d) = (k.clone(), d.clone());
        async move { k[c].lookup(d[c % d.len()], &name(c, i)).await.map(|_| ()) }
    })
    .await?;
    let (k, d) = (conns.clone(), dirs.clone());
    let unlink = timed_phase(clients, per_client, move |c, i| {
        let (k, d) = (k.clone(), d.clone());
        async move { k[c].unlink(d[c % d.len()], &name(c, i)).await }
    })
    .await?;
    drop(conns);
    server.stop().await?;
    Ok([create, stat, unlink]
        .iter()
        .zip(OPS)
        .map(|(s, op)| row("grpc", store, op, dirs_label(options), clients, files, *s))
        .collect())
}

/// The baseline on the kernel's tmpfs, with threads.
fn kernel(
    options: &MdtestOptions,
    clients: usize,
    per_client: u64,
) -> Result<Vec<MdtestResult>, String> {
    let work = tempfile::Builder::new()
        .prefix("calm-bench-mdtest-")
        .tempdir_in(&options.tmpfs_dir)
        .map_err(|e| format!("making a directory in {}: {e}", options.tmpfs_dir.display()))?;
    let dirs: Vec<PathBuf> = (0..dir_count(options, clients))
        .map(|c| work.path().join(format!("dir.{c}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(|e| e.to_string())?;
    }
    let run = |op: fn(&std::path::Path) -> std::io::Result<()>| -> Result<Took, String> {
        let started = Instant::now();
        let (ran, cpu) = Took::of(|| {
            std::thread::scope(|scope| {
                let threads: Vec<_> = (0..clients)
                    .map(|c| {
                        let d = &dirs[c % dirs.len()];
                        scope.spawn(move || {
                            for i in 0..per_client {
                                op(&d.join(format!("file.{c}.{i}")))?;
                            }
                            Ok::<_, std::io::Error>(())
                        })
                    })
                    .collect();
                for t in threads {
                    t.join().expect("thread").map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
        });
        ran?;
        Ok(Took {
            seconds: started.elapsed().as_secs_f64(),
            cpu,
        })
    };
    let create = run(|p| std::fs::File::create_new(p).map(|_| ()))?;
    let stat = run(|p| std::fs::symlink_metadata(p).map(|_| ()))?;
    let unlink = run(|p| std::fs::remove_file(p))?;
    let files = per_client * clients as u64;
    Ok([create, stat, unlink]
        .iter()
        .zip(OPS)
        .map(|(s, op)| {
            row(
                "kernel-tmpfs",
                "tmpfs",
                op,
                dirs_label(options),
                clients,
                files,
                *s,
            )
        })
        .collect())
}

/// The in-process round and then the gRPC round, each on a namespace `open` makes anew (with
/// what keeps it, such as its temporary directory, dropped after the round).
async fn both_modes<S: Store, K>(
    options: &MdtestOptions,
    clients: usize,
    per_client: u64,
    store: &'static str,
    open: impl Fn() -> Result<(K, Arc<Meta<S>>), String>,
    caller: &Caller,
) -> Result<Vec<MdtestResult>, String> {
    let (keep, meta) = open()?;
    let mut rows = inprocess(options, clients, per_client, (store, meta), caller).await?;
    drop(keep);
    let (keep, meta) = open()?;
    rows.extend(grpc(options, clients, per_client, (store, meta), caller).await?);
    drop(keep);
    Ok(rows)
}

/// A namespace on the etcd cluster of `url`, under a key prefix of its own (the URL's prefix
/// and a timestamp), grouped as `calm serve --store` groups.
fn open_etcd(url: &str) -> Result<Arc<Meta<calm_store_etcd::EtcdStore>>, String> {
    let mut options = calm_store_etcd::EtcdOptions::from_url(url)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    options.prefix = format!("{}/bench-mdtest-{now}", options.prefix);
    let store = calm_store_etcd::EtcdStore::connect(options).map_err(|e| e.to_string())?;
    let meta = Meta::open(
        store,
        MetaOptions {
            batch_ops_max: calm_meta::SHARED_BATCH_OPS_MAX,
            ..MetaOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(meta))
}

/// Turns the permission checks of this process on or off, for the arm without them of
/// `--check-cost`: only a build with the `check-cost` feature can (the `calm` binary cannot).
#[cfg(feature = "check-cost")]
fn set_checks(on: bool) -> Result<(), String> {
    calm_meta::perm::set_checks_for_benchmark(on);
    Ok(())
}

/// Without the `check-cost` feature the checks stay on: the arm without them cannot run.
#[cfg(not(feature = "check-cost"))]
fn set_checks(on: bool) -> Result<(), String> {
    match on {
        true => Ok(()),
        false => Err(
            "--check-cost needs a calm-bench built to turn permission checks off: \
                      cargo build --release -p calm-bench --features check-cost"
                .into(),
        ),
    }
}

/// Runs every mode for every client count.
pub fn run(options: &MdtestOptions) -> Result<Vec<MdtestResult>, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    for &clients in &options.clients {
        if clients == 0 {
            return Err("--clients values must be positive".into());
        }
        let per_client = options.files / clients as u64;
        if per_client == 0 {
            return Err(format!(
                "--files {} is fewer than one per client",
                options.files
            ));
        }
        let lmdb_stores = [("lmdb", true), ("lmdb-sync", false)];
        let root = Caller::default();
        if options.metrics_cost {
            // With the server's metrics and without, alternately.
            let arms = (0..options.check_pairs.max(1)).flat_map(|_| [true, false]);
            for on in arms {
                let (metrics, label) = match (on, options.check_calibrate) {
                    (true, _) => (true, "on"),
                    (false, false) => (false, "off"),
                    (false, true) => (true, "aa"),
                };
                let arm = MdtestOptions {
                    server_metrics: metrics,
                    ..options.clone()
                };
                let open = || open_meta_with(&options.dir, true);
                let rows =
                    runtime.block_on(both_modes(&arm, clients, per_client, "lmdb", open, &root));
                for mut row in rows? {
                    row.checks = label;
                    results.push(row);
                }
            }
        } else if options.check_cost {
            // With and without the checks, alternately (the machine's drift falls on both).
            let user = unprivileged();
            let arms = (0..options.check_pairs.max(1)).flat_map(|_| [true, false]);
            for checks in arms {
                let (checks, label) = match (checks, options.check_calibrate) {
                    (true, _) => (true, "on"),
                    (false, false) => (false, "off"),
                    (false, true) => (true, "aa"),
                };
                set_checks(checks)?;
                let open = || open_meta_with(&options.dir, true);
                let rows = runtime.block_on(both_modes(
                    options, clients, per_client, "lmdb", open, &user,
                ));
                set_checks(true)?;
                for mut row in rows? {
                    row.checks = label;
                    results.push(row);
                }
            }
        } else {
            for (store, wal) in lmdb_stores
                .into_iter()
                .filter(|(_, wal)| *wal || options.lmdb_sync)
            {
                let open = || open_meta_with(&options.dir, wal);
                results.extend(
                    runtime
                        .block_on(both_modes(options, clients, per_client, store, open, &root))?,
                );
            }
        }
        if let Some(url) = &options.etcd {
            let open = || Ok(((), open_etcd(url)?));
            results.extend(runtime.block_on(both_modes(
                options, clients, per_client, "etcd", open, &root,
            ))?);
        }
        results.extend(kernel(options, clients, per_client)?);
    }
    Ok(results)
}
