//! Directories whose every name this mount knows, so that it answers a lookup of a name that
//! is not there without asking the server (`docs/design/mount.md`, "Names this mount knows").
//!
//! Before the kernel creates a file, it looks the name up; a new name is not in its cache, so
//! every create through a mount cost the server a lookup besides the create itself (and on
//! etcd that lookup is a quorum read). A directory this mount made is empty when the server
//! answers; from then on, while the mount follows every change, each change of its names is
//! either this mount's own (it knows the answer) or another client's (its record arrives about
//! a millisecond after the commit, and the directory is forgotten). So the mount knows the
//! directory's names exactly, as exactly as the kernel knows a name's absence it was given
//! (`Coherence::absence_ttl`): a name another client made is seen once its record arrives.
//!
//! Pure and deterministic: [`Listings`] is told what happened and answers [`Listings::absent`];
//! the caller ([`crate::cache::Coherence`]) decides when (following, ticket checks).

use std::collections::{HashMap, HashSet};

use calm_types::{Handle, MetaError};

/// Directories whose names are known, at most (beyond, directories made later are not kept).
pub const LISTED_DIRS_MAX: usize = 1 << 14;
/// Names known over all those directories, at most: a directory whose next name would pass it
/// is forgotten (its lookups go to the server again).
pub const LISTED_NAMES_MAX: usize = 1 << 18;

/// The names of each directory this mount knows completely.
#[derive(Debug, Default)]
pub struct Listings {
    dirs: HashMap<Handle, HashSet<Box<[u8]>>>,
    names: usize,
}

/// What this mount's own change of a name came to, as its answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done, or refused because it was already so: the name is there (a make or link that
    /// succeeded or answered EEXIST) or is not (a removal that succeeded or answered ENOENT).
    Known,
    /// Refused or failed otherwise: whether anything changed is not certain here.
    Unknown,
}

impl Outcome {
    /// What a make or link of a name answered says of the name: there (made, or EEXIST), or
    /// not certain.
    pub fn of_make<T>(made: &Result<T, MetaError>) -> Outcome {
        match made {
            Ok(_) => Outcome::Known,
            Err(e) if e.errno() == libc::EEXIST => Outcome::Known,
            Err(_) => Outcome::Unknown,
        }
    }

    /// What a removal of a name answered says of the name: gone (removed, or ENOENT), or not
    /// certain.
    pub fn of_removal<T>(removed: &Result<T, MetaError>) -> Outcome {
        match removed {
            Ok(_) => Outcome::Known,
            Err(e) if e.errno() == libc::ENOENT => Outcome::Known,
            Err(_) => Outcome::Unknown,
        }
    }
}

impl Listings {
    /// Whether `name` is known not to be in `dir`.
    pub fn absent(&self, dir: Handle, name: &[u8]) -> bool {
        self.dirs
            .get(&dir)
            .is_some_and(|names| !names.contains(name))
    }

    /// Whether every name of `dir` is known.
    pub fn knows(&self, dir: Handle) -> bool {
        self.dirs.contains_key(&dir)
    }

    /// Directories and names known, for tests and figures.
    pub fn len(&self) -> (usize, usize) {
        (self.dirs.len(), self.names)
    }

    /// This mount made the directory `dir`: it is empty.
    pub fn made_dir(&mut self, dir: Handle) {
        if self.dirs.len() < LISTED_DIRS_MAX && !self.dirs.contains_key(&dir) {
            self.dirs.insert(dir, HashSet::new());
        }
    }

    /// Every name of `dir` is `names` (the server said so): kept where the bounds allow.
    pub fn listed<'a>(&mut self, dir: Handle, names: impl Iterator<Item = &'a [u8]>) {
        self.forget(dir);
        let names: HashSet<Box<[u8]>> = names.map(Box::from).collect();
        if self.dirs.len() >= LISTED_DIRS_MAX || self.names + names.len() > LISTED_NAMES_MAX {
            return;
        }
        self.names += names.len();
        self.dirs.insert(dir, names);
    }

    /// This mount made or linked `name` in `dir` (or was told it is there).
    pub fn added(&mut self, dir: Handle, name: &[u8], outcome: Outcome) {
        if outcome == Outcome::Unknown {
            return self.forget(dir);
        }
        let full = self.names >= LISTED_NAMES_MAX;
        let Some(names) = self.dirs.get_mut(&dir) else {
            return;
        };
        if names.contains(name) {
            return;
        }
        if full {
            return self.forget(dir);
        }
        names.insert(name.into());
        self.names += 1;
    }

    /// This mount removed `name` from `dir` (or was told it is not there).
    pub fn removed(&mut self, dir: Handle, name: &[u8], outcome: Outcome) {
        if outcome == Outcome::Unknown {
            return self.forget(dir);
        }
        if let Some(names) = self.dirs.get_mut(&dir)
            && names.remove(name)
        {
            self.names -= 1;
        }
    }

    /// This mount renamed `name` in `from` to `to_name` in `to`: with `exchange`, both names
    /// stay (the two inodes swapped places).
    pub fn renamed(
        &mut self,
        (from, name): (Handle, &[u8]),
        (to, to_name): (Handle, &[u8]),
        exchange: bool,
        outcome: Outcome,
    ) {
        if outcome == Outcome::Unknown {
            self.forget(from);
            return self.forget(to);
        }
        if exchange {
            return;
        }
        self.removed(from, name, Outcome::Known);
        self.added(to, to_name, Outcome::Known);
    }

    /// Another client may have changed `dir`'s names (or the directory is gone): they are no
    /// longer known.
    pub fn forget(&mut self, dir: Handle) {
        if let Some(names) = self.dirs.remove(&dir) {
            self.names -= names.len();
        }
    }

    /// Anything may have changed: nothing is known.
    pub fn clear(&mut self) {
        self.dirs.clear();
        self.names = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_directory_made_here_is_known_until_another_client_changes_it() {
        let mut l = Listings::default();
        assert!(
            !l.absent(5, b"a"),
            "nothing is known of a directory not made here"
        );
        l.made_dir(5);
        assert!(l.absent(5, b"a"));
        l.added(5, b"a", Outcome::Known);
        assert!(!l.absent(5, b"a"));
        assert!(l.absent(5, b"b"));
        l.removed(5, b"a", Outcome::Known);
        assert!(l.absent(5, b"a"));
        l.forget(5);
        assert!(!l.absent(5, b"a"));
        assert_eq!(l.len(), (0, 0));
    }

    #[test]
    fn a_directory_the_server_listed_is_known_by_its_names_within_the_bounds() {
        let mut l = Listings::default();
        l.listed(5, [&b"a"[..], b"b"].into_iter());
        assert!(!l.absent(5, b"a") && l.absent(5, b"c"));
        assert_eq!(l.len(), (1, 2));
        l.listed(5, [&b"c"[..]].into_iter());
        assert!(l.absent(5, b"a") && !l.absent(5, b"c"));
        assert_eq!(
            l.len(),
            (1, 1),
            "listed again: the names before are forgotten"
        );
        let many: Vec<Vec<u8>> = (0..LISTED_NAMES_MAX)
            .map(|i| i.to_le_bytes().to_vec())
            .collect();
        l.listed(6, many.iter().map(Vec::as_slice));
        assert!(!l.knows(6), "past the names limit, not known");
        assert_eq!(l.len(), (1, 1));
    }

    #[test]
    fn an_answer_that_does_not_say_what_happened_forgets_the_directory() {
        let mut l = Listings::default();
        l.made_dir(5);
        l.added(5, b"a", Outcome::Unknown);
        assert!(!l.knows(5));
        l.made_dir(6);
        l.made_dir(7);
        l.renamed((6, b"x"), (7, b"y"), false, Outcome::Unknown);
        assert!(!l.knows(6) && !l.knows(7));
    }

    #[test]
    fn past_the_names_limit_a_directory_is_forgotten_not_wrong() {
        let mut l = Listings::default();
        l.made_dir(1);
        for i in 0..LISTED_NAMES_MAX {
            l.added(1, format!("n{i}").as_bytes(), Outcome::Known);
        }
        assert_eq!(l.len(), (1, LISTED_NAMES_MAX));
        l.added(1, b"one more", Outcome::Known);
        assert!(!l.knows(1), "a directory past the limit must be forgotten");
        assert!(!l.absent(1, b"one more"));
        assert_eq!(l.len(), (0, 0));
    }

    #[test]
    fn past_the_directories_limit_new_ones_are_not_kept() {
        let mut l = Listings::default();
        for dir in 0..LISTED_DIRS_MAX as Handle + 10 {
            l.made_dir(dir);
        }
        assert_eq!(l.len().0, LISTED_DIRS_MAX);
        assert!(!l.knows(LISTED_DIRS_MAX as Handle + 5));
    }

    /// What one client of the namespace does, as the mount hears of it.
    #[derive(Debug, Clone)]
    enum Step {
        /// This mount makes directory `dir` (new, empty).
        Mkdir(u8),
        /// This mount makes `name` in `dir`; the answer says what happened or not.
        Make(u8, u8, bool),
        Remove(u8, u8, bool),
        Rename(u8, u8, u8, u8, bool, bool),
        /// Another client makes or removes `name` in `dir`; its record arrives (or not yet).
        Other(u8, u8, bool, bool),
        /// Records of other clients that had not arrived do now.
        Arrive,
        /// The mount stopped following: everything is forgotten.
        Resync,
    }

    fn step() -> impl Strategy<Value = Step> {
        let dir = 0u8..4;
        let name = 0u8..4;
        prop_oneof![
            dir.clone().prop_map(Step::Mkdir),
            (dir.clone(), name.clone(), any::<bool>()).prop_map(|(d, n, k)| Step::Make(d, n, k)),
            (dir.clone(), name.clone(), any::<bool>()).prop_map(|(d, n, k)| Step::Remove(d, n, k)),
            (
                dir.clone(),
                name.clone(),
                dir.clone(),
                name.clone(),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(a, m, b, n, x, k)| Step::Rename(a, m, b, n, x, k)),
            (dir, name, any::<bool>(), any::<bool>())
                .prop_map(|(d, n, add, now)| Step::Other(d, n, add, now)),
            Just(Step::Arrive),
            Just(Step::Resync),
        ]
    }

    proptest! {
        /// Against the namespace itself: whatever this mount and other clients do, a name the
        /// listings call absent is absent, once every other client's change made before has
        /// arrived (the delay the kernel's own cache has too). A directory's handle is its
        /// number plus a generation, so a directory made again is a new one.
        #[test]
        fn a_name_called_absent_is_absent(steps in proptest::collection::vec(step(), 1..200)) {
            let mut l = Listings::default();
            let mut model: HashMap<Handle, BTreeSet<u8>> = HashMap::new();
            let mut generation: HashMap<u8, Handle> = HashMap::new();
            let mut pending: Vec<Handle> = Vec::new();
            let handle = |generation: &HashMap<u8, Handle>, d: u8| {
                generation.get(&d).copied().unwrap_or(0) * 16 + Handle::from(d)
            };
            for s in steps {
                match s {
                    Step::Mkdir(d) => {
                        *generation.entry(d).or_insert(0) += 1;
                        let h = handle(&generation, d);
                        model.insert(h, BTreeSet::new());
                        l.made_dir(h);
                    }
                    Step::Make(d, n, known) => {
                        let h = handle(&generation, d);
                        // A failure may or may not have applied: say it did.
                        model.entry(h).or_default().insert(n);
                        let outcome = if known { Outcome::Known } else { Outcome::Unknown };
                        l.added(h, &[n], outcome);
                    }
                    Step::Remove(d, n, known) => {
                        let h = handle(&generation, d);
                        model.entry(h).or_default().remove(&n);
                        let outcome = if known { Outcome::Known } else { Outcome::Unknown };
                        l.removed(h, &[n], outcome);
                    }
                    Step::Rename(a, m, b, n, exchange, known) => {
                        let (ha, hb) = (handle(&generation, a), handle(&generation, b));
                        let there = model.get(&ha).is_some_and(|s| s.contains(&m));
                        let outcome = if known { Outcome::Known } else { Outcome::Unknown };
                        if !there || (ha == hb && m == n) {
                            // Refused (ENOENT) or nothing to do: nothing changes; an answer
                            // that does not say so forgets both.
                            if !known {
                                l.renamed((ha, &[m]), (hb, &[n]), exchange, outcome);
                            }
                            continue;
                        }
                        if exchange {
                            // Done when both names are there; refused (ENOENT) otherwise,
                            // which changes nothing but forgets both when not said so.
                            if !known || model.get(&hb).is_some_and(|s| s.contains(&n)) {
                                l.renamed((ha, &[m]), (hb, &[n]), true, outcome);
                            }
                            continue;
                        }
                        model.entry(ha).or_default().remove(&m);
                        model.entry(hb).or_default().insert(n);
                        l.renamed((ha, &[m]), (hb, &[n]), false, outcome);
                    }
                    Step::Other(d, n, add, now) => {
                        let h = handle(&generation, d);
                        if add {
                            model.entry(h).or_default().insert(n);
                        } else {
                            model.entry(h).or_default().remove(&n);
                        }
                        if now { l.forget(h) } else { pending.push(h) }
                    }
                    Step::Arrive => {
                        for h in pending.drain(..) {
                            l.forget(h);
                        }
                    }
                    Step::Resync => {
                        pending.clear();
                        l.clear();
                    }
                }
                for (h, names) in &model {
                    if pending.contains(h) {
                        continue;
                    }
                    for n in 0u8..4 {
                        if l.absent(*h, &[n]) {
                            prop_assert!(!names.contains(&n), "dir {} name {} called absent", h, n);
                        }
                    }
                }
                let counted: usize = l.dirs.values().map(HashSet::len).sum();
                prop_assert_eq!(counted, l.names);
            }
        }
    }
}
