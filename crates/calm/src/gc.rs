//! `calm gc DATA_DIR`: the objects no file names any more (calm-server's `offline`), listed and
//! with `--delete` removed. Offline, as fsck: the store is opened read-only (recovered first if
//! it was not closed cleanly). `calm gc --server ADDR`: the same done by a running server
//! (calm-server's `protect::collect_online`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

pub fn run(data: &Path, grace_s: u64, delete: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (store, _) = crate::stores::open_offline(data)?;
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

/// `calm gc --server ADDR`: the same, by the running server.
pub fn run_online(
    server: &str,
    grace_s: u64,
    delete: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reply = runtime
        .block_on(async {
            let client = calm_client::Client::connect(server).await?;
            client.gc(grace_s, delete).await
        })
        .with_context(|| format!("asking {server} to collect unnamed objects"))?;
    if json {
        let value = serde_json::json!({
            "objects": reply.objects,
            "bytes": reply.bytes,
            "referenced_slices": reply.referenced,
            "leaked": reply.leaked,
            "leaked_bytes": reply.leaked_bytes,
            "young": reply.young,
            "deleted": reply.deleted,
            "named_after_all": reply.named_after_all,
        });
        println!("{value}");
    } else {
        println!(
            "{} objects ({:.1} MB); {} slices named by the metadata",
            reply.objects,
            reply.bytes as f64 / 1e6,
            reply.referenced
        );
        println!(
            "{} leaked objects ({:.1} MB) older than {grace_s} s; {} younger left alone",
            reply.leaked,
            reply.leaked_bytes as f64 / 1e6,
            reply.young
        );
        if delete {
            println!(
                "deleted {} objects ({} found named after all, kept)",
                reply.deleted, reply.named_after_all
            );
        } else if reply.leaked > 0 {
            println!("(calm gc --server {server} --delete removes them)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
