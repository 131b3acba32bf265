//! `calm-bench storm` (seed 002): watching through storms.
//!
//! (a) Mounts: N bind mounts (the seed's producer: one `mount --bind` process each) in a
//! private mount namespace with no watcher, a naive watcher that
//! re-reads /proc/self/mountinfo on every wake-up, the seed's budgeted watcher (re-read at most
//! once per 10× the last read) and calm's watcher (fanotify mount events, statmount); for each,
//! the producer's wall and CPU time, the watcher's CPU time, and whether its final table equals
//! mountinfo. (b) Namespace: creates in-process with 0, 100 and 10 000 watchers (each on its own
//! directory, plus 10 on the whole tree) fed from the changelog: producer rate, slowdown against
//! 0 watchers, deliveries per second, and the largest commit-to-delivery lag.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm_meta::{Handle, ROOT};
use calm_node::mounts::kernel::read_mountinfo;
use calm_node::mounts::{Mode, Mount, MountWatcher};
use calm_watch::{Event, Target};
use prost::Message;
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct StormOptions {
    pub mounts: Vec<usize>,
    pub watchers: Vec<usize>,
    pub creates: u64,
    /// Concurrent creating tasks.
    pub clients: usize,
    /// Rounds of the namespace runs (every watcher count once per round, in rotation, so that
    /// the machine's drift falls on all of them); medians are reported.
    pub repeat: usize,
    /// Where the temporary stores and mount points are made.
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountsResult {
    pub mounts: usize,
    pub watcher: &'static str,
    pub producer_s: f64,
    pub producer_cpu_s: f64,
    pub watcher_cpu_s: f64,
    /// Watcher CPU ÷ producer CPU.
    pub watcher_share: f64,
    pub exact: bool,
    /// Seconds from the last mount until the watcher's table was exact.
    pub settle_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamespaceResult {
    pub watchers: usize,
    pub creates: u64,
    pub ops_per_sec: f64,
    /// This run's rate against the 0-watcher run's: 1 − rate ÷ rate(0).
    pub slowdown: f64,
    pub deliveries: u64,
    pub deliveries_per_sec: f64,
    pub max_lag_ms: f64,
    /// Every round's rate (the median is `ops_per_sec`).
    pub rates: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    pub bench: &'static str,
    pub private_namespace: bool,
    pub mounts: Vec<MountsResult>,
    pub namespace: Vec<NamespaceResult>,
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL in a temporary path")
}

fn unmount(target: &Path) {
    // SAFETY: umount2(2) with a valid C string; a failure leaves a mount the namespace drops.
    unsafe { libc::umount2(c(target).as_ptr(), libc::MNT_DETACH) };
}

type Key = (u32, u32, PathBuf);

fn keys(mounts: &[Mount]) -> BTreeSet<Key> {
    mounts
        .iter()
        .map(|m| (m.id, m.parent, m.mount_point.clone()))
        .collect()
}

/// How long a watcher may take to catch up after the storm before its table counts as wrong.
const SETTLE_MAX: Duration = Duration::from_secs(120);

fn mounts_run(dir: &Path, n: usize, watcher: &'static str) -> Result<MountsResult, String> {
    let base = tempfile::Builder::new()
        .prefix("calm-bench-storm-")
        .tempdir_in(dir)
        .map_err(|e| e.to_string())?;
    let source = base.path().join("source");
    std::fs::create_dir(&source).map_err(|e| e.to_string())?;
    let targets: Vec<PathBuf> = (0..n).map(|i| base.path().join(format!("m{i}"))).collect();
    for t in &targets {
        std::fs::create_dir(t).map_err(|e| e.to_string())?;
    }
    let mode = match watcher {
        "none" => None,
        "naive" => Some(Mode::Mountinfo { budget: 0 }),
        "budget" => Some(Mode::Mountinfo { budget: 10 }),
        _ => Some(Mode::Fanotify),
    };
    let w = match mode {
        Some(mode) => Some(MountWatcher::start_with(mode).map_err(|e| format!("{watcher}: {e}"))?),
        None => None,
    };
    let cpu_before = w.as_ref().map_or(Duration::ZERO, |w| w.stats().cpu);
    let started = Instant::now();
    let children0 = crate::procs::children_cpu();
    // The seed's producer: one `mount --bind` process per mount.
    for t in &targets {
        let status = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&source)
            .arg(t)
            .status()
            .map_err(|e| format!("running mount: {e}"))?;
        if !status.success() {
            return Err(format!("mount --bind on {}: {status}", t.display()));
        }
    }
    let producer_cpu = crate::procs::children_cpu() - children0;
    let producer = started.elapsed();
    let (exact, settle, watcher_cpu) = match &w {
        None => (true, Duration::ZERO, Duration::ZERO),
        Some(w) => {
            let since = Instant::now();
            let truth = keys(&read_mountinfo().map_err(|e| e.to_string())?);
            let exact = w.wait_until(SETTLE_MAX, |table| keys(&table.mounts()) == truth);
            let settle = since.elapsed();
            (exact, settle, w.stats().cpu.saturating_sub(cpu_before))
        }
    };
    drop(w);
    for t in &targets {
        unmount(t);
    }
    Ok(MountsResult {
        mounts: n,
        watcher,
        producer_s: producer.as_secs_f64(),
        producer_cpu_s: producer_cpu.as_secs_f64(),
        watcher_cpu_s: watcher_cpu.as_secs_f64(),
        watcher_share: watcher_cpu.as_secs_f64() / producer_cpu.as_secs_f64().max(1e-9),
        exact,
        settle_s: settle.as_secs_f64(),
    })
}

/// Directories the creates spread over, in every namespace run (so that only the watchers
/// differ between runs).
const NAMESPACE_DIRS: usize = 10_000;
/// Watchers of the whole tree, added to every run with watchers.
const TREE_WATCHERS: usize = 10;

async fn namespace_run(
    options: &StormOptions,
    watchers: usize,
) -> Result<(f64, u64, f64, f64), String> {
    let (_work, meta) = crate::mdtest::open_meta(&options.dir)?;
    let hub = calm_server::WatchHub::new(meta.clone(), calm_watch::Limits::default());
    // The feed runs in every run, 0 watchers included: records are written the same way.
    hub.start_feed().await.map_err(|e| e.to_string())?;
    // The directories, made concurrently (group commit), in order.
    let makers: Vec<_> = (0..64)
        .map(|m| {
            let meta = meta.clone();
            tokio::spawn(async move {
                let mut made = Vec::new();
                for d in (m..NAMESPACE_DIRS).step_by(64) {
                    let attr = meta
                        .mkdir(ROOT, format!("d{d}").as_bytes(), 0o755)
                        .await
                        .map_err(|e| e.to_string())?;
                    made.push((d, attr.handle));
                }
                Ok::<_, String>(made)
            })
        })
        .collect();
    let mut dirs: Vec<Handle> = vec![0; NAMESPACE_DIRS];
    for maker in makers {
        for (d, handle) in maker.await.map_err(|e| e.to_string())?? {
            dirs[d] = handle;
        }
    }
    let dirs = Arc::new(dirs);
    let stop = Arc::new(AtomicBool::new(false));
    let deliveries = Arc::new(AtomicU64::new(0));
    let max_lag_ns = Arc::new(AtomicU64::new(0));
    let last_delivery = Arc::new(std::sync::Mutex::new(Instant::now()));
    let mut tasks = Vec::new();
    let targets: Vec<Target> = if watchers == 0 {
        Vec::new()
    } else {
        (0..watchers)
            .map(|i| Target::Dir {
                handle: dirs[i % NAMESPACE_DIRS],
                recursive: false,
            })
            .chain((0..TREE_WATCHERS).map(|_| Target::Dir {
                handle: ROOT,
                recursive: true,
            }))
            .collect()
    };
    for target in targets {
        let (id, waker, _) = hub
            .subscribe(target, u64::MAX)
            .await
            .map_err(|e| e.to_string())?;
        let (hub, stop, deliveries, max_lag_ns, last_delivery) = (
            hub.clone(),
            stop.clone(),
            deliveries.clone(),
            max_lag_ns.clone(),
            last_delivery.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let tick = tokio::time::timeout(Duration::from_millis(200), waker.notified())
                    .await
                    .is_err();
                let events = hub.take(id, 4096, tick);
                let now_ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64);
                let mut n = 0;
                let mut oldest = None;
                for event in &events {
                    if let Event::Change(change) = event {
                        n += 1;
                        oldest.get_or_insert(change);
                    }
                }
                // The batch's oldest change has its largest lag: decoding that one is enough
                // (a watcher that decoded everything would be measuring itself).
                if let Some(change) = oldest
                    && let Ok(record) = calm_proto::pb::ClRecord::decode(&change.encoded[..])
                {
                    let lag = (now_ns - record.time_ns).max(0) as u64;
                    max_lag_ns.fetch_max(lag, Ordering::Relaxed);
                }
                if n > 0 {
                    deliveries.fetch_add(n, Ordering::Relaxed);
                    *last_delivery.lock().expect("last delivery") = Instant::now();
                }
            }
            hub.unwatch(id);
        }));
    }
    let clients = options.clients.max(1);
    let per_client = options.creates / clients as u64;
    let started = Instant::now();
    let producers: Vec<_> = (0..clients)
        .map(|c| {
            let (meta, dirs) = (meta.clone(), dirs.clone());
            tokio::spawn(async move {
                for i in 0..per_client {
                    let n = c as u64 * per_client + i;
                    let dir = dirs[(n as usize) % dirs.len()];
                    meta.create(dir, format!("f{n}").as_bytes(), 0o644)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    let produced = started.elapsed();
    let creates = per_client * clients as u64;
    // Every matching change delivered: each create matches one directory watcher (when there
    // is one for its directory) and every tree watcher.
    let expected = if watchers == 0 {
        0
    } else {
        let to_watched_dirs = (0..creates)
            .filter(|n| ((n % NAMESPACE_DIRS as u64) as usize) < watchers)
            .count() as u64;
        to_watched_dirs + creates * TREE_WATCHERS as u64
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while deliveries.load(Ordering::Acquire) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        let _ = t.await;
    }
    let delivered = deliveries.load(Ordering::Acquire);
    if delivered < expected {
        return Err(format!(
            "{watchers} watchers: {delivered} of {expected} changes delivered in 120 s"
        ));
    }
    let delivering = last_delivery
        .lock()
        .expect("last delivery")
        .saturating_duration_since(started);
    Ok((
        creates as f64 / produced.as_secs_f64().max(1e-9),
        delivered,
        delivered as f64 / delivering.as_secs_f64().max(1e-9),
        max_lag_ns.load(Ordering::Acquire) as f64 / 1e6,
    ))
}

/// Runs the whole benchmark.
pub fn run(options: &StormOptions) -> Result<StormReport, String> {
    if options.creates == 0 || options.clients == 0 {
        return Err("--creates and --clients must be positive".into());
    }
    if options.watchers.iter().any(|w| *w > NAMESPACE_DIRS) {
        return Err(format!(
            "--watchers: at most {NAMESPACE_DIRS} (one per directory)"
        ));
    }
    let private_namespace = crate::enter_private_namespace();
    if !private_namespace && options.mounts.iter().any(|n| *n > 0) {
        return Err("the mount storm needs a private mount namespace (run as root)".into());
    }
    let mut mounts = Vec::new();
    // A count of 0 skips the mount part.
    for &n in options.mounts.iter().filter(|n| **n > 0) {
        for watcher in ["none", "naive", "budget", "calm"] {
            mounts.push(mounts_run(&options.dir, n, watcher)?);
        }
    }
    let runtime = crate::runtime()?;
    let mut counts = options.watchers.clone();
    if !counts.contains(&0) {
        counts.insert(0, 0);
    }
    let mut runs: Vec<Vec<(f64, u64, f64, f64)>> = vec![Vec::new(); counts.len()];
    for _ in 0..options.repeat.max(1) {
        for (i, &watchers) in counts.iter().enumerate() {
            runs[i].push(runtime.block_on(namespace_run(options, watchers))?);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base_rate = median(runs[0].iter().map(|r| r.0).collect());
    let namespace = counts
        .iter()
        .zip(runs)
        .map(|(&watchers, runs)| {
            let rate = median(runs.iter().map(|r| r.0).collect());
            NamespaceResult {
                watchers,
                creates: options.creates / options.clients as u64 * options.clients as u64,
                ops_per_sec: rate,
                slowdown: 1.0 - rate / base_rate,
                deliveries: runs[0].1,
                deliveries_per_sec: median(runs.iter().map(|r| r.2).collect()),
                max_lag_ms: median(runs.iter().map(|r| r.3).collect()),
                rates: runs.iter().map(|r| r.0).collect(),
            }
        })
        .collect();
    Ok(StormReport {
        bench: "storm",
        private_namespace,
        mounts,
        namespace,
    })
}

/// The report as a table for a terminal.
pub fn table(report: &StormReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>7} {:>8} {:>11} {:>13} {:>13} {:>9} {:>6} {:>9}",
        "mounts",
        "watcher",
        "producer s",
        "producer cpu",
        "watcher cpu",
        "share",
        "exact",
        "settle s"
    )];
    for r in &report.mounts {
        lines.push(format!(
            "{:>7} {:>8} {:>11.3} {:>13.3} {:>13.3} {:>8.1}% {:>6} {:>9.3}",
            r.mounts,
            r.watcher,
            r.producer_s,
            r.producer_cpu_s,
            r.watcher_cpu_s,
            100.0 * r.watcher_share,
            r.exact,
            r.settle_s
        ));
    }
    lines.push(format!(
        "{:>9} {:>9} {:>12} {:>10} {:>12} {:>15} {:>11}",
        "watchers", "creates", "creates/s", "slowdown", "deliveries", "deliveries/s", "max lag ms"
    ));
    for r in &report.namespace {
        lines.push(format!(
            "{:>9} {:>9} {:>12.0} {:>9.1}% {:>12} {:>15.0} {:>11.1}",
            r.watchers,
            r.creates,
            r.ops_per_sec,
            100.0 * r.slowdown,
            r.deliveries,
            r.deliveries_per_sec,
            r.max_lag_ms
        ));
    }
    lines
}

/// Panels: the mount-table watchers' CPU against the producer's over the number of bind
/// mounts (calm's watcher beside the re-readers), and the namespace's create rate and the
/// deliveries' worst lag over the number of watchers (`--plot`).
pub fn facets(report: &StormReport) -> Vec<crate::multiples::Facet> {
    let mounts = report
        .mounts
        .iter()
        .filter(|r| r.watcher != "none")
        .map(|r| {
            crate::multiples::Cell::at(
                "mount-table watcher's CPU",
                ("bind mounts in the storm", r.mounts as f64),
                ("% of the producer's CPU", 100.0 * r.watcher_share),
                match r.watcher {
                    "naive" => "re-reading the table per event".to_string(),
                    "budget" => "re-reading it at most once per interval".to_string(),
                    other => other.to_string(),
                },
            )
            .log()
        });
    let namespace = report.namespace.iter().flat_map(|r| {
        [
            crate::multiples::Cell::at(
                "creates while watched",
                ("namespace watchers", r.watchers as f64),
                ("creates/s", r.ops_per_sec),
                "calm",
            ),
            crate::multiples::Cell::at(
                "worst delivery lag",
                ("namespace watchers", r.watchers as f64),
                ("ms", r.max_lag_ms),
                "calm",
            ),
        ]
    });
    crate::multiples::facets_of(mounts.chain(namespace))
}
