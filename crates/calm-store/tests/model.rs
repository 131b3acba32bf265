//! Model-based test: random transactions run against LMDB and against the in-memory model side
//! by side; every read answer and the final contents must agree.

use std::collections::BTreeMap;

use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::{ReadTxn, Store, WriteTxn};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Add(Vec<u8>, i64),
    Get(Vec<u8>),
    Scan(Vec<u8>, Vec<u8>, usize),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 0x7f, 0xff]), 1..4)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (key(), prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(k, v)| Op::Put(k, v)),
        key().prop_map(Op::Delete),
        (key(), -5i64..5).prop_map(|(k, d)| Op::Add(k, d)),
        key().prop_map(Op::Get),
        (
            prop::collection::vec(any::<u8>(), 0..3),
            prop::collection::vec(any::<u8>(), 0..3),
            0usize..6
        )
            .prop_map(|(s, e, l)| Op::Scan(s, e, l)),
    ]
}

/// A transaction: its operations, and whether it commits (true) or is dropped.
fn txn() -> impl Strategy<Value = (Vec<Op>, bool)> {
    (
        prop::collection::vec(op(), 1..12),
        prop::bool::weighted(0.8),
    )
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn model_scan(map: &Model, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    map.iter()
        .filter(|(k, _)| k.as_slice() >= start && (end.is_empty() || k.as_slice() < end))
        .take(limit)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Applies `op` to the model; returns the answer the store must give (as a comparable string).
fn model_apply(map: &mut Model, op: &Op) -> String {
    match op {
        Op::Put(k, v) => {
            map.insert(k.clone(), v.clone());
            "ok".into()
        }
        Op::Delete(k) => format!("{}", map.remove(k).is_some()),
        Op::Add(k, d) => {
            let old = match map.get(k) {
                None => Some(0u64),
                Some(v) => v.as_slice().try_into().ok().map(u64::from_le_bytes),
            };
            match old.and_then(|o| o.checked_add_signed(*d)) {
                Some(new) => {
                    map.insert(k.clone(), new.to_le_bytes().to_vec());
                    format!("{new}")
                }
                None => "counter error".into(),
            }
        }
        Op::Get(k) => format!("{:?}", map.get(k)),
        Op::Scan(s, e, l) => format!("{:?}", model_scan(map, s, e, *l)),
    }
}

fn store_apply<T: WriteTxn>(txn: &mut T, op: &Op) -> String {
    match op {
        Op::Put(k, v) => txn.put(k, v).map(|_| "ok".to_string()).unwrap(),
        Op::Delete(k) => format!("{}", txn.delete(k).unwrap()),
        Op::Add(k, d) => match txn.add(k, *d) {
            Ok(new) => format!("{new}"),
            Err(calm_store::StoreError::Counter { .. }) => "counter error".into(),
            Err(other) => panic!("unexpected {other}"),
        },
        Op::Get(k) => format!("{:?}", txn.get(k).unwrap().map(|v| v.into_owned())),
        Op::Scan(s, e, l) => format!("{:?}", txn.scan(s, e, *l).unwrap()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn lmdb_matches_the_model(txns in prop::collection::vec(txn(), 1..10)) {
        let dir = tempfile::tempdir().unwrap();
        let store = LmdbStore::open(dir.path(), &LmdbOptions::default()).unwrap();
        let mut committed = Model::new();
        for (ops, commit) in &txns {
            let mut model = committed.clone();
            let mut txn = store.begin().unwrap();
            for op in ops {
                let expected = model_apply(&mut model, op);
                let got = store_apply(&mut txn, op);
                prop_assert_eq!(got, expected, "op {:?}", op);
            }
            if *commit {
                txn.commit().unwrap();
                committed = model;
            }
        }
        let snap = store.snapshot().unwrap();
        let all = snap.scan(b"", b"", usize::MAX).unwrap();
        prop_assert_eq!(all, model_scan(&committed, b"", b"", usize::MAX));
    }
}
