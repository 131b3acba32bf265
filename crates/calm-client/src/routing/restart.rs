//! A lone server's restart, as its clients go through it (`docs/design/locks.md`, "A
//! server's restart"): the session it no longer knows replaced by a new one in which every lock
//! of the copy is taken again and reported done; what the server refuses to give back is lost,
//! kept for the mount to tell its holders; and the session confirmed before a commit to a
//! locked file when its lease was not lately.

use super::*;

impl LockRouter {
    /// The locks lost since the last call, `(file, owner)`.
    pub fn take_lost(&self) -> Vec<(u64, calm_locks::Owner)> {
        std::mem::take(&mut *self.lost.locked())
    }

    /// Whether a lock on `resource` was lost and not taken yet ([`LockRouter::take_lost`]).
    pub fn lost_untaken(&self, resource: u64) -> bool {
        self.lost.locked().iter().any(|(r, _)| *r == resource)
    }

    /// Completes when locks were lost since the last call of it.
    pub async fn lost_changed(&self) {
        self.lost_changed.notified().await
    }

    /// Whether this client holds a lock on `resource`.
    pub fn holds(&self, resource: u64) -> bool {
        self.state().shadow.holds(resource)
    }

    /// Whether the home server confirmed the home session within half its lease: the locks
    /// it holds there are certainly still its.
    pub fn fresh(&self) -> bool {
        self.confirmed.locked().elapsed() < Duration::from_millis(self.lease_ms / 2)
    }

    /// Renews the home session now (replacing it, and reclaiming, if the server no longer
    /// knows it).
    pub async fn confirm(&self) {
        let session = self.home_session();
        match self.home.keep_alive(session).await {
            Ok(_) => *self.confirmed.locked() = Instant::now(),
            Err(failure) if session_lost(failure.code) => self.replace_home(session).await,
            Err(failure) => tracing::debug!(%failure, "renewing the lock session"),
        }
    }

    /// Replaces the home session `old`, which its server no longer knows (it restarted, or the
    /// lease ran out), by a new one, unless another call did already. Alone on its store, the
    /// new session takes again every lock the client held, then reports it done; what the
    /// server refuses to give back is lost ([`LockRouter::take_lost`]).
    pub(super) async fn replace_home(&self, old: SessionId) {
        let _refreshing = self.refreshing.lock().await;
        if self.home_session() != old {
            return;
        }
        let new = match self.home.open_lock_session(self.lease_ms).await {
            Ok(new) => new,
            Err(failure) => {
                tracing::warn!(%failure, "opening a lock session");
                return;
            }
        };
        {
            let mut state = self.state();
            let home = state.home_id;
            if let Some(link) = state.links.get_mut(&home) {
                link.session = new;
            }
        }
        *self.confirmed.locked() = Instant::now();
        if !self.state().has_peers {
            self.reclaim_in(old, new).await;
        }
        self.replaced.notify_one();
    }

    /// Takes again in `new` every lock the client held in `old` (its server restarted), and
    /// reports it done.
    async fn reclaim_in(&self, old: SessionId, new: SessionId) {
        let mut pending: Vec<Request> = {
            let state = self.state();
            let resources: Vec<u64> = state.shadow.resources().collect();
            resources
                .into_iter()
                .flat_map(|r| state.shadow.requests(r))
                .collect()
        };
        let held = pending.len();
        let mut lost = Vec::new();
        let mut retry = Retry::new();
        while !pending.is_empty() {
            let mut again = Vec::new();
            for chunk in pending.chunks(calm_proto::locks::LOCK_BATCH_OPS_MAX) {
                let calls: Vec<LockCall> = chunk.iter().map(|r| LockCall::Reclaim(*r)).collect();
                match self.home.lock_batch(new, &calls).await {
                    Ok(answers) => {
                        for (request, answer) in chunk.iter().zip(answers) {
                            match answer.code {
                                LockCode::Ok => {}
                                LockCode::Grace | LockCode::Unavailable => again.push(*request),
                                _ => lost.push(*request),
                            }
                        }
                    }
                    Err(_) => again.extend_from_slice(chunk),
                }
            }
            pending = again;
            if !pending.is_empty() && !retry.pause().await {
                lost.append(&mut pending);
            }
        }
        if let Err(failure) = self.home.reclaim_done(vec![old], Vec::new()).await {
            tracing::debug!(%failure, "reporting the reclaim done");
        }
        if lost.is_empty() {
            if held > 0 {
                tracing::info!(
                    locks = held,
                    "took every lock again after the server restarted"
                );
            }
            return;
        }
        tracing::warn!(
            locks = held,
            lost = lost.len(),
            "locks held before the server restarted could not be taken again: their holders \
             are told"
        );
        let mut state = self.state();
        for request in &lost {
            state.shadow.unlock(request);
        }
        drop(state);
        let mut reported = self.lost.locked();
        reported.extend(lost.iter().map(|r| (r.resource, r.owner)));
        let excess = reported.len().saturating_sub(LOST_MAX);
        reported.drain(..excess);
        drop(reported);
        self.lost_changed.notify_one();
    }
}
