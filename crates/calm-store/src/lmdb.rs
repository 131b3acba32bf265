//! The embedded backend: one LMDB environment (through heed) holding one unnamed B+tree.
//!
//! LMDB gives exactly the shape calm needs for fast restarts: opening an environment reads two
//! meta pages and nothing else, whatever the size of the tree, and a crash (even kill -9 in the
//! middle of a commit) leaves the last committed meta page valid, so there is no recovery pass.
//! Every commit is synchronous (the default `MDB_SYNC` behaviour): when [`WriteTxn::commit`]
//! returns, the data and the new meta page are on the medium. Callers amortise that fsync by
//! grouping many operations into one transaction (calm-meta's group commit).
//!
//! Writers are serialised by LMDB itself; readers never block and are never blocked.

use std::borrow::Cow;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, RoTxn, RwTxn, WithoutTls};

use crate::{ReadTxn, Result, Store, StoreError, Visitor, WriteTxn, check_limits};

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
    /// Open without any write access (fsck, inspection). The directory must hold a store.
    pub read_only: bool,
}

impl Default for LmdbOptions {
    fn default() -> Self {
        Self {
            map_size_bytes: MAP_SIZE_BYTES_DEFAULT,
            max_readers: MAX_READERS_DEFAULT,
            read_only: false,
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
        other => StoreError::Io(other.to_string()),
    }
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
        let mut builder = EnvOpenOptions::new().read_txn_without_tls();
        builder
            .map_size(options.map_size_bytes)
            .max_readers(options.max_readers);
        if options.read_only {
            // SAFETY: READ_ONLY only restricts what this handle may do.
            unsafe {
                builder.flags(EnvFlags::READ_ONLY);
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
        Ok(Self {
            env,
            db,
            path: dir.to_path_buf(),
            poisoned: AtomicBool::new(false),
        })
    }

    /// The directory of the store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the environment and waits until LMDB has released it, so that the same
    /// directory can be opened again in this process (restart tests and benchmarks).
    pub fn close(self) {
        let event = self.env.prepare_for_closing();
        event.wait();
    }
}

/// A read snapshot of an [`LmdbStore`].
pub struct LmdbSnapshot<'s> {
    txn: RoTxn<'s, WithoutTls>,
    db: Database<Bytes, Bytes>,
}

/// A write transaction of an [`LmdbStore`].
pub struct LmdbTxn<'s> {
    txn: RwTxn<'s>,
    db: Database<Bytes, Bytes>,
    poisoned: &'s AtomicBool,
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
}

impl WriteTxn for LmdbTxn<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        self.db.put(&mut self.txn, key, value).map_err(map_err)
    }

    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        // MDB_APPEND: LMDB checks the order itself (MDB_KEYEXIST otherwise) and splits a full
        // page at its end instead of its middle, so an append log fills its pages.
        match self
            .db
            .put_with_flags(&mut self.txn, heed::PutFlags::APPEND, key, value)
        {
            Ok(()) => Ok(()),
            Err(heed::Error::Mdb(MdbError::KeyExist)) => Err(StoreError::Limit(format!(
                "append of {key:?}, which is not above the greatest key"
            ))),
            Err(other) => Err(map_err(other)),
        }
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_limits(key, &[])?;
        self.db.delete(&mut self.txn, key).map_err(map_err)
    }

    fn commit(self) -> Result<()> {
        match self.txn.commit() {
            Ok(()) => Ok(()),
            Err(error) => {
                // A failed commit may have written some pages; LMDB keeps the previous meta
                // page valid, but this process no longer knows what the page cache holds.
                self.poisoned.store(true, Ordering::SeqCst);
                Err(map_err(error))
            }
        }
    }
}

impl Store for LmdbStore {
    type Snapshot<'s> = LmdbSnapshot<'s>;
    type Txn<'s> = LmdbTxn<'s>;

    fn snapshot(&self) -> Result<LmdbSnapshot<'_>> {
        Ok(LmdbSnapshot {
            txn: self.env.read_txn().map_err(map_err)?,
            db: self.db,
        })
    }

    fn begin(&self) -> Result<LmdbTxn<'_>> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned);
        }
        Ok(LmdbTxn {
            txn: self.env.write_txn().map_err(map_err)?,
            db: self.db,
            poisoned: &self.poisoned,
        })
    }

    fn size_bytes(&self) -> Result<u64> {
        self.env.real_disk_size().map_err(map_err)
    }
}
