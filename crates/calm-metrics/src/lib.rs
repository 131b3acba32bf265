//! `calm-metrics`: what a server or a mount counts, in Prometheus's text exposition format.
//!
//! The library is Prometheus's Rust client (`prometheus`, TiKV's): its counters are atomics, so
//! counting takes no lock; a family's child is looked up (a read lock) once, at its first use,
//! never per event. Operations' latencies are counted in calm's own atomics ([`Latency`]) and
//! read into the library's histograms when Prometheus scrapes. Figures a component keeps already (the
//! committer's, the lock manager's) are read at scrape time by a [`Scrape`] instead of being
//! counted twice. The endpoint ([`serve`]) answers `GET /metrics` over HTTP/1.1.
//!
//! Names follow Prometheus's conventions: `calm_` then the part, base units (`_seconds`,
//! `_bytes`), `_total` on counters; labels take bounded values only (a method of the protocol,
//! an operation's kind, an error's name), never a path, a handle or a user's id.

mod endpoint;
mod latency;
mod scrape;
mod timed;

pub use calm_lockfree::load::{LOAD_KEY_BYTES_MAX, LOAD_SLOTS, Load, Loaded};
pub use endpoint::{Endpoint, bind, serve};
pub use latency::{LATENCY_BUCKETS, Latency, histogram_family, histogram_of};
pub use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder, core::Collector, proto::MetricFamily,
};
pub use scrape::{Scrape, counter_family, gauge_family};
pub use timed::{Timed, TimedSet};

/// The registry's samples without comments and histogram buckets: each line
/// `NAME{LABELS} VALUE` (a histogram keeps its `_count` and `_sum`). What `calm stats` reads of
/// a mount, which hands it out in one extended attribute ([`parse_samples`] reads it back).
pub fn samples(registry: &Registry) -> String {
    encode(registry)
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            !name.ends_with("_bucket")
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The samples of [`samples`] (or of a whole exposition), by their name with labels; lines
/// that are not samples are skipped.
pub fn parse_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (key, value) = line.trim().rsplit_once(' ')?;
            Some((key.to_string(), value.parse::<f64>().ok()?))
        })
        .collect()
}

/// The registry's families in the text exposition format.
pub fn encode(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding into memory cannot fail but for a family the registry refused already.
    if let Err(error) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!(%error, "encoding the metrics");
    }
    String::from_utf8(out).unwrap_or_default()
}
