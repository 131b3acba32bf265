//! `calm-bench`: measures calm against its baselines and peers, each in the same run. A binary
//! of its own, so that no server or mount a site runs links the benchmarks; the servers and
//! mounts it measures are the `calm` binary beside it (or `--calm` where a benchmark takes one).

use std::process::ExitCode;

use clap::Parser;

/// calm-bench: measure calm against its baselines and peers, each in the same run.
#[derive(Debug, Parser)]
#[command(name = "calm-bench", version)]
struct Cli {
    #[command(subcommand)]
    bench: calm_bench::cli::Bench,
}

fn main() -> ExitCode {
    // The allocator set as the calm binary sets it, so that what runs in this process is
    // measured as it runs there.
    calm_server::heap::tune_malloc();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("CALM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match calm_bench::cli::run(cli.bench) {
        Ok(output) => {
            // The table on stdout, or on stderr when the report goes to stdout as JSON.
            for line in &output.table {
                match output.json {
                    Some(_) => eprintln!("{line}"),
                    None => println!("{line}"),
                }
            }
            if let Some(json) = &output.json {
                println!("{json}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("calm-bench: {error}");
            ExitCode::from(2)
        }
    }
}
