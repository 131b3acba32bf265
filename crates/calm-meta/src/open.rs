//! Opening a store: formatting an empty one (with its place among several clusters, if any),
//! upgrading an older one, reading the superblock and the changelog's readers (nothing that
//! grows with the file count), and starting the committer, the housekeeping thread and, on a
//! shared store, the follower of other servers' commits.

use super::*;

impl<S: Store> Meta<S> {
    /// Opens the namespace on `store`, formatting an empty store. Reads a constant number of
    /// keys and commits one small transaction (the epoch bump).
    pub fn open(store: S, options: MetaOptions) -> Result<Self> {
        let store = Arc::new(store);
        upgrade::names(&*store)?;
        upgrade::usage(&*store)?;
        // A shared store may see another server open at the same moment: run again on a
        // conflict.
        let mut tries = 0;
        let (opened, cl) = loop {
            match open_txn(&*store, &options)? {
                Some(opened) => break opened,
                None if tries < commit::CONFLICT_RETRIES_MAX => tries += 1,
                None => {
                    return Err(MetaError::Busy(
                        "opening: the store kept conflicting with other servers".into(),
                    ));
                }
            }
        };

        let (sender, receiver) = mpsc::channel(options.queue_ops_max);
        let last_sender = Arc::new(commit::LastIndex::new(cl.last));
        let stats = Arc::new(CommitStats::default());
        let plan = housekeeping::Plan::new(&options);
        let trash_kept = options.trash_kept;
        let replaced = Arc::new(std::sync::Mutex::new(crate::replaced::Replaced::default()));
        let shares = Arc::new(crate::quota::Shares::default());
        // Another server's records: a follower publishes the last index they reach.
        let commits = store.watch_commits()?;
        let shared = store.shared();
        let committer = {
            let store = store.clone();
            let stats = stats.clone();
            let last_sender = last_sender.clone();
            let replaced = replaced.clone();
            let shares = shares.clone();
            std::thread::Builder::new()
                .name("calm-commit".into())
                .spawn(move || {
                    let kept = (last_sender, replaced, shares);
                    commit::run(store, receiver, options, opened, cl, kept, stats)
                })
                .map_err(|e| MetaError::Io(format!("starting the committer: {e}")))?
        };
        let (housekeeping_stop, housekeeping) = if plan.idle() {
            (None, None)
        } else {
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let queue = sender.downgrade();
            let store = Arc::downgrade(&store);
            let thread = std::thread::Builder::new()
                .name("calm-housekeep".into())
                .spawn(move || housekeeping::run(store, queue, stopped, plan))
                .map_err(|e| MetaError::Io(format!("starting the housekeeping thread: {e}")))?;
            (Some(stop), Some(thread))
        };
        let last_sender_for_meta = last_sender.clone();
        if let Some(commits) = commits {
            let store = Arc::downgrade(&store);
            std::thread::Builder::new()
                .name("calm-follow".into())
                .spawn(move || follow_commits(store, commits, last_sender))
                .map_err(|e| MetaError::Io(format!("starting the commit follower: {e}")))?;
        }
        Ok(Self {
            store,
            queue: Some(sender),
            committer: Some(committer),
            housekeeping_stop,
            housekeeping,
            last_index: last_sender_for_meta,
            stats,
            epoch: opened.generation,
            names: opened.names,
            shared,
            trash_kept,
            replaced,
            shares,
        })
    }
}

/// The opening transaction: formats an empty store, bumps the epoch, reads the changelog
/// state. `None`: another writer of a shared store committed first; run it again.
fn open_txn<S: Store>(
    store: &S,
    options: &MetaOptions,
) -> Result<Option<(commit::Opened, changelog::ClState)>> {
    let mut txn = store.begin()?;
    match txn.get(KEY_FORMAT)? {
        Some(format) => {
            let version = check_format(&format)?;
            if version < FORMAT_VERSION {
                // Versions 1 to 3 differ only by lacking keys that later ones add as they go;
                // before version 4 no non-directory recorded its parent: those are the
                // handles below today's high-water mark.
                if version < 4 {
                    let mark = match txn.get(KEY_HWM)? {
                        Some(bytes) => calm_store::decode_counter(KEY_HWM, &bytes)?,
                        None => 0,
                    };
                    txn.put(KEY_PARENTS_FROM, &mark.to_le_bytes())?;
                }
                txn.put(KEY_FORMAT, &format_value())?;
            }
        }
        None => {
            if txn.any_in(b"", b"")? {
                return Err(MetaError::Corrupt(
                    "the store holds data but no calm superblock".into(),
                ));
            }
            format_store(&mut txn, options.place.as_ref())?;
        }
    }
    place::check(&txn, options.place.as_ref())?;
    match (txn.get(KEY_OBJECTS)?, &options.objects_url) {
        (Some(kept), Some(given)) if kept.as_ref() != given.as_bytes() => {
            return Err(MetaError::Invalid(format!(
                "this namespace keeps its file contents in {}; it cannot move to {given}",
                String::from_utf8_lossy(&kept)
            )));
        }
        (Some(_), _) => {}
        (None, given) => {
            if let Some(url) = given.as_ref().or(options.objects_url_default.as_ref()) {
                txn.put(KEY_OBJECTS, url.as_bytes())?;
            }
        }
    }
    if txn.get(KEY_NAMESPACE_ID)?.is_none() {
        txn.put(KEY_NAMESPACE_ID, &random_id())?;
    }
    if txn.get(KEY_OBJECTS_OWNER)?.is_none() {
        txn.put(KEY_OBJECTS_OWNER, &random_id())?;
    }
    let names = match txn.get(KEY_NAME_HASH)? {
        Some(key) => layout::NameHash::from_value(&key)?,
        None => {
            return Err(MetaError::Corrupt(
                "the store has no name hash key (Snamehash)".into(),
            ));
        }
    };
    let epoch = txn.add(KEY_EPOCH, 1)?;
    let cl = changelog::ClState::load(&txn, options.changelog, store.shared())?;
    let opened = commit::Opened {
        generation: epoch,
        names,
        trash: !options.trash_kept.is_zero(),
    };
    match txn.commit() {
        Ok(()) => Ok(Some((opened, cl))),
        Err(calm_store::StoreError::Conflict) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// For a shared store: after each burst of commits by anyone, reads the last changelog index
/// on a snapshot and publishes it (monotonic), so that followers and watches see the records
/// other servers write. Ends when the namespace is gone.
fn follow_commits<S: Store>(
    store: std::sync::Weak<S>,
    commits: std::sync::mpsc::Receiver<()>,
    last_index: Arc<commit::LastIndex>,
) {
    loop {
        match commits.recv_timeout(std::time::Duration::from_secs(1)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if store.strong_count() == 0 {
                    return;
                }
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(store) = store.upgrade() else { return };
        // A shared store keeps the last index in its counter (see `ClState::counted`). The
        // store tells of a commit once a recent snapshot sees it: no round trip for it.
        let reached = store.snapshot_recent().and_then(|snap| {
            snap.get(KEY_CL_LAST)?
                .map(|bytes| calm_store::decode_counter(KEY_CL_LAST, &bytes))
                .transpose()
        });
        drop(store);
        match reached {
            Ok(Some(reached)) => {
                last_index.publish(reached);
                last_index.wake_followers();
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "following the store's commits"),
        }
    }
}

/// 16 bytes no other namespace has: the standard library's per-process random hash keys
/// (seeded by the operating system), over the time and the process id.
pub fn random_id() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut id = [0u8; 16];
    for half in id.chunks_mut(8) {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_i64(commit::now_ns());
        hasher.write_u32(std::process::id());
        half.copy_from_slice(&hasher.finish().to_le_bytes());
    }
    id
}

/// Writes the superblock and the root directory of an empty store.
/// A store formatted at a `place` takes its cluster's ranges of handles and slice ids, and
/// cluster 0's name hash key and identity when given.
fn format_store<T: WriteTxn>(txn: &mut T, place: Option<&place::Place>) -> Result<()> {
    let now = commit::now_ns();
    txn.put(KEY_FORMAT, &format_value())?;
    let namespace = place.and_then(|p| p.namespace);
    match namespace {
        Some(keys) => {
            txn.put(KEY_NAME_HASH, &keys.name_key)?;
            txn.put(KEY_NAMESPACE_ID, &keys.id)?;
        }
        None => txn.put(KEY_NAME_HASH, &random_id())?,
    }
    // Handle 0 is never used and 1 is the root: the first allocation starts at 2 (or at the
    // first handle of the store's cluster).
    let first = place.map_or(ROOT + 1, place::Place::first_handle);
    txn.put(KEY_HWM, &first.to_le_bytes())?;
    if let Some(place) = place {
        txn.put(KEY_PLACE, &place.encode())?;
        if place.first_slice_id() > 0 {
            txn.put(KEY_SLICE_NEXT, &place.first_slice_id().to_le_bytes())?;
        }
    }
    let root = Inode {
        handle: ROOT,
        kind: Kind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        generation: 1,
        size: 0,
        rdev: 0,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        parent: ROOT,
        entries: 0,
        target: Vec::new(),
        acls: 0,
        access_acl: None,
    };
    txn.put(&inode_key(ROOT), &root.encode())?;
    let usage = crate::quota::usage_of(Kind::Dir, 0);
    for owner in quota::QuotaTarget::owners(0, 0) {
        txn.put(&quota::usage_key(owner), &quota::encode_usage(&usage))?;
    }
    txn.add(KEY_INODES, 1)?;
    txn.add(KEY_FILE_BYTES, 0)?;
    Ok(())
}
