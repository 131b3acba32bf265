//! Snapshots and write transactions: a snapshot reads at one revision; a transaction reads at
//! its start revision, keeps its writes in memory (read back by its own reads), reads ahead
//! what a group will need in two requests, and commits as one etcd `Txn` guarded by the
//! commit key (`crate::commit`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::commit::commit;
use crate::log;
use crate::reads::at_revision;
use crate::{
    Ahead, EtcdStore, OP_OVERHEAD_BYTES, PREFETCH_RANGE_PAIRS_MAX, PREFETCH_RANGES_MAX, Pairs,
    READ_CACHE_KEYS_MAX, RangeBounds,
};
use calm_store::{LogVisitor, ReadTxn, Result, StoreError, Visitor, WriteTxn, check_limits};
use etcd_client::{DeleteOptions, GetOptions, Txn, TxnOp};

/// A consistent view: every read is at one revision.
#[derive(Debug)]
pub struct EtcdSnapshot<'s> {
    pub(crate) store: &'s EtcdStore,
    pub(crate) revision: i64,
    /// The read cache has applied every commit up to this snapshot's.
    pub(crate) cached: bool,
}

const NO_WRITES: &BTreeMap<Vec<u8>, Option<Vec<u8>>> = &BTreeMap::new();

impl ReadTxn for EtcdSnapshot<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        Ok(self
            .store
            .get_cached(key, self.revision, self.cached)?
            .map(Cow::Owned))
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        self.store
            .visit_at(start, end, self.revision, NO_WRITES, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.store.last_at(start, end, self.revision, NO_WRITES)
    }

    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        log::visit(self, from, visit)
    }

    fn log_first(&self) -> Result<Option<u64>> {
        log::first(self)
    }

    fn log_last(&self) -> Result<Option<u64>> {
        log::last(self)
    }
}

/// A write transaction: reads at its start revision, writes kept here until commit.
#[derive(Debug)]
pub struct EtcdTxn<'s> {
    pub(crate) store: &'s EtcdStore,
    /// `retry_ms_max` after the transaction began: its commit is sent (and sent again) until
    /// then, and settling a lost commit's answer takes at most as long again.
    pub(crate) deadline: Instant,
    pub(crate) revision: i64,
    /// The commit key's modification revision when the transaction began.
    pub(crate) seq_modified: i64,
    /// The read cache has applied every commit up to the transaction's start.
    pub(crate) cached: bool,
    /// Begun at the watch's last commit ([`EtcdStore::watched_base`]), not at a revision read
    /// from etcd: a commit that writes nothing checks that no commit came after it.
    pub(crate) watched: bool,
    /// No stored key (at `revision`) is at or above this one: appends above it need no probe.
    pub(crate) append_floor: Option<Vec<u8>>,
    /// Values read at `revision` (which never change): a key read, then deleted or read again
    /// by the same group of operations costs one round trip, not two.
    pub(crate) read: std::cell::RefCell<std::collections::HashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Writes in key order; `None` is a delete.
    pub(crate) writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Ranges `[start, end)` of the record log this transaction deletes whole
    /// (`WriteTxn::log_purge`): one etcd operation each, whatever their length. A key written
    /// after its range was deleted is in `writes`, which wins.
    pub(crate) purged: Vec<RangeBounds>,
    /// The records of the changelog batch this transaction appends to, `(first, last)`: the
    /// next record in order joins its key (`crate::log`).
    pub(crate) log_tail: Option<(u64, u64)>,
    /// Whole ranges read ahead at `revision` (`WriteTxn::prefetch`), by `[start, end)`.
    pub(crate) ranges: std::cell::RefCell<std::collections::HashMap<RangeBounds, Pairs>>,
}

impl EtcdTxn<'_> {
    /// `key`'s value at the transaction's revision when a whole range read ahead holds it
    /// (`Some(None)`: the range holds no such key); `None` when no such range covers it. A
    /// group deletes what it read ahead as ranges (request records, xattrs, chunks): each
    /// delete, which reports whether the key existed, is answered here, not by a round trip.
    fn in_range_read_ahead(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let ranges = self.ranges.borrow();
        let (_, pairs) = ranges.iter().find(|((start, end), _)| {
            key >= start.as_slice() && (end.is_empty() || key < end.as_slice())
        })?;
        let at = pairs.binary_search_by(|(k, _)| k.as_slice().cmp(key));
        Some(at.ok().map(|at| pairs[at].1.clone()))
    }

    /// The range this transaction purged that holds `key`, unless the transaction wrote `key`
    /// since.
    fn purged_range(&self, key: &[u8]) -> Option<&RangeBounds> {
        if self.writes.contains_key(key) {
            return None;
        }
        self.purged
            .iter()
            .find(|(start, end)| key >= start.as_slice() && key < end.as_slice())
    }

    /// The etcd operations of the purged ranges, each split around the keys the transaction
    /// writes (etcd refuses a transaction whose deleted range holds a key it also writes).
    fn purge_operations(&self) -> Vec<RangeBounds> {
        let mut out = Vec::new();
        for (start, end) in &self.purged {
            let mut from = start.clone();
            for key in self
                .writes
                .range(start.clone()..end.clone())
                .map(|(k, _)| k)
            {
                if from < *key {
                    out.push((from, key.clone()));
                }
                from = [key.as_slice(), &[0]].concat();
            }
            if from < *end {
                out.push((from, end.clone()));
            }
        }
        out
    }
}

impl ReadTxn for EtcdTxn<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        match self.writes.get(key) {
            Some(Some(value)) => Ok(Some(Cow::Borrowed(value))),
            Some(None) => Ok(None),
            None if self.purged_range(key).is_some() => Ok(None),
            None => {
                if let Some(known) = self.read.borrow().get(key) {
                    return Ok(known.clone().map(Cow::Owned));
                }
                if let Some(known) = self.in_range_read_ahead(key) {
                    return Ok(known.map(Cow::Owned));
                }
                let value = self.store.get_cached(key, self.revision, self.cached)?;
                let mut read = self.read.borrow_mut();
                if read.len() < READ_CACHE_KEYS_MAX {
                    read.insert(key.to_vec(), value.clone());
                }
                Ok(value.map(Cow::Owned))
            }
        }
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        let known = self
            .ranges
            .borrow()
            .get(&(start.to_vec(), end.to_vec()))
            .cloned();
        if self.purged.is_empty() {
            return self
                .store
                .visit_known(start, end, self.revision, &self.writes, known, visit);
        }
        let mut hidden = 0;
        let visited = self.store.visit_known(
            start,
            end,
            self.revision,
            &self.writes,
            known,
            &mut |key, value| match self.purged_range(key) {
                Some(_) => {
                    hidden += 1;
                    std::ops::ControlFlow::Continue(())
                }
                None => visit(key, value),
            },
        )?;
        Ok(visited - hidden)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut below = end.to_vec();
        loop {
            let last = self
                .store
                .last_at(start, &below, self.revision, &self.writes)?;
            match last.as_ref().and_then(|(key, _)| self.purged_range(key)) {
                // Purged here: the greatest key below the purged range, then.
                Some((purged_start, _)) if purged_start.as_slice() > start => {
                    below = purged_start.clone();
                }
                Some(_) => return Ok(None),
                None => return Ok(last),
            }
        }
    }

    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        log::visit(self, from, visit)
    }

    fn log_first(&self) -> Result<Option<u64>> {
        log::first(self)
    }

    fn log_last(&self) -> Result<Option<u64>> {
        log::last(self)
    }
}

impl WriteTxn for EtcdTxn<'_> {
    /// The greatest key of the keyspace is not asked of etcd (a descending range is sorted on
    /// the server after reading the whole range): a forward probe for any stored key at or
    /// above `key`, once per transaction, and this transaction's own writes.
    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        let refuse = |above: &[u8]| {
            StoreError::Limit(format!(
                "append of {key:?}, which is not above the greatest key {above:?}"
            ))
        };
        if let Some((written, _)) = self.writes.range(key.to_vec()..).find(|(_, v)| v.is_some()) {
            return Err(refuse(written));
        }
        let covered = self
            .append_floor
            .as_deref()
            .is_some_and(|floor| key >= floor);
        if !covered {
            // The first stored key at or above: from a range read ahead that covers it (the
            // tail of the log, read with the transaction's first reads), else read now.
            let ahead = self
                .ranges
                .borrow()
                .iter()
                .find(|((start, end), _)| end.is_empty() && start.as_slice() <= key)
                .map(|(_, pairs)| {
                    pairs
                        .iter()
                        .find(|(k, _)| k.as_slice() >= key)
                        .map(|(k, _)| k.clone())
                });
            let first = match ahead {
                Some(first) => first,
                None => {
                    let (stored, _) = self.store.range_at(key, b"", self.revision, 1, false)?;
                    stored.into_iter().next().map(|(k, _)| k)
                }
            };
            if let Some(above) = &first {
                if !matches!(self.writes.get(above), Some(None)) {
                    return Err(refuse(above));
                }
                // The stored key above is deleted by this transaction: ask the slow way.
                if let Some((last, _)) = self.last_in(b"", b"")?
                    && last.as_slice() >= key
                {
                    return Err(refuse(&last));
                }
            } else {
                self.append_floor = Some(key.to_vec());
            }
        }
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn writes_pending(&self) -> Option<usize> {
        Some(self.writes.len() + self.purged.len())
    }

    /// Appends `record` to the batch this transaction appends to when it follows its last
    /// record and fits ([`log::BATCH_BYTES_MAX`]); else as a key of its own, above every
    /// stored key, which the next records join.
    fn log_append(&mut self, index: u64, record: &[u8]) -> Result<()> {
        calm_store::check_log_record(index, record)?;
        if let Some((first, last)) = self.log_tail
            && index == last + 1
            && let Some(Some(value)) = self.writes.get(&log::key_of(first, last))
        {
            let joined = match first == last {
                true => log::batch_bytes(value.len() + record.len(), 2),
                false => value.len() + log::LENGTH_BYTES + record.len(),
            };
            if joined <= log::BATCH_BYTES_MAX {
                let value = self
                    .writes
                    .remove(&log::key_of(first, last))
                    .flatten()
                    .expect("the batch's key, just read");
                let mut batch = match first == last {
                    true => log::batch_of(first, &value),
                    false => value,
                };
                log::push(&mut batch, record);
                self.writes.insert(log::batch_key(index), Some(batch));
                self.log_tail = Some((first, index));
                return Ok(());
            }
        }
        self.append(&calm_store::log_key(index), record)?;
        self.log_tail = Some((index, index));
        Ok(())
    }

    /// Deletes the keys of the batches that end at or below `upto` as one range (one
    /// operation, no read, whatever the count: a purge of thousands of records fits etcd's
    /// smallest limit of operations) and moves the log's floor past `upto` (a second): the
    /// records at or below it of a batch that goes on past it are no more read.
    fn log_purge(&mut self, from: u64, upto: u64) -> Result<()> {
        if from > upto {
            return Ok(());
        }
        let start = calm_store::log_key(from).to_vec();
        // The least key above record `upto`'s and its batch's.
        let end = [calm_store::log_key(upto).as_slice(), &[log::BATCH_MARK + 1]].concat();
        // What this transaction wrote there is deleted with the range.
        let written: Vec<Vec<u8>> = self
            .writes
            .range(start.clone()..end.clone())
            .map(|(k, _)| k.clone())
            .collect();
        for key in written {
            self.writes.remove(&key);
        }
        self.purged.push((start, end));
        self.writes.insert(
            log::FLOOR_KEY.to_vec(),
            Some((upto + 1).to_le_bytes().to_vec()),
        );
        Ok(())
    }

    fn prefetch(&self, keys: &[Vec<u8>], ranges: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let wanted: Vec<Vec<u8>> = {
            let read = self.read.borrow();
            let mut seen = std::collections::HashSet::new();
            keys.iter()
                .filter(|k| {
                    !self.writes.contains_key(*k) && !read.contains_key(*k) && seen.insert(*k)
                })
                .take(READ_CACHE_KEYS_MAX.saturating_sub(read.len()))
                .cloned()
                .collect()
        };
        let mut missing = Vec::new();
        for key in wanted {
            let full = self.store.data_key(&key);
            match self
                .cached
                .then(|| self.store.inner.cache.get(&full, self.revision))
            {
                Some(Some(value)) => {
                    self.read.borrow_mut().insert(key, value);
                }
                _ => missing.push(key),
            }
        }
        let ranges: Vec<&RangeBounds> = {
            let known = self.ranges.borrow();
            ranges
                .iter()
                .filter(|r| !known.contains_key(*r))
                .take(PREFETCH_RANGES_MAX.saturating_sub(known.len()))
                .collect()
        };
        // Keys and ranges in one etcd transaction: one round trip, each read at this revision.
        let wanted: Vec<Ahead> = missing
            .into_iter()
            .map(Ahead::Key)
            .chain(ranges.into_iter().map(|r| Ahead::Range(r.clone())))
            .collect();
        for chunk in wanted.chunks(self.store.inner.options.txn_ops_max.max(1)) {
            // Each read at the revision it is sent at (the transaction's, or a newer one of the
            // same data: `EtcdStore::call_at`).
            let reads: Vec<(Vec<u8>, Option<Vec<u8>>)> = chunk
                .iter()
                .map(|ahead| match ahead {
                    Ahead::Key(key) => (self.store.data_key(key), None),
                    Ahead::Range((start, end)) => {
                        (self.store.data_key(start), Some(self.store.data_end(end)))
                    }
                })
                .collect();
            let stats = &self.store.inner.stats;
            stats.read_aheads.fetch_add(1, Ordering::Relaxed);
            let response = self
                .store
                .call_at(self.revision, move |mut client, revision| {
                    let operations: Vec<TxnOp> = reads
                        .iter()
                        .map(|(start, end)| {
                            let options = at_revision(GetOptions::new(), revision);
                            let options = match end {
                                None => options,
                                Some(end) => options
                                    .with_range(end.clone())
                                    .with_limit(PREFETCH_RANGE_PAIRS_MAX),
                            };
                            TxnOp::get(start.clone(), Some(options))
                        })
                        .collect();
                    async move { client.txn(Txn::new().and_then(operations)).await }
                })?;
            for (ahead, op) in chunk.iter().zip(response.op_responses()) {
                let etcd_client::TxnOpResponse::Get(get) = op else {
                    continue;
                };
                match ahead {
                    Ahead::Key(key) => {
                        let value = get.kvs().first().map(|kv| kv.value().to_vec());
                        self.store.inner.cache.put(
                            self.store.data_key(key),
                            value.clone(),
                            self.revision,
                        );
                        self.read.borrow_mut().insert(key.clone(), value);
                    }
                    // Only a whole range is kept; a larger one is visited as before.
                    Ahead::Range(bounds) if !get.more() => {
                        let data = self.store.inner.data.len();
                        let pairs = get
                            .kvs()
                            .iter()
                            .map(|kv| (kv.key()[data..].to_vec(), kv.value().to_vec()))
                            .collect();
                        self.ranges.borrow_mut().insert(bounds.clone(), pairs);
                    }
                    Ahead::Range(_) => {}
                }
            }
        }
        Ok(())
    }

    fn written_by_others(&self) -> bool {
        self.seq_modified != self.store.inner.own_commit_revision.load(Ordering::Relaxed)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_limits(key, b"")?;
        let existed = self.get(key)?.is_some();
        self.writes.insert(key.to_vec(), None);
        Ok(existed)
    }

    fn commit(self) -> Result<()> {
        if self.writes.is_empty() && self.purged.is_empty() {
            // What the transaction answered (a refusal: nothing to write) holds at the
            // present only if no commit came after its revision.
            if self.watched && self.store.revision()?.1 != self.seq_modified {
                self.store
                    .inner
                    .stats
                    .conflicts
                    .fetch_add(1, Ordering::Relaxed);
                self.store.inner.met_other_commit();
                return Err(StoreError::Conflict);
            }
            return Ok(());
        }
        let inner = &self.store.inner;
        let options = &inner.options;
        let purges = self.purge_operations();
        // The commit key's write counts as one operation.
        let ops = self.writes.len() + purges.len() + 1;
        if ops > options.txn_ops_max {
            return Err(StoreError::Limit(format!(
                "a transaction of {ops} writes exceeds the etcd cluster's limit of {} \
                 operations per transaction (txn-ops-max); nothing was written",
                options.txn_ops_max
            )));
        }
        let bytes: usize = self
            .writes
            .iter()
            .map(|(k, v)| inner.data.len() + k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
            + purges
                .iter()
                .map(|(start, end)| 2 * inner.data.len() + start.len() + end.len())
                .sum::<usize>()
            + ops * OP_OVERHEAD_BYTES
            + inner.seq.len() * 2
            + 16;
        if bytes > options.request_bytes_max {
            return Err(StoreError::Limit(format!(
                "a transaction of {bytes} bytes exceeds the etcd cluster's limit of {} bytes \
                 per request (request-bytes-max); nothing was written",
                options.request_bytes_max
            )));
        }
        let token = inner.next_token();
        let mut operations: Vec<TxnOp> = self
            .writes
            .into_iter()
            .map(|(key, value)| {
                let key = [inner.data.as_slice(), &key].concat();
                match value {
                    Some(value) => TxnOp::put(key, value, None),
                    None => TxnOp::delete(key, None),
                }
            })
            .chain(purges.into_iter().map(|(start, end)| {
                TxnOp::delete(
                    [inner.data.as_slice(), &start].concat(),
                    Some(DeleteOptions::new().with_range(self.store.data_end(&end))),
                )
            }))
            .collect();
        operations.push(TxnOp::put(inner.seq.clone(), token.clone(), None));
        let txn = Txn::new()
            .when([inner.unchanged_since(self.revision)])
            .and_then(operations);
        let shared = inner.clone();
        let (revision, deadline) = (self.revision, self.deadline);
        self.store
            .run(async move { commit(&shared, txn, token, revision, deadline).await })
    }
}
