//! The logged LMDB store under file faults, checked against a model.
//!
//! One fixed workload of commits (puts of small and large values, deletes, record log appends
//! and purges; large enough to grow the log's segments, checkpoint several times, and cross,
//! retire and reuse record log segments) runs with a fault planned at each of its file
//! operations in turn. Whatever the fault, the store reopened afterwards holds exactly what
//! the model holds after the commits that were acknowledged, plus, at most, the one commit
//! whose fate the failure left unknown; it takes a commit and is reopened once more. With
//! commits synced later than they return, a power loss may lose acknowledged commits, but
//! never a commit without the ones before it.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Duration;

use super::faults::{self, Fault};
use crate::lmdb::{LmdbOptions, LmdbStore};
use crate::{CommitSync, ReadTxn, Store, StoreError, WriteTxn};

/// Records per segment of the record log: small, so that the workload crosses segments.
const SEGMENT_RECORDS: u64 = 4;
/// Commits of the workload.
const COMMITS: usize = 48;

#[derive(Debug, Clone)]
enum Change {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Append(Vec<u8>),
    /// Purges the log's records up to this many after its first.
    Purge(u64),
}

/// The obviously correct store: a map and a log (and the last index ever appended, which the
/// next append must follow).
#[derive(Debug, Clone, Default)]
struct Model {
    keys: BTreeMap<Vec<u8>, Vec<u8>>,
    log: BTreeMap<u64, Vec<u8>>,
    last: u64,
}

impl Model {
    /// Whether the store holds what `self` does.
    fn holds(&self, found: &Model) -> bool {
        self.keys == found.keys && self.log == found.log
    }

    fn apply(&mut self, commit: &[Change]) {
        for change in commit {
            match change {
                Change::Put(key, value) => {
                    self.keys.insert(key.clone(), value.clone());
                }
                Change::Delete(key) => {
                    self.keys.remove(key);
                }
                Change::Append(record) => {
                    self.last += 1;
                    self.log.insert(self.last, record.clone());
                }
                Change::Purge(count) => {
                    if let Some(&first) = self.log.keys().next() {
                        self.log.retain(|index, _| *index > first + count);
                    }
                }
            }
        }
    }
}

/// A small deterministic generator (xorshift), so that every run is the same workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn workload() -> Vec<Vec<Change>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..COMMITS)
        .map(|i| {
            let mut commit = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let key = format!("k{:02}", rng.below(24)).into_bytes();
                match rng.below(6) {
                    0 => commit.push(Change::Delete(key)),
                    1 => {
                        // A large value: the B-tree bytes that bring checkpoints.
                        let len = 300_000 + rng.below(400_000) as usize;
                        commit.push(Change::Put(key, vec![(i % 251) as u8; len]));
                    }
                    _ => {
                        let len = 1 + rng.below(3000) as usize;
                        commit.push(Change::Put(key, vec![(rng.next() % 256) as u8; len]));
                    }
                }
            }
            for _ in 0..rng.below(4) {
                let len = 1 + rng.below(200) as usize;
                commit.push(Change::Append(vec![(rng.next() % 256) as u8; len]));
            }
            if rng.below(4) == 0 {
                commit.push(Change::Purge(rng.below(6)));
            }
            commit
        })
        .collect()
}

fn options(sync: CommitSync) -> LmdbOptions {
    LmdbOptions {
        wal: true,
        log_segment_records: SEGMENT_RECORDS,
        sync,
        ..LmdbOptions::default()
    }
}

/// Commits `commit` to the store, `last` being the log's last index.
fn commit(store: &LmdbStore, commit: &[Change], last: u64) -> crate::Result<()> {
    let mut txn = store.begin()?;
    let mut last = last;
    let mut first = txn.log_first()?;
    for change in commit {
        match change {
            Change::Put(key, value) => txn.put(key, value)?,
            Change::Delete(key) => {
                txn.delete(key)?;
            }
            Change::Append(record) => {
                last += 1;
                txn.log_append(last, record)?;
                first.get_or_insert(last);
            }
            Change::Purge(count) => {
                if let Some(from) = first {
                    let upto = (from + count).min(last);
                    txn.log_purge(from, upto)?;
                    first = (upto < last).then_some(upto + 1);
                }
            }
        }
    }
    txn.commit()
}

fn contents(store: &LmdbStore) -> Model {
    let snap = store.snapshot().expect("snapshot");
    let keys = snap
        .scan(b"k", b"l", usize::MAX)
        .expect("scan")
        .into_iter()
        .collect();
    let mut log = BTreeMap::new();
    snap.log_visit(0, &mut |index, record| {
        log.insert(index, record.to_vec());
        ControlFlow::Continue(())
    })
    .expect("log visit");
    Model { keys, log, last: 0 }
}

/// How a run ended: the models after each acknowledged commit (the first is the empty
/// store), and the one after the commit that failed with its fate unknown, if one did.
struct Run {
    acked: Vec<Model>,
    unknown: Option<Model>,
    fired: bool,
    ops: u64,
}

/// Runs the workload in `dir` with `fault` at operation `at`, then lets the store go.
fn run(dir: &Path, at: u64, fault: Fault, sync: CommitSync) -> Run {
    let armed = faults::arm(dir, at, fault);
    let mut model = Model::default();
    let mut acked = vec![model.clone()];
    let mut unknown = None;
    if let Ok(store) = LmdbStore::open(dir, &options(sync)) {
        for changes in workload() {
            if armed.crashed() {
                break;
            }
            let mut next = model.clone();
            next.apply(&changes);
            match commit(&store, &changes, model.last) {
                Ok(()) => {
                    model = next;
                    acked.push(model.clone());
                }
                // Out of room: nothing of it counts, and the next commit is tried.
                Err(StoreError::Full(_)) => {}
                // Refused before anything was written.
                Err(StoreError::Poisoned) => break,
                Err(_) => {
                    unknown = Some(next);
                    break;
                }
            }
        }
    }
    Run {
        acked,
        unknown,
        fired: armed.fired(),
        ops: armed.ops(),
    }
}

/// Reopens the store after `run` and checks it against the models; then commits once more and
/// checks that after another reopen. `prefix`: any acknowledged prefix will do (commits synced
/// later than they return, and a power loss).
fn check(dir: &Path, run: &Run, prefix: bool, what: &str) {
    let store = LmdbStore::open(dir, &options(CommitSync::EveryCommit))
        .unwrap_or_else(|e| panic!("{what}: reopening after the fault: {e}"));
    let found = contents(&store);
    let newest = run.acked.last().expect("the empty store");
    let allowed: Vec<&Model> = match prefix {
        true => run.acked.iter().chain(&run.unknown).collect(),
        false => [newest].into_iter().chain(&run.unknown).collect(),
    };
    let matched = allowed.into_iter().find(|model| model.holds(&found));
    assert!(
        matched.is_some(),
        "{what}: the reopened store holds {} keys and log {:?}; the last acknowledged commit \
         left {} keys and log {:?} ({} acknowledged, unknown: {})",
        found.keys.len(),
        found.log.keys().collect::<Vec<_>>(),
        newest.keys.len(),
        newest.log.keys().collect::<Vec<_>>(),
        run.acked.len() - 1,
        run.unknown.is_some(),
    );
    let last = matched.expect("checked").last;
    let extra = [
        Change::Put(b"k-after".to_vec(), b"x".to_vec()),
        Change::Append(b"after".to_vec()),
    ];
    commit(&store, &extra, last).unwrap_or_else(|e| panic!("{what}: a commit after: {e}"));
    drop(store);
    let store = LmdbStore::open(dir, &options(CommitSync::EveryCommit))
        .unwrap_or_else(|e| panic!("{what}: the second reopen: {e}"));
    let again = contents(&store);
    assert_eq!(
        again.keys.get(&b"k-after"[..]),
        Some(&b"x".to_vec()),
        "{what}"
    );
    assert_eq!(
        again.log.values().last(),
        Some(&b"after".to_vec()),
        "{what}"
    );
}

/// A fresh directory on a memory file system when there is one (the workload writes about
/// 20 MB per run and syncs often).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).expect("tempdir"),
        false => tempfile::tempdir().expect("tempdir"),
    }
}

/// The operations the whole workload makes without a fault (its open and close included).
fn operations(sync: CommitSync) -> u64 {
    let dir = scratch();
    let run = run(
        dir.path(),
        u64::MAX,
        Fault::Fail {
            errno: 0,
            written: 0,
        },
        sync,
    );
    assert!(!run.fired && run.acked.len() == COMMITS + 1);
    run.ops
}

/// Sizes of the torn or short part of a write, taken in turn: none, inside a record's header,
/// past it, a page and more, most of a large record.
const PARTS: [usize; 5] = [0, 10, 30, 4097, 200_000];

/// Runs the workload with `fault(at)` at every operation `at`, and checks each run.
fn sweep(name: &str, sync: CommitSync, prefix: bool, fault: impl Fn(u64) -> Fault) {
    let total = operations(sync);
    assert!(total > 100, "the workload makes {total} file operations");
    for at in 1..=total {
        let dir = scratch();
        let fault = fault(at);
        let run = run(dir.path(), at, fault, sync);
        let what = format!("{name}: {fault:?} at operation {at} of {total}");
        assert!(run.fired || run.ops < at, "{what}: the fault never came");
        check(dir.path(), &run, prefix, &what);
    }
}

fn part(at: u64) -> usize {
    PARTS[(at % PARTS.len() as u64) as usize]
}

#[test]
fn a_crash_at_any_write_or_sync_keeps_every_acknowledged_commit() {
    sweep("kill", CommitSync::EveryCommit, false, |at| Fault::Crash {
        torn: part(at),
        power_loss: false,
    });
}

#[test]
fn a_power_loss_at_any_write_or_sync_keeps_every_acknowledged_commit() {
    sweep("power loss", CommitSync::EveryCommit, false, |at| {
        Fault::Crash {
            torn: part(at),
            power_loss: true,
        }
    });
}

#[test]
fn a_failed_write_or_sync_anywhere_loses_no_acknowledged_commit() {
    sweep("EIO", CommitSync::EveryCommit, false, |at| Fault::Fail {
        errno: libc::EIO,
        written: part(at),
    });
}

#[test]
fn a_short_write_for_room_anywhere_is_retried_and_loses_nothing() {
    sweep("ENOSPC", CommitSync::EveryCommit, false, |at| Fault::Fail {
        errno: libc::ENOSPC,
        written: part(at),
    });
}

#[test]
fn a_power_loss_with_later_syncs_keeps_a_prefix_of_the_commits() {
    let within = CommitSync::Within(Duration::from_millis(2));
    sweep("power loss, synced within 2 ms", within, true, |at| {
        Fault::Crash {
            torn: part(at),
            power_loss: true,
        }
    });
}
