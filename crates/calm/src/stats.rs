//! `calm stats`: a running server's figures, or a mount's, every interval, as rates and
//! levels.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use calm_client::mount_stats::{mount_header, mount_interval, mount_json, mount_line};
use calm_client::stats::{
    HEADER_EVERY, header, interval, json, line, load_interval, load_json, load_lines,
};

pub fn run(
    server: &str,
    by: Option<&str>,
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
            let seconds = now.duration_since(at).as_secs_f64();
            let figures = interval(&before, &after, seconds);
            let unix_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            if let Some(by) = by {
                let (then, now) = match by {
                    "job" => (&before.by_job, &after.by_job),
                    _ => (&before.by_uid, &after.by_uid),
                };
                let rates = load_interval(then, now, seconds);
                if as_json {
                    writeln!(
                        out,
                        "{}",
                        load_json((unix_ns / 1_000_000) as u64, by, &rates)
                    )?;
                } else {
                    let (_, time) = calm_changelog::text::utc(unix_ns);
                    for row in load_lines(&time[..8], by, &rates) {
                        writeln!(out, "{row}")?;
                    }
                }
            } else if as_json {
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

/// Where a mount hands out its figures (`calm_fuse::metrics::METRICS_XATTR`).
const METRICS_XATTR: &std::ffi::CStr = c"calm.metrics";

/// The most a mount's figures take (the largest extended attribute Linux hands out).
const XATTR_BYTES_MAX: usize = 65536;

/// The samples the mount at `mountpoint` hands out.
fn mount_samples(mountpoint: &Path) -> anyhow::Result<calm_client::mount_stats::Samples> {
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
    if !(every_s.is_finite() && every_s >= 0.1) {
        bail!("--interval-s must be at least 0.1");
    }
    let mut before = mount_samples(mountpoint)?;
    let mut at = Instant::now();
    let mut shown = 0u64;
    let mut out = std::io::stdout();
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(Duration::from_secs_f64(every_s));
        let after = mount_samples(mountpoint)?;
        let now = Instant::now();
        let figures = mount_interval(&before, &after, now.duration_since(at).as_secs_f64());
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
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
        out.flush()?;
        shown += 1;
        (before, at) = (after, now);
    }
    Ok(ExitCode::SUCCESS)
}
