//! Copies: files whose opens this mount answers itself, because the server asks for the copy
//! back before it answers another client's change of the file (docs/design/mount.md,
//! "Copies"). Pure bookkeeping; the open, the recall and the giving back are the callers'.
//!
//! A recall can reach the mount before the grant it is about (the map's reply is still on its
//! way): an open reads [`Copies::seen`] before it asks, and [`Copies::keep`] refuses the grant
//! when a recall of the file, or the end of the stream of recalls, came since.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use calm_types::Handle;
use calm_types::sync::Locked;

/// Copies this mount keeps at most (the server's limit per session); past it, a grant is given
/// back.
pub const COPIES_KEPT_MAX: usize = 65_536;
/// Hashed counters of recalls (a collision only refuses a grant).
const RECALL_SLOTS: usize = 4096;

/// What an open saw before it asked for a copy ([`Copies::seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    stream: u64,
    recalls: u64,
}

#[derive(Debug)]
struct Inner {
    kept: HashSet<Handle>,
    recalls: Vec<u64>,
    /// Ends of the stream of recalls (with it, the server forgot every copy).
    streams: u64,
}

/// The copies this mount keeps.
#[derive(Debug)]
pub(crate) struct Copies {
    inner: Mutex<Inner>,
    /// Opens answered from a copy.
    answered: AtomicU64,
}

impl Default for Copies {
    fn default() -> Copies {
        Copies {
            inner: Mutex::new(Inner {
                kept: HashSet::new(),
                recalls: vec![0; RECALL_SLOTS],
                streams: 0,
            }),
            answered: AtomicU64::new(0),
        }
    }
}

fn slot(handle: Handle) -> usize {
    (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % RECALL_SLOTS
}

impl Copies {
    /// Read before the map of `handle` is asked for with a copy.
    pub(crate) fn seen(&self, handle: Handle) -> Seen {
        let inner = self.inner.locked();
        Seen {
            stream: inner.streams,
            recalls: inner.recalls[slot(handle)],
        }
    }

    /// The server granted a copy of `handle` to an open that saw `seen`: whether it is kept
    /// (else the caller gives it back).
    pub(crate) fn keep(&self, handle: Handle, seen: Seen) -> bool {
        let mut inner = self.inner.locked();
        if inner.streams != seen.stream
            || inner.recalls[slot(handle)] != seen.recalls
            || inner.kept.len() >= COPIES_KEPT_MAX
        {
            return false;
        }
        inner.kept.insert(handle);
        true
    }

    /// Whether this mount keeps a copy of `handle`.
    pub(crate) fn has(&self, handle: Handle) -> bool {
        self.inner.locked().kept.contains(&handle)
    }

    /// The copy of `handle` is dropped here (this mount changes the file, or forgot it):
    /// whether there was one (then the caller gives it back).
    pub(crate) fn drop_copy(&self, handle: Handle) -> bool {
        self.inner.locked().kept.remove(&handle)
    }

    /// The server asked for `handle`: any copy of it, and any grant of it on its way, ends.
    pub(crate) fn recalled(&self, handle: Handle) -> bool {
        let mut inner = self.inner.locked();
        let at = slot(handle);
        inner.recalls[at] = inner.recalls[at].wrapping_add(1);
        inner.kept.remove(&handle)
    }

    /// The stream of recalls ended: the server keeps no copy of this mount's any more.
    pub(crate) fn stream_ended(&self) {
        let mut inner = self.inner.locked();
        inner.streams += 1;
        inner.kept.clear();
    }

    /// Copies kept.
    pub(crate) fn count(&self) -> usize {
        self.inner.locked().kept.len()
    }

    /// An open was answered from a copy.
    pub(crate) fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// Opens answered from a copy so far.
    pub(crate) fn opens_answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_kept_only_if_nothing_ended_it_while_it_came() {
        let copies = Copies::default();
        let seen = copies.seen(7);
        assert!(copies.keep(7, seen));
        assert!(copies.has(7));
        assert!(copies.recalled(7));
        assert!(!copies.has(7));

        // A recall that came before its grant.
        let seen = copies.seen(7);
        assert!(!copies.recalled(7));
        assert!(!copies.keep(7, seen));
        assert!(!copies.has(7));

        // The stream ended while the grant came.
        let seen = copies.seen(8);
        copies.stream_ended();
        assert!(!copies.keep(8, seen));

        // A recall of another file does not end this one's grant (unless they share a slot).
        let seen = copies.seen(9);
        let other = (10..).find(|h| slot(*h) != slot(9)).expect("another slot");
        copies.recalled(other);
        assert!(copies.keep(9, seen));
        assert!(copies.drop_copy(9));
        assert!(!copies.drop_copy(9));
        assert_eq!(copies.count(), 0);
    }

    #[test]
    fn the_end_of_the_stream_ends_every_copy() {
        let copies = Copies::default();
        for handle in 0..100 {
            let seen = copies.seen(handle);
            assert!(copies.keep(handle, seen));
        }
        assert_eq!(copies.count(), 100);
        copies.stream_ended();
        assert_eq!(copies.count(), 0);
        assert!((0..100).all(|h| !copies.has(h)));
    }
}
