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

use calm_meta::{Handle, Meta, MetaError, MetaOptions, ROOT};
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
fn row(
    mode: &'static str,
    store: &'static str,
    op: &'static str,
    dirs: &'static str,
    clients: usize,
    files: u64,
    seconds: f64,
) -> MdtestResult {
    MdtestResult {
        mode,
        store,
        op,
        dirs,
        clients,
        files,
        seconds,
        ops_per_sec: files as f64 / seconds.max(1e-9),
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

    /// A server that also runs the data tasks (deleter, compactor) as `calm serve` does.
    pub async fn start_with_data<S: Store>(
        meta: Arc<Meta<S>>,
        data: Option<calm_server::data::DataOptions>,
    ) -> Result<InProcessServer, String> {
        // Loopback TCP: the benchmark runs as root, whose connections a plain TCP listener
        // takes.
        let (listener, addr) = calm_server::listen::bind("127.0.0.1:0", None).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let info = calm_server::ServerInfo {
            data_dir: String::new(),
            started: Instant::now(),
            ready_ms: 0,
            watch_limits: calm_watch::Limits::default(),
            data,
            auth: calm_server::auth::Auth::default(),
        };
        let server = calm_server::Server::start(meta, info).await;
        let local = calm_client::InProcess {
            meta: server.meta_service(),
            locks: server.lock_service(),
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

fn open_meta_store(
    dir: &std::path::Path,
    wal: bool,
    objects: Option<&str>,
) -> Result<(tempfile::TempDir, Arc<Meta<LmdbStore>>), String> {
    let work = tempfile::Builder::new()
        .prefix("calm-bench-mdtest-")
        .tempdir_in(dir)
        .map_err(|e| format!("making a directory in {}: {e}", dir.display()))?;
    let options = LmdbOptions {
        wal,
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
            ..MetaOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    Ok((work, Arc::new(meta)))
}

async fn inprocess<S: Store>(
    options: &MdtestOptions,
    clients: usize,
    per_client: u64,
    (store, meta): (&'static str, Arc<Meta<S>>),
) -> Result<Vec<MdtestResult>, String> {
    let mut dirs: Vec<Handle> = Vec::new();
    for c in 0..dir_count(options, clients) {
        dirs.push(
            meta.mkdir(ROOT, format!("dir.{c}").as_bytes(), 0o755)
                .await
                .map_err(|e| e.to_string())?
                .handle,
        );
    }
    let dirs = Arc::new(dirs);
    let files = per_client * clients as u64;
    let (m, d) = (meta.clone(), dirs.clone());
    let create = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move {
            m.create(d[c % d.len()], &name(c, i), 0o644)
                .await
                .map(|_| ())
        }
    })
    .await?;
    let (m, d) = (meta.clone(), dirs.clone());
    let stat = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move { m.lookup(d[c % d.len()], &name(c, i)).map(|_| ()) }
    })
    .await?;
    let (m, d) = (meta.clone(), dirs.clone());
    let unlink = phase(clients, per_client, move |c, i| {
        let (m, d) = (m.clone(), d.clone());
        async move { m.unlink(d[c % d.len()], &name(c, i)).await }
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
) -> Result<Vec<MdtestResult>, String> {
    let server = InProcessServer::start(meta.clone()).await?;
    let addr = server.addr.clone();
    let mut conns = Vec::new();
    let mut dirs = Vec::new();
    for c in 0..clients {
        let client = calm_client::Client::connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        if c < dir_count(options, clients) {
            dirs.push(
                client
                    .mkdir(ROOT, format!("dir.{c}").as_bytes(), 0o755)
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
    let create = phase(clients, per_client, move |c, i| {
        let (k, d) = (k.clone(), d.clone());
        async move {
            k[c].create(d[c % d.len()], &name(c, i), 0o644)
                .await
                .map(|_| ())
        }
    })
    .await?;
    let (k, d) = (conns.clone(), dirs.clone());
    let stat = phase(clients, per_client, move |c, i| {
        let (k, d) = (k.clone(), d.clone());
        async move { k[c].lookup(d[c % d.len()], &name(c, i)).await.map(|_| ()) }
    })
    .await?;
    let (k, d) = (conns.clone(), dirs.clone());
    let unlink = phase(clients, per_client, move |c, i| {
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
    let run = |op: fn(&std::path::Path) -> std::io::Result<()>| -> Result<f64, String> {
        let started = Instant::now();
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
        })?;
        Ok(started.elapsed().as_secs_f64())
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
        for (store, wal) in lmdb_stores
            .into_iter()
            .filter(|(_, wal)| *wal || options.lmdb_sync)
        {
            let (_work, meta) = open_meta_with(&options.dir, wal)?;
            results.extend(runtime.block_on(inprocess(
                options,
                clients,
                per_client,
                (store, meta),
            ))?);
            let (_work, meta) = open_meta_with(&options.dir, wal)?;
            results.extend(runtime.block_on(grpc(options, clients, per_client, (store, meta)))?);
        }
        if let Some(url) = &options.etcd {
            let meta = open_etcd(url)?;
            results.extend(runtime.block_on(inprocess(
                options,
                clients,
                per_client,
                ("etcd", meta),
            ))?);
            let meta = open_etcd(url)?;
            results.extend(runtime.block_on(grpc(options, clients, per_client, ("etcd", meta)))?);
        }
        results.extend(kernel(options, clients, per_client)?);
    }
    Ok(results)
}
