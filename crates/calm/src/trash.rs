//! `calm trash`: what was removed, kept for a while by a server started with --trash-hours;
//! list it, restore it, purge it.

use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use calm_client::Client;
use calm_client::trash::{json, lines, list_all, purge_plan, restore_plan, run_levels};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum TrashCommand {
    /// What the trash holds (an administrator sees every user's; anyone else their own): its
    /// id, when it was removed, its owner, size and the path it had.
    List {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Put entries back where they were (under NAME.restored-ID when the name is taken; in
    /// the root when the directory is gone). A directory comes back with everything removed
    /// from below it; directories above an entry that are in the trash too come back first.
    Restore {
        /// Entry ids, as `calm trash list` shows them.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Destroy entries now (with everything removed from below a directory) and give their
    /// space back.
    Purge {
        /// Entry ids, as `calm trash list` shows them.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<u64>,
        /// Every entry the caller may take (an administrator: the whole trash).
        #[arg(long)]
        all: bool,
    },
}

pub fn run(server: &str, command: TrashCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        let entries = list_all(&client).await.context("listing the trash")?;
        match command {
            TrashCommand::List { json: as_json } => {
                if as_json {
                    entries.iter().for_each(|e| println!("{}", json(e)));
                } else {
                    lines(&entries).iter().for_each(|l| println!("{l}"));
                }
            }
            TrashCommand::Restore { ids } => {
                for id in ids {
                    let levels = restore_plan(&entries, id)
                        .map_err(|_| anyhow!("entry {id} is not in the trash (calm trash list)"))?;
                    let (done, failed) = run_levels(&client, levels, |client, handle| async move {
                        client.trash_restore(handle).await
                    })
                    .await;
                    for (handle, restored) in &done {
                        if *handle == id {
                            println!(
                                "restored {id} as {} in directory {}",
                                String::from_utf8_lossy(&restored.name),
                                restored.parent
                            );
                        }
                    }
                    if done.len() > 1 {
                        println!("restored {} entries with {id}", done.len() - 1);
                    }
                    if let Some((handle, error)) = failed {
                        bail!("restoring entry {handle}: {error}");
                    }
                }
            }
            TrashCommand::Purge { ids, all } => {
                let handles: Vec<u64> = if all {
                    entries.iter().map(|e| e.handle).collect()
                } else {
                    let mut handles = Vec::new();
                    for id in ids {
                        handles.extend(purge_plan(&entries, id).map_err(|_| {
                            anyhow!("entry {id} is not in the trash (calm trash list)")
                        })?);
                    }
                    handles
                };
                let taken: std::collections::HashSet<u64> = handles.iter().copied().collect();
                let bytes: u64 = entries
                    .iter()
                    .filter(|e| taken.contains(&e.handle))
                    .map(|e| e.size)
                    .sum();
                let (done, failed) =
                    run_levels(&client, vec![handles], |client, handle| async move {
                        client.trash_purge(handle).await
                    })
                    .await;
                println!("purged {} entries ({bytes} bytes)", done.len());
                if let Some((handle, error)) = failed {
                    bail!("purging entry {handle}: {error}");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
