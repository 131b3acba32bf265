//! `calm-bench mdtest --metrics-cost --side-by-side`: what a server's counting costs its
//! clients, with both arms at once (`crate::side_by_side`). Each round opens two fresh
//! namespaces, each served over gRPC on loopback by a server of its own on a runtime of its
//! own: one counting its requests for Prometheus (`calm serve --metrics`), the other not (or
//! counting too, in the A/A run). Each arm's clients, each with its own connection and
//! directory, create then unlink `files` files.

use std::sync::Arc;

use calm_client::Client;
use calm_meta::{Handle, Meta};
use calm_store::lmdb::LmdbStore;

use crate::mdtest::InProcessServer;
use crate::side_by_side::{ArmThreads, CostOptions, RaceArm, SideBySideReport, race, rounds};

/// One arm: its namespace, its server, and its clients with their directories.
struct Arm {
    work: tempfile::TempDir,
    meta: Arc<Meta<LmdbStore>>,
    server: InProcessServer,
    clients: Vec<(Client, Handle)>,
}

impl RaceArm for Arm {
    fn start(
        runtime: &tokio::runtime::Runtime,
        options: &CostOptions,
        counting: bool,
    ) -> Result<Arm, String> {
        runtime.block_on(Arm::started(options, counting))
    }

    fn stop(self, runtime: &tokio::runtime::Runtime) -> Result<tempfile::TempDir, String> {
        runtime.block_on(self.stopped())
    }
}

impl Arm {
    async fn started(options: &CostOptions, counting: bool) -> Result<Arm, String> {
        let (work, meta) = crate::mdtest::open_meta_with(&options.dir, true)?;
        let server = InProcessServer::start_counting(Arc::clone(&meta), counting).await?;
        let top = crate::mdtest::shared_top(&meta).await?;
        let mut clients = Vec::new();
        for c in 0..options.threads {
            let client = Client::connect(&server.addr)
                .await
                .map_err(|e| e.to_string())?;
            let dir = client
                .mkdir(top, format!("dir.{c}").as_bytes(), 0o755)
                .await
                .map_err(|e| e.to_string())?
                .handle;
            clients.push((client, dir));
        }
        Ok(Arm {
            work,
            meta,
            server,
            clients,
        })
    }

    /// Closes the clients and stops the server; the directory, to remove once the runtime
    /// has let go of the namespace.
    async fn stopped(self) -> Result<tempfile::TempDir, String> {
        drop(self.clients);
        self.server.stop().await?;
        drop(self.meta);
        Ok(self.work)
    }
}

/// `pairs` rounds of both arms at once; each arm's `threads` clients create, then unlink,
/// `files` files in all.
pub fn run(options: &CostOptions) -> Result<SideBySideReport, String> {
    let windows = rounds::<Arm>(options, &|arms, runtimes, threads| {
        race_phases(arms, runtimes, options, threads)
    })?;
    Ok(SideBySideReport::new(
        "calm-bench mdtest --metrics-cost --side-by-side",
        "gRPC clients on each of two servers",
        options,
        windows,
    ))
}

fn name(t: usize, i: u64) -> Vec<u8> {
    format!("file.{t}.{i}").into_bytes()
}

/// Creates, then unlinks, by every client of both arms at once, each call made from the
/// arm's calling thread on the arm's runtime.
fn race_phases(
    arms: &[Arm; 2],
    runtimes: &[tokio::runtime::Runtime; 2],
    options: &CostOptions,
    threads: &ArmThreads,
) -> Result<Vec<(&'static str, crate::side_by_side::Window)>, String> {
    let (clients, n, burn_ns) = (options.threads, options.files, options.burn_ns);
    // Each client the same share; thread `t` of an arm calls through its client `t`.
    let total = n / clients as u64 * clients as u64;
    let create = race(total, clients, burn_ns, threads, |a, t, i| {
        let (client, dir) = &arms[a].clients[t];
        runtimes[a]
            .block_on(client.create(*dir, &name(t, i), 0o644))
            .map(drop)
            .map_err(|e| format!("create: {e}"))
    })?;
    let unlink = race(total, clients, burn_ns, threads, |a, t, i| {
        let (client, dir) = &arms[a].clients[t];
        runtimes[a]
            .block_on(client.unlink(*dir, &name(t, i)))
            .map_err(|e| format!("unlink: {e}"))
    })?;
    Ok(vec![("create", create), ("unlink", unlink)])
}
