//! The embedded backend: one LMDB environment (through heed) holding one unnamed B+tree.
//!
//! LMDB gives exactly the shape calm needs for fast restarts: opening an environment reads two
//! meta pages and nothing else, whatever the size of the tree, and a crash (even kill -9 in the
//! middle of a commit) leaves the last committed meta page valid, so there is no recovery pass.
//! Every commit is synchronous: when [`WriteTxn::commit`] returns, it is on the medium. By
//! default that is LMDB's own `MDB_SYNC` (the pages and the new meta page are written and
//! synced); with [`LmdbOptions::wal`] it is one record in a write-ahead log (see `wal.rs`:
//! one sequential write, LMDB's pages written back at checkpoints). Callers amortise the
//! fsync by grouping many operations into one transaction (calm-meta's group commit).
//!
//! With the write-ahead log, the record log ([`WriteTxn::log_append`]) lives in segment files
//! beside the B-tree (`reclog.rs`); without it, under keys of [`crate::LOG_FAMILY`]. Opening a
//! store in the other mode moves its records across (in one transaction).
//!
//! Writers are serialised by LMDB itself; readers never block and are never blocked.

use calm_types::sync::Locked;
use std::borrow::Cow;
use std::ops::Bound;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, RoTxn, RwTxn, WithoutTls};

use crate::reclog::{Bounds, LogOp, Pending, RecordLog};
use crate::wal::{self, Wal};
use crate::{
    LOG_FAMILY, LogVisitor, ReadTxn, Result, Store, StoreError, Visitor, WriteTxn, check_limits,
    check_log_record, keyed_log, log_index, log_key,
};

/// Records per segment file of a new store's record log (with the write-ahead log).
pub const LOG_SEGMENT_RECORDS_DEFAULT: u64 = crate::reclog::SEGMENT_RECORDS_DEFAULT;

/// Default upper bound of the memory map, in bytes: address space only, the file grows with the
/// data. 1 TiB holds several hundred million inodes.
pub const MAP_SIZE_BYTES_DEFAULT: usize = 1 << 40;

/// Default number of concurrent read transactions (LMDB reader slots).
pub const MAX_READERS_DEFAULT: u32 = 1024;

/// How to open an LMDB store.
#[derive(Debug, Clone)]
pub struct LmdbOptions {
    /// Upper bound of the store's size, in bytes; a write past it fails with
    /// [`StoreError::Full`].
    pub map_size_bytes: usize,
    /// Concurrent readers allowed.
    pub max_readers: u32,
    /// Open without any write access (fsck, inspection). The directory must hold a store,
    /// closed cleanly if it has a write-ahead log.
    pub read_only: bool,
    /// Commit through a write-ahead log (one sequential write and `fdatasync` per commit)
    /// instead of LMDB's synchronous commit. A store keeps the mode it was last opened for
    /// writing with; switching is allowed after a clean close.
    pub wal: bool,
    /// With the log: records per segment file of the record log, for a new store (a store
    /// keeps the value it was created with).
    pub log_segment_records: u64,
}

impl Default for LmdbOptions {
    fn default() -> Self {
        Self {
            map_size_bytes: MAP_SIZE_BYTES_DEFAULT,
            max_readers: MAX_READERS_DEFAULT,
            read_only: false,
            wal: true,
            log_segment_records: LOG_SEGMENT_RECORDS_DEFAULT,
        }
    }
}

/// An LMDB environment in a directory (`data.mdb` and `lock.mdb`).
pub struct LmdbStore {
    env: Env<WithoutTls>,
    db: Database<Bytes, Bytes>,
    path: PathBuf,
    /// Set when a commit failed: what reached the disk is unknown, so no further write is
    /// accepted until the store is reopened (LMDB then sees the last good meta page).
    poisoned: AtomicBool,
    /// The write-ahead log, when the store was opened with one. Its lock is taken before
    /// LMDB's write lock and held for the whole write transaction.
    wal: Option<Mutex<Wal>>,
    /// The record log in segment files (with the write-ahead log, or read-only on a store that
    /// was last written with it); `None`: records are keys.
    log: Option<Arc<RecordLog>>,
}

impl std::fmt::Debug for LmdbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmdbStore")
            .field("path", &self.path)
            .finish()
    }
}

fn map_err(error: heed::Error) -> StoreError {
    match error {
        heed::Error::Mdb(MdbError::MapFull) => {
            StoreError::Full("LMDB map is full (raise the map size)".into())
        }
        heed::Error::Io(io) if io.raw_os_error() == Some(libc_enospc()) => {
            StoreError::Full(io.to_string())
        }
        // LMDB's own calls report errno as their code (a commit's page writes).
        heed::Error::Mdb(MdbError::Other(code)) if code == libc_enospc() => {
            StoreError::Full(format!("LMDB: {}", MdbError::Other(code)))
        }
        other => StoreError::Io(other.to_string()),
    }
}

/// Free bytes under which a write that failed is taken for a lack of room.
const NO_ROOM_BYTES: u64 = 4 << 20;

/// Whether the file system of `dir` is (nearly) full, for the process's user (the superuser
/// may use the blocks reserved for it).
fn no_room(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs(3) writes into the zeroed struct we own; `path` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    // SAFETY: geteuid(2) has no preconditions.
    let blocks = if unsafe { libc::geteuid() } == 0 {
        st.f_bfree
    } else {
        st.f_bavail
    };
    (blocks as u64).saturating_mul(st.f_frsize as u64) < NO_ROOM_BYTES
}

/// ENOSPC on every Linux architecture.
const fn libc_enospc() -> i32 {
    28
}

impl LmdbStore {
    /// Opens (creating when allowed and absent) the store in directory `dir`.
    pub fn open(dir: &Path, options: &LmdbOptions) -> Result<Self> {
        if !options.read_only {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))?;
        } else if !dir.join("data.mdb").exists() {
            return Err(StoreError::Io(format!(
                "{} holds no store (no data.mdb)",
                dir.display()
            )));
        }
        // A writable open with the log recovers whatever the log holds (reading it once);
        // any other open refuses a store whose log holds commits it would not see.
        let mut leaving = None;
        let recovered = if options.wal && !options.read_only {
            Some(wal::recover(dir)?)
        } else {
            let pending = wal::pending(dir)?;
            if pending > 0 {
                return Err(StoreError::Io(format!(
                    "{} has {pending} commits in its write-ahead log after the last checkpoint \
                     (it was not closed cleanly, or is open elsewhere): open it for writing \
                     with the log to recover them first",
                    dir.display()
                )));
            }
            if !options.read_only {
                leaving = wal::leave(dir)?;
            }
            None
        };
        let mut builder = EnvOpenOptions::new().read_txn_without_tls();
        builder
            .map_size(options.map_size_bytes)
            .max_readers(options.max_readers);
        if options.read_only {
            // SAFETY: READ_ONLY only restricts what this handle may do.
            unsafe {
                builder.flags(EnvFlags::READ_ONLY);
            }
        } else if recovered.is_some() {
            // SAFETY: NO_SYNC is safe here because durability and crash consistency come from
            // the write-ahead log and its pinned, checkpointed snapshot (see `wal.rs`).
            unsafe {
                builder.flags(EnvFlags::NO_SYNC);
            }
        }
        // SAFETY: the environment files are only ever modified through LMDB (by this process
        // or another calm process using LMDB's own lock file); nothing truncates or rewrites
        // them behind its back.
        let env = unsafe { builder.open(dir) }.map_err(map_err)?;
        let db = if options.read_only {
            let rtxn = env.read_txn().map_err(map_err)?;
            let db = env
                .open_database::<Bytes, Bytes>(&rtxn, None)
                .map_err(map_err)?
                .ok_or_else(|| StoreError::Io("store has no main database".into()))?;
            rtxn.commit().map_err(map_err)?;
            db
        } else {
            let mut wtxn = env.write_txn().map_err(map_err)?;
            let db = env
                .create_database::<Bytes, Bytes>(&mut wtxn, None)
                .map_err(map_err)?;
            wtxn.commit().map_err(map_err)?;
            db
        };
        let (wal, log) = match recovered {
            Some(recovered) => {
                // The checkpointed snapshot (what `data.mdb` holds now) stays pinned while the
                // records after it are replayed, and until the next checkpoint.
                let pin = env.clone().static_read_txn().map_err(map_err)?;
                let mut log_ops = Vec::new();
                let records = &recovered.scanned.records;
                if !records.is_empty() {
                    let mut wtxn = env.write_txn().map_err(map_err)?;
                    for payload in records {
                        for change in wal::changes(payload)? {
                            match change {
                                wal::Change::Put(key, value) => db.put(&mut wtxn, key, value),
                                wal::Change::Delete(key) => db.delete(&mut wtxn, key).map(|_| ()),
                                wal::Change::Log(op) => {
                                    log_ops.push(op);
                                    Ok(())
                                }
                            }
                            .map_err(map_err)?;
                        }
                    }
                    wtxn.commit().map_err(map_err)?;
                    tracing::info!(
                        records = records.len(),
                        "write-ahead log replayed after an unclean close"
                    );
                }
                let (mut bounds, segment_records) = recovered.log(options.log_segment_records);
                // Segments that replayed purges removed before the crash are not looked for:
                // purging them first ends in the same bounds (a purge only moves the first
                // index up, clamped to what is appended by then).
                for op in &log_ops {
                    if let LogOp::Purge { upto } = op {
                        bounds = bounds.purged(*upto);
                    }
                }
                let log = Arc::new(RecordLog::open(dir, bounds, segment_records, true)?);
                let written = log.write(&log_ops)?;
                log.publish(written, || Ok(()))?;
                let wal = Wal::start(dir, env.clone(), recovered, pin, log.clone())?;
                (Some(Mutex::new(wal)), Some(log))
            }
            None if options.read_only => {
                // A store last written with the log keeps its records in its record log,
                // unless they are keys still (a log from before the record log existed).
                let log = match wal::log_at_checkpoint(dir)? {
                    Some((bounds, segment_records)) if !has_log_keys(&env, db)? => Some(Arc::new(
                        RecordLog::open(dir, bounds, segment_records, false)?,
                    )),
                    _ => None,
                };
                (None, log)
            }
            None => (None, None),
        };
        let store = Self {
            env,
            db,
            path: dir.to_path_buf(),
            poisoned: AtomicBool::new(false),
            wal,
            log,
        };
        if let Some(leaving) = leaving {
            store.log_into_keys(dir, leaving.log)?;
            leaving.finish(dir)?;
        }
        if store.log.is_some() && !options.read_only && has_log_keys(&store.env, store.db)? {
            store.log_keys_into_log()?;
        }
        Ok(store)
    }

    /// Opening without the log a store whose records are in its record log: writes them as
    /// keys, in one synchronous commit (a crash before the log is removed does it again).
    fn log_into_keys(&self, dir: &Path, (bounds, segment_records): (Bounds, u64)) -> Result<()> {
        if bounds.is_empty() {
            return Ok(());
        }
        let log = RecordLog::open(dir, bounds, segment_records, false)?;
        let mut wtxn = self.env.write_txn().map_err(map_err)?;
        let mut failed = None;
        let count = log.visit(bounds, 0, &mut |index, record| match self.db.put(
            &mut wtxn,
            &log_key(index),
            record,
        ) {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => {
                failed = Some(map_err(error));
                ControlFlow::Break(())
            }
        })?;
        if let Some(error) = failed {
            return Err(error);
        }
        wtxn.commit().map_err(map_err)?;
        tracing::info!(
            records = count,
            "record log moved into the B-tree (the store is opened without its write-ahead log)"
        );
        Ok(())
    }

    /// Opening with the log a store whose records are keys: moves them into the record log in
    /// one transaction (keys the record log holds already, left by an interrupted move the
    /// other way, are only deleted).
    fn log_keys_into_log(&self) -> Result<()> {
        let mut txn = self.begin()?;
        let mut keyed = Vec::new();
        visit_range(&self.db, &txn.txn, &[LOG_FAMILY], b"", &mut |key, value| {
            keyed.push((key.to_vec(), value.to_vec()));
            ControlFlow::Continue(())
        })?;
        let last = txn.log.as_ref().map_or(0, |log| log.pending.bounds().last);
        let mut moved = 0;
        for (key, value) in &keyed {
            let index = log_index(key).ok_or_else(|| {
                StoreError::Io(format!(
                    "key {key:?} of the record log's family is not a record's"
                ))
            })?;
            if index > last {
                txn.log_append(index, value)?;
                moved += 1;
            }
            txn.delete(key)?;
        }
        txn.commit()?;
        tracing::info!(
            records = moved,
            "log records moved from the B-tree to the record log"
        );
        Ok(())
    }

    /// The directory of the store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the environment (after a last checkpoint, with a write-ahead log) and waits
    /// until LMDB has released it, so that the same directory can be opened again in this
    /// process (restart tests and benchmarks).
    pub fn close(self) {
        let env = self.env.clone();
        drop(self);
        env.prepare_for_closing().wait();
    }

    /// Closes like a process killed with SIGKILL: no last checkpoint, so the next writable
    /// open recovers from the write-ahead log. For crash tests.
    pub fn close_without_checkpoint(mut self) {
        drop(self.wal.take());
        self.close();
    }

    /// When `dir` holds a store whose write-ahead log has commits after its last checkpoint
    /// (an unclean close), recovers them (opens the store with its log and closes it cleanly)
    /// so that it can be opened read-only. Returns how many there were.
    pub fn recover_log(dir: &Path) -> Result<usize> {
        let pending = wal::pending(dir)?;
        if pending > 0 {
            let options = LmdbOptions {
                wal: true,
                ..LmdbOptions::default()
            };
            LmdbStore::open(dir, &options)?.close();
        }
        Ok(pending)
    }

    /// Checkpoints the write-ahead log now (nothing to do without one).
    pub fn checkpoint(&self) -> Result<()> {
        match &self.wal {
            Some(wal) => wal.locked().checkpoint(),
            None => Ok(()),
        }
    }
}

impl Drop for LmdbStore {
    fn drop(&mut self) {
        if let Some(wal) = &self.wal {
            let mut wal = wal.locked();
            if !self.poisoned.load(Ordering::SeqCst)
                && let Err(error) = wal.checkpoint()
            {
                tracing::warn!(%error, "last checkpoint failed: the next open replays the log");
            }
            wal.unpin();
        }
    }
}

/// Whether the B-tree holds keys of the record log's default layout.
fn has_log_keys(env: &Env<WithoutTls>, db: Database<Bytes, Bytes>) -> Result<bool> {
    let rtxn = env.read_txn().map_err(map_err)?;
    let mut any = false;
    visit_range(&db, &rtxn, &[LOG_FAMILY], b"", &mut |_, _| {
        any = true;
        ControlFlow::Break(())
    })?;
    Ok(any)
}

/// A read snapshot of an [`LmdbStore`].
pub struct LmdbSnapshot<'s> {
    txn: RoTxn<'s, WithoutTls>,
    db: Database<Bytes, Bytes>,
    /// The record log and its bounds at this snapshot, when it is in segment files.
    log: Option<(&'s RecordLog, Bounds)>,
}

/// A write transaction's view of the record log in segment files: the bounds with its own
/// changes, and the changes.
struct TxnLog<'s> {
    log: &'s RecordLog,
    pending: Pending,
}

/// A write transaction of an [`LmdbStore`].
pub struct LmdbTxn<'s> {
    txn: RwTxn<'s>,
    db: Database<Bytes, Bytes>,
    poisoned: &'s AtomicBool,
    /// The store's directory (what a failed commit asks for its free space).
    dir: &'s Path,
    /// With a write-ahead log: the log (locked for the whole transaction) and this
    /// transaction's changes, in order, as its record.
    wal: Option<(MutexGuard<'s, Wal>, Vec<u8>)>,
    log: Option<TxnLog<'s>>,
    /// Bytes of the record that are record log operations.
    log_bytes: usize,
}

impl std::fmt::Debug for LmdbSnapshot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LmdbSnapshot")
    }
}

impl std::fmt::Debug for LmdbTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LmdbTxn")
    }
}

/// The LMDB range `start <= key < end`, or None when it is empty. LMDB refuses zero-length
/// keys, even as a range bound: an empty bound means "unbounded".
/// A key range as `BTreeMap::range` and heed take it.
type KeyRange<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

fn bounds<'k>(start: &'k [u8], end: &'k [u8]) -> Option<KeyRange<'k>> {
    if !end.is_empty() && start >= end {
        return None;
    }
    let lower = if start.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Included(start)
    };
    let upper = if end.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(end)
    };
    Some((lower, upper))
}

fn visit_range(
    db: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    start: &[u8],
    end: &[u8],
    visit: &mut Visitor<'_>,
) -> Result<usize> {
    let Some(range) = bounds(start, end) else {
        return Ok(0);
    };
    let mut count = 0;
    for item in db.range(txn, &range).map_err(map_err)? {
        let (key, value) = item.map_err(map_err)?;
        count += 1;
        if visit(key, value).is_break() {
            break;
        }
    }
    Ok(count)
}

/// The last pair of a range: one seek with a reverse cursor.
fn last_in_range(
    db: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_>,
    start: &[u8],
    end: &[u8],
) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let Some(range) = bounds(start, end) else {
        return Ok(None);
    };
    let mut range = db.rev_range(txn, &range).map_err(map_err)?;
    match range.next() {
        Some(item) => {
            let (key, value) = item.map_err(map_err)?;
            Ok(Some((key.to_vec(), value.to_vec())))
        }
        None => Ok(None),
    }
}

impl ReadTxn for LmdbSnapshot<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        Ok(self
            .db
            .get(&self.txn, key)
            .map_err(map_err)?
            .map(Cow::Borrowed))
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        visit_range(&self.db, &self.txn, start, end, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        last_in_range(&self.db, &self.txn, start, end)
    }

    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        match self.log {
            Some((log, bounds)) => log.visit(bounds, from, visit),
            None => keyed_log::visit(self, from, visit),
        }
    }

    fn log_first(&self) -> Result<Option<u64>> {
        match self.log {
            Some((_, bounds)) => Ok(bounds.first_record()),
            None => keyed_log::first(self),
        }
    }

    fn log_last(&self) -> Result<Option<u64>> {
        match self.log {
            Some((_, bounds)) => Ok(bounds.last_record()),
            None => keyed_log::last(self),
        }
    }
}

impl ReadTxn for LmdbTxn<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        Ok(self
            .db
            .get(&self.txn, key)
            .map_err(map_err)?
            .map(Cow::Borrowed))
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        visit_range(&self.db, &self.txn, start, end, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        last_in_range(&self.db, &self.txn, start, end)
    }

    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        let Some(own) = &self.log else {
            return keyed_log::visit(self, from, visit);
        };
        // The committed records (less this transaction's purges), then its own appends.
        let committed = Bounds {
            first: own.pending.bounds().first,
            last: own.log.bounds().last,
        };
        let mut stopped = false;
        let count = own.log.visit(committed, from, &mut |index, record| {
            let flow = visit(index, record);
            stopped = flow.is_break();
            flow
        })?;
        if stopped {
            return Ok(count);
        }
        Ok(count + own.pending.visit(from, visit))
    }

    fn log_first(&self) -> Result<Option<u64>> {
        match &self.log {
            Some(own) => Ok(own.pending.bounds().first_record()),
            None => keyed_log::first(self),
        }
    }

    fn log_last(&self) -> Result<Option<u64>> {
        match &self.log {
            Some(own) => Ok(own.pending.bounds().last_record()),
            None => keyed_log::last(self),
        }
    }
}

impl WriteTxn for LmdbTxn<'_> {
    fn log_append(&mut self, index: u64, record: &[u8]) -> Result<()> {
        let Some(own) = &mut self.log else {
            return keyed_log::append(self, index, record);
        };
        check_log_record(index, record)?;
        own.pending.append(index, record)?;
        if let Some((_, payload)) = &mut self.wal {
            let before = payload.len();
            wal::push_log_append(payload, index, record);
            self.log_bytes += payload.len() - before;
        }
        Ok(())
    }

    fn log_purge(&mut self, from: u64, upto: u64) -> Result<()> {
        let Some(own) = &mut self.log else {
            return keyed_log::purge(self, from, upto);
        };
        if own.pending.purge(upto)
            && let Some((_, payload)) = &mut self.wal
        {
            let before = payload.len();
            wal::push_log_purge(payload, upto);
            self.log_bytes += payload.len() - before;
        }
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        self.db.put(&mut self.txn, key, value).map_err(map_err)?;
        if let Some((_, record)) = &mut self.wal {
            wal::push_put(record, key, value);
        }
        Ok(())
    }

    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        // MDB_APPEND: LMDB checks the order itself (MDB_KEYEXIST otherwise) and splits a full
        // page at its end instead of its middle, so an append log fills its pages.
        match self
            .db
            .put_with_flags(&mut self.txn, heed::PutFlags::APPEND, key, value)
        {
            Ok(()) => {
                if let Some((_, record)) = &mut self.wal {
                    wal::push_put(record, key, value);
                }
                Ok(())
            }
            Err(heed::Error::Mdb(MdbError::KeyExist)) => Err(StoreError::Limit(format!(
                "append of {key:?}, which is not above the greatest key"
            ))),
            Err(other) => Err(map_err(other)),
        }
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_limits(key, &[])?;
        let found = self.db.delete(&mut self.txn, key).map_err(map_err)?;
        if let (true, Some((_, record))) = (found, &mut self.wal) {
            wal::push_delete(record, key);
        }
        Ok(found)
    }

    fn commit(self) -> Result<()> {
        // A store that is full stays usable: the failed commit wrote nothing that counts (LMDB
        // aborts a transaction whose pages could not be written, and raises its own fatal
        // flag, seen by the next `begin`, when a meta page could not), and the next commit
        // is tried once room is back. Any other failure poisons the store.
        let poison = |error: StoreError| {
            if !matches!(error, StoreError::Full(_)) {
                self.poisoned.store(true, Ordering::SeqCst);
            }
            error
        };
        let Some((mut wal, record)) = self.wal else {
            return self.txn.commit().map_err(|error| {
                // A failed commit may have written some pages; LMDB keeps the previous meta
                // page valid, but this process no longer knows what the page cache holds.
                poison(map_err(error))
            });
        };
        if record.is_empty() {
            return self.txn.commit().map_err(|error| poison(map_err(error)));
        }
        // The record first: once it is on the medium the commit is durable (a crash replays
        // it); if writing it fails, LMDB is not touched (the transaction is dropped).
        let at = wal.write(&record).map_err(poison)?;
        // Then the record log's files, past what readers see; then LMDB's commit and the
        // record log's new bounds, together for readers (a snapshot sees both or neither).
        let txn = self.txn;
        let dir = self.dir;
        // LMDB's commit here only writes pages (no sync: NO_SYNC), and a failed one is
        // aborted whole (pages it wrote are free pages no snapshot sees; a failed meta page
        // write sets LMDB's fatal flag, seen by the next `begin`). So the store stays usable.
        // LMDB reports a short write as EIO: on a file system without room, that is ENOSPC.
        let lmdb_commit = || {
            txn.commit().map_err(|error| match map_err(error) {
                StoreError::Io(message) if no_room(dir) => StoreError::Full(message),
                other => other,
            })
        };
        let committed = match self.log {
            Some(own) if own.pending.changed() => own.log.publish(own.pending, lmdb_commit),
            _ => lmdb_commit(),
        };
        if let Err(error) = committed {
            // The record must not be replayed for a commit reported failed (and the next
            // record goes where it was). Once it is cancelled, the store is as it was.
            return Err(match wal.cancel(at) {
                Ok(()) => error,
                Err(cancel) => poison(StoreError::Io(format!("{error}; and then {cancel}"))),
            });
        }
        if wal.applied(at, record.len(), self.log_bytes)
            && let Err(error) = wal.checkpoint()
        {
            // The commit itself is durable (its record) and applied; what failed is making
            // LMDB durable. The previous checkpoint and its pin still stand, so a restart
            // replays from there. Out of room, the next commit tries again; after a failed
            // sync no write is taken.
            if matches!(error, StoreError::Full(_)) {
                tracing::warn!(%error, "checkpoint postponed: no room");
            } else {
                tracing::error!(%error, "checkpoint failed: the store takes no more writes");
                self.poisoned.store(true, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

impl Store for LmdbStore {
    type Snapshot<'s> = LmdbSnapshot<'s>;
    type Txn<'s> = LmdbTxn<'s>;

    fn snapshot(&self) -> Result<LmdbSnapshot<'_>> {
        let Some(log) = self.log.as_deref() else {
            return Ok(LmdbSnapshot {
                txn: self.env.read_txn().map_err(map_err)?,
                db: self.db,
                log: None,
            });
        };
        // The B-tree's snapshot and the record log's bounds of the same commit.
        let (txn, bounds) = log.with_bounds(|bounds| {
            self.env
                .read_txn()
                .map(|txn| (txn, bounds))
                .map_err(map_err)
        })?;
        Ok(LmdbSnapshot {
            txn,
            db: self.db,
            log: Some((log, bounds)),
        })
    }

    fn begin(&self) -> Result<LmdbTxn<'_>> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned);
        }
        // The log's lock first, then LMDB's write lock (every writer goes through here).
        let wal = self.wal.as_ref().map(|wal| (wal.locked(), Vec::new()));
        let txn = self.env.write_txn().map_err(map_err)?;
        // Bounds read with the write lock held: no commit publishes until this one ends.
        let log = self.log.as_deref().map(|log| TxnLog {
            log,
            pending: Pending::new(log.bounds()),
        });
        Ok(LmdbTxn {
            txn,
            db: self.db,
            poisoned: &self.poisoned,
            dir: &self.path,
            wal,
            log,
            log_bytes: 0,
        })
    }

    fn size_bytes(&self) -> Result<u64> {
        let log = match &self.log {
            Some(log) => log.size_bytes()?,
            None => 0,
        };
        Ok(self.env.real_disk_size().map_err(map_err)? + log)
    }
}
