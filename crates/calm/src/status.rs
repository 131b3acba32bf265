//! `calm status`: ask a running server for its figures.

use std::process::ExitCode;

use anyhow::Context;

pub fn run(server: &str, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = runtime
        .block_on(async {
            let client = calm_client::Client::connect(server).await?;
            client.status().await
        })
        .with_context(|| format!("asking {server} for its status"))?;
    let average_batch = status.ops_committed as f64 / status.commits.max(1) as f64;
    let average_commit_ms = status.commit_ns_total as f64 / status.commits.max(1) as f64 / 1e6;
    if json {
        let mut value = serde_json::json!({
            "version": status.version,
            "data_dir": status.data_dir,
            "epoch": status.epoch,
            "inodes": status.inodes,
            "file_bytes": status.file_bytes,
            "handle_high_water": status.handle_high_water,
            "store_bytes": status.store_bytes,
            "commits": status.commits,
            "ops_committed": status.ops_committed,
            "failed_commits": status.failed_commits,
            "largest_batch": status.largest_batch,
            "average_batch": average_batch,
            "average_commit_ms": average_commit_ms,
            "uptime_ms": status.uptime_ms,
            "ready_ms": status.ready_ms,
            "requests": status.requests,
            "request_errors": status.request_errors,
            "batches": status.batches,
            "batched_calls": status.batched_calls,
            "lock_sessions": status.lock_sessions,
            "locks": status.locks,
            "lock_waits": status.lock_waits,
            "locked_files": status.locked_files,
            "changelog_last": status.changelog_last,
            "changelog_first": status.changelog_first,
            "changelog_readers": status.changelog_readers,
            "changelog_purged": status.changelog_purged,
            "objects_url": status.objects_url,
            "objects_queued": status.objects_queued,
            "objects_deleted": status.objects_deleted,
            "chunks_compacted": status.chunks_compacted,
            "compaction_records_replaced": status.compaction_records_replaced,
            "compaction_bytes": status.compaction_bytes,
            "compaction_failures": status.compaction_failures,
            "room_waits": status.room_waits,
            "room_waiting": status.room_waiting,
            "room_wait_ms_max": status.room_wait_ms_max,
            "chunk_records_max": status.chunk_records_max,
            "watchers": status.watchers,
            "watch_resyncs": status.watch_resyncs,
        });
        // (Past the json! macro's recursion limit.)
        value["heap_in_use_bytes"] = status.heap_in_use_bytes.into();
        value["heap_free_bytes"] = status.heap_free_bytes.into();
        value["cached_block_bytes"] = status.cached_block_bytes.into();
        value["cached_header_bytes"] = status.cached_header_bytes.into();
        value["backups_made"] = status.backups_made.into();
        value["backups_failed"] = status.backups_failed.into();
        value["backup_last_ms"] = status.backup_last_ms.into();
        value["backup_last_bytes"] = status.backup_last_bytes.into();
        value["backup_every_s"] = status.backup_every_s.into();
        value["trash_entries"] = status.trash_entries.into();
        value["trash_bytes"] = status.trash_bytes.into();
        value["trash_kept_s"] = status.trash_kept_s.into();
        value["holds"] = status.holds.into();
        value["holds_recalled"] = status.holds_recalled.into();
        value["holds_taken"] = status.holds_taken.into();
        value["copies"] = status.copies.into();
        value["copies_recalled"] = status.copies_recalled.into();
        value["copies_taken"] = status.copies_taken.into();
        value["store"] = status
            .store
            .iter()
            .map(|f| (f.name.clone(), serde_json::Value::from(f.value)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        value["nearest"] = status
            .nearest
            .iter()
            .map(|n| serde_json::json!({"who": n.who, "what": n.what, "used": n.used, "limit": n.limit}))
            .collect::<Vec<_>>()
            .into();
        println!("{value}");
    } else {
        for line in calm_cli::tables::status_lines(server, &status) {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
