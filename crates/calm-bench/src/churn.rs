//! `calm-bench churn`: creates and unlinks on 1, 2 and 3 `calm serve --store etcd://`
//! processes for N minutes each, reporting per minute the pair rate, its p99 latency, the
//! servers' CPU per pair and memory, and etcd's database size: what a namespace that has seen
//! millions of mutations costs, against what it cost in its first minute.
//!
//! Each round starts on a fresh local 3-member etcd cluster (or on a fresh key prefix of the
//! one `--store` names), so that its database size starts from nothing. Namespace clients in
//! this process (`threads`, homed round-robin on the servers) each create and unlink files in
//! a directory of their own, one request each, without pause. One pair = one create and its
//! unlink. A failed request ends the run with its error: no figure hides one.
//!
//! With `--site` ([`site`]), the round runs as a site does: through a mount of every server,
//! with files held open, a changelog reader and pauses.

mod model;
mod site;

pub use model::{ChurnOptions, ChurnPeriod, ChurnReport, ChurnRound, SiteOptions};
use model::{Latencies, p99};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use calm_client::Client;
use calm_meta::ROOT;

use crate::procs::ServerProcess;

/// Reads the report of an earlier run (its `--json` output).
pub fn load(path: &Path) -> Result<ChurnReport, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the churn report {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a churn report (`calm-bench churn --json`): {e}",
            path.display()
        )
    })
}

pub fn run(options: &ChurnOptions) -> Result<ChurnReport, String> {
    let dir = tempfile::Builder::new()
        .prefix("calm-bench-churn-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    if options.site.is_some() {
        // The mounts vanish with the benchmark, whatever ends it.
        crate::enter_private_namespace();
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut rounds = Vec::new();
    for &count in &options.servers {
        // A fresh cluster per round: its database starts empty.
        let (_cluster, url) = match (&options.site, &options.etcd) {
            (Some(_), None) => site_cluster()?,
            _ => crate::servers::cluster_or(&options.etcd)?,
        };
        let url = crate::servers::with_prefix(
            &url,
            &calm_testkit::etcd::unique_prefix(&format!("bench-churn-{count}")),
        );
        let round_dir = dir.path().join(format!("round-{count}"));
        std::fs::create_dir_all(&round_dir).map_err(|e| e.to_string())?;
        let periods = runtime.block_on(round(options, &url, &round_dir, count))?;
        rounds.push(ChurnRound {
            servers: count,
            periods,
        });
    }
    Ok(ChurnReport {
        bench: "churn".into(),
        threads: options.threads,
        period_s: options.period.as_secs_f64(),
        trash_hours: options.trash_hours,
        site: options.site,
        rounds,
    })
}

/// etcd's own limits of a transaction (operations, bytes), which a site's cluster keeps
/// unless its operator raised them; calm's defaults are the same.
const ETCD_DEFAULT_LIMITS: [&str; 4] = ["--max-txn-ops", "128", "--max-request-bytes", "1572864"];

/// A `--site` round's cluster: 3 local members with etcd's default limits (the test
/// clusters raise them), and its URL without limits (calm's defaults).
fn site_cluster() -> Result<(Option<calm_testkit::etcd::LocalCluster>, String), String> {
    let cluster = calm_testkit::etcd::LocalCluster::start_with(3, &ETCD_DEFAULT_LIMITS)?;
    let url = cluster.url("");
    let url = url
        .split_once('?')
        .map_or(url.as_str(), |(base, _)| base)
        .to_string();
    Ok((Some(cluster), url))
}

async fn round(
    options: &ChurnOptions,
    url: &str,
    dir: &Path,
    count: usize,
) -> Result<Vec<ChurnPeriod>, String> {
    let objects = format!("file://{}", dir.join("objects").display());
    let lease = options.lease_ms.to_string();
    let mut args = vec![
        "--store".to_string(),
        url.to_string(),
        "--objects".to_string(),
        objects,
        "--server-lease-ms".to_string(),
        lease,
    ];
    if let Some(hours) = options.trash_hours {
        args.extend(["--trash-hours".to_string(), hours.to_string()]);
    }
    // Every unlinked file goes to the trash (when there is one), as in the runs recorded
    // before young files skipped it: the churn's files live seconds. A site runs the
    // servers' default.
    if options.site.is_none() {
        args.extend(["--trash-min-age-s".to_string(), "0".to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut servers = Vec::new();
    for i in 0..count {
        servers.push(ServerProcess::start(
            &options.calm,
            &dir.join(format!("server-{i}")),
            &args,
        )?);
    }
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    crate::servers::all_joined(&addrs, count).await?;
    if let Some(site) = &options.site {
        let periods = site::round(options, site, url, dir, &servers).await?;
        for server in servers {
            server.process.stop()?;
        }
        return Ok(periods);
    }
    let first = Client::connect(addrs[0]).await.map_err(|e| e.to_string())?;
    let top = first
        .mkdir(ROOT, b"churn", 0o755)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Latencies::default());
    let mut tasks = Vec::new();
    for t in 0..options.threads.max(1) {
        let client = Client::connect(addrs[t % addrs.len()])
            .await
            .map_err(|e| e.to_string())?;
        let own = client
            .mkdir(top, format!("c{t}").as_bytes(), 0o755)
            .await
            .map_err(|e| e.to_string())?
            .handle;
        let stop = stop.clone();
        let latencies = latencies.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("f{i}");
                let started = Instant::now();
                client
                    .create(own, name.as_bytes(), 0o644)
                    .await
                    .map_err(|e| format!("create {name}: {e}"))?;
                client
                    .unlink(own, name.as_bytes())
                    .await
                    .map_err(|e| format!("unlink {name}: {e}"))?;
                latencies.push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
                i += 1;
            }
            Ok::<u64, String>(i)
        }));
    }
    let cpu_of =
        |servers: &[ServerProcess]| servers.iter().map(|s| s.process.cpu_us()).sum::<u64>();
    let mut periods = Vec::new();
    let mut cpu = cpu_of(&servers);
    let mut started = Instant::now();
    let mut failed = None;
    for period in 1..=options.periods {
        let end = started + options.period;
        // Wakes early when a client failed, to report it at once.
        while Instant::now() < end && !tasks.iter().any(|t| t.is_finished()) {
            tokio::time::sleep(Duration::from_millis(200).min(end - Instant::now())).await;
        }
        let done = latencies.take();
        let elapsed = started.elapsed().as_secs_f64();
        started = Instant::now();
        let now_cpu = cpu_of(&servers);
        let (db, in_use) = calm_testkit::etcd::db_size(url)?;
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let pairs = done.len() as u64;
        let figures = ChurnPeriod {
            period,
            pairs,
            pairs_per_sec: pairs as f64 / elapsed,
            p99_ms: p99(done) as f64 / 1000.0,
            cpu_us_per_pair: now_cpu.saturating_sub(cpu) as f64 / pairs.max(1) as f64,
            servers_rss_mib: mib(servers.iter().map(|s| s.process.rss_bytes()).sum()),
            db_mib: mib(db),
            db_in_use_mib: mib(in_use),
            paused_s: 0.0,
            mount_pairs_per_sec: Vec::new(),
            changelog_stored: None,
            changelog_purged: None,
            reader_records: None,
        };
        cpu = now_cpu;
        eprintln!(
            "churn: {count} server(s), period {period}/{}: {:.0} pairs/s, p99 {:.1} ms, \
             database {:.1} MiB ({:.1} in use)",
            options.periods,
            figures.pairs_per_sec,
            figures.p99_ms,
            figures.db_mib,
            figures.db_in_use_mib
        );
        periods.push(figures);
        if tasks.iter().any(|t| t.is_finished()) {
            failed = Some(period);
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    if let Some(period) = failed {
        return Err(format!(
            "a client stopped in period {period} without an error"
        ));
    }
    for server in servers {
        server.process.stop()?;
    }
    Ok(periods)
}

/// Per round: each period's figures, the rate against the round's first period, and the
/// round's summary (pairs, first period against last). A `--site` report adds each period's
/// pause, its rate per mount and the changelog's counts.
pub fn table(report: &ChurnReport) -> Vec<String> {
    let mut header = format!(
        "{:<8} {:>6} {:>9} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10}",
        "servers",
        "period",
        "pairs/s",
        "vs 1st",
        "p99 ms",
        "cpu µs/pr",
        "rss MiB",
        "db MiB",
        "in use MiB"
    );
    if report.site.is_some() {
        header.push_str(&format!(
            " {:>7} {:>17} {:>10} {:>11} {:>10}",
            "pause s", "per mount", "cl stored", "cl purged", "cl read"
        ));
    }
    let mut lines = vec![header];
    for round in &report.rounds {
        let first = round.periods.first().map_or(0.0, |p| p.pairs_per_sec);
        for p in &round.periods {
            let mut line = format!(
                "{:<8} {:>6} {:>9.0} {:>7.2}x {:>8.1} {:>10.0} {:>9.1} {:>9.1} {:>10.1}",
                round.servers,
                p.period,
                p.pairs_per_sec,
                p.pairs_per_sec / first.max(f64::MIN_POSITIVE),
                p.p99_ms,
                p.cpu_us_per_pair,
                p.servers_rss_mib,
                p.db_mib,
                p.db_in_use_mib
            );
            if report.site.is_some() {
                let count = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
                line.push_str(&format!(
                    " {:>7.0} {:>17} {:>10} {:>11} {:>10}",
                    p.paused_s,
                    p.mount_pairs_per_sec
                        .iter()
                        .map(|r| format!("{r:.0}"))
                        .collect::<Vec<_>>()
                        .join("/"),
                    count(p.changelog_stored),
                    count(p.changelog_purged),
                    count(p.reader_records),
                ));
            }
            lines.push(line);
        }
        lines.extend(summary(round, report.period_s));
    }
    if let Some(site) = &report.site {
        lines.push(format!(
            "as a site runs it: a mount of each server, a file held open on each, a changelog \
             reader reading and clearing, a {:.0} s pause every {} periods (rates count the \
             time outside pauses)",
            site.pause.as_secs_f64(),
            site.pause_every
        ));
    }
    match report.trash_hours {
        Some(hours) if hours > 0.0 => lines.push(format!(
            "the servers kept unlinked files in the trash for {hours} hours"
        )),
        Some(_) => lines.push("the servers kept no trash: the namespace stayed its size".into()),
        None => {}
    }
    lines
}

/// A round's summary: its pairs, its last period and its slowest against its first, etcd's
/// database first and last, and (when counted) the changelog's stored records at their most.
fn summary(round: &ChurnRound, period_s: f64) -> Option<String> {
    let (a, b) = (round.periods.first()?, round.periods.last()?);
    let first = a.pairs_per_sec.max(f64::MIN_POSITIVE);
    let slowest = round
        .periods
        .iter()
        .map(|p| p.pairs_per_sec)
        .fold(f64::INFINITY, f64::min);
    let mut line = format!(
        "{} server(s): {} pairs in {:.0} min; last period {:.2}x the first, slowest {:.2}x; \
         database {:.1} → {:.1} MiB ({:.1} → {:.1} in use)",
        round.servers,
        round.pairs(),
        round.periods.len() as f64 * period_s / 60.0,
        b.pairs_per_sec / first,
        slowest / first,
        a.db_mib,
        b.db_mib,
        a.db_in_use_mib,
        b.db_in_use_mib
    );
    if let (Some(most), Some(purged)) = (
        round
            .periods
            .iter()
            .filter_map(|p| p.changelog_stored)
            .max(),
        b.changelog_purged,
    ) {
        line.push_str(&format!(
            "; changelog at most {most} records stored, {purged} purged"
        ));
    }
    Some(line)
}

/// The rounds over their periods, for `--plot`: pairs per second, p99 latency, etcd's database
/// (file and in use) and the servers' memory, each a panel with a line per server count.
pub fn plot(report: &ChurnReport, path: &Path) -> Result<(), String> {
    type Figure = fn(&ChurnPeriod) -> f64;
    let figures: [(&str, &str, Figure); 5] = [
        ("creates + unlinks", "per second", |p| p.pairs_per_sec),
        ("p99 latency of a pair", "ms", |p| p.p99_ms),
        ("etcd database file", "MiB", |p| p.db_mib),
        ("etcd database in use", "MiB", |p| p.db_in_use_mib),
        ("servers' resident memory (summed)", "MiB", |p| {
            p.servers_rss_mib
        }),
    ];
    let minutes = |p: &ChurnPeriod| f64::from(p.period) * report.period_s / 60.0;
    let series = |servers: usize| match servers {
        1 => "calm, 1 server".to_string(),
        n => format!("calm, {n} servers"),
    };
    let mut cells: Vec<crate::multiples::Cell> = figures
        .iter()
        .flat_map(|(panel, unit, figure)| {
            report.rounds.iter().flat_map(move |round| {
                round.periods.iter().map(move |p| {
                    crate::multiples::Cell::at(
                        panel.to_string(),
                        ("minutes", minutes(p)),
                        (unit.to_string(), figure(p)),
                        series(round.servers),
                    )
                })
            })
        })
        .collect();
    for round in &report.rounds {
        for p in &round.periods {
            for (m, rate) in p.mount_pairs_per_sec.iter().enumerate() {
                cells.push(crate::multiples::Cell::at(
                    "creates + unlinks through each mount",
                    ("minutes", minutes(p)),
                    ("per second", *rate),
                    format!("mount of server {} of {}", m + 1, round.servers),
                ));
            }
            if let Some(stored) = p.changelog_stored {
                cells.push(crate::multiples::Cell::at(
                    "changelog records stored",
                    ("minutes", minutes(p)),
                    ("records", stored as f64),
                    series(round.servers),
                ));
            }
        }
    }
    let title = match &report.site {
        Some(site) => format!(
            "calm-bench churn --site: {} threads, a mount per server, files held open, a \
             changelog reader, {:.0} s pauses every {} periods of {:.0} s",
            report.threads,
            site.pause.as_secs_f64(),
            site.pause_every,
            report.period_s
        ),
        None => format!(
            "calm-bench churn on etcd: {} clients creating and unlinking, per period of {:.0} s",
            report.threads, report.period_s
        ),
    };
    crate::multiples::small_multiples_svg(path, &title, &crate::multiples::facets_of(cells))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_the_value_below_which_99_in_100_fall() {
        assert_eq!(p99(Vec::new()), 0);
        assert_eq!(p99(vec![5]), 5);
        let values: Vec<u32> = (1..=1000).rev().collect();
        assert_eq!(p99(values), 991);
    }

    #[test]
    fn the_table_sets_each_period_against_its_rounds_first() {
        let period = |period, pairs_per_sec, db_mib| ChurnPeriod {
            period,
            pairs: (pairs_per_sec * 60.0) as u64,
            pairs_per_sec,
            p99_ms: 1.0,
            cpu_us_per_pair: 100.0,
            servers_rss_mib: 10.0,
            db_mib,
            db_in_use_mib: db_mib,
            paused_s: 0.0,
            mount_pairs_per_sec: Vec::new(),
            changelog_stored: None,
            changelog_purged: None,
            reader_records: None,
        };
        let report = ChurnReport {
            bench: "churn".into(),
            threads: 16,
            period_s: 60.0,
            trash_hours: None,
            site: None,
            rounds: vec![ChurnRound {
                servers: 2,
                periods: vec![period(1, 400.0, 10.0), period(2, 300.0, 20.0)],
            }],
        };
        let lines = table(&report);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[2].contains("0.75x"), "{}", lines[2]);
        assert_eq!(
            lines[3],
            "2 server(s): 42000 pairs in 2 min; last period 0.75x the first, slowest 0.75x; \
             database 10.0 → 20.0 MiB (10.0 → 20.0 in use)"
        );
    }
}
