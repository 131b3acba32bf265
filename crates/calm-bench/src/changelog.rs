//! Seed 003 (Lustre changelog, LU-17303): metadata rates with the changelog off, on with one
//! registered reader that never reads, and on with a reader that reads and clears in batches
//! while the operations run; the ratio on ÷ off per operation and client count. Then how fast
//! one reader drains a backlog, against the peak create rate.
//!
//! The three modes run side by side on three fresh stores, interleaved in short slices: each
//! phase is cut into [`SLICES`] slices, and slice k of every mode runs before slice k+1 of
//! any. Noise that lasts longer than a slice (this machine's fsync latency drifts by 2× over
//! seconds) then hits the three modes alike. Rounds are repeated and medians reported. Each
//! client works in a directory of its own.
//!
//! `calibrate` runs the same rounds with no reader anywhere: the three stores then do the
//! same work, so the ratios it reports are this machine's noise floor for the method (an
//! A/A test), the yardstick for the real ratios of the same day.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm_changelog::Mask;
use calm_meta::{Handle, Meta, MetaError, ROOT, SetAttr};
use calm_store::lmdb::LmdbStore;
use serde::Serialize;

use crate::mdtest::{open_meta, phase};

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
    /// min(on, on_reading) ÷ off, of the medians.
    pub ratio: f64,
    /// min(on, on_reading) ÷ off of each round, in run order: the spread of the ratio.
    pub round_ratios: Vec<f64>,
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
    pub results: Vec<ChangelogResult>,
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
pub const SLICES: u64 = 10;

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

/// A reader that follows the changelog as it is committed and clears in batches, until
/// `stop`.
async fn reading_reader(
    meta: Arc<Meta<LmdbStore>>,
    id: u32,
    stop: Arc<AtomicBool>,
    read: Arc<AtomicU64>,
) -> Result<(), String> {
    let mut next = 0;
    let (mut unclear, mut cleared_at) = (0u64, Instant::now());
    while !stop.load(Ordering::Relaxed) {
        let records = meta
            .changelog_read(next, READ_BATCH, usize::MAX, Some(id))
            .map_err(|e| e.to_string())?;
        match records.last() {
            Some(last) => {
                next = last.index + 1;
                unclear += records.len() as u64;
                read.fetch_add(records.len() as u64, Ordering::Relaxed);
            }
            None => {
                let last = meta.changelog_last();
                meta.changelog_wait(last, Duration::from_millis(20)).await;
            }
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

/// One round: the three modes on three stores, phases in [`OPS`] order, slices interleaved.
/// Returns ops/s as `[mode][op]`.
async fn interleaved_round(
    options: &ChangelogOptions,
    clients: usize,
) -> Result<[[f64; 6]; 3], String> {
    let per_client = per_client(options, clients);
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let mut stores = Vec::new();
    let mut readers = Vec::new();
    for mode in MODES {
        let (work, meta) = open_meta(&options.dir)?;
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
                )));
            }
        }
        let mut dirs = Vec::new();
        for c in 0..clients {
            let dir = meta.mkdir(ROOT, &dir_name(c), 0o755).await;
            dirs.push(dir.map_err(|e| e.to_string())?.handle);
        }
        stores.push((work, meta, Arc::new(dirs)));
    }
    let mut seconds = [[0.0f64; 6]; 3];
    for (k, op) in OPS.iter().enumerate() {
        for s in 0..SLICES {
            let (from, to) = (s * per_client / SLICES, (s + 1) * per_client / SLICES);
            for (m, (_, meta, dirs)) in stores.iter().enumerate() {
                seconds[m][k] += slice(meta, dirs, op, from, to).await?;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.map_err(|e| e.to_string())??;
    }
    let ops = (per_client * clients as u64) as f64;
    Ok(seconds.map(|row| row.map(|s| ops / s.max(1e-9))))
}

/// One reader drains a backlog of `records` records: read in batches, clear each batch.
async fn drain(options: &ChangelogOptions, records: u64) -> Result<f64, String> {
    let (_work, meta) = open_meta(&options.dir)?;
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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub fn run(options: &ChangelogOptions) -> Result<ChangelogReport, String> {
    if options.clients.is_empty() || options.clients.contains(&0) || options.repeat == 0 {
        return Err("--clients values and --repeat must be positive".into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    let mut peak_create: f64 = 0.0;
    for &clients in &options.clients {
        // rates[mode][op] over the repeats.
        let mut rates = vec![vec![Vec::new(); OPS.len()]; MODES.len()];
        for _ in 0..options.repeat {
            let round = runtime.block_on(interleaved_round(options, clients))?;
            for (m, row) in round.iter().enumerate() {
                for (k, rate) in row.iter().enumerate() {
                    rates[m][k].push(*rate);
                }
            }
        }
        let per_client = per_client(options, clients);
        for (k, op) in OPS.iter().enumerate() {
            let round_ratios = (0..options.repeat)
                .map(|r| rates[1][k][r].min(rates[2][k][r]) / rates[0][k][r])
                .collect();
            let off = median(&mut rates[0][k]);
            let on = median(&mut rates[1][k]);
            let on_reading = median(&mut rates[2][k]);
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
        results,
    })
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
            assert_eq!(r.round_ratios.len(), 2);
            assert!(r.round_ratios.iter().all(|x| x.is_finite() && *x > 0.0));
        }
        // The drain read every record of the backlog it made (64 writers, at least 64).
        assert_eq!(report.reader_records, 64);
        assert!(report.reader_records_per_sec > 0.0);
    }

    #[test]
    fn a_calibration_registers_no_reader_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(&options(true, dir.path())).unwrap();
        assert!(report.calibration);
        assert_eq!(report.results.len(), OPS.len() * 2);
    }
}
