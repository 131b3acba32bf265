//! Objects an online gc collected: once marked, no write, append or compaction names them
//! (the mutation is refused and changes nothing), a mark taken away lets them be named again,
//! and fsck reports a record that names a marked object.

use std::sync::Arc;

use calm_meta::slices::Slice;
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;

fn object(id: u64, len: u32) -> Slice {
    Slice {
        id,
        size: len,
        off: 0,
        len,
        pos: 0,
    }
}

#[tokio::test]
async fn a_collected_object_is_never_named_again() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let file = meta.create(ROOT, b"f", 0o644).await.unwrap().handle;
    let first = meta.alloc_slices(3).await.unwrap();
    meta.mark_collected(vec![first, first + 1], true)
        .await
        .unwrap();
    let before = store.dump();
    let refused = meta
        .write(
            Caller::default(),
            file,
            vec![(0, object(first, 4096))],
            0,
            vec![],
        )
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), ESTALE, "{refused}");
    let refused = meta
        .append(Caller::default(), file, first + 1, 4096, None)
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), ESTALE, "{refused}");
    assert_eq!(store.dump(), before, "a refused mutation changes nothing");

    // An object not marked is named as always; a mark taken away frees the other.
    meta.write(
        Caller::default(),
        file,
        vec![(0, object(first + 2, 4096))],
        0,
        vec![],
    )
    .await
    .unwrap();
    meta.mark_collected(vec![first], false).await.unwrap();
    meta.write(
        Caller::default(),
        file,
        vec![(0, object(first, 100))],
        0,
        vec![],
    )
    .await
    .unwrap();
    let fsck = calm_meta::fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(fsck.is_clean(), "{:?}", fsck.problems);

    // A named object marked (what gc's second look undoes) is what fsck reports.
    meta.mark_collected(vec![first + 2], true).await.unwrap();
    let fsck = calm_meta::fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(
        fsck.problems
            .iter()
            .any(|p| p.contains("calm gc collected")),
        "{:?}",
        fsck.problems
    );
    // Only objects are marked.
    assert!(
        meta.mark_collected(vec![slices::INLINE | 5], true)
            .await
            .is_err()
    );
}

const ESTALE: i32 = 116;
