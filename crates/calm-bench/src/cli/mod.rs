//! The arguments of `calm-bench …` and what each runs: a driver of this crate, its table (and
//! with `--json` its report, the table then going to stderr), and an SVG plot with `--plot
//! FILE`. The binary parses the arguments and prints the [`Output`].

use crate::{activation, changelog, locks, mdtest, mount, startup, storm};

mod args;
mod output;
mod servers;
mod soak;

pub use args::Bench;
pub use output::{Output, OutputArgs};
use output::{calm_exe, panels};

/// Runs the benchmark the arguments name.
pub fn run(bench: Bench) -> Result<Output, String> {
    match bench {
        Bench::Activation {
            devices,
            cap_seconds,
            loop_devices,
            dir,
            out,
        } => {
            let report = activation::run(&activation::ActivationOptions {
                devices,
                cap_seconds,
                loop_devices,
                dir,
            })?;
            out.finish(
                activation::table(&report),
                &report,
                panels(
                    "calm-bench activation: disks arriving at a storage node",
                    || activation::facets(&report),
                ),
            )
        }
        Bench::Storm {
            mounts,
            watchers,
            creates,
            clients,
            repeat,
            dir,
            out,
        } => {
            let report = storm::run(&storm::StormOptions {
                mounts,
                watchers,
                creates,
                clients,
                repeat,
                dir,
            })?;
            out.finish(
                storm::table(&report),
                &report,
                panels(
                    "calm-bench storm: watchers through mount and create storms",
                    || storm::facets(&report),
                ),
            )
        }
        Bench::Data {
            seq_mib,
            streams,
            rand_mib,
            rand_reads,
            files,
            threads,
            increments,
            s3,
            dir,
            tmpfs_dir,
            others,
            inline_bytes_max,
            out,
        } => {
            let report = crate::data::run(&crate::data::DataBenchOptions {
                inline_bytes_max,
                seq_bytes: seq_mib << 20,
                streams,
                rand_file_bytes: rand_mib << 20,
                rand_reads,
                files,
                threads,
                increments,
                s3,
                dir,
                tmpfs_dir,
                others,
            })?;
            out.finish(
                crate::data::table(&report),
                &report,
                panels(
                    "calm-bench data: file contents through calm beside ext4 and tmpfs",
                    || crate::data::facets(&report),
                ),
            )
        }
        Bench::Mount {
            files,
            threads,
            lock_threads,
            locks,
            cap_seconds,
            tmpfs_dir,
            dir,
            visibility_samples,
            ttl_ms,
            ext4_dir,
            others,
            programs,
            sqlite_writers,
            sqlite_rows,
            tar_files,
            no_wal,
            store_sync,
            metrics_cost,
            check_pairs,
            check_calibrate,
            side_by_side,
            burn_ns,
            out,
        } => {
            let options = crate::side_by_side::CostOptions {
                files,
                threads: threads.iter().copied().max().unwrap_or(16),
                pairs: check_pairs,
                calibrate: check_calibrate,
                dir: dir.clone(),
                burn_ns,
            };
            if side_by_side {
                let report = crate::mount_cost::run_side_by_side(&options)?;
                return out.finish(report.table(), &report, |_| {
                    Err("--side-by-side draws no plot".into())
                });
            }
            if metrics_cost {
                let report = crate::mount_cost::run(&options)?;
                return out.finish(crate::mount_cost::table(&report), &report, |_| {
                    Err("--metrics-cost draws no plot".into())
                });
            }
            let report = mount::run(&mount::MountBenchOptions {
                wal: !no_wal,
                store_sync,
                ttl: std::time::Duration::from_millis(ttl_ms),
                ext4_dir,
                others,
                programs: programs.then_some(crate::programs::ProgramOptions {
                    writers: sqlite_writers,
                    rows: sqlite_rows,
                    tar_files,
                }),
                files,
                threads,
                lock_threads,
                locks,
                cap_seconds,
                tmpfs_dir,
                dir,
                visibility_samples,
            })?;
            out.finish(
                report.lines(),
                &report,
                panels(
                    "calm-bench mount: system calls through calm mounts beside other file systems",
                    || report.facets(),
                ),
            )
        }
        Bench::Changelog {
            clients,
            ops_per_client,
            ops_max,
            repeat,
            dir,
            calibrate,
            no_wal,
            out,
        } => {
            let report = changelog::run(&changelog::ChangelogOptions {
                clients,
                ops_per_client,
                ops_max,
                repeat,
                dir,
                calibrate,
                wal: !no_wal,
            })?;
            out.finish(
                changelog::table(&report),
                &report,
                panels(
                    "calm-bench changelog: metadata rates with and without the change feed",
                    || changelog::facets(&report),
                ),
            )
        }
        Bench::Locks {
            sizes,
            cap_seconds,
            tmpfs_dir,
            dir,
            out,
        } => {
            let report = locks::run(&locks::LocksOptions {
                sizes,
                cap_seconds,
                tmpfs_dir,
                store_dir: dir,
            })?;
            out.finish(locks::table(&report), &report, |path| {
                locks::plot(&report, path)
            })
        }
        Bench::Protect {
            files,
            dir,
            files_per_dir,
            populate_tasks,
            clone_files,
            clone_file_bytes,
            clone_inline,
            unlink_files,
            threads,
            rounds,
            out,
        } => {
            // Mounts vanish with a private namespace, however the run ends (before any thread).
            let private_namespace = crate::enter_private_namespace();
            let results = crate::protect::run(&crate::protect::ProtectOptions {
                files,
                dir: dir.clone(),
                calm_exe: calm_exe(None)?,
                files_per_dir,
                populate_tasks,
            })?;
            let clones = crate::mistakes::clones(
                &dir,
                &clone_files,
                clone_file_bytes,
                threads,
                clone_inline,
            )?;
            let trash = match unlink_files {
                0 => None,
                n => Some(crate::mistakes::trash_cost(&dir, n, threads, rounds)?),
            };
            let mut table = crate::protect::table(&results);
            table.extend(crate::mistakes::table(&clones, trash.as_ref()));
            out.finish(
                table,
                &serde_json::json!({"bench": "protect", "results": results, "clones": clones,
                    "trash": trash, "private_namespace": private_namespace}),
                |path| crate::protect::plot(&results, &clones, path),
            )
        }
        Bench::Startup {
            files,
            dir,
            files_per_dir,
            populate_tasks,
            repeat,
            out,
            no_wal,
        } => {
            let results = startup::run(&startup::StartupOptions {
                files,
                dir,
                calm_exe: calm_exe(None)?,
                files_per_dir,
                populate_tasks,
                repeat,
                wal: !no_wal,
            })?;
            out.finish(
                startup::table(&results),
                &serde_json::json!({"bench": "startup", "results": results}),
                |path| startup::plot(&results, path),
            )
        }
        Bench::Transport {
            stats,
            rounds,
            dir,
            out,
        } => {
            let results = crate::transport::run(&dir, stats, rounds)?;
            out.finish(
                crate::transport::table(&results),
                &serde_json::json!({"bench": "transport", "results": results}),
                panels(
                    "calm-bench transport: one stat over each kind of connection",
                    || crate::transport::facets(&results),
                ),
            )
        }
        Bench::Servers(args) => servers::run(args),
        Bench::Churn(args) => servers::run_churn(args),
        Bench::Clusters(args) => servers::run_clusters(args),
        Bench::Soak(args) => soak::run_soak(args),
        Bench::Appends(args) => soak::run_appends(args),
        Bench::Quota {
            clients,
            files,
            file_bytes,
            pairs,
            calibrate,
            acls,
            dir,
            out,
        } => {
            let rows = crate::quota::run(&crate::quota::QuotaBenchOptions {
                clients,
                files,
                file_bytes,
                pairs,
                calibrate,
                acls,
                dir,
            })?;
            out.finish(
                crate::quota::table(&rows, acls),
                &serde_json::json!({
                    "bench": "quota",
                    "acls": acls,
                    "results": rows,
                    "costs": crate::quota::costs(&rows),
                }),
                panels(
                    &format!(
                        "calm-bench quota: {}, or none",
                        crate::quota::arm_words(acls)
                    ),
                    || crate::quota::facets(&rows, acls),
                ),
            )
        }
        Bench::Mdtest {
            clients,
            files,
            dir,
            tmpfs_dir,
            unique_dir,
            store,
            no_wal,
            check_cost,
            check_pairs,
            check_calibrate,
            metrics_cost,
            side_by_side,
            burn_ns,
            out,
        } => {
            if check_calibrate && !check_cost && !metrics_cost {
                return Err("--check-calibrate goes with --check-cost or --metrics-cost".into());
            }
            if side_by_side {
                let report = crate::server_cost::run(&crate::side_by_side::CostOptions {
                    files,
                    threads: clients.first().copied().unwrap_or(16),
                    pairs: check_pairs,
                    calibrate: check_calibrate,
                    dir,
                    burn_ns,
                })?;
                return out.finish(report.table(), &report, |_| {
                    Err("--side-by-side draws no plot".into())
                });
            }
            let measured = if metrics_cost { "metrics" } else { "checks" };
            let results = mdtest::run(&mdtest::MdtestOptions {
                clients,
                files,
                dir,
                tmpfs_dir,
                unique_dir,
                etcd: store,
                lmdb_sync: no_wal,
                check_cost,
                check_pairs,
                check_calibrate,
                metrics_cost,
                server_metrics: false,
            })?;
            out.finish(
                crate::mdtest_report::table(&results, measured),
                &serde_json::json!({"bench": "mdtest", "results": results}),
                panels(
                    "calm-bench mdtest: the namespace in-process, over gRPC, and tmpfs",
                    || crate::mdtest_report::facets(&results),
                ),
            )
        }
    }
}
