//! Quotas under random work: two users and the superuser create, grow, shrink, chown, link,
//! rename, set and remove xattrs and remove in three directories, while the superuser sets and removes user, group
//! and tree limits. After every step: a refused step left the store byte for byte unchanged;
//! no limit a step was held to was passed by it; the usage kept equals the usage counted from
//! the namespace (fsck's quota pass). And the exact edges, step by step: a create at the inode
//! limit, a write at the byte limit, a rename into a full tree, a directory between trees.

use std::sync::Arc;

use calm_meta::ops::Op;
use calm_meta::quota::{QuotaKind, QuotaLimits, QuotaReport, QuotaTarget};
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use proptest::prelude::*;

const EDQUOT: i32 = 122;
const EXDEV: i32 = 18;

/// A user on a mount (its lock session: what keeps an unlinked open file).
fn user(uid: u32) -> Caller {
    Caller {
        session: 7,
        uid,
        gid: 100,
        groups: Default::default(),
    }
}

fn root() -> Caller {
    Caller::default()
}

#[derive(Debug, Clone)]
enum Step {
    Make(usize, u8, bool, usize),
    Grow(usize, u64, usize),
    Shrink(usize, u64),
    /// Unlinks a name; with `true`, the caller's mount has the file open (it stays an orphan
    /// until released).
    Unlink(usize, u8, usize, bool),
    /// The orphan's last close (nothing when the file is none).
    Release(usize),
    /// Purges or restores a file (`false`) or directory (`true`) from the trash.
    Purge(usize, bool),
    Restore(usize, bool),
    Rmdir(usize, u8),
    Rename(usize, u8, usize, u8),
    Link(usize, usize, u8),
    Chown(usize, usize),
    Limit(usize, u64, u64),
    /// Sets (a length) or removes (none) xattr `user.xN` of a file or directory.
    Xattr(usize, bool, u8, Option<usize>, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..8usize, 0..3u8, any::<bool>(), 0..3usize).prop_map(|(d, n, k, u)| Step::Make(d, n, k, u)),
        4 => (0..16usize, 1..5000u64, 0..3usize).prop_map(|(f, b, u)| Step::Grow(f, b, u)),
        1 => (0..16usize, 0..3000u64).prop_map(|(f, s)| Step::Shrink(f, s)),
        3 => (0..8usize, 0..3u8, 0..3usize, any::<bool>()).prop_map(|(d, n, u, k)| Step::Unlink(d, n, u, k)),
        1 => (0..16usize).prop_map(Step::Release),
        1 => (0..16usize, any::<bool>()).prop_map(|(f, d)| Step::Purge(f, d)),
        1 => (0..16usize, any::<bool>()).prop_map(|(f, d)| Step::Restore(f, d)),
        2 => (0..8usize, 0..3u8).prop_map(|(d, n)| Step::Rmdir(d, n)),
        2 => (0..8usize, 0..3u8, 0..8usize, 0..3u8).prop_map(|(a, n, b, m)| Step::Rename(a, n, b, m)),
        1 => (0..16usize, 0..8usize, 0..3u8).prop_map(|(f, d, n)| Step::Link(f, d, n)),
        1 => (0..16usize, 0..3usize).prop_map(|(f, u)| Step::Chown(f, u)),
        2 => (0..11usize, 0..12000u64, 0..12u64).prop_map(|(t, b, i)| Step::Limit(t, b, i)),
        3 => (0..16usize, any::<bool>(), 0..3u8, proptest::option::of(0..3000usize), 0..3usize)
            .prop_map(|(f, d, n, len, u)| Step::Xattr(f, d, n, len, u)),
    ]
}

const UIDS: [u32; 3] = [1000, 1001, 0];

fn name(n: u8) -> Vec<u8> {
    format!("n{n}").into_bytes()
}

fn errno<T>(r: Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.errno())
}

struct World {
    meta: Meta<Arc<MemStore>>,
    store: Arc<MemStore>,
    dirs: Vec<Handle>,
    files: Vec<Handle>,
}

impl World {
    /// A namespace with three directories; with `trash`, one that keeps what is removed.
    async fn new(trash: bool) -> World {
        let store = Arc::new(MemStore::new());
        let options = if trash {
            MetaOptions {
                trash_kept: std::time::Duration::from_secs(3600),
                trash_min_age: std::time::Duration::ZERO,
                ..MetaOptions::default()
            }
        } else {
            MetaOptions::default()
        };
        let meta = Meta::open(store.clone(), options).unwrap();
        let a = meta.mkdir(ROOT, b"a", 0o777).await.unwrap().handle;
        let b = meta.mkdir(a, b"b", 0o777).await.unwrap().handle;
        let c = meta.mkdir(ROOT, b"c", 0o777).await.unwrap().handle;
        World {
            meta,
            store,
            dirs: vec![ROOT, a, b, c],
            files: Vec::new(),
        }
    }

    fn dir(&self, i: usize) -> Handle {
        self.dirs[i % self.dirs.len()]
    }

    fn file(&self, i: usize) -> Option<Handle> {
        (!self.files.is_empty()).then(|| self.files[i % self.files.len()])
    }

    async fn apply(&mut self, step: &Step) -> (Caller, Result<(), i32>) {
        match *step {
            Step::Make(d, n, is_dir, u) => {
                let caller = user(UIDS[u]);
                let node = if is_dir {
                    NewNode::dir(0o777, 0, 0)
                } else {
                    NewNode::file(0o666, 0, 0)
                };
                let op = Op::Make {
                    parent: self.dir(d),
                    name: name(n),
                    node,
                    exclusive: true,
                };
                let answer = self.meta.apply_as(caller.clone(), op).await;
                if let Ok(ops::Done::Attr(attr)) = &answer {
                    if is_dir {
                        self.dirs.push(attr.handle);
                    } else {
                        self.files.push(attr.handle);
                    }
                }
                (caller, errno(answer))
            }
            Step::Grow(f, by, u) => {
                let Some(handle) = self.file(f) else {
                    return (root(), Ok(()));
                };
                let size = self.meta.getattr(handle).map(|a| a.size).unwrap_or(0);
                let attr = SetAttr {
                    size: Some(size + by),
                    ..SetAttr::default()
                };
                let caller = user(UIDS[u]);
                let op = Op::SetAttr { handle, attr };
                (caller.clone(), errno(self.meta.apply_as(caller, op).await))
            }
            Step::Shrink(f, to) => {
                let Some(handle) = self.file(f) else {
                    return (root(), Ok(()));
                };
                let attr = SetAttr {
                    size: Some(to),
                    ..SetAttr::default()
                };
                (root(), errno(self.meta.setattr(handle, attr).await))
            }
            Step::Unlink(d, n, u, open) => {
                let caller = user(UIDS[u]);
                let keep = match self.meta.lookup(self.dir(d), &name(n)) {
                    Ok(attr) if open => vec![attr.handle],
                    _ => Vec::new(),
                };
                let op = Op::Unlink {
                    parent: self.dir(d),
                    name: name(n),
                    keep,
                };
                (caller.clone(), errno(self.meta.apply_as(caller, op).await))
            }
            Step::Release(f) => {
                let Some(handle) = self.file(f) else {
                    return (root(), Ok(()));
                };
                let op = Op::ReleaseOrphan {
                    handle,
                    any_session: true,
                };
                (root(), errno(self.meta.apply_as(root(), op).await))
            }
            Step::Purge(i, is_dir) | Step::Restore(i, is_dir) => {
                let handle = match (is_dir, self.file(i)) {
                    (true, _) => self.dir(i),
                    (false, Some(handle)) => handle,
                    (false, None) => return (root(), Ok(())),
                };
                let answer = if matches!(step, Step::Purge(..)) {
                    self.meta.trash_purge(root(), handle).await
                } else {
                    self.meta.trash_restore(root(), handle).await.map(|_| ())
                };
                (root(), answer.map_err(|e| e.errno()))
            }
            Step::Rmdir(d, n) => (root(), errno(self.meta.rmdir(self.dir(d), &name(n)).await)),
            Step::Rename(a, n, b, m) => {
                let answer = self
                    .meta
                    .rename(self.dir(a), &name(n), self.dir(b), &name(m), 0)
                    .await;
                (root(), errno(answer))
            }
            Step::Link(f, d, n) => {
                let Some(handle) = self.file(f) else {
                    return (root(), Ok(()));
                };
                (
                    root(),
                    errno(self.meta.link(handle, self.dir(d), &name(n)).await),
                )
            }
            Step::Chown(f, u) => {
                let Some(handle) = self.file(f) else {
                    return (root(), Ok(()));
                };
                let attr = SetAttr {
                    uid: Some(UIDS[u]),
                    gid: Some(100 + u as u32),
                    ..SetAttr::default()
                };
                (root(), errno(self.meta.setattr(handle, attr).await))
            }
            Step::Xattr(f, on_dir, n, len, u) => {
                let handle = if on_dir {
                    self.dir(f)
                } else {
                    match self.file(f) {
                        Some(handle) => handle,
                        None => return (root(), Ok(())),
                    }
                };
                let caller = user(UIDS[u]);
                let name = format!("user.x{n}").into_bytes();
                let op = match len {
                    Some(len) => Op::SetXattr {
                        handle,
                        name,
                        value: vec![b'v'; len],
                        flags: 0,
                    },
                    None => Op::RemoveXattr { handle, name },
                };
                (caller.clone(), errno(self.meta.apply_as(caller, op).await))
            }
            Step::Limit(t, bytes, inodes) => {
                let target = match t {
                    0 => QuotaTarget::user(1000),
                    1 => QuotaTarget::user(1001),
                    2 => QuotaTarget::group(100),
                    3 => QuotaTarget::user(0),
                    t => QuotaTarget::tree(self.dir(t - 4)),
                };
                let limits = QuotaLimits {
                    bytes,
                    inodes,
                    ..QuotaLimits::default()
                };
                (
                    root(),
                    errno(self.meta.set_quota(root(), target, limits).await),
                )
            }
        }
    }

    fn reports(&self) -> Vec<QuotaReport> {
        self.meta.quotas(&root(), true).unwrap()
    }
}

/// Whether `caller` is held to `target`'s limits.
fn held(caller: &Caller, target: QuotaTarget) -> bool {
    target.kind == QuotaKind::Tree || !caller.is_root()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn usage_is_exact_and_no_limit_is_passed(
        trash in any::<bool>(),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut world = rt.block_on(World::new(trash));
        let mut refused = 0;
        for step in &steps {
            let before_dump = world.store.dump();
            let before = world.reports();
            let (caller, answer) = rt.block_on(world.apply(step));
            let after = world.reports();
            match answer {
                Err(_) => {
                    refused += usize::from(answer == Err(EDQUOT));
                    prop_assert!(world.store.dump() == before_dump, "refused {:?} changed the store", step);
                }
                Ok(()) => {
                    for report in &after {
                        let was = before.iter().find(|r| r.target == report.target).map(|r| r.usage).unwrap_or_default();
                        let l = report.limits;
                        if !held(&caller, report.target) || matches!(step, Step::Limit(..)) {
                            continue;
                        }
                        let grew_bytes = report.usage.bytes > was.bytes;
                        let grew_inodes = report.usage.inodes > was.inodes;
                        prop_assert!(!(grew_bytes && l.bytes > 0 && report.usage.bytes > l.bytes as i64),
                            "{:?} took {} past its byte limit: {:?}", step, report.target, report);
                        prop_assert!(!(grew_inodes && l.inodes > 0 && report.usage.inodes > l.inodes as i64),
                            "{:?} took {} past its inode limit: {:?}", step, report.target, report);
                    }
                }
            }
            let fsck = calm_meta::fsck::check(&world.store.snapshot().unwrap(), &mut |_| {}).unwrap();
            prop_assert!(fsck.is_clean(), "after {:?}: {:?}", step, fsck.problems);
        }
        let _ = refused;
    }
}

fn limit(bytes: u64, inodes: u64) -> QuotaLimits {
    QuotaLimits {
        bytes,
        inodes,
        ..QuotaLimits::default()
    }
}

#[tokio::test]
async fn the_edges_of_every_limit() {
    let mut w = World::new(false).await;
    let (a, b, c) = (w.dirs[1], w.dirs[2], w.dirs[3]);
    let alice = user(1000);
    // A user at the inode limit: the next create is refused, the superuser's is not.
    w.meta
        .set_quota(root(), QuotaTarget::user(1000), limit(0, 2))
        .await
        .unwrap();
    let make = |parent, n: &str| Op::Make {
        parent,
        name: n.as_bytes().to_vec(),
        node: NewNode::file(0o644, 0, 0),
        exclusive: true,
    };
    let f1 = match w.meta.apply_as(alice.clone(), make(c, "f1")).await.unwrap() {
        ops::Done::Attr(a) => a.handle,
        other => panic!("{other:?}"),
    };
    w.meta.apply_as(alice.clone(), make(c, "f2")).await.unwrap();
    let refused = w.meta.apply_as(alice.clone(), make(c, "f3")).await;
    assert_eq!(errno(refused), Err(EDQUOT));
    let report = w.meta.quota(&alice, QuotaTarget::user(1000)).unwrap();
    assert_eq!(report.usage.inodes, 2);
    // A tree at its byte limit: growth to exactly the limit passes, one byte more does not,
    // for the superuser too.
    w.meta
        .set_quota(root(), QuotaTarget::tree(a), limit(1000, 0))
        .await
        .unwrap();
    let g = w.meta.create(b, b"g", 0o644).await.unwrap().handle;
    let size = |n| SetAttr {
        size: Some(n),
        ..SetAttr::default()
    };
    w.meta.setattr(g, size(1000)).await.unwrap();
    assert_eq!(errno(w.meta.setattr(g, size(1001)).await), Err(EDQUOT));
    let tree = w.meta.quota(&root(), QuotaTarget::tree(a)).unwrap();
    assert_eq!(
        (tree.usage.bytes, tree.usage.inodes, tree.usage.dirs),
        (1000, 2, 1)
    );
    // A file renamed into the full tree is refused; out of it, its bytes leave the tree.
    w.meta.setattr(f1, size(10)).await.unwrap();
    assert_eq!(
        errno(w.meta.rename(c, b"f1", a, b"f1", 0).await),
        Err(EDQUOT)
    );
    w.meta.rename(b, b"g", c, b"g", 0).await.unwrap();
    let tree = w.meta.quota(&root(), QuotaTarget::tree(a)).unwrap();
    assert_eq!((tree.usage.bytes, tree.usage.inodes), (0, 1));
    w.meta.rename(c, b"f1", a, b"f1", 0).await.unwrap();
    // A directory does not move between trees under different quotas, nor does a file
    // gain a name in another: EXDEV, as between file systems.
    assert_eq!(errno(w.meta.rename(a, b"b", c, b"b", 0).await), Err(EXDEV));
    assert_eq!(errno(w.meta.link(f1, c, b"f1-again").await), Err(EXDEV));
    // The limit removed, the tree's usage goes with it; set again, it is counted again.
    w.meta
        .set_quota(root(), QuotaTarget::tree(a), QuotaLimits::default())
        .await
        .unwrap();
    w.meta.rename(a, b"b", c, b"b", 0).await.unwrap();
    let counted = w
        .meta
        .set_quota(root(), QuotaTarget::tree(c), limit(1 << 20, 100))
        .await
        .unwrap();
    assert_eq!(counted.usage.inodes, 3, "{counted:?}"); // f2, g and b (empty)
    assert_eq!(counted.usage.bytes, 1000);
    let fsck = calm_meta::fsck::check(&w.store.snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(fsck.is_clean(), "{:?}", fsck.problems);
    // Only the superuser sets limits.
    let refused = w
        .meta
        .set_quota(alice.clone(), QuotaTarget::user(1000), limit(0, 0))
        .await;
    assert_eq!(errno(refused), Err(1));
    w.files.clear();
}

/// The 100 000th create, write and unlink under three tree limits and a user limit works as
/// the first did, from 16 tasks at once (so commit groups hold many of them and the committer
/// keeps its chains across groups), and usage comes back to exactly what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_creates_writes_and_unlinks_leave_usage_exact() {
    let w = World::new(false).await;
    let meta = Arc::new(w.meta);
    let (a, b) = (w.dirs[1], w.dirs[2]);
    let leaf = meta.mkdir(b, b"leaf", 0o777).await.unwrap().handle;
    for dir in [a, b, leaf] {
        let limits = limit(1 << 40, 1 << 20);
        meta.set_quota(root(), QuotaTarget::tree(dir), limits)
            .await
            .unwrap();
    }
    meta.set_quota(root(), QuotaTarget::user(1000), limit(1 << 40, 1 << 20))
        .await
        .unwrap();
    const ROUNDS: u64 = 100_000 / 16;
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let meta = meta.clone();
            tokio::spawn(async move {
                let alice = user(1000);
                for i in 0..ROUNDS {
                    let name = format!("t{t}.{}", i % 4).into_bytes();
                    let op = Op::Make {
                        parent: leaf,
                        name: name.clone(),
                        node: NewNode::file(0o644, 0, 0),
                        exclusive: true,
                    };
                    let handle = match meta.apply_as(alice.clone(), op).await.unwrap() {
                        ops::Done::Attr(attr) => attr.handle,
                        other => panic!("{other:?}"),
                    };
                    let grow = Op::SetAttr {
                        handle,
                        attr: SetAttr {
                            size: Some(i % 5000),
                            ..SetAttr::default()
                        },
                    };
                    meta.apply_as(alice.clone(), grow).await.unwrap();
                    let unlink = Op::Unlink {
                        parent: leaf,
                        name,
                        keep: Vec::new(),
                    };
                    meta.apply_as(alice.clone(), unlink).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // What stays below each: b and leaf below a, leaf below b, nothing below leaf.
    for (dir, dirs) in [(a, 2), (b, 1), (leaf, 0)] {
        let tree = meta.quota(&root(), QuotaTarget::tree(dir)).unwrap();
        assert_eq!(
            (tree.usage.bytes, tree.usage.inodes, tree.usage.dirs),
            (0, dirs, dirs),
            "{tree:?}"
        );
    }
    let alice = meta.quota(&root(), QuotaTarget::user(1000)).unwrap();
    assert_eq!((alice.usage.bytes, alice.usage.inodes), (0, 0), "{alice:?}");
    let fsck = calm_meta::fsck::check(&w.store.snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(fsck.is_clean(), "{:?}", fsck.problems);
}
