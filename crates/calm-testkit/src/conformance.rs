//! The behaviours every [`Store`] backend must have. A backend's test calls [`run_all`] with a
//! factory of fresh, empty stores; each case panics with a message naming the rule broken.
//!
//! The suite lives in the test kit so that every backend's tests (LMDB and the reference map
//! in `calm-store`, etcd in `calm-store-etcd`) run exactly the same cases, and no library a
//! site runs carries it.

use std::ops::ControlFlow;

use calm_store::{KEY_LEN_MAX, ReadTxn, Store, StoreError, VALUE_LEN_MAX, WriteTxn, prefix_end};

/// One named case of the suite.
pub type Case<S> = (&'static str, fn(&S));

/// Every case, by name.
pub fn cases<S: Store>() -> Vec<Case<S>> {
    vec![
        ("empty store reads nothing", empty_store_reads_nothing::<S>),
        ("put, get and overwrite", put_get_overwrite::<S>),
        ("delete reports existence", delete_reports_existence::<S>),
        (
            "commit publishes, drop discards",
            commit_publishes_drop_discards::<S>,
        ),
        ("snapshots are isolated", snapshots_are_isolated::<S>),
        (
            "a transaction reads its own writes",
            txn_reads_own_writes::<S>,
        ),
        (
            "reads ahead change no answer",
            reads_ahead_change_no_answer::<S>,
        ),
        (
            "visit is ordered and bounded",
            visit_is_ordered_and_bounded::<S>,
        ),
        ("scan honours its limit", scan_honours_limit::<S>),
        ("the last pair of a range", last_in_a_range::<S>),
        ("append at the end of the keyspace", append_at_the_end::<S>),
        ("atomic add", atomic_add::<S>),
        ("limits are enforced", limits_are_enforced::<S>),
        (
            "binary keys and prefix ends",
            binary_keys_and_prefix_ends::<S>,
        ),
        ("large batch commits whole", large_batch_commits_whole::<S>),
        (
            "the log: appends, reads, purges",
            log_appends_reads_purges::<S>,
        ),
        (
            "the log: snapshots and refused appends",
            log_snapshots_and_refusals::<S>,
        ),
        (
            "the log: purges inside one transaction's records",
            log_purges_inside_a_commit::<S>,
        ),
    ]
}

/// Runs every case, each on a fresh store from `fresh`.
pub fn run_all<S: Store>(fresh: impl Fn() -> S) {
    for (name, case) in cases::<S>() {
        let store = fresh();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&store)));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("conformance case '{name}' failed: {message}");
        }
    }
}

fn put_all<S: Store>(store: &S, pairs: &[(&[u8], &[u8])]) {
    let mut txn = store.begin().expect("begin");
    for (k, v) in pairs {
        txn.put(k, v).expect("put");
    }
    txn.commit().expect("commit");
}

fn read<S: Store>(store: &S, key: &[u8]) -> Option<Vec<u8>> {
    let snap = store.snapshot().expect("snapshot");
    snap.get(key).expect("get").map(|v| v.into_owned())
}

fn keys_in(view: &impl ReadTxn, start: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
    view.scan(start, end, usize::MAX)
        .expect("scan")
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

fn empty_store_reads_nothing<S: Store>(store: &S) {
    assert_eq!(read(store, b"a"), None, "get on an empty store");
    let snap = store.snapshot().expect("snapshot");
    assert!(
        keys_in(&snap, b"", b"").is_empty(),
        "full scan of an empty store"
    );
    assert!(!snap.any_in(b"\x00", b"").expect("any_in"));
}

fn put_get_overwrite<S: Store>(store: &S) {
    put_all(store, &[(b"k", b"one")]);
    assert_eq!(read(store, b"k").as_deref(), Some(&b"one"[..]));
    put_all(store, &[(b"k", b"two")]);
    assert_eq!(read(store, b"k").as_deref(), Some(&b"two"[..]), "overwrite");
    put_all(store, &[(b"empty-value", b"")]);
    assert_eq!(
        read(store, b"empty-value").as_deref(),
        Some(&b""[..]),
        "empty value is kept"
    );
}

fn delete_reports_existence<S: Store>(store: &S) {
    put_all(store, &[(b"k", b"v")]);
    let mut txn = store.begin().expect("begin");
    assert!(
        txn.delete(b"k").expect("delete"),
        "delete of a present key returns true"
    );
    assert!(
        !txn.delete(b"k").expect("delete"),
        "second delete returns false"
    );
    assert!(
        !txn.delete(b"never").expect("delete"),
        "delete of an absent key"
    );
    txn.commit().expect("commit");
    assert_eq!(read(store, b"k"), None);
}

fn commit_publishes_drop_discards<S: Store>(store: &S) {
    {
        let mut txn = store.begin().expect("begin");
        txn.put(b"dropped", b"x").expect("put");
    }
    assert_eq!(
        read(store, b"dropped"),
        None,
        "a dropped transaction leaves nothing"
    );
    let mut txn = store.begin().expect("begin");
    txn.put(b"kept", b"y").expect("put");
    assert_eq!(
        read(store, b"kept"),
        None,
        "uncommitted write is invisible to others"
    );
    txn.commit().expect("commit");
    assert_eq!(read(store, b"kept").as_deref(), Some(&b"y"[..]));
}

fn snapshots_are_isolated<S: Store>(store: &S) {
    put_all(store, &[(b"a", b"1")]);
    let before = store.snapshot().expect("snapshot");
    put_all(store, &[(b"a", b"2"), (b"b", b"3")]);
    assert_eq!(before.get(b"a").expect("get").as_deref(), Some(&b"1"[..]));
    assert_eq!(before.get(b"b").expect("get"), None);
    assert_eq!(keys_in(&before, b"", b""), vec![b"a".to_vec()]);
    assert_eq!(read(store, b"a").as_deref(), Some(&b"2"[..]));
}

fn txn_reads_own_writes<S: Store>(store: &S) {
    put_all(store, &[(b"a", b"1"), (b"c", b"3")]);
    let mut txn = store.begin().expect("begin");
    txn.put(b"b", b"2").expect("put");
    txn.delete(b"c").expect("delete");
    assert_eq!(txn.get(b"b").expect("get").as_deref(), Some(&b"2"[..]));
    assert_eq!(txn.get(b"c").expect("get"), None);
    assert_eq!(keys_in(&txn, b"", b""), vec![b"a".to_vec(), b"b".to_vec()]);
    txn.commit().expect("commit");
}

fn reads_ahead_change_no_answer<S: Store>(store: &S) {
    put_all(store, &[(b"a", b"1"), (b"c", b"3")]);
    let many: Vec<Vec<u8>> = (0u32..300)
        .map(|i| [b"m".as_slice(), &i.to_be_bytes()].concat())
        .collect();
    {
        let mut txn = store.begin().expect("begin");
        for (i, k) in many.iter().enumerate().filter(|(i, _)| i % 3 != 0) {
            txn.put(k, &(i as u32).to_le_bytes()).expect("put");
        }
        txn.commit().expect("commit");
    }
    let before = store.snapshot().expect("snapshot");
    let mut txn = store.begin().expect("begin");
    txn.put(b"b", b"2").expect("put");
    txn.delete(b"c").expect("delete");
    let mut wanted: Vec<Vec<u8>> = [b"a", b"b", b"c", b"d", b"a"]
        .iter()
        .map(|k| k.to_vec())
        .collect();
    wanted.extend(many.iter().cloned());
    // Ranges: one that holds pairs (and this transaction's writes), one empty, one larger
    // than a store reads ahead.
    txn.put(b"m\x00\x00\x00\x05x", b"w").expect("put");
    let ranges = vec![
        (b"a".to_vec(), b"d".to_vec()),
        (b"x".to_vec(), b"y".to_vec()),
        (b"m".to_vec(), b"n".to_vec()),
    ];
    txn.prefetch(&wanted, &ranges).expect("prefetch");
    for (start, end) in &ranges {
        let mut expected = keys_in(&before, start, end);
        if start == b"m" {
            expected.push(b"m\x00\x00\x00\x05x".to_vec());
            expected.sort();
        }
        if start == b"a" {
            expected = vec![b"a".to_vec(), b"b".to_vec()];
        }
        assert_eq!(keys_in(&txn, start, end), expected, "range {start:?}");
    }
    assert_eq!(txn.get(b"a").expect("get").as_deref(), Some(&b"1"[..]));
    assert_eq!(
        txn.get(b"b").expect("get").as_deref(),
        Some(&b"2"[..]),
        "own write"
    );
    assert_eq!(txn.get(b"c").expect("get"), None, "own delete");
    assert_eq!(txn.get(b"d").expect("get"), None);
    for k in &many {
        assert_eq!(
            txn.get(k).expect("get").map(|v| v.into_owned()),
            before.get(k).expect("get").map(|v| v.into_owned()),
        );
    }
    // Writes after the read ahead are seen over it.
    txn.put(b"a", b"9").expect("put");
    assert_eq!(txn.get(b"a").expect("get").as_deref(), Some(&b"9"[..]));
    txn.commit().expect("commit");
    assert_eq!(read(store, b"a").as_deref(), Some(&b"9"[..]));
    assert_eq!(read(store, b"b").as_deref(), Some(&b"2"[..]));
    assert_eq!(read(store, b"c"), None);
}

fn visit_is_ordered_and_bounded<S: Store>(store: &S) {
    put_all(
        store,
        &[
            (b"b", b""),
            (b"a", b""),
            (b"ba", b""),
            (b"c", b""),
            (b"bb", b""),
        ],
    );
    let snap = store.snapshot().expect("snapshot");
    let all: Vec<Vec<u8>> = ["a", "b", "ba", "bb", "c"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    assert_eq!(keys_in(&snap, b"", b""), all, "full scan in key order");
    assert_eq!(
        keys_in(&snap, b"b", b"bb"),
        all[1..3].to_vec(),
        "start inclusive, end exclusive"
    );
    assert_eq!(keys_in(&snap, b"b", b"c"), all[1..4].to_vec());
    assert_eq!(
        keys_in(&snap, b"bz", b""),
        all[4..].to_vec(),
        "empty end is unbounded"
    );
    assert!(
        keys_in(&snap, b"c", b"b").is_empty(),
        "start past end is empty"
    );
    let mut seen = Vec::new();
    let visited = snap
        .visit(b"", b"", &mut |k, _| {
            seen.push(k.to_vec());
            if seen.len() == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .expect("visit");
    assert_eq!(visited, 2, "Break stops the visit");
    assert_eq!(seen, all[..2].to_vec());
}

fn last_in_a_range<S: Store>(store: &S) {
    put_all(
        store,
        &[(b"a1", b"1"), (b"a2", b"2"), (b"b1", b"3"), (b"c", b"4")],
    );
    let snap = store.snapshot().expect("snapshot");
    let last = |s: &[u8], e: &[u8]| snap.last_in(s, e).expect("last_in").map(|(k, _)| k);
    assert_eq!(last(b"a", b"b"), Some(b"a2".to_vec()));
    assert_eq!(last(b"a", b""), Some(b"c".to_vec()), "empty end: unbounded");
    assert_eq!(
        last(b"", b"b1"),
        Some(b"a2".to_vec()),
        "the end is excluded"
    );
    assert_eq!(last(b"b2", b"c"), None);
    assert_eq!(last(b"c", b"a"), None, "an empty range");
    let mut txn = store.begin().expect("begin");
    txn.put(b"a3", b"5").expect("put");
    assert_eq!(
        txn.last_in(b"a", b"b").expect("last_in"),
        Some((b"a3".to_vec(), b"5".to_vec())),
        "a transaction sees its own writes"
    );
}

fn append_at_the_end<S: Store>(store: &S) {
    put_all(store, &[(b"a", b"1"), (b"m", b"2")]);
    let mut txn = store.begin().expect("begin");
    txn.append(b"x\x00\x01", b"3")
        .expect("append above everything");
    txn.append(b"x\x00\x02", b"4").expect("and again");
    assert!(
        matches!(txn.append(b"x\x00\x02", b"5"), Err(StoreError::Limit(_))),
        "not above"
    );
    assert!(
        matches!(txn.append(b"b", b"6"), Err(StoreError::Limit(_))),
        "in the middle"
    );
    assert_eq!(
        txn.get(b"x\x00\x02").expect("get").as_deref(),
        Some(&b"4"[..])
    );
    txn.commit().expect("commit");
    assert_eq!(read(store, b"b"), None, "a refused append wrote nothing");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        keys_in(&snap, b"x", b""),
        [b"x\x00\x01".to_vec(), b"x\x00\x02".to_vec()]
    );
}

fn scan_honours_limit<S: Store>(store: &S) {
    let keys: Vec<Vec<u8>> = (0u32..100).map(|i| i.to_be_bytes().to_vec()).collect();
    let mut txn = store.begin().expect("begin");
    for k in &keys {
        txn.put(k, k).expect("put");
    }
    txn.commit().expect("commit");
    let snap = store.snapshot().expect("snapshot");
    let page = snap.scan(&keys[10], b"", 7).expect("scan");
    assert_eq!(page.len(), 7);
    assert_eq!(page[0].0, keys[10]);
    assert_eq!(page[6].1, keys[16], "values come with their keys");
    assert!(snap.scan(b"", b"", 0).expect("scan").is_empty(), "limit 0");
}

fn atomic_add<S: Store>(store: &S) {
    let mut txn = store.begin().expect("begin");
    assert_eq!(
        txn.add(b"n", 5).expect("add"),
        5,
        "absent counter starts at 0"
    );
    assert_eq!(txn.add(b"n", 10).expect("add"), 15);
    assert_eq!(txn.add(b"n", -3).expect("add"), 12);
    assert!(
        matches!(txn.add(b"n", -13), Err(StoreError::Counter { .. })),
        "going below zero is refused"
    );
    assert_eq!(
        txn.add(b"n", 0).expect("add"),
        12,
        "a refused add changes nothing"
    );
    txn.put(b"big", &u64::MAX.to_le_bytes()).expect("put");
    assert!(
        matches!(txn.add(b"big", 1), Err(StoreError::Counter { .. })),
        "overflow"
    );
    txn.put(b"bad", b"abc").expect("put");
    assert!(
        matches!(txn.add(b"bad", 1), Err(StoreError::Counter { .. })),
        "malformed"
    );
    txn.commit().expect("commit");
    assert_eq!(
        read(store, b"n"),
        Some(12u64.to_le_bytes().to_vec()),
        "counter is little-endian"
    );
}

fn limits_are_enforced<S: Store>(store: &S) {
    let mut txn = store.begin().expect("begin");
    assert!(
        matches!(txn.put(b"", b"v"), Err(StoreError::Limit(_))),
        "empty key"
    );
    let long = vec![b'k'; KEY_LEN_MAX + 1];
    assert!(
        matches!(txn.put(&long, b"v"), Err(StoreError::Limit(_))),
        "key too long"
    );
    let longest = vec![b'k'; KEY_LEN_MAX];
    txn.put(&longest, b"v")
        .expect("a key of KEY_LEN_MAX bytes is accepted");
    txn.commit().expect("commit");
    assert_eq!(read(store, &longest).as_deref(), Some(&b"v"[..]));
}

fn binary_keys_and_prefix_ends<S: Store>(store: &S) {
    put_all(
        store,
        &[
            (b"\x01\x00", b"a"),
            (b"\x01\xff", b"b"),
            (b"\x01\xff\xff", b"c"),
            (b"\x02", b"d"),
            (b"\xff\xff", b"e"),
        ],
    );
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(prefix_end(b"\x01"), b"\x02".to_vec());
    assert_eq!(prefix_end(b"\x01\xff"), b"\x02".to_vec());
    assert_eq!(prefix_end(b"\xff\xff"), Vec::<u8>::new());
    assert_eq!(
        keys_in(&snap, b"\x01", &prefix_end(b"\x01")).len(),
        3,
        "prefix range"
    );
    assert_eq!(
        keys_in(&snap, b"\xff", &prefix_end(b"\xff")).len(),
        1,
        "last prefix"
    );
}

fn large_batch_commits_whole<S: Store>(store: &S) {
    let mut txn = store.begin().expect("begin");
    for i in 0u32..20_000 {
        txn.put(&i.to_be_bytes(), &[7u8; 64]).expect("put");
    }
    txn.commit().expect("commit");
    let snap = store.snapshot().expect("snapshot");
    assert_eq!(
        snap.visit(b"", b"", &mut |_, _| ControlFlow::Continue(()))
            .expect("visit"),
        20_000
    );
}

/// The log's records with `index >= from` (owned), in the order visited.
fn log_records(view: &impl ReadTxn, from: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    view.log_visit(from, &mut |index, record| {
        out.push((index, record.to_vec()));
        ControlFlow::Continue(())
    })
    .expect("log visit");
    out
}

/// The indices of the log's records, in the order visited.
fn log_indices(view: &impl ReadTxn) -> Vec<u64> {
    log_records(view, 0).iter().map(|(i, _)| *i).collect()
}

fn record_of(index: u64) -> Vec<u8> {
    format!("record {index}").into_bytes()
}

fn log_appends_reads_purges<S: Store>(store: &S) {
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.log_first().unwrap(), None, "an empty log has no first");
    assert_eq!(snap.log_last().unwrap(), None, "an empty log has no last");
    assert!(log_records(&snap, 0).is_empty());
    drop(snap);

    // Appends beside ordinary writes, seen by the transaction itself before commit.
    let mut txn = store.begin().unwrap();
    txn.put(b"k", b"v").unwrap();
    for index in 1..=5 {
        txn.log_append(index, &record_of(index)).unwrap();
    }
    assert_eq!(txn.log_last().unwrap(), Some(5), "own appends are visible");
    assert_eq!(log_records(&txn, 4).len(), 2);
    assert!(
        log_records(&store.snapshot().unwrap(), 0).is_empty(),
        "not before commit"
    );
    txn.commit().unwrap();

    // A second commit, with records of every size up to the limit.
    let mut txn = store.begin().unwrap();
    txn.log_append(6, &vec![6u8; 64 << 10]).unwrap();
    txn.log_append(7, b"x").unwrap();
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    let all = log_records(&snap, 0);
    assert_eq!(
        all.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (1..=7).collect::<Vec<_>>(),
        "records in index order"
    );
    assert_eq!(all[2].1, record_of(3));
    assert_eq!(all[5].1.len(), 64 << 10);
    assert_eq!(all[6].1, b"x");
    assert_eq!(log_records(&snap, 7).len(), 1, "visit starts at from");
    let mut seen = 0;
    let visited = snap
        .log_visit(2, &mut |_, _| {
            seen += 1;
            if seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((seen, visited), (2, 2), "Break stops the visit");
    assert_eq!(
        (snap.log_first().unwrap(), snap.log_last().unwrap()),
        (Some(1), Some(7))
    );
    drop(snap);

    // A purge takes the head, inside the transaction first, for everyone after commit.
    let mut txn = store.begin().unwrap();
    txn.log_purge(1, 3).unwrap();
    assert_eq!(txn.log_first().unwrap(), Some(4));
    assert_eq!(log_records(&txn, 0).first().map(|r| r.0), Some(4));
    txn.log_append(8, &record_of(8)).unwrap();
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(log_indices(&snap), vec![4, 5, 6, 7, 8]);
    assert_eq!(
        read(store, b"k").as_deref(),
        Some(&b"v"[..]),
        "the keyspace is untouched"
    );
    drop(snap);

    // Purging everything leaves no record; the next index goes on.
    let mut txn = store.begin().unwrap();
    txn.log_purge(4, 8).unwrap();
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(
        (snap.log_first().unwrap(), snap.log_last().unwrap()),
        (None, None)
    );
    drop(snap);
    let mut txn = store.begin().unwrap();
    txn.log_append(9, &record_of(9)).unwrap();
    txn.commit().unwrap();
    assert_eq!(
        log_records(&store.snapshot().unwrap(), 0),
        vec![(9, record_of(9))]
    );

    // A purge takes records appended by its own transaction too; the transaction's reads of
    // the first and the last see it, and so does everyone after the commit.
    let mut txn = store.begin().unwrap();
    txn.log_append(10, &record_of(10)).unwrap();
    txn.log_append(11, &record_of(11)).unwrap();
    txn.log_purge(9, 10).unwrap();
    assert_eq!(
        (txn.log_first().unwrap(), txn.log_last().unwrap()),
        (Some(11), Some(11))
    );
    assert_eq!(log_indices(&txn), vec![11]);
    txn.commit().unwrap();
    assert_eq!(log_indices(&store.snapshot().unwrap()), vec![11]);
    let mut txn = store.begin().unwrap();
    txn.log_purge(11, 11).unwrap();
    assert_eq!(
        (txn.log_first().unwrap(), txn.log_last().unwrap()),
        (None, None),
        "a log purged whole inside the transaction has no last"
    );
    txn.log_append(12, &record_of(12)).unwrap();
    txn.commit().unwrap();
    assert_eq!(
        log_records(&store.snapshot().unwrap(), 0),
        vec![(12, record_of(12))]
    );
}

fn log_snapshots_and_refusals<S: Store>(store: &S) {
    let mut txn = store.begin().unwrap();
    txn.log_append(10, &record_of(10)).unwrap();
    txn.commit().unwrap();
    let before = store.snapshot().unwrap();

    let mut txn = store.begin().unwrap();
    txn.log_append(11, &record_of(11)).unwrap();
    // Refused: not above the last index, empty, too large. Each changes nothing.
    assert!(matches!(
        txn.log_append(11, b"again"),
        Err(StoreError::Limit(_))
    ));
    assert!(matches!(
        txn.log_append(3, b"below"),
        Err(StoreError::Limit(_))
    ));
    assert!(matches!(txn.log_append(12, b""), Err(StoreError::Limit(_))));
    assert!(matches!(
        txn.log_append(12, &vec![0; VALUE_LEN_MAX + 1]),
        Err(StoreError::Limit(_))
    ));
    txn.log_append(12, &record_of(12)).unwrap();
    txn.commit().unwrap();
    assert_eq!(
        log_records(&before, 0),
        vec![(10, record_of(10))],
        "a snapshot does not see later appends"
    );
    assert_eq!(before.log_last().unwrap(), Some(10));
    drop(before);

    // A dropped transaction leaves the log as it was.
    let mut txn = store.begin().unwrap();
    txn.log_append(13, &record_of(13)).unwrap();
    txn.log_purge(10, 12).unwrap();
    drop(txn);
    let snap = store.snapshot().unwrap();
    assert_eq!(log_indices(&snap), vec![10, 11, 12]);
    drop(snap);
    let mut txn = store.begin().unwrap();
    txn.log_append(13, &record_of(13)).unwrap();
    txn.commit().unwrap();
    assert_eq!(store.snapshot().unwrap().log_last().unwrap(), Some(13));
}

/// Records appended together (which a store may keep together) purged in their middle, by a
/// later transaction and by their own; reads from inside them; many and large ones at once.
fn log_purges_inside_a_commit<S: Store>(store: &S) {
    let mut txn = store.begin().unwrap();
    for index in 20..=29 {
        txn.log_append(index, &record_of(index)).unwrap();
    }
    txn.commit().unwrap();
    let before = store.snapshot().unwrap();
    assert_eq!(log_indices(&before), (20..=29).collect::<Vec<_>>());
    assert_eq!(
        log_records(&before, 25),
        (25..=29).map(|i| (i, record_of(i))).collect::<Vec<_>>()
    );

    let mut txn = store.begin().unwrap();
    txn.log_purge(20, 24).unwrap();
    assert_eq!(txn.log_first().unwrap(), Some(25));
    assert_eq!(log_records(&txn, 22).first().map(|r| r.0), Some(25));
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(
        (snap.log_first().unwrap(), snap.log_last().unwrap()),
        (Some(25), Some(29))
    );
    assert_eq!(log_indices(&snap), (25..=29).collect::<Vec<_>>());
    assert_eq!(
        log_records(&snap, 27),
        (27..=29).map(|i| (i, record_of(i))).collect::<Vec<_>>()
    );
    assert_eq!(
        log_indices(&before),
        (20..=29).collect::<Vec<_>>(),
        "a snapshot keeps what was purged after it"
    );
    drop((snap, before));

    // Appended and cut in two by the same transaction.
    let mut txn = store.begin().unwrap();
    for index in 30..=33 {
        txn.log_append(index, &record_of(index)).unwrap();
    }
    txn.log_purge(25, 31).unwrap();
    txn.log_append(34, &record_of(34)).unwrap();
    assert_eq!(log_indices(&txn), vec![32, 33, 34]);
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(
        log_records(&snap, 0),
        (32..=34).map(|i| (i, record_of(i))).collect::<Vec<_>>()
    );
    assert_eq!(snap.log_first().unwrap(), Some(32));
    drop(snap);

    // Many records, some large, in one transaction; purged a piece at a time.
    let large = |index: u64| vec![(index % 251) as u8; 5000 + index as usize];
    let mut txn = store.begin().unwrap();
    for index in 35..=100 {
        txn.log_append(index, &large(index)).unwrap();
    }
    txn.commit().unwrap();
    for upto in [36, 50, 77, 99] {
        let mut txn = store.begin().unwrap();
        let first = txn.log_first().unwrap().unwrap();
        txn.log_purge(first, upto).unwrap();
        txn.commit().unwrap();
        let snap = store.snapshot().unwrap();
        assert_eq!(snap.log_first().unwrap(), Some(upto + 1));
        assert_eq!(snap.log_last().unwrap(), Some(100));
        let all = log_records(&snap, 0);
        assert_eq!(
            all.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (upto + 1..=100).collect::<Vec<_>>()
        );
        assert!(all.iter().all(|(i, record)| *record == large(*i)));
    }
    let mut txn = store.begin().unwrap();
    txn.log_purge(100, 100).unwrap();
    txn.commit().unwrap();
    let snap = store.snapshot().unwrap();
    assert_eq!(
        (snap.log_first().unwrap(), snap.log_last().unwrap()),
        (None, None)
    );
}
