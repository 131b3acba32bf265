//! Orphans: a file that loses its last name while the remover's mount has it open stays whole
//! until that mount releases it, or until its session is declared gone; then it is destroyed
//! and its objects queued for deletion. fsck is clean at every step.

use std::sync::Arc;

use calm_meta::ops::{Done, Op};
use calm_meta::slices::Slice;
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_testkit::fsck_clean;

fn caller(session: u64) -> Caller {
    Caller {
        session,
        uid: 0,
        gid: 0,
        ..Caller::default()
    }
}

fn queued(meta: &Meta<Arc<MemStore>>) -> Vec<u64> {
    meta.garbage(u64::MAX, usize::MAX)
        .unwrap()
        .iter()
        .map(|g| g.id)
        .collect()
}

/// A file with one 100-byte object, `id`.
async fn file_with_object(meta: &Meta<Arc<MemStore>>, name: &[u8]) -> (Handle, u64) {
    let handle = meta.create(ROOT, name, 0o644).await.unwrap().handle;
    let id = meta.alloc_slices(1).await.unwrap();
    let slice = Slice {
        id,
        size: 100,
        off: 0,
        len: 100,
        pos: 0,
    };
    meta.write(Caller::default(), handle, vec![(0, slice)], 0, Vec::new())
        .await
        .unwrap();
    (handle, id)
}

#[tokio::test]
async fn an_open_file_outlives_its_last_name_until_released() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let (a, a_id) = file_with_object(&meta, b"a").await;
    let (b, b_id) = file_with_object(&meta, b"b").await;
    let (c, c_id) = file_with_object(&meta, b"c").await;

    // Mount session 7 has a and b open; unlink a, rename c over b.
    let unlink = Op::Unlink {
        parent: ROOT,
        name: b"a".to_vec(),
        keep: vec![a, b],
    };
    let done = meta.apply_as(caller(7), unlink).await.unwrap();
    assert!(matches!(done, Done::Orphaned(h) if h == a), "{done:?}");
    let rename = Op::Rename {
        parent: ROOT,
        name: b"c".to_vec(),
        new_parent: ROOT,
        new_name: b"b".to_vec(),
        flags: 0,
        keep: vec![a, b],
    };
    let done = meta.apply_as(caller(7), rename).await.unwrap();
    assert!(matches!(done, Done::Orphaned(h) if h == b), "{done:?}");
    assert!(matches!(meta.lookup(ROOT, b"a"), Err(MetaError::NotFound)));
    assert_eq!(meta.lookup(ROOT, b"b").unwrap().handle, c);

    // Both stay whole: attributes with no links, their maps, writable; nothing queued.
    for handle in [a, b] {
        let attr = meta.getattr(handle).unwrap();
        assert_eq!((attr.nlink, attr.size), (0, 100));
        assert_eq!(
            meta.read_map(handle, 0, MAP_RECORDS_MAX)
                .unwrap()
                .chunks
                .len(),
            1
        );
    }
    meta.setattr(
        a,
        SetAttr {
            size: Some(50),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    assert!(queued(&meta).is_empty());
    assert_eq!(meta.orphans().unwrap(), vec![(a, 7), (b, 7)]);
    assert_eq!(fsck_clean(&store).orphans, 2);
    // An orphan gets no new name.
    assert!(matches!(
        meta.link(a, ROOT, b"again").await,
        Err(MetaError::NotFound)
    ));

    // Another session may not release it; its own may, once.
    let release = |handle| Op::ReleaseOrphan {
        handle,
        any_session: false,
    };
    let refused = meta.apply_as(caller(8), release(a)).await;
    assert!(
        matches!(refused, Err(MetaError::NotPermitted(_))),
        "{refused:?}"
    );
    meta.apply_as(caller(7), release(a)).await.unwrap();
    meta.apply_as(caller(7), release(a)).await.unwrap();
    assert!(matches!(meta.getattr(a), Err(MetaError::NotFound)));
    assert_eq!(queued(&meta), vec![a_id]);

    // A new session claims b; the old one's release is then refused; a sweep (any session)
    // destroys it.
    let claim = Op::ClaimOrphans {
        handles: vec![a, b],
    };
    meta.apply_as(caller(9), claim).await.unwrap();
    assert_eq!(meta.orphans().unwrap(), vec![(b, 9)]);
    assert!(meta.apply_as(caller(7), release(b)).await.is_err());
    meta.release_orphan(b).await.unwrap();
    assert!(matches!(meta.getattr(b), Err(MetaError::NotFound)));
    assert_eq!(queued(&meta), vec![a_id, b_id]);
    assert!(meta.orphans().unwrap().is_empty());
    assert_eq!(fsck_clean(&store).orphans, 0);

    // Without a session, or not open, a last unlink destroys at once.
    let unlink = |keep| Op::Unlink {
        parent: ROOT,
        name: b"b".to_vec(),
        keep,
    };
    meta.apply_as(caller(0), unlink(vec![c])).await.unwrap();
    assert!(matches!(meta.getattr(c), Err(MetaError::NotFound)));
    assert_eq!(queued(&meta), vec![a_id, b_id, c_id]);
    fsck_clean(&store);
}
