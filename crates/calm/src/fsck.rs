//! `calm fsck DATA_DIR` or `calm fsck --store etcd://…`: read one snapshot of the store once in
//! key order with a progress bar, and report. Exit 0 when clean, 1 when damage was found, 2 when
//! the store cannot be read. A data directory's store is opened read-only, offline; one whose
//! write-ahead log holds commits after its last checkpoint (an unclean close) is recovered
//! first, as its next server would. A namespace on etcd is checked while its servers run: the
//! snapshot is every key at one revision of the cluster.

use std::path::Path;

use anyhow::{Context, anyhow};
use std::process::ExitCode;

use calm_store::Store;
use indicatif::{ProgressBar, ProgressStyle};

pub fn run(data: &Path, objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (store, replayed) = crate::gc::open_offline(data)?;
    if replayed > 0 && !json {
        eprintln!("recovered {replayed} commits from the write-ahead log");
    }
    check(&store, objects, json)
}

/// `calm fsck --store URL`: the namespace on an etcd cluster, servers running or not.
pub fn run_etcd(url: &str, objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let options = calm_store_etcd::EtcdOptions::from_url(url).map_err(|e| anyhow!(e))?;
    let store = calm_store_etcd::EtcdStore::connect(options)
        .with_context(|| format!("connecting to {url}"))?;
    // The servers compact history older than a few minutes; the check reads one revision for
    // as long as it takes.
    let _hold = store
        .hold_history()
        .with_context(|| format!("holding the history of {url} for the check"))?;
    check(&store, objects, json)
}

fn check<S: Store>(store: &S, objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let store_bytes = store.size_bytes()?;
    let bar = ProgressBar::new(store_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "fsck {bar:40} {bytes} of keys and values ({bytes_per_sec}), store file {total_bytes}",
        )
        .expect("valid template"),
    );
    let checked = calm_server::offline::check(store, objects, &mut |read| {
        bar.set_position(read.min(store_bytes))
    })?;
    bar.finish_and_clear();
    if json {
        let report = &checked.fsck;
        let audit = checked.audit.as_ref();
        let value = serde_json::json!({
            "clean": report.is_clean(),
            "keys": report.keys,
            "inodes": report.inodes,
            "directories": report.directories,
            "dentries": report.dentries,
            "xattrs": report.xattrs,
            "changelog_records": report.changelog_records,
            "changelog_readers": report.changelog_readers,
            "handle_high_water": report.handle_high_water,
            "bytes_read": report.bytes_read,
            "store_bytes": checked.store_bytes,
            "seconds": checked.seconds,
            "mb_per_s": checked.mb_per_s(),
            "problem_count": report.problem_count,
            "problems": report.problems,
            "chunks": report.chunks,
            "slice_records": report.slice_records,
            "slice_records_per_chunk_max": report.slice_records_per_chunk_max,
            "inline_slices": report.inline_slices,
            "objects": audit.map(|a| a.objects),
            "objects_named": audit.map(|a| a.referenced),
        });
        println!("{value}");
    } else {
        for line in checked.lines() {
            println!("{line}");
        }
    }
    Ok(if checked.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
