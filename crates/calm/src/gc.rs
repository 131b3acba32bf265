//! `calm gc DATA_DIR`: the objects no file names any more (calm-server's `offline`), listed and
//! with `--delete` removed. Offline, as fsck: the store is opened read-only (recovered first if
//! it was not closed cleanly).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
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

pub fn run(data: &Path, grace_s: u64, delete: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (store, _) = open_offline(data)?;
    let report = calm_server::offline::collect_garbage(&store, grace_s, delete)?;
    if json {
        let audit = &report.audit;
        let value = serde_json::json!({
            "objects": audit.objects,
            "bytes": audit.bytes,
            "referenced_slices": audit.referenced,
            "queued_slices": audit.queued,
            "queued_gone": audit.queued_gone,
            "leaked": audit.leaked.len(),
            "leaked_bytes": audit.leaked_bytes(),
            "young": audit.young,
            "deleted": report.deleted,
            "unfinished": report.unfinished.len(),
            "unfinished_bytes": report.unfinished_bytes(),
            "unfinished_deleted": report.unfinished_deleted,
            "missing": audit.missing.len(),
            "wrong_length": audit.wrong_length.len(),
        });
        println!("{value}");
    } else {
        for line in report.lines() {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
