//! Two arms measured at the same time instead of in turn. On a shared machine another tenant's
//! load comes and goes over seconds; arms run in turn each meet a different share of it, so
//! their rates differ by more than a small cost. Run at once, on threads of their own (calling
//! threads, mount and server threads apart), both meet the same load, and the processor goes
//! to each arm's threads in equal shares: an arm whose operation takes more processor time
//! makes fewer of them in the same window. The rate's ratio of the two arms in one window is
//! one figure, and each arm's processor time per operation in the same window the other: the
//! threads that work for each arm (those that appeared while it was set up, and those named
//! after it) are told apart and their run time read from the kernel's scheduler statistics.
//! Where the machine is not saturated (an operation waits on a commit more than it computes)
//! the rates hide a cost that the processor time shows. An A/A run (both arms alike) is the
//! method's own noise, and a known load added to one arm (`burn`) shows that it is measured.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

/// The share of an arm's operations after which the window closes: the first arm to have
/// done this many ends it, while every thread of both arms is still busy (an arm's last
/// threads to finish would otherwise leave the other arm the machine to itself).
pub const WINDOW_SHARE: f64 = 0.9;

/// What both arms did in one window.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Window {
    /// Operations each arm had done when the window closed.
    pub ops: [u64; 2],
    /// Processor time each arm's threads took in the window, in nanoseconds.
    pub processor_ns: [u64; 2],
    pub seconds: f64,
}

impl Window {
    /// Arm 0's rate over arm 1's.
    pub fn ratio(&self) -> f64 {
        self.ops[0] as f64 / self.ops[1].max(1) as f64
    }

    /// Arm `a`'s processor time per operation, in µs.
    pub fn processor_us_per_op(&self, a: usize) -> f64 {
        self.processor_ns[a] as f64 / 1e3 / self.ops[a].max(1) as f64
    }

    /// Arm 0's processor time per operation over arm 1's.
    pub fn processor_ratio(&self) -> f64 {
        self.processor_us_per_op(0) / self.processor_us_per_op(1)
    }
}

/// A thread of this process: its id and name.
fn threads() -> Vec<(u32, String)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
            Some((tid, name.trim_end().to_string()))
        })
        .collect()
}

/// Nanoseconds thread `tid` of this process has run (0 once it has ended).
fn run_ns(tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// How long the count of threads stays the same before an arm counts as set up, and the
/// longest wait for that.
const SETTLED: std::time::Duration = std::time::Duration::from_millis(100);
const SETTLED_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The name of arm `arm`'s runtime threads.
pub fn runtime_thread_name(arm: usize) -> String {
    format!("calm-arm-{arm}")
}

/// The name of arm `arm`'s calling threads.
fn race_thread_name(arm: usize) -> String {
    format!("calm-race-{arm}")
}

/// Which threads of this process work for which arm: those that appeared while the arm was
/// set up (its store's, its mount's), and those named after it (its runtime's, whenever they
/// start, and its calling threads).
#[derive(Debug, Default)]
pub struct ArmThreads {
    set_up: [HashSet<u32>; 2],
}

impl ArmThreads {
    /// Runs `set_up`, counting the threads that appear meanwhile as arm `arm`'s, and those
    /// that its threads start by themselves right after (a FUSE session starts its threads
    /// once it runs): until the count of threads has not changed for [`SETTLED`].
    pub fn setting_up<T>(&mut self, arm: usize, set_up: impl FnOnce() -> T) -> T {
        let before: HashSet<u32> = threads().into_iter().map(|(tid, _)| tid).collect();
        let done = set_up();
        let waited = Instant::now();
        let mut count = threads().len();
        while waited.elapsed() < SETTLED_WAIT_MAX {
            std::thread::sleep(SETTLED);
            let now = threads().len();
            if now == count {
                break;
            }
            count = now;
        }
        self.set_up[arm].extend(
            threads()
                .into_iter()
                .map(|(tid, _)| tid)
                .filter(|tid| !before.contains(tid)),
        );
        done
    }

    fn arm_of(&self, tid: u32, name: &str) -> Option<usize> {
        (0..2).find(|&a| {
            self.set_up[a].contains(&tid)
                || name == runtime_thread_name(a)
                || name == race_thread_name(a)
        })
    }

    /// Each arm's threads' run time so far, thread by thread.
    pub fn sample(&self) -> HashMap<u32, (usize, u64)> {
        threads()
            .into_iter()
            .filter_map(|(tid, name)| Some((tid, (self.arm_of(tid, &name)?, run_ns(tid)))))
            .collect()
    }
}

/// Each arm's run time between two samples: threads that ended meanwhile are left out, and a
/// thread that started counts from nothing.
fn between(first: &HashMap<u32, (usize, u64)>, last: &HashMap<u32, (usize, u64)>) -> [u64; 2] {
    let mut ns = [0u64; 2];
    for (tid, (arm, now)) in last {
        let then = first.get(tid).map_or(0, |(_, then)| *then);
        ns[*arm] += now.saturating_sub(then);
    }
    ns
}

/// Runs `op(arm, thread, index)` for every index below `n` on each of two arms at once,
/// `threads` threads per arm (thread `t` takes `t`, `t + threads`, …), all starting together;
/// each arm runs all its `n`. Returns what both had done when the first reached
/// [`WINDOW_SHARE`] of `n`, with the processor time of each arm's `arms` in that window.
/// `burn` busies arm 0's calling thread for that many nanoseconds after each operation (0:
/// none), a known cost to check the method with.
pub fn race(
    n: u64,
    threads: usize,
    burn_ns: u64,
    arms: &ArmThreads,
    op: impl Fn(usize, usize, u64) -> Result<(), String> + Sync,
) -> Result<Window, String> {
    if n == 0 || threads == 0 {
        return Err("a race needs operations and threads".into());
    }
    let closes_at = ((n as f64 * WINDOW_SHARE) as u64).max(1);
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let closed = AtomicBool::new(false);
    let window = Mutex::new(None);
    let gate = Gate::default();
    let first = OnceLock::new();
    let one = |arm: usize, t: usize| -> Result<(), String> {
        if !gate.wait() {
            return Ok(());
        }
        let began = Instant::now();
        let mut i = t as u64;
        while i < n {
            op(arm, t, i)?;
            if arm == 0 && burn_ns > 0 {
                burn(burn_ns);
            }
            let now = done[arm].fetch_add(1, Ordering::Relaxed) + 1;
            if now == closes_at && !closed.swap(true, Ordering::AcqRel) {
                let other = done[1 - arm].load(Ordering::Relaxed);
                let seconds = began.elapsed().as_secs_f64();
                let last = arms.sample();
                *window.lock().expect("window") = Some(Window {
                    ops: if arm == 0 { [now, other] } else { [other, now] },
                    processor_ns: first.get().map_or([0; 2], |f| between(f, &last)),
                    seconds,
                });
            }
            i += threads as u64;
        }
        Ok(())
    };
    let ran = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for w in 0..2 * threads {
            let (arm, t, one) = (w % 2, w / 2, &one);
            let spawned = std::thread::Builder::new()
                .name(race_thread_name(arm))
                .spawn_scoped(scope, move || one(arm, t));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    gate.open(false);
                    return Err(format!("starting a thread: {e}"));
                }
            }
        }
        // Every thread waits at the gate: the window's first sample.
        let _ = first.set(arms.sample());
        gate.open(true);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    });
    ran?;
    let window = window.lock().expect("window").take();
    window.ok_or_else(|| "the window never closed".into())
}

/// Where the threads of a race wait until all are started: opened to run, or to give up.
#[derive(Default)]
struct Gate {
    open: Mutex<Option<bool>>,
    opened: Condvar,
}

impl Gate {
    fn open(&self, run: bool) {
        *self.open.lock().expect("gate") = Some(run);
        self.opened.notify_all();
    }

    /// Waits until the gate opens: whether to run.
    fn wait(&self) -> bool {
        let mut open = self.open.lock().expect("gate");
        loop {
            match *open {
                Some(run) => return run,
                None => open = self.opened.wait(open).expect("gate"),
            }
        }
    }
}

/// Keeps this thread's processor busy for `ns` nanoseconds.
fn burn(ns: u64) {
    let until = Instant::now() + std::time::Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// One operation's cost over the rounds: arm 0's against arm 1's, by rate and by processor
/// time per operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RaceCost {
    pub op: &'static str,
    /// Each round's arm-0 rate over arm-1 rate.
    pub ratios: Vec<f64>,
    /// `1 -` the median rate ratio, and `1 -` the largest and smallest.
    pub cost: f64,
    pub cost_least: f64,
    pub cost_most: f64,
    /// Each round's arm-0 processor time per operation over arm 1's.
    pub processor_ratios: Vec<f64>,
    /// The median processor ratio `- 1`, and the smallest and largest `- 1`.
    pub processor_cost: f64,
    pub processor_cost_least: f64,
    pub processor_cost_most: f64,
    /// The arms' median processor µs per operation.
    pub processor_us: [f64; 2],
}

impl RaceCost {
    pub fn of(op: &'static str, windows: &[Window]) -> RaceCost {
        let median = crate::mdtest_report::median;
        let ratios: Vec<f64> = windows.iter().map(Window::ratio).collect();
        let processor: Vec<f64> = windows.iter().map(Window::processor_ratio).collect();
        let (least, most) = spread(&ratios);
        let (p_least, p_most) = spread(&processor);
        let us = |a: usize| median(windows.iter().map(|w| w.processor_us_per_op(a)).collect());
        RaceCost {
            op,
            cost: 1.0 - median(ratios.clone()),
            cost_least: 1.0 - most,
            cost_most: 1.0 - least,
            ratios,
            processor_cost: median(processor.clone()) - 1.0,
            processor_cost_least: p_least - 1.0,
            processor_cost_most: p_most - 1.0,
            processor_ratios: processor,
            processor_us: [us(0), us(1)],
        }
    }
}

/// The smallest and largest of `values`.
fn spread(values: &[f64]) -> (f64, f64) {
    let least = values.iter().copied().fold(f64::NAN, f64::min);
    let most = values.iter().copied().fold(f64::NAN, f64::max);
    (least, most)
}

/// [`crate::runtime`], its threads named after arm `arm`.
pub fn arm_runtime(arm: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(runtime_thread_name(arm))
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))
}

/// One arm of a side-by-side benchmark: what it sets up on its runtime, and stops after.
pub trait RaceArm: Sized {
    fn start(
        runtime: &tokio::runtime::Runtime,
        options: &CostOptions,
        counting: bool,
    ) -> Result<Self, String>;

    /// Stops the arm; its directory, to remove once the runtimes have let go of it.
    fn stop(self, runtime: &tokio::runtime::Runtime) -> Result<tempfile::TempDir, String>;
}

/// The phases a round runs on both arms (each on its runtime): each phase's window.
pub type Phases<'a, A> = dyn Fn(
        &[A; 2],
        &[tokio::runtime::Runtime; 2],
        &ArmThreads,
    ) -> Result<Vec<(&'static str, Window)>, String>
    + 'a;

/// `options.pairs` rounds, each with both arms set up afresh (arm 0 counting, arm 1 not or, in
/// an A/A run, counting too; which is set up first alternates from round to round), `phases`
/// run on them, and both stopped; every round's windows.
pub fn rounds<A: RaceArm>(
    options: &CostOptions,
    phases: &Phases<'_, A>,
) -> Result<Vec<RaceRound>, String> {
    if options.files == 0 || options.threads == 0 {
        return Err("the files and threads of each arm must be positive".into());
    }
    // Each arm's servers and mounts on two threads of their own.
    let runtimes = [arm_runtime(0)?, arm_runtime(1)?];
    let counting = [true, options.calibrate];
    let mut windows = Vec::new();
    let mut works = Vec::new();
    for round in 0..options.pairs.max(1) {
        let first = round % 2;
        let mut threads = ArmThreads::default();
        let mut started: [Option<A>; 2] = [None, None];
        for a in [first, 1 - first] {
            let arm = threads.setting_up(a, || A::start(&runtimes[a], options, counting[a]))?;
            started[a] = Some(arm);
        }
        let arms = started.map(|a| a.expect("both started"));
        let measured = phases(&arms, &runtimes, &threads);
        for (arm, runtime) in arms.into_iter().zip(&runtimes) {
            works.push(arm.stop(runtime)?);
        }
        for (op, window) in measured? {
            windows.push(RaceRound { round, op, window });
        }
    }
    // The directories go once the runtimes have ended their namespaces' last tasks.
    drop(runtimes);
    drop(works);
    Ok(windows)
}

/// What a benchmark of the metrics' cost is asked (`--metrics-cost`), in turn or side by side.
#[derive(Debug, Clone)]
pub struct CostOptions {
    /// Files each arm creates and removes in a round.
    pub files: u64,
    /// Threads (or clients) of each arm.
    pub threads: usize,
    /// Rounds.
    pub pairs: usize,
    /// The A/A run: both arms count.
    pub calibrate: bool,
    pub dir: std::path::PathBuf,
    /// Nanoseconds of busy processor added to each of the counting arm's operations, in a
    /// side-by-side run (0: none): a known cost, to show that the method sees one.
    pub burn_ns: u64,
}

/// One operation's window in one round.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RaceRound {
    pub round: usize,
    pub op: &'static str,
    /// Arm 0 counts; arm 1 does not, or counts too in an A/A run.
    pub window: Window,
}

/// A side-by-side run: every round's windows, and each operation's cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SideBySideReport {
    pub command: &'static str,
    /// What each arm's threads are (`threads on each of two mounts`).
    pub arms: &'static str,
    pub files: u64,
    pub threads: usize,
    pub calibrate: bool,
    pub burn_ns: u64,
    pub windows: Vec<RaceRound>,
    pub costs: Vec<RaceCost>,
}

impl SideBySideReport {
    pub fn new(
        command: &'static str,
        arms: &'static str,
        options: &CostOptions,
        windows: Vec<RaceRound>,
    ) -> SideBySideReport {
        let mut ops: Vec<&'static str> = Vec::new();
        for w in &windows {
            if !ops.contains(&w.op) {
                ops.push(w.op);
            }
        }
        let costs = ops
            .into_iter()
            .map(|op| {
                let of_op = windows.iter().filter(|w| w.op == op);
                RaceCost::of(op, &of_op.map(|w| w.window).collect::<Vec<_>>())
            })
            .collect();
        SideBySideReport {
            command,
            arms,
            files: options.files,
            threads: options.threads,
            calibrate: options.calibrate,
            burn_ns: options.burn_ns,
            windows,
            costs,
        }
    }

    /// Each operation's cost by rate and by processor time, with the rounds' spread, then
    /// each round's ratios.
    pub fn table(&self) -> Vec<String> {
        let rounds = self.windows.len() / self.costs.len().max(1);
        let mut lines = vec![format!(
            "{}: {} files, {} {} at once, {} rounds{}{}",
            self.command,
            self.files,
            self.threads,
            self.arms,
            rounds,
            if self.calibrate {
                " (A/A: both arms count)"
            } else {
                ""
            },
            if self.burn_ns > 0 {
                format!(" (+{} ns busy per counting operation)", self.burn_ns)
            } else {
                String::new()
            }
        )];
        lines.push(format!(
            "{:<8} {:>10} {:>18} {:>10} {:>10} {:>10} {:>18}",
            "op", "rate cost", "least … most", "on cpu µs", "other µs", "cpu cost", "least … most"
        ));
        for c in &self.costs {
            lines.push(format!(
                "{:<8} {:>9.2}% {:>8.2}% … {:>5.2}% {:>10.1} {:>10.1} {:>9.2}% {:>8.2}% … {:>5.2}%",
                c.op,
                c.cost * 100.0,
                c.cost_least * 100.0,
                c.cost_most * 100.0,
                c.processor_us[0],
                c.processor_us[1],
                c.processor_cost * 100.0,
                c.processor_cost_least * 100.0,
                c.processor_cost_most * 100.0,
            ));
        }
        lines.push("each round, on / other: rate, processor per operation".into());
        for c in &self.costs {
            let pairs: Vec<String> = c
                .ratios
                .iter()
                .zip(&c.processor_ratios)
                .map(|(r, p)| format!("{r:.3}/{p:.3}"))
                .collect();
            lines.push(format!("{:<8} {}", c.op, pairs.join(" ")));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_closes_while_both_arms_run_and_counts_each() {
        // Arm 1 sleeps on each operation: arm 0 closes the window at 90 of 100.
        let window = race(100, 2, 0, &ArmThreads::default(), |arm, _, _| {
            if arm == 1 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Ok(())
        })
        .expect("race");
        assert_eq!(window.ops[0], 90, "{window:?}");
        assert!(window.ops[1] < 90, "{window:?}");
        assert!(window.ratio() > 1.0);
    }

    #[test]
    fn every_operation_of_both_arms_runs_once() {
        let seen: Vec<_> = (0..2 * 1000).map(|_| AtomicU64::new(0)).collect();
        race(1000, 3, 0, &ArmThreads::default(), |arm, _, i| {
            seen[arm * 1000 + i as usize].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .expect("race");
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_failed_operation_fails_the_race() {
        let arms = ArmThreads::default();
        let err = race(10, 2, 0, &arms, |arm, _, i| {
            if arm == 1 && i == 5 {
                Err("no".into())
            } else {
                Ok(())
            }
        })
        .expect_err("fails");
        assert_eq!(err, "no");
        assert!(race(0, 2, 0, &arms, |_, _, _| Ok(())).is_err());
    }

    /// Nanoseconds of processor time this thread has had.
    fn thread_cpu_ns() -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime(2) fills the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
    }

    /// Keeps this thread busy until it has had `ns` more nanoseconds of processor time.
    fn compute(ns: u64) {
        let from = thread_cpu_ns();
        while thread_cpu_ns() - from < ns {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn each_arm_s_processor_time_is_its_own_threads() {
        // Both arms wait alike on each operation; arm 0 also computes for 1 ms in each. A
        // thread set up for arm 1 (as a mount's are) computes meanwhile and is its.
        let mut arms = ArmThreads::default();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let helper = arms.setting_up(1, || {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    compute(100_000);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })
        });
        let window = race(200, 2, 0, &arms, |arm, _, _| {
            if arm == 0 {
                compute(1_000_000);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(())
        })
        .expect("race");
        stop.store(true, Ordering::Relaxed);
        helper.join().expect("helper");
        // Arm 0: at least its 1 ms per operation; arm 1: its helper's, far less per operation.
        assert!(window.processor_us_per_op(0) >= 1000.0, "{window:?}");
        assert!(window.processor_ns[1] > 0, "{window:?}");
        assert!(window.processor_ratio() > 1.5, "{window:?}");
    }

    #[test]
    fn the_cost_is_the_median_round_s() {
        let window = |ops: [u64; 2], processor_ns: [u64; 2]| Window {
            ops,
            processor_ns,
            seconds: 1.0,
        };
        let cost = RaceCost::of(
            "create",
            &[
                window([98, 100], [1010, 1000]),
                window([101, 100], [1010, 1000]),
                window([97, 100], [97 * 11, 1000]),
            ],
        );
        assert!((cost.cost - 0.02).abs() < 1e-9, "{cost:?}");
        assert!((cost.cost_least + 0.01).abs() < 1e-9, "{cost:?}");
        assert!((cost.cost_most - 0.03).abs() < 1e-9, "{cost:?}");
        // Processor per operation: 10.31/10, 10/10, 11/10.
        assert!((cost.processor_cost - 0.030_612).abs() < 1e-5, "{cost:?}");
        assert!(cost.processor_cost_least.abs() < 1e-9, "{cost:?}");
        assert!((cost.processor_cost_most - 0.1).abs() < 1e-9, "{cost:?}");
    }
}
