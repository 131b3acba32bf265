//! Dump and load against the obvious model: a loaded store holds exactly the dumped store's
//! pairs (less the clients' request records and the changelog's readers and records, with the
//! handle and slice counters moved past the gap), passes fsck, and goes on without reusing a
//! handle or a slice id; a dump cut or damaged anywhere is refused before anything is written;
//! a load stopped half-way leaves a store that nothing opens.

use std::collections::BTreeMap;
use std::sync::Arc;

use calm_meta::dump::{self, DumpError, LOAD_ID_GAP};
use calm_meta::layout::{KEY_CL_LAST, KEY_FORMAT, KEY_HWM, KEY_OBJECTS_OWNER, KEY_SLICE_NEXT};
use calm_meta::slices::{INLINE, Slice};
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_store::{ReadTxn, Store};
use calm_testkit::fault::FaultStore;
use calm_testkit::fsck_clean;
use proptest::prelude::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A namespace with a bit of everything a dump keeps: directories, files with object and
/// inline slices, hard links, symlinks, xattrs, an ACL, a quota, an orphan-free tree, changelog
/// records; `files` more empty files to make it larger.
fn populated(files: usize) -> Arc<MemStore> {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        meta.changelog_register("follower", calm_changelog::Mask::all())
            .await
            .unwrap();
        let dir = meta.mkdir(ROOT, b"dir", 0o755).await.unwrap().handle;
        let sub = meta.mkdir(dir, b"sub", 0o700).await.unwrap().handle;
        let file = meta.create(dir, b"data", 0o644).await.unwrap().handle;
        let id = meta.alloc_slices(2).await.unwrap();
        let object = Slice {
            id,
            size: 1 << 20,
            off: 0,
            len: 1 << 20,
            pos: 0,
        };
        meta.write(
            Caller::default(),
            file,
            vec![(1, object)],
            (1 << 26) + (1 << 20),
            vec![],
        )
        .await
        .unwrap();
        let inline = Slice {
            id: (id + 1) | INLINE,
            size: 5,
            off: 0,
            len: 5,
            pos: 10,
        };
        meta.write(
            Caller::default(),
            file,
            vec![(0, inline)],
            0,
            vec![((id + 1) | INLINE, b"hello".to_vec())],
        )
        .await
        .unwrap();
        meta.link(file, sub, b"again").await.unwrap();
        meta.symlink(dir, b"link", b"data").await.unwrap();
        meta.setxattr(file, b"user.note", b"kept", 0).await.unwrap();
        let gone = meta.create(ROOT, b"gone", 0o600).await.unwrap().handle;
        meta.setxattr(gone, b"user.x", b"y", 0).await.unwrap();
        meta.unlink(ROOT, b"gone").await.unwrap();
        for i in 0..files {
            meta.create(sub, format!("f{i}").as_bytes(), 0o640)
                .await
                .unwrap();
        }
    });
    drop(meta);
    store
}

fn pairs(store: &MemStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    store.dump().into_iter().collect()
}

fn counter(map: &BTreeMap<Vec<u8>, Vec<u8>>, key: &[u8]) -> u64 {
    map.get(key)
        .map_or(0, |v| u64::from_le_bytes(v.as_slice().try_into().unwrap()))
}

/// The dump of `store` in frames of 4 KiB (many frames of a small namespace).
fn dumped(store: &MemStore) -> (Vec<u8>, dump::DumpSummary) {
    let mut out = Vec::new();
    let snapshot = store.snapshot().unwrap();
    let summary = dump::dump_in_frames(&snapshot, &mut out, 7, 4096, &mut |_| {}).unwrap();
    (out, summary)
}

/// Loads in transactions of 64 pairs (many of them from a small dump).
fn load_bytes<S: Store>(store: &S, bytes: &[u8]) -> Result<dump::DumpSummary, DumpError> {
    dump::load(store, &mut || Ok(bytes), (64, 1 << 20), &mut |_| {})
}

#[test]
fn a_loaded_store_holds_the_dumped_namespace_and_goes_on_past_its_ids() {
    let source = populated(50);
    let (bytes, summary) = dumped(&source);
    let before = pairs(&source);
    let cl_last = source.snapshot().unwrap().log_last().unwrap().unwrap();
    assert!(
        cl_last > 50,
        "the namespace's changes were logged for its reader"
    );
    assert!(
        before.keys().any(|k| k[0] == b'U'),
        "a changelog reader to leave out"
    );
    assert_eq!(summary.changelog_last, cl_last);

    let target = Arc::new(MemStore::new());
    let loaded = load_bytes(&*target, &bytes).unwrap();
    // What was left out (the reader, the changelog's records) only the dump's writer counts.
    assert!(summary.left_out > 50, "{summary:?}");
    assert_eq!(
        loaded,
        dump::DumpSummary {
            left_out: 0,
            ..summary.clone()
        }
    );
    let after = pairs(&target);
    // Exactly the kept pairs, the two id counters moved, the changelog's last index counted.
    let mut expected: BTreeMap<_, _> = before
        .iter()
        .filter(|(k, _)| dump::kept(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for key in [KEY_HWM, KEY_SLICE_NEXT] {
        let moved = counter(&before, key) + LOAD_ID_GAP;
        expected.insert(key.to_vec(), moved.to_le_bytes().to_vec());
    }
    expected.insert(KEY_CL_LAST.to_vec(), cl_last.to_le_bytes().to_vec());
    // A claim on the object store of its own: a loaded copy never owns the original's.
    let claim = after.get(KEY_OBJECTS_OWNER).expect("a claim").clone();
    assert_eq!(claim.len(), 16);
    assert_ne!(Some(&claim), before.get(KEY_OBJECTS_OWNER));
    expected.insert(KEY_OBJECTS_OWNER.to_vec(), claim);
    assert_eq!(after, expected);
    assert_eq!(summary.pairs, after.len() as u64);
    assert!(after.contains_key(KEY_FORMAT));
    fsck_clean(&target);

    // The loaded namespace answers as the old one, and makes handles and ids past the gap.
    let meta = Meta::open(target.clone(), MetaOptions::default()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let dir = meta.lookup(ROOT, b"dir").unwrap();
        let file = meta.lookup(dir.handle, b"data").unwrap();
        assert_eq!(file.size, (1 << 26) + (1 << 20));
        assert_eq!(file.nlink, 2);
        assert_eq!(meta.getxattr(file.handle, b"user.note").unwrap(), b"kept");
        meta.changelog_register("after", calm_changelog::Mask::all())
            .await
            .unwrap();
        let new = meta.create(ROOT, b"new", 0o644).await.unwrap();
        assert!(new.handle >= counter(&before, KEY_HWM) + LOAD_ID_GAP);
        let id = meta.alloc_slices(1).await.unwrap();
        assert!(id >= counter(&before, KEY_SLICE_NEXT) + LOAD_ID_GAP);
    });
    drop(meta);
    fsck_clean(&target);
    // The changelog goes on from the dump's last index.
    let first = target.snapshot().unwrap().log_first().unwrap().unwrap();
    assert!(first > cl_last, "record {first} after {cl_last}");
}

#[test]
fn a_store_that_holds_anything_is_refused_and_kept_as_it_was() {
    let source = populated(3);
    let (bytes, _) = dumped(&source);
    let target = populated(0);
    let before = pairs(&target);
    assert!(matches!(
        load_bytes(&*target, &bytes),
        Err(DumpError::NotEmpty)
    ));
    assert_eq!(pairs(&target), before);
}

#[test]
fn a_load_stopped_half_way_leaves_a_store_no_server_opens() {
    let source = populated(400);
    let (bytes, summary) = dumped(&source);
    assert!(summary.pairs > 10 * 64);
    // A transaction of 64 puts and its commit are 65 write operations.
    for fail_after in [66u64, 65 * 5 + 3, 65 * 9 + 64] {
        let target = FaultStore::new(MemStore::new());
        target.fail_after(fail_after);
        let error = load_bytes(&target, &bytes).unwrap_err();
        assert!(matches!(error, DumpError::Partial(_)), "{error}");
        target.heal();
        let partial = target.inner().dump();
        assert!(!partial.is_empty(), "part of it was written");
        assert!(partial.iter().all(|(k, _)| k != KEY_FORMAT));
        let opened = Meta::open(Arc::new(target), MetaOptions::default());
        let Err(error) = opened else {
            panic!("a half-loaded store opened")
        };
        assert!(error.to_string().contains("no calm superblock"), "{error}");
    }
}

#[test]
fn a_dump_cut_anywhere_is_refused_before_anything_is_written() {
    let source = populated(500);
    let (bytes, _) = dumped(&source);
    assert!(bytes.len() > 4 * 4096, "several frames");
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((0..200).map(|i| i * bytes.len() / 200));
    cuts.extend((1..40).map(|i| bytes.len() - i));
    for cut in cuts {
        let target = MemStore::new();
        let error = load_bytes(&target, &bytes[..cut]).unwrap_err();
        assert!(
            matches!(
                error,
                DumpError::Incomplete { .. } | DumpError::NotADump(_) | DumpError::Damaged(_)
            ),
            "cut at {cut}: {error}"
        );
        assert!(target.dump().is_empty(), "cut at {cut}: nothing written");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        load_bytes(&MemStore::new(), &longer),
        Err(DumpError::Damaged(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any byte changed anywhere: refused, nothing written.
    #[test]
    fn a_dump_damaged_anywhere_is_refused(at in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let (bytes, _) = small_dump();
        let mut damaged = bytes.clone();
        let i = at.index(damaged.len());
        damaged[i] ^= flip;
        let target = MemStore::new();
        let error = load_bytes(&target, &damaged).unwrap_err();
        prop_assert!(
            matches!(error, DumpError::Damaged(_) | DumpError::NotADump(_) | DumpError::Incomplete { .. }),
            "byte {} changed: {}", i, error
        );
        prop_assert!(target.dump().is_empty());
    }
}

fn small_dump() -> (Vec<u8>, dump::DumpSummary) {
    static DUMP: std::sync::OnceLock<(Vec<u8>, dump::DumpSummary)> = std::sync::OnceLock::new();
    DUMP.get_or_init(|| dumped(&populated(20))).clone()
}

#[test]
fn what_a_dump_says_of_itself() {
    let (bytes, summary) = small_dump();
    let verified = dump::verify(bytes.as_slice()).unwrap();
    assert_eq!(
        verified,
        dump::DumpSummary {
            left_out: 0,
            ..summary.clone()
        }
    );
    assert_eq!(summary.created_ns, 7);
    assert_eq!(summary.format, calm_meta::layout::FORMAT_VERSION);
    // The root, dir, sub, data, link and the 20 files.
    assert_eq!(summary.inodes, 25);
    assert!(matches!(
        dump::verify(&b"not a dump at all, but long enough for a header"[..]),
        Err(DumpError::NotADump(_))
    ));
}
