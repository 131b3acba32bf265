//! Seed 004 (PVFS2 start-up): restart-to-ready of a store holding N files, against the seed's
//! baseline, a full scan that rebuilds the ledger of used handles.
//!
//! For each N: populate a fresh store through the real create path, stop; drop the page cache;
//! start `calm serve` as a new process and time spawn → ready line (clean restart); then start
//! it again, run a create storm over gRPC, kill -9 it mid-storm, drop the cache and time the
//! restart again; finally, on the same store and again from a cold cache, time the baseline
//! scan, and fsck the store. Each restart is checked by looking up a file created during
//! population.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_meta::layout::{TAG_INODE, key_handle};
use calm_meta::{Meta, MetaOptions, ROOT};
use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::{ReadTxn, Store};
use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct StartupOptions {
    pub files: Vec<u64>,
    /// Where the stores are made (one subdirectory per N, removed afterwards).
    pub dir: PathBuf,
    /// The `calm` binary to start as the server.
    pub calm_exe: PathBuf,
    /// Files per directory in the populated tree.
    pub files_per_dir: u64,
    /// Concurrent creators while populating.
    pub populate_tasks: usize,
    /// Times each measurement is repeated (the median is reported, and the maximum).
    pub repeat: usize,
    /// Populate and serve with the write-ahead log (the default; false: `calm serve
    /// --no-wal`): the restart after kill -9 then replays what the log holds since its last
    /// checkpoint.
    pub wal: bool,
}

/// One row of the result.
#[derive(Debug, Clone, Serialize)]
pub struct StartupResult {
    pub files: u64,
    /// Spawn of `calm serve` to its ready line, after a clean stop, cold cache (median).
    pub restart_ms: f64,
    /// The same after kill -9 during a create storm, cold cache (median).
    pub restart_after_kill_ms: f64,
    /// The baseline: open the store and scan every inode to rebuild the used-handle ledger,
    /// cold cache (median).
    pub scan_rebuild_ms: f64,
    /// The slowest of the repeats of each.
    pub restart_ms_max: f64,
    pub restart_after_kill_ms_max: f64,
    pub scan_rebuild_ms_max: f64,
    pub repeats: usize,
    /// What the server itself printed as "ready in N ms" (median; clean, after kill).
    pub server_ready_ms: u64,
    pub server_ready_after_kill_ms: u64,
    /// scan_rebuild_ms / restart_ms.
    pub scan_over_restart: f64,
    pub store_bytes: u64,
    pub populate_seconds: f64,
    /// `calm fsck`'s pass over the same store, cold cache: time, rate over the store file, and
    /// whether it found the store clean after the kill -9.
    pub fsck_ms: f64,
    pub fsck_mb_per_s: f64,
    pub fsck_clean: bool,
    /// Whether the page cache could be dropped before each timed start.
    pub cold_cache: bool,
}

/// A `calm serve` child process.
struct Server {
    child: Child,
    /// Kept open: the server prints a last line when it stops.
    _stdout: BufReader<ChildStdout>,
    addr: String,
    server_ms: u64,
    spawn_to_ready: Duration,
}

fn start_server(calm_exe: &Path, data: &Path, wal: bool) -> Result<Server, String> {
    let started = Instant::now();
    let mut child = Command::new(calm_exe)
        .arg("serve")
        .arg("--data")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .args((!wal).then_some("--no-wal"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", calm_exe.display()))?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .map_err(|e| format!("reading the server's ready line: {e}"))?;
    let spawn_to_ready = started.elapsed();
    match calm_server::parse_ready_line(&line) {
        Some((server_ms, addr)) => Ok(Server {
            server_ms,
            addr,
            child,
            _stdout: stdout,
            spawn_to_ready,
        }),
        None => {
            let _ = child.kill();
            Err(format!("the server did not become ready: {line:?}"))
        }
    }
}

impl Server {
    fn stop(mut self) -> Result<(), String> {
        sigterm(self.child.id());
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("server exited with {status} after SIGTERM"));
        }
        Ok(())
    }

    fn kill9(mut self) -> Result<(), String> {
        self.child.kill().map_err(|e| e.to_string())?;
        self.child.wait().map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Sends SIGTERM with the `kill` command (no libc binding needed for one signal).
fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

fn file_name(i: u64) -> Vec<u8> {
    format!("f{i:09}").into_bytes()
}

fn dir_name(d: u64) -> Vec<u8> {
    format!("d{d:06}").into_bytes()
}

/// Creates `files` files (in directories of `files_per_dir`) through the real create path.
pub(crate) fn populate(data: &Path, files: u64, options: &StartupOptions) -> Result<f64, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let lmdb = LmdbOptions {
        wal: options.wal,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(data, &lmdb).map_err(|e| e.to_string())?;
    let meta = Arc::new(Meta::open(store, MetaOptions::default()).map_err(|e| e.to_string())?);
    let started = Instant::now();
    let bar = crate::progress(files, &format!("populating {files} files"));
    let dir_count = files.div_ceil(options.files_per_dir);
    let dirs: Vec<u64> = runtime
        .block_on(async {
            let mut dirs = Vec::new();
            for d in 0..dir_count {
                dirs.push(meta.mkdir(ROOT, &dir_name(d), 0o755).await?.handle);
            }
            Ok::<_, calm_meta::MetaError>(dirs)
        })
        .map_err(|e| e.to_string())?;
    let dirs = Arc::new(dirs);
    let tasks = options.populate_tasks as u64;
    runtime.block_on(async {
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (meta, dirs, bar) = (meta.clone(), dirs.clone(), bar.clone());
            let per_dir = options.files_per_dir;
            handles.push(tokio::spawn(async move {
                let mut i = t;
                while i < files {
                    meta.create(dirs[(i / per_dir) as usize], &file_name(i), 0o644)
                        .await?;
                    bar.inc(1);
                    i += tasks;
                }
                Ok::<_, calm_meta::MetaError>(())
            }));
        }
        for h in handles {
            h.await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(())
    })?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    drop(runtime);
    let meta = Arc::into_inner(meta).ok_or("namespace still shared")?;
    Arc::into_inner(meta.shutdown())
        .ok_or("store still shared")?
        .close();
    Ok(seconds)
}

/// Looks up a file created by [`populate`] on a running server.
fn verify(addr: &str, files: u64, files_per_dir: u64) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let client = calm_client::Client::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let last = files - 1;
        let dir = client
            .lookup(ROOT, &dir_name(last / files_per_dir))
            .await
            .map_err(|e| e.to_string())?;
        client
            .lookup(dir.handle, &file_name(last))
            .await
            .map_err(|e| format!("file {last} missing after restart: {e}"))?;
        Ok(())
    })
}

/// Runs a create storm over gRPC against `addr` for `duration`, then returns without waiting
/// for the creates in flight (the caller kills the server under them).
fn storm(addr: &str, duration: Duration, round: usize) -> Result<u64, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let created = runtime.block_on(async {
        let client = calm_client::Client::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let dir = client
            .mkdir(ROOT, format!("storm{round}").as_bytes(), 0o755)
            .await
            .map_err(|e| format!("creating the storm's directory: {e}"))?;
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for c in 0..8u64 {
            let (client, count) = (client.clone(), count.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    if client
                        .create(dir.handle, format!("s{c}-{i}").as_bytes(), 0o644)
                        .await
                        .is_err()
                    {
                        break;
                    }
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(duration).await;
        Ok::<_, String>(count.load(std::sync::atomic::Ordering::Relaxed))
    })?;
    runtime.shutdown_background();
    Ok(created)
}

fn open_read_only(data: &Path) -> Result<LmdbStore, String> {
    let options = LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    };
    LmdbStore::open(data, &options).map_err(|e| e.to_string())
}

/// The seed's baseline: open the store and walk every inode to rebuild the ledger of used
/// handles (as free extents), the work PVFS2 did at each start.
fn scan_rebuild(data: &Path) -> Result<(Duration, u64), String> {
    let started = Instant::now();
    let store = open_read_only(data)?;
    let snap = store.snapshot().map_err(|e| e.to_string())?;
    let mut free_extents: Vec<(u64, u64)> = Vec::new();
    let mut expected_next = 0u64;
    let mut used = 0u64;
    snap.visit(&[TAG_INODE], &[TAG_INODE + 1], &mut |key, _| {
        if let Some(handle) = key_handle(key) {
            if handle > expected_next {
                free_extents.push((expected_next, handle - expected_next));
            }
            expected_next = handle + 1;
            used += 1;
        }
        std::ops::ControlFlow::Continue(())
    })
    .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(snap);
    store.close();
    std::hint::black_box(&free_extents);
    Ok((elapsed, used))
}

/// fsck over the whole store, as `calm fsck` does: (time, clean?).
fn fsck(data: &Path) -> Result<(Duration, bool), String> {
    let started = Instant::now();
    let store = open_read_only(data)?;
    let snap = store.snapshot().map_err(|e| e.to_string())?;
    let report = calm_meta::fsck::check(&snap, &mut |_| {}).map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    drop(snap);
    store.close();
    Ok((elapsed, report.is_clean()))
}

/// The median (upper median for an even count) and the maximum.
fn median_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the benchmark for every N of `options.files`.
pub fn run(options: &StartupOptions) -> Result<Vec<StartupResult>, String> {
    let mut results = Vec::new();
    for &files in &options.files {
        if files == 0 {
            return Err("--files values must be positive".into());
        }
        let work = tempfile::Builder::new()
            .prefix("calm-bench-startup-")
            .tempdir_in(&options.dir)
            .map_err(|e| format!("making a directory in {}: {e}", options.dir.display()))?;
        let data = work.path().join("data");
        let populate_seconds = populate(&data, files, options)?;

        let mut cold_cache = true;
        let (mut clean, mut killed, mut scans) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..options.repeat.max(1) {
            cold_cache &= crate::drop_caches();
            let server = start_server(&options.calm_exe, &data, options.wal)?;
            clean.push((ms(server.spawn_to_ready), server.server_ms));
            verify(&server.addr, files, options.files_per_dir)?;
            server.stop()?;

            let server = start_server(&options.calm_exe, &data, options.wal)?;
            storm(&server.addr, Duration::from_millis(500), round)?;
            server.kill9()?;
            cold_cache &= crate::drop_caches();
            let server = start_server(&options.calm_exe, &data, options.wal)?;
            killed.push((ms(server.spawn_to_ready), server.server_ms));
            verify(&server.addr, files, options.files_per_dir)?;
            server.stop()?;

            cold_cache &= crate::drop_caches();
            let (scan, used) = scan_rebuild(&data)?;
            if used < files {
                return Err(format!(
                    "the baseline scan saw {used} inodes, expected at least {files}"
                ));
            }
            scans.push(ms(scan));
        }
        cold_cache &= crate::drop_caches();
        let (fsck_time, fsck_clean) = fsck(&data)?;
        let store_bytes = std::fs::metadata(data.join("data.mdb")).map_or(0, |m| m.len());
        let (restart_ms, restart_ms_max) = median_max(clean.iter().map(|c| c.0));
        let (restart_after_kill_ms, restart_after_kill_ms_max) =
            median_max(killed.iter().map(|k| k.0));
        let (scan_rebuild_ms, scan_rebuild_ms_max) = median_max(scans.iter().copied());
        results.push(StartupResult {
            files,
            restart_ms,
            restart_after_kill_ms,
            scan_rebuild_ms,
            restart_ms_max,
            restart_after_kill_ms_max,
            scan_rebuild_ms_max,
            repeats: clean.len(),
            server_ready_ms: median_max(clean.iter().map(|c| c.1 as f64)).0 as u64,
            server_ready_after_kill_ms: median_max(killed.iter().map(|k| k.1 as f64)).0 as u64,
            scan_over_restart: scan_rebuild_ms / restart_ms.max(1e-9),
            store_bytes,
            populate_seconds,
            fsck_ms: ms(fsck_time),
            fsck_mb_per_s: store_bytes as f64 / 1e6 / fsck_time.as_secs_f64().max(1e-9),
            fsck_clean,
            cold_cache,
        });
    }
    Ok(results)
}

/// The results as a table for a terminal.
pub fn table(results: &[StartupResult]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>10} {:>11} {:>15} {:>16} {:>13} {:>9} {:>10} {:>8} {:>5}",
        "files",
        "restart ms",
        "after kill9 ms",
        "scan rebuild ms",
        "scan/restart",
        "store MB",
        "fsck MB/s",
        "fsck",
        "cold"
    )];
    for r in results {
        lines.push(format!(
            "{:>10} {:>11} {:>15} {:>16} {:>12.0}x {:>9.1} {:>10.0} {:>8} {:>5}",
            r.files,
            format!("{:.1} ({:.0})", r.restart_ms, r.restart_ms_max),
            format!(
                "{:.1} ({:.0})",
                r.restart_after_kill_ms, r.restart_after_kill_ms_max
            ),
            format!("{:.0} ({:.0})", r.scan_rebuild_ms, r.scan_rebuild_ms_max),
            r.scan_over_restart,
            r.store_bytes as f64 / 1e6,
            r.fsck_mb_per_s,
            if r.fsck_clean { "clean" } else { "DAMAGED" },
            r.cold_cache
        ));
    }
    lines.push("(medians of the repeats; the slowest in parentheses)".to_string());
    lines
}

/// Restart times over the file count, clean and after kill -9, each beside a server that
/// scans every file at start, as an SVG plot at `path`.
pub fn plot(results: &[StartupResult], path: &std::path::Path) -> Result<(), String> {
    let cell = |panel: &str, series: &str, r: &StartupResult, y: f64| {
        crate::multiples::Cell::at(panel, ("files", r.files as f64), ("ms to ready", y), series)
            .log()
    };
    let cells = results.iter().flat_map(|r| {
        [
            cell("restart after a clean stop", "calm", r, r.restart_ms),
            cell(
                "restart after a clean stop",
                "a full scan at start",
                r,
                r.scan_rebuild_ms,
            ),
            cell("restart after kill -9", "calm", r, r.restart_after_kill_ms),
            cell(
                "restart after kill -9",
                "a full scan at start",
                r,
                r.scan_rebuild_ms,
            ),
        ]
    });
    crate::multiples::small_multiples_svg(
        path,
        "calm-bench startup: restart to ready, cold cache",
        &crate::multiples::facets_of(cells),
    )
}
