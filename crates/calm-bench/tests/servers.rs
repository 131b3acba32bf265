//! The `calm-bench` program end to end on a small scale, with the `calm` binary beside it.

use std::path::PathBuf;
use std::process::{Command, Output};

use calm_testkit::etcd::{LocalCluster, shared_url, unique_prefix};

/// Runs `calm-bench ARGS…` with `--calm` naming the `calm` binary cargo built beside it.
fn calm_bench(args: &[&str]) -> Output {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_calm-bench"));
    let calm = bench.with_file_name("calm");
    assert!(
        calm.is_file(),
        "no calm binary at {} (cargo build -p calm builds it)",
        calm.display()
    );
    Command::new(&bench)
        .args(args)
        .arg("--calm")
        .arg(&calm)
        .output()
        .expect("run calm-bench")
}

/// `calm-bench servers` runs end to end on a small scale and reports every figure it names
/// (the figures themselves are for docs/benchmarks, not for a test).
#[test]
fn the_servers_benchmark_reports_every_figure() {
    let prefix = unique_prefix("bench");
    let mut private = None;
    let url = shared_url(&prefix).unwrap_or_else(|| {
        private
            .insert(LocalCluster::start(3).expect("starting etcd"))
            .url(&prefix)
    });
    let out = calm_bench(&[
        "servers",
        "--servers",
        "1,3",
        "--files",
        "64",
        "--clients",
        "4",
        "--lock-clients",
        "2",
        "--lock-ops",
        "200",
        "--store",
        &url,
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(report["bench"], "servers");
    let results = report["results"].as_array().expect("results");
    let figures: Vec<(u64, String)> = results
        .iter()
        .map(|r| {
            assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["cpu_us_per_op"].as_f64().unwrap() >= 0.0, "{r}");
            (
                r["servers"].as_u64().unwrap(),
                r["op"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for servers in [1, 3] {
        for op in ["lock-hot", "lock-many", "create", "stat"] {
            assert!(
                figures.contains(&(servers, op.to_string())),
                "{servers} {op} missing: {figures:?}"
            );
        }
    }
    assert!(report["failover_s"]["lock"].as_f64().unwrap() > 0.0);
    assert!(report["failover_s"]["create"].as_f64().unwrap() > 0.0);
    assert_eq!(report["lease_s"], 2.0);
}
