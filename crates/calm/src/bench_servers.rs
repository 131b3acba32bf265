//! `calm bench servers`: the flags, wired to `calm_bench::servers`.

use anyhow::anyhow;

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
    /// The calm executable that runs the servers and the mount (default: this one), e.g. an
    /// earlier build to compare with.
    #[arg(long)]
    calm: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

/// Runs the benchmark: the table, and the report when `--json` asks for it.
pub fn run(
    args: ServersArgs,
) -> anyhow::Result<(Vec<String>, Option<calm_bench::servers::ServersReport>)> {
    let options = calm_bench::servers::ServersOptions {
        servers: args.servers,
        clients: args.clients,
        files: args.files,
        lock_clients: args.lock_clients,
        lock_ops: args.lock_ops,
        lease_ms: args.lease_ms,
        etcd: args.store,
        pair_threads: args.pair_threads,
        calm: match args.calm {
            Some(calm) => calm,
            None => std::env::current_exe()?,
        },
    };
    let report = calm_bench::servers::run(&options).map_err(|e| anyhow!(e))?;
    let lines = calm_bench::servers::table(&report);
    Ok((lines, args.json.then_some(report)))
}
