//! Several servers, one lock table per file: which server decides a file's locks, and when a
//! server that has just become a file's decider may grant new locks on it.
//!
//! Pure and deterministic, like the manager: the server feeds in what it read from the
//! registry of servers (etcd), the time, and what clients report; it gets back effects to
//! carry out. Rules (`docs/design/peers.md`):
//!
//! - **Deciders.** A file's locks are decided by the member of the current view that scores
//!   highest for its handle (rendezvous hashing, [`owner_of`]): every server and every client
//!   computes the same owner from the same view, so a client sends a request straight to the
//!   owner, and a change of the view moves only the files of the servers that came or went.
//! - **Fencing.** A server decides nothing unless its own registration was confirmed within
//!   its lease: a round that renewed the lease and read a view equal to the one it applied,
//!   sent at `t`, lets it decide until `t + lease_ms` ([`Peers::confirmed`]). The registry
//!   forgets a member only after its lease ran out, counted from a renewal it received after
//!   `t`: a server cut off from etcd stops deciding before anyone else may start.
//! - **Takeover.** When the view changes, the files that came to this server from others are
//!   in grace: only reclaims are granted there (the locks clients held through the previous
//!   decider), until (1) every member of both views has acknowledged the new view (it stopped
//!   deciding the files it lost) or a lease has passed, and then (2) every client session
//!   registered with the servers that lost files has reported its reclaim done, or
//!   `grace_ms_max` has passed.
//! - **Who may reclaim.** A session is registered with the identity that opened it (its
//!   [`Owner`]). Once a takeover has read the sessions of the servers that lost files, a
//!   reclaim there is let in only from an identity that had a session on one of them, and a
//!   report of a finished reclaim counts only for the sessions of the identity that sends it
//!   (as an NFSv4 server lets in reclaims only from the clients it knew before its restart).
//!   Before the sessions are read, reclaims wait (`Grace`) and reports are refused.

use std::collections::{BTreeMap, BTreeSet};

use crate::manager::{ResourceId, SessionId};

/// A server's id in the registry: its store epoch, unique over every start of every server.
/// A session id carries it in its high 32 bits ([`server_of_session`]).
pub type ServerId = u64;

/// Who opened a client session: the server's name for the client's identity (a certificate's
/// name, a uid on a Unix socket); the same on every server.
pub type Owner = String;

/// The server that opened `session` (session ids are `epoch << 32 | n`).
pub fn server_of_session(session: SessionId) -> ServerId {
    session >> 32
}

/// The member of `servers` that decides the locks of `resource`, if there is any member.
pub fn owner_of(resource: ResourceId, servers: &[ServerId]) -> Option<ServerId> {
    servers
        .iter()
        .copied()
        .max_by_key(|&server| (score(resource, server), server))
}

/// SplitMix64's finalizer: a bijection that spreads every input bit over the output.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn score(resource: ResourceId, server: ServerId) -> u64 {
    mix(resource ^ mix(server.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Most client sessions one takeover waits for (and most reports of a finished reclaim kept
/// for the current view): a session per client per server, and a server has at most 65 536.
pub const HOLDERS_MAX: usize = 1 << 20;

/// Times of a server among its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeersConfig {
    /// The lease of the server's registration: how long after a confirmed round it may still
    /// decide, and how long a member that never acknowledges a view is waited for.
    pub lease_ms: u64,
    /// Longest a takeover waits for the clients' reclaims once every member stopped deciding
    /// the files that moved.
    pub grace_ms_max: u64,
}

/// Where a request on a file goes, as this server sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Decided here.
    Mine,
    /// Decided here, but the file came from another server and its clients may still reclaim:
    /// only reclaims (and unlocks) now.
    Grace,
    /// Decided by that server.
    Elsewhere(ServerId),
    /// This server's registration is not confirmed (lease lapsed, or not a member): it decides
    /// nothing.
    Lapsed,
}

/// What the server must do after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Drop the locks and waiting requests of every file this server no longer decides
    /// ([`Peers::route`] says `Elsewhere` or `Lapsed`): their clients take them again from
    /// the new owner.
    DropMoved,
    /// Write this acknowledgement of the view to the registry.
    Ack(Vec<ServerId>),
    /// Read the client sessions registered with these servers and give them to
    /// [`Peers::holders`].
    ReadHolders(Vec<ServerId>),
}

/// What a server's state among peers counted since it started: its view's changes and
/// its takeovers' grace periods, by how each ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeersCounts {
    /// Views of the servers applied after the first (a server came or went: files moved).
    pub views_changed: u64,
    /// Takeovers begun: files came to this server from others.
    pub takeovers: u64,
    /// Takeovers whose clients all reported their reclaims done.
    pub ended_reclaimed: u64,
    /// Takeovers that waited their longest grace out.
    pub ended_deadline: u64,
    /// Takeovers given up because this server left the view.
    pub ended_left: u64,
    /// Milliseconds of grace of the takeovers ended, from their start to their end.
    pub grace_ms: u64,
}

#[derive(Debug, Clone)]
struct Takeover {
    /// The view before the change: a file whose owner in it was another server is in grace.
    previous: Vec<ServerId>,
    /// Losers still members that have not acknowledged the new view.
    acks_pending: BTreeSet<ServerId>,
    acks_deadline_ms: u64,
    /// The servers that files came from, whose clients may reclaim here.
    losers: Vec<ServerId>,
    /// Whether the holders were asked for; `deadline_ms` counts from then.
    holders_asked: bool,
    /// Sessions that must still report their reclaim; `None` until read.
    holders: Option<BTreeSet<SessionId>>,
    /// Who opened each session registered with the losers (read with `holders`).
    owners: BTreeMap<SessionId, Owner>,
    /// The identities among `owners`: those may reclaim here.
    reclaimers: BTreeSet<Owner>,
    deadline_ms: u64,
    /// When it began.
    started_ms: u64,
}

impl Takeover {
    fn complete(&self, now_ms: u64) -> bool {
        self.holders_asked
            && (now_ms >= self.deadline_ms || self.holders.as_ref().is_some_and(|h| h.is_empty()))
    }
}

/// One server's view of its peers and its takeovers.
#[derive(Debug, Clone)]
pub struct Peers {
    me: ServerId,
    config: PeersConfig,
    /// Sorted, no duplicates.
    view: Vec<ServerId>,
    /// Whether a view was ever applied.
    joined: bool,
    /// This server decides only before this time.
    valid_until_ms: u64,
    takeovers: Vec<Takeover>,
    /// The last view each member acknowledged.
    acks: BTreeMap<ServerId, Vec<ServerId>>,
    /// Sessions that reported their reclaim done under the current view.
    done: BTreeSet<SessionId>,
    counts: PeersCounts,
}

fn normalized(mut servers: Vec<ServerId>) -> Vec<ServerId> {
    servers.sort_unstable();
    servers.dedup();
    servers
}

impl Peers {
    pub fn new(me: ServerId, config: PeersConfig) -> Peers {
        Peers {
            me,
            config,
            view: Vec::new(),
            joined: false,
            valid_until_ms: 0,
            takeovers: Vec::new(),
            acks: BTreeMap::new(),
            done: BTreeSet::new(),
            counts: PeersCounts::default(),
        }
    }

    /// What was counted since the start.
    pub fn counts(&self) -> PeersCounts {
        self.counts
    }

    /// Forgets the takeovers complete at `now_ms`, counting how each ended.
    fn forget_complete(&mut self, now_ms: u64) {
        let counts = &mut self.counts;
        self.takeovers.retain(|t| {
            if !t.complete(now_ms) {
                return true;
            }
            match t.holders.as_ref().is_some_and(|h| h.is_empty()) {
                true => counts.ended_reclaimed += 1,
                false => counts.ended_deadline += 1,
            }
            counts.grace_ms += now_ms.saturating_sub(t.started_ms);
            false
        });
    }

    pub fn me(&self) -> ServerId {
        self.me
    }

    pub fn config(&self) -> PeersConfig {
        self.config
    }

    /// The applied view, sorted.
    pub fn view(&self) -> &[ServerId] {
        &self.view
    }

    /// Takeovers not yet complete at `now_ms`.
    pub fn takeovers_active(&self, now_ms: u64) -> usize {
        self.takeovers
            .iter()
            .filter(|t| !t.complete(now_ms))
            .count()
    }

    /// Whether this server may decide at `now_ms`.
    pub fn valid(&self, now_ms: u64) -> bool {
        now_ms < self.valid_until_ms && self.view.binary_search(&self.me).is_ok()
    }

    /// Applies the view read from the registry. A changed view starts a takeover of the files
    /// that come to this server, and drops the ones that leave it.
    pub fn set_view(&mut self, servers: Vec<ServerId>, now_ms: u64) -> Vec<Effect> {
        let servers = normalized(servers);
        if self.joined && servers == self.view {
            return Vec::new();
        }
        let previous = if self.joined {
            self.counts.views_changed += 1;
            std::mem::replace(&mut self.view, servers)
        } else {
            // The first view: whatever is there besides this server decided every file before.
            self.joined = true;
            self.view = servers;
            self.view
                .iter()
                .copied()
                .filter(|&s| s != self.me)
                .collect()
        };
        self.done.clear();
        let mut effects = vec![Effect::DropMoved];
        if self.view.binary_search(&self.me).is_err() {
            // Not a member: decide nothing until a view with this server is confirmed.
            self.valid_until_ms = 0;
            for t in self.takeovers.drain(..) {
                self.counts.ended_left += 1;
                self.counts.grace_ms += now_ms.saturating_sub(t.started_ms);
            }
            return effects;
        }
        effects.push(Effect::Ack(self.view.clone()));
        // With rendezvous hashing a file moves to this server only from a server that left
        // (when this server was a member before) or from any member before (when it joins).
        let was_member = previous.binary_search(&self.me).is_ok();
        let losers: Vec<ServerId> = previous
            .iter()
            .copied()
            .filter(|s| *s != self.me && (!was_member || self.view.binary_search(s).is_err()))
            .collect();
        if !losers.is_empty() {
            // Those still members must stop deciding the files they lost.
            let acks_pending = losers
                .iter()
                .copied()
                .filter(|s| self.view.binary_search(s).is_ok())
                .collect();
            self.takeovers.push(Takeover {
                previous,
                acks_pending,
                acks_deadline_ms: now_ms.saturating_add(self.config.lease_ms),
                losers,
                holders_asked: false,
                holders: None,
                owners: BTreeMap::new(),
                reclaimers: BTreeSet::new(),
                deadline_ms: u64::MAX,
                started_ms: now_ms,
            });
            self.counts.takeovers += 1;
        }
        effects.extend(self.advance(now_ms));
        effects
    }

    /// A round that renewed this server's lease and read a view equal to the applied one was
    /// sent at `sent_ms`: the server may decide until `sent_ms + lease_ms`.
    pub fn confirmed(&mut self, view: &[ServerId], sent_ms: u64) {
        if self.joined && normalized(view.to_vec()) == self.view {
            self.valid_until_ms = self
                .valid_until_ms
                .max(sent_ms.saturating_add(self.config.lease_ms));
        }
    }

    /// Member `server` acknowledged `view` (it decides by it).
    pub fn ack(&mut self, server: ServerId, view: Vec<ServerId>, now_ms: u64) -> Vec<Effect> {
        self.acks.insert(server, normalized(view));
        self.advance(now_ms)
    }

    /// Forgets the acknowledgements of servers that are no longer members.
    fn prune_acks(&mut self) {
        let view = &self.view;
        self.acks.retain(|s, _| view.binary_search(s).is_ok());
    }

    /// Moves takeovers on: asks for holders once the acknowledgements are in (or a lease
    /// passed), forgets complete ones.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Effect> {
        self.advance(now_ms)
    }

    fn advance(&mut self, now_ms: u64) -> Vec<Effect> {
        self.prune_acks();
        let mut effects = Vec::new();
        for takeover in &mut self.takeovers {
            let view = &self.view;
            let acks = &self.acks;
            takeover
                .acks_pending
                .retain(|s| view.binary_search(s).is_ok() && acks.get(s) != Some(view));
            if !takeover.holders_asked
                && (takeover.acks_pending.is_empty() || now_ms >= takeover.acks_deadline_ms)
            {
                takeover.holders_asked = true;
                takeover.deadline_ms = now_ms.saturating_add(self.config.grace_ms_max);
                effects.push(Effect::ReadHolders(takeover.losers.clone()));
            }
        }
        self.forget_complete(now_ms);
        effects
    }

    /// The sessions registered with `servers`, with who opened each (read after
    /// [`Effect::ReadHolders`]): the takeovers that asked for them wait for their reports, and
    /// let in reclaims from their owners only.
    pub fn holders(&mut self, servers: &[ServerId], sessions: &[(SessionId, Owner)], now_ms: u64) {
        for takeover in &mut self.takeovers {
            if takeover.holders_asked && takeover.holders.is_none() && takeover.losers == servers {
                let mut pending = BTreeSet::new();
                for (session, owner) in sessions.iter().take(HOLDERS_MAX) {
                    if !takeover.losers.contains(&server_of_session(*session)) {
                        continue;
                    }
                    takeover.owners.insert(*session, owner.clone());
                    takeover.reclaimers.insert(owner.clone());
                    if !self.done.contains(session) {
                        pending.insert(*session);
                    }
                }
                takeover.holders = Some(pending);
            }
        }
        self.forget_complete(now_ms);
    }

    /// Client `owner` reports that `sessions` (all of its own, on every server) reclaimed
    /// whatever they held, under `view`. Counts only when `view` is this server's view and the
    /// sessions of every takeover under way have been read, and only for the sessions `owner`
    /// opened; false otherwise (the client asks again).
    pub fn reclaim_done(
        &mut self,
        sessions: &[SessionId],
        view: &[ServerId],
        owner: &str,
        now_ms: u64,
    ) -> bool {
        if normalized(view.to_vec()) != self.view {
            return false;
        }
        if self
            .takeovers
            .iter()
            .any(|t| !t.complete(now_ms) && t.holders.is_none())
        {
            return false;
        }
        for session in sessions {
            let opened_by_owner = self
                .takeovers
                .iter()
                .any(|t| t.owners.get(session).is_some_and(|o| o == owner));
            if !opened_by_owner {
                continue;
            }
            if self.done.len() < HOLDERS_MAX {
                self.done.insert(*session);
            }
            for takeover in &mut self.takeovers {
                if let Some(holders) = &mut takeover.holders {
                    holders.remove(session);
                }
            }
        }
        self.forget_complete(now_ms);
        true
    }

    /// Where a request on `resource` goes. `reclaim`: the identity of a client taking again a
    /// lock it held through the previous owner, which grace lets in once the takeover knows
    /// that identity had a session there.
    pub fn route(&self, resource: ResourceId, now_ms: u64, reclaim: Option<&str>) -> Route {
        if !self.valid(now_ms) {
            return Route::Lapsed;
        }
        match owner_of(resource, &self.view) {
            Some(owner) if owner == self.me => {}
            Some(owner) => return Route::Elsewhere(owner),
            None => return Route::Lapsed,
        }
        let held_back = |t: &Takeover| match reclaim {
            None => true,
            Some(owner) => t.holders.is_none() || !t.reclaimers.contains(owner),
        };
        if self.takeovers.iter().any(|t| {
            !t.complete(now_ms) && owner_of(resource, &t.previous) != Some(self.me) && held_back(t)
        }) {
            return Route::Grace;
        }
        Route::Mine
    }

    /// When [`Peers::tick`] next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        self.takeovers
            .iter()
            .map(|t| match t.holders_asked {
                false => t.acks_deadline_ms,
                true => t.deadline_ms,
            })
            .min()
    }
}

#[cfg(test)]
mod tests;
