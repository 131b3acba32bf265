//! The reference backend: committed state is an immutable `BTreeMap` behind an `Arc`; a write
//! transaction works on its own copy and publishes it on commit. Obviously correct and
//! obviously slow (each write transaction copies the map), which is what a model is for: the
//! conformance suite and the property tests run the real backends side by side with it.

use calm_types::sync::Locked;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{ReadTxn, Result, Store, Visitor, WriteTxn, check_limits};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// An in-memory store. Not durable.
#[derive(Debug, Default)]
pub struct MemStore {
    committed: Mutex<Arc<Map>>,
    /// Serialises writers, as LMDB does.
    writer: Mutex<()>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every committed pair, in key order (for comparisons in tests).
    pub fn dump(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let map = self.committed.locked().clone();
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// A snapshot of a [`MemStore`].
#[derive(Debug)]
pub struct MemSnapshot {
    map: Arc<Map>,
}

/// A write transaction of a [`MemStore`].
#[derive(Debug)]
pub struct MemTxn<'s> {
    store: &'s MemStore,
    map: Map,
    _writer: MutexGuard<'s, ()>,
}

/// The map range `start <= key < end` (empty `end`: unbounded), or None when it is empty.
/// A key range as `BTreeMap::range` and heed take it.
type KeyRange<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

fn bounds<'k>(start: &'k [u8], end: &'k [u8]) -> Option<KeyRange<'k>> {
    if !end.is_empty() && start >= end {
        return None;
    }
    let upper = if end.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(end)
    };
    Some((Bound::Included(start), upper))
}

fn visit_map(map: &Map, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> usize {
    let Some(range) = bounds(start, end) else {
        return 0;
    };
    let mut count = 0;
    for (key, value) in map.range::<[u8], _>(range) {
        count += 1;
        if visit(key, value).is_break() {
            break;
        }
    }
    count
}

fn last_in_map(map: &Map, start: &[u8], end: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    map.range::<[u8], _>(bounds(start, end)?)
        .next_back()
        .map(|(k, v)| (k.clone(), v.clone()))
}

/// The reads of a snapshot and of a transaction: the same calls on their `map`.
macro_rules! map_reads {
    () => {
        fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
            Ok(self.map.get(key).map(|v| Cow::Borrowed(v.as_slice())))
        }

        fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
            Ok(visit_map(&self.map, start, end, visit))
        }

        fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
            Ok(last_in_map(&self.map, start, end))
        }
    };
}

impl ReadTxn for MemSnapshot {
    map_reads!();
}

impl ReadTxn for MemTxn<'_> {
    map_reads!();
}

impl WriteTxn for MemTxn<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_limits(key, value)?;
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        check_limits(key, &[])?;
        Ok(self.map.remove(key).is_some())
    }

    fn commit(self) -> Result<()> {
        *self.store.committed.locked() = Arc::new(self.map);
        Ok(())
    }
}

impl Store for MemStore {
    type Snapshot<'s> = MemSnapshot;
    type Txn<'s> = MemTxn<'s>;

    fn snapshot(&self) -> Result<MemSnapshot> {
        Ok(MemSnapshot {
            map: self.committed.locked().clone(),
        })
    }

    fn begin(&self) -> Result<MemTxn<'_>> {
        let writer = self.writer.locked();
        let map = (**self.committed.locked()).clone();
        Ok(MemTxn {
            store: self,
            map,
            _writer: writer,
        })
    }

    fn size_bytes(&self) -> Result<u64> {
        let map = self.committed.locked().clone();
        Ok(map.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum())
    }
}
