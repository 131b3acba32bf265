//! `calm locks PATH`: the locks held on one file and the requests waiting for them, asked of a
//! running server. PATH is a path inside calm's namespace, from its root (`/dir/file`).

use std::process::ExitCode;

use anyhow::{Context, anyhow};
use calm_locks::{Holder, LockKind, OFFSET_MAX, Owner, Scope};

pub fn run(server: &str, path: &str, json: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (handle, listing) = runtime
        .block_on(async {
            let client = calm_client::Client::connect(server).await?;
            let handle = resolve(&client, path).await?;
            let listing = client
                .list_locks_at_decider(handle)
                .await
                .map_err(|e| anyhow!(e))?;
            anyhow::Ok((handle, listing))
        })
        .with_context(|| format!("listing the locks of {path} on {server}"))?;
    if json {
        let locks: Vec<serde_json::Value> = listing.locks.iter().map(holder_json).collect();
        let waiting: Vec<serde_json::Value> = listing
            .waiting
            .iter()
            .map(|(wait, session, request)| {
                let mut value = holder_json(&Holder {
                    session: *session,
                    owner: request.owner,
                    scope: request.scope,
                    kind: request.kind,
                });
                value["wait"] = (*wait).into();
                value
            })
            .collect();
        let value = serde_json::json!({
            "path": path,
            "handle": handle,
            "total": listing.total,
            "locks": locks,
            "waiting": waiting,
        });
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    for line in calm_cli::tables::locks_lines(path, handle, &listing) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Walks `path` from the root with lookups.
pub(crate) async fn resolve(client: &calm_client::Client, path: &str) -> anyhow::Result<u64> {
    let mut handle = calm_meta::ROOT;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        handle = client
            .lookup(handle, name.as_bytes())
            .await
            .with_context(|| format!("looking up {name:?}"))?
            .handle;
    }
    Ok(handle)
}

fn holder_json(holder: &Holder) -> serde_json::Value {
    let (start, end) = match holder.scope {
        Scope::Range(r) => (r.start, r.end),
        Scope::WholeFile => (0, OFFSET_MAX),
    };
    let mut value = serde_json::json!({
        "type": calm_cli::tables::lock_type(holder),
        "mode": match holder.kind { LockKind::Read => "read", LockKind::Write => "write" },
        "start": start,
        "end": end,
        "session": holder.session,
    });
    // The pid of a file owner's process is known to its mount only.
    match holder.owner {
        Owner::Process { pid } => value["pid"] = pid.into(),
        Owner::File { file } => value["file"] = file.into(),
    }
    value
}
