//! `calm stats MOUNTPOINT`: a mount's figures every interval, from two readings of the samples
//! the mount hands out (the root's `calm.metrics` extended attribute, Prometheus's sample
//! lines): the kernel's requests per second with their average latency and failures, the
//! busiest kinds, invalidations, writes buffered, the object store's throughput and the block
//! cache's hit ratio. Shown as [`crate::stats`] shows a server's: one plain line per interval,
//! or one JSON object.

use std::collections::BTreeMap;

/// Samples by name with labels (`calm_metrics::parse_samples`).
pub type Samples = BTreeMap<String, f64>;

/// Kinds of request shown by name on each line, the busiest first.
pub const BUSIEST_SHOWN: usize = 3;

/// One kind of request over an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRate {
    pub op: String,
    pub per_s: f64,
    pub avg_ms: f64,
}

/// Two readings of a mount's samples `seconds` apart, as the figures of the interval.
#[derive(Debug, Clone, PartialEq)]
pub struct MountInterval {
    pub seconds: f64,
    /// The kernel's requests answered per second, their average latency, and failures (not
    /// counting the answers that are news rather than failures: a name looked up that is not
    /// there, an extended attribute asked for that is not set).
    pub requests_per_s: f64,
    pub avg_ms: f64,
    pub errors_per_s: f64,
    /// Every kind with a request in the interval, the busiest first.
    pub ops: Vec<OpRate>,
    pub invalidations_per_s: f64,
    pub buffered_mib: f64,
    /// Object store requests per second and MB/s (10^6 bytes), puts and gets.
    pub puts_per_s: f64,
    pub put_mb_per_s: f64,
    pub gets_per_s: f64,
    pub get_mb_per_s: f64,
    /// Blocks of a remote store read from memory or the local disk, over all blocks read
    /// (`None`: none read in the interval, or a local store, which has no block cache).
    pub cache_hit_ratio: Option<f64>,
    pub open_files: u64,
}

/// The samples of family `name` with every label pair of `with`, keyed by the value of
/// `label`.
fn by_label(samples: &Samples, name: &str, label: &str, with: &[&str]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (key, value) in samples.range(format!("{name}{{")..) {
        let Some(labels) = key.strip_prefix(name).and_then(|k| k.strip_prefix('{')) else {
            break;
        };
        if !with.iter().all(|pair| labels.contains(pair)) {
            continue;
        }
        let wanted = labels.split(',').find_map(|pair| {
            let (n, v) = pair.split_once("=\"")?;
            (n == label).then(|| v.trim_end_matches(['"', '}']).to_string())
        });
        if let Some(v) = wanted {
            *out.entry(v).or_insert(0.0) += value;
        }
    }
    out
}

fn sum_of(samples: &Samples, name: &str, with: &[&str]) -> f64 {
    samples
        .range(name.to_string()..)
        .take_while(|(key, _)| key.starts_with(name))
        .filter(|(key, _)| {
            let rest = &key[name.len()..];
            (rest.is_empty() || rest.starts_with('{')) && with.iter().all(|pair| key.contains(pair))
        })
        .map(|(_, v)| v)
        .sum()
}

fn delta(before: f64, after: f64) -> f64 {
    // A restarted mount's counters start again from 0: no negative rate.
    (after - before).max(0.0)
}

/// The interval between `before` and `after`, read `seconds` apart.
pub fn mount_interval(before: &Samples, after: &Samples, seconds: f64) -> MountInterval {
    let seconds = seconds.max(1e-9);
    let rate = |name: &str, with: &[&str]| {
        delta(sum_of(before, name, with), sum_of(after, name, with)) / seconds
    };
    let counts_before = by_label(before, "calm_mount_requests_seconds_count", "op", &[]);
    let counts_after = by_label(after, "calm_mount_requests_seconds_count", "op", &[]);
    let sums_before = by_label(before, "calm_mount_requests_seconds_sum", "op", &[]);
    let sums_after = by_label(after, "calm_mount_requests_seconds_sum", "op", &[]);
    let mut ops: Vec<OpRate> = counts_after
        .iter()
        .filter_map(|(op, after_count)| {
            let count = delta(counts_before.get(op).copied().unwrap_or(0.0), *after_count);
            if count <= 0.0 {
                return None;
            }
            let sum = delta(
                sums_before.get(op).copied().unwrap_or(0.0),
                sums_after.get(op).copied().unwrap_or(0.0),
            );
            Some(OpRate {
                op: op.clone(),
                per_s: count / seconds,
                avg_ms: sum / count * 1e3,
            })
        })
        .collect();
    ops.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(a.op.cmp(&b.op)));
    let requests: f64 = ops.iter().map(|o| o.per_s).sum();
    let busy_ms: f64 = ops.iter().map(|o| o.per_s * o.avg_ms).sum();
    let mount = "part=\"mount\"";
    let reads = |found: &str| {
        let pair = format!("found=\"{found}\"");
        rate("calm_block_cache_reads_total", &[mount, &pair])
    };
    let (memory, disk, store) = (reads("memory"), reads("disk"), reads("store"));
    let blocks_read = memory + disk + store;
    let level = |name: &str| sum_of(after, name, &[]);
    MountInterval {
        seconds,
        requests_per_s: requests,
        avg_ms: if requests > 0.0 {
            busy_ms / requests
        } else {
            0.0
        },
        errors_per_s: (rate("calm_mount_requests_errors_total", &[])
            - rate(
                "calm_mount_requests_errors_total",
                &["error=\"ENOENT\"", "op=\"lookup\""],
            )
            - rate("calm_mount_requests_errors_total", &["error=\"ENODATA\""]))
        .max(0.0),
        ops,
        invalidations_per_s: rate("calm_mount_invalidations_total", &[]),
        buffered_mib: level("calm_mount_buffered_bytes") / (1 << 20) as f64,
        puts_per_s: rate(
            "calm_objects_requests_seconds_count",
            &["kind=\"put\"", mount],
        ),
        put_mb_per_s: rate("calm_objects_bytes_total", &["kind=\"put\"", mount]) / 1e6,
        gets_per_s: rate(
            "calm_objects_requests_seconds_count",
            &["kind=\"get\"", mount],
        ),
        get_mb_per_s: rate("calm_objects_bytes_total", &["kind=\"get\"", mount]) / 1e6,
        cache_hit_ratio: (blocks_read > 0.0).then(|| (memory + disk) / blocks_read),
        open_files: level("calm_mount_open_files") as u64,
    }
}

/// The header of [`mount_line`]'s columns.
pub fn mount_header() -> String {
    format!(
        "{:>8} {:>8} {:>7} {:>6} {:>7} {:>7} {:>6} {:>7} {:>6} {:>7} {:>5} {:>5}  {}",
        "time",
        "reqs/s",
        "avg ms",
        "errs",
        "inval/s",
        "buf MB",
        "puts/s",
        "put MB/s",
        "gets/s",
        "get MB/s",
        "hit%",
        "open",
        "busiest (reqs/s, avg ms)"
    )
}

/// One interval as a line under [`mount_header`], stamped `time` (HH:MM:SS).
pub fn mount_line(time: &str, i: &MountInterval) -> String {
    let hit = match i.cache_hit_ratio {
        Some(ratio) => format!("{:.0}", ratio * 100.0),
        None => "-".to_string(),
    };
    let busiest: Vec<String> = i
        .ops
        .iter()
        .take(BUSIEST_SHOWN)
        .map(|o| format!("{} {:.0} {:.2}", o.op, o.per_s, o.avg_ms))
        .collect();
    format!(
        "{:>8} {:>8.0} {:>7.3} {:>6.0} {:>7.0} {:>7.1} {:>6.0} {:>8.1} {:>6.0} {:>8.1} {:>5} {:>5}  {}",
        time,
        i.requests_per_s,
        i.avg_ms,
        i.errors_per_s,
        i.invalidations_per_s,
        i.buffered_mib,
        i.puts_per_s,
        i.put_mb_per_s,
        i.gets_per_s,
        i.get_mb_per_s,
        hit,
        i.open_files,
        busiest.join(", ")
    )
}

/// One interval as a JSON object, stamped with the Unix time in ms.
pub fn mount_json(unix_ms: u64, i: &MountInterval) -> String {
    let ops: serde_json::Map<String, serde_json::Value> = i
        .ops
        .iter()
        .map(|o| {
            (
                o.op.clone(),
                serde_json::json!({"per_s": o.per_s, "avg_ms": o.avg_ms}),
            )
        })
        .collect();
    serde_json::json!({
        "unix_ms": unix_ms,
        "seconds": i.seconds,
        "requests_per_s": i.requests_per_s,
        "avg_ms": i.avg_ms,
        "errors_per_s": i.errors_per_s,
        "ops": ops,
        "invalidations_per_s": i.invalidations_per_s,
        "buffered_mib": i.buffered_mib,
        "puts_per_s": i.puts_per_s,
        "put_mb_per_s": i.put_mb_per_s,
        "gets_per_s": i.gets_per_s,
        "get_mb_per_s": i.get_mb_per_s,
        "cache_hit_ratio": i.cache_hit_ratio,
        "open_files": i.open_files,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(pairs: &[(&str, f64)]) -> Samples {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_mount_s_interval_is_the_difference_of_two_readings() {
        let before = samples(&[
            ("calm_mount_requests_seconds_count{op=\"create\"}", 100.0),
            ("calm_mount_requests_seconds_sum{op=\"create\"}", 0.1),
            ("calm_mount_requests_seconds_count{op=\"lookup\"}", 10.0),
            ("calm_mount_requests_seconds_sum{op=\"lookup\"}", 0.01),
            (
                "calm_mount_requests_errors_total{error=\"ENOENT\",op=\"lookup\"}",
                2.0,
            ),
            (
                "calm_block_cache_reads_total{found=\"memory\",part=\"mount\"}",
                5.0,
            ),
            (
                "calm_block_cache_reads_total{found=\"store\",part=\"mount\"}",
                5.0,
            ),
            ("calm_objects_bytes_total{kind=\"put\",part=\"mount\"}", 1e6),
            (
                "calm_objects_bytes_total{kind=\"put\",part=\"server\"}",
                9e9,
            ),
        ]);
        let after = samples(&[
            ("calm_mount_requests_seconds_count{op=\"create\"}", 300.0),
            ("calm_mount_requests_seconds_sum{op=\"create\"}", 0.5),
            ("calm_mount_requests_seconds_count{op=\"lookup\"}", 110.0),
            ("calm_mount_requests_seconds_sum{op=\"lookup\"}", 0.11),
            (
                "calm_mount_requests_errors_total{error=\"ENOENT\",op=\"lookup\"}",
                12.0,
            ),
            (
                "calm_mount_requests_errors_total{error=\"ENODATA\",op=\"getxattr\"}",
                40.0,
            ),
            (
                "calm_mount_requests_errors_total{error=\"EACCES\",op=\"create\"}",
                10.0,
            ),
            (
                "calm_block_cache_reads_total{found=\"memory\",part=\"mount\"}",
                20.0,
            ),
            (
                "calm_block_cache_reads_total{found=\"store\",part=\"mount\"}",
                10.0,
            ),
            ("calm_objects_bytes_total{kind=\"put\",part=\"mount\"}", 5e6),
            (
                "calm_objects_bytes_total{kind=\"put\",part=\"server\"}",
                1e10,
            ),
            ("calm_mount_buffered_bytes", 2.0 * 1048576.0),
            ("calm_mount_open_files", 3.0),
        ]);
        let i = mount_interval(&before, &after, 2.0);
        assert_eq!(i.requests_per_s, 150.0);
        assert_eq!(i.ops[0].op, "create");
        assert_eq!(i.ops[0].per_s, 100.0);
        assert!((i.ops[0].avg_ms - 2.0).abs() < 1e-9, "{:?}", i.ops[0]);
        assert!((i.ops[1].avg_ms - 1.0).abs() < 1e-9, "{:?}", i.ops[1]);
        // 200 creates of 2 ms and 100 lookups of 1 ms: 5/3 ms on average.
        assert!((i.avg_ms - 5.0 / 3.0).abs() < 1e-9, "{}", i.avg_ms);
        // Lookups of missing names and unset attributes are answers, not failures.
        assert_eq!(i.errors_per_s, 5.0);
        // The server's object store in the same process is not the mount's.
        assert_eq!(i.put_mb_per_s, 2.0);
        assert_eq!(i.cache_hit_ratio, Some(0.75));
        assert_eq!(i.buffered_mib, 2.0);
        assert_eq!(i.open_files, 3);
        // A restarted mount: no negative rate.
        let back = mount_interval(&after, &before, 1.0);
        assert_eq!(back.requests_per_s, 0.0);
        assert!(back.ops.is_empty());
        assert!(
            mount_line("12:00:00", &i).ends_with("create 100 2.00, lookup 50 1.00"),
            "{}",
            mount_line("12:00:00", &i)
        );
        let json: serde_json::Value = serde_json::from_str(&mount_json(1, &i)).unwrap();
        assert_eq!(json["ops"]["create"]["per_s"], 100.0);
        assert_eq!(json["cache_hit_ratio"], 0.75);
    }
}
