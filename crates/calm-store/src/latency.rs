//! How long a store's requests take, as a distribution kept in atomics: counts per bucket of
//! [`LATENCY_NS_BOUNDS`] and their sum, read as a histogram by a server's metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets, in ns (the last bucket: longer): 50 µs to 10 s.
pub const LATENCY_NS_BOUNDS: [u64; 14] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// A distribution of durations.
#[derive(Debug, Default)]
pub struct LatencyCounts {
    buckets: [AtomicU64; LATENCY_NS_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

/// A distribution as read: cumulative counts per bound, then every observation; their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latencies {
    pub cumulative: Vec<u64>,
    pub sum_ns: u64,
}

impl LatencyCounts {
    /// One more that took `ns`.
    pub fn observe(&self, ns: u64) {
        let at = LATENCY_NS_BOUNDS.partition_point(|bound| *bound < ns);
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The distribution as of now.
    pub fn read(&self) -> Latencies {
        Latencies {
            cumulative: self
                .buckets
                .iter()
                .scan(0, |sum, b| {
                    *sum += b.load(Ordering::Relaxed);
                    Some(*sum)
                })
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// What a store's own write-ahead log counts: how long each commit's sync took, the bytes
/// written to it, and how long each checkpoint (the data file made durable) took.
#[derive(Debug, Default)]
pub struct LogCounts {
    pub syncs: LatencyCounts,
    pub checkpoints: LatencyCounts,
    pub bytes: AtomicU64,
}

/// [`LogCounts`] as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFigures {
    pub syncs: Latencies,
    pub checkpoints: Latencies,
    pub bytes: u64,
}

impl LogCounts {
    /// The figures as of now.
    pub fn read(&self) -> LogFigures {
        LogFigures {
            syncs: self.syncs.read(),
            checkpoints: self.checkpoints.read(),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_their_buckets_and_add_up() {
        let counts = LatencyCounts::default();
        for ns in [10_000, 50_000, 60_000, 20_000_000_000] {
            counts.observe(ns);
        }
        let read = counts.read();
        assert_eq!(read.cumulative[0], 2, "at most 50 µs: 10 and 50 µs");
        assert_eq!(read.cumulative[1], 3);
        assert_eq!(read.cumulative[LATENCY_NS_BOUNDS.len() - 1], 3);
        assert_eq!(*read.cumulative.last().unwrap(), 4);
        assert_eq!(read.sum_ns, 20_000_120_000);
    }
}
