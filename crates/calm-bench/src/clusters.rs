//! `calm-bench clusters`: creates in one namespace over 1, 2 and 3 metadata clusters.
//!
//! Each round starts as many fresh local etcd clusters (of `--members` members each) as the
//! largest count asks for, so that every round starts on empty databases and shares the
//! machine with the same processes, and opens a namespace on its first N clusters, in this process (as `calm-bench mdtest` does), and its
//! clients create empty files for `--seconds`, each in a directory of the root of its own. The
//! directories are named so that they fall evenly on the clusters (a name's cluster is its
//! hash's: names are tried until each cluster has its share), as a site's project directories
//! would with many projects. The baseline is the one-cluster round of the same pass; passes
//! alternate the order of the rounds, so the machine's drift falls on every count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm_clusters::Clusters;
use calm_meta::ops::{Done, Op};
use calm_meta::{Caller, Handle, MetaOptions, NewNode, ROOT};
use calm_store_etcd::{EtcdOptions, EtcdStore};
use calm_testkit::etcd::LocalCluster;

/// What to run.
#[derive(Debug, Clone)]
pub struct ClustersOptions {
    /// The cluster counts, one round each per pass.
    pub counts: Vec<usize>,
    /// Members of each local etcd cluster.
    pub members: usize,
    /// Concurrent clients, each creating in its own directory.
    pub clients: usize,
    /// How long each round creates.
    pub seconds: f64,
    /// Passes over the counts, every other one in the reverse order.
    pub passes: usize,
}

/// One round.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClustersResult {
    pub pass: usize,
    pub clusters: usize,
    pub clients: usize,
    pub creates: u64,
    pub seconds: f64,
    pub creates_per_second: f64,
    /// This round's rate over the one-cluster round of the same pass (absent without one).
    pub ratio_to_one_cluster: Option<f64>,
    /// Creates that went to each cluster.
    pub creates_per_cluster: Vec<u64>,
    /// The machine's processors busy during the round, 0 to 1 (every process: the etcd
    /// members and this one): near 1, the machine is the limit, not the clusters.
    pub machine_busy: Option<f64>,
}

/// Most clusters a round may use: each is a local etcd cluster on this machine.
pub const BENCH_CLUSTERS_MAX: usize = 8;

pub fn run(options: &ClustersOptions) -> Result<Vec<ClustersResult>, String> {
    let largest = options.counts.iter().copied().max().unwrap_or(0);
    if largest == 0 || largest > BENCH_CLUSTERS_MAX || options.counts.contains(&0) {
        return Err(format!(
            "--clusters takes counts from 1 to {BENCH_CLUSTERS_MAX}"
        ));
    }
    if options.clients == 0 || options.members == 0 {
        return Err("--clients and --members must be positive".into());
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    for pass in 0..options.passes.max(1) {
        let mut order = options.counts.clone();
        if pass % 2 == 1 {
            order.reverse();
        }
        let mut round_results = Vec::new();
        for &count in &order {
            // Every cluster fresh, and all of them running: each round starts on empty
            // databases, beside the same processes.
            let mut clusters = Vec::with_capacity(largest);
            for _ in 0..largest {
                clusters.push(LocalCluster::start(options.members)?);
            }
            let result = runtime.block_on(round(options, &clusters[..count], pass))?;
            drop(clusters);
            eprintln!(
                "pass {pass}: {count} cluster(s): {:.0} creates/s",
                result.creates_per_second
            );
            round_results.push(result);
        }
        let one = round_results
            .iter()
            .find(|r| r.clusters == 1)
            .map(|r| r.creates_per_second);
        for mut result in round_results {
            result.ratio_to_one_cluster = one.map(|one| result.creates_per_second / one);
            results.push(result);
        }
    }
    results.sort_by_key(|r| (r.pass, r.clusters));
    Ok(results)
}

async fn round(
    options: &ClustersOptions,
    clusters: &[LocalCluster],
    pass: usize,
) -> Result<ClustersResult, String> {
    let count = clusters.len();
    let mut stores = Vec::with_capacity(count);
    for cluster in clusters {
        let prefix = calm_testkit::etcd::unique_prefix(&format!("bench-clusters-{count}"));
        let options = EtcdOptions::from_url(&cluster.url(&prefix))?;
        stores.push(EtcdStore::connect(options).map_err(|e| e.to_string())?);
    }
    let namespace = tokio::task::block_in_place(|| {
        Clusters::open(
            stores,
            MetaOptions {
                batch_ops_max: calm_meta::SHARED_BATCH_OPS_MAX,
                ..MetaOptions::default()
            },
        )
    })
    .map_err(|e| e.to_string())?;
    let namespace = Arc::new(namespace);
    let dirs = spread_dirs(&namespace, options.clients).await?;
    let per_cluster: Arc<Vec<AtomicU64>> =
        Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let ticks_before = cpu_ticks();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(options.seconds);
    let mut tasks = Vec::new();
    for (client, (dir, cluster)) in dirs.into_iter().enumerate() {
        let (namespace, per_cluster) = (namespace.clone(), per_cluster.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < until {
                let op = Op::Make {
                    parent: dir,
                    name: format!("f{client}.{i}").into_bytes(),
                    node: NewNode::file(0o644, 0, 0),
                    exclusive: true,
                };
                namespace
                    .apply_as(Caller::default(), op)
                    .await
                    .map_err(|e| e.to_string())?;
                per_cluster[cluster].fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Ok::<_, String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let machine_busy = match (ticks_before, cpu_ticks()) {
        (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => {
            Some((busy1 - busy0) as f64 / (all1 - all0) as f64)
        }
        _ => None,
    };
    let creates_per_cluster: Vec<u64> = per_cluster
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    let creates = creates_per_cluster.iter().sum();
    drop(namespace);
    Ok(ClustersResult {
        pass,
        clusters: count,
        clients: options.clients,
        creates,
        seconds,
        creates_per_second: creates as f64 / seconds,
        ratio_to_one_cluster: None,
        creates_per_cluster,
        machine_busy,
    })
}

/// The machine's busy and total processor ticks so far (`/proc/stat`: idle and iowait are
/// not busy).
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// One directory in the root per client, client `c`'s on cluster `c mod count`: names are
/// tried in turn until one falls there.
async fn spread_dirs(
    namespace: &Clusters<EtcdStore>,
    clients: usize,
) -> Result<Vec<(Handle, usize)>, String> {
    let count = namespace.count();
    let mut dirs = Vec::with_capacity(clients);
    let mut next_name = 0u64;
    for client in 0..clients {
        let cluster = client % count;
        let name = loop {
            let name = format!("project.{next_name}").into_bytes();
            next_name += 1;
            if namespace
                .cluster_of_name(ROOT, &name)
                .map_err(|e| e.to_string())?
                == cluster
            {
                break name;
            }
        };
        let op = Op::Make {
            parent: ROOT,
            name,
            node: NewNode::dir(0o755, 0, 0),
            exclusive: true,
        };
        match namespace.apply_as(Caller::default(), op).await {
            Ok(Done::Attr(attr)) => dirs.push((attr.handle, cluster)),
            Ok(other) => return Err(format!("a mkdir answered {other:?}")),
            Err(error) => return Err(error.to_string()),
        }
    }
    Ok(dirs)
}

/// The results as a table, a line each.
pub fn table(results: &[ClustersResult]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>4} {:>8} {:>7} {:>9} {:>10} {:>13} {:>9} {:>6}  per cluster",
        "pass", "clusters", "clients", "creates", "seconds", "creates/s", "vs one", "busy"
    )];
    for r in results {
        lines.push(format!(
            "{:>4} {:>8} {:>7} {:>9} {:>10.1} {:>13.0} {:>9} {:>6}  {}",
            r.pass,
            r.clusters,
            r.clients,
            r.creates,
            r.seconds,
            r.creates_per_second,
            r.ratio_to_one_cluster
                .map_or("-".to_string(), |x| format!("{x:.2}×")),
            r.machine_busy
                .map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0)),
            r.creates_per_cluster
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    lines
}

/// One panel per pass: creates per second over the number of clusters (`--plot`).
pub fn facets(results: &[ClustersResult]) -> Vec<crate::multiples::Facet> {
    crate::multiples::facets_of(results.iter().map(|r| {
        crate::multiples::Cell::at(
            format!("pass {}", r.pass),
            ("metadata clusters", r.clusters as f64),
            ("creates/s", r.creates_per_second),
            "calm",
        )
    }))
}
