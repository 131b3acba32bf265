//! `calm-bench data`: file contents through real calm mounts against the same work on the
//! local file system under the data directory (ext4 here) and on tmpfs, in one run:
//! sequential write (each run ends with fsync) and read (cold cache) in 1 MiB requests at 1
//! and 4 streams, random 4 KiB reads of one file cold and warm, small files (create, write
//! 4 KiB, close; then open, read, close) at 1 and 16 threads, and the lock-protected increment
//! from two mounts of one server (its total checked exactly).
//!
//! calm runs in this process: a server on a temporary store, two mounts of it for each object
//! store (`calm-file`: a local directory beside the store; `calm-s3`: the S3 store given with
//! `--s3`). Mounts live in a private mount namespace when one can be made.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct DataBenchOptions {
    /// Bytes written and read by the sequential cases (split over the streams).
    pub seq_bytes: u64,
    pub streams: Vec<usize>,
    /// Size of the file of the random reads, and reads per run.
    pub rand_file_bytes: u64,
    pub rand_reads: u64,
    /// Small files per run, and the thread counts.
    pub files: u64,
    pub threads: Vec<usize>,
    /// Increments per worker (2 workers per mount, 2 mounts).
    pub increments: u64,
    /// An S3 store for calm-s3 (`s3://BUCKET[/PREFIX]?endpoint=…`; credentials from the AWS
    /// environment variables). Without it, calm-s3 is not run.
    pub s3: Option<String>,
    /// Where the ext4 baseline, the store and the local objects go.
    pub dir: PathBuf,
    pub tmpfs_dir: PathBuf,
    /// Other file systems measured in the same run, each a name and its two views (two
    /// mounts of one file system, or one directory twice), mounted beforehand by the caller
    /// (for example JuiceFS, to compare). Each runs in a fresh directory under its first view.
    pub others: Vec<Other>,
    /// The calm mounts' inline limit (`calm mount --inline-bytes-max`).
    pub inline_bytes_max: u64,
}

/// A file system the caller mounted, to be measured beside calm.
#[derive(Debug, Clone, PartialEq)]
pub struct Other {
    pub name: String,
    pub views: [PathBuf; 2],
}

impl std::str::FromStr for Other {
    type Err = String;

    /// `NAME=DIR` or `NAME=DIR,DIR2` (two mounts of one file system).
    fn from_str(text: &str) -> Result<Other, String> {
        let (name, dirs) = text
            .split_once('=')
            .ok_or_else(|| format!("{text}: expected NAME=DIR[,DIR2]"))?;
        let reserved = ["ext4", "tmpfs", "calm-file", "calm-s3"];
        if name.is_empty() || reserved.contains(&name) {
            return Err(format!(
                "{text}: a name of its own, please (not one of {reserved:?})"
            ));
        }
        let dirs: Vec<&str> = dirs.split(',').collect();
        let views = match dirs.as_slice() {
            [one] if !one.is_empty() => [PathBuf::from(one), PathBuf::from(one)],
            [a, b] if !a.is_empty() && !b.is_empty() => [PathBuf::from(a), PathBuf::from(b)],
            _ => return Err(format!("{text}: expected NAME=DIR[,DIR2]")),
        };
        Ok(Other {
            name: name.to_string(),
            views,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DataResult {
    pub fs: String,
    pub case: &'static str,
    pub threads: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_sec: Option<f64>,
    pub seconds: f64,
    /// locked-increment: increments the records do not add up to (0: exact). A file system
    /// whose locks do not protect read-modify-write across its mounts loses some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DataReport {
    pub bench: &'static str,
    pub results: Vec<DataResult>,
    /// Whether the page cache could be dropped before the cold cases (needs root).
    pub cold_cache: bool,
    pub private_namespace: bool,
}

const MIB: usize = 1 << 20;
const RECORDS: u64 = 8;

fn err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Runs `work(i)` for `i` in `0..threads` on threads of its own; returns the seconds taken.
fn parallel(
    threads: usize,
    work: impl Fn(usize) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let work = &work;
                scope.spawn(move || work(i))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(started.elapsed().as_secs_f64())
}

fn pattern() -> Vec<u8> {
    // Not compressible, not all zeros: a simple generator is enough.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn seq_write(dir: &Path, bytes: u64, streams: usize) -> Result<f64, String> {
    let buf = pattern();
    let per = bytes / streams as u64;
    parallel(streams, |i| {
        let path = dir.join(format!("seq-{i}"));
        let mut file = std::fs::File::create(&path).map_err(|e| err(&path, e))?;
        let mut left = per;
        while left > 0 {
            let n = left.min(MIB as u64) as usize;
            file.write_all(&buf[..n]).map_err(|e| err(&path, e))?;
            left -= n as u64;
        }
        file.sync_all().map_err(|e| err(&path, e))
    })
}

fn seq_read(dir: &Path, bytes: u64, streams: usize) -> Result<f64, String> {
    let per = bytes / streams as u64;
    parallel(streams, |i| {
        let path = dir.join(format!("seq-{i}"));
        let mut file = std::fs::File::open(&path).map_err(|e| err(&path, e))?;
        let mut buf = vec![0u8; MIB];
        let mut read = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(|e| err(&path, e))?;
            if n == 0 {
                break;
            }
            read += n as u64;
        }
        if read != per {
            return Err(format!("{}: read {read} bytes of {per}", path.display()));
        }
        Ok(())
    })
}

fn rand_reads(path: &Path, file_bytes: u64, reads: u64, seed: u64) -> Result<f64, String> {
    let file = std::fs::File::open(path).map_err(|e| err(path, e))?;
    let mut x = seed | 1;
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    for _ in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % (file_bytes / 4096)) * 4096;
        file.read_exact_at(&mut buf, at).map_err(|e| err(path, e))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn small_write(dir: &Path, files: u64, threads: usize) -> Result<f64, String> {
    let data = vec![0x5au8; 4096];
    for t in 0..threads {
        let own = dir.join(format!("small-{threads}-{t}"));
        std::fs::create_dir_all(&own).map_err(|e| err(&own, e))?;
    }
    parallel(threads, |t| {
        let own = dir.join(format!("small-{threads}-{t}"));
        let mut i = t as u64;
        while i < files {
            let path = own.join(format!("f{i:08}"));
            let mut file = std::fs::File::create(&path).map_err(|e| err(&path, e))?;
            file.write_all(&data).map_err(|e| err(&path, e))?;
            drop(file);
            i += threads as u64;
        }
        Ok(())
    })
}

fn small_read(dir: &Path, files: u64, threads: usize) -> Result<f64, String> {
    parallel(threads, |t| {
        let own = dir.join(format!("small-{threads}-{t}"));
        let mut buf = Vec::with_capacity(8192);
        let mut i = t as u64;
        while i < files {
            let path = own.join(format!("f{i:08}"));
            buf.clear();
            std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut buf))
                .map_err(|e| err(&path, e))?;
            if buf.len() != 4096 {
                return Err(format!("{}: {} bytes", path.display(), buf.len()));
            }
            i += threads as u64;
        }
        Ok(())
    })
}

/// Two workers on each of `dirs` (two mounts of one file system, or the same directory
/// twice), each adding one to a random record under an fcntl write lock, `per_worker` times.
/// Returns the seconds taken and how many increments the records miss at the end.
fn locked_increment(dirs: [&Path; 2], per_worker: u64) -> Result<(f64, u64), String> {
    let path = dirs[0].join("counters");
    std::fs::write(&path, vec![0u8; (RECORDS * 8) as usize]).map_err(|e| err(&path, e))?;
    let seconds = parallel(4, |w| {
        let path = dirs[w / 2].join("counters");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| err(&path, e))?;
        let mut x = 0x2545_F491_4F6C_DD1Du64 + w as u64;
        for _ in 0..per_worker {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % RECORDS) * 8;
            lock(&file, libc::F_WRLCK, at).map_err(|e| err(&path, e))?;
            let mut value = [0u8; 8];
            file.read_exact_at(&mut value, at)
                .map_err(|e| err(&path, e))?;
            let value = u64::from_le_bytes(value) + 1;
            file.write_all_at(&value.to_le_bytes(), at)
                .map_err(|e| err(&path, e))?;
            lock(&file, libc::F_UNLCK, at).map_err(|e| err(&path, e))?;
        }
        Ok(())
    })?;
    let data = std::fs::read(&path).map_err(|e| err(&path, e))?;
    let total: u64 = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .sum();
    Ok((seconds, (4 * per_worker).saturating_sub(total)))
}

/// An open-file-description lock (the workers are threads of one process, which POSIX record
/// locks would not tell apart; each worker opens the file itself).
fn lock(file: &std::fs::File, kind: i32, at: u64) -> std::io::Result<()> {
    // SAFETY: all zeros is a valid struct flock (l_pid 0, as OFD locks require).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = at as i64;
    lock.l_len = 8;
    // SAFETY: fcntl(2) F_OFD_SETLKW on an open descriptor with a valid struct flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &lock) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Every case on one file system: `dirs` are its two views (two mounts, or one directory).
fn cases(
    fs: &str,
    dirs: [&Path; 2],
    options: &DataBenchOptions,
    cold: bool,
    results: &mut Vec<DataResult>,
) -> Result<(), String> {
    let dir = dirs[0];
    let mut push = |case, threads, seconds: f64, bytes: Option<u64>, ops: Option<u64>| {
        results.push(DataResult {
            fs: fs.to_string(),
            case,
            threads,
            mb_per_sec: bytes.map(|b| b as f64 / 1e6 / seconds.max(1e-9)),
            ops_per_sec: ops.map(|o| o as f64 / seconds.max(1e-9)),
            seconds,
            lost: None,
        });
    };
    let drop = || {
        if cold {
            crate::drop_caches();
        }
    };
    for &streams in &options.streams {
        let seconds = seq_write(dir, options.seq_bytes, streams)?;
        push("seq-write", streams, seconds, Some(options.seq_bytes), None);
        drop();
        let seconds = seq_read(dir, options.seq_bytes, streams)?;
        push("seq-read", streams, seconds, Some(options.seq_bytes), None);
        for i in 0..streams {
            let path = dir.join(format!("seq-{i}"));
            std::fs::remove_file(&path).map_err(|e| err(&path, e))?;
        }
    }
    let rand = dir.join("rand");
    {
        let buf = pattern();
        let mut file = std::fs::File::create(&rand).map_err(|e| err(&rand, e))?;
        for _ in 0..options.rand_file_bytes / MIB as u64 {
            file.write_all(&buf).map_err(|e| err(&rand, e))?;
        }
        file.sync_all().map_err(|e| err(&rand, e))?;
    }
    drop();
    let seconds = rand_reads(&rand, options.rand_file_bytes, options.rand_reads, 7)?;
    push("rand-read-cold", 1, seconds, None, Some(options.rand_reads));
    let seconds = rand_reads(&rand, options.rand_file_bytes, options.rand_reads, 7)?;
    push("rand-read-warm", 1, seconds, None, Some(options.rand_reads));
    std::fs::remove_file(&rand).map_err(|e| err(&rand, e))?;
    for &threads in &options.threads {
        let seconds = small_write(dir, options.files, threads)?;
        push("small-write", threads, seconds, None, Some(options.files));
        drop();
        let seconds = small_read(dir, options.files, threads)?;
        push("small-read", threads, seconds, None, Some(options.files));
    }
    let (seconds, lost) = locked_increment(dirs, options.increments)?;
    push(
        "locked-increment",
        4,
        seconds,
        None,
        Some(4 * options.increments),
    );
    results.last_mut().expect("just pushed").lost = Some(lost);
    Ok(())
}

/// A server in this process on a fresh store whose contents go to `objects`, and two mounts
/// of it: the first embedded (calls the server in-process), the second over gRPC.
struct Calm {
    work: tempfile::TempDir,
    mounts: Vec<PathBuf>,
    mounted: Vec<calm_fuse::Mounted>,
    server: Option<crate::mdtest::InProcessServer>,
}

impl Calm {
    fn start(
        runtime: &tokio::runtime::Runtime,
        dir: &Path,
        objects: Option<&str>,
        inline_bytes_max: u64,
    ) -> Result<Calm, String> {
        let (work, meta) = crate::mdtest::open_meta_objects(dir, objects)?;
        let mounts: Vec<PathBuf> = (0..2)
            .map(|i| work.path().join(format!("mnt{i}")))
            .collect();
        for m in &mounts {
            std::fs::create_dir(m).map_err(|e| err(m, e))?;
        }
        let options = calm_fuse::MountOptions {
            inline_bytes_max,
            ..Default::default()
        };
        let (server, mounted) = runtime.block_on(async {
            // The deleter and the compactor run, as under `calm serve` (with its defaults):
            // without compaction, many small overwrites of one file would be refused as busy.
            let url = meta
                .objects_url()
                .map_err(|e| e.to_string())?
                .ok_or("the namespace has no object store")?;
            let data = calm_upkeep::data::DataOptions {
                objects: calm_data::Objects::open(&url).map_err(|e| e.to_string())?,
                delete_delay: std::time::Duration::from_secs(60),
                orphan_claim_grace: calm_server::orphans::CLAIM_GRACE_DEFAULT,
            };
            let server =
                crate::mdtest::InProcessServer::start_with_data(Arc::clone(&meta), Some(data))
                    .await?;
            let mut mounted = Vec::new();
            for (i, m) in mounts.iter().enumerate() {
                let mut client = calm_client::Client::connect(&server.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                // The first mount is embedded (its server in its process, as `calm mount
                // --embedded` and `scripts/run`), the second a remote one (over gRPC).
                if i == 0 {
                    client = client.in_process(server.local.clone());
                }
                mounted.push(
                    calm_fuse::mount(client, m, &options, tokio::runtime::Handle::current())
                        .await
                        .map_err(|e| err(m, e))?,
                );
            }
            Ok::<_, String>((server, mounted))
        })?;
        Ok(Calm {
            work,
            mounts,
            mounted,
            server: Some(server),
        })
    }

    /// Unmounts and stops the server; returns the work directory (store and objects), for
    /// the caller to remove when it suits (see [`run`]).
    fn stop(mut self, runtime: &tokio::runtime::Runtime) -> Result<tempfile::TempDir, String> {
        let mounted = std::mem::take(&mut self.mounted);
        let server = self.server.take();
        runtime.block_on(async {
            for m in mounted {
                m.unmount().await.map_err(|e| e.to_string())?;
            }
            if let Some(server) = server {
                server.stop().await?;
            }
            Ok::<(), String>(())
        })?;
        Ok(self.work)
    }
}

/// Runs the whole benchmark. Each file system's files are removed only at the end of the run:
/// on an ext4 without a journal (this machine's disk), creating a file skips every inode freed
/// in the last minutes by a linear search (`recently_deleted`), so removing one file system's
/// 20 000 small files would slow the creates of the next one measured on the same disk.
pub fn run(options: &DataBenchOptions) -> Result<DataReport, String> {
    if options.seq_bytes < MIB as u64
        || options.rand_file_bytes < MIB as u64
        || options.streams.contains(&0)
        || options.threads.contains(&0)
    {
        return Err("sizes of at least 1 MiB and positive thread counts, please".into());
    }
    let private_namespace = crate::enter_private_namespace();
    let cold = crate::drop_caches();
    let runtime = crate::runtime()?;
    let mut results = Vec::new();

    let ext4 = tempfile::Builder::new()
        .prefix("calm-bench-data-")
        .tempdir_in(&options.dir)
        .map_err(|e| err(&options.dir, e))?;
    cases(
        "ext4",
        [ext4.path(), ext4.path()],
        options,
        cold,
        &mut results,
    )?;
    let mut leftovers = vec![ext4];
    let tmpfs = tempfile::Builder::new()
        .prefix("calm-bench-data-")
        .tempdir_in(&options.tmpfs_dir)
        .map_err(|e| err(&options.tmpfs_dir, e))?;
    cases(
        "tmpfs",
        [tmpfs.path(), tmpfs.path()],
        options,
        cold,
        &mut results,
    )?;
    leftovers.push(tmpfs);

    let mut stores: Vec<(&'static str, Option<&str>)> = vec![("calm-file", None)];
    if let Some(s3) = &options.s3 {
        stores.push(("calm-s3", Some(s3.as_str())));
    }
    for other in &options.others {
        // A directory of this run's own on the other file system, seen through both views.
        let work = tempfile::Builder::new()
            .prefix("calm-bench-data-")
            .tempdir_in(&other.views[0])
            .map_err(|e| err(&other.views[0], e))?;
        let name = work.path().file_name().expect("a tempdir has a name");
        let second = other.views[1].join(name);
        if !second.is_dir() {
            return Err(format!(
                "{}: not found; {} and {} must be views of one file system",
                second.display(),
                other.views[0].display(),
                other.views[1].display()
            ));
        }
        cases(
            &other.name,
            [work.path(), &second],
            options,
            cold,
            &mut results,
        )?;
        leftovers.push(work);
    }
    for (fs, objects) in stores {
        let calm = Calm::start(&runtime, &options.dir, objects, options.inline_bytes_max)?;
        let measured = cases(
            fs,
            [&calm.mounts[0], &calm.mounts[1]],
            options,
            cold,
            &mut results,
        );
        let stopped = calm.stop(&runtime);
        measured?;
        leftovers.push(stopped?);
    }
    drop(leftovers);
    Ok(DataReport {
        bench: "data",
        results,
        cold_cache: cold,
        private_namespace,
    })
}

/// The table `calm-bench data` prints: each calm figure beside the same case on ext4.
pub fn table(report: &DataReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>10} {:>17} {:>7} {:>12} {:>10} {:>9}  {}",
        "fs", "case", "threads", "rate", "unit", "÷ ext4", "exact"
    )];
    let rate = |r: &DataResult| r.mb_per_sec.or(r.ops_per_sec).unwrap_or(0.0);
    for r in &report.results {
        let base = report
            .results
            .iter()
            .find(|b| b.fs == "ext4" && b.case == r.case && b.threads == r.threads)
            .map(rate);
        lines.push(format!(
            "{:>10} {:>17} {:>7} {:>12.1} {:>10} {:>9}  {}",
            r.fs,
            r.case,
            r.threads,
            rate(r),
            if r.mb_per_sec.is_some() {
                "MB/s"
            } else {
                "ops/s"
            },
            base.map_or("-".to_string(), |b| format!("{:.3}", rate(r) / b.max(1e-9))),
            match r.lost {
                None => String::new(),
                Some(0) => "yes".to_string(),
                Some(lost) => format!("NO: {lost} increments lost"),
            }
        ));
    }
    lines.push(format!(
        "page cache {} before the cold cases; {}",
        if report.cold_cache {
            "dropped"
        } else {
            "NOT dropped (not root?)"
        },
        if report.private_namespace {
            "mounted in a private mount namespace"
        } else {
            "mounted in this namespace"
        }
    ));
    lines
}

/// One panel per case, its rate over threads, one line per file system (`--plot`).
pub fn facets(report: &DataReport) -> Vec<crate::multiples::Facet> {
    crate::multiples::facets_of(report.results.iter().map(|r| {
        let (y, unit) = match (r.mb_per_sec, r.ops_per_sec) {
            (Some(mb), _) => (mb, "MB/s"),
            (None, ops) if r.case.starts_with("small") => (ops.unwrap_or(0.0), "files/s"),
            (None, ops) => (ops.unwrap_or(0.0), "operations/s"),
        };
        crate::multiples::Cell::at(
            r.case.to_string(),
            ("threads (streams)", r.threads as f64),
            (unit, y),
            r.fs.clone(),
        )
        .log()
    }))
}
