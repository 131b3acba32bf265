//! Named conformance tests of the namespace rules, each on a fresh store.

use std::collections::HashSet;
use std::sync::Arc;

use calm_meta::error::CODES;
use calm_meta::fsck;
use calm_meta::layout::{Dentry, KEY_INODES, KEY_NAME_HASH, NameHash, entries_from, inode_key};
use calm_meta::*;
use calm_store::lmdb::{LmdbOptions, LmdbStore};
use calm_store::mem::MemStore;
use calm_store::{ReadTxn, Store, WriteTxn};
use calm_testkit::fault::FaultStore;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

fn mem() -> Meta<MemStore> {
    Meta::open(MemStore::new(), MetaOptions::default()).unwrap()
}

fn clean<S: Store>(meta: &Meta<S>) {
    let report = fsck::check(&meta.store().snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

#[test]
fn error_codes_map_one_to_one_to_errno() {
    let codes: HashSet<u32> = CODES.iter().map(|c| c.0).collect();
    let errnos: HashSet<i32> = CODES.iter().map(|c| c.1).collect();
    assert_eq!(codes.len(), CODES.len(), "codes unique");
    assert_eq!(errnos.len(), CODES.len(), "errnos unique");
    for (code, errno, name) in CODES {
        let error = MetaError::from_code(*code, "detail").expect("known code");
        assert_eq!(error.code(), *code, "{name}");
        assert_eq!(error.errno(), *errno, "{name}");
    }
    assert_eq!(MetaError::from_code(9999, ""), None);
}

#[test]
fn bad_names_get_the_right_error() {
    let rt = rt();
    let meta = mem();
    let long = vec![b'x'; NAME_LEN_MAX + 1];
    let cases: Vec<(&[u8], MetaError)> = vec![
        (b"", MetaError::NotFound),
        (b".", MetaError::Exists),
        (b"..", MetaError::Exists),
        (&long, MetaError::NameTooLong),
    ];
    for (name, expected) in cases {
        assert_eq!(
            rt.block_on(meta.create(ROOT, name, 0o644)).unwrap_err(),
            expected,
            "{name:?}"
        );
    }
    for name in [&b"a/b"[..], b"a\0b"] {
        assert_eq!(
            rt.block_on(meta.create(ROOT, name, 0o644))
                .unwrap_err()
                .errno(),
            22,
            "{name:?}"
        );
        assert_eq!(meta.lookup(ROOT, name).unwrap_err().errno(), 22);
    }
    let longest = vec![b'x'; NAME_LEN_MAX];
    rt.block_on(meta.create(ROOT, &longest, 0o644))
        .expect("255 bytes is allowed");
    assert_eq!(
        meta.lookup(ROOT, &long).unwrap_err(),
        MetaError::NameTooLong
    );
    assert_eq!(
        rt.block_on(meta.unlink(ROOT, b".")).unwrap_err(),
        MetaError::IsDir
    );
    assert_eq!(rt.block_on(meta.rmdir(ROOT, b".")).unwrap_err().errno(), 22);
    assert_eq!(
        rt.block_on(meta.rmdir(ROOT, b"..")).unwrap_err(),
        MetaError::NotEmpty
    );
    assert_eq!(
        rt.block_on(meta.rename(ROOT, b".", ROOT, b"x", 0))
            .unwrap_err()
            .errno(),
        16
    );
    clean(&meta);
}

#[test]
fn create_mkdir_lookup_and_dot_entries() {
    let rt = rt();
    let meta = mem();
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap();
    assert_eq!((d.kind, d.nlink, d.mode), (Kind::Dir, 2, 0o755));
    assert_eq!(
        meta.getattr(ROOT).unwrap().nlink,
        3,
        "a subdirectory adds a link to its parent"
    );
    let f = rt
        .block_on(meta.make(d.handle, b"f", NewNode::file(0o4755 | 0o100000, 7, 8), true))
        .unwrap();
    assert_eq!(
        (f.mode, f.uid, f.gid, f.nlink),
        (0o4755, 7, 8, 1),
        "type bits dropped, set-id kept"
    );
    assert_eq!(meta.lookup(d.handle, b"f").unwrap(), f);
    assert_eq!(meta.lookup(d.handle, b".").unwrap().handle, d.handle);
    assert_eq!(meta.lookup(d.handle, b"..").unwrap().handle, ROOT);
    assert_eq!(meta.lookup(ROOT, b"..").unwrap().handle, ROOT);
    assert_eq!(
        rt.block_on(meta.create(d.handle, b"f", 0o644)).unwrap_err(),
        MetaError::Exists,
        "exclusive"
    );
    let again = rt
        .block_on(meta.make(d.handle, b"f", NewNode::file(0o600, 0, 0), false))
        .unwrap();
    assert_eq!(
        again.handle, f.handle,
        "O_CREAT without O_EXCL opens the existing file"
    );
    assert_eq!(
        rt.block_on(meta.make(ROOT, b"d", NewNode::file(0o600, 0, 0), false))
            .unwrap_err(),
        MetaError::IsDir
    );
    assert_eq!(
        rt.block_on(meta.create(f.handle, b"x", 0o644)).unwrap_err(),
        MetaError::NotDir
    );
    assert_eq!(
        rt.block_on(meta.create(12345, b"x", 0o644)).unwrap_err(),
        MetaError::NotFound
    );
    assert_eq!(meta.lookup(f.handle, b"x").unwrap_err(), MetaError::NotDir);
    let dev = rt
        .block_on(meta.make(
            ROOT,
            b"null",
            NewNode::node(Kind::CharDevice, 0o666, 0, 0, 0x0103),
            true,
        ))
        .unwrap();
    assert_eq!((dev.kind, dev.rdev), (Kind::CharDevice, 0x0103));
    assert_ne!(dev.generation, 0);
    clean(&meta);
}

#[test]
fn symlinks_and_hard_links() {
    let rt = rt();
    let meta = mem();
    let s = rt.block_on(meta.symlink(ROOT, b"s", b"../target")).unwrap();
    assert_eq!((s.kind, s.size), (Kind::Symlink, 9));
    assert_eq!(meta.readlink(s.handle).unwrap(), b"../target");
    assert_eq!(
        rt.block_on(meta.symlink(ROOT, b"e", b"")).unwrap_err(),
        MetaError::NotFound
    );
    let too_long = vec![b'a'; SYMLINK_LEN_MAX + 1];
    assert_eq!(
        rt.block_on(meta.symlink(ROOT, b"l", &too_long))
            .unwrap_err(),
        MetaError::NameTooLong
    );
    let f = rt.block_on(meta.create(ROOT, b"f", 0o644)).unwrap();
    assert_eq!(meta.readlink(f.handle).unwrap_err().errno(), 22);
    let linked = rt.block_on(meta.link(f.handle, ROOT, b"g")).unwrap();
    assert_eq!(linked.nlink, 2);
    assert_eq!(
        rt.block_on(meta.link(f.handle, ROOT, b"g")).unwrap_err(),
        MetaError::Exists
    );
    assert_eq!(
        rt.block_on(meta.link(ROOT, ROOT, b"r"))
            .unwrap_err()
            .errno(),
        1,
        "no links to directories"
    );
    rt.block_on(meta.unlink(ROOT, b"f")).unwrap();
    assert_eq!(
        meta.getattr(f.handle).unwrap().nlink,
        1,
        "still reachable as g"
    );
    rt.block_on(meta.unlink(ROOT, b"g")).unwrap();
    assert_eq!(
        meta.getattr(f.handle).unwrap_err(),
        MetaError::NotFound,
        "last link frees the inode"
    );
    assert_eq!(meta.statfs().unwrap().inodes, 2, "root and the symlink");
    clean(&meta);
}

#[test]
fn rmdir_and_unlink_rules() {
    let rt = rt();
    let meta = mem();
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap();
    rt.block_on(meta.create(d.handle, b"f", 0o644)).unwrap();
    assert_eq!(
        rt.block_on(meta.rmdir(ROOT, b"d")).unwrap_err(),
        MetaError::NotEmpty
    );
    assert_eq!(
        rt.block_on(meta.unlink(ROOT, b"d")).unwrap_err(),
        MetaError::IsDir
    );
    assert_eq!(
        rt.block_on(meta.rmdir(d.handle, b"f")).unwrap_err(),
        MetaError::NotDir
    );
    assert_eq!(
        rt.block_on(meta.unlink(d.handle, b"nope")).unwrap_err(),
        MetaError::NotFound
    );
    rt.block_on(meta.unlink(d.handle, b"f")).unwrap();
    rt.block_on(meta.rmdir(ROOT, b"d")).unwrap();
    assert_eq!(meta.getattr(ROOT).unwrap().nlink, 2);
    clean(&meta);
}

#[test]
fn rename_rules() {
    let rt = rt();
    let meta = mem();
    let a = rt.block_on(meta.mkdir(ROOT, b"a", 0o755)).unwrap();
    let b = rt.block_on(meta.mkdir(a.handle, b"b", 0o755)).unwrap();
    let f = rt.block_on(meta.create(ROOT, b"f", 0o644)).unwrap();
    let g = rt.block_on(meta.create(ROOT, b"g", 0o644)).unwrap();
    let rename = |sp, s: &[u8], dp, d: &[u8], flags| rt.block_on(meta.rename(sp, s, dp, d, flags));

    assert_eq!(
        rename(ROOT, b"a", b.handle, b"x", 0).unwrap_err().errno(),
        22,
        "under itself"
    );
    assert_eq!(
        rename(ROOT, b"a", a.handle, b"x", 0).unwrap_err().errno(),
        22,
        "into itself"
    );
    assert_eq!(
        rename(ROOT, b"f", ROOT, b"a", 0).unwrap_err(),
        MetaError::IsDir
    );
    assert_eq!(
        rename(ROOT, b"a", ROOT, b"f", 0).unwrap_err(),
        MetaError::NotDir
    );
    assert_eq!(
        rename(ROOT, b"f", ROOT, b"g", RENAME_NOREPLACE).unwrap_err(),
        MetaError::Exists
    );
    assert_eq!(
        rename(ROOT, b"f", ROOT, b"zz", RENAME_EXCHANGE).unwrap_err(),
        MetaError::NotFound
    );
    assert_eq!(
        rename(ROOT, b"f", ROOT, b"g", 3).unwrap_err().errno(),
        22,
        "both flags"
    );
    assert_eq!(
        rename(ROOT, b"nope", ROOT, b"x", 0).unwrap_err(),
        MetaError::NotFound
    );
    rename(ROOT, b"f", ROOT, b"f", 0).expect("same name is a no-op");

    let c = rt.block_on(meta.mkdir(ROOT, b"c", 0o755)).unwrap();
    rt.block_on(meta.create(c.handle, b"inside", 0o644))
        .unwrap();
    assert_eq!(
        rename(a.handle, b"b", ROOT, b"c", 0).unwrap_err(),
        MetaError::NotEmpty
    );

    // replace a file: the replaced inode is gone
    rename(ROOT, b"f", ROOT, b"g", 0).unwrap();
    assert_eq!(meta.lookup(ROOT, b"g").unwrap().handle, f.handle);
    assert_eq!(meta.getattr(g.handle).unwrap_err(), MetaError::NotFound);

    // move a directory across parents: link counts follow
    rename(a.handle, b"b", ROOT, b"b", 0).unwrap();
    assert_eq!(meta.getattr(a.handle).unwrap().nlink, 2);
    assert_eq!(meta.getattr(ROOT).unwrap().nlink, 5);
    assert_eq!(meta.lookup(b.handle, b"..").unwrap().handle, ROOT);

    // replace an empty directory with a directory
    rename(ROOT, b"b", ROOT, b"a", 0).unwrap();
    assert_eq!(meta.getattr(a.handle).unwrap_err(), MetaError::NotFound);
    assert_eq!(meta.getattr(ROOT).unwrap().nlink, 4);

    // exchange a directory and a file across parents
    rename(ROOT, b"a", c.handle, b"inside", RENAME_EXCHANGE).unwrap();
    assert_eq!(meta.lookup(c.handle, b"inside").unwrap().handle, b.handle);
    assert_eq!(meta.lookup(ROOT, b"a").unwrap().kind, Kind::File);
    assert_eq!(meta.lookup(b.handle, b"..").unwrap().handle, c.handle);
    assert_eq!(
        (
            meta.getattr(ROOT).unwrap().nlink,
            meta.getattr(c.handle).unwrap().nlink
        ),
        (3, 3)
    );
    clean(&meta);
}

#[test]
fn readdir_cookies_are_stable_across_changes() {
    let rt = rt();
    let meta = Arc::new(mem());
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap().handle;
    let names: Vec<Vec<u8>> = (0..5000).map(|i| format!("f{i:05}").into_bytes()).collect();
    rt.block_on(async {
        let tasks: Vec<_> = names
            .chunks(500)
            .map(|chunk| {
                let (meta, chunk) = (meta.clone(), chunk.to_vec());
                tokio::spawn(async move {
                    for n in chunk {
                        meta.create(d, &n, 0o644).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    // List in pages; between pages remove some entries not yet listed and add new ones.
    let mut seen = HashSet::new();
    let mut cookie = 0;
    let mut removed = HashSet::new();
    let mut page_no = 0;
    loop {
        let page = meta.readdir(d, cookie, 100).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        for e in &page {
            assert!(seen.insert(e.name.clone()), "{:?} listed twice", e.name);
        }
        page_no += 1;
        if page_no > 20 {
            continue; // stop changing the directory, or the listing never ends
        }
        let victim = format!("f{:05}", 4999 - page_no).into_bytes();
        if !seen.contains(&victim) && rt.block_on(meta.unlink(d, &victim)).is_ok() {
            removed.insert(victim);
        }
        rt.block_on(meta.create(d, format!("new{page_no}").as_bytes(), 0o644))
            .unwrap();
    }
    for n in &names {
        assert!(
            seen.contains(n) || removed.contains(n),
            "{:?} neither listed nor removed",
            n
        );
    }
    for n in &removed {
        assert!(!seen.contains(n), "removed {:?} was listed", n);
    }
    assert_eq!(
        meta.readdir(d, 0, usize::MAX).unwrap().len(),
        READDIR_ENTRIES_MAX,
        "page size is bounded"
    );
    assert_eq!(meta.readdir(d, u64::MAX, 10).unwrap().len(), 0);
    clean(&meta);
}

#[test]
fn xattr_rules() {
    let rt = rt();
    let meta = mem();
    let f = rt.block_on(meta.create(ROOT, b"f", 0o644)).unwrap().handle;
    assert_eq!(meta.getxattr(f, b"user.a").unwrap_err(), MetaError::NoData);
    assert_eq!(
        rt.block_on(meta.setxattr(f, b"user.a", b"1", XATTR_REPLACE))
            .unwrap_err(),
        MetaError::NoData
    );
    rt.block_on(meta.setxattr(f, b"user.a", b"1", XATTR_CREATE))
        .unwrap();
    assert_eq!(
        rt.block_on(meta.setxattr(f, b"user.a", b"2", XATTR_CREATE))
            .unwrap_err(),
        MetaError::Exists
    );
    rt.block_on(meta.setxattr(f, b"user.a", b"2", XATTR_REPLACE))
        .unwrap();
    rt.block_on(meta.setxattr(f, b"user.b", b"", 0)).unwrap();
    assert_eq!(meta.getxattr(f, b"user.a").unwrap(), b"2");
    assert_eq!(
        meta.listxattr(f).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    assert_eq!(
        rt.block_on(meta.setxattr(f, b"", b"", 0)).unwrap_err(),
        MetaError::Range
    );
    assert_eq!(
        rt.block_on(meta.setxattr(f, &[b'n'; 256], b"", 0))
            .unwrap_err(),
        MetaError::Range
    );
    let big = vec![0u8; XATTR_VALUE_LEN_MAX + 1];
    assert_eq!(
        rt.block_on(meta.setxattr(f, b"user.c", &big, 0))
            .unwrap_err(),
        MetaError::TooBig
    );
    rt.block_on(meta.removexattr(f, b"user.a")).unwrap();
    assert_eq!(
        rt.block_on(meta.removexattr(f, b"user.a")).unwrap_err(),
        MetaError::NoData
    );
    rt.block_on(meta.unlink(ROOT, b"f")).unwrap();
    clean(&meta); // the xattrs went with the inode
}

#[test]
fn setattr_sets_what_it_is_given() {
    let rt = rt();
    let meta = mem();
    let f = rt.block_on(meta.create(ROOT, b"f", 0o644)).unwrap();
    let set = SetAttr {
        mode: Some(0o600),
        uid: Some(5),
        gid: Some(6),
        size: Some(4096),
        atime: Some(SetTime::At(1_000)),
        mtime: Some(SetTime::At(2_000)),
        ctime: None,
    };
    let a = rt.block_on(meta.setattr(f.handle, set)).unwrap();
    assert_eq!(
        (a.mode, a.uid, a.gid, a.size, a.atime_ns, a.mtime_ns),
        (0o600, 5, 6, 4096, 1_000, 2_000)
    );
    assert!(a.ctime_ns >= f.ctime_ns, "ctime moves forward");
    let truncated = rt
        .block_on(meta.setattr(
            f.handle,
            SetAttr {
                size: Some(10),
                ..SetAttr::default()
            },
        ))
        .unwrap();
    assert!(
        truncated.mtime_ns > 2_000,
        "a size change without a given mtime sets mtime to now"
    );
    assert_eq!(meta.statfs().unwrap().file_bytes, 10);
    let big = SetAttr {
        size: Some(FILE_SIZE_MAX + 1),
        ..SetAttr::default()
    };
    assert_eq!(
        rt.block_on(meta.setattr(f.handle, big)).unwrap_err(),
        MetaError::FileTooBig
    );
    let dir_size = SetAttr {
        size: Some(1),
        ..SetAttr::default()
    };
    assert_eq!(
        rt.block_on(meta.setattr(ROOT, dir_size)).unwrap_err(),
        MetaError::IsDir
    );
    clean(&meta);
}

#[test]
fn concurrent_operations_share_commits() {
    let rt = rt();
    let meta = Arc::new(Meta::open(MemStore::new(), MetaOptions::default()).unwrap());
    rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let meta = meta.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        meta.create(ROOT, format!("{t}-{i}").as_bytes(), 0o644)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let status = meta.status().unwrap();
    assert_eq!(status.ops_committed, 3200);
    assert!(
        status.commits < status.ops_committed,
        "groups formed: {status:?}"
    );
    assert!(status.largest_batch > 1);
    clean(&*meta);
}

#[test]
fn a_store_failure_fails_the_whole_group_and_leaves_nothing() {
    let rt = rt();
    let meta = Meta::open(FaultStore::new(MemStore::new()), MetaOptions::default()).unwrap();
    rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap();
    let d = meta.lookup(ROOT, b"d").unwrap().handle;
    rt.block_on(meta.create(d, b"f", 0o644)).unwrap();
    for countdown in 0..12 {
        let before = meta.store().inner().dump();
        meta.store().fail_after(countdown);
        let outcome = rt.block_on(meta.rename(d, b"f", ROOT, b"g", 0));
        meta.store().heal();
        match outcome {
            Err(error) => {
                assert_eq!(error.errno(), 5, "an injected store fault is EIO");
                assert!(
                    meta.store().inner().dump() == before,
                    "failed rename left state (fault at {countdown})"
                );
            }
            Ok(()) => {
                // The fault fell after the commit: the rename is whole. Put it back.
                rt.block_on(meta.rename(ROOT, b"g", d, b"f", 0)).unwrap();
            }
        }
        clean(&meta);
    }
    // After faults, handles still never repeat.
    let a = rt.block_on(meta.create(ROOT, b"a", 0o644)).unwrap().handle;
    let b = rt.block_on(meta.create(ROOT, b"b", 0o644)).unwrap().handle;
    assert_ne!(a, b);
}

/// A panic while one request of a group is applied (a bug in it) refuses that request alone,
/// with EIO and nothing of it written; the others of its group commit, and the committer,
/// the only writer, goes on serving, group after group.
#[test]
fn a_panic_inside_a_commit_group_refuses_that_request_alone_and_the_committer_goes_on() {
    let rt = rt();
    let meta =
        Arc::new(Meta::open(FaultStore::new(MemStore::new()), MetaOptions::default()).unwrap());
    // Every write that holds this symlink target panics: in the inode's value.
    meta.store().panic_on_value(b"panics-when-written");
    for round in 0..20 {
        let before = meta.store().inner().dump();
        let mut calls = Vec::new();
        for i in 0..16 {
            let meta = meta.clone();
            calls.push(rt.spawn(async move {
                match i {
                    7 => meta
                        .symlink(
                            ROOT,
                            format!("bad-{round}").as_bytes(),
                            b"panics-when-written",
                        )
                        .await
                        .map(|_| ()),
                    _ => meta
                        .create(ROOT, format!("f-{round}-{i}").as_bytes(), 0o644)
                        .await
                        .map(|_| ()),
                }
            }));
        }
        let outcomes: Vec<_> = calls
            .into_iter()
            .map(|call| rt.block_on(call).unwrap())
            .collect();
        for (i, outcome) in outcomes.iter().enumerate() {
            match i {
                7 => {
                    let error = outcome
                        .as_ref()
                        .expect_err("the panicking request is refused");
                    assert_eq!(error.errno(), 5, "{error}");
                }
                _ => assert!(outcome.is_ok(), "request {i} of round {round}: {outcome:?}"),
            }
        }
        assert_eq!(
            meta.lookup(ROOT, format!("bad-{round}").as_bytes()),
            Err(MetaError::NotFound)
        );
        assert!(
            meta.store().inner().dump() != before,
            "the others committed"
        );
        clean(&*meta);
    }
    let status = meta.status().unwrap();
    assert_eq!(status.ops_committed, 20 * 15);
    meta.store().heal();
    rt.block_on(meta.symlink(ROOT, b"good", b"panics-when-written"))
        .expect("the same request, once nothing panics, commits");
    clean(&*meta);
}

#[test]
fn restart_reuses_no_handle_and_reads_no_more_than_the_superblock() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let mut handles = HashSet::new();
    for round in 0..3 {
        let store = LmdbStore::open(dir.path(), &LmdbOptions::default()).unwrap();
        let meta = Meta::open(
            store,
            MetaOptions {
                handle_chunk: 16,
                ..MetaOptions::default()
            },
        )
        .unwrap();
        assert_eq!(meta.epoch(), round + 1);
        for i in 0..20 {
            let attr = rt
                .block_on(meta.create(ROOT, format!("r{round}-{i}").as_bytes(), 0o644))
                .unwrap();
            assert!(handles.insert(attr.handle), "handle {} reused", attr.handle);
            assert_eq!(attr.generation, round + 1);
        }
        clean(&meta);
        let store = meta.shutdown();
        Arc::into_inner(store).expect("sole owner").close();
    }
}

/// The namespace's name hash.
fn names(store: &impl Store) -> NameHash {
    let snap = store.snapshot().unwrap();
    NameHash::from_value(&snap.get(KEY_NAME_HASH).unwrap().unwrap()).unwrap()
}

#[test]
fn fsck_reports_damage() {
    let rt = rt();
    let meta = mem();
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap().handle;
    let f = rt.block_on(meta.create(d, b"f", 0o644)).unwrap().handle;
    let g = rt.block_on(meta.create(d, b"g", 0o644)).unwrap().handle;
    clean(&meta);
    let store = meta.shutdown();
    let names = names(&*store);
    let damage = |f: &dyn Fn(&mut calm_store::mem::MemTxn<'_>)| {
        let mut txn = store.begin().unwrap();
        f(&mut txn);
        txn.commit().unwrap();
    };
    damage(&|txn| {
        txn.delete(&inode_key(f)).unwrap(); // a name now points nowhere
        txn.put(KEY_INODES, &99u64.to_le_bytes()).unwrap();
        txn.delete(&names.entry_key(ROOT, b"d")).unwrap(); // d is nameless: an orphan directory
        // g kept under another name's hash: a lookup of g would not find it.
        txn.delete(&names.entry_key(d, b"g")).unwrap();
        let mut moved = entries_from(d, names.hash(b"f")).to_vec();
        moved.extend_from_slice(b"g");
        let value = Dentry {
            child: g,
            kind: Kind::File,
        };
        txn.put(&moved, &value.encode()).unwrap();
    });
    let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
    let text = report.problems.join("\n");
    assert!(!report.is_clean());
    assert!(
        text.contains(&format!("points to handle {f}, which is not a live inode")),
        "{text}"
    );
    assert!(text.contains("counter Ninodes"), "{text}");
    assert!(
        text.contains(&format!("directory {d} has 0 names")),
        "{text}"
    );
    assert!(
        text.contains(&format!("name {d}/\"g\" is kept under hash")),
        "{text}"
    );
}

#[test]
fn a_corrupt_name_key_is_an_error_not_a_crash() {
    let rt = rt();
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap().handle;
    rt.block_on(meta.create(d, b"f", 0o644)).unwrap();
    let mut bad = entries_from(d, 0)[..10].to_vec();
    bad.extend_from_slice(&[0xff, 0xff, 0xff]); // 13 bytes: among the names, too short
    let mut txn = store.begin().unwrap();
    txn.put(&bad, b"junk").unwrap();
    txn.commit().unwrap();
    let error = meta.readdir(d, 0, 100).unwrap_err();
    assert!(matches!(error, MetaError::Corrupt(_)), "{error:?}");
}

/// Names that share a hash (which the namespace's secret key makes as good as impossible, so
/// the keys are written here by hand): each listed once, in pages of any size, also past the
/// 256 that get a cookie of their own.
#[test]
fn names_sharing_a_hash_are_each_listed_once() {
    let rt = rt();
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let d = rt.block_on(meta.mkdir(ROOT, b"d", 0o755)).unwrap().handle;
    let names = names(&*store);
    let shared = names.hash(b"x");
    let mut expected = Vec::new();
    let mut txn = store.begin().unwrap();
    for (hash, count) in [
        (shared - 256, 3),
        (shared, 300),
        (shared + 256, 2),
        (shared + 512, 5),
    ] {
        for i in 0..count {
            let name = format!("h{hash}-{i:03}").into_bytes();
            let key = [&entries_from(d, hash)[..], &name].concat();
            let value = Dentry {
                child: 1000 + expected.len() as u64,
                kind: Kind::File,
            };
            txn.put(&key, &value.encode()).unwrap();
            expected.push(name);
        }
    }
    txn.commit().unwrap();
    expected.sort();
    for page in [1, 2, 7, 255, 256, 257, 1000] {
        let (mut listed, mut cookie) = (Vec::new(), 0);
        for _ in 0..expected.len() + 2 {
            let got = meta.readdir(d, cookie, page).unwrap();
            let Some(last) = got.last() else { break };
            cookie = last.cookie;
            listed.extend(got.into_iter().map(|e| e.name));
        }
        listed.sort();
        assert_eq!(listed, expected, "pages of {page}");
    }
}

/// Rewrites every name of `store` as format 7 kept it (a name key, `D parent n name` → child,
/// cookie, kind, and a readdir index entry, `D parent c cookie` → child, kind, name), except
/// the first `keep` in key order, left as format 8 (what a server killed during the upgrade
/// leaves); without any kept, the name hash key goes too, as format 7 had none. Every inode
/// becomes a fixed record.
fn to_format_7(store: &MemStore, keep: usize) {
    use calm_meta::layout::{KEY_FORMAT, entry_key_parts};
    let mut txn = store.begin().unwrap();
    let mut found = Vec::new();
    txn.visit(b"D", b"E", &mut |key, value| {
        found.push((key.to_vec(), value.to_vec()));
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    for (cookie, (key, value)) in (3u64..).zip(found.into_iter().skip(keep)) {
        let (parent, _, name) = entry_key_parts(&key).unwrap();
        let dentry = Dentry::decode(&value).unwrap();
        let prefix = &key[..9];
        let mut old = [prefix, b"n", name].concat();
        let mut v = dentry.child.to_le_bytes().to_vec();
        v.extend_from_slice(&cookie.to_le_bytes());
        v.push(dentry.kind as u8);
        txn.put(&old, &v).unwrap();
        old = [prefix, b"c", &cookie.to_be_bytes()].concat();
        let mut v = dentry.child.to_le_bytes().to_vec();
        v.push(dentry.kind as u8);
        v.extend_from_slice(name);
        txn.put(&old, &v).unwrap();
        txn.delete(&key).unwrap();
        assert_eq!(parent, calm_meta::layout::key_handle(&key).unwrap());
    }
    if keep == 0 {
        txn.delete(KEY_NAME_HASH).unwrap();
    }
    // And every inode as the fixed record format 7 wrote.
    let mut inodes = Vec::new();
    txn.visit(b"I", b"J", &mut |key, value| {
        inodes.push((key.to_vec(), value.to_vec()));
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    for (key, value) in inodes {
        let handle = calm_meta::layout::key_handle(&key).unwrap();
        let inode = calm_meta::layout::Inode::decode(handle, &value).unwrap();
        txn.put(&key, &inode.encode_fixed()).unwrap();
    }
    let mut format = txn.get(KEY_FORMAT).unwrap().unwrap().to_vec();
    format[8..12].copy_from_slice(&7u32.to_le_bytes());
    txn.put(KEY_FORMAT, &format).unwrap();
    txn.commit().unwrap();
}

/// Every entry of `dir`, in pages of 7.
fn readdir_all<S: Store>(meta: &Meta<S>, dir: Handle) -> Vec<DirEntry> {
    let (mut all, mut cookie) = (Vec::new(), 0);
    loop {
        let page = meta.readdir(dir, cookie, 7).unwrap();
        let Some(last) = page.last() else { return all };
        cookie = last.cookie;
        all.extend(page);
    }
}

/// A format-7 store (two keys per name) opened by this build: every name moved to its one key,
/// in transactions of a few names, also when an earlier upgrade was cut off half-way; listings,
/// lookups and fsck agree with what was there, and the namespace goes on.
#[test]
fn a_format_7_store_gets_one_key_per_name_also_after_an_upgrade_cut_off() {
    use calm_meta::layout::{FORMAT_VERSION, INODE_COMPACT, KEY_FORMAT, check_format};
    let rt = rt();
    for keep in [0, 150] {
        let store = Arc::new(MemStore::new());
        let expected = {
            let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
            let expected = rt.block_on(async {
                let mut expected = Vec::new();
                for d in 0..3 {
                    let dir = meta.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755).await;
                    let dir = dir.unwrap().handle;
                    let mut listed = Vec::new();
                    for i in 0..100 {
                        let name = format!("file-{i:03}").into_bytes();
                        let handle = meta.create(dir, &name, 0o644).await.unwrap().handle;
                        listed.push((name, handle));
                    }
                    listed.sort();
                    expected.push((dir, listed));
                }
                expected
            });
            let store = meta.shutdown();
            drop(store);
            expected
        };
        to_format_7(&store, keep);
        let rewritten = calm_meta::upgrade::names_in_steps(&*store, 7).unwrap();
        assert_eq!(rewritten, 303 - keep as u64, "every name left in format 7");
        let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
        let format = store
            .snapshot()
            .unwrap()
            .get(KEY_FORMAT)
            .unwrap()
            .unwrap()
            .to_vec();
        assert_eq!(check_format(&format).unwrap(), FORMAT_VERSION);
        clean(&meta);
        for (dir, listed) in &expected {
            let mut got: Vec<_> = readdir_all(&meta, *dir)
                .into_iter()
                .map(|e| (e.name, e.handle))
                .collect();
            got.sort();
            assert_eq!(&got, listed);
            for (name, handle) in listed {
                assert_eq!(meta.lookup(*dir, name).unwrap().handle, *handle);
            }
        }
        rt.block_on(async {
            let (d0, _) = &expected[0];
            meta.create(*d0, b"after", 0o644).await.unwrap();
            meta.unlink(*d0, b"file-000").await.unwrap();
            meta.rename(*d0, b"file-001", expected[1].0, b"moved", 0)
                .await
                .unwrap();
        });
        clean(&meta);
        // A changed inode is written compact; one left alone keeps its fixed record.
        let record = |handle| {
            let snap = store.snapshot().unwrap();
            snap.get(&inode_key(handle)).unwrap().unwrap()[0]
        };
        let changed = expected[0].0;
        let untouched = expected[2].1[50].1;
        assert_eq!(record(changed) & INODE_COMPACT, INODE_COMPACT);
        assert_eq!(record(untouched) & INODE_COMPACT, 0);
    }
}

/// A store of format 3 (no parent recorded for non-directories) opened by this build: upgraded
/// in place, fsck clean, the old files' parents unknown until a rename gives them one, new
/// files' known; a file made after the upgrade without a parent is a problem fsck reports.
#[test]
fn a_format_3_store_is_upgraded_and_its_files_learn_their_parents() {
    use calm_meta::layout::{Inode, KEY_FORMAT, KEY_PARENTS_FROM, links_range};
    let rt = rt();
    let store = Arc::new(MemStore::new());
    let (d, old, linked) = {
        let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
        rt.block_on(async {
            let d = meta.mkdir(ROOT, b"d", 0o755).await.unwrap().handle;
            let old = meta.create(d, b"old", 0o644).await.unwrap().handle;
            let linked = meta.create(d, b"linked", 0o644).await.unwrap().handle;
            meta.link(linked, ROOT, b"alias").await.unwrap();
            (d, old, linked)
        })
    };
    // What version 3 wrote: no parent for non-directories, no `L` keys.
    let mut txn = store.begin().unwrap();
    for handle in [old, linked] {
        let mut inode =
            Inode::decode(handle, &txn.get(&inode_key(handle)).unwrap().unwrap()).unwrap();
        inode.parent = 0;
        txn.put(&inode_key(handle), &inode.encode()).unwrap();
    }
    let (start, end) = links_range(linked);
    for (key, _) in txn.scan(&start, &end, 100).unwrap() {
        txn.delete(&key).unwrap();
    }
    let mut format = txn.get(KEY_FORMAT).unwrap().unwrap().to_vec();
    format[8..12].copy_from_slice(&3u32.to_le_bytes());
    txn.put(KEY_FORMAT, &format).unwrap();
    txn.delete(KEY_PARENTS_FROM).unwrap();
    txn.commit().unwrap();

    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    clean(&meta);
    assert!(meta.parents(old).unwrap().is_empty(), "not known yet");
    assert!(meta.parents(linked).unwrap().is_empty());
    rt.block_on(async {
        meta.rename(d, b"old", ROOT, b"old", 0).await.unwrap();
        let new = meta.create(d, b"new", 0o644).await.unwrap().handle;
        assert_eq!(meta.parents(old).unwrap(), [ROOT], "a rename tells");
        assert_eq!(meta.parents(new).unwrap(), [d]);
        // A file with two names from before stays unknown; links and unlinks keep it so.
        meta.link(linked, d, b"again").await.unwrap();
        meta.unlink(ROOT, b"alias").await.unwrap();
        assert!(meta.parents(linked).unwrap().is_empty());
        clean(&meta);

        // A file made after the upgrade without its parent is a problem.
        drop_parent(&store, new);
        let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains(&format!("inode {new} records no parent"))),
            "{:?}",
            report.problems
        );
    });
}

fn drop_parent(store: &Arc<MemStore>, handle: Handle) {
    let mut txn = store.begin().unwrap();
    let mut inode =
        layout::Inode::decode(handle, &txn.get(&inode_key(handle)).unwrap().unwrap()).unwrap();
    inode.parent = 0;
    txn.put(&inode_key(handle), &inode.encode()).unwrap();
    txn.commit().unwrap();
}

/// A write, a truncate and a chown take a file's capabilities away (the kernel leaves it to
/// the server: FUSE_HANDLE_KILLPRIV_V2), and nothing else: other xattrs stay, and a chmod or
/// a setattr that changes no owner and no size keeps them.
#[test]
fn writes_truncates_and_chowns_drop_file_capabilities() {
    let rt = rt();
    let meta = mem();
    let cap = b"security.capability";
    let file = rt.block_on(meta.create(ROOT, b"f", 0o755)).unwrap().handle;
    let set = |what: &str| {
        rt.block_on(meta.setxattr(file, cap, b"caps", 0)).unwrap();
        rt.block_on(meta.setxattr(file, b"user.keep", what.as_bytes(), 0))
            .unwrap();
    };
    let has_cap = || meta.getxattr(file, cap).is_ok();
    let kept = |what: &str| {
        assert_eq!(meta.getxattr(file, b"user.keep").unwrap(), what.as_bytes());
    };

    set("chmod");
    let chmod = SetAttr {
        mode: Some(0o750),
        ..SetAttr::default()
    };
    rt.block_on(meta.setattr(file, chmod)).unwrap();
    let same_owner = SetAttr {
        uid: Some(0),
        ..SetAttr::default()
    };
    rt.block_on(meta.setattr(file, same_owner)).unwrap();
    assert!(has_cap(), "a chmod or a chown to the same owner keeps them");

    let write = slices::Slice::hole(0, 10);
    rt.block_on(meta.write(Caller::default(), file, vec![(0, write)], 0, Vec::new()))
        .unwrap();
    assert!(!has_cap(), "a write drops them");
    kept("chmod");

    set("truncate");
    let truncate = SetAttr {
        size: Some(3),
        ..SetAttr::default()
    };
    rt.block_on(meta.setattr(file, truncate)).unwrap();
    assert!(!has_cap(), "a truncate drops them");
    kept("truncate");

    set("chown");
    let chown = SetAttr {
        uid: Some(42),
        ..SetAttr::default()
    };
    rt.block_on(meta.setattr(file, chown)).unwrap();
    assert!(!has_cap(), "a chown drops them");
    kept("chown");
    clean(&meta);
}

/// A mutation sent again with its request id (its client lost the answer) answers as the
/// first attempt did and applies nothing twice; records a client acknowledged are deleted,
/// and fsck knows the records.
#[test]
fn a_request_sent_again_answers_as_the_first_attempt_and_applies_once() {
    use calm_meta::ops::{Done, Op};
    use calm_meta::requests::{RequestId, key};
    let rt = rt();
    let meta = mem();
    let id = |seq, acked| {
        Some(RequestId {
            client: 42,
            seq,
            acked,
        })
    };
    let make = Op::Make {
        parent: ROOT,
        name: b"f".to_vec(),
        node: NewNode::file(0o644, 0, 0),
        exclusive: true,
    };
    let first = rt
        .block_on(meta.apply_request(Caller::default(), make.clone(), id(1, 0)))
        .unwrap();
    let again = rt
        .block_on(meta.apply_request(Caller::default(), make.clone(), id(1, 0)))
        .unwrap();
    assert_eq!(first, again, "a create sent again answers the same file");
    // Without the id, the same create is a new one, and fails: the name exists.
    assert_eq!(
        rt.block_on(meta.apply_as(Caller::default(), make.clone()))
            .unwrap_err()
            .errno(),
        17
    );
    let unlink = Op::Unlink {
        parent: ROOT,
        name: b"f".to_vec(),
        keep: Vec::new(),
    };
    for _ in 0..2 {
        assert_eq!(
            rt.block_on(meta.apply_request(Caller::default(), unlink.clone(), id(2, 1)))
                .unwrap(),
            Done::Nothing,
            "an unlink sent again succeeds as the first did"
        );
    }
    assert_eq!(meta.lookup(ROOT, b"f").unwrap_err().errno(), 2);
    let snapshot = meta.store().snapshot().unwrap();
    assert!(snapshot.get(&key(42, 1)).unwrap().is_none(), "acknowledged");
    assert!(snapshot.get(&key(42, 2)).unwrap().is_some());
    drop(snapshot);
    clean(&meta);
}

/// A request deletes only its client's acknowledged records above what a committed request
/// deleted already: a record left below (a request its client gave up on, arriving late) is
/// the sweep's, and no request reads from the client's first record again (on etcd, deleted
/// keys stay until a compaction, and such a read would walk every record the client ever
/// had). A server that never saw the client reads its last `ACKED_DELETES_MAX` numbers.
#[test]
fn a_request_deletes_only_its_clients_records_above_the_last_deletion() {
    use calm_meta::ops::Op;
    use calm_meta::requests::{ACKED_DELETES_MAX, RequestId, key};
    let rt = rt();
    let make = |i: u64| Op::Make {
        parent: ROOT,
        name: format!("f{i}").into_bytes(),
        node: NewNode::file(0o644, 0, 0),
        exclusive: true,
    };
    let id = |seq: u64| {
        Some(RequestId {
            client: 42,
            seq,
            acked: seq - 1,
        })
    };
    let records = |meta: &Meta<Arc<MemStore>>| {
        let snapshot = meta.store().snapshot().unwrap();
        let mut seqs = Vec::new();
        snapshot
            .visit(&key(42, 0), &key(43, 0), &mut |k, _| {
                seqs.push(u64::from_be_bytes(k[9..17].try_into().unwrap()));
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
        seqs
    };
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    for seq in 1..=100 {
        rt.block_on(meta.apply_request(Caller::default(), make(seq), id(seq)))
            .unwrap();
    }
    assert_eq!(
        records(&meta),
        vec![100],
        "each request deleted the one before"
    );
    let last = meta
        .store()
        .snapshot()
        .unwrap()
        .get(&key(42, 100))
        .unwrap()
        .unwrap()
        .to_vec();
    let late = |seq: u64| {
        let mut txn = store.begin().unwrap();
        txn.put(&key(42, seq), &last).unwrap();
        txn.commit().unwrap();
    };
    late(50);
    for seq in 101..=110 {
        rt.block_on(meta.apply_request(Caller::default(), make(seq), id(seq)))
            .unwrap();
    }
    assert_eq!(
        records(&meta),
        vec![50, 110],
        "below the last deletion: the sweep's"
    );
    // Another committer over the same store (a restart, another server) does not know the
    // client: it deletes in the client's last ACKED_DELETES_MAX numbers, not below.
    drop(meta);
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let far = 110 + ACKED_DELETES_MAX as u64 + 5;
    late(far - ACKED_DELETES_MAX as u64 - 1);
    late(far - ACKED_DELETES_MAX as u64);
    rt.block_on(meta.apply_request(Caller::default(), make(far), id(far)))
        .unwrap();
    assert_eq!(
        records(&meta),
        vec![50, 110, far - ACKED_DELETES_MAX as u64 - 1, far],
        "the window of an unknown client"
    );
    drop(meta);
}

/// The records a client leaves behind (its last request, which nothing acknowledges) are
/// found expired by their time, resumed across passes, and swept by the housekeeping thread;
/// a record of format 6 (no time) is swept too, and fsck accepts both forms.
#[test]
fn request_records_a_client_left_behind_expire() {
    use calm_meta::requests::{RequestId, SWEEP_KEYS_MAX, expired, key, written_ns};
    let rt = rt();
    let kept = std::time::Duration::from_millis(300);
    let meta = Meta::open(
        MemStore::new(),
        MetaOptions {
            request_records_kept: kept,
            ..MetaOptions::default()
        },
    )
    .unwrap();
    let first = RequestId {
        client: 7,
        seq: 1,
        acked: 0,
    };
    let make = |name: &[u8]| ops::Op::Make {
        parent: ROOT,
        name: name.to_vec(),
        node: NewNode::file(0o644, 0, 0),
        exclusive: true,
    };
    let done = rt
        .block_on(meta.apply_request(Caller::default(), make(b"f"), Some(first)))
        .unwrap();
    let snapshot = meta.store().snapshot().unwrap();
    let value = snapshot
        .get(&key(7, 1))
        .unwrap()
        .expect("recorded")
        .to_vec();
    let at = written_ns(&value).expect("version 7 records their time");
    // Expiry is by the record's time, never by when the sweep runs.
    let (old, next) = expired(&snapshot, &key(0, 0), at).unwrap();
    assert!(old.is_empty() && next.is_none(), "not older than itself");
    let (old, _) = expired(&snapshot, &key(0, 0), at + 1).unwrap();
    assert_eq!(old, vec![key(7, 1)]);
    drop(snapshot);
    assert_eq!(
        rt.block_on(meta.apply_request(Caller::default(), make(b"f"), Some(first)))
            .unwrap(),
        done,
        "sent again before the sweep: the first answer"
    );
    // A version-6 record and more records than one pass reads.
    {
        let mut txn = meta.store().begin().unwrap();
        txn.put(&key(8, 1), &[0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let mut newer = value.clone();
        newer[9..17].copy_from_slice(&i64::MAX.to_le_bytes());
        for seq in 0..SWEEP_KEYS_MAX as u64 + 10 {
            txn.put(&key(9, seq + 1), &newer).unwrap();
        }
        txn.commit().unwrap();
    }
    clean(&meta);
    let snapshot = meta.store().snapshot().unwrap();
    let (old, next) = expired(&snapshot, &key(0, 0), at + 1).unwrap();
    assert_eq!(
        old,
        vec![key(7, 1), key(8, 1)],
        "a record without a time is expired"
    );
    let next = next.expect("a pass stops after SWEEP_KEYS_MAX records");
    let (old, last) = expired(&snapshot, &next, i64::MAX - 1).unwrap();
    assert_eq!(old.len(), 0);
    assert!(last.is_none(), "the second pass reaches the end");
    drop(snapshot);
    // The thread sweeps the expired ones and keeps the others.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let snapshot = meta.store().snapshot().unwrap();
        let gone = [key(7, 1), key(8, 1)]
            .iter()
            .all(|k| snapshot.get(k).unwrap().is_none());
        if gone {
            assert!(snapshot.get(&key(9, 1)).unwrap().is_some(), "not expired");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not swept within 10 s"
        );
        drop(snapshot);
        std::thread::sleep(kept / 4);
    }
    clean(&meta);
}
