//! What `calm status` and `calm locks` print: a server's status, and a file's locks, as
//! tables for a terminal.

use calm_locks::{Holder, LockKind, OFFSET_MAX, Owner, Scope};
use calm_proto::pb::StatusReply;

use calm_client::LockListing;

const MIB: f64 = (1u64 << 20) as f64;

/// The lines `calm status` prints for `status`, the answer of `server`: one row per part of
/// the server, a row with nothing to say (as a local store's requests) left out.
pub fn status_lines(server: &str, status: &StatusReply) -> Vec<String> {
    let average_batch = status.ops_committed as f64 / status.commits.max(1) as f64;
    let average_commit_ms = status.commit_ns_total as f64 / status.commits.max(1) as f64 / 1e6;
    let store = status
        .store
        .iter()
        .map(|f| format!("{} {}", f.name, f.value))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = [
        ("server", format!("{server} (calm {})", status.version)),
        ("data", status.data_dir.clone()),
        ("objects", status.objects_url.clone()),
        ("epoch", status.epoch.to_string()),
        ("inodes", status.inodes.to_string()),
        ("file bytes", status.file_bytes.to_string()),
        ("handle high-water", status.handle_high_water.to_string()),
        ("store bytes", status.store_bytes.to_string()),
        ("commits", status.commits.to_string()),
        ("ops committed", status.ops_committed.to_string()),
        ("failed commits", status.failed_commits.to_string()),
        (
            "ops per commit",
            format!("{average_batch:.1} (largest {})", status.largest_batch),
        ),
        (
            "commit time",
            format!("{average_commit_ms:.2} ms on average"),
        ),
        (
            "requests",
            format!(
                "{} ({} answered with an error; {} of them in {} batches)",
                status.requests, status.request_errors, status.batched_calls, status.batches
            ),
        ),
        (
            "locks",
            format!(
                "{} held on {} files, {} waiting, {} sessions",
                status.locks, status.locked_files, status.lock_waits, status.lock_sessions
            ),
        ),
        (
            "changelog",
            format!(
                "last index {}, {} stored, {} readers, {} purged since start",
                status.changelog_last,
                (status.changelog_last + 1).saturating_sub(status.changelog_first),
                status.changelog_readers,
                status.changelog_purged
            ),
        ),
        (
            "object deletion",
            format!(
                "{} queued, {} deleted since start",
                status.objects_queued, status.objects_deleted
            ),
        ),
        (
            "metadata backups",
            match status.backup_every_s {
                0 => "none made (--backup-every-hours 0, or no object store)".to_string(),
                every => format!(
                    "every {:.2} h: {} made since start ({} failed){}",
                    every as f64 / 3600.0,
                    status.backups_made,
                    status.backups_failed,
                    match status.backup_last_ms {
                        0 => String::new(),
                        last => format!(
                            ", the last {:.1} MB, {} s ago",
                            status.backup_last_bytes as f64 / 1e6,
                            (now_ms().saturating_sub(last)) / 1000
                        ),
                    }
                ),
            },
        ),
        (
            "trash",
            match status.trash_kept_s {
                0 => "none: a removal is final (--trash-hours 0)".to_string(),
                kept => format!(
                    "{} entries, {:.1} MB, each kept {:.2} h",
                    status.trash_entries,
                    status.trash_bytes as f64 / 1e6,
                    kept as f64 / 3600.0
                ),
            },
        ),
        (
            "compaction",
            format!(
                "{} chunks compacted since start ({} records replaced, {:.1} MB written, {} \
                 failed); at most {} records in a chunk",
                status.chunks_compacted,
                status.compaction_records_replaced,
                status.compaction_bytes as f64 / 1e6,
                status.compaction_failures,
                status.chunk_records_max
            ),
        ),
        (
            "writes waiting",
            format!(
                "{} for a full chunk's compaction now, {} since start (longest {} ms)",
                status.room_waiting, status.room_waits, status.room_wait_ms_max
            ),
        ),
        (
            "watches",
            format!(
                "{} open, {} resyncs since start",
                status.watchers, status.watch_resyncs
            ),
        ),
        (
            "files held",
            format!(
                "{} by mounts now, {} asked back since start, {} taken from mounts too slow \
                 to give them back",
                status.holds, status.holds_recalled, status.holds_taken
            ),
        ),
        (
            "copies kept",
            format!(
                "{} by mounts now (their opens answered there), {} asked back since start, {} \
                 taken from mounts too slow to give them back",
                status.copies, status.copies_recalled, status.copies_taken
            ),
        ),
        (
            "heap",
            format!(
                "{:.1} MiB in use ({:.1} MiB of it cached blocks, {:.1} MiB block headers), \
                 {:.1} MiB free in the allocator",
                status.heap_in_use_bytes as f64 / MIB,
                status.cached_block_bytes as f64 / MIB,
                status.cached_header_bytes as f64 / MIB,
                status.heap_free_bytes as f64 / MIB
            ),
        ),
        ("store", store),
        ("ready after", format!("{} ms", status.ready_ms)),
        ("uptime", format!("{:.1} s", status.uptime_ms as f64 / 1e3)),
    ];
    let mut lines: Vec<String> = rows
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, value)| format!("{name:<18} {value}"))
        .collect();
    if !status.nearest.is_empty() {
        lines.push("nearest their limits:".into());
        for n in &status.nearest {
            lines.push(format!(
                "  {:<32} {:<24} {} of {} ({:.0} %)",
                n.who,
                n.what,
                n.used,
                n.limit,
                n.used as f64 * 100.0 / n.limit.max(1) as f64
            ));
        }
    }
    lines
}

/// A lock's type as a user names it. A mount cannot tell a POSIX record lock (fcntl, lockf)
/// from an OFD one: the kernel hands it both with an opaque owner (the process's file table,
/// or the open file), which the server knows as a file owner. Those are "RECORD"; a process
/// owner (a client of the server's own) is "POSIX".
pub fn lock_type(holder: &Holder) -> &'static str {
    match (holder.scope, holder.owner) {
        (Scope::WholeFile, _) => "FLOCK",
        (Scope::Range(_), Owner::Process { .. }) => "POSIX",
        (Scope::Range(_), Owner::File { .. }) => "RECORD",
    }
}

fn lock_row(state: &str, holder: &Holder) -> String {
    let (start, end) = match holder.scope {
        Scope::Range(r) if r.end == OFFSET_MAX => (r.start.to_string(), "EOF".to_string()),
        Scope::Range(r) => (r.start.to_string(), r.end.to_string()),
        Scope::WholeFile => ("0".to_string(), "EOF".to_string()),
    };
    let mode = match holder.kind {
        LockKind::Read => "READ",
        LockKind::Write => "WRITE",
    };
    let who = match holder.owner {
        Owner::Process { pid } => pid.to_string(),
        Owner::File { file } => format!("file:{file}"),
    };
    format!(
        "{state:<8} {:<6} {mode:<6} {start:>20} {end:>20} {:>22} {who:>12}",
        lock_type(holder),
        holder.session
    )
}

/// The lines `calm locks` prints for the file at `path` (handle `handle`): the locks held and
/// the requests waiting, one row each.
pub fn locks_lines(path: &str, handle: u64, listing: &LockListing) -> Vec<String> {
    let mut out = vec![format!(
        "{path} (handle {handle}): {} locks, {} waiting",
        listing.total,
        listing.waiting.len()
    )];
    if !listing.locks.is_empty() || !listing.waiting.is_empty() {
        out.push(format!(
            "{:<8} {:<6} {:<6} {:>20} {:>20} {:>22} {:>12}",
            "STATE", "TYPE", "MODE", "START", "END", "SESSION", "PID/FILE"
        ));
    }
    for holder in &listing.locks {
        out.push(lock_row("held", holder));
    }
    for (wait, session, request) in &listing.waiting {
        let holder = Holder {
            session: *session,
            owner: request.owner,
            scope: request.scope,
            kind: request.kind,
        };
        out.push(lock_row(&format!("wait#{wait}"), &holder));
    }
    if listing.total > listing.locks.len() as u64 {
        out.push(format!("(first {} shown)", listing.locks.len()));
    }
    out
}

/// The lines `calm changelog users` prints: the indices, the types written, and one row per
/// reader with how long it has been idle at `now_ns`.
pub fn readers_lines(
    reply: &calm_proto::pb::ClUsersReply,
    users: &[calm_changelog::User],
    now_ns: i64,
) -> Vec<String> {
    let mut out = vec![
        format!("current index: {}", reply.last),
        format!("first stored:  {}", reply.first),
        format!("written types: {}", reply.global_mask),
        format!(
            "{:<8} {:>20} {:>10}  {:<16} mask",
            "ID", "index", "(idle s)", "name"
        ),
    ];
    for user in users {
        let idle = (now_ns - user.last_clear_ns).max(0) / 1_000_000_000;
        out.push(format!(
            "{:<8} {:>20} {:>10}  {:<16} {}",
            user.label(),
            user.cleared,
            format!("({idle})"),
            user.name,
            user.mask.names()
        ));
    }
    out
}

/// Milliseconds since the epoch, by this machine's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
