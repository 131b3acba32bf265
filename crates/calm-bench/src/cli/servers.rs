//! `calm-bench servers`: the flags, wired to `crate::servers`.

use super::output::{Output, OutputArgs, calm_exe, panels};

type Result<T> = std::result::Result<T, String>;
#[derive(Debug, clap::Args)]
pub struct ServersArgs {
    /// Server counts, comma-separated (the failover is measured in a round of 3).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    servers: Vec<usize>,
    /// Namespace clients of the create and stat rounds.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Files created and stat'ed per round.
    #[arg(long, default_value_t = 20_000)]
    files: u64,
    /// Lock clients of the lock rounds.
    #[arg(long, default_value_t = 16)]
    lock_clients: usize,
    /// Lock requests per lock round.
    #[arg(long, default_value_t = 100_000)]
    lock_ops: u64,
    /// The servers' membership lease, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    lease_ms: u64,
    /// Threads of the create + unlink rounds (namespace clients in this process, then
    /// system calls through a mount of the first server).
    #[arg(long, default_value_t = 16)]
    pair_threads: usize,
    /// An etcd cluster (etcd://HOST:PORT,...) instead of a local 3-member one.
    #[arg(long)]
    store: Option<String>,
    /// The calm executable that runs the servers and the mount (default: the calm beside this program), e.g. an
    /// earlier build to compare with.
    #[arg(long)]
    calm: Option<std::path::PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

/// Runs the benchmark: the table, the report when `--json` asks for it, the plot.
pub fn run(args: ServersArgs) -> Result<Output> {
    let options = crate::servers::ServersOptions {
        servers: args.servers,
        clients: args.clients,
        files: args.files,
        lock_clients: args.lock_clients,
        lock_ops: args.lock_ops,
        lease_ms: args.lease_ms,
        etcd: args.store,
        pair_threads: args.pair_threads,
        calm: calm_exe(args.calm)?,
    };
    let report = crate::servers::run(&options)?;
    args.out.finish(
        crate::servers::table(&report),
        &report,
        panels(
            "calm-bench servers: several servers of one namespace on etcd",
            || crate::servers::facets(&report),
        ),
    )
}

#[derive(Debug, clap::Args)]
pub struct ChurnArgs {
    /// Server counts, comma-separated: one round each, on a fresh etcd cluster.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    servers: Vec<usize>,
    /// How long each round lasts, in minutes (each a reporting period).
    #[arg(long, default_value_t = 30)]
    minutes: u32,
    /// Length of a reporting period, in seconds (60: a minute; shorter for a quick look).
    #[arg(long, default_value_t = 60)]
    period_s: u64,
    /// Clients creating and unlinking at once, each in a directory of its own.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// The servers' membership lease, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    lease_ms: u64,
    /// How long the servers keep unlinked files in the trash, in hours (the servers' own
    /// default when not given: every file of the round stays in the namespace for its whole
    /// length; 0: no trash, the namespace stays the same size).
    #[arg(long)]
    trash_hours: Option<f64>,
    /// An etcd cluster (etcd://HOST:PORT,...) instead of a fresh local 3-member one per round.
    #[arg(long)]
    store: Option<String>,
    /// The calm executable that runs the servers (default: this one).
    #[arg(long)]
    calm: Option<std::path::PathBuf>,
    /// Run as a site does: a mount of every server (the threads spread over them, each in a
    /// directory of its own), a file held open on each mount, a changelog reader reading and
    /// clearing, and a pause every few periods. Needs root and FUSE.
    #[arg(long)]
    site: bool,
    /// With --site: every this many periods, one begins with a pause.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pause_every: u32,
    /// With --site: how long a pause lasts, in seconds (at most half a period).
    #[arg(long, default_value_t = 30)]
    pause_s: u64,
    #[command(flatten)]
    out: OutputArgs,
    /// Run nothing: read the report of an earlier run (its --json output) and print it, and
    /// draw it with --plot.
    #[arg(long, value_name = "REPORT_JSON")]
    replot: Option<std::path::PathBuf>,
}

/// Runs the churn benchmark (or reads an earlier report): the table, the report when `--json`
/// asks for it, the plot.
pub fn run_churn(args: ChurnArgs) -> Result<Output> {
    let report = match &args.replot {
        Some(path) => crate::churn::load(path)?,
        None => {
            let options = crate::churn::ChurnOptions {
                servers: args.servers,
                periods: args.minutes * 60 / args.period_s.max(1) as u32,
                period: std::time::Duration::from_secs(args.period_s.max(1)),
                threads: args.threads,
                lease_ms: args.lease_ms,
                trash_hours: args.trash_hours,
                etcd: args.store,
                calm: calm_exe(args.calm)?,
                site: args.site.then_some(crate::churn::SiteOptions {
                    pause_every: args.pause_every,
                    pause: std::time::Duration::from_secs(args.pause_s),
                }),
            };
            crate::churn::run(&options)?
        }
    };
    args.out
        .finish(crate::churn::table(&report), &report, |path| {
            crate::churn::plot(&report, path)
        })
}

#[derive(Debug, clap::Args)]
pub struct ClustersArgs {
    /// Cluster counts, comma-separated: one round each per pass (1 is the baseline).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    clusters: Vec<usize>,
    /// Members of each local etcd cluster.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Clients creating at once, each in a directory of the root of its own.
    #[arg(long, default_value_t = 48)]
    clients: usize,
    /// How long each round creates, in seconds.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Passes over the counts, every other one in the reverse order.
    #[arg(long, default_value_t = 2)]
    passes: usize,
    #[command(flatten)]
    out: OutputArgs,
}

/// Runs the clusters benchmark: the table, the results when `--json` asks for them, the plot.
pub fn run_clusters(args: ClustersArgs) -> Result<Output> {
    let options = crate::clusters::ClustersOptions {
        counts: args.clusters,
        members: args.members,
        clients: args.clients,
        seconds: args.seconds,
        passes: args.passes,
    };
    let results = crate::clusters::run(&options)?;
    args.out.finish(
        crate::clusters::table(&results),
        &results,
        panels(
            "calm-bench clusters: creates in one namespace over several metadata clusters",
            || crate::clusters::facets(&results),
        ),
    )
}
