//! `calm serve`: open the store, start the committer, listen, print the ready line, serve
//! until SIGINT or SIGTERM, then drain and close the store cleanly.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use calm_meta::{Meta, MetaOptions};
use calm_server::{ServerInfo, lock_data_dir};
use calm_store::lmdb::{LmdbOptions, LmdbStore};

pub fn run(listen: &str, data: &Path, started: Instant) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let _lock = lock_data_dir(data).map_err(|e| anyhow!(e))?;
    let store = LmdbStore::open(data, &LmdbOptions::default())
        .with_context(|| format!("opening the store in {}", data.display()))?;
    let meta = Arc::new(
        Meta::open(store, MetaOptions::default())
            .with_context(|| format!("opening the namespace in {}", data.display()))?,
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .with_context(|| format!("listening on {listen}"))?;
    let addr = listener.local_addr()?;
    let ready_ms = started.elapsed().as_millis() as u64;
    let info = ServerInfo {
        data_dir: data.display().to_string(),
        started,
        ready_ms,
    };
    println!("{}", calm_server::ready_line(ready_ms, &addr));
    std::io::stdout().flush()?;

    runtime.block_on(calm_server::serve(
        meta.clone(),
        info,
        listener,
        shutdown_signal(),
    ))?;
    drop(runtime);
    let meta = Arc::into_inner(meta).ok_or_else(|| anyhow!("namespace still in use"))?;
    let store = Arc::into_inner(meta.shutdown()).ok_or_else(|| anyhow!("store still in use"))?;
    store.close();
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
