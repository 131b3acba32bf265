//! `calm-bench mount`: system calls through real calm mounts against the same system calls on
//! the kernel's tmpfs, a disk file system (ext4) and any other file system given, in the same
//! run, at several thread counts (the shapes: `crate::syscalls`): creates, stats (cached, and
//! cold after the kernel's caches are dropped), readdir and `ls -l` of the directories (cold),
//! renames, unlinks, small files written and read, N non-overlapping fcntl write locks on one
//! file (the seed-001 shape, where the kernel's own lock list is O(n) per request) and
//! uncontended lock + unlock pairs. Two mounts of one server: `calm` calls the server in this
//! process (as `calm mount --embedded`), `calm-remote` speaks gRPC to it over loopback TCP (as
//! `calm mount --server`).
//!
//! Also the cross-mount visibility: a change made through one mount (chmod, rename, write and
//! close, unlink) of a file the other mount has looked at, and how long until the other mount
//! shows it (polled every 100 µs; p50 and p99).
//!
//! The mount is made in a private mount namespace of this process when it can make one (it is
//! still single-threaded when the benchmark starts), so it vanishes with the process whatever
//! happens; calm's server runs in this process on a temporary store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use crate::syscalls::{MountResult, Visibility, result};
use crate::syscalls::{VISIBILITY_WAIT, fcntl_locks, lock_unlock, metadata_ops, visibility};

#[derive(Debug, Clone)]
pub struct MountBenchOptions {
    /// Files created, stat'ed and unlinked per file system and thread count.
    pub files: u64,
    /// Thread counts of the metadata and small-file shapes (names spread over the threads).
    pub threads: Vec<usize>,
    /// Thread counts of the lock + unlock pairs.
    pub lock_threads: Vec<usize>,
    /// Lock counts.
    pub locks: Vec<u64>,
    /// Longest one lock run may take, in seconds (it then reports the count reached).
    pub cap_seconds: f64,
    pub tmpfs_dir: PathBuf,
    /// Where the temporary store, data directory and mount point are made.
    pub dir: PathBuf,
    /// Changes of each kind timed for the cross-mount visibility (0: none).
    pub visibility_samples: usize,
    /// The mounts' attribute and entry timeout.
    pub ttl: Duration,
    /// A directory on ext4 (or any local disk file system) to measure beside tmpfs.
    pub ext4_dir: Option<PathBuf>,
    /// Other file systems, mounted beforehand, measured in the same run (the first
    /// directory of each).
    pub others: Vec<crate::data::Other>,
    /// Real programs too (sqlite writers, tar), on every file system: `crate::programs`.
    pub programs: Option<crate::programs::ProgramOptions>,
    /// The store commits through its write-ahead log, as `calm mount --embedded` and `calm
    /// serve` do by default (off: LMDB's own synchronous commit, `--no-wal`).
    pub wal: bool,
    /// Every change on the disk before it is answered (`calm serve --sync`); otherwise within
    /// 10 ms, or at a client's fsync, as `calm serve` by default.
    pub store_sync: bool,
}

impl MountReport {
    /// The report as a table, one line per result, then the visibility and the setting.
    /// One panel per shape, its rate over threads (over locks for fcntl locks), one line per
    /// file system (`--plot`).
    pub fn facets(&self) -> Vec<crate::multiples::Facet> {
        crate::multiples::facets_of(self.results.iter().map(|r| {
            let (x_label, x) = match r.op {
                "fcntl-locks" => ("locks held", r.n as f64),
                _ => ("threads", r.threads as f64),
            };
            let unit = match r.op {
                "readdir" | "ls-l" => "entries/s",
                "small-write" | "small-read" => "files/s",
                _ => "operations/s",
            };
            crate::multiples::Cell::at(
                r.op.to_string(),
                (x_label, x),
                (unit, r.ops_per_sec),
                match r.fs.as_str() {
                    "calm" => "calm, server in the mount's process".to_string(),
                    "calm-remote" => "calm, server over gRPC".to_string(),
                    other => other.to_string(),
                },
            )
            .log()
        }))
    }

    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{:>11} {:>18} {:>7} {:>8} {:>10} {:>8} {:>12} {:>12}",
            "fs", "op", "threads", "n", "completed", "stopped", "seconds", "ops/s"
        )];
        for r in &self.results {
            lines.push(format!(
                "{:>11} {:>18} {:>7} {:>8} {:>10} {:>8} {:>12.3} {:>12.0}",
                r.fs, r.op, r.threads, r.n, r.completed, r.stopped, r.seconds, r.ops_per_sec
            ));
        }
        if let Some(v) = &self.visibility_ms {
            lines.push(format!(
                "cross-mount visibility: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} \
                 changes ({} unseen after {} s)",
                v.p50,
                v.p99,
                v.max,
                v.samples,
                v.unseen,
                VISIBILITY_WAIT.as_secs()
            ));
            for (kind, p50, p99) in &v.by_kind {
                lines.push(format!("  {kind:>12}: p50 {p50:.1} ms, p99 {p99:.1} ms"));
            }
        }
        for (fs, s) in ["calm", "calm-remote"].iter().zip(&self.cache_stats) {
            lines.push(format!(
                "{fs}: {} invalidations sent to its kernel, whole cache dropped {} times",
                s.invalidations, s.dropped_all
            ));
        }
        lines.push(format!(
            "{}; attribute and entry timeout {} ms; {}; {}",
            match self.cold {
                true => "cold shapes after the kernel's caches were dropped",
                false => "the kernel's caches could not be dropped: no cold shapes",
            },
            self.ttl_ms,
            if self.private_namespace {
                "mounted in a private mount namespace"
            } else {
                "mounted in this namespace (no private one could be made)"
            },
            match self.store_sync {
                true => "every change on the disk before it is answered (--store-sync)",
                false => "changes on the disk within 10 ms or at fsync, as calm serve's default",
            }
        ));
        lines
    }
}

/// Lock and unlock pairs timed on each file system and thread count.
pub const LOCK_UNLOCK_PAIRS: u64 = 5_000;

#[derive(Debug, Clone, Serialize)]
pub struct MountReport {
    pub bench: &'static str,
    /// Whether the mount lived in a private mount namespace.
    pub private_namespace: bool,
    /// The mount's attribute and entry timeout (stat results the kernel may answer itself).
    pub ttl_ms: u64,
    /// Every change was on the disk before it was answered (`--store-sync`).
    pub store_sync: bool,
    /// Whether the cold shapes ran cold (the kernel's caches dropped; root only).
    pub cold: bool,
    pub results: Vec<MountResult>,
    pub visibility_ms: Option<Visibility>,
    /// Per mount (`calm`, then `calm-remote`): what keeping its cache exact did.
    pub cache_stats: Vec<CacheFigures>,
}

/// What a mount's cache coherence did over the run.
#[derive(Debug, Clone, Serialize)]
pub struct CacheFigures {
    /// Invalidations sent to the kernel (changes made through the other mount).
    pub invalidations: u64,
    /// Times the whole cache was dropped (the change stream fell behind or broke).
    pub dropped_all: u64,
}

/// Runs the whole benchmark.
pub fn run(options: &MountBenchOptions) -> Result<MountReport, String> {
    if options.files == 0
        || options.threads.is_empty()
        || [&options.threads, &options.lock_threads]
            .iter()
            .any(|counts| counts.contains(&0))
        || options.locks.contains(&0)
    {
        return Err("--files, --threads, --lock-threads and --locks must be positive".into());
    }
    let private_namespace = crate::enter_private_namespace();
    // Cold shapes need the kernel's caches dropped, which only root may.
    let cold = crate::drop_caches();
    let runtime = crate::runtime()?;
    let sync = match options.store_sync {
        true => calm_store::CommitSync::EveryCommit,
        false => calm_store::CommitSync::Within(std::time::Duration::from_millis(10)),
    };
    let (work, meta) = crate::mdtest::open_meta_synced(&options.dir, options.wal, sync)?;
    let mountpoint = work.path().join("mnt");
    std::fs::create_dir(&mountpoint).map_err(|e| e.to_string())?;
    // A second mount of the same server, for the cross-mount visibility.
    let second = work.path().join("mnt2");
    std::fs::create_dir(&second).map_err(|e| e.to_string())?;
    let fuse_options = calm_fuse::MountOptions {
        ttl: options.ttl,
        ..Default::default()
    };
    let (server, mounted, mounted_second) = runtime.block_on(async {
        let server = crate::mdtest::InProcessServer::start(Arc::clone(&meta)).await?;
        let mut mounts = Vec::new();
        for point in [&mountpoint, &second] {
            let mut client = calm_client::Client::connect(&server.addr)
                .await
                .map_err(|e| e.to_string())?;
            // The first mount calls the server in this process, as `calm mount --embedded`
            // does; the second speaks gRPC, as `calm mount --server` does.
            if point == &mountpoint {
                client = client.in_process(server.local.clone());
            }
            let mounted = calm_fuse::mount(
                client,
                point,
                &fuse_options,
                tokio::runtime::Handle::current(),
            )
            .await
            .map_err(|e| format!("mounting at {}: {e}", point.display()))?;
            mounts.push(mounted);
        }
        let second = mounts.pop().ok_or("no second mount")?;
        let first = mounts.pop().ok_or("no first mount")?;
        Ok::<_, String>((server, first, second))
    })?;
    let tmpfs = tempfile::Builder::new()
        .prefix("calm-bench-mount-")
        .tempdir_in(&options.tmpfs_dir)
        .map_err(|e| format!("{}: {e}", options.tmpfs_dir.display()))?;

    let measured = (|| {
        let mut results = Vec::new();
        // Beside calm: tmpfs, ext4 and the other file systems asked for, in directories of
        // their own removed afterwards.
        let mut baselines = Vec::new();
        if let Some(dir) = &options.ext4_dir {
            baselines.push(("ext4".to_string(), dir.clone()));
        }
        for other in &options.others {
            baselines.push((other.name.clone(), other.views[0].clone()));
        }
        let mut baseline_dirs = Vec::new();
        for (name, dir) in &baselines {
            let own = tempfile::Builder::new()
                .prefix("calm-bench-mount-")
                .tempdir_in(dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            baseline_dirs.push((name.clone(), own));
        }
        let mut every: Vec<(&str, &Path)> = vec![
            ("calm", mountpoint.as_path()),
            ("calm-remote", second.as_path()),
            ("tmpfs", tmpfs.path()),
        ];
        every.extend(baseline_dirs.iter().map(|(n, d)| (n.as_str(), d.path())));
        for &threads in &options.threads {
            for &(fs, root) in &every {
                metadata_ops(fs, root, threads, options.files, cold, &mut results)?;
            }
        }
        let mut tmpfs_capped = false;
        for &n in &options.locks {
            results.push(fcntl_locks("calm", &mountpoint, n, options.cap_seconds)?);
            results.push(fcntl_locks("calm-remote", &second, n, options.cap_seconds)?);
            if !tmpfs_capped {
                let r = fcntl_locks("tmpfs", tmpfs.path(), n, options.cap_seconds)?;
                tmpfs_capped = r.stopped;
                results.push(r);
            }
        }
        for &threads in &options.lock_threads {
            for &(fs, root) in &every {
                results.push(lock_unlock(fs, root, threads, LOCK_UNLOCK_PAIRS)?);
            }
        }
        if let Some(programs) = &options.programs {
            let ball = crate::programs::make_tarball(tmpfs.path(), programs.tar_files)?;
            for &(fs, root) in &every {
                results.extend(crate::programs::run_all(fs, root, &ball, programs)?);
            }
        }
        let visible = match options.visibility_samples {
            0 => None,
            n => Some(visibility(&mountpoint, &second, n)?),
        };
        Ok::<_, String>((results, visible))
    })();

    // What keeping the caches exact cost each mount (the embedded one, then the remote one).
    let cache_stats = [mounted.cache_stats(), mounted_second.cache_stats()]
        .map(|s| CacheFigures {
            invalidations: s.invalidations,
            dropped_all: s.dropped_all,
        })
        .to_vec();
    let ended = runtime.block_on(async {
        let unmounted_second = mounted_second.unmount().await.map_err(|e| e.to_string());
        let unmounted = mounted
            .unmount()
            .await
            .map_err(|e| e.to_string())
            .and(unmounted_second);
        let stopped = server.stop().await;
        unmounted.and(stopped)
    });
    drop(runtime);
    drop(meta);
    let (results, visibility_ms) = measured?;
    ended?;
    Ok(MountReport {
        bench: "mount",
        private_namespace,
        ttl_ms: options.ttl.as_millis() as u64,
        store_sync: options.store_sync,
        cold,
        results,
        visibility_ms,
        cache_stats,
    })
}
