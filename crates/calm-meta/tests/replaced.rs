//! A small file replaced by a rename stays readable by its handle for a moment: another
//! mount that looked its name up just before opens what it looked up instead of failing.
//! Only by handle, only such files, only for `REPLACED_READABLE_FOR`, only for a caller who
//! could read it; the namespace itself is as if the file were gone (fsck clean).

use std::sync::Arc;

use calm_meta::replaced::{REPLACED_FILE_BYTES_MAX, REPLACED_READABLE_FOR};
use calm_meta::slices::{INLINE, Slice};
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_testkit::fsck_clean;

fn slice(id: u64, size: u32) -> Slice {
    Slice {
        id,
        size,
        off: 0,
        len: size,
        pos: 0,
    }
}

/// A file `name` holding `bytes` beside its records (inline), mode 0600, owned by root.
async fn small_file(meta: &Meta<Arc<MemStore>>, name: &[u8], bytes: &[u8]) -> Handle {
    let handle = meta.create(ROOT, name, 0o600).await.unwrap().handle;
    let id = meta.alloc_slices(1).await.unwrap() | INLINE;
    let records = vec![(0, slice(id, bytes.len() as u32))];
    meta.write(
        Caller::default(),
        handle,
        records,
        0,
        vec![(id, bytes.to_vec())],
    )
    .await
    .unwrap();
    handle
}

fn inline_text(map: &FileMap) -> Vec<u8> {
    map.inline.iter().flat_map(|(_, b)| b.clone()).collect()
}

#[tokio::test]
async fn a_small_file_replaced_by_a_rename_reads_by_handle_for_a_moment() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let old = small_file(&meta, b"f", b"first").await;
    let new = small_file(&meta, b"f.tmp", b"second").await;
    meta.rename(ROOT, b"f.tmp", ROOT, b"f", 0).await.unwrap();
    let replaced_at = std::time::Instant::now();

    // The name is the new file's; the old one reads by its handle, with no link left.
    assert_eq!(meta.lookup(ROOT, b"f").unwrap().handle, new);
    let map = meta.read_map(old, 0, 1024).unwrap();
    assert_eq!((map.attr.nlink, map.attr.size), (0, 5));
    assert_eq!(inline_text(&map), b"first");
    // Only for a caller who could read it.
    let other = Caller {
        uid: 1000,
        gid: 1000,
        ..Caller::default()
    };
    assert!(
        matches!(
            meta.read_map_as(&other, old, 0, 1024),
            Err(MetaError::Access(_))
        ),
        "{:?}",
        meta.read_map_as(&other, old, 0, 1024)
    );
    // The namespace does not have it: its attributes, a change of it, are gone.
    assert!(matches!(meta.getattr(old), Err(MetaError::NotFound)));
    fsck_clean(&store);

    // A file removed by unlink, one with an object, and one past the size kept are not kept.
    let unlinked = small_file(&meta, b"u", b"unlinked").await;
    meta.unlink(ROOT, b"u").await.unwrap();
    assert!(matches!(
        meta.read_map(unlinked, 0, 1024),
        Err(MetaError::NotFound)
    ));
    let with_object = meta.create(ROOT, b"o", 0o644).await.unwrap().handle;
    let id = meta.alloc_slices(1).await.unwrap();
    meta.write(
        Caller::default(),
        with_object,
        vec![(0, slice(id, 100))],
        0,
        Vec::new(),
    )
    .await
    .unwrap();
    let big = small_file(&meta, b"big", &vec![1; REPLACED_FILE_BYTES_MAX as usize]).await;
    let id = meta.alloc_slices(1).await.unwrap() | INLINE;
    let one_more = Slice {
        pos: REPLACED_FILE_BYTES_MAX as u32,
        ..slice(id, 1)
    };
    meta.write(
        Caller::default(),
        big,
        vec![(0, one_more)],
        0,
        vec![(id, vec![2])],
    )
    .await
    .unwrap();
    small_file(&meta, b"o.tmp", b"x").await;
    meta.rename(ROOT, b"o.tmp", ROOT, b"o", 0).await.unwrap();
    small_file(&meta, b"big.tmp", b"y").await;
    meta.rename(ROOT, b"big.tmp", ROOT, b"big", 0)
        .await
        .unwrap();
    for gone in [with_object, big] {
        assert!(matches!(
            meta.read_map(gone, 0, 1024),
            Err(MetaError::NotFound)
        ));
    }

    // After the moment, the old file is gone for every caller.
    let left = REPLACED_READABLE_FOR.saturating_sub(replaced_at.elapsed());
    std::thread::sleep(left + std::time::Duration::from_millis(50));
    assert!(matches!(
        meta.read_map(old, 0, 1024),
        Err(MetaError::NotFound)
    ));
    fsck_clean(&store);
}
