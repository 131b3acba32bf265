//! The LMDB store whose commits return before they are on the medium
//! (`CommitSync::Within`): it conforms; a writer killed with SIGKILL loses no acknowledged
//! commit (the records are in the page cache); and power loss keeps a prefix of the commits
//! that includes every commit before the last `sync`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::{CommitSync, ReadTxn, Store, WriteTxn};
use calm_testkit::conformance;

fn options(within_ms: u64) -> LmdbOptions {
    LmdbOptions {
        wal: true,
        log_segment_records: 4,
        sync: CommitSync::Within(Duration::from_millis(within_ms)),
        ..LmdbOptions::default()
    }
}

fn open(dir: &Path, within_ms: u64) -> LmdbStore {
    LmdbStore::open(dir, &options(within_ms)).expect("open with deferred syncs")
}

fn contents(store: &LmdbStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let snap = store.snapshot().expect("snapshot");
    snap.scan(&[], &[calm_store::LOG_FAMILY], usize::MAX)
        .expect("scan")
        .into_iter()
        .collect()
}

#[test]
fn the_store_with_deferred_syncs_conforms() {
    let dirs = std::sync::Mutex::new(Vec::new());
    conformance::run_all(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path(), 10);
        dirs.lock().unwrap().push(dir);
        store
    });
}

const CHILD_DIR: &str = "CALM_DEFERRED_CHILD_DIR";

#[test]
#[ignore = "run as a child process by the kill -9 test"]
fn deferred_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    // A bound longer than the run: nothing is synced by the store on its own.
    let store = open(Path::new(&dir), 1_000);
    for i in 0u64.. {
        let mut txn = store.begin().unwrap();
        txn.put(&i.to_be_bytes(), &vec![(i % 256) as u8; 512])
            .unwrap();
        txn.commit().unwrap();
        println!("{i}");
    }
}

#[test]
fn a_writer_killed_with_sigkill_loses_no_acknowledged_commit_not_yet_synced() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "deferred_child_writer",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
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
    read(5000);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    read(u64::MAX);
    let acknowledged = acknowledged.expect("the child committed");
    assert!(
        acknowledged >= 5000,
        "the child stopped early at {acknowledged}"
    );

    let store = open(dir.path(), 10);
    let found = contents(&store);
    for i in 0..=acknowledged {
        let value = found.get(&i.to_be_bytes()[..]);
        assert_eq!(
            value.map(|v| (v.len(), v[0])),
            Some((512, (i % 256) as u8)),
            "acknowledged commit {i}"
        );
    }
    assert!(
        found.len() as u64 <= acknowledged + 2,
        "{} keys",
        found.len()
    );
}

mod power {
    //! Random commits, syncs and checkpoints, then a power loss that keeps an arbitrary
    //! subset of the pages written since the last sync (of the log's segments) and since the
    //! last checkpoint (of the data file): the store reopens as it was after one of the
    //! commits since the last sync, and after every commit before it.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Commit(Vec<(u8, Option<u16>)>),
        Sync,
        Checkpoint,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => prop::collection::vec((0u8..32, prop::option::of(0u16..3000)), 1..12)
                .prop_map(Step::Commit),
            2 => Just(Step::Sync),
            1 => Just(Step::Checkpoint),
        ]
    }

    const FILES: [&str; 3] = ["data.mdb", "wal.0", "wal.1"];

    fn read_all(dir: &Path) -> Vec<Vec<u8>> {
        FILES
            .iter()
            .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
            .collect()
    }

    /// A file after power loss: each page from `late` or from `durable` as `pages` says.
    fn lose_power(durable: &[u8], late: &[u8], pages: &[bool]) -> Vec<u8> {
        let page = 4096;
        let mut disk = late.to_vec();
        for (i, chunk) in disk.chunks_mut(page).enumerate() {
            let at = i * page;
            if !pages[i % pages.len()] && at < durable.len() {
                let end = (at + chunk.len()).min(durable.len());
                chunk[..end - at].copy_from_slice(&durable[at..end]);
                chunk[end - at..].fill(0);
            }
        }
        disk
    }

    fn value(k: u8, v: u16) -> Vec<u8> {
        vec![k ^ (v as u8); 1 + usize::from(v)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        #[test]
        fn power_loss_keeps_a_prefix_of_the_commits_and_all_before_the_last_sync(
            steps in prop::collection::vec(step(), 1..40),
            pages in prop::collection::vec(any::<bool>(), 1..17),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path(), 1_000);
            let mut model = BTreeMap::new();
            // The states since the last sync: the store must come back as one of them.
            let mut since_sync = vec![model.clone()];
            // The files as they are on the medium: the data file at the last checkpoint,
            // the segments at the last sync.
            let mut on_disk = read_all(dir.path());
            for step in steps {
                match step {
                    Step::Commit(changes) => {
                        let mut txn = store.begin().unwrap();
                        for (k, v) in changes {
                            let key = vec![b'k', k];
                            match v {
                                Some(v) => {
                                    txn.put(&key, &value(k, v)).unwrap();
                                    model.insert(key, value(k, v));
                                }
                                None => {
                                    txn.delete(&key).unwrap();
                                    model.remove(&key);
                                }
                            }
                        }
                        txn.commit().unwrap();
                        since_sync.push(model.clone());
                    }
                    Step::Sync => {
                        store.sync().unwrap();
                        let now = read_all(dir.path());
                        on_disk[1] = now[1].clone();
                        on_disk[2] = now[2].clone();
                        since_sync = vec![model.clone()];
                    }
                    Step::Checkpoint => {
                        store.checkpoint().unwrap();
                        on_disk = read_all(dir.path());
                        since_sync = vec![model.clone()];
                    }
                }
            }
            let late = read_all(dir.path());
            store.close_without_checkpoint();
            for (i, file) in FILES.iter().enumerate() {
                let disk = lose_power(&on_disk[i], &late[i], &pages);
                std::fs::write(dir.path().join(file), disk).unwrap();
            }
            let store = open(dir.path(), 10);
            let found = contents(&store);
            prop_assert!(
                since_sync.contains(&found),
                "the store came back as none of the {} states since the last sync",
                since_sync.len()
            );
        }
    }
}
