//! Files removed soon after they were made skip the trash: a program's scratch files (a
//! database's journal made and removed at every transaction, an editor's temporary copy, a
//! build's intermediate outputs) are not what a trash is for, and kept for a day they would
//! fill the store (a sqlite transaction in DELETE mode left about 12 KB of it, 4 GB an hour at
//! full speed). A person's mistake is another matter: what they remove was, nearly always,
//! made longer ago than a program's scratch file lives.
//!
//! The committer remembers when it made each of the last [`YOUNG_FILES_MAX`] nodes, for
//! `MetaOptions::trash_min_age` (10 s by default); a node that loses its last name younger
//! than that is destroyed at once, as without a trash. Only this committer's own creates are
//! known, since its start: a node made before a restart, or by another server of a shared
//! store, goes to the trash, as does everything past the bound (made during a storm of more
//! than [`YOUNG_FILES_MAX`] creates within the age). Pure: time is given.

use std::collections::{HashMap, VecDeque};

use crate::types::Handle;

/// Nodes whose birth the committer remembers at most (16 bytes each in the map, 16 in the
/// queue).
pub const YOUNG_FILES_MAX: usize = 65_536;

/// Default age below which a removed node skips the trash.
pub const TRASH_MIN_AGE_DEFAULT: std::time::Duration = std::time::Duration::from_secs(10);

/// When the committer made its latest nodes.
#[derive(Debug, Default)]
pub struct YoungFiles {
    min_age_ns: i64,
    born: HashMap<Handle, i64>,
    /// `(born_ns, handle)` in the order made; an entry whose handle was forgotten (or made
    /// again) is skipped when it comes out.
    order: VecDeque<(i64, Handle)>,
}

impl YoungFiles {
    /// Remembers nodes for `min_age` (zero: none, every removal goes to the trash).
    pub fn new(min_age: std::time::Duration) -> YoungFiles {
        YoungFiles {
            min_age_ns: i64::try_from(min_age.as_nanos()).unwrap_or(i64::MAX),
            ..YoungFiles::default()
        }
    }

    /// `handle` was made at `now_ns`.
    pub fn born(&mut self, handle: Handle, now_ns: i64) {
        if self.min_age_ns == 0 {
            return;
        }
        self.prune(now_ns);
        while self.born.len() >= YOUNG_FILES_MAX {
            self.pop();
        }
        self.born.insert(handle, now_ns);
        self.order.push_back((now_ns, handle));
    }

    /// Whether `handle` was made less than the minimum age before `now_ns`.
    pub fn is_young(&self, handle: Handle, now_ns: i64) -> bool {
        self.born
            .get(&handle)
            .is_some_and(|born| now_ns.saturating_sub(*born) < self.min_age_ns)
    }

    /// `handle` is gone.
    pub fn forget(&mut self, handle: Handle) {
        self.born.remove(&handle);
    }

    /// Nodes remembered.
    pub fn len(&self) -> usize {
        self.born.len()
    }

    pub fn is_empty(&self) -> bool {
        self.born.is_empty()
    }

    fn prune(&mut self, now_ns: i64) {
        while let Some(&(born, _)) = self.order.front() {
            if now_ns.saturating_sub(born) < self.min_age_ns {
                break;
            }
            self.pop();
        }
        // Entries of forgotten nodes pile up only until they come out, at most the bound.
        while self.order.len() > 2 * YOUNG_FILES_MAX {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some((born, handle)) = self.order.pop_front()
            && self.born.get(&handle) == Some(&born)
        {
            self.born.remove(&handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn a_node_is_young_for_the_minimum_age() {
        let mut young = YoungFiles::new(std::time::Duration::from_secs(60));
        young.born(7, 100 * S);
        assert!(young.is_young(7, 100 * S));
        assert!(young.is_young(7, 159 * S));
        assert!(!young.is_young(7, 160 * S));
        assert!(!young.is_young(8, 100 * S), "not made here");
        young.forget(7);
        assert!(!young.is_young(7, 101 * S));
        // Without a minimum age nothing is young.
        let mut none = YoungFiles::new(std::time::Duration::ZERO);
        none.born(7, 0);
        assert!(!none.is_young(7, 0));
    }

    #[test]
    fn memory_stays_bounded_through_a_storm_of_creates() {
        let mut young = YoungFiles::new(std::time::Duration::from_secs(60));
        for handle in 0..(3 * YOUNG_FILES_MAX as u64) {
            young.born(handle, 0);
            if handle % 3 == 0 {
                young.forget(handle);
            }
        }
        assert!(young.len() <= YOUNG_FILES_MAX);
        assert!(young.order.len() <= 2 * YOUNG_FILES_MAX + 1);
        // The latest are known; the earliest went past the bound.
        assert!(young.is_young(3 * YOUNG_FILES_MAX as u64 - 1, 0));
        assert!(!young.is_young(1, 0));
    }

    proptest! {
        /// Against a model that remembers every birth forever: a node is young exactly when
        /// the model says so and it is among the last YOUNG_FILES_MAX made (never younger
        /// than the model says).
        #[test]
        fn young_means_made_within_the_age(steps in prop::collection::vec((0u64..50, 0i64..30, any::<bool>()), 1..300)) {
            let mut young = YoungFiles::new(std::time::Duration::from_secs(10));
            let mut model: HashMap<Handle, i64> = HashMap::new();
            let mut now = 0;
            for (handle, advance_s, remove) in steps {
                now += advance_s * S / 4;
                if remove {
                    let expected = model.get(&handle).is_some_and(|b| now - b < 10 * S);
                    prop_assert_eq!(young.is_young(handle, now), expected);
                    young.forget(handle);
                    model.remove(&handle);
                } else {
                    young.born(handle, now);
                    model.insert(handle, now);
                }
            }
        }
    }
}
