//! The changelog through the namespace: one record per operation with its fields, written only
//! when some reader wants its type, dense indices, clear and the background purge, deregister,
//! the backlog policies, idle GC, follow, and fsck's view of it all.

use std::time::Duration;

use calm_changelog::{BacklogPolicy, ChangelogConfig, Mask, RecordType, flags};
use calm_meta::fsck;
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn meta_with(config: ChangelogConfig) -> Meta<MemStore> {
    let options = MetaOptions {
        changelog: config,
        ..MetaOptions::default()
    };
    Meta::open(MemStore::new(), options).unwrap()
}

fn clean<S: Store>(meta: &Meta<S>) {
    let report = fsck::check(&meta.store().snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

fn all(meta: &Meta<MemStore>) -> Vec<calm_changelog::Record> {
    meta.changelog_read(0, usize::MAX, usize::MAX, None)
        .unwrap()
}

/// Waits (bounded) until `check` holds: the purge runs in the background.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what} did not happen within 5 s");
}

#[test]
fn every_operation_writes_one_record_with_its_fields() {
    let rt = rt();
    let meta = meta_with(ChangelogConfig::default());
    let (dir, file) = rt.block_on(async {
        meta.create(ROOT, b"before", 0o644).await.unwrap();
        // Anyone may make names in the root (uid 1000 does below).
        let open = calm_meta::SetAttr {
            mode: Some(0o777),
            ..Default::default()
        };
        meta.setattr(ROOT, open).await.unwrap();
        assert!(all(&meta).is_empty(), "no reader, no records");
        let reader = meta
            .changelog_register("backup", Mask::all())
            .await
            .unwrap();
        assert_eq!(reader.label(), "cl1");
        let caller = Caller {
            session: 77,
            uid: 1000,
            gid: 100,
            ..Caller::default()
        };
        let d = match meta
            .apply_as(
                caller,
                ops::Op::Make {
                    parent: ROOT,
                    name: b"d".to_vec(),
                    node: NewNode::node(Kind::Dir, 0o755, 1000, 100, 0),
                    exclusive: true,
                },
            )
            .await
            .unwrap()
        {
            ops::Done::Attr(attr) => attr,
            other => panic!("{other:?}"),
        };
        let f = meta.create(d.handle, b"f", 0o644).await.unwrap();
        meta.link(f.handle, ROOT, b"f2").await.unwrap();
        meta.symlink(d.handle, b"s", b"f").await.unwrap();
        meta.make(
            d.handle,
            b"p",
            NewNode::node(Kind::Fifo, 0o644, 0, 0, 0),
            true,
        )
        .await
        .unwrap();
        meta.setattr(
            f.handle,
            SetAttr {
                size: Some(10),
                ..SetAttr::default()
            },
        )
        .await
        .unwrap();
        meta.setattr(
            f.handle,
            SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            },
        )
        .await
        .unwrap();
        meta.setattr(
            f.handle,
            SetAttr {
                mtime: Some(SetTime::Now),
                ..SetAttr::default()
            },
        )
        .await
        .unwrap();
        meta.setxattr(f.handle, b"user.k", b"v", 0).await.unwrap();
        meta.removexattr(f.handle, b"user.k").await.unwrap();
        // Named in d and in the root: both directories are its parents.
        let mut both = vec![d.handle, ROOT];
        both.sort_unstable();
        assert_eq!(meta.parents(f.handle).unwrap(), both);
        meta.create(ROOT, b"victim", 0o644).await.unwrap();
        meta.rename(d.handle, b"f", ROOT, b"victim", 0)
            .await
            .unwrap();
        meta.unlink(ROOT, b"f2").await.unwrap();
        meta.unlink(ROOT, b"victim").await.unwrap();
        meta.unlink(d.handle, b"s").await.unwrap();
        meta.unlink(d.handle, b"p").await.unwrap();
        meta.rmdir(ROOT, b"d").await.unwrap();
        // Refused operations write nothing.
        assert!(meta.unlink(ROOT, b"nope").await.is_err());
        (d.handle, f.handle)
    });
    let records = all(&meta);
    let kinds: Vec<&str> = records.iter().map(|r| r.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "MKDIR", "CREAT", "HLINK", "SLINK", "MKNOD", "TRUNC", "SATTR", "MTIME", "XATTR",
            "XATTR", "CREAT", "RENME", "UNLNK", "UNLNK", "UNLNK", "UNLNK", "RMDIR"
        ]
    );
    let indices: Vec<u64> = records.iter().map(|r| r.index).collect();
    assert_eq!(
        indices,
        (1..=records.len() as u64).collect::<Vec<_>>(),
        "dense from 1"
    );
    let mkdir = &records[0];
    assert_eq!((mkdir.parent, mkdir.name.as_slice()), (ROOT, &b"d"[..]));
    assert_eq!((mkdir.session, mkdir.uid, mkdir.gid), (77, 1000, 100));
    let rename = &records[11];
    let from = rename.rename.as_ref().unwrap();
    assert_eq!(
        (rename.parent, rename.name.as_slice()),
        (ROOT, &b"victim"[..])
    );
    assert_eq!(from.source_name, b"f");
    assert_ne!(from.overwritten, 0);
    assert_eq!(rename.flags, flags::OVERWRITE | flags::LAST_LINK);
    // f2 was a second link of the renamed file: not the last one.
    assert_eq!(records[12].flags, 0);
    assert_eq!(records[13].flags, flags::LAST_LINK);
    assert_eq!(records[16].flags, flags::LAST_LINK);
    // Attribute changes name a directory holding the file (its first name's), so that
    // watchers of that directory get them.
    for record in &records[5..10] {
        assert_eq!(
            (record.target, record.parent),
            (file, dir),
            "{}",
            record.kind.name()
        );
    }
    assert!(records.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    clean(&meta);
}

#[test]
fn a_type_no_reader_wants_is_not_written_and_readers_see_their_mask() {
    let rt = rt();
    let meta = meta_with(ChangelogConfig::default());
    rt.block_on(async {
        let creates = meta
            .changelog_register("", Mask::parse("CREAT").unwrap())
            .await
            .unwrap();
        meta.mkdir(ROOT, b"d", 0o755).await.unwrap();
        meta.create(ROOT, b"f", 0o644).await.unwrap();
        let kinds: Vec<RecordType> = all(&meta).iter().map(|r| r.kind).collect();
        assert_eq!(kinds, [RecordType::Create], "MKDIR is wanted by no one");
        let dirs = meta
            .changelog_register("dirs", Mask::parse("MKDIR").unwrap())
            .await
            .unwrap();
        meta.mkdir(ROOT, b"e", 0o755).await.unwrap();
        meta.create(ROOT, b"g", 0o644).await.unwrap();
        let only = |id| {
            meta.changelog_read(0, 100, usize::MAX, Some(id))
                .unwrap()
                .iter()
                .map(|r| (r.index, r.kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            only(creates.id),
            [(1, RecordType::Create), (3, RecordType::Create)]
        );
        assert_eq!(only(dirs.id), [(2, RecordType::Mkdir)]);
        meta.changelog_set_mask(dirs.id, Mask::parse("MKDIR,UNLNK").unwrap())
            .await
            .unwrap();
        meta.unlink(ROOT, b"g").await.unwrap();
        assert_eq!(
            only(dirs.id),
            [(2, RecordType::Mkdir), (4, RecordType::Unlink)]
        );
        // Limits on a read: records and bytes.
        assert_eq!(
            meta.changelog_read(0, 2, usize::MAX, None).unwrap().len(),
            2
        );
        assert_eq!(meta.changelog_read(0, 100, 1, None).unwrap().len(), 1);
        assert_eq!(
            meta.changelog_read(3, 100, usize::MAX, None).unwrap()[0].index,
            3
        );
        assert_eq!(
            meta.changelog_read(0, 1, 1, Some(99)).unwrap_err(),
            MetaError::NotFound
        );
    });
    clean(&meta);
}

#[test]
fn clear_returns_at_once_and_the_purge_follows_in_the_background() {
    let rt = rt();
    // LMDB: the reference store copies its whole map per transaction, too slow for this.
    let dir = tempfile::tempdir().unwrap();
    let store = calm_store::lmdb::LmdbStore::open(dir.path(), &Default::default()).unwrap();
    let meta = std::sync::Arc::new(Meta::open(store, MetaOptions::default()).unwrap());
    let read_all = || {
        meta.changelog_read(0, usize::MAX, usize::MAX, None)
            .unwrap()
    };
    rt.block_on(async {
        let a = meta.changelog_register("a", Mask::all()).await.unwrap();
        let b = meta.changelog_register("b", Mask::all()).await.unwrap();
        // Concurrent creates: they share group commits, as under real load.
        let tasks: Vec<_> = (0..5000)
            .map(|i| {
                let meta = meta.clone();
                tokio::spawn(async move {
                    let name = format!("f{i}");
                    meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(meta.changelog_users().unwrap().first, 1);
        assert_eq!(meta.changelog_clear(a.id, 0).await.unwrap().cleared, 5000);
        assert_eq!(
            meta.changelog_clear(a.id, 6000).await.unwrap_err().errno(),
            22,
            "clearing past the last record"
        );
        meta.changelog_clear(b.id, 3000).await.unwrap();
        let cleared_back = meta.changelog_clear(b.id, 10).await.unwrap();
        assert_eq!(cleared_back.cleared, 3000, "a clear never moves back");
    });
    eventually("purge up to b's clear", || {
        meta.changelog_users().unwrap().first == 3001
    });
    assert_eq!(read_all().len(), 2000);
    clean(&*meta);
    // Deregistering the last one holding records lets the rest go.
    rt.block_on(meta.changelog_deregister(2)).unwrap();
    eventually("purge of what only b held", || {
        meta.changelog_users().unwrap().first == 5001
    });
    assert!(read_all().is_empty());
    let users = meta.changelog_users().unwrap();
    assert_eq!((users.last, users.users.len()), (5000, 1));
    clean(&*meta);
}

#[test]
fn a_full_backlog_refuses_before_applying_or_gcs_the_most_lagging_reader() {
    let rt = rt();
    let refuse = ChangelogConfig {
        backlog_records_max: 3,
        policy: BacklogPolicy::Refuse,
        ..ChangelogConfig::default()
    };
    let meta = meta_with(refuse);
    rt.block_on(async {
        let r = meta.changelog_register("slow", Mask::all()).await.unwrap();
        for name in [b"a", b"b", b"c"] {
            meta.create(ROOT, name, 0o644).await.unwrap();
        }
        let error = meta.create(ROOT, b"d", 0o644).await.unwrap_err();
        assert!(
            matches!(&error, MetaError::NoSpace(m) if m.contains("cl1")),
            "{error:?}"
        );
        assert_eq!(
            meta.lookup(ROOT, b"d").unwrap_err(),
            MetaError::NotFound,
            "nothing applied"
        );
        meta.changelog_clear(r.id, 2).await.unwrap();
        meta.create(ROOT, b"d", 0o644).await.unwrap();
    });
    clean(&meta);

    let gc = ChangelogConfig {
        backlog_records_max: 3,
        policy: BacklogPolicy::GcMostLagging,
        ..ChangelogConfig::default()
    };
    let meta = meta_with(gc);
    rt.block_on(async {
        let slow = meta.changelog_register("slow", Mask::all()).await.unwrap();
        for name in [b"a", b"b"] {
            meta.create(ROOT, name, 0o644).await.unwrap();
        }
        let fast = meta.changelog_register("fast", Mask::all()).await.unwrap();
        meta.create(ROOT, b"c", 0o644).await.unwrap();
        meta.create(ROOT, b"d", 0o644).await.unwrap();
        let users = meta.changelog_users().unwrap();
        assert_eq!(
            users.users.iter().map(|u| u.id).collect::<Vec<_>>(),
            [fast.id]
        );
        let records = meta
            .changelog_read(0, 100, usize::MAX, Some(fast.id))
            .unwrap();
        let mark = records
            .iter()
            .find(|r| r.kind == RecordType::Mark)
            .expect("a MARK");
        assert_eq!(
            String::from_utf8_lossy(&mark.name),
            format!("cl{} deregistered: backlog limit", slow.id)
        );
        assert_eq!(
            records.last().unwrap().kind,
            RecordType::Create,
            "and the create went on"
        );
    });
    clean(&meta);
}

#[test]
fn idle_readers_are_collected() {
    let rt = rt();
    let config = ChangelogConfig {
        idle_records_max: 10,
        gc_interval_min_ns: 20_000_000,
        ..ChangelogConfig::default()
    };
    let meta = meta_with(config);
    let registered = |id| {
        meta.changelog_users()
            .unwrap()
            .users
            .iter()
            .any(|u| u.id == id)
    };
    let idle = rt.block_on(async {
        let idle = meta.changelog_register("idle", Mask::all()).await.unwrap();
        let busy = meta.changelog_register("busy", Mask::all()).await.unwrap();
        // Behind by fewer records than the limit: however many GC passes run, it stays.
        for i in 0..5 {
            let name = format!("f{i}");
            meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
            meta.changelog_clear(busy.id, 0).await.unwrap();
        }
        let behind = meta.changelog_last() - idle.cleared;
        assert!(behind <= 10, "{behind} records behind");
        std::thread::sleep(Duration::from_millis(200));
        assert!(registered(idle.id), "collected while within the limit");
        // Past the limit: the next GC pass collects it, and only it.
        for i in 5..20 {
            let name = format!("f{i}");
            meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
            meta.changelog_clear(busy.id, 0).await.unwrap();
        }
        assert!(registered(busy.id));
        idle
    });
    eventually("GC of the idle reader", || !registered(idle.id));
    assert!(
        meta.changelog_users().unwrap().users.len() == 1,
        "the busy reader stays"
    );
    clean(&meta);
}

#[test]
fn follow_wakes_when_a_record_commits() {
    let rt = rt();
    let meta = std::sync::Arc::new(meta_with(ChangelogConfig::default()));
    rt.block_on(async {
        meta.changelog_register("f", Mask::all()).await.unwrap();
        let last = meta.changelog_last();
        let waiter = {
            let meta = meta.clone();
            tokio::spawn(async move {
                meta.changelog_wait(last, Duration::from_secs(10))
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        meta.create(ROOT, b"x", 0o644).await.unwrap();
        assert_eq!(waiter.await.unwrap(), last + 1);
        // Nothing new: the wait ends at its timeout with the same index.
        assert_eq!(
            meta.changelog_wait(last + 1, Duration::from_millis(20))
                .await
                .unwrap(),
            last + 1
        );
    });
}

/// A follow read of every type from `from`, up to `max_records`.
async fn follow_from(
    meta: &Meta<MemStore>,
    from: u64,
    max_records: usize,
    min_records: usize,
    linger: Duration,
) -> Vec<calm_changelog::Record> {
    let follow = Follow {
        wait: Duration::from_secs(60),
        min_records,
        linger,
    };
    meta.changelog_follow(from, max_records, usize::MAX, None, follow)
        .await
        .unwrap()
}

#[test]
fn a_batching_follower_answers_at_its_batch_or_after_its_linger() {
    let rt = rt();
    let meta = std::sync::Arc::new(meta_with(ChangelogConfig::default()));
    rt.block_on(async {
        meta.changelog_register("f", Mask::all()).await.unwrap();
        let from = meta.changelog_last() + 1;
        let spawn_follow = |from, min_records, linger| {
            let meta = meta.clone();
            tokio::spawn(async move { follow_from(&meta, from, 100, min_records, linger).await })
        };
        // A batch of 3 and a linger longer than the test: the answer waits for the third.
        let batch = spawn_follow(from, 3, Duration::from_secs(60));
        for name in [b"a", b"b"] {
            meta.create(ROOT, name, 0o644).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!batch.is_finished(), "answered with 2 of a batch of 3");
        meta.create(ROOT, b"c", 0o644).await.unwrap();
        let records = batch.await.unwrap();
        // Gathered over several wake-ups, each record once and in order.
        let got: Vec<(u64, &[u8])> = records.iter().map(|r| (r.index, &r.name[..])).collect();
        assert_eq!(got, [(from, &b"a"[..]), (from + 1, b"b"), (from + 2, b"c")]);
        // A batch larger than what comes: the answer comes after the linger, with what came.
        let next = from + 3;
        meta.create(ROOT, b"d", 0o644).await.unwrap();
        let lingered = follow_from(&meta, next, 100, 1000, Duration::from_millis(5)).await;
        assert_eq!(lingered.len(), 1);
        assert_eq!(lingered[0].name, b"d");
        // Nothing there when the linger ends: the follower waits on for the first record.
        let idle = spawn_follow(next + 1, 1000, Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !idle.is_finished(),
            "answered empty at the end of its linger"
        );
        meta.create(ROOT, b"e", 0o644).await.unwrap();
        let first = idle.await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].name, b"e");
        // At most max_records, however large the batch asked.
        let capped = follow_from(&meta, from, 2, 1000, Duration::from_secs(60)).await;
        assert_eq!(capped.len(), 2);
        // Nothing new and no wait: an empty answer at once.
        let none = meta
            .changelog_follow(
                next + 2,
                100,
                usize::MAX,
                None,
                Follow::batching(Duration::ZERO),
            )
            .await
            .unwrap();
        assert!(none.is_empty());
    });
}

#[test]
fn the_changelog_survives_a_reopen() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let store = calm_store::lmdb::LmdbStore::open(dir.path(), &Default::default()).unwrap();
        Meta::open(store, MetaOptions::default()).unwrap()
    };
    let meta = open();
    rt.block_on(async {
        let r = meta.changelog_register("r", Mask::all()).await.unwrap();
        meta.create(ROOT, b"a", 0o644).await.unwrap();
        meta.changelog_clear(r.id, 1).await.unwrap();
        meta.create(ROOT, b"b", 0o644).await.unwrap();
    });
    drop(meta);
    let meta = open();
    let users = meta.changelog_users().unwrap();
    assert_eq!((users.last, users.users[0].cleared), (2, 1));
    rt.block_on(async {
        meta.create(ROOT, b"c", 0o644).await.unwrap();
        let next = meta.changelog_register("s", Mask::all()).await.unwrap();
        assert_eq!(next.id, 2, "ids are never reused");
    });
    let indices: Vec<u64> = meta
        .changelog_read(0, 100, usize::MAX, Some(1))
        .unwrap()
        .iter()
        .map(|r| r.index)
        .collect();
    assert_eq!(indices, [2, 3]);
    let report = fsck::check(&meta.store().snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_store_failure_drops_the_record_with_its_operation_and_leaves_no_gap() {
    let rt = rt();
    let store = calm_testkit::fault::FaultStore::new(MemStore::new());
    let meta = Meta::open(store, MetaOptions::default()).unwrap();
    rt.block_on(meta.changelog_register("r", Mask::all()))
        .unwrap();
    let mut created = Vec::new();
    for countdown in 0..16 {
        let name = format!("f{countdown}");
        let before = meta.store().inner().dump();
        meta.store().fail_after(countdown);
        let outcome = rt.block_on(meta.create(ROOT, name.as_bytes(), 0o644));
        meta.store().heal();
        match outcome {
            Err(error) => {
                assert_eq!(error.errno(), 5, "an injected store fault is EIO");
                assert!(
                    meta.store().inner().dump() == before,
                    "a failed create left state (fault at {countdown})"
                );
            }
            Ok(_) => created.push(name),
        }
    }
    assert!(
        !created.is_empty() && created.len() < 16,
        "some failed, some went through"
    );
    // The next record follows the last committed one: no index was lost to a failed group.
    rt.block_on(meta.create(ROOT, b"after", 0o644)).unwrap();
    created.push("after".into());
    let records = meta
        .changelog_read(0, usize::MAX, usize::MAX, None)
        .unwrap();
    let indices: Vec<u64> = records.iter().map(|r| r.index).collect();
    assert_eq!(indices, (1..=created.len() as u64).collect::<Vec<_>>());
    let names: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8(r.name.clone()).unwrap())
        .collect();
    assert_eq!(names, created, "exactly the committed creates, in order");
    clean(&meta);
}
