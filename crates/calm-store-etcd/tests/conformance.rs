//! The etcd backend against the conformance suite every backend passes, on a real cluster
//! (the shared one of `scripts/test`, or a private 3-member cluster), each case under a prefix
//! of its own; and the limits of a cluster with etcd's default settings.

use std::time::Duration;

use calm_store::{ReadTxn, Store, StoreError, WriteTxn};
use calm_store_etcd::{EtcdOptions, EtcdStore};
use calm_testkit::etcd::{LocalCluster, shared_url, unique_prefix};

/// The URL of a cluster for this test: the shared one, or `private` started here.
fn cluster_url(private: &mut Option<LocalCluster>, prefix: &str) -> String {
    if let Some(url) = shared_url(prefix) {
        return url;
    }
    let cluster = private.get_or_insert_with(|| LocalCluster::start(3).expect("starting etcd"));
    cluster.url(prefix)
}

#[test]
fn etcd_store_passes_the_conformance_suite() {
    let mut private = None;
    let base = cluster_url(&mut private, "x");
    calm_testkit::conformance::run_all(|| {
        let url = base.replace("/x?", &format!("/{}?", unique_prefix("conformance")));
        EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).expect("connecting")
    });
}

#[test]
fn limits_give_clear_errors_and_write_nothing() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("limits"));
    let mut options = EtcdOptions::from_url(&url).unwrap();
    // etcd's defaults, as a production cluster has them.
    options.txn_ops_max = calm_store_etcd::TXN_OPS_MAX_DEFAULT;
    options.request_bytes_max = calm_store_etcd::REQUEST_BYTES_MAX_DEFAULT;
    let store = EtcdStore::connect(options).unwrap();

    let mut txn = store.begin().unwrap();
    for i in 0u32..200 {
        txn.put(&i.to_be_bytes(), b"v").unwrap();
    }
    match txn.commit() {
        Err(StoreError::Limit(message)) => {
            assert!(message.contains("txn-ops-max"), "{message}");
            assert!(message.contains("nothing was written"), "{message}");
        }
        other => panic!("200 writes against a limit of 128: {other:?}"),
    }
    let mut txn = store.begin().unwrap();
    for i in 0u32..4 {
        txn.put(&i.to_be_bytes(), &vec![7u8; 1 << 19]).unwrap();
    }
    match txn.commit() {
        Err(StoreError::Limit(message)) => {
            assert!(message.contains("request-bytes-max"), "{message}")
        }
        other => panic!("2 MiB against a limit of 1.5 MiB: {other:?}"),
    }
    assert!(
        !store.snapshot().unwrap().any_in(b"", b"").unwrap(),
        "a refused transaction wrote something"
    );

    // Within the limits, the same store commits.
    let mut txn = store.begin().unwrap();
    for i in 0u32..100 {
        txn.put(&i.to_be_bytes(), b"v").unwrap();
    }
    txn.commit().unwrap();
    assert_eq!(
        store
            .snapshot()
            .unwrap()
            .scan(b"", b"", 1000)
            .unwrap()
            .len(),
        100
    );
}

#[test]
fn concurrent_writers_conflict_and_nothing_is_lost() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("conflict"));
    let a = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let b = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    // Both read the counter, both add: the second to commit must be told to run again.
    let mut ta = a.begin().unwrap();
    let mut tb = b.begin().unwrap();
    ta.add(b"counter", 1).unwrap();
    tb.add(b"counter", 1).unwrap();
    ta.commit().unwrap();
    assert!(matches!(tb.commit(), Err(StoreError::Conflict)));
    // Two threads each adding 50 times with retries end at exactly 101.
    std::thread::scope(|scope| {
        for store in [&a, &b] {
            scope.spawn(move || {
                for _ in 0..50 {
                    loop {
                        let mut txn = store.begin().unwrap();
                        txn.add(b"counter", 1).unwrap();
                        match txn.commit() {
                            Ok(()) => break,
                            Err(StoreError::Conflict) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let value = a
        .snapshot()
        .unwrap()
        .get(b"counter")
        .unwrap()
        .unwrap()
        .to_vec();
    assert_eq!(calm_store::decode_counter(b"counter", &value).unwrap(), 101);
}

#[test]
fn bad_urls_are_refused_clearly() {
    for (url, says) in [
        ("http://127.0.0.1:2379", "etcd://"),
        ("etcd://127.0.0.1", "HOST:PORT"),
        ("etcd://127.0.0.1:notaport", "HOST:PORT"),
        (
            "etcd://127.0.0.1:2379/p?txn-ops-max=lots",
            "must be a number",
        ),
        ("etcd://127.0.0.1:2379/p?colour=blue", "unknown"),
        ("etcd://127.0.0.1:2379/p?history-s=-1", "must be a number"),
    ] {
        let error = EtcdOptions::from_url(url).unwrap_err();
        assert!(error.contains(says), "{url}: {error}");
    }
    let options = EtcdOptions::from_url("etcd://a:1,b:2/fs1?txn-ops-max=1000").unwrap();
    assert_eq!(options.endpoints, ["http://a:1", "http://b:2"]);
    assert_eq!(options.prefix, "fs1");
    assert_eq!(options.txn_ops_max, 1000);
    assert_eq!(
        options.history_kept,
        calm_store_etcd::history::HISTORY_KEPT_DEFAULT
    );
    let options = EtcdOptions::from_url("etcd://a:1/fs1?history-s=0").unwrap();
    assert!(options.history_kept.is_zero(), "0: calm never compacts");
    let options = EtcdOptions::from_url("etcd://a:1/fs1?history-s=600").unwrap();
    assert_eq!(options.history_kept, std::time::Duration::from_secs(600));
}

#[test]
fn the_space_quota_is_a_clear_error_and_writes_nothing() {
    // A cluster of its own with a 4 MiB quota: filling it raises etcd's NOSPACE alarm.
    let cluster =
        LocalCluster::start_with(1, &["--quota-backend-bytes", "4194304"]).expect("starting etcd");
    let store = EtcdStore::connect(EtcdOptions::from_url(&cluster.url("quota")).unwrap()).unwrap();
    let mut full = None;
    for round in 0u32..64 {
        let mut txn = store.begin().unwrap();
        for i in 0u32..4 {
            txn.put(
                &[round.to_be_bytes(), i.to_be_bytes()].concat(),
                &vec![round as u8; 256 << 10],
            )
            .unwrap();
        }
        match txn.commit() {
            Ok(()) => {}
            Err(error) => {
                full = Some((round, error));
                break;
            }
        }
    }
    let Some((round, error)) = full else {
        panic!("64 MiB went into a 4 MiB quota");
    };
    match error {
        StoreError::Full(message) => assert!(message.contains("quota"), "{message}"),
        other => panic!("a full cluster answered {other:?}"),
    }
    // The refused transaction left nothing; what committed before it is intact.
    let snapshot = store.snapshot().unwrap();
    let keys = snapshot.scan(b"", b"", 10_000).unwrap();
    assert_eq!(
        keys.len() as u32,
        round * 4,
        "a refused transaction (round {round}) wrote something"
    );
    for (key, value) in keys {
        assert_eq!(value.len(), 256 << 10);
        assert!(value.iter().all(|b| *b == key[3]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_can_be_opened_used_and_dropped_inside_a_runtime() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("in-runtime"));
    let store = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let mut txn = store.begin().unwrap();
    txn.put(b"k", b"v").unwrap();
    txn.commit().unwrap();
    assert_eq!(
        store.snapshot().unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    // The last clone goes here, inside this test's runtime: no "runtime dropped in an
    // asynchronous context" panic.
    drop(store);
    drop(private);
}

#[test]
fn an_unreachable_cluster_is_a_clear_error_after_the_retry_limit() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("etcd://127.0.0.1:{port}/p?retry-ms-max=500&attempt-ms-max=200");
    match EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()) {
        Err(StoreError::Io(message)) => assert!(message.contains("etcd"), "{message}"),
        other => panic!("connecting to nothing: {other:?}"),
    }
}

/// The read cache is exact across writers: what another store (another server) commits is
/// read by the next snapshot here, however often the pair was read before; and the cache
/// serves the reads a snapshot repeats.
#[test]
fn cached_reads_see_every_commit_of_every_writer() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("cache"));
    let a = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let b = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let read = |store: &EtcdStore, key: &[u8]| {
        store
            .snapshot()
            .unwrap()
            .get(key)
            .unwrap()
            .map(|v| v.to_vec())
    };
    for round in 0..200u32 {
        let value = round.to_le_bytes();
        let writer = if round % 2 == 0 { &a } else { &b };
        let mut txn = writer.begin().unwrap();
        txn.put(b"k", &value).unwrap();
        if round % 3 == 0 {
            txn.delete(b"gone").unwrap();
        } else {
            txn.put(b"gone", b"x").unwrap();
        }
        txn.commit().unwrap();
        // Acknowledged, so every later snapshot of either store sees it.
        for store in [&a, &b] {
            assert_eq!(read(store, b"k"), Some(value.to_vec()), "round {round}");
            let expected = (round % 3 != 0).then(|| b"x".to_vec());
            assert_eq!(read(store, b"gone"), expected, "round {round}");
            assert_eq!(read(store, b"never"), None);
        }
    }
    let (hits, _) = a.cache_counts();
    assert!(hits > 0, "the cache served nothing");
}

/// A range read ahead answers the transaction's reads and deletes of keys inside it, present or
/// absent, without a request of their own; its own writes still come first.
#[test]
fn keys_inside_a_range_read_ahead_are_read_and_deleted_without_a_round_trip() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("ahead"));
    let store = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let mut txn = store.begin().unwrap();
    for i in 0u8..10 {
        txn.put(&[b'r', i * 2], &[i]).unwrap();
    }
    txn.commit().unwrap();

    let mut txn = store.begin().unwrap();
    txn.prefetch(&[], &[(vec![b'r'], vec![b's'])]).unwrap();
    let key_reads = || {
        store
            .stats()
            .key_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = key_reads();
    for i in 0u8..10 {
        assert_eq!(txn.get(&[b'r', i * 2]).unwrap().as_deref(), Some(&[i][..]));
        assert_eq!(
            txn.get(&[b'r', i * 2 + 1]).unwrap(),
            None,
            "absent inside the range"
        );
    }
    for i in 0u8..10 {
        assert!(txn.delete(&[b'r', i * 2]).unwrap(), "existed");
        assert!(!txn.delete(&[b'r', i * 2 + 1]).unwrap(), "did not exist");
        assert_eq!(
            txn.get(&[b'r', i * 2]).unwrap(),
            None,
            "deleted in the transaction"
        );
    }
    txn.put(b"r\x04", b"new").unwrap();
    assert_eq!(txn.get(b"r\x04").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(
        key_reads(),
        before,
        "no key read beyond the range read ahead"
    );
    // A key outside every range read ahead is read as before.
    assert_eq!(txn.get(b"t").unwrap(), None);
    assert_eq!(key_reads(), before + 1);
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.get(b"r\x02").unwrap(), None);
    assert_eq!(snap.get(b"r\x04").unwrap().as_deref(), Some(&b"new"[..]));
}

/// A write transaction may begin at the last commit its store's watch delivered, without asking
/// etcd: what it answers must still hold at its commit. One that writes nothing (a refusal
/// computed from what it read) and began before another store's commit is told to run again,
/// as one that writes is; after another store's acknowledged commit, a transaction of this
/// store either sees it or fails with a conflict, never answers from before it.
#[test]
fn a_transaction_begun_on_the_watch_never_answers_from_before_an_acknowledged_commit() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("watched"));
    let a = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let b = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let watched = |store: &EtcdStore| {
        store
            .stats()
            .watched_begins
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let mut txn = b.begin().unwrap();
    txn.put(b"b", b"1").unwrap();
    txn.commit().unwrap();
    // A transaction of b begun on its watch, then a commit of a, then b's commit of nothing.
    let stale = loop {
        let before = watched(&b);
        let txn = b.begin().unwrap();
        if watched(&b) > before {
            break txn;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let mut txn = a.begin().unwrap();
    txn.put(b"k", b"from a").unwrap();
    txn.commit().unwrap();
    assert_eq!(stale.get(b"k").unwrap(), None, "its revision is before a's");
    assert!(matches!(stale.commit(), Err(StoreError::Conflict)));
    // Now and from then on: each acknowledged commit of a is seen by b's next transaction, or
    // that transaction is refused and seen by its next attempt.
    let put = |store: &EtcdStore, key: &[u8], value: &[u8]| loop {
        let mut txn = store.begin().unwrap();
        txn.put(key, value).unwrap();
        match txn.commit() {
            Ok(()) => break,
            Err(StoreError::Conflict) => continue,
            Err(e) => panic!("{e}"),
        }
    };
    // `key` as a transaction of `store` that commits sees it (a refused one runs again).
    let read = |store: &EtcdStore, key: &[u8]| loop {
        let txn = store.begin().unwrap();
        let seen = txn.get(key).unwrap().map(|v| v.to_vec());
        match txn.commit() {
            Ok(()) => break seen,
            Err(StoreError::Conflict) => continue,
            Err(e) => panic!("{e}"),
        }
    };
    for round in 0..200u32 {
        let value = round.to_le_bytes();
        put(&a, b"k", &value);
        assert_eq!(read(&b, b"k"), Some(value.to_vec()), "round {round}");
        if round % 2 == 0 {
            // b commits too, so that its next transactions begin on its watch again.
            put(&b, b"b", &value);
        }
    }
    // A conflict makes b read the revision for a while: the rounds above may all fall inside
    // that time on a fast machine. Past it, b begins on its watch again, and still sees every
    // commit a acknowledged before it began (or is refused and sees it on its next attempt).
    let before = watched(&b);
    for round in 200..205u32 {
        std::thread::sleep(calm_store_etcd::BEGIN_READ_AFTER_CONFLICT + Duration::from_millis(100));
        let value = round.to_le_bytes();
        put(&b, b"b", &value);
        put(&a, b"k", &value);
        assert_eq!(read(&b, b"k"), Some(value.to_vec()), "round {round}");
    }
    assert!(watched(&b) > before, "b never began on its watch again");
}

#[test]
fn a_store_at_rest_is_held_by_its_clones_alone() {
    let mut private = None;
    let url = cluster_url(&mut private, &unique_prefix("holders"));
    let store = EtcdStore::connect(EtcdOptions::from_url(&url).unwrap()).unwrap();
    let mut txn = store.begin().unwrap();
    txn.put(b"k", b"v").unwrap();
    txn.commit().unwrap();
    assert_eq!(
        store.snapshot().unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    // The read cache's watch has the commit (it follows while the store lives), then waits
    // without holding the store: dropping the last clone would end it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.holders() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        store.holders(),
        1,
        "background work holds the store at rest"
    );
    let clone = store.clone();
    assert_eq!(store.holders(), 2);
    drop(clone);
    assert_eq!(store.holders(), 1);
}
