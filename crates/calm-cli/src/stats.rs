//! `calm stats`: a server's figures every interval, as rates (what happened since the last
//! sample) beside levels (what is held now), one line per sample, `iostat`-like: a plain
//! terminal and a pipe read it alike (no colour, no cursor movement), its header again every
//! [`HEADER_EVERY`] lines; or one JSON object per line for scripts.

use calm_proto::pb::{self, StatusReply};

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
    /// The average time the server took to answer a namespace call of the interval (a
    /// batch's calls each), in ms; 0 without any.
    pub call_ms: f64,
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
    let calls = after.namespace_calls.saturating_sub(before.namespace_calls);
    let call_ns = after
        .namespace_ns_total
        .saturating_sub(before.namespace_ns_total);
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
        call_ms: if calls == 0 {
            0.0
        } else {
            call_ns as f64 / calls as f64 / 1e6
        },
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
        "{:>8} {:>8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>10} {:>7}",
        "time",
        "ops/s",
        "groups",
        "ops/grp",
        "commit ms",
        "reqs/s",
        "calls/s",
        "call ms",
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
        "{:>8} {:>8.0} {:>7.0} {:>7.1} {:>9.3} {:>8.0} {:>8.0} {:>7.3} {:>6.0} {:>6} {:>6} {:>8} {:>7.0} {:>7} {:>10} {:>7.1}",
        time,
        i.ops_per_s,
        i.commits_per_s,
        i.ops_per_commit,
        i.commit_ms,
        i.requests_per_s,
        i.batched_calls_per_s,
        i.call_ms,
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
        "call_ms": i.call_ms,
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

/// One user's or job's requests over an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadRate {
    pub key: String,
    pub requests_per_s: f64,
    /// The average time the server spent on one of its requests.
    pub avg_ms: f64,
    /// Server time spent on its requests per second of the interval (1000: one request
    /// being answered at every moment).
    pub busy_ms_per_s: f64,
}

/// The users' (or jobs') rates between two samples `seconds` apart: those with requests in
/// the interval, the busiest first, "other" last.
pub fn load_interval(before: &[pb::Load], after: &[pb::Load], seconds: f64) -> Vec<LoadRate> {
    let seconds = seconds.max(1e-9);
    let mut rates: Vec<LoadRate> = after
        .iter()
        .filter_map(|now| {
            let then = before.iter().find(|b| b.key == now.key);
            let requests = now.requests.saturating_sub(then.map_or(0, |b| b.requests));
            let ns = now
                .seconds_ns
                .saturating_sub(then.map_or(0, |b| b.seconds_ns));
            (requests > 0).then(|| LoadRate {
                key: now.key.clone(),
                requests_per_s: requests as f64 / seconds,
                avg_ms: ns as f64 / requests as f64 / 1e6,
                busy_ms_per_s: ns as f64 / 1e6 / seconds,
            })
        })
        .collect();
    rates.sort_by(|a, b| {
        (a.key == "other")
            .cmp(&(b.key == "other"))
            .then(b.requests_per_s.total_cmp(&a.requests_per_s))
            .then(a.key.cmp(&b.key))
    });
    rates
}

/// The lines of one interval of [`load_interval`] by `by` (`uid`, `job`), stamped `time`: a
/// header, then one line per key.
pub fn load_lines(time: &str, by: &str, rates: &[LoadRate]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>8} {:<24} {:>9} {:>8} {:>11}",
        time, by, "reqs/s", "avg ms", "server ms/s"
    )];
    if rates.is_empty() {
        lines.push(format!("{:>8} {:<24}", "", "(no requests)"));
    }
    for r in rates {
        lines.push(format!(
            "{:>8} {:<24} {:>9.0} {:>8.3} {:>11.1}",
            "", r.key, r.requests_per_s, r.avg_ms, r.busy_ms_per_s
        ));
    }
    lines
}

/// One interval of [`load_interval`] as a JSON object, stamped with the Unix time in ms.
pub fn load_json(unix_ms: u64, by: &str, rates: &[LoadRate]) -> String {
    let loads: Vec<serde_json::Value> = rates
        .iter()
        .map(|r| {
            serde_json::json!({
                "key": r.key,
                "requests_per_s": r.requests_per_s,
                "avg_ms": r.avg_ms,
                "busy_ms_per_s": r.busy_ms_per_s,
            })
        })
        .collect();
    serde_json::json!({ "unix_ms": unix_ms, "by": by, "loads": loads }).to_string()
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
            namespace_calls: 40,
            namespace_ns_total: 8_000_000,
            locks: 3,
            ..StatusReply::default()
        };
        let after = StatusReply {
            commits: 30,
            ops_committed: 300,
            commit_ns_total: 50_000_000,
            requests: 250,
            namespace_calls: 240,
            namespace_ns_total: 108_000_000,
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
        // 200 calls took 100 ms in all.
        assert_eq!(i.call_ms, 0.5);
        assert_eq!(i.locks, 7);
        // A restarted server (counters back to 0) gives no negative rate.
        assert_eq!(interval(&after, &before, 1.0).ops_per_s, 0.0);
        assert_eq!(header().split_whitespace().count(), 19);
        assert_eq!(line("12:00:00", &i).split_whitespace().count(), 16);
    }

    #[test]
    fn a_user_s_rate_is_the_difference_of_its_counts() {
        let load = |key: &str, requests: u64, ms: u64| pb::Load {
            key: key.to_string(),
            requests,
            seconds_ns: ms * 1_000_000,
        };
        let before = [load("1000", 100, 50), load("other", 5, 5)];
        let after = [
            load("1000", 300, 250),
            load("2000", 40, 80),
            load("other", 15, 15),
            load("3000", 0, 0),
        ];
        let rates = load_interval(&before, &after, 2.0);
        let keys: Vec<&str> = rates.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["1000", "2000", "other"]);
        assert_eq!(rates[0].requests_per_s, 100.0);
        assert_eq!(rates[0].avg_ms, 1.0);
        assert_eq!(rates[0].busy_ms_per_s, 100.0);
        assert_eq!(rates[1].avg_ms, 2.0);
        // A key swept out (its counts now under "other") gives no negative rate.
        assert!(
            load_interval(&after, &before, 1.0)
                .iter()
                .all(|r| r.requests_per_s >= 0.0)
        );
        let lines = load_lines("12:00:00", "uid", &rates);
        assert_eq!(lines.len(), 4);
        assert!(
            lines[1].contains("1000") && lines[1].contains("100"),
            "{lines:?}"
        );
        let json: serde_json::Value = serde_json::from_str(&load_json(7, "uid", &rates)).unwrap();
        assert_eq!(json["loads"][1]["key"], "2000");
    }
}
