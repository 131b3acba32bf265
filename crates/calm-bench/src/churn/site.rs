//! `calm-bench churn --site`: the churn as a site runs it. One `calm mount` per server, the
//! creating threads spread over the mounts (each in a directory of its own, through the kernel
//! like any program), a file held open on every mount for the whole round, a changelog reader
//! registered that reads and clears as a tool following the change feed does, and every few
//! periods a pause in which nothing is created: the quiet in which etcd's history moves on
//! without calm.
//!
//! A period's rate counts its working time only (its length less its pause).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm_client::{Client, FollowWait};

use super::model::{ChurnOptions, ChurnPeriod, Latencies, SiteOptions, p99};
use crate::procs::{MountProcess, ServerProcess};

/// What the threads, the reader and the period loop share.
struct Shared {
    stop: AtomicBool,
    paused: AtomicBool,
    latencies: Latencies,
    /// Pairs done through each mount since the round began.
    per_mount: Vec<AtomicU64>,
    /// Records the reader has read since the round began.
    read: AtomicU64,
}

/// One round with `servers.len()` servers, a mount of each.
pub(super) async fn round(
    options: &ChurnOptions,
    site: &SiteOptions,
    url: &str,
    dir: &Path,
    servers: &[ServerProcess],
) -> Result<Vec<ChurnPeriod>, String> {
    let mounts = servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let cache = dir.join(format!("cache-{i}"));
            let cache = cache
                .to_str()
                .ok_or("a path that is not UTF-8")?
                .to_string();
            MountProcess::start(
                &options.calm,
                &dir.join(format!("mnt-{i}")),
                &server.addr,
                &["--cache-dir", &cache],
            )
        })
        .collect::<Result<Vec<_>, String>>()?;
    let points: Vec<PathBuf> = mounts.iter().map(|m| m.mountpoint.clone()).collect();
    // A file held open on every mount for the whole round, as `sleep 300 < MNT/x` holds one.
    let held = held_open(&points)?;
    let top = points[0].join("churn");
    std::fs::create_dir(&top).map_err(|e| format!("making {}: {e}", top.display()))?;

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        latencies: Latencies::default(),
        per_mount: points.iter().map(|_| AtomicU64::new(0)).collect(),
        read: AtomicU64::new(0),
    });
    let reader_client = Client::connect(&servers[1 % servers.len()].addr)
        .await
        .map_err(|e| e.to_string())?;
    let reader = tokio::spawn(follow_and_clear(reader_client, shared.clone()));
    let mut threads = Vec::new();
    for t in 0..options.threads.max(1) {
        let m = t % points.len();
        // Made through its own mount, then used there.
        let own = points[m].join("churn").join(format!("c{t}"));
        make_dir_seen(&own)?;
        let shared = shared.clone();
        threads.push(std::thread::spawn(move || create_unlink(&own, m, &shared)));
    }
    let status: Vec<Client> = {
        let mut clients = Vec::new();
        for server in servers {
            clients.push(
                Client::connect(&server.addr)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        clients
    };

    let cpu_of = |servers: &[ServerProcess]| {
        servers.iter().map(|s| s.process.cpu_us()).sum::<u64>()
            + mounts.iter().map(|m| m.process.cpu_us()).sum::<u64>()
    };
    let mut periods = Vec::new();
    let mut cpu = cpu_of(servers);
    let mut mount_pairs: Vec<u64> = vec![0; points.len()];
    let mut read = 0;
    let mut started = Instant::now();
    let mut failed = None;
    let any_ended = || threads.iter().any(|t| t.is_finished()) || reader.is_finished();
    for period in 1..=options.periods {
        let end = started + options.period;
        let mut paused_s = 0.0;
        if period % site.pause_every == 0 {
            let pause_end = Instant::now() + site.pause.min(options.period / 2);
            shared.paused.store(true, Ordering::Relaxed);
            let paused = Instant::now();
            while Instant::now() < pause_end && !any_ended() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            shared.paused.store(false, Ordering::Relaxed);
            paused_s = paused.elapsed().as_secs_f64();
        }
        // Wakes early when a thread or the reader failed, to report it at once.
        while Instant::now() < end && !any_ended() {
            tokio::time::sleep(Duration::from_millis(200).min(end - Instant::now())).await;
        }
        let done = shared.latencies.take();
        let elapsed = started.elapsed().as_secs_f64();
        let working = (elapsed - paused_s).max(f64::MIN_POSITIVE);
        started = Instant::now();
        let now_cpu = cpu_of(servers);
        let (db, in_use) = calm_testkit::etcd::db_size(url)?;
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let pairs = done.len() as u64;
        let (stored, purged) = changelog_counts(&status).await?;
        let now_read = shared.read.load(Ordering::Relaxed);
        let figures = ChurnPeriod {
            period,
            pairs,
            pairs_per_sec: pairs as f64 / working,
            p99_ms: p99(done) as f64 / 1000.0,
            cpu_us_per_pair: now_cpu.saturating_sub(cpu) as f64 / pairs.max(1) as f64,
            servers_rss_mib: mib(servers.iter().map(|s| s.process.rss_bytes()).sum()),
            db_mib: mib(db),
            db_in_use_mib: mib(in_use),
            paused_s,
            mount_pairs_per_sec: shared
                .per_mount
                .iter()
                .zip(mount_pairs.iter_mut())
                .map(|(now, before)| {
                    let now = now.load(Ordering::Relaxed);
                    let rate = now.saturating_sub(*before) as f64 / working;
                    *before = now;
                    rate
                })
                .collect(),
            changelog_stored: Some(stored),
            changelog_purged: Some(purged),
            reader_records: Some(now_read - read),
        };
        read = now_read;
        cpu = now_cpu;
        eprintln!(
            "churn --site: {} server(s), period {period}/{}: {:.0} pairs/s ({}), p99 {:.1} ms, \
             database {:.1} MiB, changelog {stored} stored, {purged} purged",
            servers.len(),
            options.periods,
            figures.pairs_per_sec,
            figures
                .mount_pairs_per_sec
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join("/"),
            figures.p99_ms,
            figures.db_mib,
        );
        periods.push(figures);
        if any_ended() {
            failed = Some(period);
            break;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    shared.paused.store(false, Ordering::Relaxed);
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a creating thread panicked".to_string())??;
    }
    reader.await.map_err(|e| e.to_string())??;
    if let Some(period) = failed {
        return Err(format!(
            "a thread or the reader stopped in period {period} without an error"
        ));
    }
    drop(held);
    for mount in mounts {
        mount.process.stop()?;
    }
    Ok(periods)
}

/// A file made on every mount and opened there, kept open while the result lives.
fn held_open(points: &[PathBuf]) -> Result<Vec<File>, String> {
    points
        .iter()
        .enumerate()
        .map(|(i, point)| {
            let path = point.join(format!("held-open-{i}"));
            std::fs::write(&path, b"held open for the round\n")
                .and_then(|()| File::open(&path))
                .map_err(|e| format!("{}: {e}", path.display()))
        })
        .collect()
}

/// Makes `dir` through its own mount, waiting for its parent (made through another mount) to
/// appear there first.
fn make_dir_seen(dir: &Path) -> Result<(), String> {
    let waited = Instant::now();
    loop {
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && waited.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("making {}: {e}", dir.display())),
        }
    }
}

/// One thread: creates a file in `dir` and closes it, unlinks it, again until told to stop;
/// waits while the round pauses. A failed call ends the round with its error.
fn create_unlink(dir: &Path, mount: usize, shared: &Shared) -> Result<(), String> {
    let mut i = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let path = dir.join(format!("f{i}"));
        let started = Instant::now();
        File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
        std::fs::remove_file(&path).map_err(|e| format!("unlink {}: {e}", path.display()))?;
        shared
            .latencies
            .push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
        shared.per_mount[mount].fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    Ok(())
}

/// A tool following the change feed: registers a reader, reads what is after its cleared
/// index, clears what it read, until the round stops; deregisters at the end.
async fn follow_and_clear(client: Client, shared: Arc<Shared>) -> Result<(), String> {
    let id = client
        .changelog_register("bench-follower", "")
        .await
        .map_err(|e| format!("registering a changelog reader: {e}"))?
        .id;
    let wait = FollowWait {
        wait_ms: 1000,
        ..FollowWait::default()
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let (records, _last) = client
            .changelog_follow(0, calm_client::CL_EACH_BATCH_RECORDS, Some(id), wait)
            .await
            .map_err(|e| format!("the changelog reader's read: {e}"))?;
        if let Some(last) = records.last() {
            client
                .changelog_clear(id, last.index)
                .await
                .map_err(|e| format!("the changelog reader's clear: {e}"))?;
            shared
                .read
                .fetch_add(records.len() as u64, Ordering::Relaxed);
        }
    }
    client
        .changelog_deregister(id)
        .await
        .map_err(|e| format!("deregistering the changelog reader: {e}"))?;
    Ok(())
}

/// The changelog's records stored now (as the first server counts them) and the records
/// every server has purged since it started, summed.
async fn changelog_counts(servers: &[Client]) -> Result<(u64, u64), String> {
    let mut stored = None;
    let mut purged = 0;
    for client in servers {
        let status = client
            .status()
            .await
            .map_err(|e| format!("a server's status: {e}"))?;
        // The first stored is the last + 1 when none is.
        stored.get_or_insert((status.changelog_last + 1).saturating_sub(status.changelog_first));
        purged += status.changelog_purged;
    }
    Ok((stored.unwrap_or(0), purged))
}
