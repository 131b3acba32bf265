//! The trash: what loses its last name (unlink, rmdir, a rename over it, an orphan's release)
//! is kept out of the namespace and its trees (in its owners' quotas until purged), nothing in
//! it changes, a restore names it
//! again (under a new name when the old is taken, after its directory), a purge or the expiry
//! destroys it and queues its objects. fsck is clean at every step.

use std::sync::Arc;
use std::time::Duration;

use calm_meta::ops::Op;
use calm_meta::quota::{QuotaLimits, QuotaTarget};
use calm_meta::slices::Slice;
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use calm_testkit::fsck_clean;

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const EDQUOT: i32 = 122;
const ESTALE: i32 = 116;

fn options(kept: Duration) -> MetaOptions {
    MetaOptions {
        trash_kept: kept,
        // Every removal into the trash, however young (`young_nodes_skip_the_trash` tests the
        // minimum age).
        trash_min_age: Duration::ZERO,
        ..MetaOptions::default()
    }
}

fn user(uid: u32) -> Caller {
    Caller {
        uid,
        gid: uid,
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

/// A file of `size` bytes in one object; returns its handle and the object's id.
async fn file_with_object(
    meta: &Meta<Arc<MemStore>>,
    parent: Handle,
    name: &[u8],
    size: u32,
) -> (Handle, u64) {
    let handle = meta.create(parent, name, 0o644).await.unwrap().handle;
    let id = meta.alloc_slices(1).await.unwrap();
    let slice = Slice {
        id,
        size,
        off: 0,
        len: size,
        pos: 0,
    };
    meta.write(Caller::default(), handle, vec![(0, slice)], 0, Vec::new())
        .await
        .unwrap();
    (handle, id)
}

fn made(done: ops::Done) -> Handle {
    match done {
        ops::Done::Attr(attr) => attr.handle,
        other => panic!("a make answered {other:?}"),
    }
}

fn listed(meta: &Meta<Arc<MemStore>>, caller: &Caller) -> Vec<(Handle, String)> {
    meta.trash_list(caller, 0, 10_000)
        .unwrap()
        .entries
        .into_iter()
        .map(|l| {
            (
                l.listed.handle,
                String::from_utf8(l.path).expect("utf-8 path"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_removed_file_waits_in_the_trash_and_comes_back_whole() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    meta.changelog_register("follower", calm_changelog::Mask::all())
        .await
        .unwrap();
    let dir = meta.mkdir(ROOT, b"d", 0o755).await.unwrap().handle;
    let (file, id) = file_with_object(&meta, dir, b"f", 1000).await;
    let before = meta.getattr(file).unwrap();
    meta.unlink(dir, b"f").await.unwrap();

    // Out of the namespace, its objects kept, in the trash with its path.
    assert_eq!(meta.lookup(dir, b"f").unwrap_err().errno(), ENOENT);
    assert!(queued(&meta).is_empty(), "nothing queued for deletion");
    assert_eq!(listed(&meta, &user(0)), vec![(file, "/d/f".to_string())]);
    let status = meta.status().unwrap();
    assert_eq!((status.trash_entries, status.trash_bytes), (1, 1000));
    let report = fsck_clean(&store);
    assert_eq!((report.trash_entries, report.trash_bytes), (1, 1000));

    // Nothing in the trash changes.
    let attr = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(meta.setattr(file, attr).await.unwrap_err().errno(), ESTALE);

    // Restored under its name, as it was.
    let restored = meta.trash_restore(user(0), file).await.unwrap();
    assert_eq!(
        (restored.parent, restored.name.as_slice()),
        (dir, &b"f"[..])
    );
    let after = meta.lookup(dir, b"f").unwrap();
    assert_eq!((after.handle, after.size, after.nlink), (file, 1000, 1));
    assert_eq!(after.mtime_ns, before.mtime_ns);
    let map = meta.read_map(file, 0, 100).unwrap();
    assert!(
        map.chunks
            .iter()
            .any(|(_, slices)| slices.iter().any(|s| s.id == id)),
        "{map:?}"
    );
    assert!(listed(&meta, &user(0)).is_empty());
    let report = fsck_clean(&store);
    assert_eq!((report.trash_entries, report.trash_bytes), (0, 0));
    // The changelog: the unlink as always, the restore as a create.
    let records = meta
        .changelog_read(0, usize::MAX, usize::MAX, None)
        .unwrap();
    let last: Vec<_> = records
        .iter()
        .rev()
        .take(2)
        .map(|r| (r.kind, r.target, r.parent, r.name.clone()))
        .collect();
    use calm_changelog::RecordType;
    assert_eq!(
        last,
        vec![
            (RecordType::Create, file, dir, b"f".to_vec()),
            (RecordType::Unlink, file, dir, b"f".to_vec()),
        ]
    );

    // Removed again, its name taken meanwhile: restored beside it.
    meta.unlink(dir, b"f").await.unwrap();
    let (other, _) = file_with_object(&meta, dir, b"f", 10).await;
    let restored = meta.trash_restore(user(0), file).await.unwrap();
    assert_eq!(
        String::from_utf8(restored.name).unwrap(),
        format!("f.restored-{file}")
    );
    assert_eq!(meta.lookup(dir, b"f").unwrap().handle, other);
    fsck_clean(&store);

    // Purged: destroyed, its object queued.
    meta.unlink(dir, format!("f.restored-{file}").as_bytes())
        .await
        .unwrap();
    meta.trash_purge(user(0), file).await.unwrap();
    assert_eq!(queued(&meta), vec![id]);
    assert_eq!(meta.getattr(file).unwrap_err().errno(), ENOENT);
    let status = meta.status().unwrap();
    assert_eq!((status.trash_entries, status.trash_bytes), (0, 0));
    fsck_clean(&store);
}

#[tokio::test]
async fn a_removed_tree_comes_back_directories_first() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    let top = meta.mkdir(ROOT, b"top", 0o755).await.unwrap().handle;
    let sub = meta.mkdir(top, b"sub", 0o755).await.unwrap().handle;
    let (a, _) = file_with_object(&meta, sub, b"a", 5).await;
    let (b, _) = file_with_object(&meta, top, b"b", 7).await;
    // rm -rf top: the files, then the directories, deepest first.
    meta.unlink(sub, b"a").await.unwrap();
    meta.rmdir(top, b"sub").await.unwrap();
    meta.unlink(top, b"b").await.unwrap();
    meta.rmdir(ROOT, b"top").await.unwrap();
    let mut paths = listed(&meta, &user(0));
    paths.sort();
    let mut expected = vec![
        (top, "/top".to_string()),
        (sub, "/top/sub".to_string()),
        (a, "/top/sub/a".to_string()),
        (b, "/top/b".to_string()),
    ];
    expected.sort();
    assert_eq!(paths, expected);
    assert_eq!(meta.statfs().unwrap().inodes, 5, "the root and the trash");
    fsck_clean(&store);

    // Nothing is made in a directory in the trash; a file waits for its directory.
    assert_eq!(
        meta.create(sub, b"x", 0o644).await.unwrap_err().errno(),
        ENOENT
    );
    let refused = meta.trash_restore(user(0), a).await.unwrap_err();
    assert!(
        refused.to_string().contains("restore it first"),
        "{refused}"
    );
    for handle in [top, sub, a, b] {
        meta.trash_restore(user(0), handle).await.unwrap();
    }
    assert_eq!(meta.lookup(ROOT, b"top").unwrap().nlink, 3);
    assert_eq!(meta.lookup(sub, b"a").unwrap().handle, a);
    assert_eq!(meta.lookup(top, b"b").unwrap().size, 7);
    fsck_clean(&store);

    // A file whose directory was purged comes back in the root.
    meta.unlink(sub, b"a").await.unwrap();
    meta.rmdir(top, b"sub").await.unwrap();
    meta.trash_purge(user(0), sub).await.unwrap();
    let restored = meta.trash_restore(user(0), a).await.unwrap();
    assert_eq!(
        (restored.parent, restored.name.as_slice()),
        (ROOT, &b"a"[..])
    );
    fsck_clean(&store);
}

fn quota_clean(store: &MemStore) {
    let mismatches = quota::count::check(&store.snapshot().unwrap()).unwrap();
    assert!(
        mismatches.is_empty(),
        "usage kept != counted: {mismatches:?}"
    );
}

/// User 1000's usage: (bytes, inodes).
fn usage_of(meta: &Meta<Arc<MemStore>>, target: QuotaTarget) -> (i64, i64) {
    let usage = meta.quota(&user(0), target).unwrap().usage;
    (usage.bytes, usage.inodes)
}

#[tokio::test]
async fn the_trash_counts_in_its_owners_quota_until_purged_and_is_each_owners() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    let shared = meta.mkdir(ROOT, b"shared", 0o777).await.unwrap().handle;
    let limits = QuotaLimits {
        bytes: 1500,
        ..QuotaLimits::default()
    };
    let owner = QuotaTarget::user(1000);
    meta.set_quota(user(0), owner, limits).await.unwrap();
    let make = |name: &[u8]| Op::Make {
        parent: shared,
        name: name.to_vec(),
        node: NewNode::file(0o644, 1000, 1000),
        exclusive: true,
    };
    let unlink = |name: &[u8]| Op::Unlink {
        parent: shared,
        name: name.to_vec(),
        keep: vec![],
    };
    let mine = made(meta.apply_as(user(1000), make(b"mine")).await.unwrap());
    meta.apply_as(user(1000), resize(mine, 1000)).await.unwrap();
    meta.apply_as(user(1000), unlink(b"mine")).await.unwrap();
    assert_eq!(
        usage_of(&meta, owner),
        (1000, 1),
        "what waits in the trash still counts in its owner's quota"
    );
    quota_clean(&store);

    // So the trash is no way around the limit: the room it holds is not given twice.
    let big = made(meta.apply_as(user(1000), make(b"big")).await.unwrap());
    let before = store.dump();
    let refused = meta
        .apply_as(user(1000), resize(big, 1000))
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EDQUOT, "{refused}");
    assert_eq!(store.dump(), before, "a refused write changes nothing");

    // Another user sees nothing of it and cannot take it; its owner can.
    assert!(listed(&meta, &user(2000)).is_empty());
    assert_eq!(listed(&meta, &user(1000)).len(), 1);
    let refused = meta.trash_restore(user(2000), mine).await.unwrap_err();
    assert_eq!(refused.errno(), EPERM, "{refused}");
    assert_eq!(
        meta.trash_purge(user(2000), mine)
            .await
            .unwrap_err()
            .errno(),
        EPERM
    );

    // A purge gives the room back.
    meta.trash_purge(user(1000), mine).await.unwrap();
    assert_eq!(usage_of(&meta, owner), (0, 1));
    meta.apply_as(user(1000), resize(big, 1000)).await.unwrap();
    assert_eq!(usage_of(&meta, owner), (1000, 1));
    quota_clean(&store);

    // A restore counts in the trees again (refused past a limit, changing nothing), and not in
    // its owner's a second time.
    meta.apply_as(user(1000), unlink(b"big")).await.unwrap();
    let tree = QuotaTarget::tree(shared);
    let small = QuotaLimits {
        bytes: 500,
        ..QuotaLimits::default()
    };
    meta.set_quota(user(0), tree, small).await.unwrap();
    assert_eq!(usage_of(&meta, tree), (0, 0), "the trash is in no tree");
    let before = store.dump();
    let refused = meta.trash_restore(user(1000), big).await.unwrap_err();
    assert_eq!(refused.errno(), EDQUOT, "{refused}");
    assert_eq!(store.dump(), before, "a refused restore changes nothing");
    meta.set_quota(user(0), tree, QuotaLimits::default())
        .await
        .unwrap();
    meta.trash_restore(user(1000), big).await.unwrap();
    assert_eq!(usage_of(&meta, owner), (1000, 1));
    quota_clean(&store);
    fsck_clean(&store);
}

#[tokio::test]
async fn a_file_replaced_by_a_rename_and_an_orphan_go_to_the_trash() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    let (old, _) = file_with_object(&meta, ROOT, b"config", 10).await;
    let (new, _) = file_with_object(&meta, ROOT, b"config.tmp", 20).await;
    meta.rename(ROOT, b"config.tmp", ROOT, b"config", 0)
        .await
        .unwrap();
    assert_eq!(listed(&meta, &user(0)), vec![(old, "/config".to_string())]);

    // Open on the remover's mount: an orphan until closed, then in the trash.
    let session = Caller {
        session: 7,
        ..Caller::default()
    };
    meta.apply_as(
        session.clone(),
        Op::Unlink {
            parent: ROOT,
            name: b"config".to_vec(),
            keep: vec![new],
        },
    )
    .await
    .unwrap();
    assert_eq!(meta.orphans().unwrap().len(), 1);
    // Still changeable while open.
    let attr = SetAttr {
        size: Some(30),
        ..SetAttr::default()
    };
    meta.apply_as(session.clone(), Op::SetAttr { handle: new, attr })
        .await
        .unwrap();
    meta.apply_as(
        session,
        Op::ReleaseOrphan {
            handle: new,
            any_session: false,
        },
    )
    .await
    .unwrap();
    assert!(meta.orphans().unwrap().is_empty());
    let mut paths = listed(&meta, &user(0));
    paths.sort();
    assert_eq!(
        paths,
        vec![(old, "/config".to_string()), (new, "/config".to_string())]
    );
    assert_eq!(meta.status().unwrap().trash_bytes, 40);
    fsck_clean(&store);
}

#[tokio::test]
async fn expired_entries_are_purged_in_the_background() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_millis(300))).unwrap();
    let mut ids = Vec::new();
    for i in 0..50 {
        let name = format!("f{i}");
        let (_, id) = file_with_object(&meta, ROOT, name.as_bytes(), 100).await;
        meta.unlink(ROOT, name.as_bytes()).await.unwrap();
        ids.push(id);
    }
    assert_eq!(meta.status().unwrap().trash_entries, 50);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while meta.status().unwrap().trash_entries > 0 {
        assert!(std::time::Instant::now() < deadline, "not expired in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut gone = queued(&meta);
    gone.sort();
    assert_eq!(gone, ids, "every object queued for deletion");
    let report = fsck_clean(&store);
    assert_eq!((report.inodes, report.trash_entries), (1, 0));
}

/// A node that loses its last name younger than the minimum age is a program's scratch: it
/// is destroyed at once (its objects queued), whether unlinked, replaced by a rename or
/// rmdir'd; one older goes to the trash as before.
#[tokio::test]
async fn young_nodes_skip_the_trash() {
    let store = Arc::new(MemStore::new());
    let options = MetaOptions {
        trash_min_age: Duration::from_millis(500),
        ..options(Duration::from_secs(3600))
    };
    let meta = Meta::open(store.clone(), options).unwrap();
    let (_, young) = file_with_object(&meta, ROOT, b"journal", 100).await;
    meta.unlink(ROOT, b"journal").await.unwrap();
    assert!(
        listed(&meta, &user(0)).is_empty(),
        "a young file skips the trash"
    );
    assert_eq!(queued(&meta), vec![young]);
    let (old, _) = file_with_object(&meta, ROOT, b"old", 100).await;
    let (replaced, _) = file_with_object(&meta, ROOT, b"target", 100).await;
    meta.mkdir(ROOT, b"scratch", 0o755).await.unwrap();
    meta.rmdir(ROOT, b"scratch").await.unwrap();
    meta.create(ROOT, b"new", 0o644).await.unwrap();
    assert!(
        listed(&meta, &user(0)).is_empty(),
        "nor does a young directory"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Older than the minimum age now: kept.
    meta.rename(ROOT, b"new", ROOT, b"target", 0).await.unwrap();
    meta.unlink(ROOT, b"old").await.unwrap();
    let mut kept: Vec<Handle> = listed(&meta, &user(0)).iter().map(|(h, _)| *h).collect();
    kept.sort();
    assert_eq!(kept, vec![old, replaced]);
    let report = fsck_clean(&store);
    assert_eq!(report.trash_entries, 2);
}

#[tokio::test]
async fn without_a_trash_a_removal_is_final() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let (_, id) = file_with_object(&meta, ROOT, b"f", 100).await;
    meta.unlink(ROOT, b"f").await.unwrap();
    assert_eq!(queued(&meta), vec![id]);
    assert!(listed(&meta, &user(0)).is_empty());
    fsck_clean(&store);
}

/// The expiry keeps up with removals: a pass that purged entries is followed at once, not after
/// the pause, so a trash whose entries have all expired is emptied at the next pass, whatever
/// its size. (One page of entries per pause, four pages took three pauses more: a trash under
/// removals faster than a page per pause grew for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_keeps_up_with_removals_faster_than_a_page_per_pause() {
    // The pause between passes is `kept` here (at most 10 s).
    let kept = Duration::from_secs(10);
    let store = Arc::new(MemStore::new());
    let meta = Arc::new(Meta::open(store.clone(), options(kept)).unwrap());
    let entries = 4 * calm_meta::ops::trash::EXPIRY_ENTRIES_PER_PASS as u64;
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let meta = meta.clone();
            tokio::spawn(async move {
                for i in (t..entries).step_by(64) {
                    let name = format!("f{i}");
                    meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
                    meta.unlink(ROOT, name.as_bytes()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Every entry has expired from here on; the next pass comes within one pause.
    let all_expired = std::time::Instant::now() + kept;
    let trash = || meta.status().unwrap().trash_entries;
    while trash() > 0 {
        let now = std::time::Instant::now();
        assert!(
            now < all_expired + 2 * kept,
            "{} entries still in the trash {:?} after the last expired",
            trash(),
            now.saturating_duration_since(all_expired)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = fsck_clean(&store);
    assert_eq!((report.inodes, report.trash_entries), (1, 0));
}

/// A directory with a tree limit, removed whole (its files, then it) and restored (it, then
/// its files), comes back with its limit, and what is restored below it is held to it: the
/// file past the limit is refused (EDQUOT, changing nothing) and stays in the trash. Purged,
/// it takes its limit with it. The usage kept equals the usage counted throughout.
#[tokio::test]
async fn a_restored_tree_comes_back_with_its_limit() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    let proj = meta.mkdir(ROOT, b"proj", 0o777).await.unwrap().handle;
    let limit = QuotaLimits {
        bytes: 1000,
        ..QuotaLimits::default()
    };
    meta.set_quota(user(0), QuotaTarget::tree(proj), limit)
        .await
        .unwrap();
    let mut files = Vec::new();
    for name in [&b"a"[..], b"b"] {
        let file = meta.create(proj, name, 0o644).await.unwrap().handle;
        let size = SetAttr {
            size: Some(600),
            ..SetAttr::default()
        };
        if name == b"b" {
            // Over the limit now: raised for a moment, then lowered again.
            let raised = QuotaLimits {
                bytes: 2000,
                ..limit
            };
            meta.set_quota(user(0), QuotaTarget::tree(proj), raised)
                .await
                .unwrap();
        }
        meta.setattr(file, size).await.unwrap();
        files.push(file);
    }
    meta.set_quota(user(0), QuotaTarget::tree(proj), limit)
        .await
        .unwrap();
    for name in [&b"a"[..], b"b"] {
        meta.unlink(proj, name).await.unwrap();
    }
    meta.rmdir(ROOT, b"proj").await.unwrap();
    let check = || {
        assert!(
            quota::count::check(&store.snapshot().unwrap())
                .unwrap()
                .is_empty()
        );
    };
    check();
    meta.trash_restore(user(0), proj).await.unwrap();
    let kept = meta.quota(&user(0), QuotaTarget::tree(proj)).unwrap();
    assert_eq!(kept.limits.bytes, 1000, "the limit came back: {kept:?}");
    meta.trash_restore(user(0), files[0]).await.unwrap();
    let refused = meta.trash_restore(user(0), files[1]).await.unwrap_err();
    assert_eq!(refused.errno(), 122, "{refused}");
    let usage = meta.quota(&user(0), QuotaTarget::tree(proj)).unwrap().usage;
    assert_eq!(usage.bytes, 600);
    check();
    // Gone for good: its limit with it.
    meta.unlink(proj, b"a").await.unwrap();
    meta.rmdir(ROOT, b"proj").await.unwrap();
    meta.trash_purge(user(0), proj).await.unwrap();
    let gone = meta.quota(&user(0), QuotaTarget::tree(proj)).unwrap();
    assert_eq!(gone.limits.bytes, 0, "{gone:?}");
    check();
    fsck_clean(&store);
}

/// A caller with a lock session, as a mount's requests carry one.
fn mounted(uid: u32, session: u64) -> Caller {
    Caller {
        session,
        ..user(uid)
    }
}

fn make_in(parent: Handle, name: &[u8], node: NewNode) -> Op {
    Op::Make {
        parent,
        name: name.to_vec(),
        node,
        exclusive: true,
    }
}

fn resize(handle: Handle, size: u64) -> Op {
    Op::SetAttr {
        handle,
        attr: SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    }
}

/// A file of user 1000 made in `parent` through `mount`, `size` bytes long, then unlinked
/// while that mount has it open: an orphan of the mount's session.
async fn open_and_unlinked(
    meta: &Meta<Arc<MemStore>>,
    mount: &Caller,
    parent: Handle,
    name: &[u8],
    size: u64,
) -> Handle {
    let file = NewNode::file(0o644, 1000, 1000);
    let handle = made(
        meta.apply_as(mount.clone(), make_in(parent, name, file))
            .await
            .unwrap(),
    );
    meta.apply_as(mount.clone(), resize(handle, size))
        .await
        .unwrap();
    let unlink = Op::Unlink {
        parent,
        name: name.to_vec(),
        keep: vec![handle],
    };
    meta.apply_as(mount.clone(), unlink).await.unwrap();
    handle
}

#[tokio::test]
async fn an_open_file_with_no_name_counts_in_its_tree_until_its_last_close() {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    let project = meta.mkdir(ROOT, b"project", 0o777).await.unwrap().handle;
    let tree = QuotaTarget::tree(project);
    let limits = QuotaLimits {
        bytes: 10_000,
        ..QuotaLimits::default()
    };
    meta.set_quota(user(0), tree, limits).await.unwrap();
    let mount = mounted(1000, 7);
    let log = open_and_unlinked(&meta, &mount, project, b"log", 1000).await;
    assert_eq!(
        usage_of(&meta, tree),
        (1000, 1),
        "open with no name, it still counts in its tree"
    );
    quota_clean(&store);

    // It grows within the tree's limit, and not past it, through a write or a truncate.
    meta.apply_as(mount.clone(), resize(log, 9000))
        .await
        .unwrap();
    assert_eq!(usage_of(&meta, tree), (9000, 1));
    let id = meta.alloc_slices(1).await.unwrap();
    let before = store.dump();
    let refused = meta
        .apply_as(mount.clone(), resize(log, 20_000))
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EDQUOT, "{refused}");
    let slice = Slice {
        id,
        size: 2000,
        off: 0,
        len: 2000,
        pos: 0,
    };
    let refused = meta
        .write(mount.clone(), log, vec![(9000, slice)], 11_000, Vec::new())
        .await
        .unwrap_err();
    assert_eq!(refused.errno(), EDQUOT, "{refused}");
    assert_eq!(store.dump(), before, "a refused growth changes nothing");
    quota_clean(&store);

    // Its last close takes it out of the tree, into the trash (still its owner's).
    let release = Op::ReleaseOrphan {
        handle: log,
        any_session: false,
    };
    meta.apply_as(mount.clone(), release).await.unwrap();
    assert_eq!(usage_of(&meta, tree), (0, 0));
    assert_eq!(usage_of(&meta, QuotaTarget::user(1000)), (9000, 1));
    assert_eq!(
        listed(&meta, &user(1000)),
        vec![(log, "/project/log".into())]
    );
    quota_clean(&store);

    // An orphan whose directory is removed leaves the trees with it, and then grows in its
    // owner's quota only.
    let sub = made(
        meta.apply_as(
            mount.clone(),
            make_in(project, b"sub", NewNode::dir(0o755, 1000, 1000)),
        )
        .await
        .unwrap(),
    );
    let tmp = open_and_unlinked(&meta, &mount, sub, b"tmp", 3000).await;
    assert_eq!(usage_of(&meta, tree), (3000, 2));
    meta.apply_as(
        mount.clone(),
        Op::Rmdir {
            parent: project,
            name: b"sub".to_vec(),
        },
    )
    .await
    .unwrap();
    assert_eq!(usage_of(&meta, tree), (0, 0));
    quota_clean(&store);
    meta.apply_as(mount.clone(), resize(tmp, 50_000))
        .await
        .unwrap();
    assert_eq!(usage_of(&meta, tree), (0, 0));
    quota_clean(&store);
    let release = Op::ReleaseOrphan {
        handle: tmp,
        any_session: false,
    };
    meta.apply_as(mount, release).await.unwrap();
    assert_eq!(usage_of(&meta, QuotaTarget::user(1000)), (59_000, 3));
    quota_clean(&store);
    fsck_clean(&store);
}

/// A store of format 13 (its trash in no quota, its orphans in no tree) opened by this build:
/// the records of orphans whose directory is gone say so, and every usage is counted again.
#[tokio::test]
async fn a_format_13_store_gets_its_trash_and_orphans_counted() {
    use calm_meta::layout::{KEY_FORMAT, OrphanRecord, orphan_key};
    use calm_store::{ReadTxn, WriteTxn};
    let store = Arc::new(MemStore::new());
    let (orphan, sub) = {
        let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
        let project = meta.mkdir(ROOT, b"project", 0o777).await.unwrap().handle;
        let limits = QuotaLimits {
            bytes: 1 << 20,
            ..QuotaLimits::default()
        };
        let tree = QuotaTarget::tree(project);
        meta.set_quota(user(0), tree, limits).await.unwrap();
        let mount = mounted(1000, 7);
        let mut handles = Vec::new();
        for name in [&b"trashed"[..], b"orphan"] {
            handles.push(open_and_unlinked(&meta, &mount, project, name, 1000).await);
        }
        let release = Op::ReleaseOrphan {
            handle: handles[0],
            any_session: false,
        };
        meta.apply_as(mount.clone(), release).await.unwrap();
        let sub = made(
            meta.apply_as(
                mount.clone(),
                make_in(project, b"sub", NewNode::dir(0o755, 1000, 1000)),
            )
            .await
            .unwrap(),
        );
        (handles[1], sub)
    };
    // What version 13 wrote: the trash out of its owner's usage, the orphan out of its tree,
    // and an orphan record naming a directory since removed.
    let mut txn = store.begin().unwrap();
    txn.put(
        KEY_FORMAT,
        &[b"CALMMETA".as_slice(), &13u32.to_le_bytes()].concat(),
    )
    .unwrap();
    for target in [QuotaTarget::user(1000), QuotaTarget::group(1000)] {
        let usage = quota::QuotaUsage {
            bytes: 1000,
            inodes: 2,
            dirs: 1,
        };
        txn.put(&quota::usage_key(target), &quota::encode_usage(&usage))
            .unwrap();
    }
    let tree_usage = quota::QuotaUsage {
        inodes: 1,
        dirs: 1,
        ..Default::default()
    };
    txn.put(
        &quota::usage_key(QuotaTarget::tree(2)),
        &quota::encode_usage(&tree_usage),
    )
    .unwrap();
    let record = OrphanRecord {
        session: 7,
        place: Some((sub + 1000, b"orphan".to_vec())), // never a directory
    };
    txn.put(&orphan_key(orphan), &record.encode()).unwrap();
    txn.commit().unwrap();
    assert!(
        !quota::count::check(&store.snapshot().unwrap())
            .unwrap()
            .is_empty()
    );

    let meta = Meta::open(store.clone(), options(Duration::from_secs(3600))).unwrap();
    quota_clean(&store);
    let snap = store.snapshot().unwrap();
    let record = OrphanRecord::decode(&snap.get(&orphan_key(orphan)).unwrap().unwrap()).unwrap();
    assert_eq!(record.place, Some((0, b"orphan".to_vec())));
    assert_eq!(usage_of(&meta, QuotaTarget::user(1000)), (2000, 3));
    fsck_clean(&store);
}
