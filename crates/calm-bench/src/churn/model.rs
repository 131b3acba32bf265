//! The churn benchmark's options and report, and what a round's loop counts with: shared by
//! the rounds of clients and the rounds as a site runs them.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone)]
pub struct ChurnOptions {
    /// Server counts, one round each.
    pub servers: Vec<usize>,
    /// Reporting periods per round.
    pub periods: u32,
    /// Length of a period.
    pub period: Duration,
    /// Namespace clients, each creating and unlinking in a directory of its own.
    pub threads: usize,
    /// The servers' membership lease.
    pub lease_ms: u64,
    /// The servers' `--trash-hours` (None: their default).
    pub trash_hours: Option<f64>,
    /// An etcd cluster to use instead of a fresh local one per round.
    pub etcd: Option<String>,
    /// The `calm` binary to start servers with.
    pub calm: PathBuf,
    /// Run as a site does (mounts, files held open, a reader, pauses) instead of clients in
    /// this process.
    pub site: Option<SiteOptions>,
}

/// The conditions of a `--site` round beyond its mounts (one per server), its files held open
/// (one per mount) and its changelog reader.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SiteOptions {
    /// Every this many periods, one begins with a pause.
    pub pause_every: u32,
    /// How long nothing is created then (at most half a period).
    pub pause: Duration,
}

/// One period of one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChurnPeriod {
    /// From 1.
    pub period: u32,
    pub pairs: u64,
    pub pairs_per_sec: f64,
    /// The slowest 1 % of the period's pairs took this or more (create and unlink together).
    pub p99_ms: f64,
    /// CPU (user + system) of the calm server processes per pair (`--site`: and the mounts').
    pub cpu_us_per_pair: f64,
    /// Resident memory of the servers, summed.
    pub servers_rss_mib: f64,
    /// etcd's database file at the period's end (the largest member), and the part of it in
    /// use (what compaction freed is reused by later writes).
    pub db_mib: f64,
    pub db_in_use_mib: f64,
    /// Seconds of the period in which nothing was created (`--site`'s pauses); the rates
    /// count the rest.
    #[serde(default)]
    pub paused_s: f64,
    /// The pair rate through each mount (`--site`), in the servers' order.
    #[serde(default)]
    pub mount_pairs_per_sec: Vec<f64>,
    /// The changelog's records stored at the period's end, and those purged since the servers
    /// started (all servers), as `calm status` shows them.
    #[serde(default)]
    pub changelog_stored: Option<u64>,
    #[serde(default)]
    pub changelog_purged: Option<u64>,
    /// Records the changelog reader read and cleared in the period (`--site`).
    #[serde(default)]
    pub reader_records: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChurnRound {
    pub servers: usize,
    pub periods: Vec<ChurnPeriod>,
}

impl ChurnRound {
    pub fn pairs(&self) -> u64 {
        self.periods.iter().map(|p| p.pairs).sum()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChurnReport {
    pub bench: String,
    pub threads: usize,
    pub period_s: f64,
    /// The servers' `--trash-hours`, when the run set it (reports of earlier runs: their
    /// default, 24 hours, or no trash before there was one).
    #[serde(default)]
    pub trash_hours: Option<f64>,
    /// A `--site` run's conditions (reports of client runs: none).
    #[serde(default)]
    pub site: Option<SiteOptions>,
    pub rounds: Vec<ChurnRound>,
}

/// The latencies (µs) of the pairs done since the last take.
#[derive(Default)]
pub(crate) struct Latencies(std::sync::Mutex<Vec<u32>>);

impl Latencies {
    pub(crate) fn push(&self, us: u32) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(us);
    }

    pub(crate) fn take(&self) -> Vec<u32> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The 99th percentile of `values` (0 when there are none).
pub(crate) fn p99(mut values: Vec<u32>) -> u32 {
    if values.is_empty() {
        return 0;
    }
    let at = (values.len() * 99 / 100).min(values.len() - 1);
    *values.select_nth_unstable(at).1
}
