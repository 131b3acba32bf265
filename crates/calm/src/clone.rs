//! `calm clone SRC DST`: a copy of a file or a tree on a calm mount, made of metadata alone.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use calm_cli::quota_tables::resolve_path;
use calm_client::Client;

pub fn run(server: &str, src: &str, dst: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = Client::connect(server)
            .await
            .with_context(|| format!("connecting to {server}"))?;
        let from = resolve_path(&client, src)
            .await
            .with_context(|| format!("finding {src}"))?;
        let dst_path = Path::new(dst);
        let Some(name) = dst_path.file_name() else {
            bail!("{dst} names no new entry");
        };
        let parent_path = match dst_path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::env::current_dir()?,
        };
        let parent = resolve_path(&client, &parent_path.to_string_lossy())
            .await
            .with_context(|| format!("finding {}", parent_path.display()))?;
        let started = std::time::Instant::now();
        let name = name.as_encoded_bytes();
        let cloned = calm_client::clone::clone_tree(&client, from, parent, name)
            .await
            .with_context(|| format!("cloning {src} as {dst}"))?;
        println!(
            "cloned {src} as {dst}: {} entries below it in {} requests, {:.2} s",
            cloned.entries,
            cloned.requests,
            started.elapsed().as_secs_f64()
        );
        Ok(ExitCode::SUCCESS)
    })
}
