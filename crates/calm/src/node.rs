//! `calm target format`, `calm node`, `calm pools`: label targets, run the storage-node agent,
//! list its pools.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use calm_node::agent::{NodeOptions, run as run_agent};
use calm_node::label::{self, Label};

#[derive(Debug, clap::Subcommand)]
pub enum TargetCommand {
    /// Write a target label onto a block device (its first 512 bytes, which ext4 and btrfs
    /// leave unused: make the file system first) or into a directory.
    Format {
        path: PathBuf,
        #[arg(long)]
        pool: String,
        #[arg(long)]
        index: u32,
        #[arg(long)]
        count: u32,
        /// The pool's uuid (every member of a pool carries the same one; new when absent).
        #[arg(long)]
        pool_uuid: Option<String>,
        /// Raise it when re-creating a pool: older members become stale.
        #[arg(long, default_value_t = 1)]
        generation: u64,
    },
    /// Print a target's label.
    Show { path: PathBuf },
}

pub fn target(command: TargetCommand) -> anyhow::Result<ExitCode> {
    let (path, label) = match command {
        TargetCommand::Format {
            path,
            pool,
            index,
            count,
            pool_uuid,
            generation,
        } => {
            let label = Label::new_member(pool, index, count, pool_uuid.as_deref(), generation)
                .map_err(|e| anyhow!(e))?;
            label::write(&path, &label).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            (path, label)
        }
        TargetCommand::Show { path } => {
            let label = label::read(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
            (path, label)
        }
    };
    println!("{}: {}", path.display(), label.describe());
    Ok(ExitCode::SUCCESS)
}

static STOP: AtomicBool = AtomicBool::new(false);
static RESCAN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    if signal == libc::SIGHUP {
        RESCAN.store(true, Ordering::Release);
    } else {
        STOP.store(true, Ordering::Release);
    }
}

pub fn node(
    root: &Path,
    targets: Vec<PathBuf>,
    read_parallelism: usize,
    activation_workers: usize,
    degraded_after_s: Option<u64>,
    pools: Vec<String>,
    server: Option<&str>,
) -> anyhow::Result<ExitCode> {
    for t in &targets {
        if !t.is_dir() {
            bail!("--targets {}: not a directory", t.display());
        }
    }
    // SAFETY: installing an async-signal-safe handler (it only stores to an atomic).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
    }
    let options = NodeOptions {
        root: root.to_path_buf(),
        target_dirs: targets,
        read_parallelism,
        activation_workers,
        degraded_after: degraded_after_s.map(Duration::from_secs),
        pools,
    };
    // Registration with a metadata server: after each change of the pools, and every few
    // seconds (soft state). A failed registration is logged; the next one carries everything.
    let registrar = match server {
        Some(addr) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let client = runtime
                .block_on(calm_client::Client::connect(addr))
                .with_context(|| format!("connecting to {addr}"))?;
            Some((runtime, client, node_name()))
        }
        None => None,
    };
    let mut report = |targets: Vec<calm_node::agent::TargetSnapshot>| {
        let Some((runtime, client, node)) = &registrar else {
            return;
        };
        let registration = calm_proto::targets::registration(node, targets);
        if let Err(e) = runtime.block_on(client.register_targets(registration)) {
            tracing::warn!(%e, "registering targets with the metadata server");
        }
    };
    let figures = run_agent(
        &options,
        &STOP,
        &RESCAN,
        |f| {
            println!(
                "ready: {} devices scanned, {} targets, {} pools active",
                f.devices_scanned, f.targets, f.pools_active
            );
            let _ = std::io::stdout().flush();
        },
        &mut report,
    )
    .context("running the node agent")?;
    println!(
        "stopped: {} events, {} enumerations, {} pools activated",
        figures.events, figures.enumerations, figures.pools_active
    );
    Ok(ExitCode::SUCCESS)
}

/// This node's name in the registry: its host name.
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "node".into())
}

/// The pools as the metadata server's target registry has them.
pub fn pools_from_server(server: &str, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let targets = runtime.block_on(async {
        let client = calm_client::Client::connect(server).await?;
        client.list_targets().await
    })?;
    if json {
        println!("{}", calm_cli::json::targets(&targets));
        return Ok(ExitCode::SUCCESS);
    }
    for line in calm_proto::targets::table(&targets) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn pools(root: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let path = root.join("pools.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} (is calm node running with --root {}?)",
            path.display(),
            root.display()
        )
    })?;
    if json {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let table =
        calm_node::pools_file::table(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    for line in table {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
