//! The arguments of `calm-bench …` and what each runs: a driver of this crate, its table (and
//! with `--json` its report, the table then going to stderr), and an SVG plot with `--plot
//! FILE`. The binary parses the arguments and prints the [`Output`].

use std::path::PathBuf;

use crate::{activation, changelog, locks, mdtest, mount, startup, storm};

mod output;
mod servers;
mod soak;

use clap::Subcommand;
pub use output::{Output, OutputArgs};
use output::{calm_exe, panels};

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Dump and load of the metadata at N files (`calm dump`, `calm load` as processes: files
    /// per second and peak memory), against a plain copy of the store and the creation rate.
    Protect {
        /// File counts, comma-separated (e.g. 100000,1000000).
        #[arg(long, value_delimiter = ',', default_value = "100000")]
        files: Vec<u64>,
        /// Where to build the stores.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        /// Files per directory.
        #[arg(long, default_value_t = 10_000)]
        files_per_dir: u64,
        /// Concurrent creators while populating.
        #[arg(long, default_value_t = 512)]
        populate_tasks: usize,
        /// Through a mount: trees of these many files (comma-separated) cloned with `calm
        /// clone` against `cp -r` (none: skipped).
        #[arg(long, value_delimiter = ',')]
        clone_files: Vec<u64>,
        /// The size of each file of those trees.
        #[arg(long, default_value_t = 16 << 10)]
        clone_file_bytes: u64,
        /// Keep those files' bytes in the metadata when they are small enough (inline), as a
        /// mount does by default; without it every file is an object, as large files are.
        #[arg(long)]
        clone_inline: bool,
        /// Through a mount: unlinks of this many files with the trash kept against without one
        /// (0: skipped).
        #[arg(long, default_value_t = 0)]
        unlink_files: u64,
        /// Writers, copiers and unlinkers through the mount.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Rounds of the unlinks with and without the trash (alternating).
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Restart to ready at N files (cold cache, clean and after kill -9), against a server that
    /// reads every file at start to rebuild its list of handles in use.
    Startup {
        /// File counts, comma-separated (e.g. 100000,1400000,10000000).
        #[arg(long, value_delimiter = ',', default_value = "100000")]
        files: Vec<u64>,
        /// Where to build the stores.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        /// Files per directory.
        #[arg(long, default_value_t = 10_000)]
        files_per_dir: u64,
        /// Concurrent creators while populating.
        #[arg(long, default_value_t = 512)]
        populate_tasks: usize,
        /// Repeats of each timed start and scan (the median is reported, and the maximum).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        #[command(flatten)]
        out: OutputArgs,
        /// Populate and serve with LMDB's own synchronous commit (`calm serve --no-wal`).
        #[arg(long)]
        no_wal: bool,
    },
    /// Byte-range locks, N of them on one file (ascending, random, split, conflict test),
    /// against a naive list and the kernel's fcntl locks, each capped in time.
    Locks {
        /// Lock counts, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,25000,50000,100000,1000000"
        )]
        sizes: Vec<u64>,
        /// Longest a baseline runs for one size, in seconds.
        #[arg(long, default_value_t = 60.0)]
        cap_seconds: f64,
        #[arg(long, default_value = "/dev/shm")]
        tmpfs_dir: PathBuf,
        /// Where the gRPC run's temporary store is made.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Disks arriving at a storage node, in pools of 4: calm's pool assembly against a rescan
    /// of every known disk at each arrival.
    Activation {
        /// Device counts, comma-separated (multiples of 4).
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        devices: Vec<u64>,
        /// Longest one baseline run may take, in seconds.
        #[arg(long, default_value_t = 60.0)]
        cap_seconds: f64,
        /// Loop devices in the real run: ext4 images with labels, attached while the agent runs
        /// (0: skip it; needs root).
        #[arg(long, default_value_t = 256)]
        loop_devices: u64,
        /// Where the real run's images and mount points are made.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Mount-table watchers through a storm of bind mounts (none, one that re-reads the whole
    /// table per event, one that re-reads it at most once per interval, calm's fanotify
    /// watcher), and namespace watchers through a storm of creates.
    Storm {
        /// Bind-mount counts, comma-separated (0: skip the mount part).
        #[arg(long, value_delimiter = ',', default_value = "2000,10000")]
        mounts: Vec<usize>,
        /// Namespace watcher counts, comma-separated (0 is always run, as the baseline).
        #[arg(long, value_delimiter = ',', default_value = "0,100,10000")]
        watchers: Vec<usize>,
        /// Creates per namespace run.
        #[arg(long, default_value_t = 100_000)]
        creates: u64,
        /// Concurrent creating tasks.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Rounds of the namespace runs (medians reported).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Where the temporary stores and mount points are made.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// System calls through real calm mounts against the same calls on tmpfs, ext4 and other
    /// file systems at 1, 4 and 16 threads: creates, stats, listings, renames, unlinks, small
    /// files, fcntl locks, and how soon one mount sees another's change.
    Mount {
        /// Files created, stat'ed, listed, renamed and unlinked (then written and read as
        /// small files) on each file system, at each thread count.
        #[arg(long, default_value_t = 100_000)]
        files: u64,
        /// Thread counts of the metadata and small-file shapes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        threads: Vec<usize>,
        /// Thread counts of the uncontended lock + unlock pairs, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        lock_threads: Vec<usize>,
        /// Lock counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        locks: Vec<u64>,
        /// Longest one lock run may take, in seconds (it then reports the count reached).
        #[arg(long, default_value_t = 60.0)]
        cap_seconds: f64,
        #[arg(long, default_value = "/dev/shm")]
        tmpfs_dir: PathBuf,
        /// Where the temporary store, data directory and mount point are made.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        /// Changes of each kind (chmod, rename, write + close, unlink) timed from one mount to
        /// a second one (0: none).
        #[arg(long, default_value_t = 20)]
        visibility_samples: usize,
        /// The mounts' attribute and entry timeout, in ms (`calm mount --ttl-ms`).
        #[arg(long, default_value_t = calm_fuse::fs::TTL_DEFAULT.as_millis() as u64)]
        ttl_ms: u64,
        /// A directory on ext4 (a local disk file system) to measure beside tmpfs.
        #[arg(long)]
        ext4_dir: Option<PathBuf>,
        /// Another file system to measure in the same run, mounted beforehand: NAME=DIR.
        /// May be given more than once.
        #[arg(long = "other")]
        others: Vec<crate::data::Other>,
        /// Real programs too, on every file system: sqlite writers (rollback journal and
        /// write-ahead log) and tar extraction.
        #[arg(long)]
        programs: bool,
        /// Concurrent sqlite writer processes, and rows each inserts (one transaction each).
        #[arg(long, default_value_t = 4)]
        sqlite_writers: usize,
        #[arg(long, default_value_t = 500)]
        sqlite_rows: usize,
        /// Files in the tarball extracted.
        #[arg(long, default_value_t = 2000)]
        tar_files: usize,
        /// Serve the mounts with LMDB's own synchronous commit (`calm serve --no-wal`) instead
        /// of the write-ahead log every calm server and embedded mount uses by default.
        #[arg(long)]
        no_wal: bool,
        /// Every change on the disk before it is answered (`calm serve --sync`).
        #[arg(long)]
        store_sync: bool,
        /// Measure instead what metrics cost through a mount: creates, stats and unlinks of
        /// --files files by the largest of --threads through a mount of a server over gRPC,
        /// both counting (`--metrics` on each) or neither, --check-pairs rounds of each in turn.
        #[arg(long)]
        metrics_cost: bool,
        /// Rounds of each arm of --metrics-cost.
        #[arg(long, default_value_t = 4)]
        check_pairs: usize,
        /// The A/A run of --metrics-cost: both arms count (the method's own noise).
        #[arg(long)]
        check_calibrate: bool,
        /// Run --metrics-cost's two arms at the same time, each on a mount of its own, instead
        /// of in turn: both meet the machine's other load alike, and the cost is the counting
        /// arm's rate and processor time per operation against the other's in the same window.
        #[arg(long, requires = "metrics_cost")]
        side_by_side: bool,
        /// With --side-by-side: busy the counting arm's threads for this many nanoseconds
        /// after each operation, a known cost to check that the method measures one.
        #[arg(long, default_value_t = 0, requires = "side_by_side")]
        burn_ns: u64,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// File contents through calm mounts (local directory and S3 objects) against ext4 and
    /// tmpfs in the same run: sequential, random and small-file I/O, and locked increments
    /// from two mounts.
    Data {
        /// Bytes of the sequential cases, in MiB (split over the streams).
        #[arg(long, default_value_t = 4096)]
        seq_mib: u64,
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        streams: Vec<usize>,
        /// Size of the file of the random 4 KiB reads, in MiB, and reads per run.
        #[arg(long, default_value_t = 1024)]
        rand_mib: u64,
        #[arg(long, default_value_t = 20_000)]
        rand_reads: u64,
        /// Small files per run, and thread counts.
        #[arg(long, default_value_t = 20_000)]
        files: u64,
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        threads: Vec<usize>,
        /// Increments per worker (4 workers on two mounts).
        #[arg(long, default_value_t = 2000)]
        increments: u64,
        /// An S3 store for calm-s3: s3://BUCKET[/PREFIX]?endpoint=URL&region=R (credentials
        /// from the AWS environment variables; scripts/s3-server starts one).
        #[arg(long)]
        s3: Option<String>,
        /// Where the ext4 baseline, the store and the local objects go.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[arg(long, default_value = "/dev/shm")]
        tmpfs_dir: PathBuf,
        /// Another file system to measure in the same run, mounted beforehand:
        /// NAME=DIR, or NAME=DIR,DIR2 for two mounts of it (the locked increments use both).
        /// May be given more than once.
        #[arg(long = "other")]
        others: Vec<crate::data::Other>,
        /// The calm mounts' `--inline-bytes-max`: small writes kept by the metadata up to
        /// this many bytes per commit (0: every write an object).
        #[arg(long, default_value_t = calm_meta::slices::INLINE_WRITE_BYTES_MAX)]
        inline_bytes_max: u64,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Creates and other metadata changes with the change feed off, on with an idle reader,
    /// and on with a reader reading and clearing; and one reader draining a backlog.
    Changelog {
        /// Concurrent clients, comma-separated for several rounds.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        clients: Vec<usize>,
        /// Operations per phase and client (a round does at most --ops-max per phase). The
        /// defaults take about 11 minutes here; with half as many and 3 rounds, the A/A ratios
        /// (--calibrate) spread a third more.
        #[arg(long, default_value_t = 4000)]
        ops_per_client: u64,
        #[arg(long, default_value_t = 40_000)]
        ops_max: u64,
        /// Rounds per client count (fresh stores each); a rate is a median over every
        /// round's slices. 8 rounds: a store's own speed, which lasts its round, is averaged
        /// over 8 stores per mode (5 before: an A/A standard deviation of 0.012).
        #[arg(long, default_value_t = 8)]
        repeat: usize,
        /// Where the temporary stores are made.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Register no reader in any mode: the same rounds as an A/A test, whose ratios are
        /// the method's noise on this machine.
        #[arg(long)]
        calibrate: bool,
        /// Open the stores with LMDB's own synchronous commit (`calm serve --no-wal`).
        #[arg(long)]
        no_wal: bool,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// 10 000 stats over one connection: the Unix socket, plain TCP on loopback and mutual
    /// TLS, in turn, against one server in this process.
    Transport {
        #[arg(long, default_value_t = 10_000)]
        stats: u64,
        /// Rounds of the three transports, in turn.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// 1, 2 and 3 servers of one namespace on etcd: lock operations on one hot file and on
    /// many, creates and stats, with the servers' CPU per operation; kill -9 failover times.
    Servers(servers::ServersArgs),
    /// Creates and unlinks on 1, 2 and 3 servers on etcd for N minutes each: the rate, its p99
    /// latency and etcd's database size per minute, each against the first.
    Churn(servers::ChurnArgs),
    /// Creates in one namespace over 1, 2 and 3 metadata clusters (local etcd clusters), in
    /// this process, each client in a directory of the root of its own: the rate against one
    /// cluster's in the same pass.
    Clusters(servers::ClustersArgs),
    /// Appends, fsync'd writes, sqlite transactions, creates and unlinks from several mounts
    /// of one server for N minutes: each minute's rates against the first, p99 latencies,
    /// records per chunk and memory; every result checked, no object leaked.
    Soak(soak::SoakArgs),
    /// What atomic appends cost one mount (direct I/O), against appends through the page
    /// cache; and records torn when two mounts append at once, with each.
    Appends(soak::AppendsArgs),
    /// create, stat and unlink rates in-process, over gRPC and on the kernel's tmpfs.
    Mdtest {
        /// Concurrent clients, comma-separated for several rounds.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        clients: Vec<usize>,
        /// Files per round.
        #[arg(long, default_value_t = 100_000)]
        files: u64,
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        #[arg(long, default_value = "/dev/shm")]
        tmpfs_dir: PathBuf,
        /// Each client in a directory of its own (mdtest -u); default: one shared directory.
        #[arg(long)]
        unique_dir: bool,
        /// Run calm's modes on this etcd cluster too (etcd://HOST:PORT,...), beside LMDB.
        #[arg(long)]
        store: Option<String>,
        /// Run calm's LMDB modes again with LMDB's own synchronous commit (store "lmdb-sync",
        /// `calm serve --no-wal`).
        #[arg(long)]
        no_wal: bool,
        /// Measure what the server's permission checks cost: an unprivileged caller, with the
        /// checks and without (this benchmark's process only), alternately. Needs a calm-bench
        /// built with `--features check-cost`.
        #[arg(long, conflicts_with = "no_wal")]
        check_cost: bool,
        /// Rounds with the checks and without, in turn, for --check-cost.
        #[arg(long, default_value_t = 4)]
        check_pairs: usize,
        /// The A/A run of --check-cost or --metrics-cost: both arms have what is measured (the
        /// cost it shows is noise).
        #[arg(long)]
        check_calibrate: bool,
        /// Measure what the server's Prometheus metrics cost (`calm serve --metrics`): calm's
        /// modes with a server counting its requests and without, alternately (--check-pairs
        /// rounds of each; the in-process mode, which nothing counts, is the control).
        #[arg(long, conflicts_with_all = ["no_wal", "check_cost"])]
        metrics_cost: bool,
        /// Run --metrics-cost's two arms at the same time, each with a server and clients of
        /// its own, instead of in turn (creates and unlinks by the first of --clients, in
        /// --unique-dir directories; --check-pairs rounds).
        #[arg(long, requires = "metrics_cost", conflicts_with = "store")]
        side_by_side: bool,
        /// With --side-by-side: busy the counting arm's calling threads for this many
        /// nanoseconds after each operation, a known cost to check that the method measures one.
        #[arg(long, default_value_t = 0, requires = "side_by_side")]
        burn_ns: u64,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// What quotas cost: creates, small-file writes and unlinks by an unprivileged caller
    /// under limits on three ancestors, its user and its group, against no limit, in turn.
    Quota {
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Files per round.
        #[arg(long, default_value_t = 20_000)]
        files: u64,
        /// Bytes written to each file, in one write.
        #[arg(long, default_value_t = 4096)]
        file_bytes: u32,
        /// Rounds with the limits and without, in turn.
        #[arg(long, default_value_t = 4)]
        pairs: usize,
        /// The A/A run: both arms have the limits (the cost it shows is noise).
        #[arg(long)]
        calibrate: bool,
        /// POSIX ACLs as well, in the arm with limits: each client's directory is root's,
        /// opened to the caller by a named entry of its access ACL, with a default ACL its
        /// files take (so every create, write and unlink is decided by an ACL).
        #[arg(long)]
        acls: bool,
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
}

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
