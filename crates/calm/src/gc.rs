//! `calm gc DATA_DIR` and the object check of `calm fsck --objects`: the namespace's object
//! store against what its metadata names (calm-data's audit). Offline, as fsck: the store is
//! opened read-only (recovered first if it was not closed cleanly).

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use calm_data::Objects;
use calm_data::audit::{Audit, audit, delete_leaked, stale_unfinished};
use calm_store::Store;
use calm_store::lmdb::{LmdbOptions, LmdbStore};

/// Opens the store in `data` read-only, after replaying what its log holds.
pub fn open_offline(data: &Path) -> anyhow::Result<(LmdbStore, usize)> {
    let replayed = LmdbStore::recover_log(data)
        .with_context(|| format!("recovering the store in {}", data.display()))?;
    let options = LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(data, &options)
        .with_context(|| format!("opening the store in {}", data.display()))?;
    Ok((store, replayed))
}

/// The audit of the store's objects against its metadata.
pub fn audit_objects<S: Store>(store: &S, grace_ms: i64) -> anyhow::Result<(Objects, Audit)> {
    let snapshot = store.snapshot()?;
    let url = calm_meta::data::objects_url(&snapshot)?
        .ok_or_else(|| anyhow!("this namespace names no object store"))?;
    let (referenced, _) = calm_meta::data::referenced_objects(&snapshot)?;
    drop(snapshot);
    let objects = Objects::open(&url).with_context(|| format!("opening the object store {url}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = runtime
        .block_on(objects.list())
        .with_context(|| format!("listing {url}"))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    Ok((objects, audit(&referenced, &listed, now_ms, grace_ms)))
}

/// The object check's lines for fsck's report: problems, each a sentence.
pub fn problems(report: &Audit) -> Vec<String> {
    let mut out = Vec::new();
    for (id, block) in &report.missing {
        out.push(format!("block {block} of slice {id} is named but missing"));
    }
    for (id, block, len, want) in &report.wrong_length {
        out.push(format!(
            "block {block} of slice {id} is {len} bytes long, not {want}"
        ));
    }
    out
}

pub fn run(data: &Path, grace_s: u64, delete: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (store, _) = open_offline(data)?;
    let grace_ms = (grace_s.min(i64::MAX as u64 / 1000) * 1000) as i64;
    let (objects, report) = audit_objects(&store, grace_ms)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let unfinished = stale_unfinished(
        runtime
            .block_on(objects.unfinished())
            .context("listing unfinished writes")?,
        now_ms,
        grace_ms,
    );
    let unfinished_bytes: u64 = unfinished.iter().map(|u| u.len).sum();
    let mut deleted = 0;
    let mut unfinished_deleted = 0;
    if delete {
        deleted = runtime
            .block_on(delete_leaked(&objects, &report))
            .context("deleting leaked objects")?;
        for u in &unfinished {
            runtime
                .block_on(objects.delete_unfinished(u))
                .context("deleting an unfinished write")?;
            unfinished_deleted += 1;
        }
    }
    if json {
        let value = serde_json::json!({
            "objects": report.objects,
            "bytes": report.bytes,
            "referenced_slices": report.referenced,
            "leaked": report.leaked.len(),
            "leaked_bytes": report.leaked_bytes(),
            "young": report.young,
            "deleted": deleted,
            "unfinished": unfinished.len(),
            "unfinished_bytes": unfinished_bytes,
            "unfinished_deleted": unfinished_deleted,
            "missing": report.missing.len(),
            "wrong_length": report.wrong_length.len(),
        });
        println!("{value}");
    } else {
        println!(
            "{} objects ({:.1} MB) in {}; {} slices named by the metadata",
            report.objects,
            report.bytes as f64 / 1e6,
            objects.url(),
            report.referenced
        );
        println!(
            "{} leaked objects ({:.1} MB) older than {grace_s} s; {} younger left alone",
            report.leaked.len(),
            report.leaked_bytes() as f64 / 1e6,
            report.young
        );
        for object in report.leaked.iter().take(20) {
            println!(
                "  slice {} block {} ({} bytes)",
                object.id, object.block, object.len
            );
        }
        println!(
            "{} unfinished writes ({:.1} MB) older than {grace_s} s (staging files of writes \
             that died before their rename)",
            unfinished.len(),
            unfinished_bytes as f64 / 1e6
        );
        if delete {
            println!("deleted {deleted} objects and {unfinished_deleted} unfinished writes");
        } else if !report.leaked.is_empty() || !unfinished.is_empty() {
            println!("(calm gc --delete removes them)");
        }
        for problem in problems(&report) {
            println!("PROBLEM: {problem} (calm fsck --objects reports it)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
