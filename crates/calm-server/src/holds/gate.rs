//! The gate every request that asks holds back passes through, so that a hold of a directory
//! that already has names can wait until every request that looked before the hold was marked
//! has been applied: the names the holder is given are then the directory's last.
//!
//! A request takes a [`Pass`] before it looks at the holds and keeps it until its change is
//! applied (or refused). [`Gate::turn`] (after a hold is marked) moves the gate on and waits
//! until every pass taken before has been dropped; a pass taken after sees the hold, and asks
//! for it back before it changes anything the hold covers. Taking a pass never waits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Passes are counted on two sides: the side of the gate's epoch when they were taken.
#[derive(Debug, Default)]
pub struct Gate {
    epoch: AtomicU64,
    inside: [AtomicUsize; 2],
    /// Woken when the last pass of a side is dropped.
    left: Notify,
    /// One turn at a time (a turn waits for the side before it only).
    turning: tokio::sync::Mutex<()>,
}

/// A request's way through the gate, held until its change is applied.
#[must_use = "a pass counts only while it is held"]
#[derive(Debug)]
pub struct Pass<'a> {
    gate: &'a Gate,
    side: usize,
}

impl Gate {
    /// A pass: counted on the side of the epoch it was taken in.
    pub fn enter(&self) -> Pass<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::SeqCst);
            let side = (epoch & 1) as usize;
            self.inside[side].fetch_add(1, Ordering::SeqCst);
            // Still that epoch: any turn that moved past it will wait for this pass.
            if self.epoch.load(Ordering::SeqCst) == epoch {
                return Pass { gate: self, side };
            }
            self.leave(side);
        }
    }

    fn leave(&self, side: usize) {
        if self.inside[side].fetch_sub(1, Ordering::SeqCst) == 1 {
            self.left.notify_waiters();
        }
    }

    /// Moves the gate on and waits until every pass taken before has been dropped.
    pub async fn turn(&self) {
        let _turning = self.turning.lock().await;
        let side = (self.epoch.fetch_add(1, Ordering::SeqCst) & 1) as usize;
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.inside[side].load(Ordering::SeqCst) == 0 {
                return;
            }
            left.await;
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.leave(self.side);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_turn_waits_for_the_passes_taken_before_it_and_not_for_later_ones() {
        let gate = Arc::new(Gate::default());
        let before = gate.enter();
        let turned = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.turn().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A pass taken while the turn waits is on the other side: the turn does not wait
        // for it.
        let after = gate.enter();
        assert!(!turned.is_finished(), "a pass taken before is still held");
        drop(before);
        tokio::time::timeout(Duration::from_secs(5), turned)
            .await
            .expect("the turn ends once the pass before it is dropped")
            .unwrap();
        // The next turn waits for that later pass.
        let next = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.turn().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!next.is_finished());
        drop(after);
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the second turn ends with the pass it waits for")
            .unwrap();
        // Nothing inside: a turn ends at once.
        tokio::time::timeout(Duration::from_secs(5), gate.turn())
            .await
            .unwrap();
    }

    #[test]
    fn passes_from_many_threads_are_all_counted_out() {
        let gate = Arc::new(Gate::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        drop(gate.enter());
                    }
                })
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        for _ in 0..100 {
            runtime.block_on(gate.turn());
        }
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(gate.inside[0].load(Ordering::SeqCst), 0);
        assert_eq!(gate.inside[1].load(Ordering::SeqCst), 0);
    }
}
