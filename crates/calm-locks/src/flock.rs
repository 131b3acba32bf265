//! BSD `flock` locks of one resource: whole-file, shared or exclusive, held by an open file
//! description, and independent of the record locks (as on Linux: a flock lock never conflicts
//! with a POSIX or OFD lock on the same file).
//!
//! A conversion (shared to exclusive or back) by the holder is atomic here: a refused
//! conversion keeps the lock the owner had. Linux drops the old lock first and may then fail
//! or sleep without it; keeping it is what "a refused request changes nothing" asks for.

use std::collections::BTreeSet;

use crate::range::LockKind;

/// Who holds the flock lock of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlockTable {
    /// The exclusive holder. Invariant: when set, `shared` is empty.
    exclusive: Option<u64>,
    shared: BTreeSet<u64>,
}

impl FlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.shared.len() + usize::from(self.exclusive.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lock `owner` holds, if any.
    pub fn held_by(&self, owner: u64) -> Option<LockKind> {
        if self.exclusive == Some(owner) {
            Some(LockKind::Write)
        } else if self.shared.contains(&owner) {
            Some(LockKind::Read)
        } else {
            None
        }
    }

    /// Calls `visit(owner, kind)` for every holder `kind` by `owner` conflicts with, until it
    /// returns false.
    pub fn visit_conflicts(
        &self,
        owner: u64,
        kind: LockKind,
        visit: &mut dyn FnMut(u64, LockKind) -> bool,
    ) {
        if let Some(holder) = self.exclusive {
            if holder != owner {
                visit(holder, LockKind::Write);
            }
            return;
        }
        if kind == LockKind::Write {
            for holder in &self.shared {
                if *holder != owner && !visit(*holder, LockKind::Read) {
                    return;
                }
            }
        }
    }

    /// One holder `kind` by `owner` conflicts with, if any.
    pub fn test(&self, owner: u64, kind: LockKind) -> Option<(u64, LockKind)> {
        let mut found = None;
        self.visit_conflicts(owner, kind, &mut |holder, held| {
            found = Some((holder, held));
            false
        });
        found
    }

    /// Takes (or converts to) `kind` for `owner`, or returns a conflicting holder and changes
    /// nothing. `Ok(true)` when an exclusive lock became shared (others may now get in).
    pub fn set(&mut self, owner: u64, kind: LockKind) -> Result<bool, (u64, LockKind)> {
        if let Some(conflict) = self.test(owner, kind) {
            return Err(conflict);
        }
        let downgraded = kind == LockKind::Read && self.exclusive == Some(owner);
        self.exclusive = None;
        match kind {
            LockKind::Write => {
                self.shared.remove(&owner);
                self.exclusive = Some(owner);
            }
            LockKind::Read => {
                self.shared.insert(owner);
            }
        }
        Ok(downgraded)
    }

    /// Releases `owner`'s lock (LOCK_UN, or the last close of the file description). Returns
    /// whether it held one.
    pub fn unlock(&mut self, owner: u64) -> bool {
        if self.exclusive == Some(owner) {
            self.exclusive = None;
            true
        } else {
            self.shared.remove(&owner)
        }
    }

    /// Every holder, exclusive first.
    pub fn holders(&self) -> Vec<(u64, LockKind)> {
        let exclusive = self.exclusive.map(|owner| (owner, LockKind::Write));
        let shared = self.shared.iter().map(|owner| (*owner, LockKind::Read));
        exclusive.into_iter().chain(shared).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_exclude_a_writer_and_conversion_is_atomic() {
        let mut table = FlockTable::new();
        table.set(1, LockKind::Read).unwrap();
        table.set(2, LockKind::Read).unwrap();
        assert_eq!(table.set(1, LockKind::Write), Err((2, LockKind::Read)));
        assert_eq!(table.held_by(1), Some(LockKind::Read), "kept on refusal");
        assert!(table.unlock(2));
        assert_eq!(table.set(1, LockKind::Write), Ok(false));
        assert_eq!(table.test(3, LockKind::Read), Some((1, LockKind::Write)));
        assert_eq!(table.set(1, LockKind::Read), Ok(true), "a downgrade");
        assert_eq!(table.holders(), vec![(1, LockKind::Read)]);
        assert!(table.unlock(1));
        assert!(!table.unlock(1));
        assert!(table.is_empty());
    }
}
