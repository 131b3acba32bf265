//! Copies: which sessions answer opens of a file from what they read of it (pure; the server's
//! holds table asks them back, `crate::holds`).
//!
//! A copy is granted at a read of the file's map and asked back after another session's change
//! of the file committed, before that change is answered: a session that keeps a copy never
//! opens a file older than a change whose caller was answered.
//!
//! A grant races with a change: the map read before the change committed, the grant after the
//! change looked for copies to ask back. Each change counts one more change of its file (in
//! [`CHANGE_SLOTS`] hashed counters), and a grant is refused when its file's count moved since
//! just before its map was read.

use std::collections::{HashMap, HashSet};

use calm_meta::Handle;

/// Hashed counters of changes (a collision only refuses a grant).
pub const CHANGE_SLOTS: usize = 1 << 16;

/// Copies kept, by file and by session.
#[derive(Debug)]
pub(crate) struct Copies {
    files: HashMap<Handle, HashSet<u64>>,
    sessions: HashMap<u64, HashSet<Handle>>,
    /// Copies asked back already (not asked again).
    asked: HashSet<(Handle, u64)>,
    changes: Vec<u64>,
    count: usize,
}

impl Default for Copies {
    fn default() -> Copies {
        Copies {
            files: HashMap::new(),
            sessions: HashMap::new(),
            asked: HashSet::new(),
            changes: vec![0; CHANGE_SLOTS],
            count: 0,
        }
    }
}

fn slot(handle: Handle) -> usize {
    (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize % CHANGE_SLOTS
}

impl Copies {
    /// Copies kept, in all.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Copies `session` keeps.
    pub(crate) fn of(&self, session: u64) -> usize {
        self.sessions.get(&session).map_or(0, HashSet::len)
    }

    /// The count of changes of `handle` (read before its map is, for [`Copies::grant`]).
    pub(crate) fn changes(&self, handle: Handle) -> u64 {
        self.changes[slot(handle)]
    }

    /// Grants `session` a copy of `handle` if no change of it counted since `changes`.
    pub(crate) fn grant(&mut self, session: u64, handle: Handle, changes: u64) -> bool {
        if self.changes(handle) != changes {
            return false;
        }
        if self.files.entry(handle).or_default().insert(session) {
            self.sessions.entry(session).or_default().insert(handle);
            self.count += 1;
        }
        true
    }

    /// `session` no longer keeps a copy of `handle`.
    pub(crate) fn give_back(&mut self, session: u64, handle: Handle) -> bool {
        let Some(sessions) = self.files.get_mut(&handle) else {
            return false;
        };
        if !sessions.remove(&session) {
            return false;
        }
        if sessions.is_empty() {
            self.files.remove(&handle);
        }
        if let Some(handles) = self.sessions.get_mut(&session) {
            handles.remove(&handle);
            if handles.is_empty() {
                self.sessions.remove(&session);
            }
        }
        self.asked.remove(&(handle, session));
        self.count -= 1;
        true
    }

    /// Every copy of `session` ends: how many.
    pub(crate) fn end_session(&mut self, session: u64) -> usize {
        let Some(handles) = self.sessions.remove(&session) else {
            return 0;
        };
        for handle in &handles {
            if let Some(sessions) = self.files.get_mut(handle) {
                sessions.remove(&session);
                if sessions.is_empty() {
                    self.files.remove(handle);
                }
            }
            self.asked.remove(&(*handle, session));
        }
        self.count -= handles.len();
        handles.len()
    }

    /// A change of `handle` committed: counted.
    pub(crate) fn changed(&mut self, handle: Handle) {
        let at = slot(handle);
        self.changes[at] = self.changes[at].wrapping_add(1);
    }

    /// The sessions other than `asker` with a copy of `handle`.
    pub(crate) fn wanted(&self, asker: u64, handle: Handle) -> Vec<u64> {
        self.files
            .get(&handle)
            .map(|s| s.iter().copied().filter(|s| *s != asker).collect())
            .unwrap_or_default()
    }

    /// Of [`Copies::wanted`], those not asked back yet, marked asked now.
    pub(crate) fn unasked(&mut self, asker: u64, handle: Handle) -> Vec<u64> {
        let mut ask = self.wanted(asker, handle);
        ask.retain(|session| self.asked.insert((handle, *session)));
        ask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_grant_after_a_change_it_did_not_see_is_refused() {
        let mut copies = Copies::default();
        let before = copies.changes(100);
        copies.changed(100);
        assert!(!copies.grant(7, 100, before));
        assert!(copies.grant(7, 100, copies.changes(100)));
        assert_eq!(copies.wanted(8, 100), vec![7]);
        assert_eq!(copies.wanted(7, 100), Vec::<u64>::new(), "never its own");
        assert_eq!(copies.unasked(8, 100), vec![7]);
        assert_eq!(copies.unasked(9, 100), Vec::<u64>::new(), "asked once");
        assert!(copies.give_back(7, 100));
        assert_eq!(copies.count(), 0);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Grant(u64, Handle),
        GiveBack(u64, Handle),
        End(u64),
        Change(Handle),
    }

    fn step() -> impl Strategy<Value = Step> {
        let session = 1..4u64;
        let handle = 10..16u64;
        prop_oneof![
            (session.clone(), handle.clone()).prop_map(|(s, h)| Step::Grant(s, h)),
            (session.clone(), handle.clone()).prop_map(|(s, h)| Step::GiveBack(s, h)),
            session.prop_map(Step::End),
            handle.prop_map(Step::Change),
        ]
    }

    proptest! {
        /// The table against a set of (file, session) pairs: the same copies wanted for every
        /// asker and file, the same counts; a grant whose read saw the last change succeeds.
        #[test]
        fn the_table_answers_as_a_set_of_pairs(steps in prop::collection::vec(step(), 1..100)) {
            let mut copies = Copies::default();
            let mut model: HashSet<(Handle, u64)> = HashSet::new();
            for step in steps {
                match step {
                    Step::Grant(s, h) => {
                        prop_assert!(copies.grant(s, h, copies.changes(h)));
                        model.insert((h, s));
                    }
                    Step::GiveBack(s, h) => {
                        prop_assert_eq!(copies.give_back(s, h), model.remove(&(h, s)));
                    }
                    Step::End(s) => {
                        let had = model.iter().filter(|m| m.1 == s).count();
                        prop_assert_eq!(copies.end_session(s), had);
                        model.retain(|m| m.1 != s);
                    }
                    Step::Change(h) => {
                        let before = copies.changes(h);
                        copies.changed(h);
                        prop_assert!(!copies.grant(9, h, before));
                    }
                }
                prop_assert_eq!(copies.count(), model.len());
                for h in 10..16u64 {
                    for asker in 0..4u64 {
                        let mut got = copies.wanted(asker, h);
                        got.sort();
                        let mut want: Vec<u64> = model
                            .iter()
                            .filter(|m| m.0 == h && m.1 != asker)
                            .map(|m| m.1)
                            .collect();
                        want.sort();
                        prop_assert_eq!(got, want);
                    }
                }
                for s in 1..4u64 {
                    prop_assert_eq!(copies.of(s), model.iter().filter(|m| m.1 == s).count());
                }
            }
        }
    }
}
