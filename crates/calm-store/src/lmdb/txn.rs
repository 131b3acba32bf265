//! Snapshots and write transactions of the LMDB store: reads of a key, a range and its last
//! key on one B-tree snapshot, writes (with the record log's pending appends, and the
//! write-ahead log's record when it is on), and the commit that makes them durable.

use super::*;

/// A read snapshot of an [`LmdbStore`].
pub struct LmdbSnapshot<'s> {
    pub(super) txn: RoTxn<'s, WithoutTls>,
    pub(super) db: Database<Bytes, Bytes>,
    /// The record log and its bounds at this snapshot, when it is in segment files.
    pub(super) log: Option<(&'s RecordLog, Bounds)>,
}

/// A write transaction's view of the record log in segment files: the bounds with its own
/// changes, and the changes.
pub(super) struct TxnLog<'s> {
    pub(super) log: &'s RecordLog,
    pub(super) pending: Pending,
}

/// A write transaction of an [`LmdbStore`].
pub struct LmdbTxn<'s> {
    pub(super) txn: RwTxn<'s>,
    pub(super) db: Database<Bytes, Bytes>,
    pub(super) poisoned: &'s AtomicBool,
    /// The store's directory (what a failed commit asks for its free space).
    pub(super) dir: &'s Path,
    /// With a write-ahead log: the log (locked for the whole transaction) and this
    /// transaction's changes, in order, as its record.
    pub(super) wal: Option<(MutexGuard<'s, Wal>, Vec<u8>)>,
    pub(super) log: Option<TxnLog<'s>>,
    /// Bytes of the record that are record log operations.
    pub(super) log_bytes: usize,
    /// The record log was purged (files go): the commit is synced before it is applied,
    /// even where commits are synced later (`CommitSync::Within`).
    pub(super) purged: bool,
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
pub(super) type KeyRange<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

pub(super) fn bounds<'k>(start: &'k [u8], end: &'k [u8]) -> Option<KeyRange<'k>> {
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

pub(super) fn visit_range(
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
pub(super) fn last_in_range(
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

/// The key reads of a snapshot and of a write transaction: the same calls on their `db` and
/// `txn` (a write transaction reads what it wrote).
macro_rules! key_reads {
    () => {
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
    };
}

impl ReadTxn for LmdbSnapshot<'_> {
    key_reads!();

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
    key_reads!();

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
            self.purged = true;
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
        let at = wal.write(&record, self.purged).map_err(poison)?;
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
