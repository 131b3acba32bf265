//! `calm-bench soak` and `calm-bench appends`: the flags, wired to `crate::soak` and
//! `crate::appends`.

use std::path::PathBuf;

use super::output::{Output, OutputArgs, calm_exe, panels};

type Result<T> = std::result::Result<T, String>;

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// How long the run lasts, in minutes (each a reporting period).
    #[arg(long, default_value_t = 30)]
    minutes: u32,
    /// Length of a reporting period, in seconds (60: a minute; shorter for a quick look).
    #[arg(long, default_value_t = 60)]
    period_s: u64,
    /// Mounts of the one server, each running every workload.
    #[arg(long, default_value_t = 2)]
    mounts: usize,
    /// The namespace's object store (s3://BUCKET[/PREFIX]?endpoint=URL&region=R, credentials
    /// from the AWS environment variables); default: a local directory beside the store.
    #[arg(long)]
    s3: Option<String>,
    /// Where the store and the mount points go.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    #[command(flatten)]
    out: OutputArgs,
    /// Run nothing: read the report of an earlier run (its --json output) and print it, and
    /// draw it with --plot.
    #[arg(long, value_name = "REPORT_JSON")]
    replot: Option<PathBuf>,
}

/// Runs the soak: the table, the report (with `--json`) and the plot; an error when a check
/// failed.
pub fn run_soak(args: SoakArgs) -> Result<Output> {
    let options = crate::soak::SoakOptions {
        calm: calm_exe(None)?,
        dir: args.dir,
        periods: args.minutes,
        period: std::time::Duration::from_secs(args.period_s),
        mounts: args.mounts,
        objects: args.s3,
    };
    let report = match &args.replot {
        Some(path) => crate::soak::load(path)?,
        None => crate::soak::run(&options)?,
    };
    let output = args.out.finish(report.lines(), &report, |path| {
        crate::soak::plot(&report, path)
    })?;
    if !report.ok() {
        return Err(format!(
            "{}\nthe soak's checks failed (above)",
            output.table.join("\n")
        ));
    }
    Ok(output)
}

#[derive(Debug, clap::Args)]
pub struct AppendsArgs {
    /// Lines one writer appends per round, rounds of each kind of mount, and bytes per line.
    #[arg(long, default_value_t = 20_000)]
    lines: u64,
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    #[arg(long, default_value_t = 100)]
    line_bytes: usize,
    /// Records each of two mounts appends at once in the tearing check, and bytes per record.
    #[arg(long, default_value_t = 2_000)]
    records: u64,
    #[arg(long, default_value_t = 1_000)]
    record_bytes: usize,
    /// Where the store and the mount points go.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    #[command(flatten)]
    out: OutputArgs,
}

/// Runs the appends benchmark: the table, the report (with `--json`) and the plot.
pub fn run_appends(args: AppendsArgs) -> Result<Output> {
    let options = crate::appends::AppendsOptions {
        calm: calm_exe(None)?,
        dir: args.dir,
        lines: args.lines,
        rounds: args.rounds,
        line_bytes: args.line_bytes,
        records: args.records,
        record_bytes: args.record_bytes,
    };
    let report = crate::appends::run(&options)?;
    args.out.finish(
        report.lines(),
        &report,
        panels(
            "calm-bench appends: O_APPEND on one mount, and whole records across two",
            || crate::appends::facets(&report),
        ),
    )
}
