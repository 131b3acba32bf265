//! `calm-bench servers`: 1, 2 and 3 `calm serve --store etcd://` processes over one local
//! 3-member etcd cluster (or the one `--store` names), each round on a fresh key prefix.
//!
//! - **lock-hot**: lock clients each set and unset a lock on a range of their own of one
//!   file (no conflicts), through routers homed round-robin on the servers: every request goes
//!   to the file's decider, whichever server the client is on. One operation = one request.
//! - **lock-many**: the same on a file of their own per round trip, spread over all servers.
//! - **create** and **stat**: namespace clients (64 by default) homed round-robin on the
//!   servers create files in one directory, then read their attributes.
//! - **pair-client** and **pair-mount**: creates and unlinks at 16 threads, each in a
//!   directory of its own, by namespace clients in this process, then by system calls through
//!   a `calm mount` of the first server: what a program sees beside what the servers can do.
//!
//! Each figure comes with the CPU time the calm server processes spent on it (user + system,
//! from `/proc/PID/stat`, summed over the servers; etcd's own CPU is not counted), per
//! operation: on a 2-core machine the servers and the clients share the cores, so throughput
//! across server counts says little, CPU per operation says what a server spends. With 3
//! servers, the failover times: kill -9 of the server deciding a file, then the time until a
//! lock on that file is granted again (another server took it over) and until a client that
//! used the dead server has a create answered by another one.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_client::Client;
use calm_client::routing::LockRouter;
use calm_locks::peers::owner_of;
use calm_locks::{LockKind, Owner, Range, Request, Scope};
use calm_meta::ROOT;
use calm_proto::locks::{LockCall, LockCode};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ServersOptions {
    /// Server counts, one round each.
    pub servers: Vec<usize>,
    /// Namespace clients of the create and stat rounds.
    pub clients: usize,
    /// Files created (and stat'ed) per round.
    pub files: u64,
    /// Lock clients of the lock rounds.
    pub lock_clients: usize,
    /// Lock requests per lock round.
    pub lock_ops: u64,
    /// The servers' membership lease.
    pub lease_ms: u64,
    /// An etcd cluster to use instead of a local one.
    pub etcd: Option<String>,
    /// Threads (and namespace clients) of the create + unlink rounds.
    pub pair_threads: usize,
    /// The `calm` binary to start servers with.
    pub calm: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServersResult {
    pub servers: usize,
    pub op: &'static str,
    pub ops_per_sec: f64,
    pub cpu_us_per_op: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailoverTimes {
    pub lock: f64,
    pub create: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServersReport {
    pub bench: &'static str,
    pub results: Vec<ServersResult>,
    pub failover_s: Option<FailoverTimes>,
    pub lease_s: f64,
}

/// A `calm serve` process.
struct ServerProcess {
    child: Child,
    addr: String,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    /// A server of the namespace at `url`, its contents in `dir/objects-PREFIX` (one object
    /// store per namespace: a server refuses another namespace's).
    fn start(options: &ServersOptions, url: &str, dir: &Path) -> Result<ServerProcess, String> {
        let prefix: String = url
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .chars()
            .take_while(|c| *c != '?')
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let objects = format!("file://{}", dir.join(format!("objects-{prefix}")).display());
        let data = dir.join(format!("server-{}", unique()));
        let mut child = Command::new(&options.calm)
            .arg("serve")
            .arg("--data")
            .arg(&data)
            .args(["--store", url, "--objects", &objects])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--server-lease-ms", &options.lease_ms.to_string()])
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", options.calm.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("reading the ready line: {e}"))?;
        let (_, addr) = calm_server::parse_ready_line(&line)
            .ok_or_else(|| format!("unexpected first line of calm serve: {line:?}"))?;
        Ok(ServerProcess { child, addr })
    }

    /// CPU time (user + system) the process has used, in microseconds.
    fn cpu_us(&self) -> u64 {
        crate::procs::cpu_us(self.child.id())
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn cpu_of(servers: &[ServerProcess]) -> u64 {
    servers.iter().map(ServerProcess::cpu_us).sum()
}

/// Waits until every server lists `count` members.
pub(crate) async fn all_joined(addrs: &[&str], count: usize) -> Result<(), String> {
    let started = Instant::now();
    for addr in addrs {
        let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
        loop {
            let members = client.members().await.map_err(|e| e.to_string())?;
            if members.servers.len() == count {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("the servers never saw each other: {members:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

fn lock_request(file: u64, task: usize, kind: LockKind) -> Request {
    Request {
        resource: file,
        owner: Owner::File {
            file: task as u64 + 1,
        },
        scope: Scope::Range(Range {
            start: task as u64 * 16,
            end: task as u64 * 16 + 7,
        }),
        kind,
    }
}

/// Each router task sets and unsets its lock `ops / tasks / 2` times on `file_of(task, i)`.
async fn lock_round(
    routers: &[Arc<LockRouter>],
    ops: u64,
    file_of: Arc<dyn Fn(usize, u64) -> u64 + Send + Sync>,
) -> Result<u64, String> {
    let per_task = (ops / routers.len() as u64 / 2).max(1);
    let mut tasks = Vec::new();
    for (task, router) in routers.iter().enumerate() {
        let router = router.clone();
        let file_of = file_of.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                let request = lock_request(file_of(task, i), task, LockKind::Write);
                let answers = router
                    .call(
                        request.resource,
                        &[LockCall::Set(request), LockCall::Unlock(request)],
                    )
                    .await
                    .map_err(|f| f.to_string())?;
                if let Some(bad) = answers.iter().find(|a| a.code != LockCode::Ok) {
                    return Err(format!("lock round: {bad:?}"));
                }
            }
            Ok::<u64, String>(per_task * 2)
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.map_err(|e| e.to_string())??;
    }
    Ok(done)
}

/// Measures `work` (which returns its operation count): operations per second and server
/// CPU per operation.
async fn measure<F: Future<Output = Result<u64, String>>>(
    servers: &[ServerProcess],
    op: &'static str,
    work: F,
) -> Result<ServersResult, String> {
    let cpu = cpu_of(servers);
    let started = Instant::now();
    let ops = work.await?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_of(servers).saturating_sub(cpu);
    Ok(ServersResult {
        servers: servers.len(),
        op,
        ops_per_sec: ops as f64 / elapsed,
        cpu_us_per_op: cpu as f64 / ops.max(1) as f64,
    })
}

/// The operations done by `tasks`, each returning its count; the first failure.
async fn total_of(tasks: Vec<tokio::task::JoinHandle<Result<u64, String>>>) -> Result<u64, String> {
    let mut done = 0;
    for task in tasks {
        done += task.await.map_err(|e| e.to_string())??;
    }
    Ok(done)
}

/// `url` (`etcd://HOSTS[/PREFIX][?OPTIONS]`) with `prefix` added to its key prefix.
pub(crate) fn with_prefix(url: &str, prefix: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    format!("{}/{prefix}{query}", base.trim_end_matches('/'))
}

/// One round with `count` servers on a fresh prefix of `base_url`.
async fn round(
    options: &ServersOptions,
    base_url: &str,
    dir: &Path,
    count: usize,
    results: &mut Vec<ServersResult>,
) -> Result<Option<FailoverTimes>, String> {
    let url = with_prefix(
        base_url,
        &calm_testkit::etcd::unique_prefix(&format!("bench-servers-{count}")),
    );
    let mut servers = Vec::new();
    for _ in 0..count {
        servers.push(ServerProcess::start(options, &url, dir)?);
    }
    all_joined(
        &servers.iter().map(|s| s.addr.as_str()).collect::<Vec<_>>(),
        count,
    )
    .await?;
    let home = |i: usize| servers[i % servers.len()].addr.clone();
    let first = Client::connect(&servers[0].addr)
        .await
        .map_err(|e| e.to_string())?;
    let lock_dir = first
        .mkdir(ROOT, b"locks", 0o755)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let mut lock_files = Vec::new();
    for i in 0..256 {
        let name = format!("f{i}");
        lock_files.push(
            first
                .create(lock_dir, name.as_bytes(), 0o644)
                .await
                .map_err(|e| e.to_string())?
                .handle,
        );
    }
    let mut routers = Vec::new();
    for i in 0..options.lock_clients {
        let client = Client::connect(&home(i)).await.map_err(|e| e.to_string())?;
        routers.push(
            LockRouter::open(client, 30_000)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    // Renewing their leases (and following the view) while the rounds last.
    let renewing: Vec<_> = routers
        .iter()
        .map(|router| tokio::spawn(router.clone().run()))
        .collect();
    let hot = lock_files[0];
    // A first pass opens every router's sessions on every server.
    lock_round(&routers, 2 * 256 * routers.len() as u64, {
        let files = lock_files.clone();
        Arc::new(move |_, i| files[i as usize % files.len()])
    })
    .await?;
    results.push(
        measure(
            &servers,
            "lock-hot",
            lock_round(&routers, options.lock_ops, Arc::new(move |_, _| hot)),
        )
        .await?,
    );
    let files = lock_files.clone();
    results.push(
        measure(
            &servers,
            "lock-many",
            lock_round(
                &routers,
                options.lock_ops,
                Arc::new(move |task, i| files[(task * 31 + i as usize) % files.len()]),
            ),
        )
        .await?,
    );
    for task in renewing {
        task.abort();
    }
    for router in &routers {
        router.close().await;
    }
    drop(routers);

    // Namespace clients.
    let dir_handle = first
        .mkdir(ROOT, b"files", 0o755)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let mut clients = Vec::new();
    for i in 0..options.clients {
        clients.push(Client::connect(&home(i)).await.map_err(|e| e.to_string())?);
    }
    let per_client = (options.files / options.clients as u64).max(1);
    let created: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
    results.push(
        measure(&servers, "create", async {
            let mut tasks = Vec::new();
            for (c, client) in clients.iter().enumerate() {
                let client = client.clone();
                let created = created.clone();
                tasks.push(tokio::spawn(async move {
                    let mut mine = Vec::new();
                    for i in 0..per_client {
                        let name = format!("c{c}-{i}");
                        let attr = client
                            .create(dir_handle, name.as_bytes(), 0o644)
                            .await
                            .map_err(|e| e.to_string())?;
                        mine.push(attr.handle);
                    }
                    created
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(mine);
                    Ok::<u64, String>(per_client)
                }));
            }
            total_of(tasks).await
        })
        .await?,
    );
    let handles = Arc::new(created.lock().unwrap_or_else(|p| p.into_inner()).clone());
    results.push(
        measure(&servers, "stat", async {
            let mut tasks = Vec::new();
            for (c, client) in clients.iter().enumerate() {
                let client = client.clone();
                let handles = handles.clone();
                let count = clients.len();
                tasks.push(tokio::spawn(async move {
                    let mut done = 0;
                    for handle in handles.iter().skip(c).step_by(count) {
                        client.getattr(*handle).await.map_err(|e| e.to_string())?;
                        done += 1;
                    }
                    Ok::<u64, String>(done)
                }));
            }
            total_of(tasks).await
        })
        .await?,
    );
    drop(clients);
    pair_rounds(options, &servers, dir, results).await?;
    if count < 3 {
        return Ok(None);
    }
    failover(options, servers, lock_files, dir_handle)
        .await
        .map(Some)
}

/// Creates and unlinks at `options.pair_threads` at once, each in a directory of its own: by
/// namespace clients in this process (homed round-robin on the servers), then by as many
/// threads of system calls through a `calm mount` of the first server (open with O_CREAT and
/// O_EXCL, close, unlink). One operation = one create and its unlink.
async fn pair_rounds(
    options: &ServersOptions,
    servers: &[ServerProcess],
    dir: &Path,
    results: &mut Vec<ServersResult>,
) -> Result<(), String> {
    let threads = options.pair_threads.max(1);
    let per_thread = (options.files / threads as u64).max(1);
    let first = Client::connect(&servers[0].addr)
        .await
        .map_err(|e| e.to_string())?;
    let top = first
        .mkdir(ROOT, b"pairs", 0o755)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let mut clients = Vec::new();
    for i in 0..threads {
        let client = Client::connect(&servers[i % servers.len()].addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = format!("c{i}");
        let own = client
            .mkdir(top, name.as_bytes(), 0o755)
            .await
            .map_err(|e| e.to_string())?
            .handle;
        clients.push((client, own));
    }
    results.push(
        measure(servers, "pair-client", async {
            let mut tasks = Vec::new();
            for (client, own) in clients.iter().cloned() {
                tasks.push(tokio::spawn(async move {
                    for i in 0..per_thread {
                        let name = format!("f{i}");
                        client
                            .create(own, name.as_bytes(), 0o644)
                            .await
                            .map_err(|e| e.to_string())?;
                        client
                            .unlink(own, name.as_bytes())
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok::<u64, String>(per_thread)
                }));
            }
            total_of(tasks).await
        })
        .await?,
    );
    drop(clients);
    let mountpoint = dir.join(format!("mount-{}", unique()));
    let mount =
        crate::procs::MountProcess::start(&options.calm, &mountpoint, &servers[0].addr, &[])?;
    let root = mountpoint.join("pairs");
    for t in 0..threads {
        std::fs::create_dir(root.join(format!("m{t}")))
            .map_err(|e| format!("making a directory on the mount: {e}"))?;
    }
    let result = measure(servers, "pair-mount", async {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let own = root.join(format!("m{t}"));
                std::thread::spawn(move || -> Result<u64, String> {
                    for i in 0..per_thread {
                        let path = own.join(format!("f{i}"));
                        std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(&path)
                            .map_err(|e| format!("creating {}: {e}", path.display()))?;
                        std::fs::remove_file(&path)
                            .map_err(|e| format!("unlinking {}: {e}", path.display()))?;
                    }
                    Ok(per_thread)
                })
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            let mut done = 0;
            for worker in workers {
                done += worker.join().map_err(|_| "a mount worker panicked")??;
            }
            Ok(done)
        })
        .await
        .map_err(|e| e.to_string())?
    })
    .await;
    mount.process.stop()?;
    results.push(result?);
    Ok(())
}

/// Kills the server deciding a file that a client keeps locking, while another client that
/// uses that server keeps creating: how long until each is answered by another server.
async fn failover(
    options: &ServersOptions,
    mut servers: Vec<ServerProcess>,
    lock_files: Vec<u64>,
    dir: u64,
) -> Result<FailoverTimes, String> {
    let probe = Client::connect(&servers[1].addr)
        .await
        .map_err(|e| e.to_string())?;
    let members = probe.members().await.map_err(|e| e.to_string())?;
    let view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
    let mut ids = HashMap::new();
    for (i, server) in servers.iter().enumerate() {
        let client = Client::connect(&server.addr)
            .await
            .map_err(|e| e.to_string())?;
        ids.insert(client.members().await.map_err(|e| e.to_string())?.me, i);
    }
    let file = lock_files[0];
    let victim_id = owner_of(file, &view).ok_or("no decider")?;
    let victim = ids[&victim_id];
    let survivor = (victim + 1) % servers.len();
    // The locker: homed on a survivor, locking the victim's file over and over.
    let home = Client::connect(&servers[survivor].addr)
        .await
        .map_err(|e| e.to_string())?;
    let router = LockRouter::open(home, 30_000)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(router.clone().run());
    // The creator: the victim first in its list.
    let mut list = vec![servers[victim].addr.clone()];
    list.extend(
        servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != victim)
            .map(|(_, s)| s.addr.clone()),
    );
    let creator = Client::connect_servers(&list)
        .await
        .map_err(|e| e.to_string())?;
    let killed: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    // Seconds since the kill, once it happened.
    let since_kill = |killed: Arc<std::sync::Mutex<Option<Instant>>>| {
        move || -> Option<f64> {
            killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map(|at| at.elapsed().as_secs_f64())
        }
    };
    let lock_after = since_kill(killed.clone());
    let locking = tokio::spawn({
        let router = router.clone();
        async move {
            let mut i = 0u64;
            loop {
                i += 1;
                let request = lock_request(file, 0, LockKind::Write);
                let answers = router
                    .call(file, &[LockCall::Set(request), LockCall::Unlock(request)])
                    .await
                    .map_err(|f| f.to_string())?;
                if answers.iter().any(|a| a.code != LockCode::Ok) {
                    return Err(format!("failover lock: {answers:?}"));
                }
                if let Some(seconds) = lock_after() {
                    return Ok::<f64, String>(seconds);
                }
                if i.is_multiple_of(64) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    });
    let create_after = since_kill(killed.clone());
    let creating = tokio::spawn({
        let creator = creator.clone();
        async move {
            let mut i = 0u64;
            loop {
                i += 1;
                creator
                    .create(dir, format!("failover-{i}").as_bytes(), 0o644)
                    .await
                    .map_err(|e| e.to_string())?;
                if let Some(seconds) = create_after() {
                    return Ok::<f64, String>(seconds);
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim_process = servers.remove(victim);
    // Counted from the signal, but only answers after the process is gone count: they come
    // from another server.
    let signalled = Instant::now();
    victim_process.kill9();
    *killed.lock().unwrap_or_else(|p| p.into_inner()) = Some(signalled);
    let limit = Duration::from_millis(options.lease_ms * 2 + 60_000);
    let lock = tokio::time::timeout(limit, locking)
        .await
        .map_err(|_| "no lock was granted after the kill".to_string())?
        .map_err(|e| e.to_string())??;
    let create = tokio::time::timeout(limit, creating)
        .await
        .map_err(|_| "no create was answered after the kill".to_string())?
        .map_err(|e| e.to_string())??;
    router.close().await;
    Ok(FailoverTimes { lock, create })
}

/// The etcd cluster `etcd` names, or a local 3-member one started for the run (stopped when
/// the returned guard goes); its URL.
pub(crate) fn cluster_or(
    etcd: &Option<String>,
) -> Result<(Option<calm_testkit::etcd::LocalCluster>, String), String> {
    Ok(match etcd {
        Some(url) => (None, url.clone()),
        None => {
            let cluster = calm_testkit::etcd::LocalCluster::start(3)?;
            let url = cluster.url("");
            (Some(cluster), url)
        }
    })
}

pub fn run(options: &ServersOptions) -> Result<ServersReport, String> {
    // The pair rounds' mounts go away with this process, however it ends.
    crate::enter_private_namespace();
    let dir = tempfile::Builder::new()
        .prefix("calm-bench-servers-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let (_cluster, url) = cluster_or(&options.etcd)?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    let mut failover_s = None;
    for count in &options.servers {
        let times = runtime.block_on(round(options, &url, dir.path(), *count, &mut results))?;
        failover_s = failover_s.or(times);
    }
    // etcd grants leases in whole seconds.
    let lease_s = options.lease_ms.div_ceil(1000) as f64;
    Ok(ServersReport {
        bench: "servers",
        results,
        failover_s,
        lease_s,
    })
}

/// The table: each figure beside the single-server one of the same run.
pub fn table(report: &ServersReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<8} {:<12} {:>12} {:>10} {:>14} {:>12}",
        "servers", "op", "ops/s", "cpu µs/op", "cpu vs 1 srv", "ops vs 1 srv"
    )];
    for result in &report.results {
        let base = report
            .results
            .iter()
            .find(|r| r.servers == 1 && r.op == result.op);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        lines.push(format!(
            "{:<8} {:<12} {:>12.0} {:>10.1} {:>14} {:>12}",
            result.servers,
            result.op,
            result.ops_per_sec,
            result.cpu_us_per_op,
            ratio(result.cpu_us_per_op, base.map(|b| b.cpu_us_per_op)),
            ratio(result.ops_per_sec, base.map(|b| b.ops_per_sec)),
        ));
    }
    match &report.failover_s {
        Some(f) => lines.push(format!(
            "failover after kill -9: first lock {:.2} s, first create {:.2} s (lease {:.0} s; \
             goal ≤ lease + 1 s)",
            f.lock, f.create, report.lease_s
        )),
        None => lines.push("failover: not measured (needs a round with 3 servers)".into()),
    }
    lines
}

/// Two panels per operation, over the number of servers: its rate, and the servers' CPU per
/// operation (`--plot`).
pub fn facets(report: &ServersReport) -> Vec<crate::multiples::Facet> {
    let cells = report.results.iter().flat_map(|r| {
        [
            crate::multiples::Cell::at(
                format!("{}: rate", r.op),
                ("servers", r.servers as f64),
                ("operations/s", r.ops_per_sec),
                "calm",
            ),
            crate::multiples::Cell::at(
                format!("{}: CPU", r.op),
                ("servers", r.servers as f64),
                ("µs of the servers' CPU per operation", r.cpu_us_per_op),
                "calm",
            ),
        ]
    });
    crate::multiples::facets_of(cells)
}
