//! `calm-store`: the ordered, transactional key-value seam under calm's metadata.
//!
//! Everything durable that calm keeps goes through the [`Store`] trait: byte-string keys in
//! lexicographic order, snapshot reads, and write transactions that are applied whole or not
//! at all. The namespace (`calm-meta`) is written against this trait only, so that a backend
//! can be swapped (LMDB for one machine, etcd for several) and so that a test can wrap a
//! backend to inject faults.
//!
//! This crate knows nothing about inodes, names or handles: keys and values are opaque bytes.
//! The one exception is [`WriteTxn::add`], which interprets a value as a little-endian `u64`
//! counter, because atomic counters (handle high-water mark, statistics) are the one
//! read-modify-write every backend must be able to do natively.
//!
//! Backends:
//! - [`lmdb::LmdbStore`]: the embedded default (heed over LMDB), one writer at a time, readers
//!   never blocked, every commit durable (fsync) before it returns.
//! - [`mem::MemStore`]: an in-memory `BTreeMap`, the obviously-correct reference model the
//!   other backends are checked against. It is not durable and never used by the server.
//!
//! The suite of behaviours every backend must pass is `calm-testkit`'s `conformance`.

use std::borrow::Cow;
use std::ops::ControlFlow;

#[cfg(feature = "lmdb")]
mod disk;
#[cfg(feature = "lmdb")]
mod durable;
pub mod latency;
#[cfg(feature = "lmdb")]
pub mod lmdb;
pub mod mem;
#[cfg(feature = "lmdb")]
mod reclog;
pub mod registry;
#[cfg(feature = "lmdb")]
pub use durable::{CommitSync, SYNC_WITHIN_MS_MAX};
#[cfg(feature = "lmdb")]
mod wal;

/// Longest key any backend must accept, in bytes. LMDB's compiled-in limit is 511; keeping the
/// contract below it leaves the namespace's layout (1 + 8 + 255 bytes at most) well inside.
pub const KEY_LEN_MAX: usize = 511;

/// Longest value any backend must accept, in bytes (LMDB has no practical limit; etcd's
/// default request limit is 1.5 MiB, which the etcd backend checks per transaction).
pub const VALUE_LEN_MAX: usize = 1 << 20;

/// Errors of the storage seam. Split by what the caller can do about them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store has no room left (LMDB map full, disk full, quota). Nothing of the failed
    /// transaction was applied.
    #[error("store is full: {0}")]
    Full(String),
    /// A key or value is outside the limits of the seam. Nothing was applied.
    #[error("{0}")]
    Limit(String),
    /// A value handled by [`WriteTxn::add`] is not an 8-byte counter, or the addition would
    /// leave the range of `u64`. Nothing was applied.
    #[error("counter {key:?}: {reason}")]
    Counter { key: Vec<u8>, reason: &'static str },
    /// An optimistic backend found that a key it read changed before commit; the caller may
    /// run the whole transaction again. LMDB never returns this.
    #[error("transaction conflict, retry")]
    Conflict,
    /// An earlier commit failed to reach the disk: the store refuses every further write until
    /// it is reopened, because what is on disk is no longer known (fsync-gate semantics).
    #[error("store is poisoned by an earlier failed commit; restart to recover")]
    Poisoned,
    /// The store files could not be read or written, or are not a store.
    #[error("store I/O: {0}")]
    Io(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a namespace operation answers when its store failed: no room, a poisoned store
/// (read-only until reopened), a request past the seam's limits, or I/O.
impl From<StoreError> for calm_types::MetaError {
    fn from(error: StoreError) -> Self {
        use calm_types::MetaError;
        match error {
            StoreError::Full(d) => MetaError::NoSpace(d),
            StoreError::Poisoned => MetaError::ReadOnly(error.to_string()),
            StoreError::Limit(d) => MetaError::Invalid(d),
            other => MetaError::Io(other.to_string()),
        }
    }
}

/// What [`ReadTxn::visit`] calls for each pair; `Break` stops the visit.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> ControlFlow<()> + 'a;

/// What [`ReadTxn::log_visit`] calls for each record (index, bytes); `Break` stops the visit.
pub type LogVisitor<'a> = dyn FnMut(u64, &[u8]) -> ControlFlow<()> + 'a;

/// The key family of the record log's default layout: records are the pairs
/// `[LOG_FAMILY] ++ index (u64, big-endian) → record`, the end of the keyspace, so that
/// appends fill pages. A backend that keeps the log elsewhere (the LMDB store with its
/// write-ahead log: segment files) stores no key of this family. Callers must not use it.
pub const LOG_FAMILY: u8 = 0xFF;

/// The key of log record `index` in the default layout.
pub fn log_key(index: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = LOG_FAMILY;
    key[1..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The index a key of the default log layout names.
pub fn log_index(key: &[u8]) -> Option<u64> {
    (key.len() == 9 && key[0] == LOG_FAMILY)
        .then(|| u64::from_be_bytes(key[1..9].try_into().expect("8 bytes")))
}

/// Checks a record for [`WriteTxn::log_append`]: not empty, and within [`VALUE_LEN_MAX`].
pub fn check_log_record(index: u64, record: &[u8]) -> Result<()> {
    if record.is_empty() {
        return Err(StoreError::Limit(format!("log record {index} is empty")));
    }
    if index == 0 {
        return Err(StoreError::Limit("log index 0 is not a record's".into()));
    }
    check_limits(&log_key(index), record)
}

/// A consistent read-only view: a snapshot, or the current state of a write transaction
/// (which sees its own uncommitted writes).
pub trait ReadTxn {
    /// The value stored under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>>;

    /// Calls `visit` for each pair with `start <= key < end`, in ascending key order, until
    /// it returns `ControlFlow::Break`. An empty `end` means "to the end of the keyspace".
    /// Returns the number of pairs visited.
    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize>;

    /// Up to `limit` pairs with `start <= key < end`, in ascending order (owned copies).
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.visit(start, end, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            if out.len() >= limit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        Ok(out)
    }

    /// Whether any key lies in `start <= key < end`.
    fn any_in(&self, start: &[u8], end: &[u8]) -> Result<bool> {
        Ok(self.visit(start, end, &mut |_, _| ControlFlow::Break(()))? > 0)
    }

    /// The pair with the greatest key in `start <= key < end` (empty `end`: no upper bound).
    /// The default walks the whole range; ordered backends answer with one seek.
    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut last = None;
        self.visit(start, end, &mut |k, v| {
            last = Some((k.to_vec(), v.to_vec()));
            ControlFlow::Continue(())
        })?;
        Ok(last)
    }

    /// Calls `visit` for each record of the log with `index >= from`, in ascending order,
    /// until it returns `ControlFlow::Break`. Returns the number of records visited.
    ///
    /// The log is an append-only sequence of records under dense `u64` indices, committed
    /// with the keyspace in the same transactions (see [`WriteTxn::log_append`]). A
    /// snapshot's visit may skip records that a later commit purged (every record it visits
    /// is one the snapshot holds, in order, without a gap other than that head).
    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        keyed_log::visit(self, from, visit)
    }

    /// The index of the first record of the log, if it holds any.
    fn log_first(&self) -> Result<Option<u64>> {
        keyed_log::first(self)
    }

    /// The index of the last record of the log, if it holds any.
    fn log_last(&self) -> Result<Option<u64>> {
        keyed_log::last(self)
    }
}

/// The record log in its default layout (keys of [`LOG_FAMILY`]), for backends that keep it
/// there: the trait's default methods, callable by a backend that keeps it there only
/// sometimes.
pub mod keyed_log {
    use super::*;

    pub fn visit<R: ReadTxn + ?Sized>(
        view: &R,
        from: u64,
        visit: &mut LogVisitor<'_>,
    ) -> Result<usize> {
        view.visit(
            &log_key(from),
            b"",
            &mut |key, value| match log_index(key) {
                Some(index) => visit(index, value),
                None => ControlFlow::Break(()),
            },
        )
    }

    pub fn first<R: ReadTxn + ?Sized>(view: &R) -> Result<Option<u64>> {
        let mut first = None;
        visit(view, 0, &mut |index, _| {
            first = Some(index);
            ControlFlow::Break(())
        })?;
        Ok(first)
    }

    pub fn last<R: ReadTxn + ?Sized>(view: &R) -> Result<Option<u64>> {
        Ok(view
            .last_in(&[LOG_FAMILY], b"")?
            .and_then(|(key, _)| log_index(&key)))
    }

    pub fn append<T: WriteTxn + ?Sized>(txn: &mut T, index: u64, record: &[u8]) -> Result<()> {
        check_log_record(index, record)?;
        txn.append(&log_key(index), record)
    }

    pub fn purge<T: WriteTxn + ?Sized>(txn: &mut T, from: u64, upto: u64) -> Result<()> {
        for index in from..=upto {
            txn.delete(&log_key(index))?;
        }
        Ok(())
    }
}

/// A write transaction. Writes are visible to this transaction's own reads at once and to
/// everyone else after [`WriteTxn::commit`] returns; dropping it without commit discards all.
pub trait WriteTxn: ReadTxn {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Puts `key`, which must be greater than every key in the store (an append log at the
    /// end of the keyspace). Backends use it to fill pages instead of splitting them in half.
    /// A key that is not the greatest fails with [`StoreError::Limit`] and changes nothing.
    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if let Some((last, _)) = self.last_in(b"", b"")?
            && last.as_slice() >= key
        {
            return Err(StoreError::Limit(format!(
                "append of {key:?}, which is not above the greatest key {last:?}"
            )));
        }
        self.put(key, value)
    }
    /// Removes `key`; returns whether it existed.
    fn delete(&mut self, key: &[u8]) -> Result<bool>;
    /// Appends `record` to the log under `index`, which must be above every index the log
    /// holds (backends may also refuse a gap after the last record); committed with the rest
    /// of the transaction. A refused index fails with [`StoreError::Limit`] and changes
    /// nothing. The default keeps the record under [`log_key`].
    fn log_append(&mut self, index: u64, record: &[u8]) -> Result<()> {
        keyed_log::append(self, index, record)
    }
    /// Removes the log's records with `index <= upto`; the caller knows that none lies below
    /// `from` (so the default deletes the keys `from..=upto` without searching).
    fn log_purge(&mut self, from: u64, upto: u64) -> Result<()> {
        keyed_log::purge(self, from, upto)
    }
    /// Adds `delta` to the little-endian `u64` counter under `key` (absent = 0) and returns
    /// the new value. Fails with [`StoreError::Counter`] on a malformed value or on overflow.
    fn add(&mut self, key: &[u8], delta: i64) -> Result<u64> {
        let old = match self.get(key)? {
            None => 0,
            Some(bytes) => decode_counter(key, &bytes)?,
        };
        let new = old
            .checked_add_signed(delta)
            .ok_or_else(|| StoreError::Counter {
                key: key.to_vec(),
                reason: "addition leaves the u64 range",
            })?;
        self.put(key, &new.to_le_bytes())?;
        Ok(new)
    }
    /// Writes this transaction carries so far, for a store that limits them
    /// ([`Store::writes_max`]); `None` for one that does not count.
    fn writes_pending(&self) -> Option<usize> {
        None
    }
    /// Whether another writer committed after this store's own last commit and before this
    /// transaction began: what this process keeps in memory about the store may be stale. A
    /// store only this process writes answers `false`.
    fn written_by_others(&self) -> bool {
        false
    }
    /// Reads `keys` and the small ranges `ranges` (`[start, end)`) ahead, together, so that
    /// the transaction's next `get`s of those keys and `visit`s of exactly those ranges cost
    /// no round trip each (a networked store; the others read in place and do nothing here).
    /// Reading ahead changes no answer.
    fn prefetch(&self, keys: &[Vec<u8>], ranges: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let _ = (keys, ranges);
        Ok(())
    }
    /// Makes every write of this transaction durable and visible, or none of them.
    fn commit(self) -> Result<()>;
}

/// An ordered transactional key-value store.
pub trait Store: Send + Sync + 'static {
    type Snapshot<'s>: ReadTxn
    where
        Self: 's;
    type Txn<'s>: WriteTxn
    where
        Self: 's;

    /// Makes every commit that has returned durable. A store whose commits are durable when
    /// they return has nothing to do.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// A consistent snapshot of the last committed state.
    fn snapshot(&self) -> Result<Self::Snapshot<'_>>;
    /// A consistent snapshot that sees every commit of this process, and the other writers'
    /// commits this process has learnt of (a shared store may skip the round trip that a
    /// [`Store::snapshot`] pays to see every commit acknowledged anywhere; it may then miss
    /// another writer's commit of the last moments). For checks that tolerate that.
    fn snapshot_recent(&self) -> Result<Self::Snapshot<'_>> {
        self.snapshot()
    }
    /// Starts a write transaction. Backends with a single writer (LMDB) block here until the
    /// previous write transaction ends.
    fn begin(&self) -> Result<Self::Txn<'_>>;
    /// A write transaction for work that has waited since `since` (queued behind other
    /// transactions): a store that bounds how long a transaction may take (a networked one,
    /// retrying while its cluster does not answer) counts that bound from `since`, and fails
    /// at once when it has passed. The others ignore it.
    fn begin_within(&self, since: std::time::Instant) -> Result<Self::Txn<'_>> {
        let _ = since;
        self.begin()
    }
    /// Bytes the store occupies on its medium (for status and fsck rates).
    fn size_bytes(&self) -> Result<u64>;
    /// Most writes (puts and deletes) one transaction may carry; `None`: no limit beyond its
    /// size. Work that can be cut (a purge) takes no more than is left of it.
    fn writes_max(&self) -> Option<usize> {
        None
    }
    /// Whether other processes may commit to this store between this process's transactions
    /// (a shared engine such as etcd). A namespace over a shared store re-reads what it keeps
    /// in memory at the start of each transaction, and runs a transaction again when its
    /// commit fails with [`StoreError::Conflict`].
    fn shared(&self) -> bool {
        false
    }
    /// For a shared store: a channel that receives a message after commits by any writer
    /// (coalesced: one message may stand for many commits, none is lost after the call
    /// returns), sent once a [`Store::snapshot_recent`] taken then sees them. `None` for a
    /// store that only this process writes.
    fn watch_commits(&self) -> Result<Option<std::sync::mpsc::Receiver<()>>> {
        Ok(None)
    }
    /// For a shared store: the registry of the servers sharing it (the same one at every
    /// call). `None` for a store that only this process writes.
    fn registry(&self) -> Option<std::sync::Arc<dyn registry::Registry>> {
        None
    }

    /// What the store counts of its own work since it was opened, for status: (what, how
    /// many). Empty for a store that counts nothing beyond what the namespace counts.
    fn figures(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// How long the requests to a shared store's cluster took (each attempt), since the store
    /// was opened. `None` for a store in this process.
    fn request_latencies(&self) -> Option<latency::Latencies> {
        None
    }

    /// What the store's own write-ahead log counts (each commit's sync, bytes written,
    /// checkpoints), since the store was opened. `None` for a store without one.
    fn log_figures(&self) -> Option<latency::LogFigures> {
        None
    }

    /// Keeps the snapshots taken from now readable for as long as the returned guard lives,
    /// however long a reader takes (a store that drops old versions of its keys, as etcd's
    /// compaction does, keeps them). `None`: this store never drops what a snapshot reads.
    fn hold_reads(&self) -> Result<Option<Box<dyn Send>>> {
        Ok(None)
    }
}

/// A shared store is a store: lets a test (or a tool) keep a handle on a store that a
/// namespace also owns.
impl<S: Store> Store for std::sync::Arc<S> {
    type Snapshot<'s> = S::Snapshot<'s>;
    type Txn<'s> = S::Txn<'s>;

    fn snapshot(&self) -> Result<Self::Snapshot<'_>> {
        (**self).snapshot()
    }

    fn snapshot_recent(&self) -> Result<Self::Snapshot<'_>> {
        (**self).snapshot_recent()
    }

    fn begin(&self) -> Result<Self::Txn<'_>> {
        (**self).begin()
    }

    fn size_bytes(&self) -> Result<u64> {
        (**self).size_bytes()
    }

    fn shared(&self) -> bool {
        (**self).shared()
    }

    fn watch_commits(&self) -> Result<Option<std::sync::mpsc::Receiver<()>>> {
        (**self).watch_commits()
    }

    fn registry(&self) -> Option<std::sync::Arc<dyn registry::Registry>> {
        (**self).registry()
    }

    fn figures(&self) -> Vec<(&'static str, u64)> {
        (**self).figures()
    }

    fn request_latencies(&self) -> Option<latency::Latencies> {
        (**self).request_latencies()
    }

    fn log_figures(&self) -> Option<latency::LogFigures> {
        (**self).log_figures()
    }

    fn hold_reads(&self) -> Result<Option<Box<dyn Send>>> {
        (**self).hold_reads()
    }
}

/// Decodes a counter value written by [`WriteTxn::add`].
pub fn decode_counter(key: &[u8], bytes: &[u8]) -> Result<u64> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| StoreError::Counter {
        key: key.to_vec(),
        reason: "value is not an 8-byte counter",
    })?;
    Ok(u64::from_le_bytes(array))
}

/// Checks the limits of the seam on a key and a value; every backend calls it before writing.
pub fn check_limits(key: &[u8], value: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(StoreError::Limit("empty key".into()));
    }
    if key.len() > KEY_LEN_MAX {
        return Err(StoreError::Limit(format!(
            "key of {} bytes exceeds KEY_LEN_MAX ({KEY_LEN_MAX} bytes)",
            key.len()
        )));
    }
    if value.len() > VALUE_LEN_MAX {
        return Err(StoreError::Limit(format!(
            "value of {} bytes exceeds VALUE_LEN_MAX ({VALUE_LEN_MAX} bytes)",
            value.len()
        )));
    }
    Ok(())
}

/// The smallest key greater than every key that starts with `prefix`, or empty (= end of the
/// keyspace) when `prefix` is all 0xff.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last != 0xff {
            end.push(last + 1);
            return end;
        }
    }
    end
}
