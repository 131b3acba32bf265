//! The LMDB store with its write-ahead log: the conformance suite, clean and unclean closes,
//! a real kill -9 of a writing process, simulated power loss (the data file as it was at the
//! last checkpoint, with a later meta page on it) and a torn last record. The record log
//! (segment files beside the B-tree) takes part in all of them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::{LOG_FAMILY, ReadTxn, Store, WriteTxn};
use calm_testkit::conformance;

/// Records per segment of the record log in these tests: small, so that runs cross and purge
/// whole segments.
const SEGMENT_RECORDS: u64 = 4;

fn wal_options() -> LmdbOptions {
    LmdbOptions {
        wal: true,
        log_segment_records: SEGMENT_RECORDS,
        ..LmdbOptions::default()
    }
}

/// LMDB's own synchronous commit, without the log.
fn no_log() -> LmdbOptions {
    LmdbOptions {
        wal: false,
        ..LmdbOptions::default()
    }
}

fn read_only() -> LmdbOptions {
    LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    }
}

fn open(dir: &Path) -> LmdbStore {
    LmdbStore::open(dir, &wal_options()).expect("open with the log")
}

/// Everything in the store's keyspace (but the record log's family).
fn contents(store: &LmdbStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let snap = store.snapshot().expect("snapshot");
    snap.scan(&[], &[LOG_FAMILY], usize::MAX)
        .expect("scan")
        .into_iter()
        .collect()
}

/// Everything in the store's record log.
fn log_contents(store: &LmdbStore) -> BTreeMap<u64, Vec<u8>> {
    let snap = store.snapshot().expect("snapshot");
    let mut out = BTreeMap::new();
    snap.log_visit(0, &mut |index, record| {
        out.insert(index, record.to_vec());
        std::ops::ControlFlow::Continue(())
    })
    .expect("log visit");
    out
}

fn log_record(index: u64) -> Vec<u8> {
    vec![(index % 251) as u8; 1 + (index % 300) as usize]
}

/// Appends `count` records after the model's last and purges up to `purge` (if any), in one
/// transaction, to the store and the model (`last` keeps the last index ever appended).
fn log_commit(
    store: &LmdbStore,
    model: &mut BTreeMap<u64, Vec<u8>>,
    last: &mut u64,
    count: u64,
    purge: Option<u64>,
) {
    let mut txn = store.begin().expect("begin");
    for _ in 0..count {
        *last += 1;
        txn.log_append(*last, &log_record(*last))
            .expect("log append");
        model.insert(*last, log_record(*last));
    }
    if let Some(upto) = purge {
        let from = model.keys().next().copied().unwrap_or(upto);
        txn.log_purge(from, upto).expect("log purge");
        model.retain(|index, _| *index > upto);
    }
    txn.commit().expect("commit");
}

/// Applies `changes` (value None: delete) in one transaction, to the store and the model.
fn commit(
    store: &LmdbStore,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    changes: &[(Vec<u8>, Option<Vec<u8>>)],
) {
    let mut txn = store.begin().expect("begin");
    for (key, value) in changes {
        match value {
            Some(value) => {
                txn.put(key, value).expect("put");
                model.insert(key.clone(), value.clone());
            }
            None => {
                txn.delete(key).expect("delete");
                model.remove(key);
            }
        }
    }
    txn.commit().expect("commit");
}

fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}{i:05}").into_bytes()
}

/// Many transactions: puts, overwrites and deletes, some large enough to move many pages.
fn workload(store: &LmdbStore, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, prefix: &str) {
    for t in 0..60 {
        let mut changes = Vec::new();
        for i in 0..40 {
            let n = t * 40 + i;
            changes.push((key(prefix, n), Some(vec![(n % 251) as u8; 50 + n % 700])));
        }
        if t >= 2 {
            changes.push((key(prefix, (t - 2) * 40), None));
            changes.push((key(prefix, (t - 1) * 40 + 3), Some(b"overwritten".to_vec())));
        }
        commit(store, model, &changes);
    }
}

/// Rewrites existing keys of `prefix` over and over: a store that does not grow, where LMDB
/// reuses freed pages as soon as it may. About 1.5 MB of log.
fn churn(store: &LmdbStore, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, prefix: &str) {
    for round in 0..150 {
        let changes: Vec<_> = (0..40)
            .map(|i| {
                let n = (round * 7 + i * 59) % 2400;
                (
                    key(prefix, n),
                    Some(vec![(round % 251) as u8; 50 + n % 300]),
                )
            })
            .collect();
        commit(store, model, &changes);
    }
}

#[test]
fn the_logged_store_conforms() {
    let dirs = std::sync::Mutex::new(Vec::new());
    conformance::run_all(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        dirs.lock().unwrap().push(dir);
        store
    });
}

#[test]
fn a_clean_close_leaves_nothing_to_replay_and_a_read_only_open_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let store = open(dir.path());
    workload(&store, &mut model, "a");
    store.close();
    let store = LmdbStore::open(dir.path(), &read_only()).expect("read-only after a clean close");
    assert_eq!(contents(&store), model);
    store.close();
    let store = open(dir.path());
    assert_eq!(contents(&store), model);
}

#[test]
fn an_unclean_close_is_replayed_and_refused_to_readers_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let store = open(dir.path());
    workload(&store, &mut model, "a");
    store.close_without_checkpoint();

    for options in [read_only(), no_log()] {
        let error = LmdbStore::open(dir.path(), &options).expect_err("pending records");
        assert!(error.to_string().contains("write-ahead log"), "{error}");
    }
    let store = open(dir.path());
    assert_eq!(contents(&store), model);
    workload(&store, &mut model, "b");
    store.close_without_checkpoint();
    let store = open(dir.path());
    assert_eq!(contents(&store), model);
}

#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let error = LmdbStore::open(dir.path(), &wal_options()).expect_err("second writer");
    assert!(error.to_string().contains("one writer"), "{error}");
    let error = LmdbStore::open(dir.path(), &no_log()).expect_err("second writer");
    assert!(error.to_string().contains("one writer"), "{error}");
    drop(store);
}

#[test]
fn a_store_moves_into_and_out_of_the_log_keeping_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let (mut log, mut last) = (BTreeMap::new(), 0);
    let store = LmdbStore::open(dir.path(), &no_log()).unwrap();
    workload(&store, &mut model, "a");
    log_commit(&store, &mut log, &mut last, 10, Some(3));
    store.close();
    // Into the log: the records move from keys to segment files.
    let store = open(dir.path());
    assert_eq!(contents(&store), model);
    assert_eq!(
        log_contents(&store),
        log,
        "records moved into the record log"
    );
    assert!(
        store
            .snapshot()
            .unwrap()
            .scan(&[LOG_FAMILY], &[], 1)
            .unwrap()
            .is_empty(),
        "no record is left as a key"
    );
    workload(&store, &mut model, "b");
    log_commit(&store, &mut log, &mut last, 9, Some(8));
    store.close();
    let segments = std::fs::read_dir(dir.path().join("log")).unwrap().count();
    assert!(
        segments >= 2,
        "the record log holds segment files ({segments})"
    );
    // Read-only, the record log is read from its files.
    let reader = LmdbStore::open(dir.path(), &read_only()).unwrap();
    assert_eq!(log_contents(&reader), log);
    reader.close();
    // Out of the log: the records become keys again.
    let store = LmdbStore::open(dir.path(), &no_log()).unwrap();
    assert_eq!(contents(&store), model);
    assert_eq!(log_contents(&store), log, "records moved back into keys");
    workload(&store, &mut model, "c");
    log_commit(&store, &mut log, &mut last, 5, None);
    store.close();
    assert!(!dir.path().join("wal.ckpt").exists(), "the log was left");
    assert!(!dir.path().join("log").exists(), "the record log was left");
    // Back to the log: its old checkpoint is gone, so the current data is taken as it is.
    let store = open(dir.path());
    assert_eq!(contents(&store), model);
    assert_eq!(log_contents(&store), log);
}

/// Power loss after the last checkpoint. What reached the disk since is unknown, so two
/// extremes: (a) nothing but a later meta page (the data file holds the checkpoint's pages
/// with a meta page pointing at pages that never arrived); (b) every later page (so the
/// checkpointed snapshot survives only if nothing overwrote its pages: the pin). Recovery puts
/// the checkpoint's meta pages back and replays the log; both end in the committed state.
#[test]
fn power_loss_after_a_checkpoint_is_recovered_from_the_log() {
    for every_later_page_arrived in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.mdb");
        let mut model = BTreeMap::new();
        let store = open(dir.path());
        workload(&store, &mut model, "a");
        // The checkpoint the crash follows: what is written after it (about 2.5 MB of log)
        // stays under the log's checkpoint size, so no later checkpoint happens.
        store.checkpoint().unwrap();
        let image = std::fs::read(&data).unwrap();
        workload(&store, &mut model, "b");
        churn(&store, &mut model, "a");
        let late = std::fs::read(&data).unwrap();
        store.close_without_checkpoint();

        let crashed = if every_later_page_arrived {
            late
        } else {
            let page = 4096.min(image.len() / 2);
            let mut crashed = image.clone();
            crashed[..2 * page].copy_from_slice(&late[..2 * page]);
            assert_ne!(crashed, image, "the later meta pages differ");
            crashed
        };
        std::fs::write(&data, &crashed).unwrap();

        let store = open(dir.path());
        assert_eq!(
            contents(&store),
            model,
            "every later page: {every_later_page_arrived}"
        );
    }
}

/// A record torn by a crash (its bytes only partly on the medium) is not replayed, nor is
/// anything after it; everything before it is.
#[test]
fn a_torn_last_record_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let store = open(dir.path());
    workload(&store, &mut model, "a");
    let before_last = model.clone();
    commit(
        &store,
        &mut model,
        &[(b"zzz-last".to_vec(), Some(b"LASTVALUE".to_vec()))],
    );
    store.close_without_checkpoint();

    let mut torn = 0;
    for name in ["wal.0", "wal.1"] {
        let path = dir.path().join(name);
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(9).position(|w| w == b"LASTVALUE") {
            bytes[at] ^= 0xFF;
            std::fs::write(&path, &bytes).unwrap();
            torn += 1;
        }
    }
    assert_eq!(torn, 1, "the last record is in one segment");
    let store = open(dir.path());
    assert_eq!(contents(&store), before_last);
}

const CHILD_DIR: &str = "CALM_WAL_TEST_CHILD_DIR";

/// Run by `a_writer_killed_with_sigkill_loses_no_acknowledged_commit` in a child process:
/// commits key i (4 KiB values, so checkpoints come every ~1000 commits) and prints i once
/// the commit returned, until killed.
#[test]
#[ignore = "run as a child process by the kill -9 test"]
fn child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let store = open(Path::new(&dir));
    for i in 0u64.. {
        let mut txn = store.begin().unwrap();
        txn.put(&i.to_be_bytes(), &vec![(i % 256) as u8; 4096])
            .unwrap();
        txn.commit().unwrap();
        println!("{i}");
    }
}

#[test]
fn a_writer_killed_with_sigkill_loses_no_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_writer", "--nocapture"])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill it when dropped, also if an assertion below fails.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut child = Kill(child);
    let mut acknowledged = None;
    let mut read = |until: u64| {
        for line in lines.by_ref() {
            if let Ok(i) = line.unwrap().trim().parse::<u64>() {
                acknowledged = Some(i);
                if i >= until {
                    break;
                }
            }
        }
    };
    read(2500);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // What the child printed before it died: acknowledged too.
    read(u64::MAX);
    let acknowledged = acknowledged.expect("the child committed");
    assert!(
        acknowledged >= 2500,
        "the child stopped early at {acknowledged}"
    );

    let store = open(dir.path());
    let found = contents(&store);
    for i in 0..=acknowledged {
        let value = found.get(&i.to_be_bytes()[..]);
        assert_eq!(
            value.map(|v| (v.len(), v[0])),
            Some((4096, (i % 256) as u8)),
            "acknowledged commit {i}"
        );
    }
    // At most the one commit in flight at the kill is there beyond the acknowledged ones.
    assert!(
        found.len() as u64 <= acknowledged + 2,
        "{} keys",
        found.len()
    );
}

mod model {
    //! Random runs of commits, checkpoints, clean closes, kill -9 and power loss against a
    //! `BTreeMap`: after every reopen the store holds exactly what was committed. Power loss
    //! keeps, of every page written since the last checkpoint, an arbitrary subset (the
    //! kernel writes back in any order), and may keep or lose the file's growth.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// Puts (value Some) and deletes, and records appended to the record log and a purge
        /// of its first records, one transaction.
        Commit(Vec<(u8, Option<u16>)>, u8, Option<u8>),
        Checkpoint,
        CleanClose,
        Kill,
        /// Which later pages reach the disk (bit per page, repeating), and whether the file's
        /// growth since the checkpoint survives.
        PowerLoss(Vec<bool>, bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (
                prop::collection::vec((0u8..48, prop::option::of(0u16..2000)), 1..30),
                0u8..7,
                prop::option::weighted(0.3, 0u8..9),
            )
                .prop_map(|(changes, appends, purge)| Step::Commit(changes, appends, purge)),
            1 => Just(Step::Checkpoint),
            1 => Just(Step::CleanClose),
            1 => Just(Step::Kill),
            2 => (prop::collection::vec(any::<bool>(), 1..17), any::<bool>())
                .prop_map(|(pages, grown)| Step::PowerLoss(pages, grown)),
        ]
    }

    /// A file after power loss: each page from `late` (written since the checkpoint) or from
    /// `image` (the checkpoint's) as `pages` says; the growth since kept or lost.
    fn lose_power(image: &[u8], late: &[u8], pages: &[bool], grown: bool) -> Vec<u8> {
        let page = 4096;
        let len = if grown {
            late.len()
        } else {
            image.len().min(late.len())
        };
        let mut disk = vec![0u8; len];
        for (i, chunk) in disk.chunks_mut(page).enumerate() {
            let at = i * page;
            let from_late = pages[i % pages.len()] || at >= image.len();
            let source = if from_late { late } else { image };
            let end = (at + chunk.len()).min(source.len());
            chunk[..end - at].copy_from_slice(&source[at..end]);
        }
        disk
    }

    /// The record log's files by name.
    fn log_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        match std::fs::read_dir(dir.join("log")) {
            Ok(listing) => listing
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect(),
            Err(_) => BTreeMap::new(),
        }
    }

    fn value(k: u8, v: u16) -> Vec<u8> {
        // Values of up to ~2 KiB: commits move many pages.
        vec![k ^ (v as u8); 1 + usize::from(v)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn the_logged_store_holds_what_was_committed_across_crashes(
            steps in prop::collection::vec(step(), 1..24)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path().join("data.mdb");
            let mut model = BTreeMap::new();
            let (mut log, mut last) = (BTreeMap::new(), 0u64);
            let mut store = Some(open(dir.path()));
            // The data file and the record log's files as of the last checkpoint (opening a
            // new store checkpoints; reopening one does not: the last checkpoint stays the
            // baseline until the next one).
            let mut image = std::fs::read(&data).unwrap();
            let mut log_image = log_files(dir.path());
            for step in steps {
                let s = store.take().unwrap();
                match step {
                    Step::Commit(changes, appends, purge) => {
                        let changes: Vec<_> = changes
                            .into_iter()
                            .map(|(k, v)| (vec![b'k', k], v.map(|v| value(k, v))))
                            .collect();
                        commit(&s, &mut model, &changes);
                        let purge = purge.map(|p| {
                            log.keys().next().copied().unwrap_or(last + 1) + u64::from(p)
                        });
                        log_commit(&s, &mut log, &mut last, u64::from(appends), purge);
                        store = Some(s);
                        continue;
                    }
                    Step::Checkpoint => {
                        s.checkpoint().unwrap();
                        image = std::fs::read(&data).unwrap();
                        log_image = log_files(dir.path());
                        store = Some(s);
                        continue;
                    }
                    Step::CleanClose => {
                        s.close();
                        image = std::fs::read(&data).unwrap();
                        log_image = log_files(dir.path());
                    }
                    Step::Kill => s.close_without_checkpoint(),
                    Step::PowerLoss(pages, grown) => {
                        let late = std::fs::read(&data).unwrap();
                        let log_late = log_files(dir.path());
                        s.close_without_checkpoint();
                        std::fs::write(&data, lose_power(&image, &late, &pages, grown)).unwrap();
                        // The record log's files alike: a file removed since the checkpoint
                        // may come back, one created since may be gone.
                        let log_dir = dir.path().join("log");
                        for name in log_image.keys().chain(log_late.keys()) {
                            let path = log_dir.join(name);
                            let bytes = match (log_image.get(name), log_late.get(name)) {
                                (Some(old), Some(new)) => Some(lose_power(old, new, &pages, grown)),
                                (Some(old), None) => pages[0].then(|| old.clone()),
                                (None, Some(new)) => grown.then(|| lose_power(&[], new, &pages, true)),
                                (None, None) => None,
                            };
                            match bytes {
                                Some(bytes) => std::fs::write(&path, bytes).unwrap(),
                                None => {
                                    let _ = std::fs::remove_file(&path);
                                }
                            }
                        }
                    }
                }
                let reopened = open(dir.path());
                prop_assert_eq!(contents(&reopened), model.clone());
                prop_assert_eq!(log_contents(&reopened), log.clone());
                store = Some(reopened);
            }
            let s = store.take().unwrap();
            s.close_without_checkpoint();
            let s = open(dir.path());
            prop_assert_eq!(contents(&s), model);
            prop_assert_eq!(log_contents(&s), log);
        }
    }
}
