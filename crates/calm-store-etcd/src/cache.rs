//! Reads served from memory, exactly: a cache of the pairs this store read, kept by an etcd
//! watch of the data range and the commit key (`docs/design/etcd.md`, "Reads").
//!
//! Every calm commit rewrites the commit key, so the data as of a revision `R` is the data as
//! of the commit key's modification revision `S` at `R`. The watch removes every pair a
//! commit changes and then records that it has applied every commit up to that commit's
//! revision (`applied`). A snapshot at `R` (whose commit key was modified at `S`) may use the
//! cache once `applied >= S`: each cached pair was read at a revision `r <= R` and no commit
//! after `r` up to `applied` changed it, so it is the pair at `R`.
//!
//! A pair read at revision `r` is cached only if the watch has applied nothing past `r` yet
//! (`applied <= r`): a change after `r` is then still to come, and will remove it. Anything
//! the watch cannot vouch for (it broke, and resumed past a compaction) empties the cache.
//!
//! Revision reads are shared: a snapshot needs the commit key read *after* it started (so that
//! it sees every commit acknowledged before), and one read serves every snapshot that started
//! before it was sent.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Most pairs cached; past it the cache starts over.
pub const CACHE_PAIRS_MAX: usize = 1 << 20;
/// Longest a snapshot waits for the watch to reach its commit before reading from etcd.
pub const CATCH_UP_MS_MAX: u64 = 20;

#[derive(Debug, Default)]
struct Pairs {
    /// Key (with the data prefix) → value (`None`: absent) and the revision it was read at.
    pairs: HashMap<Vec<u8>, (Option<Vec<u8>>, i64)>,
    /// Every commit up to this revision has been applied (its changes removed).
    applied: i64,
    /// False until the watch runs (and after it lost track): nothing is served or kept.
    following: bool,
}

/// The cache of one store.
#[derive(Debug, Default)]
pub struct ReadCache {
    state: Mutex<Pairs>,
    /// Woken when `applied` moves.
    moved: Condvar,
    pub hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
}

impl ReadCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pairs> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The watch starts at `applied + 1`, with an empty cache.
    pub fn start(&self, applied: i64) {
        let mut state = self.lock();
        state.pairs.clear();
        state.applied = applied;
        state.following = true;
        self.moved.notify_all();
    }

    /// Whether the watch is following the commits.
    pub fn following(&self) -> bool {
        self.lock().following
    }

    /// The watch lost track (it could not resume where it was): forget everything.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.pairs.clear();
        state.following = false;
    }

    /// The revision of the last commit the watch applied, while it follows.
    pub fn applied_revision(&self) -> Option<i64> {
        let state = self.lock();
        (state.following && state.applied > 0).then_some(state.applied)
    }

    /// One commit's changed keys, then its revision.
    pub fn applied(&self, changed: impl IntoIterator<Item = Vec<u8>>, revision: i64) {
        let mut state = self.lock();
        for key in changed {
            state.pairs.remove(&key);
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
        if state.pairs.len() >= CACHE_PAIRS_MAX {
            state.pairs.clear();
        }
        state.pairs.insert(key, (value, revision));
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
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
                state = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
        // A commit changes it: gone.
        cache.applied([key.clone()], 12);
        assert!(cache.get(&key, 12).is_none());
        // A read at 11 comes back after the watch applied 12: not kept (it may be stale).
        cache.put(key.clone(), Some(b"old".to_vec()), 11);
        assert!(cache.get(&key, 12).is_none());
        // Absent pairs are cached too.
        cache.put(b"gone".to_vec(), None, 12);
        assert_eq!(cache.get(b"gone", 12), Some(None));
        // A snapshot of a commit the watch has not applied waits, then reads from etcd.
        assert!(!cache.ready_for(13));
        cache.stop();
        assert!(cache.get(b"gone", 12).is_none());
        assert!(!cache.ready_for(12));
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
}
