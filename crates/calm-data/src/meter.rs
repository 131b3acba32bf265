//! What a handle on the object store counts: requests by kind (puts, gets, deletes, listings)
//! with how long they took, their bytes and failures; and how reads of a remote store were
//! served (memory, local disk, the store). Atomics only; shown to Prometheus at scrape time
//! ([`Meter::families`]) by the server and the mount that hold the handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use calm_metrics::{Latency, MetricFamily, counter_family, histogram_family};

/// A kind of request to the object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Put,
    Get,
    Delete,
    List,
}

const KINDS: [(Kind, &str); 4] = [
    (Kind::Put, "put"),
    (Kind::Get, "get"),
    (Kind::Delete, "delete"),
    (Kind::List, "list"),
];

#[derive(Debug, Default)]
struct Counts {
    seconds: Latency,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// Where a block read of a remote store was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Memory,
    Disk,
    Store,
}

/// The counters of one handle and its clones.
#[derive(Debug, Default)]
pub struct Meter {
    kinds: [Counts; 4],
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    store_reads: AtomicU64,
}

impl Meter {
    /// A request of `kind` begun at `started` moved `bytes` and succeeded or not.
    pub fn request(&self, kind: Kind, started: Instant, bytes: u64, ok: bool) {
        let counts = &self.kinds[kind as usize];
        counts.seconds.observe(started.elapsed());
        counts.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !ok {
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A block of a remote store was read from `found`.
    pub fn found(&self, found: Found) {
        match found {
            Found::Memory => &self.memory_hits,
            Found::Disk => &self.disk_hits,
            Found::Store => &self.store_reads,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of `kind` made so far.
    pub fn requests(&self, kind: Kind) -> u64 {
        self.kinds[kind as usize].seconds.count()
    }

    /// The families Prometheus is shown, labelled with the `part` that holds this handle
    /// (`server`, `mount`: a server and a mount in one process show theirs side by side).
    pub fn families(&self, part: &str) -> Vec<MetricFamily> {
        let labels: Vec<[(&str, &str); 2]> = KINDS
            .iter()
            .map(|(_, n)| [("kind", *n), ("part", part)])
            .collect();
        let seconds: Vec<(&[(&str, &str)], &Latency)> = labels
            .iter()
            .zip(&self.kinds)
            .map(|(l, c)| (&l[..], &c.seconds))
            .collect();
        let bytes: Vec<(&[(&str, &str)], f64)> = labels
            .iter()
            .zip(&self.kinds)
            .map(|(l, c)| (&l[..], c.bytes.load(Ordering::Relaxed) as f64))
            .collect();
        let errors: Vec<(&[(&str, &str)], f64)> = labels
            .iter()
            .zip(&self.kinds)
            .map(|(l, c)| (&l[..], c.errors.load(Ordering::Relaxed) as f64))
            .collect();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        vec![
            histogram_family(
                "calm_objects_requests_seconds",
                "How long requests to the object store took, by kind (put, get, delete, list; its count: how many were made).",
                &seconds,
            ),
            counter_family(
                "calm_objects_bytes_total",
                "Bytes written to (put) and read from (get) the object store.",
                &bytes,
            ),
            counter_family(
                "calm_objects_errors_total",
                "Requests to the object store that failed, by kind (after their retries).",
                &errors,
            ),
            counter_family(
                "calm_block_cache_reads_total",
                "Blocks of a remote object store read, by where they were found: memory, the local disk cache, or the store itself.",
                &[
                    (
                        &[("found", "memory"), ("part", part)],
                        load(&self.memory_hits),
                    ),
                    (&[("found", "disk"), ("part", part)], load(&self.disk_hits)),
                    (
                        &[("found", "store"), ("part", part)],
                        load(&self.store_reads),
                    ),
                ],
            ),
        ]
    }
}
