//! `calm-bench appends`: what atomic appends cost. A file opened with O_APPEND bypasses the
//! kernel's page cache on a calm mount (direct I/O), so that one write(2) reaches the mount
//! whole and lands whole at the file's end whatever other mounts append. The baseline, in the
//! same run: mounts started with `--append-through-cache`, whose appends go through the page
//! cache as any other write (the kernel then cuts a write at every page it has not read).
//!
//! Measured: one writer appending lines through an O_APPEND descriptor on one mount, in rounds
//! that alternate the two kinds of mount (appends per second, the median of the rounds, and
//! the ratio); then two mounts of each kind appending records at once to one file each, and the
//! records torn (another's bytes inside one) counted.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::procs::{MountProcess, ServerProcess};

#[derive(Debug, Clone)]
pub struct AppendsOptions {
    pub calm: PathBuf,
    pub dir: PathBuf,
    /// Lines appended per round, and rounds of each kind.
    pub lines: u64,
    pub rounds: u32,
    /// Bytes of a line in the rounds.
    pub line_bytes: usize,
    /// Records each of two mounts appends at once in the tearing check, and their size.
    pub records: u64,
    pub record_bytes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct AppendRound {
    pub mount: &'static str,
    pub round: u32,
    pub appends_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Tearing {
    pub mount: &'static str,
    pub records: u64,
    pub torn: u64,
    pub bytes_expected: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AppendsReport {
    pub bench: &'static str,
    pub line_bytes: usize,
    pub rounds: Vec<AppendRound>,
    /// Medians of the rounds, appends per second.
    pub direct: f64,
    pub through_cache: f64,
    /// `direct / through_cache`.
    pub ratio: f64,
    pub tearing: Vec<Tearing>,
}

/// The two kinds of mount.
const DIRECT: &str = "calm (direct)";
const CACHED: &str = "calm (page cache)";

impl AppendsReport {
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{:>18} {:>6} {:>12}",
            "mount", "round", "appends/s"
        )];
        for r in &self.rounds {
            lines.push(format!(
                "{:>18} {:>6} {:>12.0}",
                r.mount, r.round, r.appends_per_s
            ));
        }
        lines.push(format!(
            "median: {DIRECT} {:.0}/s, {CACHED} {:.0}/s, ratio {:.3} ({}-byte lines, one writer)",
            self.direct, self.through_cache, self.ratio, self.line_bytes
        ));
        for t in &self.tearing {
            lines.push(format!(
                "two mounts appending at once, {}: {} of {} records torn; {} of {} bytes",
                t.mount, t.torn, t.records, t.bytes, t.bytes_expected
            ));
        }
        lines
    }
}

pub fn run(options: &AppendsOptions) -> Result<AppendsReport, String> {
    if options.lines == 0 || options.rounds == 0 || options.records == 0 {
        return Err("--lines, --rounds and --records must be positive".into());
    }
    if options.line_bytes < 24 || options.record_bytes < 24 {
        return Err("lines and records of at least 24 bytes, please".into());
    }
    crate::enter_private_namespace();
    let work = tempfile::Builder::new()
        .prefix("calm-bench-appends-")
        .tempdir_in(&options.dir)
        .map_err(|e| format!("{}: {e}", options.dir.display()))?;
    let server = ServerProcess::start(&options.calm, &work.path().join("data"), &[])?;
    let mount = |name: &str, args: &[&str]| {
        MountProcess::start(&options.calm, &work.path().join(name), &server.addr, args)
    };
    let direct = [mount("direct-a", &[])?, mount("direct-b", &[])?];
    let cached = [
        mount("cached-a", &["--append-through-cache"])?,
        mount("cached-b", &["--append-through-cache"])?,
    ];
    let mut rounds = Vec::new();
    for round in 1..=options.rounds {
        // Alternated, so that neither kind always runs on a warmer machine.
        let order = if round % 2 == 1 {
            [(DIRECT, &direct[0]), (CACHED, &cached[0])]
        } else {
            [(CACHED, &cached[0]), (DIRECT, &direct[0])]
        };
        for (name, mount) in order {
            let path = mount.mountpoint.join(format!("rate-{round}"));
            let seconds = append_lines(&path, 0, options.lines, options.line_bytes)?;
            rounds.push(AppendRound {
                mount: name,
                round,
                appends_per_s: options.lines as f64 / seconds,
            });
        }
    }
    let median = |name: &str| {
        let mut rates: Vec<f64> = rounds
            .iter()
            .filter(|r| r.mount == name)
            .map(|r| r.appends_per_s)
            .collect();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let (direct_rate, cached_rate) = (median(DIRECT), median(CACHED));
    let mut tearing = Vec::new();
    for (name, pair) in [(DIRECT, &direct), (CACHED, &cached)] {
        let file = format!("torn-{}", tearing.len());
        let results: Vec<Result<f64, String>> = std::thread::scope(|scope| {
            let workers: Vec<_> = pair
                .iter()
                .enumerate()
                .map(|(writer, mount)| {
                    let path = mount.mountpoint.join(&file);
                    scope.spawn(move || {
                        append_lines(&path, writer, options.records, options.record_bytes)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err("a writer panicked".into())))
                .collect()
        });
        for result in results {
            result?;
        }
        let bytes = std::fs::read(pair[0].mountpoint.join(&file))
            .map_err(|e| format!("reading {file}: {e}"))?;
        tearing.push(Tearing {
            mount: name,
            records: 2 * options.records,
            torn: torn(&bytes, options.record_bytes, 2 * options.records),
            bytes_expected: 2 * options.records * options.record_bytes as u64,
            bytes: bytes.len() as u64,
        });
    }
    for mount in direct.into_iter().chain(cached) {
        mount.process.stop()?;
    }
    server.process.stop()?;
    Ok(AppendsReport {
        bench: "appends",
        line_bytes: options.line_bytes,
        rounds,
        direct: direct_rate,
        through_cache: cached_rate,
        ratio: direct_rate / cached_rate,
        tearing,
    })
}

/// Line `n` of writer `writer`: `bytes` long, its writer and number first, a newline last.
fn record(writer: usize, n: u64, bytes: usize) -> Vec<u8> {
    let mut text = format!("w{writer} {n:012} ").into_bytes();
    text.resize(bytes - 1, b'a' + (n % 26) as u8);
    text.push(b'\n');
    text
}

/// Appends `count` records through one O_APPEND descriptor; the seconds it took.
fn append_lines(path: &Path, writer: usize, count: u64, bytes: usize) -> Result<f64, String> {
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let started = std::time::Instant::now();
    for n in 0..count {
        (&file)
            .write_all(&record(writer, n, bytes))
            .map_err(|e| format!("append {n} to {}: {e}", path.display()))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Of `expected` records of `bytes` bytes, those not found whole in `data` (each record ends
/// with the only newline it holds).
fn torn(data: &[u8], bytes: usize, expected: u64) -> u64 {
    let whole = data
        .split_inclusive(|b| *b == b'\n')
        .filter(|piece| {
            let text = String::from_utf8_lossy(piece);
            let record_of = text
                .strip_prefix('w')
                .and_then(|t| t.split_once(' '))
                .and_then(|(writer, rest)| {
                    let n: u64 = rest.get(..12)?.parse().ok()?;
                    Some(record(writer.parse().ok()?, n, bytes))
                });
            record_of.as_deref() == Some(*piece)
        })
        .count() as u64;
    expected.saturating_sub(whole)
}

/// Two panels: each round's appends per second on one mount, O_APPEND with direct I/O beside
/// through the page cache; and the records torn when two mounts append at once (`--plot`).
pub fn facets(report: &AppendsReport) -> Vec<crate::multiples::Facet> {
    let rounds = report.rounds.iter().map(|r| {
        crate::multiples::Cell::at(
            "appends on one mount",
            ("round", f64::from(r.round)),
            ("appends/s", r.appends_per_s),
            r.mount.to_string(),
        )
    });
    let torn = report.tearing.iter().map(|t| {
        crate::multiples::Cell::at(
            "records torn, two mounts at once",
            ("records appended", t.records as f64),
            ("records torn", t.torn as f64),
            t.mount,
        )
    });
    crate::multiples::facets_of(rounds.chain(torn))
}
