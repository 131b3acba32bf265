//! Seed 001 (Lustre flock, LU-17276): N non-overlapping write locks on one resource, in
//! ascending and random order, the split case, and the per-operation time of a conflict test,
//! for calm's lock manager and, in the same run, two baselines:
//! - `naive-list`: one list per resource, scanned by every request (Lustre before LU-17276,
//!   and Linux's own `i_flctx` list);
//! - `kernel-fcntl`: the kernel itself, OFD locks (`F_OFD_SETLK`) on a file in a tmpfs, one open
//!   file description per owner.
//!
//! Locks are one byte long and two bytes apart (never adjacent, so never merged), taken by 1000
//! owners in turn. The split case takes one write lock over everything, then N one-byte read
//! locks inside it by the same owner, each splitting it. Each (implementation, case) run is
//! capped in time; a run that hits the cap is reported as stopped with the count it reached,
//! and larger sizes of that pair are not started.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use calm_locks::{LockKind, Range, RangeLocks};
use serde::Serialize;

/// Owners taking turns in the ascending and random cases.
pub const OWNERS: u64 = 1000;
/// Conflict tests timed per size (fewer when N is smaller).
pub const GETLK_OPS_MAX: u64 = 100_000;

#[derive(Debug, Clone)]
pub struct LocksOptions {
    pub sizes: Vec<u64>,
    /// Longest a baseline may run for one size, in seconds.
    pub cap_seconds: f64,
    /// Where the kernel baseline's file is made (a tmpfs).
    pub tmpfs_dir: PathBuf,
    /// Where the gRPC run's store is made.
    pub store_dir: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct LocksResult {
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub case: &'static str,
    pub n: u64,
    /// Wall time of the run; for `getlk`, per operation.
    pub seconds: f64,
    /// Operations completed (N unless stopped).
    pub completed: u64,
    pub stopped: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LocksReport {
    pub bench: &'static str,
    /// Heap bytes per lock held by calm's manager at the largest size (None when the counting
    /// allocator is not installed).
    pub bytes_per_lock: Option<f64>,
    /// Lock operations per second over gRPC on one file, in batches of `grpc.batch_ops`.
    pub grpc_ops_per_sec: f64,
    pub grpc: GrpcFigures,
    pub results: Vec<LocksResult>,
}

/// What the cases need from an implementation.
trait Manager {
    const NAME: &'static str;
    fn set(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool;
    /// Whether a request would conflict (and the conflicting lock is found).
    fn conflicts(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool;
}

struct Calm(RangeLocks);

impl Manager for Calm {
    const NAME: &'static str = "calm";
    fn set(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        self.0.set(owner, Range { start, end }, kind).is_ok()
    }
    fn conflicts(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        self.0.test(owner, Range { start, end }, kind).is_some()
    }
}

/// The baseline: one list, every request scans all of it.
#[derive(Default)]
struct NaiveList(Vec<(u64, u64, u64, LockKind)>);

impl Manager for NaiveList {
    const NAME: &'static str = "naive-list";
    fn set(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        if self.conflicts(owner, start, end, kind) {
            return false;
        }
        let (mut lo, mut hi) = (start, end);
        let mut kept = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            let (o, s, e, k) = self.0[i];
            let touches = o == owner && s <= end.saturating_add(1) && start <= e.saturating_add(1);
            if !touches {
                i += 1;
                continue;
            }
            let overlaps = s <= end && start <= e;
            if k == kind {
                lo = lo.min(s);
                hi = hi.max(e);
            } else if overlaps {
                if s < start {
                    kept.push((o, s, start - 1, k));
                }
                if e > end {
                    kept.push((o, end + 1, e, k));
                }
            } else {
                i += 1;
                continue;
            }
            self.0.swap_remove(i);
        }
        self.0.extend(kept);
        self.0.push((owner, lo, hi, kind));
        true
    }
    fn conflicts(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        self.0.iter().any(|&(o, s, e, k)| {
            o != owner
                && s <= end
                && start <= e
                && (k == LockKind::Write || kind == LockKind::Write)
        })
    }
}

/// The kernel's OFD locks on one tmpfs file, one open file description per owner.
struct Kernel {
    fds: Vec<OwnedFd>,
    _dir: tempfile::TempDir,
}

impl Kernel {
    fn open(dir: &std::path::Path) -> Result<Kernel, String> {
        let work = tempfile::Builder::new()
            .prefix("calm-bench-locks-")
            .tempdir_in(dir)
            .map_err(|e| format!("making a directory in {}: {e}", dir.display()))?;
        let path = work.path().join("file");
        let mut fds = Vec::new();
        for _ in 0..=OWNERS {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| e.to_string())?;
            fds.push(OwnedFd::from(file));
        }
        Ok(Kernel { fds, _dir: work })
    }

    /// One fcntl call with an OFD command: (return code, the flock as the kernel left it).
    fn fcntl(
        &self,
        owner: u64,
        cmd: i32,
        start: u64,
        end: u64,
        kind: LockKind,
    ) -> (i32, libc::flock) {
        // SAFETY: an all-zero flock is a valid value of a plain C struct.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = match kind {
            LockKind::Read => libc::F_RDLCK as i16,
            LockKind::Write => libc::F_WRLCK as i16,
        };
        lock.l_whence = libc::SEEK_SET as i16;
        lock.l_start = start as i64;
        lock.l_len = (end - start + 1) as i64;
        let fd = self.fds[(owner % self.fds.len() as u64) as usize].as_raw_fd();
        // SAFETY: `fd` is open for the life of `self`; `lock` is a valid flock for OFD commands.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut lock as *mut libc::flock) };
        (rc, lock)
    }
}

impl Manager for Kernel {
    const NAME: &'static str = "kernel-fcntl";
    fn set(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        self.fcntl(owner, libc::F_OFD_SETLK, start, end, kind).0 == 0
    }
    fn conflicts(&mut self, owner: u64, start: u64, end: u64, kind: LockKind) -> bool {
        let (rc, lock) = self.fcntl(owner, libc::F_OFD_GETLK, start, end, kind);
        rc == 0 && lock.l_type != libc::F_UNLCK as i16
    }
}

/// A fixed permutation of 0..n (xorshift Fisher–Yates), the same for every implementation.
fn shuffled(n: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// Runs `step(i)` for each i of `order` until done or past the cap: (seconds, completed).
fn capped(
    order: impl Iterator<Item = u64>,
    cap_seconds: f64,
    mut step: impl FnMut(u64) -> Result<(), String>,
) -> Result<(f64, u64, bool), String> {
    let started = Instant::now();
    let mut done = 0u64;
    for i in order {
        step(i)?;
        done += 1;
        if done.is_multiple_of(256) && started.elapsed().as_secs_f64() > cap_seconds {
            return Ok((started.elapsed().as_secs_f64(), done, true));
        }
    }
    Ok((started.elapsed().as_secs_f64(), done, false))
}

fn granted(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: a lock that cannot conflict was refused"))
    }
}

/// One size of one case on a fresh manager.
fn run_case<M: Manager>(
    fresh: &dyn Fn() -> Result<M, String>,
    case: &'static str,
    n: u64,
    cap: f64,
) -> Result<LocksResult, String> {
    let mut m = fresh()?;
    let (seconds, completed, stopped) = match case {
        "ascending" => capped(0..n, cap, |i| {
            granted(m.set(i % OWNERS, 2 * i, 2 * i, LockKind::Write), M::NAME)
        })?,
        "random" => capped(shuffled(n).into_iter(), cap, |i| {
            granted(m.set(i % OWNERS, 2 * i, 2 * i, LockKind::Write), M::NAME)
        })?,
        "split" => {
            // One big write lock, then N locks of the other type inside it: every one splits
            // the owner's write lock in two.
            granted(m.set(0, 0, 2 * n + 1, LockKind::Write), M::NAME)?;
            capped(0..n, cap, |i| {
                granted(m.set(0, 2 * i + 1, 2 * i + 1, LockKind::Read), M::NAME)
            })?
        }
        "getlk" => {
            let (_, placed, stopped) = capped(0..n, cap, |i| {
                granted(m.set(i % OWNERS, 2 * i, 2 * i, LockKind::Write), M::NAME)
            })?;
            if stopped {
                (0.0, placed, true)
            } else {
                let ops = n.min(GETLK_OPS_MAX);
                let order = shuffled(n);
                let (seconds, done, stopped) =
                    capped(order.into_iter().take(ops as usize), cap, |i| {
                        // Another owner asks for a read lock on a write-locked byte: a conflict.
                        granted(
                            m.conflicts(OWNERS, 2 * i, 2 * i, LockKind::Read),
                            "conflict test found no conflict",
                        )
                    })?;
                (seconds / done.max(1) as f64, done, stopped)
            }
        }
        other => return Err(format!("unknown case {other}")),
    };
    Ok(LocksResult {
        implementation: M::NAME,
        case,
        n,
        seconds,
        completed,
        stopped,
    })
}

fn run_impl<M: Manager>(
    fresh: &dyn Fn() -> Result<M, String>,
    options: &LocksOptions,
    results: &mut Vec<LocksResult>,
) -> Result<(), String> {
    for case in ["ascending", "random", "split", "getlk"] {
        for &n in &options.sizes {
            let result = run_case(fresh, case, n, options.cap_seconds)?;
            let stopped = result.stopped;
            results.push(result);
            if stopped {
                break; // a larger size would only hit the cap again
            }
        }
    }
    Ok(())
}

/// Runs every implementation, case and size.
pub fn run(options: &LocksOptions) -> Result<LocksReport, String> {
    if options.sizes.contains(&0) {
        return Err("--sizes values must be positive".into());
    }
    let mut results = Vec::new();
    run_impl(&|| Ok(Calm(RangeLocks::new())), options, &mut results)?;
    run_impl(&|| Ok(NaiveList::default()), options, &mut results)?;
    run_impl(&|| Kernel::open(&options.tmpfs_dir), options, &mut results)?;

    let grpc = grpc_run(&options.store_dir)?;

    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    let before = crate::heap::heap_bytes_in_use() as i64;
    let mut locks = RangeLocks::new();
    for i in 0..largest {
        locks
            .set(
                i % OWNERS,
                Range {
                    start: 2 * i,
                    end: 2 * i,
                },
                LockKind::Write,
            )
            .map_err(|c| format!("refused: {c:?}"))?;
    }
    let grown = crate::heap::heap_bytes_in_use() as i64 - before;
    let bytes_per_lock = (grown > 0).then(|| grown as f64 / largest as f64);
    drop(locks);
    Ok(LocksReport {
        bench: "locks",
        bytes_per_lock,
        grpc_ops_per_sec: grpc.batched_ops_per_sec,
        grpc,
        results,
    })
}

/// Concurrent clients (one connection and one session each) in the gRPC run.
pub const GRPC_CLIENTS: u64 = 4;
/// Operations per batch in the batched part of the gRPC run.
pub const GRPC_BATCH_OPS: u64 = 512;
/// Batches each client sends in the batched part.
pub const GRPC_BATCHES: u64 = 400;
/// Single-operation requests each client sends in the unbatched part.
pub const GRPC_SINGLE_OPS: u64 = 8_000;
/// Requests each client keeps in flight in the unbatched part.
pub const GRPC_IN_FLIGHT: u64 = 16;

/// The gRPC part: every client sets one-byte write locks of its own (no conflicts, all on one
/// file), first in batches (one batch in flight per client), then one operation per request
/// (`in_flight` requests in flight per client).
#[derive(Debug, Clone, Serialize)]
pub struct GrpcFigures {
    pub clients: u64,
    pub batch_ops: u64,
    /// Single-operation requests in flight per client in the unbatched part.
    pub in_flight: u64,
    pub batched_ops: u64,
    pub batched_seconds: f64,
    pub batched_ops_per_sec: f64,
    pub unbatched_ops: u64,
    pub unbatched_seconds: f64,
    pub unbatched_ops_per_sec: f64,
}

fn grpc_run(store_dir: &std::path::Path) -> Result<GrpcFigures, String> {
    let runtime = crate::runtime()?;
    runtime.block_on(grpc_async(store_dir))
}

async fn grpc_async(store_dir: &std::path::Path) -> Result<GrpcFigures, String> {
    use calm_locks::{Owner, Request, Scope};
    use calm_proto::locks::LockCall;

    let (_work, meta) = crate::mdtest::open_meta(store_dir)?;
    let server = crate::mdtest::InProcessServer::start(meta.clone()).await?;
    let addr = server.addr.clone();
    let mut clients = Vec::new();
    for _ in 0..GRPC_CLIENTS {
        let client = calm_client::Client::connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        let session = client
            .open_lock_session(60_000)
            .await
            .map_err(|e| e.to_string())?;
        clients.push((client, session));
    }
    let file = clients[0]
        .0
        .create(calm_meta::ROOT, b"hot", 0o644)
        .await
        .map_err(|e| e.to_string())?
        .handle;
    let set = move |c: u64, i: u64| {
        LockCall::Set(Request {
            resource: file,
            owner: Owner::Process { pid: c as u32 + 1 },
            scope: Scope::Range(Range {
                start: (c << 40) + 2 * i,
                end: (c << 40) + 2 * i,
            }),
            kind: LockKind::Write,
        })
    };
    let check = |answers: Vec<calm_proto::locks::LockAnswer>| -> Result<(), String> {
        match answers.iter().find(|a| !a.is_ok()) {
            Some(refused) => Err(format!("a lock was refused: {refused:?}")),
            None => Ok(()),
        }
    };

    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, (client, session)) in clients.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            for b in 0..GRPC_BATCHES {
                let calls: Vec<LockCall> = (0..GRPC_BATCH_OPS)
                    .map(|i| set(c as u64, b * GRPC_BATCH_OPS + i))
                    .collect();
                let answers = client
                    .lock_batch(session, &calls)
                    .await
                    .map_err(|e| e.to_string())?;
                check(answers)?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let batched_seconds = started.elapsed().as_secs_f64();
    let batched_ops = GRPC_CLIENTS * GRPC_BATCHES * GRPC_BATCH_OPS;

    let started = Instant::now();
    let mut tasks = Vec::new();
    let offset = GRPC_BATCHES * GRPC_BATCH_OPS;
    for (c, (client, session)) in clients.iter().cloned().enumerate() {
        for lane in 0..GRPC_IN_FLIGHT {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                for i in (lane..GRPC_SINGLE_OPS).step_by(GRPC_IN_FLIGHT as usize) {
                    let answers = client
                        .lock_batch(session, &[set(c as u64, offset + i)])
                        .await
                        .map_err(|e| e.to_string())?;
                    check(answers)?;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let unbatched_seconds = started.elapsed().as_secs_f64();
    let unbatched_ops = GRPC_CLIENTS * GRPC_SINGLE_OPS;

    // Every lock is there: the server did the work it acknowledged.
    let listing = clients[0]
        .0
        .list_locks(file)
        .await
        .map_err(|e| e.to_string())?;
    if listing.total != batched_ops + unbatched_ops {
        return Err(format!(
            "{} locks held after {} acknowledged sets",
            listing.total,
            batched_ops + unbatched_ops
        ));
    }
    drop(clients);
    server.stop().await?;
    Ok(GrpcFigures {
        clients: GRPC_CLIENTS,
        batch_ops: GRPC_BATCH_OPS,
        in_flight: GRPC_IN_FLIGHT,
        batched_ops,
        batched_seconds,
        batched_ops_per_sec: batched_ops as f64 / batched_seconds,
        unbatched_ops,
        unbatched_seconds,
        unbatched_ops_per_sec: unbatched_ops as f64 / unbatched_seconds,
    })
}

/// The report as a table for a terminal.
pub fn table(report: &LocksReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>13} {:>10} {:>9} {:>14} {:>10} {:>8}",
        "impl", "case", "n", "seconds", "completed", "stopped"
    )];
    for r in &report.results {
        lines.push(format!(
            "{:>13} {:>10} {:>9} {:>14.9} {:>10} {:>8}",
            r.implementation, r.case, r.n, r.seconds, r.completed, r.stopped
        ));
    }
    lines.push(match report.bytes_per_lock {
        Some(b) => format!("calm: {b:.1} heap bytes per lock"),
        None => "calm: bytes per lock not measured".to_string(),
    });
    let g = &report.grpc;
    lines.push(format!(
        "gRPC, one file, {} clients: {:.0} lock ops/s in batches of {} ({} ops in {:.2} s), \
         {:.0} ops/s one per request, {} in flight per client ({} ops in {:.2} s)",
        g.clients,
        g.batched_ops_per_sec,
        g.batch_ops,
        g.batched_ops,
        g.batched_seconds,
        g.unbatched_ops_per_sec,
        g.in_flight,
        g.unbatched_ops,
        g.unbatched_seconds
    ));
    lines.push("(getlk: seconds per operation)".into());
    lines
}

/// One panel per case, its time over N, one line per implementation (calm, the naive list,
/// the kernel's fcntl locks), as an SVG plot at `path`. Runs a baseline stopped at its cap are
/// left out (the table names where it stopped).
pub fn plot(report: &LocksReport, path: &std::path::Path) -> Result<(), String> {
    let cells = report.results.iter().filter(|r| !r.stopped).map(|r| {
        let (y_label, y) = match r.case {
            "getlk" => ("µs per F_GETLK", r.seconds * 1e6),
            _ => ("seconds for all N", r.seconds),
        };
        crate::multiples::Cell::at(
            match r.case {
                "getlk" => "conflict test (F_GETLK) among N locks".to_string(),
                case => format!("N locks set, {case}"),
            },
            ("N locks on one file", r.n as f64),
            (y_label, y),
            r.implementation.to_string(),
        )
        .log()
    });
    crate::multiples::small_multiples_svg(
        path,
        "calm-bench locks: byte-range locks on one file against a naive list and the kernel",
        &crate::multiples::facets_of(cells),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive baseline must do the same work as calm: same grants, same final locks.
    #[test]
    fn the_naive_list_ends_with_the_same_locks_as_calm() {
        let mut calm = Calm(RangeLocks::new());
        let mut naive = NaiveList::default();
        let mut x = 7u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let owner = x % 3;
            let start = (x >> 8) % 60;
            let end = start + (x >> 16) % 6;
            let kind = if x & 1 == 0 {
                LockKind::Read
            } else {
                LockKind::Write
            };
            assert_eq!(
                naive.set(owner, start, end, kind),
                calm.set(owner, start, end, kind)
            );
        }
        let mut got: Vec<(u64, u64, u64, LockKind)> = naive.0.clone();
        got.sort();
        let expected: Vec<(u64, u64, u64, LockKind)> = calm
            .0
            .locks()
            .iter()
            .map(|l| (l.owner, l.range.start, l.range.end, l.kind))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn shuffled_is_a_permutation() {
        let mut order = shuffled(1000);
        order.sort_unstable();
        assert_eq!(order, (0..1000).collect::<Vec<_>>());
    }
}
