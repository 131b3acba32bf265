//! `calm fsck DATA_DIR` or `calm fsck --store etcd://…`: read one snapshot of the store once in
//! key order with a progress bar, and report. Exit 0 when clean, 1 when damage was found, 2 when
//! the store cannot be read. A data directory's store is opened read-only, offline; one whose
//! write-ahead log holds commits after its last checkpoint (an unclean close) is recovered
//! first, as its next server would. A namespace on etcd is checked while its servers run: the
//! snapshot is every key at one revision of the cluster. A namespace over several metadata
//! clusters (`--store` once per cluster) is checked cluster by cluster, then as one namespace.

use std::path::Path;

use anyhow::Context;
use std::process::ExitCode;

use crate::stores::{OnStore, StoreAt};
use calm_store::Store;
use indicatif::{ProgressBar, ProgressStyle};

pub fn run(data: &Path, objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    crate::stores::read(StoreAt::Dir(data), json, Check { objects, json })
}

/// The check of one store, whichever kind it is.
struct Check {
    objects: bool,
    json: bool,
}

impl OnStore for Check {
    type Out = ExitCode;
    fn run<S: Store>(self, store: &S) -> anyhow::Result<ExitCode> {
        check(store, self.objects, self.json)
    }
}

/// `calm fsck --store URL …`: the namespace on an etcd cluster, or over several (one URL per
/// cluster, cluster 0 first), servers running or not.
pub fn run_etcd(urls: &[String], objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let mut stores = Vec::with_capacity(urls.len());
    let mut holds = Vec::with_capacity(urls.len());
    for url in urls {
        let store = crate::stores::connect_etcd(url)?;
        // The servers compact history older than a minute; the check reads one revision of
        // each cluster for as long as it takes.
        holds.push(
            store
                .hold_history()
                .with_context(|| format!("holding the history of {url} for the check"))?,
        );
        stores.push(store);
    }
    match stores.as_slice() {
        [store] => check(store, objects, json),
        _ => check_clusters(&stores, objects, json),
    }
}

fn bar(store_bytes: u64) -> ProgressBar {
    let bar = ProgressBar::new(store_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "fsck {bar:40} {bytes} of keys and values ({bytes_per_sec}), store file {total_bytes}",
        )
        .expect("valid template"),
    );
    bar
}

fn exit_code(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn check<S: Store>(store: &S, objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let store_bytes = store.size_bytes()?;
    let bar = bar(store_bytes);
    let checked = calm_server::offline::check(store, objects, &mut |read| {
        bar.set_position(read.min(store_bytes))
    })?;
    bar.finish_and_clear();
    if json {
        println!("{}", report_json(&checked));
    } else {
        for line in checked.lines() {
            println!("{line}");
        }
    }
    Ok(exit_code(checked.is_clean()))
}

/// Every cluster's store checked, then the clusters as one namespace; each cluster's bar in
/// turn.
fn check_clusters<S: Store>(stores: &[S], objects: bool, json: bool) -> anyhow::Result<ExitCode> {
    let sizes = stores
        .iter()
        .map(|s| s.size_bytes())
        .collect::<Result<Vec<_>, _>>()?;
    let mut current: Option<(usize, ProgressBar)> = None;
    let checked = calm_server::offline::check_clusters(stores, objects, &mut |cluster, read| {
        if current.as_ref().is_none_or(|(at, _)| *at != cluster) {
            if let Some((_, done)) = current.take() {
                done.finish_and_clear();
            }
            current = Some((cluster, bar(sizes[cluster])));
        }
        if let Some((_, bar)) = &current {
            bar.set_position(read.min(sizes[cluster]));
        }
    })?;
    if let Some((_, done)) = current.take() {
        done.finish_and_clear();
    }
    if json {
        let (inodes, names) = checked.inodes_and_names();
        let value = serde_json::json!({
            "clean": checked.is_clean(),
            "inodes": inodes,
            "dentries": names,
            "clusters": checked.clusters.iter().map(report_json).collect::<Vec<_>>(),
            "problems": checked.problems,
        });
        println!("{value}");
    } else {
        for line in checked.lines() {
            println!("{line}");
        }
    }
    Ok(exit_code(checked.is_clean()))
}

/// One store's report as JSON.
fn report_json(checked: &calm_server::offline::CheckReport) -> serde_json::Value {
    let report = &checked.fsck;
    let audit = checked.audit.as_ref();
    serde_json::json!({
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
    })
}
