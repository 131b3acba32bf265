//! `calm stats`: a running server's figures every interval, as rates and levels.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use calm_client::stats::{HEADER_EVERY, header, interval, json, line};

pub fn run(
    server: &str,
    every_s: f64,
    count: Option<u64>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    if !(every_s.is_finite() && every_s >= 0.1) {
        bail!("--interval-s must be at least 0.1");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = calm_client::Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        let mut before = client
            .status()
            .await
            .with_context(|| format!("asking {server} for its figures"))?;
        let mut at = Instant::now();
        let mut shown = 0u64;
        let mut out = std::io::stdout();
        while count.is_none_or(|c| shown < c) {
            tokio::time::sleep(Duration::from_secs_f64(every_s)).await;
            let after = client
                .status()
                .await
                .with_context(|| format!("asking {server} for its figures"))?;
            let now = Instant::now();
            let figures = interval(&before, &after, now.duration_since(at).as_secs_f64());
            let unix_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            if as_json {
                writeln!(out, "{}", json((unix_ns / 1_000_000) as u64, &figures))?;
            } else {
                if shown.is_multiple_of(HEADER_EVERY as u64) {
                    writeln!(out, "{}", header())?;
                }
                let (_, time) = calm_changelog::text::utc(unix_ns);
                writeln!(out, "{}", line(&time[..8], &figures))?;
            }
            out.flush()?;
            shown += 1;
            (before, at) = (after, now);
        }
        Ok(ExitCode::SUCCESS)
    })
}
