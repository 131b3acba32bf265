//! One watcher's queue: bounded, coalescing per object, with one explicit resync past its
//! limit.
//!
//! A watcher that keeps up sees every change. One that falls behind holds at most one queued
//! change per object, the latest (a newer change of an object replaces the queued one and takes
//! its place in index order). Past `max` queued changes the queue is dropped and the watcher
//! owes a resync: its next event is `Resync { from: R }`, R being the index of the change that
//! overflowed it, and the changes from R on follow. A watcher that re-reads the current state
//! when told to resync, then applies what follows, misses nothing: whatever the state it read
//! does not yet show has an index of at least R.
//!
//! An exact queue ([`Queue::exact`], a mount's cache) never coalesces: a rename followed by a
//! chmod of the same file must both arrive, since the rename names entries the chmod does not.
//! Past `max` changes it resyncs in the same way.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::{Change, Event, Handle};

/// What a queue has done so far (for status and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pushed: u64,
    /// Changes replaced by a newer change of the same object.
    pub coalesced: u64,
    /// Times the queue overflowed into a resync.
    pub resyncs: u64,
}

#[derive(Debug, Clone)]
pub struct Queue {
    /// Queued changes by index.
    entries: BTreeMap<u64, Arc<Change>>,
    /// Object → index of its queued change.
    by_object: HashMap<Handle, u64>,
    max: usize,
    /// A resync is owed, from this index.
    resync: Option<u64>,
    /// A newer change of an object replaces its queued one.
    coalesce: bool,
    stats: QueueStats,
}

impl Queue {
    /// A queue holding at most `max` changes (at least 1).
    pub fn new(max: usize) -> Queue {
        Queue {
            entries: BTreeMap::new(),
            by_object: HashMap::new(),
            max: max.max(1),
            resync: None,
            coalesce: true,
            stats: QueueStats::default(),
        }
    }

    /// A queue holding at most `max` changes that never coalesces them.
    pub fn exact(max: usize) -> Queue {
        Queue {
            coalesce: false,
            ..Queue::new(max)
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing to deliver (no change queued and no resync owed).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.resync.is_none()
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Queues `change` (its index above every queued one).
    pub fn push(&mut self, change: Arc<Change>) {
        debug_assert!(
            self.entries
                .last_key_value()
                .is_none_or(|(last, _)| *last < change.index),
            "changes arrive in index order"
        );
        self.stats.pushed += 1;
        if self.coalesce
            && let Some(old) = self.by_object.insert(change.object, change.index)
        {
            self.entries.remove(&old);
            self.stats.coalesced += 1;
        }
        self.entries.insert(change.index, change);
        if self.entries.len() > self.max {
            // Too far behind even one change per object: start over from this change.
            let (index, change) = self.entries.pop_last().expect("just inserted");
            self.entries.clear();
            self.by_object.clear();
            if self.coalesce {
                self.by_object.insert(change.object, index);
            }
            self.entries.insert(index, change);
            self.resync = Some(index);
            self.stats.resyncs += 1;
        }
    }

    /// Drops what is queued and owes a resync from `from` (a watcher whose history is gone).
    /// An exact queue stays exact.
    pub fn force_resync(&mut self, from: u64) {
        self.entries.clear();
        self.by_object.clear();
        self.resync = Some(from);
        self.stats.resyncs += 1;
    }

    /// Up to `max` events, oldest first: an owed resync, then changes.
    pub fn take(&mut self, max: usize, out: &mut Vec<Event>) {
        let mut room = max;
        if room == 0 {
            return;
        }
        if let Some(from) = self.resync.take() {
            out.push(Event::Resync { from });
            room -= 1;
        }
        while room > 0 {
            let Some((index, change)) = self.entries.pop_first() else {
                break;
            };
            if self.by_object.get(&change.object) == Some(&index) {
                self.by_object.remove(&change.object);
            }
            out.push(Event::Change(change));
            room -= 1;
        }
    }
}
