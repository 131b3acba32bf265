//! `calm-locks`: byte-range locks of one resource, as a pure, deterministic state machine.
//!
//! No I/O, no async, no clock, no threads: a request goes in, an answer comes out, and the
//! state changes only when the answer is a grant. What an owner *is* (a POSIX owner = client
//! session + pid, an OFD = an open file description) is the caller's business: here an owner is
//! an opaque `u64`, and two requests conflict only when their owners differ.
//!
//! Semantics are Linux's record locks: one owner's locks never overlap each other; a new lock
//! merges with the owner's overlapping or adjacent locks of the same type, and replaces the part
//! of the owner's locks of the other type that it covers (PR(1,10) then PW(5,6) gives PR(1,4),
//! PW(5,6), PR(7,10)); unlock punches holes; a refused request changes nothing.
//!
//! No operation is linear in the number of locks (the seed's failure was a list scanned per
//! request, O(n²) for n locks): with n locks and k locks actually touched (merged, split, or in
//! conflict), every operation is O(log n + k):
//! - `own`: every lock by `(owner, start)`: an owner's locks are disjoint, so those overlapping
//!   a range are the one just before it and the ones starting inside it;
//! - `writes`: every write lock by `start`: write locks are disjoint across *all* owners (a
//!   write lock overlaps nothing of anyone else), so the same search finds them;
//! - `reads`: read locks of different owners may overlap, so they live in an interval treap.
//!
//! Not yet here (issue 3): blocking waits, deadlock detection, flock, sessions and leases.

mod treap;

use std::collections::BTreeMap;
use std::ops::Bound;

pub use treap::Treap;

/// The largest byte offset a lock can reach: `i64::MAX`, as `off_t` (OFFSET_MAX).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// Read (shared) or write (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockKind {
    Read,
    Write,
}

/// An inclusive byte range `[start, end]`, `end <= OFFSET_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

/// Why a range is refused, with the errno Linux gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// EINVAL: a negative start, or a negative length reaching below 0.
    Invalid,
    /// EOVERFLOW: the range reaches past OFFSET_MAX.
    Overflow,
}

impl Range {
    /// The range of `struct flock`'s absolute `l_start` and `l_len`: `len == 0` means "to the
    /// end of any file", a negative `len` covers `[start + len, start - 1]`.
    pub fn from_posix(start: i64, len: i64) -> Result<Range, RangeError> {
        if start < 0 {
            return Err(RangeError::Invalid);
        }
        let (start, end) = match len {
            0 => (start, i64::MAX),
            len if len > 0 => {
                let end = start.checked_add(len - 1).ok_or(RangeError::Overflow)?;
                (start, end)
            }
            len => {
                let first = start.checked_add(len).ok_or(RangeError::Invalid)?;
                if first < 0 {
                    return Err(RangeError::Invalid);
                }
                (first, start - 1)
            }
        };
        if end < start {
            return Err(RangeError::Invalid);
        }
        Ok(Range {
            start: start as u64,
            end: end as u64,
        })
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// A granted lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lock {
    pub owner: u64,
    pub range: Range,
    pub kind: LockKind,
}

/// Bit 63 of a packed `own` value: set for a write lock. Free because `end <= OFFSET_MAX`, and
/// it makes an entry 24 bytes instead of 32 (smaller tree nodes, fewer cache misses).
const WRITE_BIT: u64 = 1 << 63;
const _: () = assert!(OFFSET_MAX & WRITE_BIT == 0);

fn pack(end: u64, kind: LockKind) -> u64 {
    debug_assert!(end <= OFFSET_MAX);
    match kind {
        LockKind::Read => end,
        LockKind::Write => end | WRITE_BIT,
    }
}

fn unpack(value: u64) -> (u64, LockKind) {
    if value & WRITE_BIT == 0 {
        (value, LockKind::Read)
    } else {
        (value & !WRITE_BIT, LockKind::Write)
    }
}

/// The lock an entry of the `own` index stands for.
fn own_entry_to_lock(((owner, start), value): (&(u64, u64), &u64)) -> Lock {
    let (end, kind) = unpack(*value);
    Lock {
        owner: *owner,
        range: Range { start: *start, end },
        kind,
    }
}

/// The byte-range locks of one resource.
#[derive(Debug, Clone, Default)]
pub struct RangeLocks {
    /// Every lock: `(owner, start)` → `end` with the kind in bit 63 (see [`pack`]).
    own: BTreeMap<(u64, u64), u64>,
    /// Every write lock: `start` → `(end, owner)`. Disjoint across owners.
    writes: BTreeMap<u64, (u64, u64)>,
    /// Every read lock.
    reads: Treap,
}

impl RangeLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of locks held.
    pub fn len(&self) -> usize {
        self.own.len()
    }

    pub fn is_empty(&self) -> bool {
        self.own.is_empty()
    }

    /// A lock of another owner that `kind` on `range` by `owner` would conflict with, if any
    /// (F_GETLK). Does not change anything.
    pub fn test(&self, owner: u64, range: Range, kind: LockKind) -> Option<Lock> {
        if let Some(lock) = self.conflicting_write(owner, range) {
            return Some(lock);
        }
        if kind == LockKind::Write
            && let Some((start, end, holder)) =
                self.reads.find_overlap(range.start, range.end, owner)
        {
            return Some(Lock {
                owner: holder,
                range: Range { start, end },
                kind: LockKind::Read,
            });
        }
        None
    }

    fn conflicting_write(&self, owner: u64, range: Range) -> Option<Lock> {
        let before = self
            .writes
            .range(..range.start)
            .next_back()
            .filter(|(_, (end, _))| *end >= range.start);
        let inside = self.writes.range(range.start..=range.end);
        before
            .into_iter()
            .chain(inside)
            .find(|(_, (_, holder))| *holder != owner)
            .map(|(start, (end, holder))| Lock {
                owner: *holder,
                range: Range {
                    start: *start,
                    end: *end,
                },
                kind: LockKind::Write,
            })
    }

    /// `owner`'s locks overlapping `[a, b]`, in order.
    fn own_overlapping(&self, owner: u64, a: u64, b: u64) -> Vec<Lock> {
        let before = self
            .own
            .range((Bound::Included((owner, 0)), Bound::Excluded((owner, a))))
            .next_back()
            .filter(|(_, value)| unpack(**value).0 >= a);
        let inside = self.own.range((owner, a)..=(owner, b));
        before
            .into_iter()
            .chain(inside)
            .map(own_entry_to_lock)
            .collect()
    }

    fn insert(&mut self, lock: Lock) {
        let Lock { owner, range, kind } = lock;
        self.own.insert((owner, range.start), pack(range.end, kind));
        match kind {
            LockKind::Write => {
                self.writes.insert(range.start, (range.end, owner));
            }
            LockKind::Read => self.reads.insert(range.start, range.end, owner),
        }
    }

    fn remove(&mut self, lock: Lock) {
        self.own.remove(&(lock.owner, lock.range.start));
        match lock.kind {
            LockKind::Write => {
                self.writes.remove(&lock.range.start);
            }
            LockKind::Read => {
                self.reads.remove(lock.range.start, lock.owner);
            }
        }
    }

    /// Takes `kind` on `range` for `owner` (F_SETLK), or returns the conflicting lock and
    /// changes nothing.
    pub fn set(&mut self, owner: u64, range: Range, kind: LockKind) -> Result<(), Lock> {
        if let Some(conflict) = self.test(owner, range, kind) {
            return Err(conflict);
        }
        // The owner's locks that overlap or touch the new one.
        let touch_start = range.start.saturating_sub(1);
        let touch_end = range.end.saturating_add(1).min(OFFSET_MAX);
        let mut merged = range;
        for old in self.own_overlapping(owner, touch_start, touch_end) {
            if old.kind == kind {
                // Same type, overlapping or adjacent: one lock.
                self.remove(old);
                merged.start = merged.start.min(old.range.start);
                merged.end = merged.end.max(old.range.end);
            } else if old.range.overlaps(&range) {
                // Other type: the new lock takes the part it covers.
                self.remove(old);
                self.keep_outside(old, range);
            }
        }
        self.insert(Lock {
            owner,
            range: merged,
            kind,
        });
        Ok(())
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

    /// Releases `owner`'s locks on `range` (F_UNLCK), punching holes where needed.
    pub fn unlock(&mut self, owner: u64, range: Range) {
        for old in self.own_overlapping(owner, range.start, range.end) {
            self.remove(old);
            self.keep_outside(old, range);
        }
    }

    /// Releases every lock of `owner` (close of the last descriptor, end of a session).
    /// Returns how many locks were released.
    pub fn release_owner(&mut self, owner: u64) -> usize {
        let held: Vec<Lock> = self.own_overlapping(owner, 0, u64::MAX);
        for lock in &held {
            self.remove(*lock);
        }
        held.len()
    }

    /// Every lock, ordered by owner then start.
    pub fn locks(&self) -> Vec<Lock> {
        self.own.iter().map(own_entry_to_lock).collect()
    }

    /// Whole-structure consistency (debug and tests): the three indexes agree, an owner's locks
    /// are disjoint and never adjacent with the same type, write locks overlap nothing of
    /// another owner.
    pub fn check_consistency(&self) -> Result<(), String> {
        let locks = self.locks();
        let writes = locks.iter().filter(|l| l.kind == LockKind::Write).count();
        if writes != self.writes.len() || locks.len() - writes != self.reads.len() {
            return Err(format!(
                "index sizes: {} locks, {} writes indexed of {writes}, {} reads indexed",
                locks.len(),
                self.writes.len(),
                self.reads.len()
            ));
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
            match lock.kind {
                LockKind::Write => {
                    if self.writes.get(&lock.range.start) != Some(&(lock.range.end, lock.owner)) {
                        return Err(format!("{lock:?} missing from the write index"));
                    }
                    if let Some(other) = self.test(lock.owner, lock.range, LockKind::Write) {
                        return Err(format!("{lock:?} overlaps {other:?}"));
                    }
                }
                LockKind::Read => {
                    if let Some(other) = self.conflicting_write(lock.owner, lock.range) {
                        return Err(format!("{lock:?} overlaps {other:?}"));
                    }
                }
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

    #[test]
    fn a_different_type_from_the_same_owner_replaces_that_range() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(1, 10), LockKind::Read).unwrap();
        locks.set(1, r(5, 6), LockKind::Write).unwrap();
        let got: Vec<(u64, u64, LockKind)> = locks
            .locks()
            .iter()
            .map(|l| (l.range.start, l.range.end, l.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 4, LockKind::Read),
                (5, 6, LockKind::Write),
                (7, 10, LockKind::Read)
            ]
        );
        locks.check_consistency().unwrap();
    }

    #[test]
    fn same_type_merges_when_adjacent_or_overlapping() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(0, 4), LockKind::Write).unwrap();
        locks.set(1, r(5, 9), LockKind::Write).unwrap();
        locks.set(1, r(20, 30), LockKind::Write).unwrap();
        locks.set(1, r(8, 25), LockKind::Write).unwrap();
        assert_eq!(locks.locks().len(), 1);
        assert_eq!(locks.locks()[0].range, r(0, 30));
    }

    #[test]
    fn unlock_punches_a_hole_and_a_refused_set_changes_nothing() {
        let mut locks = RangeLocks::new();
        locks.set(1, r(0, 99), LockKind::Read).unwrap();
        locks.unlock(1, r(10, 19));
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
        assert_eq!(locks.release_owner(1), 2);
        assert_eq!(locks.len(), 1);
    }

    #[test]
    fn posix_ranges() {
        assert_eq!(Range::from_posix(5, 0), Ok(r(5, OFFSET_MAX)));
        assert_eq!(Range::from_posix(5, 3), Ok(r(5, 7)));
        assert_eq!(Range::from_posix(5, -3), Ok(r(2, 4)));
        assert_eq!(Range::from_posix(5, -6), Err(RangeError::Invalid));
        assert_eq!(Range::from_posix(-1, 1), Err(RangeError::Invalid));
        assert_eq!(Range::from_posix(i64::MAX, 2), Err(RangeError::Overflow));
        assert_eq!(
            Range::from_posix(i64::MAX, 1),
            Ok(r(OFFSET_MAX, OFFSET_MAX))
        );
    }
}
