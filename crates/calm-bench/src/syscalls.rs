//! The system calls `calm-bench mount` times, on any directory of any file system: the
//! metadata shapes (create, stat cached and cold, readdir and `ls -l` cold, rename, unlink), small
//! files (create + write 4 KiB + close, then open + read + close), fcntl locks (N
//! non-overlapping on one file; uncontended lock + unlock pairs from 1 or more threads), and
//! the cross-mount visibility of a change between two mounts of one file system.
//!
//! Every shape runs with T threads, each in a directory of its own (in one shared directory
//! the kernel would serialize them on the directory's lock), names spread over them.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

/// One timed shape on one file system.
#[derive(Debug, Clone, Serialize)]
pub struct MountResult {
    pub fs: String,
    pub op: &'static str,
    /// Threads (or processes) doing it at once.
    pub threads: usize,
    pub n: u64,
    /// Operations done (less than `n` when the run hit the cap).
    pub completed: u64,
    pub stopped: bool,
    pub seconds: f64,
    pub ops_per_sec: f64,
}

pub fn result(
    fs: &str,
    op: &'static str,
    threads: usize,
    n: u64,
    completed: u64,
    seconds: f64,
) -> MountResult {
    MountResult {
        fs: fs.to_string(),
        op,
        threads,
        n,
        completed,
        stopped: completed < n,
        seconds,
        ops_per_sec: completed as f64 / seconds.max(1e-9),
    }
}

/// Runs `op(thread, index)` for every index below `n`, spread over `threads` (thread `t` takes
/// `t`, `t + threads`, …); returns the seconds taken.
pub(crate) fn spread(
    n: u64,
    threads: usize,
    op: impl Fn(usize, u64) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let op = &op;
                scope.spawn(move || -> Result<(), String> {
                    let mut i = t as u64;
                    while i < n {
                        op(t, i)?;
                        i += threads as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// Creates `path` as an empty file, failing if it exists (what a create of the metadata
/// benchmarks is).
pub(crate) fn create_empty(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map(drop)
        .map_err(|e| failed(path, e))
}

fn failed(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// The metadata and small-file shapes with `threads` threads on `n` names, in a directory of
/// its own under `root` (removed afterwards). Cold shapes drop the kernel's caches first
/// (`cold`: root may; otherwise they are not run).
pub fn metadata_ops(
    fs: &str,
    root: &Path,
    threads: usize,
    n: u64,
    cold: bool,
    results: &mut Vec<MountResult>,
) -> Result<(), String> {
    let dir = root.join(format!("mdtest-{threads}"));
    let own = |t: usize| dir.join(format!("t{t}"));
    for t in 0..threads {
        std::fs::create_dir_all(own(t)).map_err(|e| failed(&own(t), e))?;
    }
    let name = |t: usize, i: u64| own(t).join(format!("f{i:08}"));
    let renamed = |t: usize, i: u64| own(t).join(format!("f{i:08}.renamed"));
    let mut push = |op, seconds| results.push(result(fs, op, threads, n, n, seconds));

    let seconds = spread(n, threads, |t, i| create_empty(&name(t, i)))?;
    push("create", seconds);
    let stat = |t: usize, i: u64| {
        let path = name(t, i);
        std::fs::metadata(&path)
            .map(drop)
            .map_err(|e| failed(&path, e))
    };
    push("stat-cached", spread(n, threads, stat)?);
    if cold {
        crate::drop_caches();
        push("stat-cold", spread(n, threads, stat)?);
        // Listings of each thread's directory, all at once, names only (`ls -f`), and then
        // names and attributes (`ls -l`): entries per second.
        for (op, attributes) in [("readdir", false), ("ls-l", true)] {
            crate::drop_caches();
            let seconds = list(&dir, threads, n, attributes)?;
            push(op, seconds);
        }
    }
    let seconds = spread(n, threads, |t, i| {
        std::fs::rename(name(t, i), renamed(t, i)).map_err(|e| failed(&name(t, i), e))
    })?;
    push("rename", seconds);
    let seconds = spread(n, threads, |t, i| {
        std::fs::remove_file(renamed(t, i)).map_err(|e| failed(&renamed(t, i), e))
    })?;
    push("unlink", seconds);

    // Small files: create, write 4 KiB and close; then (cold when possible) open, read and
    // close each, checking its length.
    let data = vec![0x5au8; 4096];
    let seconds = spread(n, threads, |t, i| {
        let path = name(t, i);
        std::fs::write(&path, &data).map_err(|e| failed(&path, e))
    })?;
    push("small-write", seconds);
    if cold {
        crate::drop_caches();
    }
    let seconds = spread(n, threads, |t, i| {
        let path = name(t, i);
        let read = std::fs::read(&path).map_err(|e| failed(&path, e))?;
        match read.len() {
            4096 => Ok(()),
            other => Err(format!("{}: {other} bytes, wrote 4096", path.display())),
        }
    })?;
    push("small-read", seconds);
    std::fs::remove_dir_all(&dir).map_err(|e| failed(&dir, e))
}

/// Lists every thread's directory under `dir` at once (with each entry's attributes when
/// `attributes`); the seconds taken, after checking that `n` entries were seen in all.
fn list(dir: &Path, threads: usize, n: u64, attributes: bool) -> Result<f64, String> {
    let started = Instant::now();
    let listed = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let own = dir.join(format!("t{t}"));
                scope.spawn(move || -> Result<u64, String> {
                    let mut count = 0;
                    for entry in std::fs::read_dir(&own).map_err(|e| failed(&own, e))? {
                        let entry = entry.map_err(|e| failed(&own, e))?;
                        if attributes {
                            entry.metadata().map_err(|e| failed(&entry.path(), e))?;
                        }
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
    let seconds = started.elapsed().as_secs_f64();
    if listed != n {
        return Err(format!(
            "{}: listed {listed} entries, made {n}",
            dir.display()
        ));
    }
    Ok(seconds)
}

/// A fresh file for lock runs.
fn lock_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| failed(path, e))
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
pub fn fcntl_locks(fs: &str, root: &Path, n: u64, cap_seconds: f64) -> Result<MountResult, String> {
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
    std::fs::remove_file(&path).map_err(|e| failed(&path, e))?;
    Ok(result(fs, "fcntl-locks", 1, n, done, seconds))
}

/// Uncontended fcntl write lock and unlock pairs on one file from `threads` threads, each
/// through a descriptor of its own on a 4 KiB range of its own (the round trips a
/// lock-protected update pays), `pairs` in all; ops/s counts pairs.
pub fn lock_unlock(
    fs: &str,
    root: &Path,
    threads: usize,
    pairs: u64,
) -> Result<MountResult, String> {
    let path = root.join("lock-unlock");
    drop(lock_file(&path)?);
    let files = (0..threads)
        .map(|_| lock_file(&path))
        .collect::<Result<Vec<_>, String>>()?;
    let seconds = spread(pairs, threads, |t, _| {
        let start = t as u64 * 4096;
        for kind in [libc::F_WRLCK, libc::F_UNLCK] {
            set_lock(&files[t], kind, start, 4096)
                .map_err(|e| format!("{fs}: lock or unlock refused: {e}"))?;
        }
        Ok(())
    })?;
    drop(files);
    std::fs::remove_file(&path).map_err(|e| failed(&path, e))?;
    Ok(result(fs, "lock-unlock", threads, pairs, pairs, seconds))
}

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
pub fn visibility(a: &Path, b: &Path, samples: usize) -> Result<Visibility, String> {
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
