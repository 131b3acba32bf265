//! Handles granted in advance: a client's mount makes nodes with the handles the server
//! granted it, in order, each once, and no other client may use them; the grants outlive a
//! restart. Checked against a model (the ranges granted and the next handle of each), with
//! fsck clean at every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use calm_meta::ops::Op;
use calm_meta::ops::grants::{
    GRANT_HANDLES_MAX, GRANTS_PER_CLIENT_MAX, GrantRecord, TAG_GRANT, expired, grant_key,
};
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_store::{ReadTxn, Store, WriteTxn};
use calm_testkit::fsck_clean;
use proptest::prelude::*;

fn make(name: String, client: u64, handle: Handle) -> Op {
    let mut node = NewNode::file(0o644, 0, 0);
    node.granted = Some(Granted { handle, client });
    Op::Make {
        parent: ROOT,
        name: name.into_bytes(),
        node,
        exclusive: true,
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Client 1 or 2 asks for this many handles.
    Grant(u64, u64),
    /// A client makes a node with the handle at this offset from its oldest grant's next one
    /// (0: the next), or with one of the other client's. A handle below the next one (used
    /// or skipped) never makes a node again: the model's `next` only grows.
    Make(u64, u64, bool),
    /// The server restarts.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u64..3, 1u64..5).prop_map(|(c, n)| Step::Grant(c, n)),
        6 => (1u64..3, prop_oneof![4 => Just(0u64), 1 => 0u64..4], prop::bool::weighted(0.15))
            .prop_map(|(c, off, other)| Step::Make(c, off, other)),
        1 => Just(Step::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn granted_handles_make_nodes_once_in_order_for_their_client_alone(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = Arc::new(MemStore::new());
        let mut meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
        // The model: per client, its grants by first handle → (next, end).
        let mut grants: BTreeMap<u64, BTreeMap<Handle, (Handle, Handle)>> = BTreeMap::new();
        let mut made = 0u64;
        for step in steps {
            match step {
                Step::Grant(client, count) => {
                    let held = grants.entry(client).or_default();
                    let got = rt.block_on(meta.grant_handles(Caller::default(), client, count));
                    if held.len() >= GRANTS_PER_CLIENT_MAX {
                        prop_assert!(got.is_err(), "a grant past the limit");
                    } else {
                        let first = got.unwrap();
                        prop_assert!(grants.values().flat_map(|g| g.values())
                            .all(|&(next, end)| first + count <= next || first >= end),
                            "a grant overlaps another");
                        grants.entry(client).or_default().insert(first, (first, first + count));
                    }
                }
                Step::Make(client, offset, other) => {
                    let owner = if other { 3 - client } else { client };
                    let Some(&(next, _)) = grants.get(&owner).and_then(|g| g.values().next()) else {
                        continue;
                    };
                    let handle = next + offset;
                    made += 1;
                    let got = rt.block_on(meta.apply_as(Caller::default(), make(format!("f{made}"), client, handle)));
                    // Any handle of one of the client's grants from that grant's next one on
                    // (a mount may skip some), by that client alone. A handle picked past the
                    // other client's grant may land in one of the client's own: judged by the
                    // handle, not by where it was picked from.
                    let mine = grants.entry(client).or_default();
                    let grant = mine.iter().find(|&(_, &(next, end))| next <= handle && handle < end);
                    let grant = grant.map(|(&first, &(_, end))| (first, end));
                    prop_assert_eq!(got.is_ok(), grant.is_some(), "make with handle {} by {}: {:?}", handle, client, got);
                    if let Some((first, end)) = grant {
                        let attr = meta.lookup(ROOT, format!("f{made}").as_bytes()).unwrap();
                        prop_assert_eq!(attr.handle, handle);
                        if handle + 1 == end {
                            mine.remove(&first);
                        } else {
                            mine.insert(first, (handle + 1, end));
                        }
                    }
                }
                Step::Restart => {
                    drop(meta);
                    meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
                }
            }
            fsck_clean(&store);
        }
        // Handles the server picks are none of those granted.
        let attr = rt.block_on(meta.create(ROOT, b"picked", 0o644)).unwrap();
        prop_assert!(grants.values().flat_map(|g| g.values()).all(|&(next, end)| attr.handle < next || attr.handle >= end));
    }
}

#[tokio::test]
async fn a_grant_is_refused_past_its_size_and_a_node_keeps_its_granted_handle_after_a_restart() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    for count in [0, GRANT_HANDLES_MAX + 1] {
        assert_eq!(
            meta.grant_handles(Caller::default(), 7, count)
                .await
                .unwrap_err()
                .errno(),
            22
        );
    }
    let first = meta.grant_handles(Caller::default(), 7, 2).await.unwrap();
    drop(meta);
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    meta.apply_as(Caller::default(), make("a".into(), 7, first))
        .await
        .unwrap();
    meta.apply_as(Caller::default(), make("b".into(), 7, first + 1))
        .await
        .unwrap();
    // The last handle used, the grant is gone: no key left of it.
    assert_eq!(
        meta.apply_as(Caller::default(), make("c".into(), 7, first + 1))
            .await
            .unwrap_err()
            .errno(),
        22
    );
    assert_eq!(meta.lookup(ROOT, b"b").unwrap().handle, first + 1);
    fsck_clean(&store);
}

fn grant_keys(store: &MemStore) -> Vec<Vec<u8>> {
    let view = store.snapshot().unwrap();
    let mut keys = Vec::new();
    view.visit(&grant_key(0, 0), &[TAG_GRANT + 1], &mut |k, _| {
        keys.push(k.to_vec());
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    keys
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A grant found unused by a sweep and used before its deletion is applied stays (its use
/// wrote a later time); one still unused goes; one written before grants kept a time counts
/// as used when the sweep began.
#[tokio::test]
async fn a_sweep_forgets_the_grants_still_unused_when_it_deletes_them() {
    let store = Arc::new(MemStore::new());
    let options = MetaOptions {
        grants_unused_kept: std::time::Duration::ZERO,
        ..MetaOptions::default()
    };
    let meta = Meta::open(store.clone(), options).unwrap();
    let idle = meta.grant_handles(Caller::default(), 1, 4).await.unwrap();
    let busy = meta.grant_handles(Caller::default(), 2, 4).await.unwrap();
    // A grant as a store written before the time was kept holds it: 16 bytes.
    let mut txn = store.begin().unwrap();
    let legacy = GrantRecord {
        next: busy + 100,
        end: busy + 104,
        used_ns: None,
    }
    .encode();
    txn.put(&grant_key(3, busy + 100), &legacy[..16]).unwrap();
    txn.commit().unwrap();

    let before_ns = now_ns() + 1;
    let started_ns = before_ns + 1_000_000_000;
    let (old, next) = expired(
        &store.snapshot().unwrap(),
        &grant_key(0, 0),
        before_ns,
        started_ns,
    )
    .unwrap();
    assert_eq!(next, None);
    assert_eq!(
        old,
        vec![grant_key(1, idle), grant_key(2, busy)],
        "the legacy one is young"
    );
    let (old, _) = expired(&store.snapshot().unwrap(), &grant_key(0, 0), before_ns, 0).unwrap();
    assert_eq!(old.len(), 3, "the legacy one counted as used at 0");

    // Client 2 uses its grant after the sweep found it.
    meta.apply_as(Caller::default(), make("b".into(), 2, busy))
        .await
        .unwrap();
    let keys = vec![grant_key(1, idle), grant_key(2, busy)];
    let forget = Op::ForgetGrants {
        keys,
        before_ns,
        unknown_ns: started_ns,
    };
    meta.apply_as(Caller::default(), forget).await.unwrap();
    assert_eq!(
        grant_keys(&store),
        vec![
            grant_key(2, busy).to_vec(),
            grant_key(3, busy + 100).to_vec()
        ]
    );
    meta.apply_as(Caller::default(), make("c".into(), 2, busy + 1))
        .await
        .unwrap();
    assert_eq!(
        meta.apply_as(Caller::default(), make("a".into(), 1, idle))
            .await
            .unwrap_err()
            .errno(),
        22,
        "a make with a grant forgotten"
    );
    fsck_clean(&store);
}

/// The housekeeping thread forgets a grant nobody uses, and keeps one in use.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_forgets_grants_unused_for_as_long_as_it_keeps_them() {
    let store = Arc::new(MemStore::new());
    let kept = std::time::Duration::from_secs(2);
    let options = MetaOptions {
        grants_unused_kept: kept,
        ..MetaOptions::default()
    };
    let meta = Meta::open(store.clone(), options).unwrap();
    let idle = meta.grant_handles(Caller::default(), 1, 4).await.unwrap();
    let busy = meta
        .grant_handles(Caller::default(), 2, 1000)
        .await
        .unwrap();
    let start = std::time::Instant::now();
    let mut used = 0;
    while grant_keys(&store).contains(&grant_key(1, idle).to_vec()) {
        assert!(
            start.elapsed() < 10 * kept,
            "a grant unused for 20 s still kept"
        );
        meta.apply_as(Caller::default(), make(format!("f{used}"), 2, busy + used))
            .await
            .unwrap();
        used += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        start.elapsed() >= kept,
        "forgotten before it was unused for {kept:?}"
    );
    assert!(
        grant_keys(&store).contains(&grant_key(2, busy).to_vec()),
        "a grant in use forgotten"
    );
    meta.apply_as(Caller::default(), make("last".into(), 2, busy + used))
        .await
        .unwrap();
    fsck_clean(&store);
}
