//! `calm bench mount`: system calls through real calm mounts against the same system calls on
//! the kernel's tmpfs, in the same run: create, stat (cached, and cold after the kernel's
//! caches are dropped), `ls -l` of the directories (cold), rename and unlink rates, and N
//! non-overlapping fcntl write locks on one file (the seed-001 shape, where the kernel's own lock list is
//! O(n) per request). Two mounts of one server: `calm` calls the server in this process (as
//! `calm mount --embedded`), `calm-remote` speaks gRPC to it over loopback TCP (as
//! `calm mount --server`).
//!
//! Also the cross-mount visibility: a change made through one mount (chmod, rename, write and
//! close, unlink) of a file the other mount has looked at, and how long until the other mount
//! shows it (polled every 100 µs; p50 and p99).
//!
//! The mount is made in a private mount namespace of this process when it can make one (it is
//! still single-threaded when the benchmark starts), so it vanishes with the process whatever
//! happens; calm's server runs in this process on a temporary store.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Debug, Clone)]
pub struct MountBenchOptions {
    /// Files created, stat'ed and unlinked per file system.
    pub files: u64,
    /// Threads doing the metadata operations (names spread over them).
    pub threads: usize,
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
}

impl MountReport {
    /// The report as a table, one line per result, then the visibility and the setting.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{:>11} {:>18} {:>8} {:>10} {:>8} {:>12} {:>12}",
            "fs", "op", "n", "completed", "stopped", "seconds", "ops/s"
        )];
        for r in &self.results {
            lines.push(format!(
                "{:>11} {:>18} {:>8} {:>10} {:>8} {:>12.3} {:>12.0}",
                r.fs, r.op, r.n, r.completed, r.stopped, r.seconds, r.ops_per_sec
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
            "{} threads; attribute and entry timeout {} ms; {}",
            self.threads,
            self.ttl_ms,
            if self.private_namespace {
                "mounted in a private mount namespace"
            } else {
                "mounted in this namespace (no private one could be made)"
            }
        ));
        lines
    }
}

/// Lock and unlock pairs timed on each file system.
pub const LOCK_UNLOCK_PAIRS: u64 = 5_000;

/// How long a change may take to show through the other mount before it counts as unseen.
pub const VISIBILITY_WAIT: Duration = Duration::from_secs(5);

/// How long until a change through one mount shows through the other, in ms.
#[derive(Debug, Clone, Serialize)]
pub struct Visibility {
    pub samples: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Changes not seen within [`VISIBILITY_WAIT`] (counted at that wait).
    pub unseen: usize,
    /// p50 and p99 per kind of change.
    pub by_kind: Vec<(String, f64, f64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountResult {
    pub fs: String,
    pub op: &'static str,
    pub n: u64,
    /// Operations done (less than `n` when the run hit the cap).
    pub completed: u64,
    pub stopped: bool,
    pub seconds: f64,
    pub ops_per_sec: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountReport {
    pub bench: &'static str,
    /// Whether the mount lived in a private mount namespace.
    pub private_namespace: bool,
    /// The mount's attribute and entry timeout (stat results the kernel may answer itself).
    pub ttl_ms: u64,
    pub threads: usize,
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

pub(crate) fn result(
    fs: &str,
    op: &'static str,
    n: u64,
    completed: u64,
    seconds: f64,
) -> MountResult {
    MountResult {
        fs: fs.to_string(),
        op,
        n,
        completed,
        stopped: completed < n,
        seconds,
        ops_per_sec: completed as f64 / seconds.max(1e-9),
    }
}

/// Runs `op(name)` for every file name, spread over `threads`, each thread in its own
/// directory `dir/tN` (in one shared directory the kernel would serialize them on the
/// directory's lock); returns the seconds taken.
fn timed_names(
    dir: &Path,
    files: u64,
    threads: usize,
    op: impl Fn(&Path) -> std::io::Result<()> + Sync,
) -> Result<f64, String> {
    let started = Instant::now();
    let failed = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let op = &op;
                scope.spawn(move || -> Result<(), String> {
                    let mut i = t;
                    let own = dir.join(format!("t{t}"));
                    while i < files {
                        let path = own.join(format!("f{i:08}"));
                        op(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                        i += threads as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .find(Result::is_err)
    });
    if let Some(Err(e)) = failed {
        return Err(e);
    }
    Ok(started.elapsed().as_secs_f64())
}

fn metadata_ops(
    fs: &str,
    root: &Path,
    options: &MountBenchOptions,
    results: &mut Vec<MountResult>,
) -> Result<(), String> {
    let dir = root.join("mdtest");
    for t in 0..options.threads {
        let own = dir.join(format!("t{t}"));
        std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
    }
    let n = options.files;
    let seconds = timed_names(&dir, n, options.threads, |path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map(drop)
    })?;
    results.push(result(fs, "create", n, n, seconds));
    let seconds = timed_names(&dir, n, options.threads, |path| {
        std::fs::metadata(path).map(drop)
    })?;
    results.push(result(fs, "stat", n, n, seconds));
    // The same stats with the kernel's dentries and inodes dropped first (root only; the
    // kernel keeps tmpfs's, which have nowhere else to live).
    if crate::drop_caches() {
        let seconds = timed_names(&dir, n, options.threads, |path| {
            std::fs::metadata(path).map(drop)
        })?;
        results.push(result(fs, "stat-cold", n, n, seconds));
    }
    // `ls -l` of each thread's directory, all at once, with the kernel's caches dropped first
    // when they can be: entries listed and stat'ed per second.
    let listing = match crate::drop_caches() {
        true => "ls-l-cold",
        false => "ls-l",
    };
    let started = Instant::now();
    let listed = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..options.threads)
            .map(|t| {
                let own = dir.join(format!("t{t}"));
                scope.spawn(move || -> Result<u64, String> {
                    let mut count = 0;
                    let entries =
                        std::fs::read_dir(&own).map_err(|e| format!("{}: {e}", own.display()))?;
                    for entry in entries {
                        let entry = entry.map_err(|e| e.to_string())?;
                        entry.metadata().map_err(|e| e.to_string())?;
                        count += 1;
                    }
                    Ok(count)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a lister panicked".into())))
            .sum::<Result<u64, String>>()
    })?;
    if listed != n {
        return Err(format!("{fs}: listed {listed} entries, made {n}"));
    }
    results.push(result(fs, listing, n, n, started.elapsed().as_secs_f64()));
    let renamed = |path: &Path| path.with_extension("renamed");
    let seconds = timed_names(&dir, n, options.threads, |path| {
        std::fs::rename(path, renamed(path))
    })?;
    results.push(result(fs, "rename", n, n, seconds));
    let seconds = timed_names(&dir, n, options.threads, |path| {
        std::fs::remove_file(renamed(path))
    })?;
    results.push(result(fs, "unlink", n, n, seconds));
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// A fresh file for lock runs.
fn lock_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// fcntl F_SETLK of `kind` (F_WRLCK, F_UNLCK, …) on `len` bytes at `start` of `file`.
fn set_lock(file: &std::fs::File, kind: i32, start: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: flock is plain data; all zeros is valid before the fields are set.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = start as i64;
    lock.l_len = len as i64;
    // SAFETY: fcntl(2) F_SETLK on an open descriptor with a valid struct flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `n` one-byte write locks with gaps (so that none merge) on one file, ascending, through one
/// descriptor; stops at the cap.
fn fcntl_locks(fs: &str, root: &Path, n: u64, cap_seconds: f64) -> Result<MountResult, String> {
    let path = root.join(format!("locks-{n}"));
    let file = lock_file(&path)?;
    let started = Instant::now();
    let mut done = 0;
    for i in 0..n {
        set_lock(&file, libc::F_WRLCK, 2 * i, 1)
            .map_err(|e| format!("{fs}: lock {i} refused: {e}"))?;
        done += 1;
        if done % 256 == 0 && started.elapsed().as_secs_f64() > cap_seconds {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(result(fs, "fcntl-locks", n, done, seconds))
}

/// Uncontended fcntl write lock and unlock of one byte range of one file, `n` pairs, through
/// one descriptor (the round trips a lock-protected update pays); ops/s counts pairs.
fn lock_unlock(fs: &str, root: &Path, n: u64) -> Result<MountResult, String> {
    let path = root.join("lock-unlock");
    let file = lock_file(&path)?;
    let set = |kind: i32| {
        set_lock(&file, kind, 0, 4096).map_err(|e| format!("{fs}: lock or unlock refused: {e}"))
    };
    let started = Instant::now();
    for _ in 0..n {
        set(libc::F_WRLCK)?;
        set(libc::F_UNLCK)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(result(fs, "lock-unlock", n, n, seconds))
}

/// The `q` quantile (0..=1) of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// Waits until `seen()` holds, polling every 100 µs; the ms it took, or None past
/// [`VISIBILITY_WAIT`].
fn until(seen: impl Fn() -> bool) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < VISIBILITY_WAIT {
        if seen() {
            return Some(started.elapsed().as_secs_f64() * 1e3);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

/// Changes made through mount `a` of files mount `b` has just looked at, and how long `b`
/// takes to show each: chmod, rename, write + close, unlink; `samples` of each.
fn visibility(a: &Path, b: &Path, samples: usize) -> Result<Visibility, String> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, e: std::io::Error| format!("visibility, {what}: {e}");
    let dir = "visibility";
    std::fs::create_dir(a.join(dir)).map_err(|e| io("mkdir", e))?;
    let mut all = Vec::new();
    let mut by_kind = Vec::new();
    let mut unseen = 0;
    for kind in ["chmod", "rename", "write-close", "unlink"] {
        let mut times = Vec::new();
        for i in 0..samples {
            let name = format!("{dir}/{kind}-{i}");
            std::fs::write(a.join(&name), b"before").map_err(|e| io("create", e))?;
            // Mount b looks first, so that what it caches is the old state: its attributes
            // (a stat: a read would make the kernel ask again for the access time), or, for
            // the write, its contents.
            let seen_before = match kind {
                "write-close" => {
                    until(|| std::fs::read(b.join(&name)).is_ok_and(|d| d == b"before"))
                }
                _ => until(|| std::fs::metadata(b.join(&name)).is_ok_and(|m| m.len() == 6)),
            };
            if seen_before.is_none() {
                return Err(format!("{name} never showed through the second mount"));
            }
            let started = Instant::now();
            let waited = match kind {
                "chmod" => {
                    std::fs::set_permissions(a.join(&name), PermissionsExt::from_mode(0o600))
                        .map_err(|e| io("chmod", e))?;
                    until(|| {
                        std::fs::metadata(b.join(&name))
                            .is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600)
                    })
                }
                "rename" => {
                    let to = format!("{name}-renamed");
                    std::fs::rename(a.join(&name), a.join(&to)).map_err(|e| io("rename", e))?;
                    until(|| std::fs::metadata(b.join(&to)).is_ok() && !b.join(&name).exists())
                }
                "write-close" => {
                    std::fs::write(a.join(&name), b"after!").map_err(|e| io("write", e))?;
                    until(|| std::fs::read(b.join(&name)).is_ok_and(|d| d == b"after!"))
                }
                _ => {
                    std::fs::remove_file(a.join(&name)).map_err(|e| io("unlink", e))?;
                    until(|| !b.join(&name).exists())
                }
            };
            // From the change's return to its sight through b.
            let ms = match waited {
                Some(_) => started.elapsed().as_secs_f64() * 1e3,
                None => {
                    unseen += 1;
                    VISIBILITY_WAIT.as_secs_f64() * 1e3
                }
            };
            times.push(ms);
        }
        times.sort_by(f64::total_cmp);
        by_kind.push((
            kind.to_string(),
            quantile(&times, 0.5),
            quantile(&times, 0.99),
        ));
        all.extend(times);
    }
    std::fs::remove_dir_all(a.join(dir)).map_err(|e| io("cleaning up", e))?;
    all.sort_by(f64::total_cmp);
    Ok(Visibility {
        samples: all.len(),
        p50: quantile(&all, 0.5),
        p99: quantile(&all, 0.99),
        max: all.last().copied().unwrap_or(f64::NAN),
        unseen,
        by_kind,
    })
}

/// Runs the whole benchmark.
pub fn run(options: &MountBenchOptions) -> Result<MountReport, String> {
    if options.files == 0 || options.threads == 0 || options.locks.contains(&0) {
        return Err("--files, --threads and --locks values must be positive".into());
    }
    let private_namespace = crate::enter_private_namespace();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (work, meta) = crate::mdtest::open_meta_with(&options.dir, options.wal)?;
    let mountpoint = work.path().join("mnt");
    std::fs::create_dir(&mountpoint).map_err(|e| e.to_string())?;
    // A second mount of the same server, for the cross-mount visibility.
    let second = work.path().join("mnt2");
    std::fs::create_dir(&second).map_err(|e| e.to_string())?;
    let fuse_options = calm_fuse::MountOptions {
        write_buffer_bytes: calm_fuse::contents::WRITE_BUFFER_BYTES_DEFAULT,
        ttl: options.ttl,
        lease_ms: calm_fuse::locks::LEASE_MS_DEFAULT,
        allow_other: false,
        cache_dir: None,
        cache_bytes: 0,
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
        metadata_ops("calm", &mountpoint, options, &mut results)?;
        metadata_ops("calm-remote", &second, options, &mut results)?;
        metadata_ops("tmpfs", tmpfs.path(), options, &mut results)?;
        // Beside them: ext4, and the other file systems asked for, in directories of their
        // own removed afterwards.
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
            metadata_ops(name, own.path(), options, &mut results)?;
            baseline_dirs.push((name.clone(), own));
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
        for (fs, root) in [
            ("calm", mountpoint.as_path()),
            ("calm-remote", second.as_path()),
            ("tmpfs", tmpfs.path()),
        ] {
            results.push(lock_unlock(fs, root, LOCK_UNLOCK_PAIRS)?);
        }
        for (name, own) in &baseline_dirs {
            results.push(lock_unlock(name, own.path(), LOCK_UNLOCK_PAIRS)?);
        }
        if let Some(programs) = &options.programs {
            let ball = crate::programs::make_tarball(tmpfs.path(), programs.tar_files)?;
            let mut runs = vec![
                ("calm", mountpoint.as_path()),
                ("calm-remote", second.as_path()),
                ("tmpfs", tmpfs.path()),
            ];
            runs.extend(baseline_dirs.iter().map(|(n, d)| (n.as_str(), d.path())));
            for (fs, root) in runs {
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
        threads: options.threads,
        results,
        visibility_ms,
        cache_stats,
    })
}
