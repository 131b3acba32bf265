//! `calm-bench soak`: a file system used for long, as a site uses it. A `calm serve` and
//! several `calm mount`s of it (processes of their own) take, for N minutes and at once, from
//! every mount: appends of lines to one shared log (O_APPEND), small writes into one shared
//! 4 MiB database file each followed by fsync (each mount in pages of its own), sqlite
//! transactions on one shared database (rollback journal), and small files created and removed.
//! Reported per minute: each workload's operations per second and its ratio to the first
//! minute (the baseline of the same run: flat is the goal), its p99 latency, the most records a
//! hot file's chunk holds, and the memory of the server and of each mount. At the end every
//! workload's result is checked (every line of the log whole and there, the database file's
//! bytes equal to the writers' models, sqlite's rows and integrity), and the stopped store is
//! checked: clean, and no object that nothing names (`calm gc`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::procs::{MountProcess, ServerProcess, calm_json};

mod plot;
mod report;
pub use plot::plot;
pub use report::*;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Latencies, in logarithmic buckets 4% wide (from 1 µs to about an hour).
#[derive(Debug, Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

const BUCKET_GROWTH: f64 = 1.04;
const BUCKETS: usize = 600;

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    fn record(&mut self, latency: Duration) {
        let us = latency.as_secs_f64() * 1e6;
        let bucket = (us.max(1.0).ln() / BUCKET_GROWTH.ln()) as usize;
        self.counts[bucket.min(BUCKETS - 1)] += 1;
        self.total += 1;
    }

    /// The latency under which a fraction `q` of the samples fall, in ms (the bucket's top).
    fn quantile_ms(&self, q: f64) -> f64 {
        let want = (self.total as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= want.max(1) {
                return BUCKET_GROWTH.powi(bucket as i32 + 1) / 1e3;
            }
        }
        0.0
    }
}

/// Every workload's latencies, per period.
#[derive(Debug)]
struct Recorder {
    started: Instant,
    period: Duration,
    periods: u32,
    /// `[period][workload]`
    histograms: Mutex<Vec<Vec<Histogram>>>,
    failures: Mutex<Vec<String>>,
}

impl Recorder {
    fn record(&self, workload: usize, latency: Duration) {
        let period = (self.started.elapsed().as_secs_f64() / self.period.as_secs_f64()) as usize;
        if period < self.periods as usize {
            let mut histograms = lock(&self.histograms);
            histograms[period][workload].record(latency);
        }
    }

    fn failed(&self, what: String) {
        let mut failures = lock(&self.failures);
        if failures.len() < 100 {
            failures.push(what);
        }
    }

    fn running(&self) -> bool {
        self.started.elapsed() < self.period * self.periods
    }
}

/// Runs the benchmark.
pub fn run(options: &SoakOptions) -> Result<SoakReport, String> {
    if options.periods == 0 || options.mounts == 0 || options.period.is_zero() {
        return Err("at least one period, one mount and a period longer than 0".into());
    }
    crate::enter_private_namespace();
    let work = tempfile::Builder::new()
        .prefix("calm-bench-soak-")
        .tempdir_in(&options.dir)
        .map_err(|e| format!("{}: {e}", options.dir.display()))?;
    let data = work.path().join("data");
    let mut server_args = vec!["--delete-delay-s", "10"];
    if let Some(url) = &options.objects {
        server_args.extend(["--objects", url.as_str()]);
    }
    let server = ServerProcess::start(&options.calm, &data, &server_args)?;
    let mounts: Vec<MountProcess> = (0..options.mounts)
        .map(|m| {
            let point = work.path().join(format!("mnt{m}"));
            let cache = work.path().join(format!("cache{m}"));
            let cache = cache
                .to_str()
                .ok_or("a path that is not UTF-8")?
                .to_string();
            MountProcess::start(
                &options.calm,
                &point,
                &server.addr,
                &["--cache-dir", &cache],
            )
        })
        .collect::<Result<_, _>>()?;
    let points: Vec<PathBuf> = mounts.iter().map(|m| m.mountpoint.clone()).collect();
    prepare(&points)?;

    let recorder = Arc::new(Recorder {
        started: Instant::now(),
        period: options.period,
        periods: options.periods,
        histograms: Mutex::new(vec![
            vec![Histogram::new(); WORKLOADS.len()];
            options.periods as usize
        ]),
        failures: Mutex::new(Vec::new()),
    });
    let appended: Vec<Arc<AtomicU64>> = (0..options.mounts)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let committed = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let mut db_writers = Vec::new();
    for (m, point) in points.iter().enumerate() {
        let (r, p, n) = (recorder.clone(), point.clone(), appended[m].clone());
        workers.push(std::thread::spawn(move || appender(&r, &p, m, &n)));
        let (r, p) = (recorder.clone(), point.clone());
        let mounts = options.mounts as u64;
        db_writers.push(std::thread::spawn(move || {
            fsync_writer(&r, &p, m as u64, mounts)
        }));
        let (r, p, c) = (recorder.clone(), point.clone(), committed.clone());
        workers.push(std::thread::spawn(move || sqlite_writer(&r, &p, m, &c)));
        let (r, p) = (recorder.clone(), point.clone());
        workers.push(std::thread::spawn(move || creator(&r, &p, m)));
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime
        .block_on(calm_client::Client::connect(&server.addr))
        .map_err(|e| e.to_string())?;
    let bar = crate::progress(u64::from(options.periods), "soak periods");
    let mut samples = Vec::new();
    for period in 1..=options.periods {
        let end = recorder.started + options.period * period;
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        let figures = runtime.block_on(server_figures(&client));
        samples.push((
            figures,
            server.process.rss_bytes() as f64 / (1 << 20) as f64,
            server.process.anon_bytes() as f64 / (1 << 20) as f64,
            mounts
                .iter()
                .map(|m| m.process.rss_bytes() as f64 / (1 << 20) as f64)
                .collect::<Vec<_>>(),
            mounts
                .iter()
                .map(|m| m.process.anon_bytes() as f64 / (1 << 20) as f64)
                .collect::<Vec<_>>(),
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    for worker in workers {
        worker
            .join()
            .map_err(|_| "a workload's thread panicked".to_string())?;
    }
    let mut models = Vec::new();
    for writer in db_writers {
        models.push(
            writer
                .join()
                .map_err(|_| "a database writer's thread panicked".to_string())?,
        );
    }

    // The checks, through the first mount.
    let counts: Vec<u64> = appended.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let (log_lines, log_lines_bad) = check_log(&points[0].join("log"), &counts)?;
    let db_pages_differing = check_db(&points[0].join("db"), &models)?;
    let (sqlite_rows, sqlite_integrity) = check_sqlite(&points[0].join("app.db"))?;
    // The client's connection goes with its runtime: a server stops once its clients left.
    drop(client);
    drop(runtime);
    for mount in mounts {
        mount.process.stop()?;
    }
    server.process.stop()?;
    let data_arg = data.to_str().ok_or("a path that is not UTF-8")?;
    let fsck = calm_json(&options.calm, &["fsck", data_arg, "--json"])?;
    let gc = calm_json(&options.calm, &["gc", data_arg, "--grace-s", "0", "--json"])?;

    let failures = lock(&recorder.failures).clone();
    let histograms = lock(&recorder.histograms).clone();
    let seconds = options.period.as_secs_f64();
    let first: Vec<f64> = histograms[0]
        .iter()
        .map(|h| h.total as f64 / seconds)
        .collect();
    let periods = histograms
        .iter()
        .zip(samples)
        .enumerate()
        .map(
            |(i, (workloads, (figures, server_mib, server_anon, mount_mib, mount_anon)))| {
                PeriodFigures {
                    period: i as u32 + 1,
                    workloads: workloads
                        .iter()
                        .enumerate()
                        .map(|(w, h)| {
                            let ops_per_s = h.total as f64 / seconds;
                            WorkloadFigures {
                                workload: WORKLOADS[w].into(),
                                ops: h.total,
                                ops_per_s,
                                ratio_to_first: ops_per_s / first[w].max(1e-9),
                                p50_ms: h.quantile_ms(0.5),
                                p99_ms: h.quantile_ms(0.99),
                            }
                        })
                        .collect(),
                    records_per_chunk: figures.records,
                    records_per_chunk_high: figures.records_high,
                    server_rss_mib: server_mib,
                    server_anon_mib: server_anon,
                    server_heap_in_use_mib: figures.heap_in_use as f64 / (1 << 20) as f64,
                    server_heap_free_mib: figures.heap_free as f64 / (1 << 20) as f64,
                    server_cached_mib: figures.cached as f64 / (1 << 20) as f64,
                    mount_rss_mib: mount_mib,
                    mount_anon_mib: mount_anon,
                }
            },
        )
        .collect();
    Ok(SoakReport {
        bench: "soak".into(),
        period_s: seconds,
        mounts: options.mounts,
        objects: options
            .objects
            .clone()
            .unwrap_or_else(|| "a local directory".into()),
        periods,
        checks: SoakChecks {
            log_lines,
            log_lines_bad,
            db_pages_differing,
            sqlite_rows,
            sqlite_rows_expected: committed.load(Ordering::Relaxed),
            sqlite_integrity,
            store_clean: fsck["clean"] == true,
            objects_leaked: gc["leaked"].as_u64().unwrap_or(u64::MAX),
            records_per_chunk_max: fsck["slice_records_per_chunk_max"].as_u64().unwrap_or(0),
            failures,
        },
    })
}

/// The shared files (the log, the database file of zeros, sqlite's database), and each mount's
/// directory of [`FILES_KEPT`] small files, so that every timed create also removes one.
fn prepare(points: &[PathBuf]) -> Result<(), String> {
    for (mount, point) in points.iter().enumerate() {
        let dir = point.join(format!("files{mount}"));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for n in 0..FILES_KEPT {
            let path = dir.join(n.to_string());
            std::fs::write(&path, [b'f'; 4096]).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let point = &points[0];
    std::fs::File::create(point.join("log")).map_err(|e| format!("the log: {e}"))?;
    let db = std::fs::File::create(point.join("db")).map_err(|e| format!("the db: {e}"))?;
    db.set_len(DB_PAGES * PAGE_BYTES)
        .and_then(|()| db.sync_all())
        .map_err(|e| format!("the db: {e}"))?;
    let out = std::process::Command::new("python3")
        .args(["-c", SQLITE_INIT])
        .arg(point.join("app.db"))
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "making the sqlite database: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn line(mount: usize, n: u64) -> Vec<u8> {
    let mut text = format!("m{mount} {n:012} ").into_bytes();
    let fill = b'a' + (n % 26) as u8;
    text.resize(LINE_BYTES - 1, fill);
    text.push(b'\n');
    text
}

/// Appends lines to the shared log until the run ends.
fn appender(recorder: &Recorder, point: &Path, mount: usize, appended: &AtomicU64) {
    let log = match std::fs::OpenOptions::new()
        .append(true)
        .open(point.join("log"))
    {
        Ok(file) => file,
        Err(e) => return recorder.failed(format!("opening the log: {e}")),
    };
    let mut n = 0;
    while recorder.running() {
        let started = Instant::now();
        if let Err(e) = (&log).write_all(&line(mount, n)) {
            return recorder.failed(format!("append {n} on mount {mount}: {e}"));
        }
        recorder.record(0, started.elapsed());
        n += 1;
        appended.store(n, Ordering::Relaxed);
    }
}

/// Small writes at random places of this mount's pages of the database file, each followed
/// by fsync, until the run ends; returns the pages written, as they should read.
fn fsync_writer(recorder: &Recorder, point: &Path, mount: u64, mounts: u64) -> Vec<(u64, Vec<u8>)> {
    let mut models: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
    let db = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(point.join("db"))
    {
        Ok(file) => file,
        Err(e) => {
            recorder.failed(format!("opening the database file: {e}"));
            return Vec::new();
        }
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ mount;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    let mut done = 0;
    while recorder.running() {
        let page = (next() % (DB_PAGES / mounts)) * mounts + mount;
        let len = 1 + next() % 200;
        let at = next() % (PAGE_BYTES - len);
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let started = Instant::now();
        let written = db
            .write_all_at(&bytes, page * PAGE_BYTES + at)
            .and_then(|()| db.sync_data());
        if let Err(e) = written {
            recorder.failed(format!("fsync'd write {done} on mount {mount}: {e}"));
            break;
        }
        recorder.record(1, started.elapsed());
        let model = models
            .entry(page)
            .or_insert_with(|| vec![0; PAGE_BYTES as usize]);
        model[at as usize..(at + len) as usize].copy_from_slice(&bytes);
        done += 1;
    }
    models.into_iter().collect()
}

const SQLITE_INIT: &str = "import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute('CREATE TABLE t (mount INTEGER, n INTEGER, v BLOB)')
db.close()";

/// One transaction per line read on stdin ('q' ends it); prints the microseconds each took.
const SQLITE_WRITER: &str = "import os, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=600, isolation_level=None)
mount, n = int(sys.argv[2]), 0
for command in sys.stdin:
    if command.startswith('q'):
        break
    started = time.monotonic()
    db.execute('BEGIN IMMEDIATE')
    db.execute('INSERT INTO t VALUES (?, ?, ?)', (mount, n, os.urandom(100)))
    db.execute('COMMIT')
    n += 1
    print(int((time.monotonic() - started) * 1e6), flush=True)
db.close()
print('done', n, flush=True)";

/// sqlite transactions on the shared database until the run ends (a python3 process doing
/// them, one per request).
fn sqlite_writer(recorder: &Recorder, point: &Path, mount: usize, committed: &AtomicU64) {
    let child = std::process::Command::new("python3")
        .args(["-c", SQLITE_WRITER])
        .arg(point.join("app.db"))
        .arg(mount.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return recorder.failed(format!("python3: {e}")),
    };
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    while recorder.running() {
        if stdin
            .write_all(b"t\n")
            .and_then(|()| stdin.flush())
            .is_err()
        {
            break;
        }
        match lines.next() {
            Some(Ok(us)) => match us.parse::<u64>() {
                Ok(us) => {
                    recorder.record(2, Duration::from_micros(us));
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    recorder.failed(format!("sqlite on mount {mount}: {us}"));
                    break;
                }
            },
            _ => {
                recorder.failed(format!("sqlite on mount {mount} ended"));
                break;
            }
        }
    }
    let _ = stdin.write_all(b"q\n");
    drop(stdin);
    let _ = child.wait();
}

/// Small files made (4 KiB written, closed), each removing the oldest of the last
/// [`FILES_KEPT`] (made by [`prepare`] before the run), until the run ends.
fn creator(recorder: &Recorder, point: &Path, mount: usize) {
    let dir = point.join(format!("files{mount}"));
    let data = vec![b'f'; 4096];
    let mut n = FILES_KEPT;
    while recorder.running() {
        let started = Instant::now();
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(dir.join(n.to_string()))
            .and_then(|mut f| f.write_all(&data));
        let removed = std::fs::remove_file(dir.join((n - FILES_KEPT).to_string()));
        if let Err(e) = made.and(removed) {
            return recorder.failed(format!("file {n} on mount {mount}: {e}"));
        }
        recorder.record(3, started.elapsed());
        n += 1;
    }
}

/// What a period's end asks the server.
#[derive(Debug, Default)]
struct ServerFigures {
    /// The most records a chunk of the hot files holds now.
    records: u64,
    /// The server's high-water mark of records in a chunk.
    records_high: u64,
    heap_in_use: u64,
    heap_free: u64,
    cached: u64,
}

async fn server_figures(client: &calm_client::Client) -> ServerFigures {
    let mut most = 0;
    for name in ["log", "db", "app.db", "app.db-journal"] {
        let Ok(attr) = client.lookup(calm_meta::ROOT, name.as_bytes()).await else {
            continue;
        };
        if let Ok(map) = client.read_map(attr.handle).await {
            let records = map.chunks.iter().map(|(_, r)| r.len() as u64).max();
            most = most.max(records.unwrap_or(0));
        }
    }
    let status = client.status().await.unwrap_or_default();
    ServerFigures {
        records: most,
        records_high: status.chunk_records_max,
        heap_in_use: status.heap_in_use_bytes,
        heap_free: status.heap_free_bytes,
        cached: status.cached_block_bytes + status.cached_header_bytes,
    }
}

/// Every line of the log whole, each mount's lines all there and in their order: (lines,
/// lines that are not).
fn check_log(path: &Path, appended: &[u64]) -> Result<(u64, u64), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("the log: {e}"))?;
    let mut next = vec![0u64; appended.len()];
    let (mut lines, mut bad) = (0, 0);
    for text in BufReader::with_capacity(1 << 20, file).split(b'\n') {
        let mut text = text.map_err(|e| format!("reading the log: {e}"))?;
        text.push(b'\n');
        lines += 1;
        let parsed = std::str::from_utf8(&text).ok().and_then(|t| {
            let mount: usize = t.get(1..t.find(' ')?)?.parse().ok()?;
            let n: u64 = t.split(' ').nth(1)?.parse().ok()?;
            Some((mount, n))
        });
        match parsed {
            Some((mount, n))
                if mount < next.len() && next[mount] == n && text == line(mount, n) =>
            {
                next[mount] += 1
            }
            _ => bad += 1,
        }
    }
    let missing: u64 = appended
        .iter()
        .zip(&next)
        .map(|(want, got)| want.saturating_sub(*got))
        .sum();
    Ok((lines, bad + missing))
}

/// Pages of the database file that differ from what the writers wrote.
fn check_db(path: &Path, models: &[Vec<(u64, Vec<u8>)>]) -> Result<u64, String> {
    let db = std::fs::File::open(path).map_err(|e| format!("the db: {e}"))?;
    let mut differing = 0;
    let mut page = vec![0u8; PAGE_BYTES as usize];
    for model in models {
        for (index, want) in model {
            db.read_exact_at(&mut page, index * PAGE_BYTES)
                .map_err(|e| format!("reading the db: {e}"))?;
            if &page != want {
                differing += 1;
            }
        }
    }
    Ok(differing)
}

/// sqlite's rows and integrity_check.
fn check_sqlite(path: &Path) -> Result<(u64, String), String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=600)
print(db.execute('SELECT COUNT(*) FROM t').fetchone()[0])
print(db.execute('PRAGMA integrity_check').fetchone()[0])",
        ])
        .arg(path)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let rows = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| format!("sqlite check: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((rows, lines.next().unwrap_or("").to_string()))
}
