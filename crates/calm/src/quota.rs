//! `calm quota` and `calm summary`: limits on what users, groups and directory trees use,
//! asked of a running server.

use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use calm_cli::quota_tables::{parse_size, quota_json, quota_lines, resolve_path, summary_json};
use calm_client::{Client, QuotaLimits, QuotaTarget};
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set limits (the superuser only): on the tree at PATH, or on --user or --group over the
    /// whole namespace. A limit not named keeps its value; 0 removes it.
    Set {
        #[command(flatten)]
        whose: Whose,
        /// Most bytes (the sizes of regular files and the extended attributes of every inode;
        /// K, M, G, T suffixes).
        #[arg(long, value_parser = parse_size)]
        bytes: Option<u64>,
        /// Most inodes (files, directories, links, every kind).
        #[arg(long, value_parser = parse_size)]
        inodes: Option<u64>,
        /// Bytes past which growth goes on only for the grace period.
        #[arg(long, value_parser = parse_size)]
        soft_bytes: Option<u64>,
        /// Inodes past which growth goes on only for the grace period.
        #[arg(long, value_parser = parse_size)]
        soft_inodes: Option<u64>,
        /// Seconds growth may go on past a soft limit.
        #[arg(long)]
        grace_s: Option<u64>,
    },
    /// Show one quota: limits and usage.
    Get {
        #[command(flatten)]
        whose: Whose,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the quotas with a limit.
    List {
        /// Also every user and group that owns something, without a limit.
        #[arg(long)]
        all: bool,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Count usage from the namespace and compare it with the usage kept (reads every inode).
    Check {
        /// JSON lines instead of sentences.
        #[arg(long)]
        json: bool,
    },
}

/// Whose quota: a tree, a user or a group.
#[derive(Debug, Args)]
pub struct Whose {
    /// A directory: on a calm mount here, or inside the namespace from its root (/dir).
    #[arg(required_unless_present_any = ["user", "group"])]
    path: Option<String>,
    /// A user (uid), over the whole namespace.
    #[arg(long, conflicts_with_all = ["path", "group"])]
    user: Option<u32>,
    /// A group (gid), over the whole namespace.
    #[arg(long, conflicts_with_all = ["path", "user"])]
    group: Option<u32>,
}

/// A quota target with the name its answers give it (`user 1000`, `group 100`).
fn named(target: QuotaTarget) -> (QuotaTarget, String) {
    (target, target.to_string())
}

impl Whose {
    async fn target(&self, client: &Client) -> anyhow::Result<(QuotaTarget, String)> {
        Ok(match (&self.path, self.user, self.group) {
            (_, Some(uid), _) => named(QuotaTarget::user(uid)),
            (_, _, Some(gid)) => named(QuotaTarget::group(gid)),
            (Some(path), None, None) => {
                let dir = resolve_path(client, path)
                    .await
                    .with_context(|| format!("finding {path}"))?;
                (QuotaTarget::tree(dir), path.clone())
            }
            (None, None, None) => bail!("name a directory, --user or --group"),
        })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

pub fn run(server: &str, command: QuotaCommand) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let client = Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        match command {
            QuotaCommand::Set {
                whose,
                bytes,
                inodes,
                soft_bytes,
                soft_inodes,
                grace_s,
            } => {
                let (target, name) = whose.target(&client).await?;
                let old = client.quota(target).await.map_err(|e| anyhow!(e))?.limits;
                let limits = QuotaLimits {
                    bytes: bytes.unwrap_or(old.bytes),
                    inodes: inodes.unwrap_or(old.inodes),
                    soft_bytes: soft_bytes.unwrap_or(old.soft_bytes),
                    soft_inodes: soft_inodes.unwrap_or(old.soft_inodes),
                    grace_s: grace_s.unwrap_or(old.grace_s),
                };
                let report = client
                    .set_quota(target, limits)
                    .await
                    .with_context(|| format!("setting the quota of {name}"))?;
                for line in quota_lines(&[(name, report)], now_ns()) {
                    println!("{line}");
                }
            }
            QuotaCommand::Get { whose, json } => {
                let (target, name) = whose.target(&client).await?;
                let report = client
                    .quota(target)
                    .await
                    .with_context(|| format!("reading the quota of {name}"))?;
                if json {
                    println!("{}", quota_json(&name, &report));
                } else {
                    for line in quota_lines(&[(name, report)], now_ns()) {
                        println!("{line}");
                    }
                }
            }
            QuotaCommand::List { all, json } => {
                let reports = client.quotas(all).await.context("listing the quotas")?;
                let named: Vec<_> = reports
                    .into_iter()
                    .map(|r| (calm_cli::quota_tables::target_name(&r, &|_| None), r))
                    .collect();
                if json {
                    for (name, r) in &named {
                        println!("{}", quota_json(name, r));
                    }
                } else {
                    for line in quota_lines(&named, now_ns()) {
                        println!("{line}");
                    }
                }
            }
            QuotaCommand::Check { json } => {
                let mismatches = client.check_quotas().await.context("checking the quotas")?;
                for m in &mismatches {
                    if json {
                        println!(
                            "{}",
                            serde_json::json!({"quota": m.target.to_string(),
                            "kept": [m.kept.bytes, m.kept.inodes, m.kept.dirs],
                            "counted": [m.counted.bytes, m.counted.inodes, m.counted.dirs]})
                        );
                    } else {
                        println!("{m}");
                    }
                }
                if !mismatches.is_empty() {
                    return Ok(ExitCode::FAILURE);
                }
                if !json {
                    println!("every usage kept equals the usage counted");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `calm summary PATH`: the files, directories and bytes below a directory.
pub fn summary(server: &str, path: &str, json: bool) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let client = Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        let dir = resolve_path(&client, path)
            .await
            .with_context(|| format!("finding {path}"))?;
        let (usage, kept) = client
            .summary(dir)
            .await
            .with_context(|| format!("summing up {path}"))?;
        if json {
            println!("{}", summary_json(path, &usage, kept));
        } else {
            println!(
                "{path}: {} files, {} directories, {} bytes ({})",
                usage.inodes - usage.dirs,
                usage.dirs,
                usage.bytes,
                if kept {
                    "kept by its quota: read at once"
                } else {
                    "counted by walking the tree: no quota keeps it"
                }
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}
