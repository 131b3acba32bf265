//! Every backend of this crate passes the shared conformance suite.

use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::mem::MemStore;
use calm_store::{ReadTxn, Store, StoreError, WriteTxn};
use calm_testkit::conformance;
use calm_testkit::fault::FaultStore;

#[test]
fn mem_store_conforms() {
    conformance::run_all(MemStore::new);
}

#[test]
fn lmdb_store_conforms() {
    let dirs = std::sync::Mutex::new(Vec::new());
    conformance::run_all(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LmdbStore::open(dir.path(), &LmdbOptions::default()).expect("open");
        dirs.lock().unwrap().push(dir);
        store
    });
}

#[test]
fn lmdb_store_without_the_log_conforms() {
    let dirs = std::sync::Mutex::new(Vec::new());
    let options = LmdbOptions {
        wal: false,
        ..LmdbOptions::default()
    };
    conformance::run_all(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LmdbStore::open(dir.path(), &options).expect("open");
        dirs.lock().unwrap().push(dir);
        store
    });
}

#[test]
fn fault_store_without_faults_conforms() {
    conformance::run_all(|| FaultStore::new(MemStore::new()));
}

#[test]
fn lmdb_store_survives_reopen_and_opens_read_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LmdbStore::open(dir.path(), &LmdbOptions::default()).expect("open");
    let mut txn = store.begin().expect("begin");
    txn.put(b"k", b"v").expect("put");
    txn.add(b"n", 3).expect("add");
    txn.commit().expect("commit");
    store.close();

    let options = LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(dir.path(), &options).expect("reopen read-only");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(snap.get(b"k").expect("get").as_deref(), Some(&b"v"[..]));
    assert_eq!(
        snap.get(b"n").expect("get").as_deref(),
        Some(&3u64.to_le_bytes()[..])
    );
    drop(snap);
    assert!(
        store.begin().and_then(|mut t| t.put(b"x", b"y")).is_err(),
        "read-only refuses writes"
    );
}

#[test]
fn lmdb_read_only_open_of_an_empty_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LmdbOptions {
        read_only: true,
        ..LmdbOptions::default()
    };
    let error = LmdbStore::open(dir.path(), &options).expect_err("no store there");
    assert!(error.to_string().contains("holds no store"), "{error}");
}

#[test]
fn lmdb_full_map_fails_the_transaction_and_keeps_the_store_usable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LmdbOptions {
        map_size_bytes: 1 << 20,
        ..LmdbOptions::default()
    };
    let store = LmdbStore::open(dir.path(), &options).expect("open");
    let mut txn = store.begin().expect("begin");
    txn.put(b"before", b"1").expect("put");
    txn.commit().expect("commit");

    let mut txn = store.begin().expect("begin");
    let mut outcome = Ok(());
    for i in 0u32..100_000 {
        outcome = txn.put(&i.to_be_bytes(), &[0u8; 512]);
        if outcome.is_err() {
            break;
        }
    }
    assert!(
        matches!(outcome, Err(StoreError::Full(_))),
        "expected Full, got {outcome:?}"
    );
    drop(txn);

    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        snap.scan(b"", b"", 10).expect("scan").len(),
        1,
        "nothing of the failed txn"
    );
    drop(snap);
    let mut txn = store.begin().expect("store still writable");
    txn.put(b"after", b"2").expect("put");
    txn.commit().expect("commit");
}

#[test]
fn fault_store_fails_the_nth_write_once() {
    let store = FaultStore::new(MemStore::new());
    store.fail_after(2);
    let mut txn = store.begin().expect("begin");
    txn.put(b"a", b"1").expect("first write");
    txn.put(b"b", b"1").expect("second write");
    assert!(
        matches!(txn.put(b"c", b"1"), Err(StoreError::Io(_))),
        "third write fails"
    );
    txn.put(b"d", b"1").expect("the fault fires once");
}
