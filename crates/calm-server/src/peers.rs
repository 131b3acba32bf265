//! Several servers on one store: this server's membership in the store's registry, the view
//! of the members it decides by, and the takeovers of files that come to it
//! (`calm_locks::peers` holds the rules; `docs/design/peers.md` the argument).
//!
//! One task per server ([`run`]): it joins the registry under a lease, then every third of
//! the lease (and at once when the registry's watch reports a change, or a takeover has a
//! deadline) renews the lease and reads the members and their acknowledgements. What it read
//! goes into the state among peers under the lock table's mutex, so a change of the view and the
//! requests it moves never interleave; the effects that need the registry (acknowledge the
//! view, read the sessions of the servers that lost files) run after, outside the mutex.

use calm_types::sync::Locked;
use std::sync::Arc;
use std::time::Duration;

use calm_locks::LockError;
use calm_locks::peers::{Effect, Peers, PeersConfig, Route, ServerId};
use calm_proto::pb;
use calm_store::registry::{Members, Registry};

use crate::locks::LockTable;

/// Default lease of a server's membership, in milliseconds: the longest a dead server's files
/// wait before others take them over (etcd counts leases in whole seconds).
pub const SERVER_LEASE_MS_DEFAULT: u64 = 5_000;
/// Default longest wait for clients' reclaims after a takeover, in milliseconds.
pub const GRACE_MS_MAX_DEFAULT: u64 = 10_000;
/// How often the thread that forwards the registry's watch checks that the server still runs:
/// the longest it delays the end of a stopping server.
const REGISTRY_WATCH_POLL: Duration = Duration::from_millis(200);

/// Pause between two attempts to join the registry.
const JOIN_RETRY_MS: u64 = 200;
/// Time a takeover may take to read the sessions of the server it takes over, beyond the
/// leases: three registry calls at their longest (the store's `attempt-ms-max`, 10 s each).
const HOLDERS_READ_MS_MAX: u64 = 30_000;

/// How long this server's sessions stay in the registry after its last renewal: the others
/// notice it gone within its lease, wait up to a lease for acknowledgements, and read the
/// sessions then; the grace and slow registry calls are margin. (Default: 50 s.)
pub fn holders_kept_ms(lease_ms: u64, grace_ms_max: u64) -> u64 {
    2 * lease_ms + grace_ms_max + HOLDERS_READ_MS_MAX
}

/// How this server takes part among its peers.
#[derive(Debug, Clone)]
pub struct PeersOptions {
    /// Where clients reach this server (its first TCP listener, or its Unix socket).
    pub address: String,
    pub lease_ms: u64,
    pub grace_ms_max: u64,
}

/// What a server among several shows of its deciders (metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeersFigures {
    /// Servers in the view this server decides by.
    pub servers: usize,
    /// Whether this server's membership is confirmed (it decides its files' locks).
    pub deciding: bool,
    /// Takeovers whose grace is not over.
    pub takeovers_active: usize,
    pub counts: calm_locks::peers::PeersCounts,
    /// Lock requests refused by [`crate::decider_counts::REFUSALS`].
    pub refused: [u64; 3],
    /// Locks and waiting requests dropped because their file moved to another server.
    pub locks_moved: u64,
}

impl LockTable {
    /// What the deciders counted, with several servers (`None` alone).
    pub fn peers_figures(&self) -> Option<PeersFigures> {
        if !self.has_peers() {
            return None;
        }
        let now_ms = self.now_ms();
        let (refused, locks_moved) = self.decider_counts.read();
        let mut figures = PeersFigures {
            refused,
            locks_moved,
            ..PeersFigures::default()
        };
        if let Some(peers) = &self.lock().peers {
            figures.servers = peers.view().len();
            figures.deciding = peers.valid(now_ms);
            figures.takeovers_active = peers.takeovers_active(now_ms);
            figures.counts = peers.counts();
        }
        Some(figures)
    }

    /// The view this server decides by, for clients.
    pub(crate) fn members_reply(&self) -> pb::MembersReply {
        if !self.has_peers() {
            return pb::MembersReply {
                has_peers: false,
                me: self.me,
                servers: Vec::new(),
            };
        }
        let members = self.members.locked();
        pb::MembersReply {
            has_peers: true,
            me: self.me,
            servers: members
                .iter()
                .map(|(id, address)| pb::Member {
                    id: *id,
                    address: address.clone(),
                })
                .collect(),
        }
    }

    pub(crate) fn reclaim_done(&self, sessions: &[u64], view: &[u64], owner: &str) -> bool {
        let now_ms = self.now_ms();
        match &mut self.lock().peers {
            Some(peers) => peers.reclaim_done(sessions, view, owner, now_ms),
            None => false,
        }
    }

    /// Applies what the state among peers asked for that needs only the table (dropping the files
    /// that moved away); returns the rest.
    fn carry_out(&self, effects: Vec<Effect>) -> Vec<Effect> {
        let mut later = Vec::new();
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        for effect in effects {
            if effect != Effect::DropMoved {
                later.push(effect);
                continue;
            }
            let Some(peers) = inner.peers.clone() else {
                continue;
            };
            let mut dropped = 0;
            for resource in inner.manager.resources() {
                if matches!(
                    peers.route(resource, now_ms, None),
                    Route::Elsewhere(_) | Route::Lapsed
                ) {
                    dropped += inner.manager.drop_resource(resource, LockError::Moved);
                }
            }
            inner.deliver();
            self.decider_counts.moved(dropped);
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "dropped the locks of files another server decides now"
                );
            }
        }
        later
    }

    /// Stops deciding (the server is leaving): every lock is dropped, every request refused
    /// until the others took the files over.
    pub(crate) fn lapse(&self) {
        let mut inner = self.lock();
        if let Some(peers) = &mut inner.peers {
            peers.set_view(Vec::new(), 0);
        }
        drop(inner);
        self.carry_out(vec![Effect::DropMoved]);
    }
}

/// Runs `f` on a blocking thread (registry calls wait for etcd).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> calm_store::Result<T> + Send + 'static,
) -> calm_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(calm_store::StoreError::Io(format!("registry call: {e}"))))
}

/// Joins the registry (trying until it works) and returns the lease granted.
async fn join(registry: &Arc<dyn Registry>, me: ServerId, options: &PeersOptions) -> u64 {
    loop {
        let (registry, address, lease_ms) =
            (registry.clone(), options.address.clone(), options.lease_ms);
        let holders_ms = holders_kept_ms(lease_ms, options.grace_ms_max);
        match blocking(move || registry.join(me, &address, lease_ms, holders_ms)).await {
            Ok(granted_ms) => return granted_ms,
            Err(e) => {
                tracing::warn!(%e, "joining the registry of servers; trying again");
                tokio::time::sleep(Duration::from_millis(JOIN_RETRY_MS)).await;
            }
        }
    }
}

/// This server's part among its peers, until aborted. `me` is the store epoch.
/// `owners`: who opened each session (recorded again with it after a lapse).
pub async fn run(
    table: Arc<LockTable>,
    options: PeersOptions,
    owners: Arc<crate::auth::SessionOwners>,
) {
    let Some(registry) = table.registry.clone() else {
        return;
    };
    let me = table.me;
    let lease_ms = join(&registry, me, &options).await;
    table.lock().peers = Some(Peers::new(
        me,
        PeersConfig {
            lease_ms,
            grace_ms_max: options.grace_ms_max,
        },
    ));
    tracing::info!(
        server = format!("{me:x}"),
        lease_ms,
        "joined the registry of servers"
    );
    let changed = Arc::new(tokio::sync::Notify::new());
    match registry.watch() {
        Ok(receiver) => {
            // Holds `changed` weakly: once this task is gone (the server stops, and its
            // runtime, which waits for blocking threads, drops it), the thread ends within a
            // poll, and the watch with it.
            let changed = Arc::downgrade(&changed);
            tokio::task::spawn_blocking(move || {
                loop {
                    let report = receiver.recv_timeout(REGISTRY_WATCH_POLL);
                    let Some(changed) = changed.upgrade() else {
                        return;
                    };
                    match report {
                        Ok(()) => changed.notify_one(),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            });
        }
        Err(e) => tracing::warn!(%e, "watching the registry: following it by rounds only"),
    }
    let period = Duration::from_millis((lease_ms / 3).max(100));
    loop {
        round(&table, &registry, me, &options, &owners).await;
        let now_ms = table.now_ms();
        let deadline = table
            .lock()
            .peers
            .as_ref()
            .and_then(|c| c.next_deadline())
            .map(|d| Duration::from_millis(d.saturating_sub(now_ms)));
        let sleep = deadline.map_or(period, |d| d.min(period));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = changed.notified() => {}
        }
    }
}

/// One round: renew, read the members, apply them.
async fn round(
    table: &Arc<LockTable>,
    registry: &Arc<dyn Registry>,
    me: ServerId,
    options: &PeersOptions,
    owners: &crate::auth::SessionOwners,
) {
    let sent_ms = table.now_ms();
    let renewing = registry.clone();
    let renewed = blocking(move || renewing.renew()).await;
    let reading = registry.clone();
    let members = blocking(move || reading.members()).await;
    match &renewed {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("this server's lease in the registry ran out; joining again");
            // Its files were taken over (or are being): nothing is decided here until the
            // new membership is confirmed.
            table.lapse();
            join(registry, me, options).await;
            hold_again(table, registry, owners).await;
            return;
        }
        Err(e) => tracing::warn!(%e, "renewing this server's lease in the registry"),
    }
    let members = match members {
        Ok(members) => members,
        Err(e) => {
            tracing::warn!(%e, "reading the registry of servers");
            return;
        }
    };
    let effects = apply(table, &members, sent_ms, matches!(renewed, Ok(true)));
    run_effects(table, registry, effects).await;
}

/// Records the open sessions again under the new membership's holders lease (the old one
/// may have run out with the membership): a later takeover of this server waits for them.
async fn hold_again(
    table: &Arc<LockTable>,
    registry: &Arc<dyn Registry>,
    owners: &crate::auth::SessionOwners,
) {
    let sessions: Vec<(u64, String)> = table
        .lock()
        .manager
        .sessions()
        .into_iter()
        .filter_map(|s| Some((s, owners.owner(s)?)))
        .collect();
    let count = sessions.len();
    let registry = registry.clone();
    let held = blocking(move || {
        sessions
            .into_iter()
            .try_for_each(|(s, owner)| registry.hold(s, &owner))
    })
    .await;
    match held {
        Ok(()) => tracing::info!(sessions = count, "recorded the open sessions again"),
        // A takeover of this server will not wait for the sessions not recorded: their
        // reclaims may come after its grace and lose to a conflicting lock.
        Err(e) => tracing::warn!(%e, "recording the open sessions again"),
    }
}

/// Applies a read of the registry under the table's mutex.
fn apply(table: &LockTable, members: &Members, sent_ms: u64, renewed: bool) -> Vec<Effect> {
    let view: Vec<ServerId> = members.servers.iter().map(|(id, _)| *id).collect();
    let now_ms = table.now_ms();
    let effects = {
        let mut inner = table.lock();
        let Some(peers) = inner.peers.as_mut() else {
            return Vec::new();
        };
        let mut effects = peers.set_view(view.clone(), now_ms);
        if renewed {
            peers.confirmed(&view, sent_ms);
        }
        for (server, acked) in &members.acks {
            effects.extend(peers.ack(*server, acked.clone(), now_ms));
        }
        effects.extend(peers.tick(now_ms));
        let applied = peers.view().to_vec();
        *table.members.locked() = members
            .servers
            .iter()
            .filter(|(id, _)| applied.binary_search(id).is_ok())
            .cloned()
            .collect();
        effects
    };
    table.carry_out(effects)
}

async fn run_effects(table: &Arc<LockTable>, registry: &Arc<dyn Registry>, effects: Vec<Effect>) {
    for effect in effects {
        match effect {
            Effect::DropMoved => {}
            Effect::Ack(view) => {
                let registry = registry.clone();
                if let Err(e) = blocking(move || registry.ack(&view)).await {
                    tracing::warn!(%e, "acknowledging the view of servers");
                }
            }
            Effect::ReadHolders(servers) => {
                let reading = registry.clone();
                let sessions = match blocking(move || reading.holders()).await {
                    Ok(sessions) => sessions,
                    // Not read: the takeover waits its grace out, which is safe.
                    Err(e) => {
                        tracing::warn!(%e, "reading the sessions of servers taken over");
                        continue;
                    }
                };
                let now_ms = table.now_ms();
                if let Some(peers) = table.lock().peers.as_mut() {
                    peers.holders(&servers, &sessions, now_ms);
                }
            }
        }
    }
}
