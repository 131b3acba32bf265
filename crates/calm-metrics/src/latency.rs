//! Counters a part keeps in its own atomics and shows at scrape time: a [`Latency`]
//! distribution (Prometheus's histogram, without the library's types in the part), and the
//! families made of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::proto::{self, MetricFamily, MetricType};

use crate::scrape::{family, labelled};

/// Latency buckets, in seconds: 50 µs to 10 s, about three per decade.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// How long things took: counts per bucket of [`LATENCY_BUCKETS`] (the last: beyond them),
/// their sum and count, in atomics (counting takes no lock).
#[derive(Debug)]
pub struct Latency {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Latency {
    /// One more that took `took`.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let at = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// How many were observed.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The distribution as a histogram sample with `labels`.
    pub fn metric(&self, labels: &[(&str, &str)]) -> proto::Metric {
        let mut metric = labelled(labels);
        let mut histogram = proto::Histogram::default();
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len());
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            let mut bucket = proto::Bucket::default();
            bucket.set_upper_bound(*bound);
            bucket.set_cumulative_count(cumulative);
            buckets.push(bucket);
        }
        cumulative += self.buckets[LATENCY_BUCKETS.len()].load(Ordering::Relaxed);
        histogram.set_bucket(buckets);
        histogram.set_sample_count(cumulative);
        histogram.set_sample_sum(self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
        metric.set_histogram(histogram);
        metric
    }
}

/// A histogram family of one distribution kept elsewhere: `bounds` (upper bounds, ascending),
/// `cumulative` counts (one per bound, then one more: every observation) and their sum.
pub fn histogram_of(
    name: &str,
    help: &str,
    bounds: &[f64],
    cumulative: &[u64],
    sum: f64,
) -> MetricFamily {
    let mut metric = labelled(&[]);
    let mut histogram = proto::Histogram::default();
    histogram.set_bucket(
        bounds
            .iter()
            .zip(cumulative)
            .map(|(bound, count)| {
                let mut bucket = proto::Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(*count);
                bucket
            })
            .collect(),
    );
    histogram.set_sample_count(cumulative.last().copied().unwrap_or(0));
    histogram.set_sample_sum(sum);
    metric.set_histogram(histogram);
    family(name, help, MetricType::HISTOGRAM, vec![metric])
}

/// A histogram family (`name` ends in `_seconds`): each distribution with its labels.
pub fn histogram_family(
    name: &str,
    help: &str,
    values: &[(&[(&str, &str)], &Latency)],
) -> MetricFamily {
    let metrics = values
        .iter()
        .map(|(labels, latency)| latency.metric(labels))
        .collect();
    family(name, help, MetricType::HISTOGRAM, metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distribution_reads_back_as_a_histogram() {
        let latency = Latency::default();
        latency.observe(Duration::from_micros(30));
        latency.observe(Duration::from_millis(3));
        latency.observe(Duration::from_secs(60));
        assert_eq!(latency.count(), 3);
        let registry = prometheus::Registry::new();
        let scrape = crate::Scrape::new(&registry, "test").unwrap();
        let latency = std::sync::Arc::new(latency);
        scrape.add(move || {
            vec![histogram_family(
                "calm_test_put_seconds",
                "How long puts took.",
                &[(&[("kind", "put")], &latency)],
            )]
        });
        let samples = crate::parse_samples(&crate::encode(&registry));
        let at = |key: &str| samples.get(key).copied();
        assert_eq!(at("calm_test_put_seconds_count{kind=\"put\"}"), Some(3.0));
        assert_eq!(
            at("calm_test_put_seconds_bucket{kind=\"put\",le=\"0.00005\"}"),
            Some(1.0)
        );
        assert_eq!(
            at("calm_test_put_seconds_bucket{kind=\"put\",le=\"0.005\"}"),
            Some(2.0)
        );
        assert_eq!(
            at("calm_test_put_seconds_bucket{kind=\"put\",le=\"+Inf\"}"),
            Some(3.0)
        );
        let sum = at("calm_test_put_seconds_sum{kind=\"put\"}").unwrap();
        assert!((sum - 60.00303).abs() < 1e-6, "{sum}");
    }
}
