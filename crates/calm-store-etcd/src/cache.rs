//! Reads served from memory, exactly: a cache of the pairs this store read, kept by an etcd
//! watch of the data range and the commit key (`docs/design/etcd.md`, "Reads").
//!
//! Every calm commit rewrites the commit key, so the data as of a revision `R` is the data as
//! of the commit key's modification revision `S` at `R`. The watch gives every pair the cache
//! holds that a commit changes its new value and the revision of the change, and then records
//! that it has applied every commit up to that commit's revision (`applied`). A snapshot at `R`
//! (whose commit key was modified at `S`) may use the cache once `applied >= S`: each cached
//! pair is as of a revision `r <= R` (read then, or changed then) and no commit after `r` up
//! to `applied` changed it (the watch would have replaced it), so it is the pair at `R`. A
//! pair as of `r > R` is newer than the snapshot: not served.
//!
//! A pair read at revision `r` is cached only if the watch has applied nothing past `r` yet
//! (`applied <= r`): a change after `r` is then still to come, and will replace it. Anything
//! the watch cannot vouch for (it broke, and resumed past a compaction) empties the cache.
//! The model test below checks every answer against the history of every key.
//!
//! Revision reads are shared: a snapshot needs the commit key read *after* it started (so that
//! it sees every commit acknowledged before), and one read serves every snapshot that started
//! before it was sent.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Most pairs cached; past it the cache starts over.
pub const CACHE_PAIRS_MAX: usize = 1 << 20;
/// Most bytes cached, counting each pair's key and value and [`PAIR_OVERHEAD_BYTES`]; past it
/// the cache starts over. (Bounded by count alone, a server's cache of 2^20 pairs took about
/// 180 MiB.)
pub const CACHE_BYTES_MAX: usize = 64 << 20;
/// What a cached pair costs beyond its key's and value's bytes: its slot in the table and
/// the allocator's share of its two buffers.
pub const PAIR_OVERHEAD_BYTES: usize = 96;
/// Longest a snapshot waits for the watch to reach its commit before reading from etcd.
pub const CATCH_UP_MS_MAX: u64 = 20;

/// What `key` with `value` costs the cache.
fn pair_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + PAIR_OVERHEAD_BYTES
}

#[derive(Debug, Default)]
pub(crate) struct Pairs {
    /// Key (with the data prefix) → value (`None`: absent) and the revision it was read at.
    pairs: HashMap<Vec<u8>, (Option<Vec<u8>>, i64)>,
    /// What the pairs cost, as [`CACHE_BYTES_MAX`] counts it.
    bytes: usize,
    /// Every commit up to this revision has been applied (its changes removed).
    applied: i64,
    /// False until the watch runs (and after it lost track): nothing is served or kept.
    following: bool,
}

/// A change the watch delivered: key, value after it (`None`: deleted), its revision.
pub type Change = (Vec<u8>, Option<Vec<u8>>, i64);

/// The cache of one store.
#[derive(Debug, Default)]
pub struct ReadCache {
    state: Mutex<Pairs>,
    /// Woken when `applied` moves.
    moved: Condvar,
    pub hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
}

impl Pairs {
    fn clear(&mut self) {
        self.pairs.clear();
        self.bytes = 0;
    }
}

impl ReadCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pairs> {
        self.state.locked()
    }

    /// The watch starts at `applied + 1`, with an empty cache.
    pub fn start(&self, applied: i64) {
        let mut state = self.lock();
        state.clear();
        state.applied = applied;
        state.following = true;
        self.moved.notify_all();
    }

    /// Pairs held and what they cost, as [`CACHE_BYTES_MAX`] counts it.
    pub fn held(&self) -> (usize, usize) {
        let state = self.lock();
        (state.pairs.len(), state.bytes)
    }

    /// Whether the watch is following the commits.
    pub fn following(&self) -> bool {
        self.lock().following
    }

    /// The watch lost track (it could not resume where it was): forget everything.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.clear();
        state.following = false;
    }

    /// The revision of the last commit the watch applied, while it follows.
    pub fn applied_revision(&self) -> Option<i64> {
        let state = self.lock();
        (state.following && state.applied > 0).then_some(state.applied)
    }

    /// The changes of the commits up to `revision`, in order: each key, its value after the
    /// change (`None`: deleted) and the change's revision. A pair the cache holds takes its
    /// new value (the next read of it, the common case after a write, is then a hit), or goes
    /// when it was deleted (so that the cache follows the live keys, not every key ever
    /// removed); others are not added (what was never read here is not kept).
    pub fn applied(&self, changed: impl IntoIterator<Item = Change>, revision: i64) {
        let mut state = self.lock();
        for (key, value, at) in changed {
            let Some(pair) = state.pairs.get_mut(&key) else {
                continue;
            };
            let before = pair_bytes(&key, &pair.0);
            match value {
                Some(value) => {
                    let after = key.len() + value.len() + PAIR_OVERHEAD_BYTES;
                    *pair = (Some(value), at);
                    state.bytes = state.bytes - before + after;
                }
                None => {
                    state.pairs.remove(&key);
                    state.bytes -= before;
                }
            }
        }
        if revision > state.applied {
            state.applied = revision;
            self.moved.notify_all();
        }
    }

    /// Whether a snapshot of a commit key modified at `seq_modified` may read from the cache,
    /// waiting briefly for the watch to get there.
    pub fn ready_for(&self, seq_modified: i64) -> bool {
        let state = self.lock();
        if !state.following {
            return false;
        }
        let (state, _) = self
            .moved
            .wait_timeout_while(state, Duration::from_millis(CATCH_UP_MS_MAX), |s| {
                s.following && s.applied < seq_modified
            })
            .unwrap_or_else(|p| p.into_inner());
        state.following && state.applied >= seq_modified
    }

    /// The revision of the last commit the watch applied once it is at or past
    /// `seq_modified`, waiting at most `within` for it; `None` when it is not there by then
    /// (or the watch does not follow).
    pub fn reached(&self, seq_modified: i64, within: Duration) -> Option<i64> {
        let state = self.lock();
        if !state.following {
            return None;
        }
        let (state, _) = self
            .moved
            .wait_timeout_while(state, within, |s| s.following && s.applied < seq_modified)
            .unwrap_or_else(|p| p.into_inner());
        (state.following && state.applied > 0 && state.applied >= seq_modified)
            .then_some(state.applied)
    }

    /// The cached value of `key` for a snapshot at `revision` that is [`Self::ready_for`].
    pub fn get(&self, key: &[u8], revision: i64) -> Option<Option<Vec<u8>>> {
        let state = self.lock();
        let found = match state.pairs.get(key) {
            Some((value, read_at)) if *read_at <= revision => Some(value.clone()),
            _ => None,
        };
        let counter = match found {
            Some(_) => &self.hits,
            None => &self.misses,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        found
    }

    /// `value` was read for `key` at `revision`.
    pub fn put(&self, key: Vec<u8>, value: Option<Vec<u8>>, revision: i64) {
        let mut state = self.lock();
        if !state.following || state.applied > revision {
            return;
        }
        let bytes = pair_bytes(&key, &value);
        if state.pairs.len() >= CACHE_PAIRS_MAX || state.bytes + bytes > CACHE_BYTES_MAX {
            state.clear();
        }
        let key_bytes = key.len();
        if let Some((old, _)) = state.pairs.insert(key, (value, revision)) {
            state.bytes -= key_bytes + old.map_or(0, |v| v.len()) + PAIR_OVERHEAD_BYTES;
        }
        state.bytes += bytes;
    }
}

/// Shared reads of the commit key: a caller gets the answer of a read sent after it asked.
#[derive(Debug, Default)]
pub struct RevisionReads {
    state: Mutex<Flights>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct Flights {
    /// A read is on its way (sent at generation `sent`).
    in_flight: bool,
    /// Generations: the next read to send, and the last answered with its answer.
    next: u64,
    answered: u64,
    answer: Option<Result<(i64, i64), String>>,
}

impl RevisionReads {
    /// The commit key's revision and modification revision, read after this call began:
    /// `read` sends one read; concurrent callers share reads.
    pub fn get(&self, read: impl Fn() -> Result<(i64, i64), String>) -> Result<(i64, i64), String> {
        let mut state = self.state.locked();
        // Any read sent from now on will do: the one numbered `next`.
        let wanted = state.next;
        loop {
            if state.answered > wanted
                && let Some(answer) = &state.answer
            {
                return answer.clone();
            }
            if !state.in_flight {
                state.in_flight = true;
                let generation = state.next;
                state.next += 1;
                drop(state);
                let answer = read();
                state = self.state.locked();
                state.in_flight = false;
                state.answered = generation + 1;
                state.answer = Some(answer.clone());
                self.done.notify_all();
                if generation >= wanted {
                    return answer;
                }
                continue;
            }
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_served_only_while_no_change_can_have_passed_it() {
        let cache = ReadCache::default();
        let key = b"k".to_vec();
        // Not following yet: nothing kept.
        cache.put(key.clone(), Some(b"1".to_vec()), 10);
        assert!(!cache.ready_for(10));
        cache.start(10);
        assert!(cache.ready_for(10));
        assert!(cache.get(&key, 10).is_none());
        cache.put(key.clone(), Some(b"1".to_vec()), 10);
        assert_eq!(cache.get(&key, 10), Some(Some(b"1".to_vec())));
        // A snapshot older than the read does not use it.
        assert!(cache.get(&key, 9).is_none());
        // A commit changes it: the new value, for snapshots from the change on.
        cache.applied([(key.clone(), Some(b"2".to_vec()), 12)], 12);
        assert_eq!(cache.get(&key, 12), Some(Some(b"2".to_vec())));
        assert!(cache.get(&key, 11).is_none());
        // A read at 11 comes back after the watch applied 12: not kept (it may be stale).
        cache.put(key.clone(), Some(b"old".to_vec()), 11);
        assert_eq!(cache.get(&key, 12), Some(Some(b"2".to_vec())));
        // A key never read here is not added by a change of it.
        cache.applied([(b"new".to_vec(), Some(b"n".to_vec()), 13)], 13);
        assert!(cache.get(b"new", 13).is_none());
        // Deleted: let go (the next read of it goes to etcd).
        cache.applied([(key.clone(), None, 14)], 14);
        assert_eq!(cache.get(&key, 14), None);
        assert_eq!(cache.held().0, 0);
        // Absent pairs are cached too.
        cache.put(b"gone".to_vec(), None, 14);
        assert_eq!(cache.get(b"gone", 14), Some(None));
        // A snapshot of a commit the watch has not applied waits, then reads from etcd.
        assert!(!cache.ready_for(15));
        cache.stop();
        assert!(cache.get(b"gone", 14).is_none());
        assert!(!cache.ready_for(12));
    }

    #[test]
    fn the_cache_keeps_within_its_bytes_and_lets_deleted_pairs_go() {
        let cache = ReadCache::default();
        cache.start(1);
        let value = vec![7u8; 4096];
        let per_pair = 8 + value.len() + PAIR_OVERHEAD_BYTES;
        let fit = CACHE_BYTES_MAX / per_pair;
        for i in 0..fit as u64 {
            cache.put(i.to_be_bytes().to_vec(), Some(value.clone()), 1);
        }
        assert_eq!(cache.held(), (fit, fit * per_pair));
        // One more is past the bound: the cache starts over with it.
        cache.put(u64::MAX.to_be_bytes().to_vec(), Some(value.clone()), 1);
        assert_eq!(cache.held(), (1, per_pair));
        // Replaced by a read of the same key: counted once.
        cache.put(u64::MAX.to_be_bytes().to_vec(), Some(vec![1]), 1);
        assert_eq!(cache.held(), (1, 8 + 1 + PAIR_OVERHEAD_BYTES));
        // Changed by a commit, then deleted by another: gone, and nothing counted.
        cache.applied(
            [(u64::MAX.to_be_bytes().to_vec(), Some(value.clone()), 2)],
            2,
        );
        assert_eq!(cache.held(), (1, per_pair));
        assert_eq!(cache.get(&u64::MAX.to_be_bytes(), 2), Some(Some(value)));
        cache.applied([(u64::MAX.to_be_bytes().to_vec(), None, 3)], 3);
        assert_eq!(cache.held(), (0, 0));
        assert_eq!(
            cache.get(&u64::MAX.to_be_bytes(), 3),
            None,
            "a miss: read from etcd"
        );
    }

    #[test]
    fn concurrent_revision_reads_share_a_read_sent_after_they_asked() {
        let reads = std::sync::Arc::new(RevisionReads::default());
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let reads = reads.clone();
                let sent = sent.clone();
                std::thread::spawn(move || {
                    let asked = sent.load(std::sync::atomic::Ordering::SeqCst);
                    let (revision, _) = reads
                        .get(|| {
                            let n = sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            std::thread::sleep(Duration::from_millis(2));
                            Ok((n, n))
                        })
                        .unwrap();
                    // The answer comes from a read sent after this caller asked.
                    assert!(revision > asked, "{revision} <= {asked}");
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst) <= 16);
    }

    /// Commits at increasing revisions, delivered by the watch late and in order, reads of
    /// etcd at any revision put in the cache, snapshots at any revision: whatever the cache
    /// serves is the key's value at the snapshot's revision.
    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Step {
            /// A commit changing these keys (value `None`: deleted), `gap` revisions after the
            /// last one (other writes of the cluster take revisions too).
            Commit {
                changes: Vec<(u8, Option<u8>)>,
                gap: i64,
            },
            /// The watch delivers this many of the commits not yet delivered.
            Deliver(usize),
            /// A read of etcd at the revision this far back from the last, then kept.
            Read { key: u8, back: i64 },
            /// A snapshot at the revision this far back reads the key from the cache.
            Get { key: u8, back: i64 },
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                (
                    prop::collection::vec((0u8..4, prop::option::of(0u8..8)), 1..3),
                    1i64..3
                )
                    .prop_map(|(changes, gap)| Step::Commit { changes, gap }),
                (1usize..3).prop_map(Step::Deliver),
                (0u8..4, 0i64..6).prop_map(|(key, back)| Step::Read { key, back }),
                (0u8..4, 0i64..6).prop_map(|(key, back)| Step::Get { key, back }),
            ]
        }

        /// One key's change: the key, its value after (`None`: deleted).
        type KeyChange = (u8, Option<u8>);

        /// Every commit: its revision and changes.
        struct History(Vec<(i64, Vec<KeyChange>)>);

        impl History {
            fn value_at(&self, key: u8, revision: i64) -> Option<Vec<u8>> {
                let mut value = None;
                for (at, changes) in &self.0 {
                    if *at > revision {
                        break;
                    }
                    for (k, v) in changes {
                        if *k == key {
                            value = v.map(|v| vec![v]);
                        }
                    }
                }
                value
            }

            /// The revision of the last commit at or before `revision` (0: none).
            fn commit_at(&self, revision: i64) -> i64 {
                self.0
                    .iter()
                    .rev()
                    .map(|(at, _)| *at)
                    .find(|at| *at <= revision)
                    .unwrap_or(0)
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn the_cache_serves_only_the_value_at_the_snapshot(
                steps in prop::collection::vec(step(), 1..60)
            ) {
                let cache = ReadCache::default();
                cache.start(0);
                let mut history = History(Vec::new());
                let mut last = 0i64;
                let mut delivered = 0usize;
                for step in steps {
                    match step {
                        Step::Commit { changes, gap } => {
                            last += gap;
                            history.0.push((last, changes));
                        }
                        Step::Deliver(n) => {
                            let upto = (delivered + n).min(history.0.len());
                            for (at, changes) in &history.0[delivered..upto] {
                                let changes = changes
                                    .iter()
                                    .map(|(k, v)| (vec![*k], v.map(|v| vec![v]), *at));
                                cache.applied(changes.collect::<Vec<_>>(), *at);
                            }
                            delivered = upto;
                        }
                        Step::Read { key, back } => {
                            let at = (last - back).max(0);
                            cache.put(vec![key], history.value_at(key, at), at);
                        }
                        Step::Get { key, back } => {
                            let at = (last - back).max(0);
                            let applied = cache.applied_revision().unwrap_or(0);
                            if applied < history.commit_at(at) {
                                continue; // not ready: the snapshot reads etcd
                            }
                            if let Some(value) = cache.get(&[key], at) {
                                prop_assert_eq!(value, history.value_at(key, at), "key {} at {}", key, at);
                            }
                        }
                    }
                }
            }
        }
    }
}
