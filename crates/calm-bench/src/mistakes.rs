//! `calm-bench protect`, through a mount (a server in this process, a FUSE mount of it, as
//! `calm mount --embedded` runs): a clone of a tree of N files (`calm clone`'s requests)
//! against `cp -r` of the same tree on the same mount, each checked to be a copy; and the rate
//! of unlinks through the mount with the trash kept against without one, in alternating
//! rounds on fresh namespaces.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_meta::Meta;
use calm_store::lmdb::LmdbStore;
use serde::Serialize;

use crate::mdtest::InProcessServer;

/// Files per directory of the trees.
const FILES_PER_DIR: u64 = 1000;

#[derive(Debug, Clone, Serialize)]
pub struct CloneResult {
    pub files: u64,
    pub file_bytes: u64,
    /// The files' bytes were kept in the metadata (inline), not in objects.
    pub inline: bool,
    /// Making the tree through the mount (`threads` writers).
    pub populate_s: f64,
    /// `cp -r` of the tree on the same mount (the baseline).
    pub cp_s: f64,
    pub cp_files_per_s: f64,
    /// `calm clone` of the tree (its requests, from a client of the server).
    pub clone_s: f64,
    pub clone_files_per_s: f64,
    pub clone_requests: u64,
    /// `cp -r` time over the clone's.
    pub speedup: f64,
    /// Both copies hold every file with the source's size, and the sampled files its bytes.
    pub copies_equal: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrashRound {
    pub trash: bool,
    pub unlinks_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrashResult {
    pub files: u64,
    pub threads: usize,
    pub rounds: Vec<TrashRound>,
    /// The best round of each (the machine is shared: the best is the least disturbed).
    pub off_per_s: f64,
    pub on_per_s: f64,
    /// On over off.
    pub ratio: f64,
}

struct Mounted {
    runtime: tokio::runtime::Runtime,
    _work: tempfile::TempDir,
    meta: Arc<Meta<LmdbStore>>,
    server: InProcessServer,
    mounted: calm_fuse::Mounted,
    point: PathBuf,
}

/// A namespace in `dir` mounted; `inline`: small files' bytes kept in the metadata (else every
/// file's bytes are an object).
fn mount(dir: &Path, trash_kept: Duration, inline: bool) -> Result<Mounted, String> {
    let runtime = crate::runtime()?;
    let (work, meta) = crate::mdtest::open_meta_trash(dir, trash_kept)?;
    let point = work.path().join("mnt");
    std::fs::create_dir(&point).map_err(|e| e.to_string())?;
    let options = calm_fuse::MountOptions {
        ttl: Duration::from_secs(1),
        inline_bytes_max: if inline {
            calm_meta::slices::INLINE_WRITE_BYTES_MAX
        } else {
            0
        },
        ..Default::default()
    };
    let (server, mounted) = runtime.block_on(async {
        let server = InProcessServer::start(Arc::clone(&meta)).await?;
        let client = calm_client::Client::connect(&server.addr)
            .await
            .map_err(|e| e.to_string())?
            .in_process(server.local.clone());
        let mounted = calm_fuse::mount(client, &point, &options, tokio::runtime::Handle::current())
            .await
            .map_err(|e| format!("mounting at {}: {e}", point.display()))?;
        Ok::<_, String>((server, mounted))
    })?;
    Ok(Mounted {
        runtime,
        _work: work,
        meta,
        server,
        mounted,
        point,
    })
}

/// Unmounts, stops the server, then its runtime (and the tasks still holding the namespace),
/// then closes the namespace before its directory goes.
fn unmount(m: Mounted) -> Result<(), String> {
    let Mounted {
        runtime,
        _work,
        meta,
        server,
        mounted,
        ..
    } = m;
    let ended = runtime.block_on(async {
        let unmounted = mounted.unmount().await.map_err(|e| e.to_string());
        unmounted.and(server.stop().await)
    });
    drop(runtime);
    drop(meta);
    ended
}

/// The bytes of file `i`: `bytes` long, different for every file.
fn contents(i: u64, bytes: u64) -> Vec<u8> {
    let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn file_path(top: &Path, i: u64) -> PathBuf {
    top.join(format!("d{}", i / FILES_PER_DIR))
        .join(format!("f{i}"))
}

/// Runs `each(i)` for `i` in `0..n` on `threads` threads.
fn spread(
    n: u64,
    threads: usize,
    each: &(dyn Fn(u64) -> Result<(), String> + Sync),
) -> Result<(), String> {
    let threads = threads.max(1) as u64;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || (t..n).step_by(threads as usize).try_for_each(each)))
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "a worker panicked".to_string())?)
    })
}

fn make_tree(top: &Path, files: u64, bytes: u64, threads: usize) -> Result<(), String> {
    for d in 0..files.div_ceil(FILES_PER_DIR) {
        std::fs::create_dir_all(top.join(format!("d{d}"))).map_err(|e| e.to_string())?;
    }
    spread(files, threads, &|i| {
        std::fs::write(file_path(top, i), contents(i, bytes)).map_err(|e| e.to_string())
    })
}

/// Every file of the copy has the source's size, and every 97th its bytes.
fn same_tree(copy: &Path, files: u64, bytes: u64) -> Result<bool, String> {
    for i in 0..files {
        let path = file_path(copy, i);
        let len = std::fs::metadata(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len != bytes {
            return Ok(false);
        }
        if i % 97 == 0 && std::fs::read(&path).map_err(|e| e.to_string())? != contents(i, bytes) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A clone against `cp -r` of a tree of each count of files, on one mount.
pub fn clones(
    dir: &Path,
    counts: &[u64],
    file_bytes: u64,
    threads: usize,
    inline: bool,
) -> Result<Vec<CloneResult>, String> {
    let mut results = Vec::new();
    for &files in counts {
        let m = mount(dir, Duration::ZERO, inline)?;
        let measured = (|| {
            let src = m.point.join("src");
            let started = Instant::now();
            make_tree(&src, files, file_bytes, threads)?;
            let populate_s = started.elapsed().as_secs_f64();

            let copy = m.point.join("cp");
            let started = Instant::now();
            let status = std::process::Command::new("cp")
                .arg("-r")
                .arg(&src)
                .arg(&copy)
                .status()
                .map_err(|e| format!("cp: {e}"))?;
            let cp_s = started.elapsed().as_secs_f64();
            if !status.success() {
                return Err(format!("cp -r failed: {status}"));
            }

            let src_handle = std::fs::metadata(&src).map_err(|e| e.to_string())?.ino();
            let root = std::fs::metadata(&m.point)
                .map_err(|e| e.to_string())?
                .ino();
            let started = Instant::now();
            let cloned = m.runtime.block_on(async {
                let client = calm_client::Client::connect(&m.server.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                calm_client::clone::clone_tree(&client, src_handle, root, b"clone")
                    .await
                    .map_err(|e| format!("clone: {e}"))
            })?;
            let clone_s = started.elapsed().as_secs_f64();
            let copies_equal = same_tree(&copy, files, file_bytes)?
                && same_tree(&m.point.join("clone"), files, file_bytes)?;
            Ok(CloneResult {
                files,
                file_bytes,
                inline,
                populate_s,
                cp_s,
                cp_files_per_s: files as f64 / cp_s.max(1e-9),
                clone_s,
                clone_files_per_s: files as f64 / clone_s.max(1e-9),
                clone_requests: cloned.requests,
                speedup: cp_s / clone_s.max(1e-9),
                copies_equal,
            })
        })();
        let ended = unmount(m);
        results.push(measured?);
        ended?;
    }
    Ok(results)
}

/// Unlinks per second through a mount with the trash kept and without, `rounds` times each,
/// alternating, each round on a fresh namespace of `files` empty files.
pub fn trash_cost(
    dir: &Path,
    files: u64,
    threads: usize,
    rounds: usize,
) -> Result<TrashResult, String> {
    let mut measured = Vec::new();
    for round in 0..rounds.max(1) * 2 {
        let trash = round % 2 == 1;
        let kept = if trash {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::ZERO
        };
        let m = mount(dir, kept, true)?;
        let result = (|| {
            make_tree(&m.point, files, 0, threads)?;
            let started = Instant::now();
            spread(files, threads, &|i| {
                std::fs::remove_file(file_path(&m.point, i)).map_err(|e| e.to_string())
            })?;
            let per_s = files as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let status = m.meta.status().map_err(|e| e.to_string())?;
            let expected = if trash { files } else { 0 };
            if status.trash_entries != expected {
                return Err(format!(
                    "{} entries in the trash after {files} unlinks, expected {expected}",
                    status.trash_entries
                ));
            }
            Ok(per_s)
        })();
        let ended = unmount(m);
        measured.push(TrashRound {
            trash,
            unlinks_per_s: result?,
        });
        ended?;
    }
    let best = |on: bool| {
        measured
            .iter()
            .filter(|r| r.trash == on)
            .map(|r| r.unlinks_per_s)
            .fold(0.0, f64::max)
    };
    let (off_per_s, on_per_s) = (best(false), best(true));
    Ok(TrashResult {
        files,
        threads,
        rounds: measured,
        off_per_s,
        on_per_s,
        ratio: on_per_s / off_per_s.max(1e-9),
    })
}

/// The two sections as table lines.
pub fn table(clones: &[CloneResult], trash: Option<&TrashResult>) -> Vec<String> {
    let mut out = Vec::new();
    if !clones.is_empty() {
        out.push(format!(
            "{:>9} {:>9} {:>10} {:>11} {:>10} {:>11} {:>9} {:>8} {:>6}",
            "files",
            "bytes",
            "cp -r s",
            "cp files/s",
            "clone s",
            "clone f/s",
            "requests",
            "speedup",
            "equal"
        ));
        for r in clones {
            out.push(format!(
                "{:>9} {:>9} {:>10.2} {:>11.0} {:>10.3} {:>11.0} {:>9} {:>7.0}x {:>6}",
                r.files,
                r.file_bytes,
                r.cp_s,
                r.cp_files_per_s,
                r.clone_s,
                r.clone_files_per_s,
                r.clone_requests,
                r.speedup,
                r.copies_equal
            ));
        }
    }
    if let Some(t) = trash {
        out.push(format!(
            "unlinks through the mount, {} files, {} threads: {:.0}/s without a trash, {:.0}/s \
             with one ({:.2}x); rounds: {}",
            t.files,
            t.threads,
            t.off_per_s,
            t.on_per_s,
            t.ratio,
            t.rounds
                .iter()
                .map(|r| format!(
                    "{} {:.0}",
                    if r.trash { "on" } else { "off" },
                    r.unlinks_per_s
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}
