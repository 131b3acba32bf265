//! One server's lock state: [`calm_locks::LockManager`] behind one mutex, the RPCs its
//! waiting requests complete, the lease task, and the clock leases are counted on.
//!
//! - One mutex over the manager: an operation is a few hundred nanoseconds of memory work,
//!   and a batch of operations takes the mutex once. Nothing awaits while holding it.
//! - Leases: one task ticks (every [`crate::lease_clock::TICK_MS`], or sooner when a deadline is
//!   due) and expires what is due; a new session wakes it. Leases are counted on the time the
//!   server ran (`crate::lease_clock`), so a server that was stopped expires nobody for it.
//! - Several servers on one store (`crate::peers`): under the same mutex, every set, test,
//!   unlock and release of a file first asks the peers state whether this server decides
//!   the file's locks now (`calm_locks::peers::Route`), counted on the time that passed (a
//!   registration in the registry runs out on the registry's clock, stopped or not).

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use calm_locks::peers::{Peers, Route};
use calm_locks::{Event, Limits, LockError, LockManager, SessionId, Stats, WaitId};
use calm_proto::locks::{LockCode, LockFailure};
use tokio::sync::{Notify, oneshot};
use tonic::Request;

use calm_locks::recovery::{Admission, Recovery};

use crate::lease_clock::RunningClock;
use crate::ledger::Ledger;

fn failure(code: LockCode, message: impl Into<String>) -> LockFailure {
    LockFailure::new(code, message)
}

pub(crate) type Reply = Result<(), LockError>;

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) manager: LockManager,
    /// Which files this server decides, with several servers on one store; `None` alone, or
    /// before it joined the registry (then it decides nothing: see [`LockTable::has_peers`]).
    pub(crate) peers: Option<Peers>,
    /// The RPC each waiting request completes.
    pub(crate) pending: HashMap<WaitId, oneshot::Sender<Reply>>,
    /// `(session, tag)` of every waiting request, and back.
    pub(crate) by_tag: HashMap<(SessionId, u64), WaitId>,
    pub(crate) tags: HashMap<WaitId, (SessionId, u64)>,
    /// Alone on its store: the grace after a restart, while the clients that held locks take
    /// them again (none after a start that found no session open).
    pub(crate) recovery: Recovery,
}

impl Inner {
    /// Completes the RPCs of the requests the manager granted or refused.
    pub(crate) fn deliver(&mut self) {
        for event in self.manager.take_events() {
            let (wait, reply) = match event {
                Event::Granted(wait) => (wait, Ok(())),
                Event::Refused(wait, error) => (wait, Err(error)),
            };
            self.forget(wait);
            if let Some(sender) = self.pending.remove(&wait) {
                // The receiver is gone only if its RPC is being dropped; the guard then finds
                // nothing pending and the lock stays with its owner, as after a signal that
                // arrives once the kernel has granted the lock.
                let _ = sender.send(reply);
            }
        }
    }

    pub(crate) fn forget(&mut self, wait: WaitId) {
        if let Some(tag) = self.tags.remove(&wait) {
            self.by_tag.remove(&tag);
        }
    }
}

/// The lock state of one server, shared by the lock service, the status RPC and the lease
/// task.
#[derive(Debug)]
pub struct LockTable {
    inner: Mutex<Inner>,
    started: Instant,
    /// The time the server ran, which leases are counted on.
    clock: Mutex<RunningClock>,
    /// Wakes the lease task when a session with a sooner deadline may exist.
    pub(crate) lease_changed: Notify,
    /// Several servers share the store: the registry where sessions are recorded, and where
    /// this server is a member (`crate::peers`).
    pub(crate) registry: Option<Arc<dyn calm_store::registry::Registry>>,
    /// `(id, address)` of the members of the applied view.
    pub(crate) members: Mutex<Vec<(u64, String)>>,
    /// This server's id: its store epoch.
    pub(crate) me: u64,
    /// The highest changelog index a client's lock request said its mutations reached: with
    /// several servers, a lock's previous holder may have committed through another server,
    /// whose commits this one may not have seen yet.
    pub(crate) client_index: AtomicU64,
    /// Requests refused for where their file is decided, locks dropped as files moved.
    pub(crate) decider_counts: crate::decider_counts::DeciderCounts,
    /// Alone on a store in a data directory: where the open sessions are written down.
    pub(crate) ledger: Option<Arc<Ledger>>,
    /// Set when the server stops: lock waits end at once.
    pub(crate) stopping: crate::stopping::Stopping,
}

impl LockTable {
    pub fn new(limits: Limits, epoch: u64) -> Self {
        Self::with_registry(limits, epoch, None)
    }

    /// A table of one server among several sharing `registry`: it decides nothing until the
    /// peers task joined the registry.
    pub fn with_registry(
        limits: Limits,
        epoch: u64,
        registry: Option<Arc<dyn calm_store::registry::Registry>>,
    ) -> Self {
        LockTable {
            registry,
            members: Mutex::new(Vec::new()),
            me: epoch,
            client_index: AtomicU64::new(0),
            decider_counts: Default::default(),
            inner: Mutex::new(Inner {
                peers: None,
                manager: LockManager::new(limits, (epoch << 32) | 1),
                pending: HashMap::new(),
                by_tag: HashMap::new(),
                tags: HashMap::new(),
                recovery: Recovery::new(&[], 0),
            }),
            started: Instant::now(),
            clock: Mutex::new(RunningClock::default()),
            lease_changed: Notify::new(),
            ledger: None,
            stopping: Default::default(),
        }
    }

    /// This table, writing its sessions down in the ledger at `path` (a server alone on its
    /// store): the sessions a previous life left open there start a grace in which only their
    /// clients' reclaims are granted (`calm_locks::recovery`).
    pub fn keep_ledger(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        let (ledger, survivors) = Ledger::open(path)?;
        let ledger = Arc::new(ledger);
        if survivors.is_empty() {
            ledger.compact(Some(&[]))?;
        } else {
            let longest = survivors.iter().map(|s| s.lease_ms).max().unwrap_or(0);
            tracing::info!(
                sessions = survivors.len(),
                longest_lease_ms = longest,
                "sessions were open when the server stopped: new locks wait until their \
                 clients took theirs again"
            );
            let now_ms = self.lease_now_ms();
            self.lock().recovery = Recovery::new(&survivors, now_ms);
        }
        self.ledger = Some(ledger);
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Whether several servers share the store.
    pub fn has_peers(&self) -> bool {
        self.registry.is_some()
    }

    /// Whether this server is the one its clients send the namespace's mutations to (the
    /// decider of the root's locks: `calm_client::COMMITTER_OF`); a server alone always is.
    pub fn commits_here(&self) -> bool {
        if !self.has_peers() {
            return true;
        }
        let inner = self.lock();
        inner.peers.as_ref().is_some_and(|peers| {
            matches!(
                peers.route(calm_types::ROOT, self.now_ms(), None),
                Route::Mine | Route::Grace
            )
        })
    }

    /// Whether this server decides `resource`'s locks now: `Ok`, or the failure to answer.
    /// `reclaim`: the identity of a client taking again a lock it held through the previous
    /// decider; `release`: an unlock or release, which a grace does not hold back.
    pub(crate) fn route(
        &self,
        inner: &Inner,
        resource: u64,
        reclaim: Option<&str>,
        release: bool,
    ) -> Result<(), LockFailure> {
        if !self.has_peers() {
            return match inner.recovery.admit(self.lease_now_ms(), reclaim, release) {
                Admission::Yes => Ok(()),
                Admission::Grace => Err(failure(
                    LockCode::Grace,
                    "the server restarted and the clients that held locks are taking them again",
                )),
                Admission::Late => Err(failure(
                    LockCode::Lost,
                    "the lock was held before the server restarted and was not taken again in \
                     time (or not by a client that held one): it is lost",
                )),
            };
        }
        let route = match &inner.peers {
            Some(peers) => peers.route(resource, self.now_ms(), reclaim),
            None => Route::Lapsed,
        };
        self.decider_counts.routed(route, release);
        match route {
            Route::Mine => Ok(()),
            Route::Grace if release => Ok(()),
            Route::Grace => Err(failure(
                LockCode::Grace,
                format!("file {resource} was taken over and its clients are reclaiming"),
            )),
            Route::Elsewhere(server) => Err(failure(
                LockCode::Moved,
                format!("server {server:x} decides the locks of file {resource}"),
            )),
            Route::Lapsed => Err(failure(
                LockCode::Unavailable,
                "this server's membership is not confirmed: it decides no lock now",
            )),
        }
    }

    /// Milliseconds since the server started, as they passed (a registration in the
    /// registry of servers runs out on that time).
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Milliseconds the server ran since it started: what client leases are counted on
    /// (`crate::lease_clock`).
    pub(crate) fn lease_now_ms(&self) -> u64 {
        let raw_ms = self.now_ms();
        self.clock.locked().at(raw_ms)
    }

    /// Milliseconds left out of the lease clock because the server did not run.
    pub fn stalled_ms(&self) -> u64 {
        self.clock.locked().stalled_ms()
    }

    pub fn stats(&self) -> Stats {
        self.lock().manager.stats()
    }

    /// Lock requests by how they ended, and sessions expired, since the server started.
    pub fn counts(&self) -> calm_locks::Counts {
        self.lock().manager.counts()
    }

    /// The locks `session` holds and the most it may hold, if it is open.
    pub fn session_locks(&self, session: u64) -> Option<(u64, u64)> {
        self.lock().manager.session_locks(session)
    }

    /// Whether `session` is open (not closed, not expired).
    pub fn session_live(&self, session: u64) -> bool {
        self.lock().manager.live(session).is_ok()
    }

    /// Expires due sessions until `shutdown`; never returns otherwise.
    /// It ticks at least every [`crate::lease_clock::TICK_MS`]: a longer gap is a time the
    /// server did not run, which no lease counts.
    pub async fn run_leases(self: Arc<Self>) {
        let tick = Duration::from_millis(crate::lease_clock::TICK_MS);
        loop {
            let (next, expired, now_ms, recovered) = {
                let mut inner = self.lock();
                let now_ms = self.lease_now_ms();
                let expired = inner.manager.expire(now_ms);
                inner.deliver();
                let recovered = inner
                    .recovery
                    .tick(now_ms)
                    .then(|| (inner.recovery.counts(), inner.manager.sessions()));
                (inner.manager.next_deadline(), expired, now_ms, recovered)
            };
            for session in expired {
                self.forget_session(session);
            }
            if let Some((counts, live)) = recovered {
                self.recovered(counts, live);
            }
            let sleep = match next {
                Some(deadline_ms) => Duration::from_millis(deadline_ms.saturating_sub(now_ms)),
                None => tick,
            }
            .min(tick);
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.lease_changed.notified() => {}
            }
        }
    }
}

impl LockTable {
    /// The grace after the restart is over: the ledger keeps this life's sessions only.
    fn recovered(&self, counts: calm_locks::recovery::RecoveryCounts, live: Vec<SessionId>) {
        tracing::info!(
            sessions = counts.survivors,
            reclaimed = counts.reported,
            grace_ms = counts.grace_ms,
            "the grace after the restart is over: new locks are granted"
        );
        if let Some(ledger) = self.ledger.clone() {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = ledger.compact(Some(&live)) {
                    tracing::warn!(%e, "rewriting the ledger of lock sessions");
                }
            });
        }
    }

    /// Writes down that `session`, opened by `owner` with `lease_ms`, is open (a server alone
    /// on its store), before it may hold anything.
    pub(crate) async fn hold(
        &self,
        session: SessionId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<(), String> {
        if let Some(registry) = self.registry.clone() {
            let owner = owner.to_string();
            return tokio::task::spawn_blocking(move || registry.hold(session, &owner))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    r.map_err(|e| format!("recording the session in the registry: {e}"))
                });
        }
        if let Some(ledger) = self.ledger.clone() {
            let owner = owner.to_string();
            return tokio::task::spawn_blocking(move || ledger.hold(session, &owner, lease_ms))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| format!("writing the session down: {e}")));
        }
        Ok(())
    }

    /// Client `owner` took again what its `sessions` held before the restart (alone on the
    /// store; with several servers, [`LockTable::reclaim_done`]).
    pub(crate) fn recovery_reported(&self, sessions: &[SessionId], owner: &str) -> bool {
        let now_ms = self.lease_now_ms();
        let mut inner = self.lock();
        let reported = inner.recovery.reported(sessions, owner, now_ms);
        let recovered = (!inner.recovery.active(now_ms) && reported)
            .then(|| (inner.recovery.counts(), inner.manager.sessions()));
        drop(inner);
        if let Some((counts, live)) = recovered {
            self.recovered(counts, live);
        }
        reported
    }

    /// Forgets an ended session in the registry (in the background: nothing waits for it,
    /// and a session left there only makes a takeover wait its grace out).
    pub(crate) fn forget_session(&self, session: SessionId) {
        if let Some(registry) = self.registry.clone() {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = registry.unhold(session) {
                    tracing::warn!(session, %e, "forgetting a lock session in the registry");
                }
            });
        }
        if let Some(ledger) = self.ledger.clone() {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = ledger.unhold(session) {
                    tracing::warn!(session, %e, "writing down that a lock session ended");
                }
            });
        }
    }

    /// Notes the changelog index a client's request says its mutations reached.
    pub(crate) fn note_client_index<T>(&self, request: &Request<T>) {
        if let Some(index) = request
            .metadata()
            .get(calm_proto::INDEX_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            self.client_index.fetch_max(index, Ordering::AcqRel);
        }
    }
}
