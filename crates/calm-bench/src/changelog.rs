//! Seed 003 (Lustre changelog, LU-17303): metadata rates with the changelog off, on with one
//! registered reader that never reads, and on with a reader that reads and clears in batches
//! while the operations run; the ratio on ÷ off per operation and client count. Then how fast
//! one reader drains a backlog, against the peak create rate.
//!
//! Each (clients, mode) run gets a fresh store; runs of the three modes are interleaved and
//! repeated, and the median of the repeats is reported, because this machine's noise is as
//! large as the effect measured. Each client works in a directory of its own.

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
    /// min(on, on_reading) ÷ off.
    pub ratio: f64,
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

/// Runs the six phases; returns ops/s per phase, in [`OPS`] order.
async fn phases(
    meta: &Arc<Meta<LmdbStore>>,
    clients: usize,
    per_client: u64,
) -> Result<[f64; 6], String> {
    let mut dirs: Vec<Handle> = Vec::new();
    for c in 0..clients {
        dirs.push(
            meta.mkdir(ROOT, &dir_name(c), 0o755)
                .await
                .map_err(|e| e.to_string())?
                .handle,
        );
    }
    let dirs = Arc::new(dirs);
    let ops = (per_client * clients as u64) as f64;
    let mut rates = [0.0; 6];
    for (k, op) in OPS.iter().enumerate() {
        let (m, d) = (meta.clone(), dirs.clone());
        let run = move |c: usize, i: u64| {
            let (m, d) = (m.clone(), d.clone());
            async move {
                let dir = d[c];
                match *op {
                    "mkdir" => m.mkdir(dir, &name(i), 0o755).await.map(|_| ()),
                    "rmdir" => m.rmdir(dir, &name(i)).await,
                    "create" => m.create(dir, &name(i), 0o644).await.map(|_| ()),
                    "setattr" => {
                        let handle = m.lookup(dir, &name(i))?.handle;
                        let set = SetAttr {
                            mode: Some(0o600),
                            ..SetAttr::default()
                        };
                        m.setattr(handle, set).await.map(|_| ())
                    }
                    "rename" => m.rename(dir, &name(i), dir, &renamed(i), 0).await,
                    "unlink" => m.unlink(dir, &renamed(i)).await,
                    _ => Err(MetaError::Invalid(format!("unknown op {op}"))),
                }
            }
        };
        let seconds = phase(clients, per_client, run).await?;
        rates[k] = ops / seconds.max(1e-9);
    }
    Ok(rates)
}

/// A reader that reads what is committed and clears it, batch by batch, until `stop`.
async fn reading_reader(
    meta: Arc<Meta<LmdbStore>>,
    id: u32,
    stop: Arc<AtomicBool>,
    read: Arc<AtomicU64>,
) -> Result<(), String> {
    let mut next = 0;
    while !stop.load(Ordering::Relaxed) {
        let records = meta
            .changelog_read(next, READ_BATCH, usize::MAX, Some(id))
            .map_err(|e| e.to_string())?;
        match records.last() {
            Some(last) => {
                next = last.index + 1;
                read.fetch_add(records.len() as u64, Ordering::Relaxed);
                meta.changelog_clear(id, last.index)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            None => {
                let last = meta.changelog_last();
                meta.changelog_wait(last, Duration::from_millis(50)).await;
            }
        }
    }
    Ok(())
}

async fn one_run(
    options: &ChangelogOptions,
    clients: usize,
    mode: &str,
) -> Result<[f64; 6], String> {
    let (_work, meta) = open_meta(&options.dir)?;
    let per_client = options
        .ops_per_client
        .min(options.ops_max / clients as u64)
        .max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let mut reader = None;
    if mode != "off" {
        let user = meta
            .changelog_register("bench", Mask::all())
            .await
            .map_err(|e| e.to_string())?;
        if mode == "on_reading" {
            reader = Some(tokio::spawn(reading_reader(
                meta.clone(),
                user.id,
                stop.clone(),
                read.clone(),
            )));
        }
    }
    let rates = phases(&meta, clients, per_client).await?;
    stop.store(true, Ordering::Relaxed);
    if let Some(reader) = reader {
        reader.await.map_err(|e| e.to_string())??;
    }
    Ok(rates)
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
            for (m, mode) in MODES.iter().enumerate() {
                let run = runtime.block_on(one_run(options, clients, mode))?;
                for (k, rate) in run.iter().enumerate() {
                    rates[m][k].push(*rate);
                }
            }
        }
        let per_client = options
            .ops_per_client
            .min(options.ops_max / clients as u64)
            .max(1);
        for (k, op) in OPS.iter().enumerate() {
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
        results,
    })
}
