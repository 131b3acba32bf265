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
use std::time::Duration;

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, RoTxn, RwTxn, WithoutTls};

use crate::reclog::{Bounds, LogOp, Pending, RecordLog};
use crate::wal::{self, Wal};

mod txn;
use crate::{
    LOG_FAMILY, LogVisitor, ReadTxn, Result, Store, StoreError, Visitor, WriteTxn, check_limits,
    check_log_record, keyed_log, log_index, log_key,
};
pub use txn::{LmdbSnapshot, LmdbTxn};
use txn::{TxnLog, visit_range};

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
    /// With the log: when a commit is on the medium (before it returns, or within a bound
    /// after it; see `durable.rs`).
    pub sync: crate::CommitSync,
}

impl Default for LmdbOptions {
    fn default() -> Self {
        Self {
            map_size_bytes: MAP_SIZE_BYTES_DEFAULT,
            max_readers: MAX_READERS_DEFAULT,
            read_only: false,
            wal: true,
            log_segment_records: LOG_SEGMENT_RECORDS_DEFAULT,
            sync: crate::CommitSync::EveryCommit,
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
    /// What the write-ahead log counts (its syncs, bytes, checkpoints), when there is one.
    log_counts: Option<Arc<crate::latency::LogCounts>>,
    /// With `CommitSync::Within`: the records written and not yet synced.
    durable: Option<Arc<crate::durable::Durable>>,
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
        let mut log_counts = None;
        let mut durable = None;
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
                let counts = Arc::new(crate::latency::LogCounts::default());
                log_counts = Some(counts.clone());
                let mut wal = Wal::start(dir, env.clone(), recovered, pin, log.clone(), counts)?;
                if let crate::CommitSync::Within(within) = options.sync {
                    let within = within.min(Duration::from_millis(crate::SYNC_WITHIN_MS_MAX));
                    let made = wal.defer_syncs(within)?;
                    let syncing = made.clone();
                    std::thread::Builder::new()
                        .name("calm-store-sync".into())
                        .spawn(move || syncing.run())
                        .map_err(|e| StoreError::Io(format!("starting the log's syncer: {e}")))?;
                    durable = Some(made);
                }
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
            log_counts,
            durable,
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
        if let Some(durable) = &self.durable {
            durable.close();
        }
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

    fn sync(&self) -> Result<()> {
        match &self.durable {
            Some(durable) => durable.sync(),
            None => Ok(()),
        }
    }

    fn begin(&self) -> Result<LmdbTxn<'_>> {
        if self.poisoned.load(Ordering::SeqCst)
            || self
                .durable
                .as_ref()
                .is_some_and(|d| d.failed.load(Ordering::SeqCst))
        {
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
            purged: false,
        })
    }

    fn size_bytes(&self) -> Result<u64> {
        let log = match &self.log {
            Some(log) => log.size_bytes()?,
            None => 0,
        };
        Ok(self.env.real_disk_size().map_err(map_err)? + log)
    }

    fn log_figures(&self) -> Option<crate::latency::LogFigures> {
        self.log_counts.as_ref().map(|counts| counts.read())
    }
}
