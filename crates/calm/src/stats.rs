//! `calm stats`: a running server's figures, or a mount's, every interval, as rates and
//! levels.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use calm_cli::mount_stats::{mount_header, mount_interval, mount_json, mount_line};
use calm_cli::stats::{
    HEADER_EVERY, header, interval, json, line, load_interval, load_json, load_lines,
};

pub fn run(
    server: &str,
    by: Option<&str>,
    every_s: f64,
    count: Option<u64>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    check_interval(every_s)?;
    // A worker of its own keeps the connection answered while this thread sleeps.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = runtime
        .block_on(calm_client::Client::connect(server))
        .with_context(|| format!("connecting to {server}"))?;
    let status = || {
        runtime
            .block_on(client.status())
            .with_context(|| format!("asking {server} for its figures"))
    };
    every(
        every_s,
        count,
        status,
        |out, shown, unix_ns, before, after, seconds| {
            let unix_ms = (unix_ns / 1_000_000) as u64;
            let (_, time) = calm_changelog::text::utc(unix_ns);
            if let Some(by) = by {
                let (then, now) = match by {
                    "job" => (&before.by_job, &after.by_job),
                    _ => (&before.by_uid, &after.by_uid),
                };
                let rates = load_interval(then, now, seconds);
                if as_json {
                    writeln!(out, "{}", load_json(unix_ms, by, &rates))?;
                } else {
                    for row in load_lines(&time[..8], by, &rates) {
                        writeln!(out, "{row}")?;
                    }
                }
                return Ok(());
            }
            let figures = interval(before, after, seconds);
            if as_json {
                writeln!(out, "{}", json(unix_ms, &figures))?;
            } else {
                if shown.is_multiple_of(HEADER_EVERY as u64) {
                    writeln!(out, "{}", header())?;
                }
                writeln!(out, "{}", line(&time[..8], &figures))?;
            }
            Ok(())
        },
    )
}

fn check_interval(every_s: f64) -> anyhow::Result<()> {
    if !(every_s.is_finite() && every_s >= 0.1) {
        bail!("--interval-s must be at least 0.1");
    }
    Ok(())
}

/// Takes a `sample` every `every_s` seconds, `count` times (for ever without), and has `show`
/// print each interval: the lines shown so far, the time (Unix ns), the samples at its start
/// and end, and its length in seconds.
fn every<T>(
    every_s: f64,
    count: Option<u64>,
    mut sample: impl FnMut() -> anyhow::Result<T>,
    mut show: impl FnMut(&mut std::io::Stdout, u64, i64, &T, &T, f64) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    let mut before = sample()?;
    let mut at = Instant::now();
    let mut shown = 0u64;
    let mut out = std::io::stdout();
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(Duration::from_secs_f64(every_s));
        let after = sample()?;
        let now = Instant::now();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let seconds = now.duration_since(at).as_secs_f64();
        show(&mut out, shown, unix_ns, &before, &after, seconds)?;
        out.flush()?;
        shown += 1;
        (before, at) = (after, now);
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a mount hands out its figures (`calm_fuse::metrics::METRICS_XATTR`).
const METRICS_XATTR: &std::ffi::CStr = c"calm.metrics";

/// The most a mount's figures take (the largest extended attribute Linux hands out).
const XATTR_BYTES_MAX: usize = 65536;

/// The samples the mount at `mountpoint` hands out.
fn mount_samples(mountpoint: &Path) -> anyhow::Result<calm_cli::mount_stats::Samples> {
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .context("a mount point without NUL bytes")?;
    let mut buf = vec![0u8; XATTR_BYTES_MAX];
    // SAFETY: `path` and the attribute's name are NUL-terminated; `buf` is writable for its
    // whole length.
    let len = unsafe {
        libc::getxattr(
            path.as_ptr(),
            METRICS_XATTR.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if len < 0 {
        let error = std::io::Error::last_os_error();
        bail!(
            "{} is not a calm mount, or not its root ({error})",
            mountpoint.display()
        );
    }
    buf.truncate(len as usize);
    Ok(calm_metrics::parse_samples(&String::from_utf8_lossy(&buf)))
}

/// `calm stats MOUNTPOINT`: the mount's figures every `every_s` seconds.
pub fn run_mount(
    mountpoint: &Path,
    every_s: f64,
    count: Option<u64>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    check_interval(every_s)?;
    let sample = || mount_samples(mountpoint);
    every(
        every_s,
        count,
        sample,
        |out, shown, unix_ns, before, after, seconds| {
            let figures = mount_interval(before, after, seconds);
            if as_json {
                writeln!(
                    out,
                    "{}",
                    mount_json((unix_ns / 1_000_000) as u64, &figures)
                )?;
            } else {
                if shown.is_multiple_of(HEADER_EVERY as u64) {
                    writeln!(out, "{}", mount_header())?;
                }
                let (_, time) = calm_changelog::text::utc(unix_ns);
                writeln!(out, "{}", mount_line(&time[..8], &figures))?;
            }
            Ok(())
        },
    )
}
