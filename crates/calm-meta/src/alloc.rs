//! The handle allocator: handles come from memory, out of chunks reserved by bumping the
//! persisted high-water mark (`Shwm`) inside the same write transaction that uses them.
//!
//! Invariants:
//! - every handle in a committed inode is below the persisted high-water mark;
//! - `next` only grows, so no handle is ever returned twice by one allocator;
//! - after a restart the allocator starts at the persisted mark, above everything ever handed
//!   out, so no handle is reused across restarts either. The unused rest of the last chunk is
//!   skipped: at most `chunk` handles per restart, out of 2^64.
//!
//! Start-up therefore reads one key. Nothing is scanned, ever (the PVFS2 failure was a scan of
//! every handle at start to rebuild a free-handle ledger).

use calm_store::{WriteTxn, decode_counter};

use crate::layout::KEY_HWM;
use crate::types::Handle;

/// Default handles reserved per high-water-mark bump.
pub const HANDLE_CHUNK_DEFAULT: u64 = 65_536;

/// Hands out handles. Owned by the single committer thread; no locks.
#[derive(Debug)]
pub struct HandleAllocator {
    chunk: u64,
    /// The next handle to hand out.
    next: Handle,
    /// Handles below `limit` are covered by a reservation (committed, or in the current
    /// transaction when `reserved_in_txn`).
    limit: Handle,
    /// Whether the current transaction bumped the mark; if it aborts, the bump is gone.
    reserved_in_txn: bool,
}

impl HandleAllocator {
    pub fn new(chunk: u64) -> Self {
        assert!(chunk > 0, "handle chunk must be positive");
        Self {
            chunk,
            next: 0,
            limit: 0,
            reserved_in_txn: false,
        }
    }

    /// A fresh handle, reserving a new chunk in `txn` when the current one is used up.
    pub fn allocate(&mut self, txn: &mut impl WriteTxn) -> calm_store::Result<Handle> {
        if self.next >= self.limit {
            let mark = match txn.get(KEY_HWM)? {
                Some(bytes) => decode_counter(KEY_HWM, &bytes)?,
                None => 0,
            };
            // After an aborted reservation `next` can be above the persisted mark: the new
            // chunk starts at whichever is higher, so it covers every handle it will give.
            let base = self.next.max(mark);
            let new_mark =
                base.checked_add(self.chunk)
                    .ok_or_else(|| calm_store::StoreError::Counter {
                        key: KEY_HWM.to_vec(),
                        reason: "handle space exhausted",
                    })?;
            txn.add(KEY_HWM, (new_mark - mark) as i64)?;
            self.next = base;
            self.limit = new_mark;
            self.reserved_in_txn = true;
        }
        let handle = self.next;
        self.next += 1;
        Ok(handle)
    }

    /// `count` consecutive handles (the first returned), reserving a chunk large enough in
    /// `txn` when the current one has not that many left: handles granted in advance.
    pub fn allocate_range(
        &mut self,
        txn: &mut impl WriteTxn,
        count: u64,
    ) -> calm_store::Result<Handle> {
        if count == 0 {
            return Err(calm_store::StoreError::Counter {
                key: KEY_HWM.to_vec(),
                reason: "no handles asked for",
            });
        }
        if self.limit.saturating_sub(self.next) < count {
            // The rest of this chunk is skipped: a new one, from where it ends, holds them all.
            let chunk = self.chunk;
            self.chunk = chunk.max(count);
            self.next = self.limit;
            let first = self.allocate(txn);
            self.chunk = chunk;
            let first = first?;
            self.next = first + count;
            return Ok(first);
        }
        let first = self.next;
        self.next += count;
        Ok(first)
    }

    /// The transaction that used this allocator committed.
    pub fn committed(&mut self) {
        self.reserved_in_txn = false;
    }

    /// The transaction that used this allocator was dropped: a reservation made in it is void.
    pub fn aborted(&mut self) {
        if self.reserved_in_txn {
            self.limit = self.next;
            self.reserved_in_txn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use calm_store::mem::MemStore;
    use calm_store::{ReadTxn, Store};
    use proptest::prelude::*;

    use super::*;

    fn persisted_mark(store: &MemStore) -> u64 {
        let snap = store.snapshot().unwrap();
        snap.get(KEY_HWM)
            .unwrap()
            .map_or(0, |v| decode_counter(KEY_HWM, &v).unwrap())
    }

    /// A store as `format_store` leaves it: handles 0 and 1 (root) are taken.
    fn formatted() -> MemStore {
        let store = MemStore::new();
        let mut txn = store.begin().unwrap();
        txn.put(KEY_HWM, &2u64.to_le_bytes()).unwrap();
        txn.commit().unwrap();
        store
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Allocate this many handles in one transaction, then commit (true) or abort.
        Txn(u8, bool),
        /// Allocate this many consecutive handles at once (a grant), then commit or abort.
        Range(u8, bool),
        /// Lose the in-memory allocator (a crash) and start a new one.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1u8..20, prop::bool::weighted(0.7)).prop_map(|(n, c)| Step::Txn(n, c)),
            2 => (1u8..20, prop::bool::weighted(0.7)).prop_map(|(n, c)| Step::Range(n, c)),
            1 => Just(Step::Restart),
        ]
    }

    proptest! {
        /// Against the model "a set of every committed handle": committed handles are unique,
        /// below the persisted mark, and no handle is ever returned twice even across aborts
        /// and restarts.
        #[test]
        fn handles_are_unique_and_below_the_mark(chunk in 1u64..8, steps in prop::collection::vec(step(), 1..40)) {
            let store = formatted();
            let mut alloc = HandleAllocator::new(chunk);
            let mut committed: HashSet<Handle> = HashSet::new();
            let mut returned: HashSet<Handle> = HashSet::new();
            for step in steps {
                match step {
                    Step::Txn(n, commit) | Step::Range(n, commit) => {
                        let mut txn = store.begin().unwrap();
                        let got: Vec<Handle> = match step {
                            Step::Range(..) => {
                                let first = alloc.allocate_range(&mut txn, u64::from(n)).unwrap();
                                (first..first + u64::from(n)).collect()
                            }
                            _ => (0..n).map(|_| alloc.allocate(&mut txn).unwrap()).collect(),
                        };
                        for &h in &got {
                            prop_assert!(h > 1, "0 is never a handle and 1 is the root");
                            prop_assert!(returned.insert(h), "handle {} returned twice", h);
                        }
                        if commit {
                            txn.commit().unwrap();
                            alloc.committed();
                            committed.extend(got);
                        } else {
                            drop(txn);
                            alloc.aborted();
                        }
                        let mark = persisted_mark(&store);
                        prop_assert!(committed.iter().all(|h| *h < mark), "a committed handle at or above the mark {}", mark);
                    }
                    Step::Restart => {
                        alloc = HandleAllocator::new(chunk);
                        // After a restart only committed handles matter; a handle returned in
                        // an aborted transaction may come back (it was never used).
                        returned = committed.clone();
                    }
                }
            }
        }
    }

    #[test]
    fn a_restart_skips_the_rest_of_the_chunk() {
        let store = formatted();
        let mut alloc = HandleAllocator::new(100);
        let mut txn = store.begin().unwrap();
        assert_eq!(alloc.allocate(&mut txn).unwrap(), 2);
        assert_eq!(alloc.allocate(&mut txn).unwrap(), 3);
        txn.commit().unwrap();
        alloc.committed();
        assert_eq!(persisted_mark(&store), 102);
        let mut alloc = HandleAllocator::new(100);
        let mut txn = store.begin().unwrap();
        assert_eq!(alloc.allocate(&mut txn).unwrap(), 102);
    }
}
