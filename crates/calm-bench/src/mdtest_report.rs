//! What `calm-bench mdtest` reports: its table, the cost of what `--check-cost` or
//! `--metrics-cost` turns on and off (medians of the rounds and of each pair's ratio), and its
//! plot's panels.

use std::time::Instant;

use crate::mdtest::{MdtestResult, unprivileged};

/// The table of `results`: one row each, with its rate against the kernel's in the same
/// round; then, with `--check-cost`, what the checks cost each mode and operation (the median
/// of the rounds without them against the median of the rounds with them).
pub fn table(results: &[MdtestResult], measured: &str) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>13} {:>8} {:>7} {:>7} {:>6} {:>8} {:>9} {:>12} {:>14}",
        "mode", "store", "op", "dirs", "checks", "clients", "files", "ops/s", "vs tmpfs"
    )];
    for r in results {
        let baseline = results
            .iter()
            .find(|b| b.mode == "kernel-tmpfs" && b.op == r.op && b.clients == r.clients)
            .map_or(f64::NAN, |b| r.ops_per_sec / b.ops_per_sec);
        lines.push(format!(
            "{:>13} {:>8} {:>7} {:>7} {:>6} {:>8} {:>9} {:>12.0} {:>13.2}x",
            r.mode, r.store, r.op, r.dirs, r.checks, r.clients, r.files, r.ops_per_sec, baseline
        ));
    }
    let costs = check_costs(results);
    if !costs.is_empty() {
        lines.push(String::new());
        if measured == "checks" {
            lines.push(format!(
                "the checks of one create (search + write permission, new owner), timed alone: \
                 {:.1} ns",
                check_ns()
            ));
        }
        lines.push(format!(
            "{:>13} {:>7} {:>8} {:>14} {:>14} {:>8} {:>12} {:>9} {:>11} {:>9} {:>11}",
            "mode",
            "op",
            "clients",
            "with ops/s",
            "without ops/s",
            "cost",
            "paired cost",
            "with µs",
            "without µs",
            "cpu cost",
            "paired cpu"
        ));
        lines.push(format!(
            "(what the {measured} cost: medians of the rounds, and the median of each pair's own \
             ratio; then the same of processor µs per operation, this whole process's; with \
             --check-calibrate both arms have them, so the costs are the method's noise)"
        ));
        for c in costs {
            lines.push(format!(
                "{:>13} {:>7} {:>8} {:>14.0} {:>14.0} {:>7.1}% {:>11.1}% {:>9.1} {:>11.1} {:>8.1}% \
                 {:>10.1}%",
                c.mode,
                c.op,
                c.clients,
                c.with,
                c.without,
                c.cost * 100.0,
                c.paired_cost * 100.0,
                c.with_cpu_us,
                c.without_cpu_us,
                c.cpu_cost * 100.0,
                c.paired_cpu_cost * 100.0
            ));
        }
    }
    lines
}

/// The CPU time of the checks themselves, in ns per operation: a create's checks (search
/// and write permission on the directory, the new owner) for the unprivileged caller of
/// `--check-cost`, timed over a million calls on one thread. Beside an operation's own time
/// (1 / its rate per core) this is the checks' share of the server's CPU.
pub fn check_ns() -> f64 {
    use calm_meta::perm;
    let caller = unprivileged();
    let dir = perm::Owner::new(calm_meta::Kind::Dir, 0o2775, 1000, 2015);
    const CALLS: u32 = 1_000_000;
    let started = Instant::now();
    for _ in 0..CALLS {
        let caller = std::hint::black_box(&caller);
        let dir = std::hint::black_box(&dir);
        let searched = perm::may_lookup(caller, dir);
        let changed = perm::may_change_dir(caller, dir);
        let owner = perm::new_owner(caller, dir, calm_meta::Kind::File, 1000, 1000, 0o644);
        std::hint::black_box((searched.is_ok(), changed.is_ok(), owner));
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
}

/// What the permission checks cost one mode's operation at one client count.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckCost {
    pub mode: &'static str,
    pub op: &'static str,
    pub clients: usize,
    /// Median rate of the rounds with the checks, and without (or of the second arm of an
    /// A/A run).
    pub with: f64,
    pub without: f64,
    /// `1 - with / without`: the share of the rate the checks take (negative: within noise).
    pub cost: f64,
    /// The median over the pairs (a round with the checks and the round without that follows
    /// it) of `1 - with / without`: the machine's drift between pairs falls out.
    pub paired_cost: f64,
    /// Median processor µs per operation of the rounds with, and without.
    pub with_cpu_us: f64,
    pub without_cpu_us: f64,
    /// `with / without - 1` of the processor time's medians, and the median over the pairs.
    pub cpu_cost: f64,
    pub paired_cpu_cost: f64,
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The cost of the checks from `--check-cost` rows (none without them).
pub fn check_costs(results: &[MdtestResult]) -> Vec<CheckCost> {
    let mut costs = Vec::new();
    let second = |checks: &str| checks == "off" || checks == "aa";
    for r in results.iter().filter(|r| second(r.checks)) {
        if costs
            .iter()
            .any(|c: &CheckCost| c.mode == r.mode && c.op == r.op && c.clients == r.clients)
        {
            continue;
        }
        let figures = |arm: &dyn Fn(&str) -> bool, of: fn(&MdtestResult) -> f64| -> Vec<f64> {
            results
                .iter()
                .filter(|x| x.mode == r.mode && x.op == r.op && x.clients == r.clients)
                .filter(|x| arm(x.checks))
                .map(of)
                .collect()
        };
        let on_off = |of: fn(&MdtestResult) -> f64| {
            let (on, off) = (figures(&|c| c == "on", of), figures(&second, of));
            let pairs = on.iter().zip(&off).map(|(on, off)| on / off).collect();
            (median(on), median(off), median(pairs))
        };
        let (with, without, paired) = on_off(|x| x.ops_per_sec);
        let (with_cpu, without_cpu, paired_cpu) = on_off(|x| x.cpu_us_per_op);
        costs.push(CheckCost {
            mode: r.mode,
            op: r.op,
            clients: r.clients,
            with,
            without,
            cost: 1.0 - with / without,
            paired_cost: 1.0 - paired,
            with_cpu_us: with_cpu,
            without_cpu_us: without_cpu,
            cpu_cost: with_cpu / without_cpu - 1.0,
            paired_cpu_cost: paired_cpu - 1.0,
        });
    }
    costs
}

/// One panel per operation and directory shape, its rate over clients, one line per mode
/// (in-process, over gRPC, the kernel's tmpfs), for `--plot`.
pub fn facets(results: &[MdtestResult]) -> Vec<crate::multiples::Facet> {
    crate::multiples::facets_of(results.iter().map(|r| {
        crate::multiples::Cell::at(
            format!(
                "{}, {} directory",
                r.op,
                if r.dirs == "shared" {
                    "one"
                } else {
                    "a per-client"
                }
            ),
            ("clients", r.clients as f64),
            ("operations/s", r.ops_per_sec),
            {
                let who = match r.mode {
                    "inprocess" => format!("calm in-process ({})", r.store),
                    "grpc" => format!("calm over gRPC ({})", r.store),
                    _ => format!("{} (the kernel)", r.store),
                };
                match r.checks {
                    "off" => format!("{who}, no permission checks"),
                    _ => who,
                }
            },
        )
        .log()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mdtest::row;

    fn r(mode: &'static str, op: &'static str, checks: &'static str, rate: f64) -> MdtestResult {
        MdtestResult {
            checks,
            ..row(
                mode,
                "lmdb",
                op,
                "shared",
                4,
                rate as u64,
                crate::mdtest::Took {
                    seconds: 1.0,
                    cpu: std::time::Duration::ZERO,
                },
            )
        }
    }

    fn cpu(row: MdtestResult, cpu_us_per_op: f64) -> MdtestResult {
        MdtestResult {
            cpu_us_per_op,
            ..row
        }
    }

    #[test]
    fn the_cost_of_the_checks_is_the_median_without_against_the_median_with() {
        let results = [
            cpu(r("inprocess", "create", "on", 90.0), 110.0),
            cpu(r("inprocess", "create", "off", 100.0), 100.0),
            cpu(r("inprocess", "create", "on", 94.0), 104.0),
            cpu(r("inprocess", "create", "off", 100.0), 100.0),
            cpu(r("inprocess", "create", "on", 10.0), 20.0),
            cpu(r("inprocess", "create", "off", 500.0), 10.0),
            r("grpc", "stat", "on", 50.0),
            r("grpc", "stat", "off", 40.0),
            r("kernel-tmpfs", "stat", "on", 1000.0),
        ];
        let costs = check_costs(&results);
        assert_eq!(costs.len(), 2);
        assert_eq!((costs[0].mode, costs[0].op), ("inprocess", "create"));
        assert_eq!((costs[0].with, costs[0].without), (90.0, 100.0));
        assert!((costs[0].cost - 0.10).abs() < 1e-9);
        // Pairs: 1 - 90/100, 1 - 94/100, 1 - 10/500 → 0.10, 0.06, 0.98: the median is 0.10.
        assert!((costs[0].paired_cost - 0.10).abs() < 1e-9);
        // Processor µs per operation: medians 104 against 100; pairs 1.10, 1.04, 2.0.
        assert_eq!(
            (costs[0].with_cpu_us, costs[0].without_cpu_us),
            (104.0, 100.0)
        );
        assert!((costs[0].cpu_cost - 0.04).abs() < 1e-9);
        assert!((costs[0].paired_cpu_cost - 0.10).abs() < 1e-9);
        // Faster with the checks: a negative cost (noise), reported as it is.
        assert!((costs[1].cost + 0.25).abs() < 1e-9);
        assert!(check_costs(&results[8..]).is_empty());
        assert!(
            table(&results, "checks")
                .iter()
                .any(|l| l.contains("10.0%"))
        );
        // An A/A run's second arm counts as the "without".
        let aa = [
            r("grpc", "create", "on", 100.0),
            r("grpc", "create", "aa", 100.0),
        ];
        assert_eq!(check_costs(&aa)[0].cost, 0.0);
    }
}
