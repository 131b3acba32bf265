//! The POSIX and OFD record locks of one resource: who holds which byte range, with Linux's
//! merge, split and conflict rules. Owners are opaque `u64`s; two requests conflict only when
//! their owners differ.
//!
//! Semantics are Linux's record locks: one owner's locks never overlap each other; a new lock
//! merges with the owner's overlapping or adjacent locks of the same type, and replaces the part
//! of the owner's locks of the other type that it covers (PR(1,10) then PW(5,6) gives PR(1,4),
//! PW(5,6), PR(7,10)); unlock punches holes; a refused request changes nothing.
//!
//! No operation is linear in the number of locks (the seed's failure was a list scanned per
//! request, O(n²) for n locks): with n locks and k locks actually touched (merged, split, or in
//! conflict), every operation is O(log n + k), amortized:
//! - `writes`: every write lock by `start`. Write locks are disjoint across *all* owners (a
//!   write lock overlaps nothing of anyone else), so the write locks overlapping a range are the
//!   last one starting at or before its end and its predecessors while they reach its start.
//!   A `set` walks it once and finds both the first other owner's lock in the way (it stops
//!   there) and the owner's own write locks to merge or cut;
//! - `own`: per owner, its read locks by `start` (disjoint, found the same way), its write
//!   locks as a hash set of starts (for closing an owner in O(its locks)), and, from the
//!   owner's first range unlock on, its write locks in order too (an unlock must not walk other
//!   owners' locks; built once in O(w log w) for w locks, amortized over the sets that made
//!   them, and kept up to date after);
//! - `reads`: read locks of different owners may overlap, so they live in an interval treap.
//!
//! One cold B-tree descent per set instead of two is what makes random order fast: at 1 M locks
//! the indexes are larger than the last-level cache.

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::range::{LockKind, OFFSET_MAX, Range};
use crate::treap::Treap;

/// A granted lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lock {
    pub owner: u64,
    pub range: Range,
    pub kind: LockKind,
}

fn read_lock(owner: u64, start: u64, end: u64) -> Lock {
    Lock {
        owner,
        range: Range { start, end },
        kind: LockKind::Read,
    }
}

fn write_lock(owner: u64, start: u64, end: u64) -> Lock {
    Lock {
        owner,
        range: Range { start, end },
        kind: LockKind::Write,
    }
}

/// One owner's locks: read locks in order (found by range), write locks as a set of starts (the
/// `writes` index has their ends).
#[derive(Debug, Clone, Default)]
struct Held {
    reads: BTreeMap<u64, u64>,
    writes: HashSet<u64, BuildHasherDefault<StartHasher>>,
    /// The owner's write locks in order (`start` → `end`), built on the owner's first unlock
    /// and kept from then on: a range unlock must find them without walking other owners'
    /// locks, but an owner that never unlocks a range never pays for the order.
    ordered: Option<BTreeMap<u64, u64>>,
}

impl Held {
    fn len(&self) -> usize {
        self.reads.len() + self.writes.len()
    }
}

/// Hashes a lock start: one multiply (Fibonacci hashing). Starts are not chosen by an adversary
/// who gains anything from collisions beyond slowing their own locks.
#[derive(Debug, Default, Clone, Copy)]
struct StartHasher(u64);

impl Hasher for StartHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (value ^ self.0)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
    }
}

/// The byte-range locks of one resource.
#[derive(Debug, Clone, Default)]
pub struct RangeLocks {
    /// Every lock, per owner. Invariant: no owner without a lock.
    own: BTreeMap<u64, Held>,
    /// Every write lock: `start` → `(end, owner)`. Disjoint across owners.
    writes: BTreeMap<u64, (u64, u64)>,
    /// Every read lock.
    reads: Treap,
    /// Number of locks held, all owners.
    len: usize,
    /// Reused by `set` and `unlock` for the owner's locks they touch, so that the hot path does
    /// not allocate.
    scratch: Vec<Lock>,
}

impl RangeLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of locks held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of locks `owner` holds here.
    pub fn owner_len(&self, owner: u64) -> usize {
        self.own.get(&owner).map_or(0, Held::len)
    }

    /// A lock of another owner that `kind` on `range` by `owner` would conflict with, if any
    /// (F_GETLK). Does not change anything.
    pub fn test(&self, owner: u64, range: Range, kind: LockKind) -> Option<Lock> {
        let mut found = None;
        self.visit_conflicts(owner, range, kind, &mut |lock| {
            found = Some(lock);
            false
        });
        found
    }

    /// Calls `visit` with every lock of another owner that `kind` on `range` by `owner` would
    /// conflict with, until it returns false. O(log n + k) for k locks overlapping `range`.
    pub fn visit_conflicts(
        &self,
        owner: u64,
        range: Range,
        kind: LockKind,
        visit: &mut dyn FnMut(Lock) -> bool,
    ) {
        // Write locks are disjoint: those overlapping are the last one starting at or before
        // `range.end` and its predecessors while they still reach `range.start`.
        for (start, (end, holder)) in self.writes.range(..=range.end).rev() {
            if *end < range.start {
                break;
            }
            if *holder != owner && !visit(write_lock(*holder, *start, *end)) {
                return;
            }
        }
        if kind == LockKind::Write {
            self.visit_read_conflicts(owner, range, visit);
        }
    }

    fn visit_read_conflicts(&self, owner: u64, range: Range, visit: &mut dyn FnMut(Lock) -> bool) {
        self.reads
            .visit_overlaps(range.start, range.end, &mut |start, end, holder| {
                if holder == owner {
                    return true;
                }
                visit(read_lock(holder, start, end))
            });
    }

    /// Appends to `out` `owner`'s read locks overlapping `[a, b]`. An owner's locks are
    /// disjoint, so their ends grow with their starts: walking back from the last lock that
    /// starts at or before `b`, the first one that ends before `a` ends the search (one descent
    /// of the tree instead of two).
    fn own_reads_overlapping(&self, owner: u64, a: u64, b: u64, out: &mut Vec<Lock>) {
        let Some(held) = self.own.get(&owner) else {
            return;
        };
        for (start, end) in held.reads.range(..=b).rev() {
            if *end < a {
                break;
            }
            out.push(read_lock(owner, *start, *end));
        }
    }

    /// Appends to `out` `owner`'s write locks overlapping `[a, b]`.
    fn own_writes_overlapping(&mut self, owner: u64, a: u64, b: u64, out: &mut Vec<Lock>) {
        let Some(held) = self.own.get_mut(&owner) else {
            return;
        };
        if held.writes.is_empty() {
            return;
        }
        let writes = &self.writes;
        // O(w log w) once per owner, amortized over the w sets that made those locks.
        let ordered = held.ordered.get_or_insert_with(|| {
            held.writes
                .iter()
                .map(|start| (*start, writes[start].0))
                .collect()
        });
        for (start, end) in ordered.range(..=b).rev() {
            if *end < a {
                break;
            }
            out.push(write_lock(owner, *start, *end));
        }
    }

    fn insert(&mut self, lock: Lock) {
        let Lock { owner, range, kind } = lock;
        let held = self.own.entry(owner).or_default();
        match kind {
            LockKind::Write => {
                held.writes.insert(range.start);
                if let Some(ordered) = &mut held.ordered {
                    ordered.insert(range.start, range.end);
                }
                self.writes.insert(range.start, (range.end, owner));
            }
            LockKind::Read => {
                held.reads.insert(range.start, range.end);
                self.reads.insert(range.start, range.end, owner);
            }
        }
        self.len += 1;
    }

    fn remove(&mut self, lock: Lock) {
        if let Some(held) = self.own.get_mut(&lock.owner) {
            match lock.kind {
                LockKind::Write => {
                    held.writes.remove(&lock.range.start);
                    if let Some(ordered) = &mut held.ordered {
                        ordered.remove(&lock.range.start);
                    }
                }
                LockKind::Read => {
                    held.reads.remove(&lock.range.start);
                }
            }
            if held.len() == 0 {
                self.own.remove(&lock.owner);
            }
        }
        match lock.kind {
            LockKind::Write => {
                self.writes.remove(&lock.range.start);
            }
            LockKind::Read => {
                self.reads.remove(lock.range.start, lock.owner);
            }
        }
        self.len -= 1;
    }

    /// Takes `kind` on `range` for `owner` (F_SETLK), or returns the conflicting lock and
    /// changes nothing. `Ok(true)` when the set gave up write bytes of the owner (a write lock
    /// turned into a read lock), which may let another owner's waiting reader in.
    pub fn set(&mut self, owner: u64, range: Range, kind: LockKind) -> Result<bool, Lock> {
        // The owner's locks that overlap or touch the new one.
        let touch_start = range.start.saturating_sub(1);
        let touch_end = range.end.saturating_add(1).min(OFFSET_MAX);
        let mut touched = std::mem::take(&mut self.scratch);
        touched.clear();
        // One walk of the write index finds both another owner's write lock in the way (the
        // same one `test` would report: the walk goes down from the end) and the owner's own
        // write locks to merge or cut.
        for (start, (end, holder)) in self.writes.range(..=touch_end).rev() {
            if *end < touch_start {
                break;
            }
            if *holder == owner {
                touched.push(write_lock(owner, *start, *end));
            } else if *start <= range.end && *end >= range.start {
                self.scratch = touched;
                return Err(write_lock(*holder, *start, *end));
            }
        }
        if kind == LockKind::Write {
            let mut found = None;
            self.visit_read_conflicts(owner, range, &mut |lock| {
                found = Some(lock);
                false
            });
            if let Some(conflict) = found {
                self.scratch = touched;
                return Err(conflict);
            }
        }
        self.own_reads_overlapping(owner, touch_start, touch_end, &mut touched);
        let mut merged = range;
        let mut gave_up_writes = false;
        for old in touched.drain(..) {
            if old.kind == kind {
                // Same type, overlapping or adjacent: one lock.
                self.remove(old);
                merged.start = merged.start.min(old.range.start);
                merged.end = merged.end.max(old.range.end);
            } else if old.range.overlaps(&range) {
                // Other type: the new lock takes the part it covers.
                self.remove(old);
                self.keep_outside(old, range);
                gave_up_writes |= old.kind == LockKind::Write;
            }
        }
        self.scratch = touched;
        self.insert(Lock {
            owner,
            range: merged,
            kind,
        });
        Ok(gave_up_writes)
    }

    /// Re-adds the parts of `old` outside `cut`.
    fn keep_outside(&mut self, old: Lock, cut: Range) {
        if old.range.start < cut.start {
            self.insert(Lock {
                range: Range {
                    start: old.range.start,
                    end: cut.start - 1,
                },
                ..old
            });
        }
        if old.range.end > cut.end {
            self.insert(Lock {
                range: Range {
                    start: cut.end + 1,
                    end: old.range.end,
                },
                ..old
            });
        }
    }

    /// Releases `owner`'s locks on `range` (F_UNLCK), punching holes where needed. Returns
    /// whether anything was released.
    pub fn unlock(&mut self, owner: u64, range: Range) -> bool {
        let mut touched = std::mem::take(&mut self.scratch);
        touched.clear();
        self.own_writes_overlapping(owner, range.start, range.end, &mut touched);
        self.own_reads_overlapping(owner, range.start, range.end, &mut touched);
        let released = !touched.is_empty();
        for old in touched.drain(..) {
            self.remove(old);
            self.keep_outside(old, range);
        }
        self.scratch = touched;
        released
    }

    /// Every lock of `owner`, in no particular order.
    fn owner_locks(&self, owner: u64, out: &mut Vec<Lock>) {
        let Some(held) = self.own.get(&owner) else {
            return;
        };
        for start in &held.writes {
            let (end, _) = self.writes[start];
            out.push(write_lock(owner, *start, end));
        }
        for (start, end) in &held.reads {
            out.push(read_lock(owner, *start, *end));
        }
    }

    /// Releases every lock of `owner` (close, end of a session) and returns them.
    pub fn release_owner(&mut self, owner: u64) -> Vec<Lock> {
        let mut held = Vec::new();
        self.owner_locks(owner, &mut held);
        for lock in &held {
            self.remove(*lock);
        }
        held
    }

    /// Every lock, ordered by owner then start.
    pub fn locks(&self) -> Vec<Lock> {
        let mut out = Vec::with_capacity(self.len);
        for owner in self.own.keys() {
            let first = out.len();
            self.owner_locks(*owner, &mut out);
            out[first..].sort_unstable_by_key(|lock| lock.range.start);
        }
        out
    }

    /// Whole-structure consistency (debug and tests): the three indexes agree, an owner's locks
    /// are disjoint and never adjacent with the same type, write locks overlap nothing of
    /// another owner.
    pub fn check_consistency(&self) -> Result<(), String> {
        let locks = self.locks();
        let writes = locks.iter().filter(|l| l.kind == LockKind::Write).count();
        if locks.len() != self.len
            || writes != self.writes.len()
            || locks.len() - writes != self.reads.len()
        {
            return Err(format!(
                "index sizes: {} locks (len {}), {} writes indexed of {writes}, {} reads indexed",
                locks.len(),
                self.len,
                self.writes.len(),
                self.reads.len()
            ));
        }
        if self.own.values().any(|held| held.len() == 0) {
            return Err("an owner with an empty map".into());
        }
        for pair in locks.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.owner == b.owner {
                if a.range.end >= b.range.start {
                    return Err(format!("{a:?} overlaps {b:?}"));
                }
                if a.kind == b.kind && a.range.end + 1 == b.range.start {
                    return Err(format!("{a:?} and {b:?} should have merged"));
                }
            }
        }
        for lock in &locks {
            if lock.range.start > lock.range.end || lock.range.end > OFFSET_MAX {
                return Err(format!("{lock:?} is not a range"));
            }
            if lock.kind == LockKind::Write
                && self.writes.get(&lock.range.start) != Some(&(lock.range.end, lock.owner))
            {
                return Err(format!("{lock:?} missing from the write index"));
            }
            if let Some(other) = self.test(lock.owner, lock.range, lock.kind) {
                return Err(format!("{lock:?} overlaps {other:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Range {
        Range { start, end }
    }

    fn shape(locks: &RangeLocks) -> Vec<(u64, u64, u64, LockKind)> {
        locks
            .locks()
            .iter()
            .map(|l| (l.owner, l.range.start, l.range.end, l.kind))
            .collect()
    }

    #[test]
    fn a_different_type_from_the_same_owner_replaces_that_range() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(1, 10), LockKind::Read).unwrap();
        assert_eq!(locks.set(1, r(5, 6), LockKind::Write), Ok(false));
        assert_eq!(
            shape(&locks),
            vec![
                (1, 1, 4, LockKind::Read),
                (1, 5, 6, LockKind::Write),
                (1, 7, 10, LockKind::Read)
            ]
        );
        // And back: the read over everything merges all three, giving up the write bytes.
        assert_eq!(locks.set(1, r(1, 10), LockKind::Read), Ok(true));
        assert_eq!(shape(&locks), vec![(1, 1, 10, LockKind::Read)]);
        locks.check_consistency().unwrap();
    }

    #[test]
    fn same_type_merges_when_adjacent_or_overlapping() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(0, 4), LockKind::Write).unwrap();
        locks.set(1, r(5, 9), LockKind::Write).unwrap();
        locks.set(1, r(20, 30), LockKind::Write).unwrap();
        locks.set(1, r(8, 25), LockKind::Write).unwrap();
        assert_eq!(shape(&locks), vec![(1, 0, 30, LockKind::Write)]);
        // Another owner's adjacent lock stays separate.
        locks.set(2, r(31, 31), LockKind::Write).unwrap();
        assert_eq!(locks.len(), 2);
        locks.check_consistency().unwrap();
    }

    #[test]
    fn unlock_punches_a_hole_and_a_refused_set_changes_nothing() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(0, 99), LockKind::Read).unwrap();
        assert!(locks.unlock(1, r(10, 19)));
        assert!(!locks.unlock(1, r(10, 19)), "nothing left to release there");
        assert_eq!(locks.len(), 2);
        locks.set(2, r(50, 50), LockKind::Read).unwrap();
        let before = locks.locks();
        let conflict = locks.set(3, r(40, 60), LockKind::Write).unwrap_err();
        assert_eq!(conflict.kind, LockKind::Read);
        assert!(conflict.owner == 1 || conflict.owner == 2);
        assert_eq!(
            locks.locks(),
            before,
            "refused request left state unchanged"
        );
        assert_eq!(
            locks.test(3, r(10, 19), LockKind::Write),
            None,
            "the hole is free"
        );
        assert_eq!(locks.release_owner(1).len(), 2);
        assert_eq!(locks.len(), 1);
        locks.check_consistency().unwrap();
    }

    #[test]
    fn locks_reach_the_largest_offset() {
        let mut locks = RangeLocks::new();
        let everything = r(0, OFFSET_MAX);
        locks
            .set(1, r(OFFSET_MAX, OFFSET_MAX), LockKind::Write)
            .unwrap();
        assert!(locks.test(2, everything, LockKind::Read).is_some());
        locks.set(1, everything, LockKind::Write).unwrap();
        assert_eq!(shape(&locks), vec![(1, 0, OFFSET_MAX, LockKind::Write)]);
        locks.unlock(1, r(0, OFFSET_MAX - 1));
        assert_eq!(
            shape(&locks),
            vec![(1, OFFSET_MAX, OFFSET_MAX, LockKind::Write)]
        );
        locks.check_consistency().unwrap();
    }

    #[test]
    fn every_conflict_is_visited() {
        let mut locks = RangeLocks::new();
        for owner in 1..=5 {
            locks
                .set(owner, r(owner * 10, 100), LockKind::Read)
                .unwrap();
        }
        locks.set(9, r(200, 210), LockKind::Write).unwrap();
        let mut seen = Vec::new();
        locks.visit_conflicts(3, r(0, 300), LockKind::Write, &mut |lock| {
            seen.push(lock.owner);
            true
        });
        seen.sort();
        assert_eq!(seen, vec![1, 2, 4, 5, 9]);
    }
}
