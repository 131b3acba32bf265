//! `calm stats`: a server's figures every interval, as rates (what happened since the last
//! sample) beside levels (what is held now), one line per sample, `iostat`-like: a plain
//! terminal and a pipe read it alike (no colour, no cursor movement), its header again every
//! [`HEADER_EVERY`] lines; or one JSON object per line for scripts.

use calm_proto::pb::StatusReply;

/// Lines between two headers.
pub const HEADER_EVERY: usize = 20;

/// Two samples of a server's status `seconds` apart, as the figures of the interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub seconds: f64,
    /// Mutations committed per second, commit groups per second, and their averages.
    pub ops_per_s: f64,
    pub commits_per_s: f64,
    pub ops_per_commit: f64,
    pub commit_ms: f64,
    /// Requests answered per second (a batch counts once), and those that failed.
    pub requests_per_s: f64,
    pub errors_per_s: f64,
    /// Calls carried by batches per second.
    pub batched_calls_per_s: f64,
    pub locks: u64,
    pub lock_waits: u64,
    pub sessions: u64,
    pub watchers: u64,
    /// Objects deleted per second, and waiting to be.
    pub deleted_per_s: f64,
    pub deletion_queue: u64,
    pub compactions_per_s: f64,
    pub inodes: u64,
    pub heap_mib: f64,
    pub changelog_last: u64,
}

fn per_s(before: u64, after: u64, seconds: f64) -> f64 {
    after.saturating_sub(before) as f64 / seconds.max(1e-9)
}

/// The interval between `before` and `after`, sampled `seconds` apart.
pub fn interval(before: &StatusReply, after: &StatusReply, seconds: f64) -> Interval {
    let commits = after.commits.saturating_sub(before.commits);
    let ops = after.ops_committed.saturating_sub(before.ops_committed);
    let commit_ns = after.commit_ns_total.saturating_sub(before.commit_ns_total);
    Interval {
        seconds,
        ops_per_s: per_s(before.ops_committed, after.ops_committed, seconds),
        commits_per_s: per_s(before.commits, after.commits, seconds),
        ops_per_commit: if commits == 0 {
            0.0
        } else {
            ops as f64 / commits as f64
        },
        commit_ms: if commits == 0 {
            0.0
        } else {
            commit_ns as f64 / commits as f64 / 1e6
        },
        requests_per_s: per_s(before.requests, after.requests, seconds),
        errors_per_s: per_s(before.request_errors, after.request_errors, seconds),
        batched_calls_per_s: per_s(before.batched_calls, after.batched_calls, seconds),
        locks: after.locks,
        lock_waits: after.lock_waits,
        sessions: after.lock_sessions,
        watchers: after.watchers,
        deleted_per_s: per_s(before.objects_deleted, after.objects_deleted, seconds),
        deletion_queue: after.objects_queued,
        compactions_per_s: per_s(before.chunks_compacted, after.chunks_compacted, seconds),
        inodes: after.inodes,
        heap_mib: after.heap_in_use_bytes as f64 / (1 << 20) as f64,
        changelog_last: after.changelog_last,
    }
}

/// The header of [`line`]'s columns.
pub fn header() -> String {
    format!(
        "{:>8} {:>8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>10} {:>7}",
        "time",
        "ops/s",
        "groups",
        "ops/grp",
        "commit ms",
        "reqs/s",
        "calls/s",
        "errs",
        "locks",
        "waits",
        "sessions",
        "del/s",
        "queued",
        "inodes",
        "heap MB"
    )
}

/// One interval as a line under [`header`], stamped `time` (HH:MM:SS).
pub fn line(time: &str, i: &Interval) -> String {
    format!(
        "{:>8} {:>8.0} {:>7.0} {:>7.1} {:>9.3} {:>8.0} {:>8.0} {:>6.0} {:>6} {:>6} {:>8} {:>7.0} {:>7} {:>10} {:>7.1}",
        time,
        i.ops_per_s,
        i.commits_per_s,
        i.ops_per_commit,
        i.commit_ms,
        i.requests_per_s,
        i.batched_calls_per_s,
        i.errors_per_s,
        i.locks,
        i.lock_waits,
        i.sessions,
        i.deleted_per_s,
        i.deletion_queue,
        i.inodes,
        i.heap_mib
    )
}

/// One interval as a JSON object, stamped with the Unix time in ms.
pub fn json(unix_ms: u64, i: &Interval) -> String {
    serde_json::json!({
        "unix_ms": unix_ms,
        "seconds": i.seconds,
        "ops_per_s": i.ops_per_s,
        "commits_per_s": i.commits_per_s,
        "ops_per_commit": i.ops_per_commit,
        "commit_ms": i.commit_ms,
        "requests_per_s": i.requests_per_s,
        "batched_calls_per_s": i.batched_calls_per_s,
        "errors_per_s": i.errors_per_s,
        "locks": i.locks,
        "lock_waits": i.lock_waits,
        "lock_sessions": i.sessions,
        "watchers": i.watchers,
        "deleted_per_s": i.deleted_per_s,
        "deletion_queue": i.deletion_queue,
        "compactions_per_s": i.compactions_per_s,
        "inodes": i.inodes,
        "heap_mib": i.heap_mib,
        "changelog_last": i.changelog_last,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_the_interval_s_differences_and_levels_the_last_sample_s() {
        let before = StatusReply {
            commits: 10,
            ops_committed: 100,
            commit_ns_total: 10_000_000,
            requests: 50,
            locks: 3,
            ..StatusReply::default()
        };
        let after = StatusReply {
            commits: 30,
            ops_committed: 300,
            commit_ns_total: 50_000_000,
            requests: 250,
            request_errors: 4,
            locks: 7,
            ..StatusReply::default()
        };
        let i = interval(&before, &after, 2.0);
        assert_eq!(i.ops_per_s, 100.0);
        assert_eq!(i.commits_per_s, 10.0);
        assert_eq!(i.ops_per_commit, 10.0);
        assert_eq!(i.commit_ms, 2.0);
        assert_eq!(i.requests_per_s, 100.0);
        assert_eq!(i.errors_per_s, 2.0);
        assert_eq!(i.locks, 7);
        // A restarted server (counters back to 0) gives no negative rate.
        assert_eq!(interval(&after, &before, 1.0).ops_per_s, 0.0);
        assert_eq!(header().split_whitespace().count(), 17);
        assert_eq!(line("12:00:00", &i).split_whitespace().count(), 15);
    }
}
