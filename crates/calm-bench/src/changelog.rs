//! Seed 003 (Lustre changelog, LU-17303): metadata rates with the changelog off, on with one
//! registered reader that never reads, and on with a reader that reads and clears in batches
//! while the operations run; the ratio on ÷ off per operation and client count. Then how fast
//! one reader drains a backlog, against the peak create rate.
//!
//! The three modes run side by side on three fresh stores, interleaved in short slices: each
//! phase is cut into [`SLICES`] slices, and slice k of every mode runs before slice k+1 of
//! any. Noise that lasts longer than a slice (this machine's fsync latency drifts by 2× over
//! seconds) then hits the three modes alike; the modes take turns at going first. A mode's
//! rate is the median, over every slice of every round, of its slice rate divided by the
//! slice's common level (the geometric mean of the three modes' rates in that slice), times
//! the median common level ([`drift_free_rates`]): the drift the three slices of one index
//! share cancels out of every ratio, and a host stall that lands in one slice (this
//! machine's fsync sometimes takes tens of milliseconds) does not decide a ratio, while a cost
//! a mode has in most slices does. Measured with `--calibrate` (no reader anywhere, so every
//! ratio should be 1): the spread of the 24 ratios fell from a standard deviation of 0.018
//! (the medians of the raw slice rates, as before) to 0.012, and their mean rose from 0.985 to
//! 0.989 (the minimum of two noisy rates is biased low, less so with less noise). The ratio
//! of the raw medians and the ratio of total times are reported beside it. Each client works
//! in a directory of its own. Between rounds the file system is synced, so that removing one
//! round's stores is not paid by the next round's slices.
//!
//! The reading reader also measures how soon it holds each record: from the time the record
//! carries (its group's start, before the group's fsync) to the read returning it. That bounds
//! commit-to-visible from above for a following reader; the report gives its percentiles per
//! client count.
//!
//! `calibrate` runs the same rounds with no reader anywhere: the three stores then do the
//! same work, so the ratios it reports are this machine's noise floor for the method (an
//! A/A test), the yardstick for the real ratios of the same day.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use calm_changelog::Mask;
use calm_meta::{Follow, Handle, Meta, MetaError, ROOT, SetAttr};
use calm_store::lmdb::LmdbStore;
use serde::Serialize;

use crate::mdtest::{open_meta_with, phase};

#[derive(Debug, Clone)]
pub struct ChangelogOptions {
    pub clients: Vec<usize>,
    /// Operations per phase for one client; a run does `clients ×` this, at most `ops_max`.
    pub ops_per_client: u64,
    pub ops_max: u64,
    pub repeat: usize,
    pub dir: PathBuf,
    /// Register no reader in any mode (an A/A run measuring the method's noise).
    pub calibrate: bool,
    /// Open the stores with the write-ahead log (the default; false: LMDB's own commit).
    pub wal: bool,
}

pub const OPS: [&str; 6] = ["mkdir", "rmdir", "create", "setattr", "rename", "unlink"];
const MODES: [&str; 3] = ["off", "on", "on_reading"];
/// Records per read of the reading reader.
pub const READ_BATCH: usize = 4096;

#[derive(Debug, Clone, Serialize)]
pub struct ChangelogResult {
    pub op: &'static str,
    pub clients: usize,
    pub ops: u64,
    pub off_ops_per_sec: f64,
    pub on_ops_per_sec: f64,
    pub on_reading_ops_per_sec: f64,
    /// min(on, on_reading) ÷ off, of the three rates above (each a median of slice rates
    /// with the slices' common drift taken out; see the module comment).
    pub ratio: f64,
    /// The same of each round alone, in run order: the spread of the ratio.
    pub round_ratios: Vec<f64>,
    /// min(on, on_reading) ÷ off of the plain medians of the slice rates (the estimate used
    /// before the drift was taken out; noisier).
    pub raw_median_ratio: f64,
    /// min(on, on_reading) ÷ off of the total times (every slice of every round).
    pub mean_ratio: f64,
}

/// How soon the following reader held records, for one client count (every round).
#[derive(Debug, Clone, Serialize)]
pub struct FollowLatency {
    pub clients: usize,
    /// Records measured.
    pub records: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChangelogReport {
    pub bench: &'static str,
    /// One reader draining a backlog: records read and cleared per second.
    pub reader_records_per_sec: f64,
    pub reader_records: u64,
    /// The highest create rate of the run, any mode and client count.
    pub peak_create_ops_per_sec: f64,
    pub repeat: usize,
    /// No reader was registered in any mode: the ratios measure noise, not the changelog.
    pub calibration: bool,
    /// The stores committed through the write-ahead log.
    pub wal: bool,
    pub results: Vec<ChangelogResult>,
    /// From a record's group time to the following reader holding it (empty when
    /// calibrating: there is no reader).
    pub follow_latency: Vec<FollowLatency>,
}

fn dir_name(c: usize) -> Vec<u8> {
    format!("client.{c}").into_bytes()
}

fn name(i: u64) -> Vec<u8> {
    format!("f.{i}").into_bytes()
}

fn renamed(i: u64) -> Vec<u8> {
    format!("g.{i}").into_bytes()
}

/// Slices per phase (see the module comment).
pub const SLICES: u64 = 20;

/// Operation `op` on item `i` of a client's directory `dir`.
async fn one_op(meta: &Meta<LmdbStore>, op: &str, dir: Handle, i: u64) -> Result<(), MetaError> {
    match op {
        "mkdir" => meta.mkdir(dir, &name(i), 0o755).await.map(|_| ()),
        "rmdir" => meta.rmdir(dir, &name(i)).await,
        "create" => meta.create(dir, &name(i), 0o644).await.map(|_| ()),
        "setattr" => {
            let handle = meta.lookup(dir, &name(i))?.handle;
            let set = SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            };
            meta.setattr(handle, set).await.map(|_| ())
        }
        "rename" => meta.rename(dir, &name(i), dir, &renamed(i), 0).await,
        "unlink" => meta.unlink(dir, &renamed(i)).await,
        _ => Err(MetaError::Invalid(format!("unknown op {op}"))),
    }
}

/// Items `from..to` of every client, one task per client; returns seconds.
async fn slice(
    meta: &Arc<Meta<LmdbStore>>,
    dirs: &Arc<Vec<Handle>>,
    op: &'static str,
    from: u64,
    to: u64,
) -> Result<f64, String> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..dirs.len())
        .map(|c| {
            let (meta, dirs) = (meta.clone(), dirs.clone());
            tokio::spawn(async move {
                for i in from..to {
                    one_op(&meta, op, dirs[c], i).await?;
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

/// The reading reader clears once it has read this many records since its last clear, or
/// [`CLEAR_INTERVAL`] after it, as a consumer of a change feed does (robinhood, backup tools).
pub const CLEAR_RECORDS: u64 = 1024;
pub const CLEAR_INTERVAL: Duration = Duration::from_millis(100);

fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// A reader that follows the changelog as it is committed and clears in batches, until
/// `stop`; pushes to `latencies` each record's time from its group's start to being read, in
/// ns.
async fn reading_reader(
    meta: Arc<Meta<LmdbStore>>,
    id: u32,
    stop: Arc<AtomicBool>,
    read: Arc<AtomicU64>,
    latencies: Arc<Mutex<Vec<u64>>>,
) -> Result<(), String> {
    let mut next = 0;
    let (mut unclear, mut cleared_at) = (0u64, Instant::now());
    // Once stopped, read up to the last record before leaving, so that every record is measured.
    while !(stop.load(Ordering::Relaxed) && next > meta.changelog_last()) {
        // The follow read of `calm changelog read --follow` (batching, lingering).
        let records = meta
            .changelog_follow(
                next,
                READ_BATCH,
                usize::MAX,
                Some(id),
                Follow::batching(Duration::from_millis(20)),
            )
            .await
            .map_err(|e| e.to_string())?;
        match records.last() {
            Some(last) => {
                let now = wall_ns();
                latencies.lock().expect("latencies").extend(
                    records
                        .iter()
                        .map(|r| u64::try_from(now - r.time_ns).unwrap_or(0)),
                );
                next = last.index + 1;
                unclear += records.len() as u64;
                read.fetch_add(records.len() as u64, Ordering::Relaxed);
            }
            None if stop.load(Ordering::Relaxed) => break,
            None => {}
        }
        if unclear > 0 && (unclear >= CLEAR_RECORDS || cleared_at.elapsed() >= CLEAR_INTERVAL) {
            meta.changelog_clear(id, next - 1)
                .await
                .map_err(|e| e.to_string())?;
            (unclear, cleared_at) = (0, Instant::now());
        }
    }
    Ok(())
}

/// Operations per phase and client in a round of `clients`.
fn per_client(options: &ChangelogOptions, clients: usize) -> u64 {
    options
        .ops_per_client
        .min(options.ops_max / clients as u64)
        .max(SLICES)
}

/// What one round measured.
struct Round {
    /// Each slice's ops/s, as `[mode][op][slice]`.
    slice_rates: Vec<Vec<Vec<f64>>>,
    /// Total seconds as `[mode][op]`.
    seconds: [[f64; 6]; 3],
    /// The following reader's latencies, ns.
    latencies: Vec<u64>,
}

/// One round: the three modes on three stores, phases in [`OPS`] order, slices interleaved.
async fn interleaved_round(options: &ChangelogOptions, clients: usize) -> Result<Round, String> {
    let per_client = per_client(options, clients);
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let mut stores = Vec::new();
    let mut readers = Vec::new();
    for mode in MODES {
        let (work, meta) = open_meta_with(&options.dir, options.wal)?;
        if mode != "off" && !options.calibrate {
            let user = meta
                .changelog_register("bench", Mask::all())
                .await
                .map_err(|e| e.to_string())?;
            if mode == "on_reading" {
                readers.push(tokio::spawn(reading_reader(
                    meta.clone(),
                    user.id,
                    stop.clone(),
                    read.clone(),
                    latencies.clone(),
                )));
            }
        }
        let mut dirs = Vec::new();
        for c in 0..clients {
            let dir = meta.mkdir(ROOT, &dir_name(c), 0o755).await;
            dirs.push(dir.map_err(|e| e.to_string())?.handle);
        }
        // The namespace before its directory: a tuple drops its fields in order.
        stores.push((meta, Arc::new(dirs), work));
    }
    let mut seconds = [[0.0f64; 6]; 3];
    let mut slice_rates = vec![vec![Vec::new(); OPS.len()]; MODES.len()];
    for (k, op) in OPS.iter().enumerate() {
        for s in 0..SLICES {
            let (from, to) = (s * per_client / SLICES, (s + 1) * per_client / SLICES);
            // The modes take turns at going first, so that no mode always follows the same
            // one (whatever a mode leaves behind, the next one meets it alike).
            for turn in 0..MODES.len() {
                let m = (turn + s as usize) % MODES.len();
                let (meta, dirs, _) = &stores[m];
                let took = slice(meta, dirs, op, from, to).await?;
                seconds[m][k] += took;
                slice_rates[m][k].push(((to - from) * clients as u64) as f64 / took.max(1e-9));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.map_err(|e| e.to_string())??;
    }
    let latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    Ok(Round {
        slice_rates,
        seconds,
        latencies,
    })
}

/// The `q` quantile (0..=1) of sorted `values`, in ms.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at] as f64 / 1e6
}

/// One reader drains a backlog of `records` records: read in batches, clear each batch.
async fn drain(options: &ChangelogOptions, records: u64) -> Result<f64, String> {
    let (_work, meta) = open_meta_with(&options.dir, options.wal)?;
    let user = meta
        .changelog_register("drain", Mask::all())
        .await
        .map_err(|e| e.to_string())?;
    let dir = meta
        .mkdir(ROOT, b"backlog", 0o755)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let writers = 64u64;
    let m = meta.clone();
    phase(writers as usize, records / writers, move |c, i| {
        let m = m.clone();
        async move {
            m.create(dir, format!("{c}.{i}").as_bytes(), 0o644)
                .await
                .map(|_| ())
        }
    })
    .await?;
    let started = Instant::now();
    let mut next = 0;
    let mut total = 0u64;
    loop {
        let batch = meta
            .changelog_read(next, READ_BATCH, usize::MAX, Some(user.id))
            .map_err(|e| e.to_string())?;
        let Some(last) = batch.last() else { break };
        next = last.index + 1;
        total += batch.len() as u64;
        meta.changelog_clear(user.id, last.index)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// Waits until the file system under `dir` has written out everything before, the removal of
/// the round's three stores included (hundreds of MB: on a file system that discards freed
/// blocks at its journal commit, that commit otherwise lands in the next round's first
/// slices, whichever mode runs them).
fn settle(dir: &std::path::Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let dir_file =
        std::fs::File::open(dir).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    // SAFETY: syncfs reads nothing but the descriptor, which lives until the call returns.
    if unsafe { libc::syncfs(dir_file.as_raw_fd()) } != 0 {
        let error = std::io::Error::last_os_error();
        return Err(format!(
            "syncing the file system of {}: {error}",
            dir.display()
        ));
    }
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The three modes' rates from their slice rates (`rates[mode][slice]`, slice `s` of every
/// mode run back to back): each slice's rates are divided by the slice's common level (their
/// geometric mean), each mode's rate is the median of its quotients times the median level.
/// A factor common to the three rates of a slice (the machine's fsync latency drifting over
/// seconds) leaves the quotients, and so every ratio between the modes, unchanged.
pub fn drift_free_rates(rates: [&[f64]; 3]) -> [f64; 3] {
    let slices = rates.iter().map(|r| r.len()).min().unwrap_or(0);
    if slices == 0 {
        return [0.0; 3];
    }
    let mut levels: Vec<f64> = (0..slices)
        .map(|s| (rates[0][s] * rates[1][s] * rates[2][s]).cbrt().max(1e-12))
        .collect();
    let mut out = [0.0; 3];
    for (m, mode) in rates.iter().enumerate() {
        let mut quotients: Vec<f64> = (0..slices).map(|s| mode[s] / levels[s]).collect();
        out[m] = median(&mut quotients);
    }
    let level = median(&mut levels);
    out.map(|q| q * level)
}

pub fn run(options: &ChangelogOptions) -> Result<ChangelogReport, String> {
    if options.clients.is_empty() || options.clients.contains(&0) || options.repeat == 0 {
        return Err("--clients values and --repeat must be positive".into());
    }
    let runtime = crate::runtime()?;
    let mut results = Vec::new();
    let mut follow_latency = Vec::new();
    let mut peak_create: f64 = 0.0;
    for &clients in &options.clients {
        // Slice rates as [mode][op] over every round (in run order: slice s of the three
        // modes at the same place), each round's rates as [round][op][mode], and total
        // seconds as [mode][op].
        let mut slice_rates = vec![vec![Vec::new(); OPS.len()]; MODES.len()];
        let mut round_rates = Vec::new();
        let mut seconds = [[0.0f64; 6]; 3];
        let mut latencies = Vec::new();
        for _ in 0..options.repeat {
            let round = runtime.block_on(interleaved_round(options, clients))?;
            settle(&options.dir)?;
            latencies.extend(round.latencies);
            for (m, row) in round.slice_rates.iter().enumerate() {
                for (k, rates) in row.iter().enumerate() {
                    slice_rates[m][k].extend_from_slice(rates);
                    seconds[m][k] += round.seconds[m][k];
                }
            }
            let rates: [[f64; 3]; 6] = std::array::from_fn(|k| {
                drift_free_rates(std::array::from_fn(|m| &round.slice_rates[m][k][..]))
            });
            round_rates.push(rates);
        }
        if !latencies.is_empty() {
            latencies.sort_unstable();
            follow_latency.push(FollowLatency {
                clients,
                records: latencies.len() as u64,
                p50_ms: quantile_ms(&latencies, 0.5),
                p99_ms: quantile_ms(&latencies, 0.99),
                max_ms: quantile_ms(&latencies, 1.0),
            });
        }
        let per_client = per_client(options, clients);
        for (k, op) in OPS.iter().enumerate() {
            let round_ratios = round_rates
                .iter()
                .map(|r| r[k][1].min(r[k][2]) / r[k][0])
                .collect();
            let mean_ratio = seconds[0][k] / seconds[1][k].max(seconds[2][k]);
            let [off, on, on_reading] =
                drift_free_rates(std::array::from_fn(|m| &slice_rates[m][k][..]));
            let raw: [f64; 3] = std::array::from_fn(|m| median(&mut slice_rates[m][k].clone()));
            if *op == "create" {
                peak_create = peak_create.max(off).max(on).max(on_reading);
            }
            results.push(ChangelogResult {
                op,
                clients,
                ops: per_client * clients as u64,
                off_ops_per_sec: off,
                on_ops_per_sec: on,
                on_reading_ops_per_sec: on_reading,
                ratio: on.min(on_reading) / off,
                round_ratios,
                raw_median_ratio: raw[1].min(raw[2]) / raw[0],
                mean_ratio,
            });
        }
    }
    let reader_records = options.ops_max.max(64);
    let reader_records_per_sec = runtime.block_on(drain(options, reader_records))?;
    Ok(ChangelogReport {
        bench: "changelog",
        reader_records_per_sec,
        reader_records: reader_records / 64 * 64,
        peak_create_ops_per_sec: peak_create,
        repeat: options.repeat,
        calibration: options.calibrate,
        wal: options.wal,
        results,
        follow_latency,
    })
}

/// The report as a table for a terminal.
pub fn table(report: &ChangelogReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>8} {:>7} {:>7} {:>12} {:>12} {:>14} {:>7} {:>13}",
        "op", "clients", "ops", "off ops/s", "on ops/s", "reading ops/s", "ratio", "rounds"
    )];
    for r in &report.results {
        let (low, high) = r
            .round_ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        lines.push(format!(
            "{:>8} {:>7} {:>7} {:>12.0} {:>12.0} {:>14.0} {:>7.3} {:>6.3}-{:<6.3}",
            r.op,
            r.clients,
            r.ops,
            r.off_ops_per_sec,
            r.on_ops_per_sec,
            r.on_reading_ops_per_sec,
            r.ratio,
            low,
            high
        ));
    }
    if report.calibration {
        lines.push("calibration: no reader in any mode, the ratios are the method's noise".into());
    }
    lines.push(format!(
        "reader: {:.0} records/s read and cleared ({} records), {:.1}x the peak create rate {:.0}/s; medians of {} runs",
        report.reader_records_per_sec,
        report.reader_records,
        report.reader_records_per_sec / report.peak_create_ops_per_sec.max(1.0),
        report.peak_create_ops_per_sec,
        report.repeat
    ));
    lines
}

/// One panel per operation, its rate over clients with the change feed off, on with an idle
/// reader, and on with a reader reading and clearing (`--plot`).
pub fn facets(report: &ChangelogReport) -> Vec<crate::multiples::Facet> {
    let cells = report.results.iter().flat_map(|r| {
        [
            ("calm, change feed off", r.off_ops_per_sec),
            ("calm, feed on, idle reader", r.on_ops_per_sec),
            ("calm, feed on, reader reading", r.on_reading_ops_per_sec),
        ]
        .map(|(series, y)| {
            crate::multiples::Cell::at(
                r.op.to_string(),
                ("clients", r.clients as f64),
                ("operations/s", y),
                series,
            )
        })
    });
    crate::multiples::facets_of(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(calibrate: bool, dir: &std::path::Path) -> ChangelogOptions {
        ChangelogOptions {
            clients: vec![1, 3],
            ops_per_client: 20,
            ops_max: 60,
            repeat: 2,
            dir: dir.to_path_buf(),
            calibrate,
            wal: true,
        }
    }

    #[test]
    fn a_report_has_every_op_and_client_count_with_consistent_ratios() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(&options(false, dir.path())).unwrap();
        assert!(!report.calibration);
        assert_eq!(report.results.len(), OPS.len() * 2);
        for r in &report.results {
            assert_eq!(r.ops, 20 * r.clients as u64);
            assert!(r.off_ops_per_sec > 0.0 && r.on_ops_per_sec > 0.0);
            let expected = r.on_ops_per_sec.min(r.on_reading_ops_per_sec) / r.off_ops_per_sec;
            assert!((r.ratio - expected).abs() < 1e-9);
            assert!(r.mean_ratio.is_finite() && r.mean_ratio > 0.0);
            assert!(r.raw_median_ratio.is_finite() && r.raw_median_ratio > 0.0);
            assert_eq!(r.round_ratios.len(), 2);
            assert!(r.round_ratios.iter().all(|x| x.is_finite() && *x > 0.0));
        }
        // The following reader measured every record of every round: one per operation and
        // one per client directory.
        assert_eq!(report.follow_latency.len(), 2);
        for f in &report.follow_latency {
            assert_eq!(f.records, 2 * (6 * 20 + 1) * f.clients as u64);
            assert!(f.p50_ms <= f.p99_ms && f.p99_ms <= f.max_ms && f.max_ms < 60_000.0);
        }
        // The drain read every record of the backlog it made (64 writers, at least 64).
        assert_eq!(report.reader_records, 64);
        assert!(report.reader_records_per_sec > 0.0);
    }

    #[test]
    fn a_drift_common_to_a_slice_leaves_the_ratios_unchanged() {
        // Mode rates per slice with some noise, then a different factor for every slice
        // (the machine drifting): the ratios must not move.
        let off: Vec<f64> = (0..21)
            .map(|s| 1000.0 + f64::from(s * 37 % 11) * 9.0)
            .collect();
        let on: Vec<f64> = off
            .iter()
            .enumerate()
            .map(|(s, r)| r * (0.96 + (s * 7 % 5) as f64 * 0.01))
            .collect();
        let reading: Vec<f64> = off.iter().map(|r| r * 0.97).collect();
        let plain = drift_free_rates([&off, &on, &reading]);
        let drift = |rates: &[f64]| -> Vec<f64> {
            rates
                .iter()
                .enumerate()
                .map(|(s, r)| r * [0.5, 1.0, 2.0, 0.7, 1.6][s % 5])
                .collect()
        };
        let drifted = drift_free_rates([&drift(&off), &drift(&on), &drift(&reading)]);
        for m in 1..3 {
            let (a, b) = (plain[m] / plain[0], drifted[m] / drifted[0]);
            assert!((a - b).abs() < 1e-12, "mode {m}: {a} then {b}");
        }
        // A mode 0.97 of another in every slice is 0.97 of it.
        assert!((plain[2] / plain[0] - 0.97).abs() < 1e-12);
        // The plain medians move with the drift (what it did to the estimate before): the
        // ratio of the noisy mode's is not what it was without the drift.
        let raw = |rates: &[f64]| median(&mut rates.to_vec());
        let (before, after) = (raw(&on) / raw(&off), raw(&drift(&on)) / raw(&drift(&off)));
        assert!((before - after).abs() > 1e-3, "{before} then {after}");
    }

    #[test]
    fn a_calibration_registers_no_reader_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(&options(true, dir.path())).unwrap();
        assert!(report.calibration);
        assert_eq!(report.results.len(), OPS.len() * 2);
        assert!(report.follow_latency.is_empty());
    }
}
