//! `calm-bench mount --metrics-cost`: what counting costs through a mount. Each arm opens a
//! fresh namespace, serves it over gRPC on loopback and mounts it (as `calm mount --server`
//! does), then `threads` threads create, stat and unlink `files` files through the mount. With
//! metrics on, the mount counts every request the kernel sends (`calm mount --metrics`) and
//! the server every request and batched call (`calm serve --metrics`); off, neither counts
//! (the server's load per user and job, counted always, is in both). `pairs` rounds of each
//! arm, which goes first alternating from round to round; with `calibrate`, both arms count
//! (an A/A run: the method's own noise). Beside it, what counting one reply takes by itself
//! (the mount's counters told of a reply a million times, by one thread and by `threads` at
//! once on the same kind), to set against the time of a request.
//!
//! With `--side-by-side` ([`run_side_by_side`]) the two arms run at the same time instead, each
//! with its own namespace, server and mount on threads of its own (`crate::side_by_side`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mdtest_report::median;
use crate::side_by_side::{
    ArmThreads, CostOptions, RaceArm, SideBySideReport, Window, race, rounds,
};
use crate::syscalls::create_empty;

/// One arm's rate of one operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArmRate {
    /// `on`, `off`, or `aa` (the A/A run's second arm: counting too).
    pub arm: &'static str,
    pub round: usize,
    pub op: &'static str,
    pub ops_per_s: f64,
    /// Processor time of this whole process (mount, server, the calling threads, and the
    /// kernel's work for them) per operation, in µs.
    pub cpu_us_per_op: f64,
}

/// One operation's cost: the arms' medians and the median of each round's own ratio.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpCost {
    pub op: &'static str,
    pub with_ops_per_s: f64,
    pub without_ops_per_s: f64,
    /// `1 - with / without` of the medians.
    pub cost: f64,
    /// The median of each round's `1 - with / without`.
    pub paired_cost: f64,
    /// The arms' median processor µs per operation.
    pub with_cpu_us: f64,
    pub without_cpu_us: f64,
    /// `with / without - 1` of the processor time's medians: the share of processor time
    /// the counting adds (less noisy than the rate on a shared machine: another tenant's load
    /// slows the rate but is not this process's processor time).
    pub cpu_cost: f64,
    /// The median of each round's `with / without - 1` of processor time.
    pub paired_cpu_cost: f64,
}

/// The run: every arm's rates, and the costs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountCostReport {
    pub files: u64,
    pub threads: usize,
    pub calibrate: bool,
    pub rates: Vec<ArmRate>,
    pub costs: Vec<OpCost>,
    /// Nanoseconds one reply's counting takes, by one thread and by `threads` at once.
    pub count_ns_one_thread: f64,
    pub count_ns_all_threads: f64,
}

/// Replies counted to time the counting alone.
const COUNTED: u64 = 1_000_000;

/// Processor nanoseconds a mount takes to count one reply, with `threads` threads counting the
/// same kind at once.
fn counting_ns(threads: usize) -> Result<f64, String> {
    use fuser::ReplyObserver;
    let metrics = calm_fuse::metrics::MountMetrics::new(calm_metrics::Registry::new(), true)?;
    let per_thread = COUNTED / threads as u64;
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let metrics = &metrics;
            scope.spawn(move || {
                for _ in 0..per_thread {
                    // A create (opcode 35), answered at once.
                    metrics.replied(35, std::time::Instant::now(), 0);
                }
            });
        }
    });
    // Processor time per reply: the wall time times the cores the threads kept busy.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy = cores.min(threads) as f64;
    Ok(started.elapsed().as_nanos() as f64 * busy / (per_thread * threads as u64) as f64)
}

const OPS: [&str; 3] = ["create", "stat", "unlink"];

/// Each operation's rate in one arm, and its processor µs per operation.
type Rates = Vec<(&'static str, f64, f64)>;

/// Runs the arms in turn.
pub fn run(options: &CostOptions) -> Result<MountCostReport, String> {
    if options.files == 0 || options.threads == 0 {
        return Err("--files and --threads must be positive".into());
    }
    crate::enter_private_namespace();
    let runtime = crate::runtime()?;
    let mut rates = Vec::new();
    // Each arm's directory is removed once the runtime has let go of every namespace (their
    // stores close as the runtime's last tasks end).
    let mut works = Vec::new();
    for round in 0..options.pairs.max(1) {
        // In turn, first one arm then the other (on, off, off, on, …): the A/A run of a fixed
        // order showed the first arm of each round faster by up to 7 %.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for counting in order {
            let arm = match (counting, options.calibrate) {
                (true, _) => "on",
                (false, false) => "off",
                (false, true) => "aa",
            };
            let on = counting || options.calibrate;
            let (measured, work) = one_arm(&runtime, options, on)?;
            works.push(work);
            for (op, ops_per_s, cpu_us_per_op) in measured {
                rates.push(ArmRate {
                    arm,
                    round,
                    op,
                    ops_per_s,
                    cpu_us_per_op,
                });
            }
        }
    }
    drop(runtime);
    drop(works);
    let second = if options.calibrate { "aa" } else { "off" };
    let costs = costs(&rates, second);
    Ok(MountCostReport {
        files: options.files,
        threads: options.threads,
        calibrate: options.calibrate,
        rates,
        costs,
        count_ns_one_thread: counting_ns(1)?,
        count_ns_all_threads: counting_ns(options.threads)?,
    })
}

/// Both arms at once (`crate::side_by_side`), each on a runtime of its own: `pairs` rounds,
/// each with two fresh namespaces, servers and mounts, `threads` threads on each; creates and
/// unlinks.
pub fn run_side_by_side(options: &CostOptions) -> Result<SideBySideReport, String> {
    crate::enter_private_namespace();
    let windows = rounds::<Arm>(options, &|arms, _, threads| {
        let roots = [arms[0].mountpoint.clone(), arms[1].mountpoint.clone()];
        race_phases(&roots, options, threads)
    })?;
    Ok(SideBySideReport::new(
        "calm-bench mount --metrics-cost --side-by-side",
        "threads on each of two mounts",
        options,
        windows,
    ))
}

/// Creates, then unlinks, of `files` files by `threads` threads on each of the two mounts at
/// once; each phase's window. (A stat through a mount is answered from the kernel's cache:
/// its window would last milliseconds.)
fn race_phases(
    roots: &[PathBuf; 2],
    options: &CostOptions,
    arms: &ArmThreads,
) -> Result<Vec<(&'static str, Window)>, String> {
    let (threads, n, burn_ns) = (options.threads, options.files, options.burn_ns);
    let own = |arm: usize, t: usize| roots[arm].join(format!("t{t}"));
    for (arm, t) in (0..2).flat_map(|arm| (0..threads).map(move |t| (arm, t))) {
        std::fs::create_dir(own(arm, t)).map_err(|e| format!("{}: {e}", own(arm, t).display()))?;
    }
    let name = |arm: usize, t: usize, i: u64| own(arm, t).join(format!("f{i:08}"));
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    let create = race(n, threads, burn_ns, arms, |arm, t, i| {
        create_empty(&name(arm, t, i))
    })?;
    let unlink = race(n, threads, burn_ns, arms, |arm, t, i| {
        let path = name(arm, t, i);
        std::fs::remove_file(&path).map_err(|e| failed(&path, e))
    })?;
    Ok(vec![("create", create), ("unlink", unlink)])
}

/// Each operation's cost from the arms' `rates`: `second` is the arm set against "on" ("off",
/// or "aa" in an A/A run).
fn costs(rates: &[ArmRate], second: &str) -> Vec<OpCost> {
    OPS.iter()
        .map(|op| {
            let of = |arm: &str| -> Vec<&ArmRate> {
                rates
                    .iter()
                    .filter(|r| r.arm == arm && r.op == *op)
                    .collect()
            };
            let (with, without) = (of("on"), of(second));
            let medians = |of: fn(&ArmRate) -> f64| {
                (
                    median(with.iter().map(|r| of(r)).collect()),
                    median(without.iter().map(|r| of(r)).collect()),
                )
            };
            // Each round's `with / without` of one figure.
            let paired = |of: fn(&ArmRate) -> f64| {
                let ratios = with.iter().filter_map(|w| {
                    let o = without.iter().find(|o| o.round == w.round)?;
                    Some(of(w) / of(o))
                });
                median(ratios.collect())
            };
            let (with_rate, without_rate) = medians(|r| r.ops_per_s);
            let (with_cpu, without_cpu) = medians(|r| r.cpu_us_per_op);
            OpCost {
                op,
                with_ops_per_s: with_rate,
                without_ops_per_s: without_rate,
                cost: 1.0 - with_rate / without_rate,
                paired_cost: 1.0 - paired(|r| r.ops_per_s),
                with_cpu_us: with_cpu,
                without_cpu_us: without_cpu,
                cpu_cost: with_cpu / without_cpu - 1.0,
                paired_cpu_cost: paired(|r| r.cpu_us_per_op) - 1.0,
            }
        })
        .collect()
}

/// One arm's namespace, server and mount, counting or not.
struct Arm {
    work: tempfile::TempDir,
    meta: Arc<calm_meta::Meta<calm_store::lmdb::LmdbStore>>,
    server: crate::mdtest::InProcessServer,
    mounted: calm_fuse::Mounted,
    mountpoint: PathBuf,
}

impl RaceArm for Arm {
    fn start(
        runtime: &tokio::runtime::Runtime,
        options: &CostOptions,
        counting: bool,
    ) -> Result<Arm, String> {
        Arm::start_in(runtime, &options.dir, counting)
    }

    fn stop(self, runtime: &tokio::runtime::Runtime) -> Result<tempfile::TempDir, String> {
        self.stopped(runtime)
    }
}

impl Arm {
    /// A fresh namespace, served over gRPC on loopback by a server on `runtime` and mounted.
    fn start_in(
        runtime: &tokio::runtime::Runtime,
        dir: &Path,
        counting: bool,
    ) -> Result<Arm, String> {
        let (work, meta) = crate::mdtest::open_meta_with(dir, true)?;
        let mountpoint = work.path().join("mnt");
        std::fs::create_dir(&mountpoint).map_err(|e| e.to_string())?;
        let fuse_options = calm_fuse::MountOptions {
            metrics: counting.then(calm_metrics::Registry::new),
            count_requests: counting,
            ..Default::default()
        };
        let (server, mounted) = runtime.block_on(async {
            let server =
                crate::mdtest::InProcessServer::start_counting(Arc::clone(&meta), counting).await?;
            let client = calm_client::Client::connect(&server.addr)
                .await
                .map_err(|e| e.to_string())?;
            let mounted = calm_fuse::mount(
                client,
                &mountpoint,
                &fuse_options,
                tokio::runtime::Handle::current(),
            )
            .await
            .map_err(|e| format!("mounting at {}: {e}", mountpoint.display()))?;
            Ok::<_, String>((server, mounted))
        })?;
        Ok(Arm {
            work,
            meta,
            server,
            mounted,
            mountpoint,
        })
    }

    /// Unmounts and stops the server; the directory, to remove once the runtime has let go of
    /// the namespace (its store closes as the runtime's last tasks end).
    fn stopped(self, runtime: &tokio::runtime::Runtime) -> Result<tempfile::TempDir, String> {
        let Arm {
            work,
            meta,
            server,
            mounted,
            ..
        } = self;
        runtime.block_on(async {
            let unmounted = mounted.unmount().await.map_err(|e| e.to_string());
            let stopped = server.stop().await;
            unmounted.and(stopped)
        })?;
        drop(meta);
        Ok(work)
    }
}

/// One arm: a fresh namespace, a server and a mount counting or not; the rates of each
/// operation.
fn one_arm(
    runtime: &tokio::runtime::Runtime,
    options: &CostOptions,
    counting: bool,
) -> Result<(Rates, tempfile::TempDir), String> {
    let arm = Arm::start_in(runtime, &options.dir, counting)?;
    let measured = creates_stats_unlinks(&arm.mountpoint, options.threads, options.files);
    let work = arm.stopped(runtime)?;
    Ok((measured?, work))
}

fn creates_stats_unlinks(root: &Path, threads: usize, n: u64) -> Result<Rates, String> {
    let own = |t: usize| root.join(format!("t{t}"));
    for t in 0..threads {
        std::fs::create_dir(own(t)).map_err(|e| format!("{}: {e}", own(t).display()))?;
    }
    let name = |t: usize, i: u64| own(t).join(format!("f{i:08}"));
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    // Each phase's seconds and the processor time this process took meanwhile.
    let timed = |phase: &(dyn Fn(usize, u64) -> Result<(), String> + Sync)| {
        let cpu = crate::procs::own_cpu();
        let seconds = crate::syscalls::spread(n, threads, phase)?;
        let cpu_us = (crate::procs::own_cpu() - cpu).as_secs_f64() * 1e6;
        Ok::<_, String>((n as f64 / seconds, cpu_us / n as f64))
    };
    let create = timed(&|t, i| create_empty(&name(t, i)))?;
    let stat = timed(&|t, i| {
        let path = name(t, i);
        std::fs::metadata(&path)
            .map(drop)
            .map_err(|e| failed(&path, e))
    })?;
    let unlink = timed(&|t, i| {
        let path = name(t, i);
        std::fs::remove_file(&path).map_err(|e| failed(&path, e))
    })?;
    Ok(vec![
        ("create", create.0, create.1),
        ("stat", stat.0, stat.1),
        ("unlink", unlink.0, unlink.1),
    ])
}

/// The report as a table: each operation's rates with and without counting, and the costs.
pub fn table(report: &MountCostReport) -> Vec<String> {
    let second = if report.calibrate {
        "again (A/A)"
    } else {
        "off"
    };
    let mut lines = vec![
        format!(
            "calm-bench mount --metrics-cost: {} files, {} threads, {} rounds of each arm{}",
            report.files,
            report.threads,
            report.rates.len() / (2 * OPS.len()).max(1),
            if report.calibrate {
                " (A/A: both arms count)"
            } else {
                ""
            }
        ),
        format!(
            "{:<8} {:>14} {:>14} {:>8} {:>12} {:>10} {:>12} {:>9} {:>12}",
            "op",
            "on ops/s",
            format!("{second} ops/s"),
            "cost",
            "paired cost",
            "on cpu µs",
            format!("{} cpu µs", if report.calibrate { "again" } else { "off" }),
            "cpu cost",
            "paired cpu"
        ),
    ];
    lines.insert(
        1,
        format!(
            "counting one reply alone: {:.0} ns of processor time (one thread), {:.0} ns ({} threads counting the same kind at once)",
            report.count_ns_one_thread, report.count_ns_all_threads, report.threads
        ),
    );
    for c in &report.costs {
        lines.push(format!(
            "{:<8} {:>14.0} {:>14.0} {:>7.1}% {:>11.1}% {:>10.1} {:>12.1} {:>8.1}% {:>11.1}%",
            c.op,
            c.with_ops_per_s,
            c.without_ops_per_s,
            c.cost * 100.0,
            c.paired_cost * 100.0,
            c.with_cpu_us,
            c.without_cpu_us,
            c.cpu_cost * 100.0,
            c.paired_cpu_cost * 100.0
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(arm: &'static str, round: usize, ops_per_s: f64, cpu_us_per_op: f64) -> ArmRate {
        ArmRate {
            arm,
            round,
            op: "create",
            ops_per_s,
            cpu_us_per_op,
        }
    }

    #[test]
    fn costs_set_each_round_against_the_same_rounds_other_arm() {
        let rates = [
            rate("on", 0, 90.0, 110.0),
            rate("off", 0, 100.0, 100.0),
            rate("off", 1, 50.0, 100.0),
            rate("on", 1, 49.0, 102.0),
            rate("on", 2, 100.0, 300.0),
            rate("off", 2, 100.0, 100.0),
        ];
        let create = &costs(&rates, "off")[0];
        assert_eq!(create.op, "create");
        // Medians: rates 90 against 100, processor time 110 against 100.
        assert!((create.cost - 0.10).abs() < 1e-9, "{create:?}");
        assert!((create.cpu_cost - 0.10).abs() < 1e-9, "{create:?}");
        // Rounds: rates 0.90, 0.98, 1.0; processor time 1.10, 1.02, 3.0.
        assert!((create.paired_cost - 0.02).abs() < 1e-9, "{create:?}");
        assert!((create.paired_cpu_cost - 0.10).abs() < 1e-9, "{create:?}");
        // No "aa" arm in this run: nothing to set against.
        assert!(costs(&rates, "aa")[0].cost.is_nan());
    }
}
