//! Clones: a copy made of metadata shares the source's objects (each named once more), a
//! write to either never changes the other, an object goes only with the last record naming
//! it, a tree is cloned a directory at a time, quotas count a clone as a copy, and who may and
//! who owns follow `cp -r` / `cp -a`. fsck is clean at every step.

use std::sync::Arc;

use calm_meta::ops::Op;
use calm_meta::quota::{QuotaLimits, QuotaTarget};
use calm_meta::slices::{INLINE, Slice};
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use calm_testkit::fsck_clean;

const EACCES: i32 = 13;
const EDQUOT: i32 = 122;
const EEXIST: i32 = 17;

fn user(uid: u32) -> Caller {
    Caller {
        uid,
        gid: uid,
        ..Caller::default()
    }
}

fn queued(meta: &Meta<Arc<MemStore>>) -> Vec<u64> {
    let mut ids: Vec<u64> = meta
        .garbage(u64::MAX, usize::MAX)
        .unwrap()
        .iter()
        .map(|g| g.id)
        .collect();
    ids.sort();
    ids
}

fn object(id: u64, size: u32) -> Slice {
    Slice {
        id,
        size,
        off: 0,
        len: size,
        pos: 0,
    }
}

/// The objects `handle`'s records name, in order.
fn named(meta: &Meta<Arc<MemStore>>, handle: Handle) -> Vec<u64> {
    let map = meta.read_map(handle, 0, 1000).unwrap();
    map.chunks
        .iter()
        .flat_map(|(_, slices)| slices.iter().map(|s| s.id))
        .collect()
}

async fn file(meta: &Meta<Arc<MemStore>>, parent: Handle, name: &[u8], size: u32) -> (Handle, u64) {
    let handle = meta.create(parent, name, 0o644).await.unwrap().handle;
    let id = meta.alloc_slices(1).await.unwrap();
    meta.write(
        Caller::default(),
        handle,
        vec![(0, object(id, size))],
        0,
        vec![],
    )
    .await
    .unwrap();
    (handle, id)
}

/// Clones the tree at `src` as `name` in `parent`, a directory at a time, `max` entries per
/// request; returns the copy's handle.
async fn clone_tree(
    meta: &Meta<Arc<MemStore>>,
    caller: &Caller,
    src: Handle,
    parent: Handle,
    name: &[u8],
    max: usize,
) -> Result<Handle> {
    let top = meta.clone_node(caller.clone(), src, parent, name).await?;
    let mut todo = vec![(src, top.handle)];
    while let Some((from, to)) = todo.pop() {
        let mut after = Vec::new();
        loop {
            let done = meta
                .clone_entries(caller.clone(), from, to, after, max)
                .await?;
            todo.extend(done.dirs);
            match done.next {
                Some(next) => after = next,
                None => break,
            }
        }
    }
    Ok(top.handle)
}

#[tokio::test]
async fn a_clone_shares_objects_and_goes_its_own_way() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let (src, id) = file(&meta, ROOT, b"data", 5000).await;
    // An inline slice too: copied, not shared.
    let inline = meta.alloc_slices(1).await.unwrap() | INLINE;
    meta.write(
        Caller::default(),
        src,
        vec![(0, object(inline, 10))],
        0,
        vec![(inline, b"0123456789".to_vec())],
    )
    .await
    .unwrap();
    meta.setxattr(src, b"user.tag", b"v1", 0).await.unwrap();
    let copy = meta
        .clone_node(Caller::default(), src, ROOT, b"copy")
        .await
        .unwrap();
    assert_ne!(copy.handle, src);
    assert_eq!(copy.size, 5000);
    assert_eq!(meta.getxattr(copy.handle, b"user.tag").unwrap(), b"v1");
    let (a, b) = (named(&meta, src), named(&meta, copy.handle));
    assert_eq!(a[0], id);
    assert_eq!(b[0], id, "the object is shared");
    assert_ne!(a[1], b[1], "inline bytes are copied under a new id");
    fsck_clean(&store);

    // A write to the copy names a new object; the source's records stay.
    let new = meta.alloc_slices(1).await.unwrap();
    meta.write(
        Caller::default(),
        copy.handle,
        vec![(0, object(new, 5000))],
        0,
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(named(&meta, src), a);
    fsck_clean(&store);

    // The source goes: its object stays (the copy's older record still names it).
    meta.unlink(ROOT, b"data").await.unwrap();
    assert!(!queued(&meta).contains(&id));
    fsck_clean(&store);
    // The copy goes: the object with it.
    meta.unlink(ROOT, b"copy").await.unwrap();
    assert_eq!(queued(&meta), vec![id, new]);
    fsck_clean(&store);
}

#[tokio::test]
async fn a_tree_clones_a_directory_at_a_time_as_a_copy() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let top = meta.mkdir(ROOT, b"top", 0o755).await.unwrap().handle;
    let mut expected = Vec::new();
    for d in 0..3 {
        let dir = meta
            .mkdir(top, format!("d{d}").as_bytes(), 0o750)
            .await
            .unwrap()
            .handle;
        for f in 0..25 {
            file(&meta, dir, format!("f{f}").as_bytes(), 100 + f).await;
            expected.push(format!("d{d}/f{f}"));
        }
        meta.symlink(dir, b"link", b"f0").await.unwrap();
    }
    meta.mkdir(top, b"empty", 0o700).await.unwrap();
    let copy = clone_tree(&meta, &Caller::default(), top, ROOT, b"copy", 7)
        .await
        .unwrap();
    let summary = meta.summary(&Caller::default(), copy).unwrap();
    let original = meta.summary(&Caller::default(), top).unwrap();
    assert_eq!(summary.usage, original.usage, "counted as a copy");
    for path in &expected {
        let (d, f) = path.split_once('/').unwrap();
        let dir = meta.lookup(copy, d.as_bytes()).unwrap();
        assert_eq!(dir.mode & 0o777, 0o750);
        let cloned = meta.lookup(dir.handle, f.as_bytes()).unwrap();
        let source = meta
            .lookup(meta.lookup(top, d.as_bytes()).unwrap().handle, f.as_bytes())
            .unwrap();
        assert_eq!(cloned.size, source.size);
        assert_eq!(named(&meta, cloned.handle), named(&meta, source.handle));
    }
    let d0 = meta.lookup(copy, b"d0").unwrap().handle;
    assert_eq!(
        meta.readlink(meta.lookup(d0, b"link").unwrap().handle)
            .unwrap(),
        b"f0"
    );
    assert_eq!(meta.lookup(copy, b"empty").unwrap().nlink, 2);
    assert_eq!(meta.lookup(ROOT, b"copy").unwrap().nlink, 2 + 4);
    fsck_clean(&store);

    // A name taken: refused, nothing written.
    let before = store.dump();
    let refused = meta
        .clone_node(Caller::default(), top, ROOT, b"copy")
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EEXIST);
    assert_eq!(store.dump(), before);

    // Every object goes only when both trees are gone.
    for (src, dir) in [(top, "top"), (copy, "copy")] {
        for d in 0..3 {
            let sub = meta.lookup(src, format!("d{d}").as_bytes()).unwrap().handle;
            for f in 0..25 {
                meta.unlink(sub, format!("f{f}").as_bytes()).await.unwrap();
            }
            meta.unlink(sub, b"link").await.unwrap();
        }
        if dir == "top" {
            assert!(
                queued(&meta).is_empty(),
                "the copy still names every object"
            );
        }
    }
    assert_eq!(queued(&meta).len(), 75);
    fsck_clean(&store);
}

#[tokio::test]
async fn a_user_clones_what_they_may_read_and_owns_the_copy() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let home = meta.mkdir(ROOT, b"home", 0o777).await.unwrap().handle;
    let (shared, _) = file(&meta, ROOT, b"shared", 1000).await; // 0644, root's
    let secret = meta.create(ROOT, b"secret", 0o600).await.unwrap().handle;
    let mode = SetAttr {
        mode: Some(0o4755),
        ..SetAttr::default()
    };
    meta.setattr(shared, mode).await.unwrap();

    let copy = meta
        .clone_node(user(1000), shared, home, b"mine")
        .await
        .unwrap();
    assert_eq!(
        (copy.uid, copy.gid),
        (1000, 1000),
        "a user owns the copy, as cp -r"
    );
    assert_eq!(
        copy.mode & 0o7777,
        0o755,
        "setuid is not copied to another owner"
    );
    let refused = meta
        .clone_node(user(1000), secret, home, b"stolen")
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EACCES);
    let refused = meta
        .clone_node(user(1000), shared, ROOT, b"here")
        .await
        .unwrap_err();
    assert_eq!(
        refused.errno(),
        EACCES,
        "the destination's directory is not theirs"
    );

    // The copy counts in the user's quota as a copy would, and is refused past it.
    let limits = QuotaLimits {
        bytes: 1500,
        ..QuotaLimits::default()
    };
    meta.set_quota(Caller::default(), QuotaTarget::user(1000), limits)
        .await
        .unwrap();
    let usage = meta
        .quota(&Caller::default(), QuotaTarget::user(1000))
        .unwrap()
        .usage;
    assert_eq!(usage.bytes, 1000);
    let before = store.dump();
    let refused = meta
        .clone_node(user(1000), shared, home, b"again")
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EDQUOT);
    assert_eq!(store.dump(), before);

    // The superuser's clone keeps each owner, as cp -a.
    let kept = meta
        .apply_as(
            Caller::default(),
            Op::Clone {
                src: copy.handle,
                parent: ROOT,
                name: b"kept".to_vec(),
            },
        )
        .await
        .unwrap();
    let kept = match kept {
        ops::Done::Attr(attr) => attr,
        other => panic!("{other:?}"),
    };
    assert_eq!((kept.uid, kept.gid), (1000, 1000));
    assert!(
        quota::count::check(&store.snapshot().unwrap())
            .unwrap()
            .is_empty()
    );
    fsck_clean(&store);
}
