//! A server that stops: what waits without end (a mount's watch of changes, a lock wait) is
//! ended at once, answered "unavailable", so that its client goes on at another server (or
//! waits for this one to come back) instead of holding the stop for its whole bound.

use std::sync::Arc;

/// Set once when the server begins to stop; every clone sees it.
#[derive(Debug, Clone)]
pub struct Stopping {
    flag: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Stopping {
    fn default() -> Self {
        Stopping {
            flag: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl Stopping {
    /// The server begins to stop.
    pub fn begin(&self) {
        self.flag.send_replace(true);
    }

    /// Whether the server is stopping.
    pub fn is_set(&self) -> bool {
        *self.flag.borrow()
    }

    /// Returns once the server is stopping (at once if it is).
    pub async fn wait(&self) {
        let mut seen = self.flag.subscribe();
        // The sender lives as long as `self`: the wait ends only when the flag is set.
        let _ = seen.wait_for(|stopping| *stopping).await;
    }
}

/// What a client is answered when the server it waits on stops: a status with no error code
/// of calm's, which clients take as a lost connection.
pub fn stopping_status() -> tonic::Status {
    tonic::Status::unavailable("the server is stopping")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_is_told_once_and_later_ones_at_once() {
        let stopping = Stopping::default();
        assert!(!stopping.is_set());
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let stopping = stopping.clone();
                tokio::spawn(async move { stopping.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        stopping.begin();
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("told")
                .unwrap();
        }
        assert!(stopping.is_set());
        tokio::time::timeout(std::time::Duration::from_secs(5), stopping.wait())
            .await
            .expect("a wait begun after the stop ends at once");
    }
}
