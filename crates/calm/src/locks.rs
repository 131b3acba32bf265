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
    println!(
        "{path} (handle {handle}): {} locks, {} waiting",
        listing.total,
        listing.waiting.len()
    );
    if !listing.locks.is_empty() || !listing.waiting.is_empty() {
        println!(
            "{:<8} {:<6} {:<6} {:>20} {:>20} {:>22} {:>12}",
            "STATE", "TYPE", "MODE", "START", "END", "SESSION", "PID/FILE"
        );
    }
    for holder in &listing.locks {
        println!("{}", row("held", holder));
    }
    for (wait, session, request) in &listing.waiting {
        let holder = Holder {
            session: *session,
            owner: request.owner,
            scope: request.scope,
            kind: request.kind,
        };
        println!("{}", row(&format!("wait#{wait}"), &holder));
    }
    if listing.total > listing.locks.len() as u64 {
        println!("(first {} shown)", listing.locks.len());
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

/// A lock's type as a user names it. A mount cannot tell a POSIX record lock (fcntl, lockf)
/// from an OFD one: the kernel hands it both with an opaque owner (the process's file table,
/// or the open file), which the server knows as a file owner. Those are "RECORD"; a process
/// owner (a client of the server's own) is "POSIX".
fn type_name(holder: &Holder) -> &'static str {
    match (holder.scope, holder.owner) {
        (Scope::WholeFile, _) => "FLOCK",
        (Scope::Range(_), Owner::Process { .. }) => "POSIX",
        (Scope::Range(_), Owner::File { .. }) => "RECORD",
    }
}

fn row(state: &str, holder: &Holder) -> String {
    let (start, end) = match holder.scope {
        Scope::Range(r) if r.end == OFFSET_MAX => (r.start.to_string(), "EOF".to_string()),
        Scope::Range(r) => (r.start.to_string(), r.end.to_string()),
        Scope::WholeFile => ("0".to_string(), "EOF".to_string()),
    };
    let mode = match holder.kind {
        LockKind::Read => "READ",
        LockKind::Write => "WRITE",
    };
    let who = match holder.owner {
        Owner::Process { pid } => pid.to_string(),
        Owner::File { file } => format!("file:{file}"),
    };
    format!(
        "{state:<8} {:<6} {mode:<6} {start:>20} {end:>20} {:>22} {who:>12}",
        type_name(holder),
        holder.session
    )
}

fn holder_json(holder: &Holder) -> serde_json::Value {
    let (start, end) = match holder.scope {
        Scope::Range(r) => (r.start, r.end),
        Scope::WholeFile => (0, OFFSET_MAX),
    };
    let mut value = serde_json::json!({
        "type": type_name(holder),
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
