//! Operations counted and timed where they happen ([`TimedSet`]: every error counter looked up
//! once, when first used).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::latency::{Latency, histogram_family};
/// One operation's counters: how many, how long, and how many failed, by error. The time is a
/// [`Latency`] of atomics (counting takes no lock and no compare-and-swap loop); each error
/// counter is made at its first use (a series appears once something happened), then found
/// with one atomic load.
#[derive(Debug, Clone)]
pub struct Timed {
    family: Arc<Family>,
    op: &'static str,
    seconds: Arc<Latency>,
    errors: Arc<[OnceLock<IntCounter>]>,
}

#[derive(Debug)]
struct Family {
    failed: IntCounterVec,
    errors: Vec<&'static str>,
}

impl Timed {
    /// One operation done in `took` (its count is the histogram's).
    pub fn observe(&self, took: Duration) {
        self.seconds.observe(took);
    }

    /// One operation failed with error number `error` of the set's list (past the list: the
    /// last, "other").
    pub fn failed(&self, error: usize) {
        let at = error.min(self.errors.len().saturating_sub(1));
        if let (Some(slot), Some(name)) = (self.errors.get(at), self.family.errors.get(at)) {
            slot.get_or_init(|| self.family.failed.with_label_values(&[self.op, name]))
                .inc();
        }
    }
}

/// A family of operations with a bounded list of names and of errors: `PREFIX_seconds{op}` (a
/// histogram, whose `_count` is the operations done) and `PREFIX_errors_total{op, error}`.
#[derive(Debug, Clone)]
pub struct TimedSet {
    ops: Arc<HashMap<&'static str, Timed>>,
    other: Timed,
}

impl TimedSet {
    /// Registers the two families in `registry`: `ops` are the operations' names (one more,
    /// "other", takes any name not listed), `errors` the errors' (the last should be "other").
    pub fn new(
        registry: &Registry,
        prefix: &str,
        what: &str,
        ops: &[&'static str],
        errors: &[&'static str],
    ) -> prometheus::Result<TimedSet> {
        let failed = IntCounterVec::new(
            Opts::new(
                format!("{prefix}_errors_total"),
                format!("{} that failed, by operation and error.", capitalized(what)),
            ),
            &["op", "error"],
        )?;
        let family = Arc::new(Family {
            failed: failed.clone(),
            errors: errors.to_vec(),
        });
        let make = |op: &'static str| Timed {
            family: family.clone(),
            op,
            seconds: Arc::default(),
            errors: errors.iter().map(|_| OnceLock::new()).collect(),
        };
        let table: HashMap<_, _> = ops.iter().map(|op| (*op, make(op))).collect();
        let other = make("other");
        let seconds = TimedSeconds::new(
            format!("{prefix}_seconds"),
            format!("How long {what} took, by operation (its count: how many were done)."),
            table
                .values()
                .chain([&other])
                .map(|t| (t.op, t.seconds.clone())),
        )?;
        registry.register(Box::new(seconds))?;
        registry.register(Box::new(failed))?;
        Ok(TimedSet {
            ops: Arc::new(table),
            other,
        })
    }

    /// The counters of operation `op` (an unlisted name: "other's").
    pub fn op(&self, op: &str) -> &Timed {
        self.ops.get(op).unwrap_or(&self.other)
    }
}

/// The `PREFIX_seconds{op}` histograms of a [`TimedSet`], read at each scrape: the operations
/// done at least once, in the order of their names.
struct TimedSeconds {
    desc: prometheus::core::Desc,
    help: String,
    ops: Vec<(&'static str, Arc<Latency>)>,
}

impl TimedSeconds {
    fn new(
        name: String,
        help: String,
        ops: impl Iterator<Item = (&'static str, Arc<Latency>)>,
    ) -> prometheus::Result<TimedSeconds> {
        let desc = prometheus::core::Desc::new(
            name,
            help.clone(),
            vec!["op".to_string()],
            HashMap::new(),
        )?;
        let mut ops: Vec<_> = ops.collect();
        ops.sort_by_key(|(op, _)| *op);
        Ok(TimedSeconds { desc, help, ops })
    }
}

impl prometheus::core::Collector for TimedSeconds {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let done: Vec<_> = self.ops.iter().filter(|(_, l)| l.count() > 0).collect();
        if done.is_empty() {
            return Vec::new();
        }
        let labels: Vec<[(&str, &str); 1]> = done.iter().map(|(op, _)| [("op", *op)]).collect();
        let values: Vec<(&[(&str, &str)], &Latency)> = labels
            .iter()
            .zip(&done)
            .map(|(labels, (_, latency))| (labels.as_slice(), latency.as_ref()))
            .collect();
        vec![histogram_family(&self.desc.fq_name, &self.help, &values)]
    }
}

/// `what` with its first letter in upper case.
fn capitalized(what: &str) -> String {
    let mut chars = what.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::{Scrape, gauge_family};

    #[test]
    fn counted_operations_and_scraped_figures_read_back_in_the_text_format() {
        let registry = Registry::new();
        let set = TimedSet::new(
            &registry,
            "calm_test_requests",
            "requests",
            &["Lookup", "Make"],
            &["not_found", "other"],
        )
        .unwrap();
        set.op("Make").observe(Duration::from_millis(2));
        set.op("Make").observe(Duration::from_millis(3));
        set.op("Lookup").failed(0);
        set.op("Nonsense").failed(7);
        let scrape = Scrape::new(&registry, "test").unwrap();
        scrape.add(|| {
            vec![gauge_family(
                "calm_test_held",
                "Things held now.",
                &[(&[("kind", "a")], 3.0)],
            )]
        });
        let text = crate::encode(&registry);
        assert!(
            text.contains("calm_test_requests_seconds_count{op=\"Make\"} 2"),
            "{text}"
        );
        // A series appears once its operation was done: Lookup only failed.
        assert!(
            !text.contains("calm_test_requests_seconds_count{op=\"Lookup\"}"),
            "{text}"
        );
        assert!(
            text.contains("calm_test_requests_seconds_bucket{op=\"Make\",le=\"0.0025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("calm_test_requests_errors_total{error=\"not_found\",op=\"Lookup\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("calm_test_requests_errors_total{error=\"other\",op=\"other\"} 1"),
            "{text}"
        );
        assert!(text.contains("calm_test_held{kind=\"a\"} 3"), "{text}");
        let samples = crate::parse_samples(&crate::samples(&registry));
        assert_eq!(
            samples["calm_test_requests_seconds_count{op=\"Make\"}"],
            2.0
        );
        assert!((samples["calm_test_requests_seconds_sum{op=\"Make\"}"] - 0.005).abs() < 1e-9);
        assert_eq!(samples["calm_test_held{kind=\"a\"}"], 3.0);
        assert!(
            samples.keys().all(|k| !k.contains("_bucket")),
            "{samples:?}"
        );
        assert!(
            text.contains("# HELP calm_test_held Things held now."),
            "{text}"
        );
    }
}
