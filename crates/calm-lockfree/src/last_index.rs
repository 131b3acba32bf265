//! The index of the last changelog record committed, and the followers waiting for an index:
//! the committer publishes each commit's last index without a lock, and a lock is taken only
//! when a follower waits for an index the commit reached. Its races (a follower registering as
//! the commit it waits for lands, a follower leaving as it is woken) are checked under loom
//! (`models`).

use std::collections::BTreeMap;

use tokio::sync::oneshot;

use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, fence};

/// A follower refused: [`FOLLOWERS_WAITING_MAX`] wait already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{FOLLOWERS_WAITING_MAX} changelog followers are waiting already"
        )
    }
}

impl std::error::Error for Busy {}

/// The index of the last changelog record committed, as the committer (and, on a shared
/// store, the follower of other servers' commits) publishes it: readable at once, and the
/// followers waiting for an index, each woken once it is reached (not on every commit: a
/// follower that waits for a batch of records sleeps through the commits before it).
#[derive(Debug)]
pub struct LastIndex {
    last: AtomicU64,
    /// The lowest index a follower waits for (`u64::MAX`: none waits); a commit below it
    /// takes no lock. Kept equal to the first key of `waiting` under its lock.
    due: AtomicU64,
    waiting: Mutex<Waiting>,
}

/// A follower's place among the waiting: it leaves when this goes (if not woken before).
struct Registered<'a> {
    last: &'a LastIndex,
    key: (u64, u64),
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut waiting = self.last.lock();
        if waiting.by_index.remove(&self.key).is_some() {
            self.last.due.store(waiting.due(), Ordering::SeqCst);
        }
    }
}

/// Most followers waiting at once (follow reads in flight, and the watch feed); one more is
/// refused as busy. Each costs a map entry and a oneshot channel, about 150 bytes.
pub const FOLLOWERS_WAITING_MAX: usize = 65_536;

/// Followers waiting, by the index each waits for (and an id, for leaving on a timeout); at
/// most [`FOLLOWERS_WAITING_MAX`].
#[derive(Debug, Default)]
struct Waiting {
    next_id: u64,
    by_index: BTreeMap<(u64, u64), oneshot::Sender<()>>,
}

impl Waiting {
    fn due(&self) -> u64 {
        self.by_index
            .first_key_value()
            .map_or(u64::MAX, |(&(index, _), _)| index)
    }
}

impl LastIndex {
    pub fn new(last: u64) -> LastIndex {
        LastIndex {
            last: AtomicU64::new(last),
            due: AtomicU64::new(u64::MAX),
            waiting: Mutex::new(Waiting::default()),
        }
    }

    /// The last index published (monotonic).
    pub fn get(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Raises the index to `reached` (never lowers it) without waking anyone.
    pub fn publish(&self, reached: u64) {
        self.last.fetch_max(reached, Ordering::SeqCst);
    }

    /// Wakes the followers whose index the last index has reached.
    pub fn wake_followers(&self) {
        // The commit stored `last`, a follower stores `due` (`enter`); each then reads the
        // other's, past a fence: one of the two sees the other's store, so a follower that
        // registers as its commit lands is woken by one of them.
        fence(Ordering::SeqCst);
        let reached = self.get();
        if reached < self.due.load(Ordering::SeqCst) {
            return;
        }
        let woken = {
            let mut waiting = self.lock();
            let later = waiting.by_index.split_off(&(reached.saturating_add(1), 0));
            let woken = std::mem::replace(&mut waiting.by_index, later);
            self.due.store(waiting.due(), Ordering::SeqCst);
            woken
        };
        for (_, follower) in woken {
            // A follower that timed out meanwhile is gone: nothing to tell.
            let _ = follower.send(());
        }
    }

    /// Waits until the last index is at least `index`, or `timeout` passes; returns the last
    /// index then. Refused as busy when [`FOLLOWERS_WAITING_MAX`] followers already wait.
    pub async fn wait_until(&self, index: u64, timeout: std::time::Duration) -> Result<u64, Busy> {
        if self.get() >= index || timeout.is_zero() {
            return Ok(self.get());
        }
        let (_registered, wake) = self.enter(index)?;
        let _ = tokio::time::timeout(timeout, wake).await;
        Ok(self.get())
    }

    /// Registers a follower for `index`, and wakes it at once if a commit reached the index
    /// before it was registered (that commit did not look for it). The follower stays
    /// registered until it is woken or the returned guard goes (a timeout, or a follow read
    /// dropped with its request).
    fn enter(&self, index: u64) -> Result<(Registered<'_>, oneshot::Receiver<()>), Busy> {
        let (woken, wake) = oneshot::channel();
        let key = {
            let mut waiting = self.lock();
            if waiting.by_index.len() >= FOLLOWERS_WAITING_MAX {
                return Err(Busy);
            }
            let key = (index, waiting.next_id);
            waiting.next_id += 1;
            waiting.by_index.insert(key, woken);
            self.due.fetch_min(index, Ordering::SeqCst);
            key
        };
        // See `wake_followers`.
        fence(Ordering::SeqCst);
        if self.get() >= index {
            self.wake_followers();
        }
        Ok((Registered { last: self, key }, wake))
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Followers waiting now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().by_index.len()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{FOLLOWERS_WAITING_MAX, LastIndex};

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_follower_sleeps_through_commits_below_its_index() {
        let last = Arc::new(LastIndex::new(2));
        assert_eq!(
            last.wait_until(2, LONG).await.unwrap(),
            2,
            "reached already"
        );
        let waiting = tokio::spawn({
            let last = last.clone();
            async move { last.wait_until(5, LONG).await.unwrap() }
        });
        while last.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        for reached in 3..5 {
            last.publish(reached);
            last.wake_followers();
        }
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "woken below its index");
        assert_eq!(last.waiting(), 1);
        last.publish(7);
        last.wake_followers();
        assert_eq!(waiting.await.unwrap(), 7);
        assert_eq!(last.waiting(), 0);
    }

    #[test]
    fn a_follower_registered_just_after_its_commit_is_woken() {
        let last = LastIndex::new(0);
        // The follower saw 0 and goes to register for 5; the commit of 5 lands first and, as
        // nobody waits yet, wakes nobody.
        last.publish(5);
        last.wake_followers();
        let (_, mut wake) = last.enter(5).unwrap();
        assert!(wake.try_recv().is_ok(), "a follower slept past its index");
        assert_eq!(last.waiting(), 0);
    }

    #[tokio::test]
    async fn a_follower_that_times_out_leaves_nothing_behind() {
        let last = LastIndex::new(0);
        assert_eq!(
            last.wait_until(10, Duration::from_millis(5)).await.unwrap(),
            0
        );
        assert_eq!(last.waiting(), 0);
        assert_eq!(last.due.load(std::sync::atomic::Ordering::SeqCst), u64::MAX);
        assert_eq!(last.wait_until(10, Duration::ZERO).await.unwrap(), 0);
        assert_eq!(last.waiting(), 0);
    }

    #[tokio::test]
    async fn a_follower_dropped_while_waiting_leaves_nothing_behind() {
        let last = Arc::new(LastIndex::new(0));
        let waiting = tokio::spawn({
            let last = last.clone();
            async move { last.wait_until(10, LONG).await }
        });
        while last.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // As a follow read whose request went away: its future is dropped, not timed out.
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        assert_eq!(last.waiting(), 0);
        assert_eq!(last.due.load(std::sync::atomic::Ordering::SeqCst), u64::MAX);
    }

    #[tokio::test]
    async fn one_follower_over_the_limit_is_refused_as_busy() {
        let last = LastIndex::new(0);
        let entered: Vec<_> = (0..FOLLOWERS_WAITING_MAX as u64)
            .map(|i| last.enter(i + 1).unwrap())
            .collect();
        let refused = last.wait_until(1, LONG).await.unwrap_err();
        assert_eq!(refused, super::Busy);
        assert_eq!(last.waiting(), FOLLOWERS_WAITING_MAX);
        // The waiting ones are still woken, and then there is room again.
        last.publish(u64::MAX - 1);
        last.wake_followers();
        for (_, mut wake) in entered {
            assert!(wake.try_recv().is_ok());
        }
        assert_eq!(last.waiting(), 0);
        assert_eq!(last.wait_until(1, LONG).await.unwrap(), u64::MAX - 1);
    }

    /// Followers that each wait for the index after the one they just saw, against a committer
    /// publishing one index at a time on another thread: the follower registers just as the
    /// committer passes its index, again and again. Every follower is woken (none sleeps its
    /// whole timeout), and none is left waiting.
    #[test]
    fn no_follower_misses_its_index() {
        const LAST: u64 = 100_000;
        const FOLLOWERS: usize = 4;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let last = Arc::new(LastIndex::new(0));
        let followers: Vec<_> = (0..FOLLOWERS)
            .map(|_| {
                let last = last.clone();
                runtime.spawn(async move {
                    let mut waits = 0u64;
                    while last.get() < LAST {
                        let index = last.get() + 1;
                        let woken = tokio::time::timeout(
                            Duration::from_secs(20),
                            last.wait_until(index, LONG),
                        )
                        .await
                        .expect("a follower missed its wake-up")
                        .unwrap();
                        assert!(woken >= index, "woken at {woken}, waiting for {index}");
                        waits += 1;
                    }
                    waits
                })
            })
            .collect();
        let committer = std::thread::spawn({
            let last = last.clone();
            move || {
                for reached in 1..=LAST {
                    last.publish(reached);
                    last.wake_followers();
                    // A commit's worth of other work, so that followers come and go between.
                    for _ in 0..200 {
                        std::hint::spin_loop();
                    }
                }
            }
        });
        for follower in followers {
            let waits = runtime.block_on(follower).unwrap();
            assert!(waits > 0);
        }
        committer.join().unwrap();
        assert_eq!(last.waiting(), 0);
    }
}

/// The races of followers and commits under every interleaving loom finds.
#[cfg(all(test, feature = "loom"))]
mod models {
    use super::LastIndex;
    use loom::sync::Arc;
    use loom::sync::atomic::Ordering;

    fn commit(last: &Arc<LastIndex>, reached: u64) -> loom::thread::JoinHandle<()> {
        let last = last.clone();
        loom::thread::spawn(move || {
            last.publish(reached);
            last.wake_followers();
        })
    }

    /// A follower that registers for an index as the commit of that index lands (after the
    /// follower saw the index below it): woken either by the commit or by its own check.
    #[test]
    fn a_follower_registering_as_its_commit_lands_is_woken() {
        loom::model(|| {
            let last = Arc::new(LastIndex::new(4));
            let committer = commit(&last, 5);
            let (registered, mut wake) = last.enter(5).unwrap();
            committer.join().unwrap();
            assert!(wake.try_recv().is_ok(), "a follower slept past its index");
            drop(registered);
            assert_eq!(last.waiting(), 0);
            assert_eq!(last.due.load(Ordering::SeqCst), u64::MAX);
        });
    }

    /// Two followers, one of them for an index the commit reaches: that one is woken, the
    /// other stays and is the next one due; then it leaves (a timeout) as a later commit
    /// lands, and nothing is left behind either way.
    #[test]
    fn a_commit_wakes_the_followers_it_reached_and_a_leaving_one_leaves_nothing() {
        loom::model(|| {
            let last = Arc::new(LastIndex::new(0));
            let later = {
                let last = last.clone();
                loom::thread::spawn(move || {
                    let (registered, wake) = last.enter(6).unwrap();
                    (registered.key, wake)
                })
            };
            let (_near, mut near_wake) = last.enter(3).unwrap();
            let committer = commit(&last, 3);
            let (later_key, mut later_wake) = later.join().unwrap();
            committer.join().unwrap();
            assert!(near_wake.try_recv().is_ok());
            // The later follower's guard went at the end of its thread: it left.
            assert!(later_wake.try_recv().is_err());
            assert_eq!(later_key.0, 6);
            assert_eq!(last.waiting(), 0);
            assert_eq!(last.due.load(Ordering::SeqCst), u64::MAX);
        });
    }

    /// A follower that stays registered for an index not reached keeps it due.
    #[test]
    fn a_follower_not_reached_stays_due() {
        loom::model(|| {
            let last = Arc::new(LastIndex::new(0));
            let (_staying, mut wake) = last.enter(9).unwrap();
            let first = commit(&last, 2);
            let second = commit(&last, 8);
            first.join().unwrap();
            second.join().unwrap();
            assert!(wake.try_recv().is_err());
            assert_eq!(last.waiting(), 1);
            assert_eq!(last.due.load(Ordering::SeqCst), 9);
            assert_eq!(last.get(), 8);
        });
    }
}
