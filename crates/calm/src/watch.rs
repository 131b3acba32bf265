//! `calm watch PATH`: follow the changes under a directory (or to one file) as they commit,
//! through the server's watch stream; one line per change (Lustre's changelog line), or JSON
//! lines with `--json`. Runs until interrupted or until `--count` changes were printed.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use calm_client::{WatchEvent, WatchWhat};
use calm_meta::Kind;

pub fn run(
    server: &str,
    path: &str,
    recursive: bool,
    from: u64,
    json: bool,
    count: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = calm_client::Client::connect(server).await?;
        let handle = crate::locks::resolve(&client, path).await?;
        let attr = client.getattr(handle).await?;
        let what = if attr.kind == Kind::Dir {
            WatchWhat::Dir { handle, recursive }
        } else if recursive {
            anyhow::bail!("--recursive needs a directory; {path} is not one");
        } else {
            WatchWhat::Handles(vec![handle])
        };
        let mut watch = client
            .watch(what, from)
            .await
            .with_context(|| format!("watching {path}"))?;
        let mut printed = 0;
        let mut out = std::io::stdout();
        while count.is_none_or(|c| printed < c) {
            let Some(event) = watch.next().await? else {
                break;
            };
            let line = match (&event, json) {
                (WatchEvent::Change(record), true) => calm_cli::json::record(record).to_string(),
                (WatchEvent::Change(record), false) => calm_changelog::text::line(record),
                (WatchEvent::Resync { from }, true) => {
                    serde_json::json!({ "resync_from": from }).to_string()
                }
                (WatchEvent::Resync { from }, false) => {
                    format!("resync: this watcher fell behind; changes resume at {from}")
                }
                (WatchEvent::Progress { .. }, _) => continue,
            };
            writeln!(out, "{line}")?;
            out.flush()?;
            if matches!(event, WatchEvent::Change(_)) {
                printed += 1;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
