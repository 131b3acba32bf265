//! The changes a reply is checked against: a count of every change the mount has seen, and
//! for each slot of handles (hashed), for every handle at once and for directories' attributes,
//! the count when one last changed. A request takes the count when it begins
//! ([`Changes::now`]); its reply may be cached only if nothing it is about was marked since
//! ([`Changes::since`]). Marks from the thread that follows the server's changes and from the
//! request threads (a mount's own changes) race each other: a slot's count only ever rises,
//! so a mark that counted later is never overwritten by one that counted earlier.

use crate::sync::{AtomicU64, Ordering};

/// An inode's number, as the mount's cache knows it.
pub type Handle = u64;

#[derive(Debug)]
pub struct Changes {
    /// Changes marked so far.
    count: AtomicU64,
    /// Per slot, the count when one of its handles last changed.
    by_slot: Box<[AtomicU64]>,
    /// The count when anything may have changed (the stream fell behind or broke).
    all: AtomicU64,
    /// The count when this mount last renamed or removed a name it could not tell was not a
    /// directory's (which directories' attributes changed is not known here).
    dirs: AtomicU64,
}

impl Changes {
    /// A table of `slots` slots (at least one; a collision only makes a reply cached for 0 s).
    pub fn new(slots: usize) -> Changes {
        Changes {
            count: AtomicU64::new(0),
            by_slot: (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect(),
            all: AtomicU64::new(0),
            dirs: AtomicU64::new(0),
        }
    }

    /// The count now: what a request takes when it begins.
    pub fn now(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Marks a change of `handles`.
    pub fn mark(&self, handles: impl IntoIterator<Item = Handle>) {
        let now = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        for handle in handles {
            self.by_slot[self.slot(handle)].fetch_max(now, Ordering::SeqCst);
        }
    }

    /// Marks that anything may have changed.
    pub fn mark_all(&self) {
        let now = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        self.all.fetch_max(now, Ordering::SeqCst);
    }

    /// Marks that some directory's attributes changed.
    pub fn mark_dirs(&self) {
        let now = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        self.dirs.fetch_max(now, Ordering::SeqCst);
    }

    /// Whether `handle` (or anything) was marked after the count was `then`.
    pub fn since(&self, then: u64, handle: Handle) -> bool {
        self.by_slot[self.slot(handle)].load(Ordering::SeqCst) > then
            || self.all.load(Ordering::SeqCst) > then
    }

    /// Whether some directory's attributes were marked after the count was `then`.
    pub fn dirs_since(&self, then: u64) -> bool {
        self.dirs.load(Ordering::SeqCst) > then
    }

    fn slot(&self, handle: Handle) -> usize {
        // Fibonacci hashing: consecutive handles spread over the slots.
        (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize % self.by_slot.len()
    }
}

/// The marks' races under every interleaving loom finds.
#[cfg(all(test, feature = "loom"))]
mod models {
    use super::*;
    use loom::sync::Arc;

    /// Two marks of handles that share a slot, racing a request that begins between them: the
    /// later mark's count stays in the slot, so the request's reply is not cached.
    #[test]
    fn a_mark_counted_after_a_request_began_is_never_overwritten_by_an_earlier_one() {
        loom::model(|| {
            let changes = Arc::new(Changes::new(1));
            let marks: Vec<_> = [1, 2]
                .into_iter()
                .map(|handle| {
                    let changes = changes.clone();
                    loom::thread::spawn(move || changes.mark([handle]))
                })
                .collect();
            let began = changes.now();
            for mark in marks {
                mark.join().unwrap();
            }
            // Both marks are done: one counted after the request began unless both came
            // before.
            let after = changes.now() > began;
            assert_eq!(changes.since(began, 1), after, "began at {began}");
            assert_eq!(changes.since(began, 2), after, "began at {began}");
        });
    }

    /// A reply checked after a mark that the request's own thread saw done (the invalidation
    /// marks, then tells the kernel): the check sees it, whatever else marks meanwhile.
    #[test]
    fn a_mark_done_before_the_check_is_seen_by_a_request_begun_before_it() {
        loom::model(|| {
            let changes = Arc::new(Changes::new(2));
            let began = changes.now();
            let all = {
                let changes = changes.clone();
                loom::thread::spawn(move || changes.mark_all())
            };
            let dirs = {
                let changes = changes.clone();
                loom::thread::spawn(move || changes.mark_dirs())
            };
            changes.mark([7]);
            assert!(changes.since(began, 7));
            all.join().unwrap();
            dirs.join().unwrap();
            assert!(changes.since(began, 8));
            assert!(changes.dirs_since(began));
            assert!(!changes.dirs_since(changes.now()));
        });
    }
}
