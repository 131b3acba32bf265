//! Keeping etcd's history short. etcd keeps every version of every key, deleted ones too, until
//! someone compacts it: a namespace under steady creates and unlinks grows etcd's database by
//! every mutation ever made (about a kilobyte per create and unlink) until the cluster's space
//! quota refuses every write, and a range read walks the deleted keys of its range too.
//!
//! Each store compacts the cluster to the newest revision it saw at least
//! [`EtcdOptions::history_kept`](crate::EtcdOptions) ago (default [`HISTORY_KEPT_DEFAULT`]):
//! what calm reads at an older revision is then gone, and nothing of calm needs it. A
//! transaction reads at its start revision for milliseconds (one compacted under it is run
//! again), the read cache and the registry follow watches that start over from the present
//! when compacted past, and a watch or snapshot a minute behind has long been given up on.
//! Several servers of one namespace each compact; etcd answers the later ones "compacted
//! already", which is not an error. Compaction frees space inside etcd's database for reuse;
//! giving it back to the file system is etcd's defragmentation (README).
//!
//! [`History`] is the pure part: which revision to compact to, from the revisions read over
//! time.

use std::collections::VecDeque;
use std::time::Duration;

/// How long history is kept by default: what a watch or snapshot of calm may still read.
/// A minute: under a steady churn of creates and unlinks on two servers, five minutes of
/// history made etcd's database 4.4 times larger (478 against 108 MiB) and the rate after the
/// first compactions 0.73–0.91 of the first minute's, against 1.09–1.28 with a minute
/// (`docs/benchmarks/2026-12-04/churn-trash/`); nothing of calm reads history older than
/// seconds.
pub const HISTORY_KEPT_DEFAULT: Duration = Duration::from_secs(60);

/// Most revisions remembered (one per period: [`period`] keeps it to about six).
const SEEN_MAX: usize = 64;

/// How often the current revision is read and history compacted: a fifth of what is kept (so
/// history stays within 1.2 times it), between 100 ms and a minute.
pub fn period(kept: Duration) -> Duration {
    (kept / 5).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// Revisions read over time, and how far history was compacted.
#[derive(Debug)]
pub struct History {
    kept: Duration,
    /// (when, revision), oldest first, revisions increasing.
    seen: VecDeque<(Duration, i64)>,
    compacted: i64,
}

impl History {
    pub fn new(kept: Duration) -> History {
        History {
            kept,
            seen: VecDeque::new(),
            compacted: 0,
        }
    }

    /// The cluster was at `revision` at `now` (time since any fixed start). Returns the
    /// revision to compact to, if history before a newer one than the last compaction's is
    /// older than what is kept.
    pub fn observe(&mut self, now: Duration, revision: i64) -> Option<i64> {
        if self.seen.back().is_none_or(|&(_, last)| revision > last) {
            if self.seen.len() == SEEN_MAX {
                self.seen.pop_front();
            }
            self.seen.push_back((now, revision));
        }
        let old_enough = |at: Duration| at + self.kept <= now;
        // The newest revision seen long enough ago: the ones before it are of no more use.
        while self.seen.len() > 1 && old_enough(self.seen[1].0) {
            self.seen.pop_front();
        }
        match self.seen.front() {
            Some(&(at, revision)) if old_enough(at) && revision > self.compacted => Some(revision),
            _ => None,
        }
    }

    /// History was compacted up to `revision` (by this store or another).
    pub fn compacted(&mut self, revision: i64) {
        self.compacted = self.compacted.max(revision);
    }

    /// The revision history was last compacted to (0: never).
    pub fn compacted_to(&self) -> i64 {
        self.compacted
    }
}

/// Which server compacts. Every compaction walks etcd's whole index of keys on every member
/// (about a fifth of the leader's CPU under a churn of creates and unlinks when each of three
/// servers compacted every period), so one server does it: the one that made the namespace's
/// last commit (it commits every mutation), or any server when no calm commit came within
/// the kept time (the revision moved without calm: leases, locks, an operator). The others
/// compact only to what was current twice the kept time ago, which the committer has
/// compacted past already (etcd answers that at once, with no walk), so that history stays
/// bounded if the committer ever stops compacting.
#[derive(Debug)]
pub struct Retention {
    near: History,
    far: History,
}

impl Retention {
    pub fn new(kept: Duration) -> Retention {
        Retention {
            near: History::new(kept),
            far: History::new(kept * 2),
        }
    }

    /// The cluster was at `revision` at `now`; the namespace's last commit was made at
    /// `last_commit` (0: none), this store's own last at `own_commit` (0: none). Returns the
    /// revision to compact to, if any.
    pub fn observe(
        &mut self,
        now: Duration,
        revision: i64,
        last_commit: i64,
        own_commit: i64,
    ) -> Option<i64> {
        let near = self.near.observe(now, revision);
        let far = self.far.observe(now, revision);
        let committer = last_commit > 0 && own_commit == last_commit;
        match near {
            Some(to) if committer || last_commit <= to => Some(to),
            _ => far,
        }
    }

    /// History was compacted up to `revision` (by this store or another).
    pub fn compacted(&mut self, revision: i64) {
        self.near.compacted(revision);
        self.far.compacted(revision);
    }

    /// The revision history was last compacted to (0: never).
    pub fn compacted_to(&self) -> i64 {
        self.near.compacted_to()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEPT: Duration = Duration::from_secs(300);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn compacts_to_what_was_current_the_kept_time_ago() {
        let mut history = History::new(KEPT);
        assert_eq!(history.observe(s(0), 100), None, "nothing is old enough");
        assert_eq!(history.observe(s(60), 200), None);
        assert_eq!(history.observe(s(299), 300), None);
        assert_eq!(history.observe(s(300), 400), Some(100));
        history.compacted(100);
        assert_eq!(
            history.observe(s(330), 450),
            None,
            "100 is done, 200 is not old"
        );
        assert_eq!(history.observe(s(360), 500), Some(200));
        history.compacted(200);
        // An idle cluster: the revision stays; nothing more to do.
        assert_eq!(history.observe(s(900), 500), Some(500));
        history.compacted(500);
        assert_eq!(history.observe(s(2000), 500), None);
        assert_eq!(history.compacted_to(), 500);
    }

    #[test]
    fn another_servers_compaction_counts() {
        let mut history = History::new(KEPT);
        history.observe(s(0), 100);
        history.compacted(150);
        assert_eq!(history.observe(s(400), 300), None, "150 is past 100");
    }

    #[test]
    fn the_period_is_a_fifth_of_the_history_within_bounds() {
        assert_eq!(period(KEPT), s(60));
        assert_eq!(period(s(3600)), s(60));
        assert_eq!(period(s(2)), Duration::from_millis(400));
        assert_eq!(period(Duration::ZERO), Duration::from_millis(100));
    }

    #[test]
    fn only_the_committer_compacts_while_commits_come() {
        let kept = s(100);
        let mut committer = Retention::new(kept);
        let mut other = Retention::new(kept);
        // Commits all along, all the committer's (its own last at the revision); looked at
        // every 10 s.
        for t in (0..400u64).step_by(10) {
            let revision = 10 * t as i64 + 10;
            let to = committer.observe(s(t), revision, revision, revision);
            if t >= 100 {
                assert_eq!(to, Some(revision - 1000), "at {t} s");
                committer.compacted(revision - 1000);
            }
            let theirs = other.observe(s(t), revision, revision, 5);
            if t < 200 {
                assert_eq!(theirs, None, "at {t} s: nothing twice the kept time old");
            } else {
                // Twice the kept time behind: what the committer compacted past long ago.
                assert_eq!(theirs, Some(revision - 2000), "at {t} s");
                assert!(theirs.unwrap() < committer.compacted_to());
                other.compacted(theirs.unwrap());
            }
        }
    }

    #[test]
    fn any_server_compacts_when_no_commit_came_within_the_kept_time() {
        let kept = s(100);
        let mut other = Retention::new(kept);
        // The last calm commit at revision 50; the revision moves on without calm.
        for t in (0..100u64).step_by(10) {
            assert_eq!(other.observe(s(t), 50 + t as i64, 50, 7), None);
        }
        assert_eq!(other.observe(s(100), 150, 50, 7), Some(50));
        other.compacted(50);
        // A commit of another server after what would be compacted: back to the far one.
        assert_eq!(other.observe(s(130), 180, 170, 7), None);
    }

    proptest! {
        /// Against the obvious model: every revision ever read, with its time. The revision
        /// to compact to is never newer than the newest read at least the kept time ago
        /// (nothing still in use is compacted) and always newer than what was compacted; while
        /// no more revisions were read than are remembered, it is that newest one, whenever
        /// it is newer than what was compacted.
        #[test]
        fn never_compacts_what_is_still_kept(
            steps in proptest::collection::vec((0u64..120, 0i64..50, any::<bool>()), 1..200)
        ) {
            let kept = s(100);
            let mut history = History::new(kept);
            let (mut now, mut revision) = (Duration::ZERO, 1i64);
            let mut all: Vec<(Duration, i64)> = Vec::new();
            let mut compacted = 0;
            for (advance, more, done) in steps {
                now += s(advance);
                revision += more;
                all.push((now, revision));
                let got = history.observe(now, revision);
                let newest_old = all
                    .iter()
                    .filter(|(at, _)| *at + kept <= now)
                    .map(|&(_, r)| r)
                    .max();
                let exact = all.len() <= SEEN_MAX;
                if let Some(to) = got {
                    prop_assert!(to > compacted);
                    prop_assert!(newest_old.is_some_and(|r| to <= r));
                    if exact {
                        prop_assert_eq!(Some(to), newest_old);
                    }
                    if done {
                        history.compacted(to);
                        compacted = to;
                    }
                } else if exact {
                    prop_assert!(newest_old.is_none_or(|r| r <= compacted));
                }
            }
        }
    }
}
