//! What the committer counts of its commit groups: how many, the mutations they carried, the
//! time they took, failures, and the distributions of their sizes and durations (buckets of
//! atomics, read by a server's metrics as histograms).

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets of commit groups' sizes, in mutations (the last bucket: more).
pub const GROUP_SIZE_BOUNDS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Figures of the committer, read by status.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub commits: AtomicU64,
    pub ops: AtomicU64,
    pub failed_commits: AtomicU64,
    pub largest_batch: AtomicU64,
    pub commit_ns_total: AtomicU64,
    /// Changelog records purged.
    pub cl_purged: AtomicU64,
    /// The first changelog record stored as the committer last knew it: a floor for the
    /// reads of the first elsewhere (`ClState::load_from`).
    pub cl_first: AtomicU64,
    /// Commit groups by size ([`GROUP_SIZE_BOUNDS`]) and by duration.
    pub group_sizes: [AtomicU64; GROUP_SIZE_BOUNDS.len() + 1],
    pub commit_ns: calm_store::latency::LatencyCounts,
}

/// The bucket of `value` among `bounds` (past the last: one more).
pub(crate) fn bucket(bounds: &[u64], value: u64) -> usize {
    bounds.partition_point(|bound| *bound < value)
}

/// The distributions of commit groups: counts per bucket (cumulative, as Prometheus wants
/// them, the last being every group) of their sizes, and of their durations (the buckets of
/// [`calm_store::latency::LATENCY_NS_BOUNDS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitDistributions {
    pub sizes: Vec<u64>,
    pub ops: u64,
    pub durations: Vec<u64>,
    pub ns: u64,
}

impl CommitStats {
    /// The distributions as of now.
    pub fn distributions(&self) -> CommitDistributions {
        let cumulative = |buckets: &[AtomicU64]| -> Vec<u64> {
            buckets
                .iter()
                .scan(0, |sum, b| {
                    *sum += b.load(Ordering::Relaxed);
                    Some(*sum)
                })
                .collect()
        };
        let durations = self.commit_ns.read();
        CommitDistributions {
            sizes: cumulative(&self.group_sizes),
            ops: self.ops.load(Ordering::Relaxed),
            durations: durations.cumulative,
            ns: durations.sum_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_falls_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(bucket(&GROUP_SIZE_BOUNDS, 1), 0);
        assert_eq!(bucket(&GROUP_SIZE_BOUNDS, 2), 1);
        assert_eq!(bucket(&GROUP_SIZE_BOUNDS, 3), 2);
        assert_eq!(bucket(&GROUP_SIZE_BOUNDS, 1024), 10);
        assert_eq!(bucket(&GROUP_SIZE_BOUNDS, 1025), 11);
        let stats = CommitStats::default();
        for size in [1, 1, 3, 2000] {
            stats.group_sizes[bucket(&GROUP_SIZE_BOUNDS, size)].fetch_add(1, Ordering::Relaxed);
        }
        let d = stats.distributions();
        assert_eq!(d.sizes[0], 2);
        assert_eq!(d.sizes[2], 3);
        assert_eq!(*d.sizes.last().unwrap(), 4);
    }
}
