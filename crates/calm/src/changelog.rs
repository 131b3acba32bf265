//! `calm changelog …`: readers and records of a running server's changelog, for people (a
//! table, Lustre's `lfs changelog` line format) and for scripts (`--json`, one JSON object
//! per line).

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use calm_changelog::User;
use calm_client::FollowWait;
use calm_proto::changelog::CL_LINGER_US_MAX;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ChangelogCommand {
    /// Register a reader; prints its id (cl<N>). It gets every record written from now on.
    Register {
        #[arg(long, default_value = "")]
        name: String,
        /// Record types, Lustre's names comma-separated (CREAT,MKDIR,UNLNK,…), ALL or DEFAULT.
        #[arg(long, default_value = "DEFAULT")]
        mask: String,
        #[arg(long)]
        json: bool,
    },
    /// Deregister a reader; what only it still needed is purged in the background.
    Deregister { id: String },
    /// The current index and every reader: cleared index, idle time, mask.
    Users {
        #[arg(long)]
        json: bool,
    },
    /// Print records; with --user, those after its cleared index and within its mask.
    Read {
        #[arg(long)]
        user: Option<String>,
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Keep printing records as they are committed (long poll), until interrupted.
        #[arg(long)]
        follow: bool,
        /// With --follow: print when this many records are there…
        #[arg(long, default_value_t = calm_meta::CL_FOLLOW_BATCH_RECORDS as u32)]
        batch_records: u32,
        /// …or, when some are, this long after asking, in µs (0: each as it comes; at most
        /// 100 000).
        #[arg(long, default_value_t = calm_meta::CL_FOLLOW_LINGER.as_micros() as u32)]
        linger_us: u32,
        /// Stop after this many records (0: no limit).
        #[arg(long, default_value_t = 0)]
        max: u64,
        #[arg(long)]
        json: bool,
    },
    /// Mark every record up to INDEX (0: the last) processed by reader ID.
    Clear { id: String, index: u64 },
    /// Set a reader's mask.
    Mask { id: String, types: String },
}

fn user_id(text: &str) -> anyhow::Result<u32> {
    User::parse_label(text).ok_or_else(|| anyhow!("{text:?} is not a reader id (cl<N>)"))
}

pub fn run(server: &str, command: ChangelogCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = calm_client::Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        match command {
            ChangelogCommand::Register { name, mask, json } => {
                let user = client.changelog_register(&name, &mask).await?;
                if json {
                    println!("{}", calm_cli::json::reader(&user, 0));
                } else {
                    println!("{}", user.label());
                }
            }
            ChangelogCommand::Deregister { id } => {
                let user = client.changelog_deregister(user_id(&id)?).await?;
                println!("deregistered {}", user.label());
            }
            ChangelogCommand::Users { json } => {
                let reply = client.changelog_users().await?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64);
                let users: Vec<User> = reply
                    .users
                    .iter()
                    .map(calm_proto::changelog::user_from_wire)
                    .collect::<Result<_, _>>()?;
                if json {
                    println!("{}", calm_cli::json::readers(&reply, &users, now));
                } else {
                    for line in calm_cli::tables::readers_lines(&reply, &users, now) {
                        println!("{line}");
                    }
                }
            }
            ChangelogCommand::Read {
                user,
                from,
                follow,
                batch_records,
                linger_us,
                max,
                json,
            } => {
                if linger_us > CL_LINGER_US_MAX {
                    bail!("--linger-us {linger_us} is over the limit of {CL_LINGER_US_MAX} µs");
                }
                let user = user.as_deref().map(user_id).transpose()?;
                let wait = FollowWait {
                    wait_ms: if follow { FOLLOW_WAIT_MS } else { 0 },
                    min_records: batch_records,
                    linger_us,
                };
                let mut out = std::io::stdout().lock();
                client
                    .changelog_each(from, user, wait, max, |records| {
                        for record in records {
                            if json {
                                writeln!(out, "{}", calm_cli::json::record(record))?;
                            } else {
                                writeln!(out, "{}", calm_changelog::text::line(record))?;
                            }
                        }
                        out.flush()?;
                        anyhow::Ok(())
                    })
                    .await?;
            }
            ChangelogCommand::Clear { id, index } => {
                let user = client.changelog_clear(user_id(&id)?, index).await?;
                println!("{} cleared up to {}", user.label(), user.cleared);
            }
            ChangelogCommand::Mask { id, types } => {
                let user = client.changelog_set_mask(user_id(&id)?, &types).await?;
                println!("{} mask {}", user.label(), user.mask.names());
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

/// Longest one follow request waits before asking again, in ms.
const FOLLOW_WAIT_MS: u32 = 10_000;
