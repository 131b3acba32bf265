//! Figures read when Prometheus scrapes ([`Scrape`]), and the families they are shown as.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::Registry;
use prometheus::proto::{self, MetricFamily, MetricType};

type Figures = dyn Fn() -> Vec<MetricFamily> + Send + Sync;

/// Figures read when Prometheus scrapes, from closures each part registers: what a part
/// keeps already (in atomics of its own) is not counted a second time.
#[derive(Clone)]
pub struct Scrape {
    parts: Arc<std::sync::RwLock<Vec<Box<Figures>>>>,
    /// What the registry knows this scrape by (one per part: a server and a mount in one
    /// process each have theirs).
    desc: Arc<prometheus::core::Desc>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape").finish_non_exhaustive()
    }
}

impl Scrape {
    /// A scrape of `part` (`server`, `mount`) registered in `registry` (one per part).
    pub fn new(registry: &Registry, part: &str) -> prometheus::Result<Scrape> {
        let desc = prometheus::core::Desc::new(
            format!("calm_{part}_scraped"),
            format!("The figures of the {part} read at each scrape."),
            Vec::new(),
            HashMap::new(),
        )?;
        let scrape = Scrape {
            parts: Arc::default(),
            desc: Arc::new(desc),
        };
        registry.register(Box::new(scrape.clone()))?;
        Ok(scrape)
    }

    /// Adds a part's figures.
    pub fn add(&self, figures: impl Fn() -> Vec<MetricFamily> + Send + Sync + 'static) {
        if let Ok(mut parts) = self.parts.write() {
            parts.push(Box::new(figures));
        }
    }
}

impl prometheus::core::Collector for Scrape {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match self.parts.read() {
            Ok(parts) => parts.iter().flat_map(|figures| figures()).collect(),
            Err(_) => Vec::new(),
        }
    }
}

pub(crate) fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    metrics: Vec<proto::Metric>,
) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

pub(crate) fn labelled(labels: &[(&str, &str)]) -> proto::Metric {
    let mut metric = proto::Metric::default();
    metric.set_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(name.to_string());
                pair.set_value(value.to_string());
                pair
            })
            .collect(),
    );
    metric
}

/// A gauge family: each value with its labels.
pub fn gauge_family(name: &str, help: &str, values: &[(&[(&str, &str)], f64)]) -> MetricFamily {
    let metrics = values
        .iter()
        .map(|(labels, value)| {
            let mut metric = labelled(labels);
            let mut gauge = proto::Gauge::default();
            gauge.set_value(*value);
            metric.set_gauge(gauge);
            metric
        })
        .collect();
    family(name, help, MetricType::GAUGE, metrics)
}

/// A counter family (`name` ends in `_total`): each value with its labels.
pub fn counter_family(name: &str, help: &str, values: &[(&[(&str, &str)], f64)]) -> MetricFamily {
    let metrics = values
        .iter()
        .map(|(labels, value)| {
            let mut metric = labelled(labels);
            let mut counter = proto::Counter::default();
            counter.set_value(*value);
            metric.set_counter(counter);
            metric
        })
        .collect();
    family(name, help, MetricType::COUNTER, metrics)
}
