//! The arguments of each `calm-bench` command (clap's derive): what the user may set, with the
//! defaults each benchmark was measured with.

use std::path::PathBuf;

use clap::Subcommand;

use super::output::OutputArgs;
use super::servers;
use super::soak;

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
