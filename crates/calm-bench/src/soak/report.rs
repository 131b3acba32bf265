//! What a soak run reports: its options, each minute's figures per workload, the checks at
//! the end, and the report as it is saved and loaded again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The report a run wrote with `--json`, read back (to draw its plot again).
pub fn load(path: &Path) -> Result<SoakReport, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the soak report {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a soak report (`calm-bench soak --json`): {e}",
            path.display()
        )
    })
}

/// The workloads, in report order.
pub const WORKLOADS: [&str; 4] = ["append", "fsync-write", "sqlite", "create+unlink"];
/// Bytes of a log line (every line the same length, its mount and number at its start).
pub const LINE_BYTES: usize = 100;
/// The shared database file: 4 MiB of 4 KiB pages.
pub const DB_PAGES: u64 = 1024;
pub const PAGE_BYTES: u64 = 4096;
/// Small files each mount keeps at once (each create past it removes the oldest).
pub const FILES_KEPT: u64 = 1000;

#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The `calm` executable to run the server and the mounts with.
    pub calm: PathBuf,
    /// Where the data directory and the mount points go.
    pub dir: PathBuf,
    /// Reporting periods, and the length of one (a minute; shorter for a quick check).
    pub periods: u32,
    pub period: Duration,
    pub mounts: usize,
    /// The namespace's object store (`s3://…`; default: a local directory).
    pub objects: Option<String>,
}

/// One workload in one period.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadFigures {
    pub workload: String,
    pub ops: u64,
    pub ops_per_s: f64,
    /// `ops_per_s` over the first period's.
    pub ratio_to_first: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeriodFigures {
    /// 1 for the first.
    pub period: u32,
    pub workloads: Vec<WorkloadFigures>,
    /// The most records one chunk of the hot files (log, database file, sqlite's database
    /// and journal) held at the period's end.
    pub records_per_chunk: u64,
    /// The server's high-water mark of records a write left in a chunk, since its start.
    pub records_per_chunk_high: u64,
    pub server_rss_mib: f64,
    /// The part of the server's resident memory no file backs (its heap; the rest is mostly
    /// the metadata store's mapped file).
    pub server_anon_mib: f64,
    /// Of the server's heap, what its allocator counts as allocated now (`calm status`; 0 in
    /// reports from before it did).
    #[serde(default)]
    pub server_heap_in_use_mib: f64,
    /// What the server's allocator holds free without returning it to the system.
    #[serde(default)]
    pub server_heap_free_mib: f64,
    /// Of what is in use, the server's caches of the object store (whole blocks and block
    /// headers, each bounded).
    #[serde(default)]
    pub server_cached_mib: f64,
    pub mount_rss_mib: Vec<f64>,
    /// The part of each mount's resident memory no file backs (its heap; the rest is mostly
    /// the program's own code, paged in as it is used).
    pub mount_anon_mib: Vec<f64>,
}

/// What the end-of-run checks found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakChecks {
    pub log_lines: u64,
    pub log_lines_bad: u64,
    pub db_pages_differing: u64,
    pub sqlite_rows: u64,
    pub sqlite_rows_expected: u64,
    pub sqlite_integrity: String,
    pub store_clean: bool,
    pub objects_leaked: u64,
    pub records_per_chunk_max: u64,
    /// Operations that failed (each is also an error of the run).
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakReport {
    pub bench: String,
    pub period_s: f64,
    pub mounts: usize,
    pub objects: String,
    pub periods: Vec<PeriodFigures>,
    pub checks: SoakChecks,
}

impl SoakReport {
    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        let c = &self.checks;
        c.failures.is_empty()
            && c.log_lines_bad == 0
            && c.db_pages_differing == 0
            && c.sqlite_rows == c.sqlite_rows_expected
            && c.sqlite_integrity == "ok"
            && c.store_clean
            && c.objects_leaked == 0
    }

    /// The report as a table: a line per period and workload, then memory, then the checks.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{:>6} {:>14} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "period", "workload", "ops", "ops/s", "vs first", "p50 ms", "p99 ms"
        )];
        for p in &self.periods {
            for w in &p.workloads {
                lines.push(format!(
                    "{:>6} {:>14} {:>9} {:>9.0} {:>9.2} {:>9.2} {:>9.2}",
                    p.period, w.workload, w.ops, w.ops_per_s, w.ratio_to_first, w.p50_ms, w.p99_ms
                ));
            }
        }
        lines.push(format!(
            "{:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {} {}",
            "period",
            "records/chunk",
            "(high)",
            "server MiB",
            "(heap)",
            "(in use)",
            "(free)",
            "(caches)",
            "mounts MiB",
            "(heap)"
        ));
        let mibs = |figures: &[f64]| {
            figures
                .iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for p in &self.periods {
            lines.push(format!(
                "{:>6} {:>12} {:>12} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {} ({})",
                p.period,
                p.records_per_chunk,
                p.records_per_chunk_high,
                p.server_rss_mib,
                p.server_anon_mib,
                p.server_heap_in_use_mib,
                p.server_heap_free_mib,
                p.server_cached_mib,
                mibs(&p.mount_rss_mib),
                mibs(&p.mount_anon_mib),
            ));
        }
        let c = &self.checks;
        lines.push(format!(
            "checks: log {} lines, {} bad; database file {} pages differing; sqlite {} of {} \
             rows, integrity {}; store clean {}; {} objects leaked; at most {} records in a chunk",
            c.log_lines,
            c.log_lines_bad,
            c.db_pages_differing,
            c.sqlite_rows,
            c.sqlite_rows_expected,
            c.sqlite_integrity,
            c.store_clean,
            c.objects_leaked,
            c.records_per_chunk_max
        ));
        for failure in &c.failures {
            lines.push(format!("FAILED: {failure}"));
        }
        lines.push(format!(
            "{} mounts of one server, object store {}, periods of {} s",
            self.mounts, self.objects, self.period_s
        ));
        lines
    }
}
