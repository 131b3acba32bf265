//! A client's locks across the servers of a namespace (`docs/design/peers.md`).
//!
//! With several servers on one store, each file's locks are decided by one member of the
//! servers' view, which the client computes itself ([`owner_of`]) from the view a server
//! gives it (`Locks.Members`): a request goes straight to its decider, no hop between servers.
//! A session belongs to the server that opened it, so the router opens one on each server it
//! locks through, lazily, and renews them all.
//!
//! It keeps a copy of every lock it was granted (`Shadow`: per file and owner, the same
//! merge-and-split rules as the manager). When the view changes (a server died, or joined),
//! the locks whose file has a new decider are reclaimed there, and the router reports to every
//! member that it has reclaimed all under the new view: the takeover's grace ends once every
//! session of the servers that lost files has done so. A request answered `Moved` (the view it
//! was routed by is old), `Grace` (the new decider waits for reclaims) or `Unavailable` (the
//! server is unreachable, or its membership lapsed) is sent again after a refresh of the view,
//! for up to [`ROUTE_RETRY_MS_MAX`]: an application sees a pause, not an error.
//!
//! A server alone on its store says it has no peers: everything goes to it. When it
//! restarts (the client finds its session unknown or fenced), the router opens a new session
//! and reclaims there every lock it held, then reports it done: the server grants no new lock
//! until its clients from before did so, or their leases passed. A lock the server refuses to
//! give back is lost: it is dropped from the copy and reported ([`LockRouter::take_lost`]), so
//! that the mount tells its holder. A request refused `Grace` meanwhile is sent again, and a
//! waiting request whose server went away is sent again once it is back: it waits on.

use calm_types::sync::Locked;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use calm_locks::peers::owner_of;
use calm_locks::{Request, SessionId};
use calm_proto::locks::{LockAnswer, LockCall, LockCode, LockFailure};

use crate::Client;
use crate::shadow::Shadow;

mod restart;

/// Longest a request is sent again while its file's decider moves (a server's lease and a
/// takeover's grace), in milliseconds; past it the request fails with the last answer.
pub const ROUTE_RETRY_MS_MAX: u64 = 60_000;
/// How often the router asks for the view, in milliseconds: how soon after a server's lease
/// ran out its locks are reclaimed elsewhere.
pub const MEMBERS_POLL_MS: u64 = 250;
const RETRY_PAUSE_MS_MIN: u64 = 10;
const RETRY_PAUSE_MS_MAX: u64 = 200;

/// A server the router locks through.
#[derive(Debug, Clone)]
struct Link {
    client: Client,
    session: SessionId,
}

/// Where a blocking request is.
#[derive(Debug, Default)]
struct WaitState {
    /// The server and session it was last sent in.
    at: Option<(u64, SessionId)>,
    cancelled: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The id of the server `home` reaches (it changes when `home` moves to another server).
    home_id: u64,
    /// The address `home` was connected to when `home_id` was learnt.
    home_address: Option<String>,
    has_peers: bool,
    /// Sorted member ids.
    view: Vec<u64>,
    addresses: BTreeMap<u64, String>,
    links: HashMap<u64, Link>,
    shadow: Shadow,
    waits: HashMap<u64, WaitState>,
    /// Members that have not yet accepted the report of the reclaim under `view`.
    done_pending: BTreeSet<u64>,
    /// Sessions on servers that left the view, newest last.
    departed: std::collections::VecDeque<SessionId>,
}

/// Sessions on departed servers that reports of reclaims still name.
const DEPARTED_MAX: usize = 64;

/// One client's lock sessions on the servers of a namespace.
#[derive(Debug)]
pub struct LockRouter {
    home: Client,
    lease_ms: u64,
    state: Mutex<State>,
    /// Serializes changes of the view (and their reclaims) and the opening of sessions.
    refreshing: tokio::sync::Mutex<()>,
    /// Signalled when the session on the home server was replaced by a new one.
    replaced: tokio::sync::Notify,
    /// Locks the servers refused to give back after a restart: `(file, owner)`, for the
    /// mount to tell their holders (at most [`LOST_MAX`] kept until taken).
    lost: Mutex<Vec<(u64, calm_locks::Owner)>>,
    lost_changed: tokio::sync::Notify,
    /// When the home server last confirmed the home session (a renewal, or its opening).
    confirmed: Mutex<Instant>,
}

/// Lost locks kept until the mount takes them: past it, the oldest go (their files are still
/// told through the later ones of the same owner).
pub const LOST_MAX: usize = 65_536;

/// Whether a refusal says the session is gone (the server restarted, or the lease ran out).
fn session_lost(code: LockCode) -> bool {
    matches!(code, LockCode::Fenced | LockCode::NoSuchSession)
}

pub(crate) fn retryable(code: LockCode) -> bool {
    matches!(
        code,
        LockCode::Moved | LockCode::Grace | LockCode::Unavailable
    )
}

/// Whether an answer asks for the request to be sent again shortly: with several servers,
/// while the file's decider moves; alone, while the server's clients reclaim after a restart.
fn again_later(has_peers: bool, code: LockCode) -> bool {
    match has_peers {
        true => retryable(code),
        false => code == LockCode::Grace,
    }
}

fn lock_state(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.locked()
}

/// Pauses between two sends of a request, growing.
pub(crate) struct Retry {
    deadline: Instant,
    pause_ms: u64,
}

impl Retry {
    pub(crate) fn new() -> Retry {
        Retry {
            deadline: Instant::now() + Duration::from_millis(ROUTE_RETRY_MS_MAX),
            pause_ms: RETRY_PAUSE_MS_MIN,
        }
    }

    /// Waits before the next send; false once the time is up.
    pub(crate) async fn pause(&mut self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(self.pause_ms)).await;
        self.pause_ms = (self.pause_ms * 2).min(RETRY_PAUSE_MS_MAX);
        true
    }
}

impl LockRouter {
    /// Opens a session on `home` (the client's server) and asks it for the view.
    pub async fn open(home: Client, lease_ms: u64) -> Result<Arc<LockRouter>, LockFailure> {
        let members = home.members().await?;
        let session = home.open_lock_session(lease_ms).await?;
        let mut state = State {
            home_id: members.me,
            home_address: home.server(),
            has_peers: members.has_peers,
            ..State::default()
        };
        state.links.insert(
            members.me,
            Link {
                client: home.clone(),
                session,
            },
        );
        if members.has_peers {
            state.view = members.servers.iter().map(|m| m.id).collect();
            state.view.sort_unstable();
            state.addresses = members
                .servers
                .iter()
                .map(|m| (m.id, m.address.clone()))
                .collect();
        }
        Ok(Arc::new(LockRouter {
            home,
            lease_ms,
            state: Mutex::new(state),
            refreshing: tokio::sync::Mutex::new(()),
            replaced: tokio::sync::Notify::new(),
            lost: Mutex::new(Vec::new()),
            lost_changed: tokio::sync::Notify::new(),
            confirmed: Mutex::new(Instant::now()),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock_state(&self.state)
    }

    /// The session on the home server (the one the client's namespace calls name).
    pub fn home_session(&self) -> SessionId {
        let state = self.state();
        state
            .links
            .get(&state.home_id)
            .map_or(0, |link| link.session)
    }

    /// Every session of this client, on every server.
    pub fn sessions(&self) -> Vec<SessionId> {
        self.state().links.values().map(|l| l.session).collect()
    }

    /// Whether `session` is one of this client's.
    pub fn is_mine(&self, session: SessionId) -> bool {
        self.state().links.values().any(|l| l.session == session)
    }

    /// Locks this client holds, over every file and server.
    pub fn held(&self) -> usize {
        self.state().shadow.len()
    }

    /// Completes when the session on the home server has been replaced since the last call.
    pub async fn replaced(&self) {
        self.replaced.notified().await
    }

    /// The server that decides `resource`'s locks, as this client sees it.
    fn route(&self, resource: u64) -> u64 {
        let state = self.state();
        match state.has_peers {
            true => owner_of(resource, &state.view).unwrap_or(state.home_id),
            false => state.home_id,
        }
    }

    /// The link to `server`, opening a session there first if there is none.
    async fn link(&self, server: u64) -> Result<Link, LockFailure> {
        if let Some(link) = self.state().links.get(&server) {
            return Ok(link.clone());
        }
        let _opening = self.refreshing.lock().await;
        self.link_unlocked(server).await
    }

    /// Applies `calls` (all on `resource`, or releases everywhere) at the server deciding
    /// `resource`, sending them again while it moves.
    pub async fn call(
        &self,
        resource: u64,
        calls: &[LockCall],
    ) -> Result<Vec<LockAnswer>, LockFailure> {
        let mut answers: Vec<Option<LockAnswer>> = vec![None; calls.len()];
        let mut retry = Retry::new();
        loop {
            let pending: Vec<usize> = (0..calls.len()).filter(|i| answers[*i].is_none()).collect();
            let server = self.route(resource);
            let sent: Vec<LockCall> = pending.iter().map(|i| calls[*i]).collect();
            let (outcome, used) = match self.link(server).await {
                Ok(link) => (
                    link.client.lock_batch(link.session, &sent).await,
                    Some(link.session),
                ),
                Err(failure) => (Err(failure), None),
            };
            let has_peers = self.state().has_peers;
            let moved = match (&outcome, used) {
                (Err(failure), Some(session)) if has_peers => {
                    self.session_moved(server, session, failure.code).await
                }
                (Err(failure), Some(session)) if session_lost(failure.code) => {
                    // The server restarted, or the lease ran out: a new session (with every
                    // lock taken again), and the call sent again in it.
                    self.replace_home(session).await;
                    self.home_session() != session
                }
                _ => false,
            };
            let mut again = None;
            match outcome {
                Err(failure) if moved || (has_peers && retryable(failure.code)) => {
                    again = Some(failure)
                }
                Err(failure) => return Err(failure),
                Ok(got) => {
                    for (i, answer) in pending.into_iter().zip(got) {
                        if again_later(has_peers, answer.code) {
                            again = Some(LockFailure::new(answer.code, answer.message.clone()));
                            continue;
                        }
                        if answer.is_ok() {
                            self.note_granted(&calls[i]);
                        }
                        answers[i] = Some(answer);
                    }
                }
            }
            let Some(failure) = again else {
                return Ok(answers.into_iter().map(|a| a.expect("answered")).collect());
            };
            if !retry.pause().await {
                return Err(failure);
            }
            self.refresh(Some(server)).await;
        }
    }

    /// Whether a refusal `code` of `session`, used at `server`, says the session is gone
    /// because the client moved: its home connection went to another server (whose failover
    /// sends a call again there, in the session of the server it left), or the session there
    /// was replaced meanwhile. The call is then sent again, in the session the client has now
    /// (a request that was waiting holds nothing yet; the locks held were reclaimed in the new
    /// session by the move).
    async fn session_moved(&self, server: u64, session: SessionId, code: LockCode) -> bool {
        if !matches!(code, LockCode::NoSuchSession | LockCode::Fenced) {
            return false;
        }
        self.follow_home().await;
        self.state()
            .links
            .get(&server)
            .is_none_or(|link| link.session != session)
    }

    fn note_granted(&self, call: &LockCall) {
        let mut state = self.state();
        match call {
            LockCall::Set(request) | LockCall::SetFor(request, _) | LockCall::Reclaim(request) => {
                state.shadow.set(request)
            }
            LockCall::Unlock(request) => state.shadow.unlock(request),
            LockCall::Release(owner, resource) => state.shadow.release(*owner, *resource),
            LockCall::Test(_) => {}
        }
    }

    /// Takes a lock (for a process of user `uid`, when said), waiting as long as it takes;
    /// [`LockRouter::cancel`] with `tag` ends the wait with `Cancelled`.
    pub async fn wait(
        &self,
        tag: u64,
        request: Request,
        uid: Option<u32>,
    ) -> Result<LockAnswer, LockFailure> {
        self.state().waits.insert(tag, WaitState::default());
        let answer = self.wait_routed(tag, request, uid).await;
        self.state().waits.remove(&tag);
        answer
    }

    async fn wait_routed(
        &self,
        tag: u64,
        request: Request,
        uid: Option<u32>,
    ) -> Result<LockAnswer, LockFailure> {
        let mut retry = Retry::new();
        loop {
            let server = self.route(request.resource);
            let link = match self.link(server).await {
                Ok(link) => Ok(link),
                Err(failure) if retryable(failure.code) => Err(failure),
                Err(failure) => return Err(failure),
            };
            let used = link.as_ref().ok().map(|link| link.session);
            let outcome = match link {
                Ok(link) => {
                    {
                        let mut state = self.state();
                        let wait = state.waits.entry(tag).or_default();
                        if wait.cancelled {
                            return Ok(LockAnswer::failed(
                                LockCode::Cancelled,
                                "the waiting request was cancelled",
                            ));
                        }
                        wait.at = Some((server, link.session));
                    }
                    let outcome = link
                        .client
                        .lock_wait_for(link.session, tag, request, uid)
                        .await;
                    if let Some(wait) = self.state().waits.get_mut(&tag) {
                        wait.at = None;
                    }
                    outcome
                }
                Err(failure) => Err(failure),
            };
            let has_peers = self.state().has_peers;
            let code = match &outcome {
                Ok(answer) => answer.code,
                Err(failure) => failure.code,
            };
            let moved = match used {
                Some(session) if has_peers => self.session_moved(server, session, code).await,
                Some(session) if session_lost(code) => {
                    self.replace_home(session).await;
                    self.home_session() != session
                }
                _ => false,
            };
            // Alone, a wait whose server went away waits on once it is back (it held nothing
            // yet), however long that takes: a signal ends it.
            let waits_on = !has_peers && matches!(code, LockCode::Unavailable | LockCode::Grace);
            let failure = match outcome {
                Ok(answer) if moved || waits_on || again_later(has_peers, answer.code) => {
                    LockFailure::new(answer.code, answer.message)
                }
                Ok(answer) => {
                    if answer.is_ok() {
                        self.state().shadow.set(&request);
                    }
                    return Ok(answer);
                }
                Err(failure) if moved || waits_on || (has_peers && retryable(failure.code)) => {
                    failure
                }
                Err(failure) => return Err(failure),
            };
            if self.state().waits.get(&tag).is_some_and(|w| w.cancelled) {
                return Ok(LockAnswer::failed(
                    LockCode::Cancelled,
                    "the waiting request was cancelled",
                ));
            }
            if !retry.pause().await {
                if !waits_on {
                    return Err(failure);
                }
                tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS_MAX)).await;
            }
            self.refresh(Some(server)).await;
        }
    }

    /// Cancels the blocking request `tag`. True when it was cancelled (or will be, before it
    /// is sent again); false when it is not waiting (answered, or not at its server yet).
    pub async fn cancel(&self, tag: u64) -> Result<bool, LockFailure> {
        let at = {
            let mut state = self.state();
            let Some(wait) = state.waits.get_mut(&tag) else {
                return Ok(false);
            };
            wait.cancelled = true;
            wait.at
        };
        let Some((server, session)) = at else {
            // Between two sends: the next one will not happen.
            return Ok(true);
        };
        let link = self.state().links.get(&server).cloned();
        match link {
            Some(link) if link.session == session => link.client.lock_cancel(session, tag).await,
            _ => Ok(true),
        }
    }

    /// Asks for the view (first of `hint`, then of the home server, then of any member) and,
    /// when it changed, reclaims at their new deciders the locks whose files moved and
    /// reports it to every member. Members that did not accept the report are asked again
    /// at the next refresh.
    pub async fn refresh(&self, hint: Option<u64>) {
        if !self.state().has_peers {
            return;
        }
        let _refreshing = self.refreshing.lock().await;
        let Some(members) = self.ask_members(hint).await else {
            return;
        };
        let mut view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
        view.sort_unstable();
        let (old, moved) = {
            let mut state = self.state();
            for member in &members.servers {
                state.addresses.insert(member.id, member.address.clone());
            }
            if view == state.view || view.is_empty() {
                (None, Vec::new())
            } else {
                let old = state.view.clone();
                let moved: Vec<(u64, Vec<Request>)> = state
                    .shadow
                    .resources()
                    .filter(|r| owner_of(*r, &old) != owner_of(*r, &view))
                    .map(|r| (r, state.shadow.requests(r)))
                    .collect();
                (Some(old), moved)
            }
        };
        if old.is_some() {
            if !self.reclaim(&view, moved).await {
                // Not all reclaimed (a new decider does not agree yet): the view stays as it
                // was, so that the next refresh reclaims again.
                return;
            }
            let mut state = self.state();
            state.view = view.clone();
            state
                .addresses
                .retain(|id, _| view.binary_search(id).is_ok());
            let departed: Vec<u64> = state
                .links
                .keys()
                .copied()
                .filter(|id| view.binary_search(id).is_err() && *id != state.home_id)
                .collect();
            for id in departed {
                if let Some(link) = state.links.remove(&id) {
                    // Still reported: the servers that took its files over wait for it.
                    state.departed.push_back(link.session);
                    if state.departed.len() > DEPARTED_MAX {
                        state.departed.pop_front();
                    }
                }
            }
            state.done_pending = view.iter().copied().collect();
        }
        self.report_done().await;
    }

    async fn ask_members(&self, hint: Option<u64>) -> Option<calm_proto::pb::MembersReply> {
        let mut order: Vec<u64> = hint.into_iter().collect();
        order.push(self.state().home_id);
        {
            let state = self.state();
            order.extend(state.view.iter().copied());
        }
        let mut asked = BTreeSet::new();
        for server in order {
            if !asked.insert(server) {
                continue;
            }
            let client = match self.state().links.get(&server) {
                Some(link) => link.client.clone(),
                None => continue,
            };
            match client.members().await {
                Ok(members) if members.has_peers => return Some(members),
                _ => continue,
            }
        }
        None
    }

    /// Takes the locks of `moved` again at their deciders under `view`. False when one of
    /// them could not be asked (it does not decide the file by its own view yet).
    async fn reclaim(&self, view: &[u64], moved: Vec<(u64, Vec<Request>)>) -> bool {
        let mut by_server: BTreeMap<u64, Vec<Request>> = BTreeMap::new();
        for (resource, requests) in moved {
            if let Some(server) = owner_of(resource, view) {
                by_server.entry(server).or_default().extend(requests);
            }
        }
        let mut all = true;
        for (server, requests) in by_server {
            let link = match self.link_unlocked(server).await {
                Ok(link) => link,
                Err(failure) => {
                    tracing::debug!(server, %failure, "reclaiming locks: no session yet");
                    return false;
                }
            };
            let calls: Vec<LockCall> = requests.iter().map(|r| LockCall::Reclaim(*r)).collect();
            for chunk in calls.chunks(calm_proto::locks::LOCK_BATCH_OPS_MAX) {
                match link.client.lock_batch(link.session, chunk).await {
                    Ok(answers) => {
                        for (call, answer) in chunk.iter().zip(answers) {
                            let LockCall::Reclaim(request) = call else {
                                continue;
                            };
                            match answer.code {
                                LockCode::Ok => {}
                                code if retryable(code) => all = false,
                                _ => {
                                    tracing::warn!(
                                        file = request.resource,
                                        failure = %answer.message,
                                        "a lock could not be reclaimed after its server moved: \
                                         it is lost"
                                    );
                                    self.state().shadow.unlock(request);
                                }
                            }
                        }
                    }
                    Err(failure) => {
                        tracing::debug!(server, %failure, "reclaiming locks");
                        all = false;
                    }
                }
            }
        }
        all
    }

    /// [`LockRouter::link`] for a caller that holds `refreshing` already.
    async fn link_unlocked(&self, server: u64) -> Result<Link, LockFailure> {
        if let Some(link) = self.state().links.get(&server) {
            return Ok(link.clone());
        }
        let address = self
            .state()
            .addresses
            .get(&server)
            .cloned()
            .ok_or_else(|| {
                LockFailure::new(
                    LockCode::Unavailable,
                    format!("server {server:x} is not in this client's view"),
                )
            })?;
        let client = self.home.sibling(&address).await.map_err(|e| {
            LockFailure::new(
                LockCode::Unavailable,
                format!("connecting to {address}: {e}"),
            )
        })?;
        let session = client.open_lock_session(self.lease_ms).await?;
        let link = Link { client, session };
        self.state().links.insert(server, link.clone());
        Ok(link)
    }

    /// Reports the reclaim under the current view to the members that have not accepted it.
    async fn report_done(&self) {
        let (pending, view, sessions) = {
            let state = self.state();
            (
                state.done_pending.iter().copied().collect::<Vec<_>>(),
                state.view.clone(),
                state
                    .links
                    .values()
                    .map(|l| l.session)
                    .chain(state.departed.iter().copied())
                    .collect::<Vec<_>>(),
            )
        };
        for server in pending {
            let link = match self.link_unlocked(server).await {
                Ok(link) => link,
                Err(_) => continue,
            };
            if let Ok(true) = link
                .client
                .reclaim_done(sessions.clone(), view.clone())
                .await
            {
                self.state().done_pending.remove(&server);
            }
        }
    }

    /// Renews every session and follows the view until dropped. A session a server no longer
    /// knows (expired while this process stalled, or the server restarted) is replaced: its
    /// locks are gone, which is logged.
    pub async fn run(self: Arc<Self>) {
        let renew_every = Duration::from_millis((self.lease_ms / 3).max(10));
        let mut renewed = Instant::now();
        loop {
            let poll = match self.state().has_peers {
                true => Duration::from_millis(MEMBERS_POLL_MS).min(renew_every),
                false => renew_every,
            };
            tokio::time::sleep(poll).await;
            self.follow_home().await;
            self.refresh(None).await;
            if renewed.elapsed() >= renew_every {
                renewed = Instant::now();
                self.renew_all().await;
            }
        }
    }

    /// When `home` moved to another server (its own failover), the session there becomes the
    /// home session: the one on the server left behind is reported as departed, and the
    /// client's orphans are claimed by the new one ([`LockRouter::replaced`]).
    async fn follow_home(&self) {
        let address = self.home.server();
        if address.is_none() || address == self.state().home_address {
            return;
        }
        let _refreshing = self.refreshing.lock().await;
        let Ok(members) = self.home.members().await else {
            return;
        };
        let old = self.state().home_id;
        if members.me == old {
            self.state().home_address = address;
            return;
        }
        let existing = self.state().links.get(&members.me).map(|l| l.session);
        let session = match existing {
            Some(session) => session,
            None => match self.home.open_lock_session(self.lease_ms).await {
                Ok(session) => session,
                Err(failure) => {
                    tracing::warn!(%failure, "opening a lock session on the new server");
                    return;
                }
            },
        };
        {
            let mut state = self.state();
            if let Some(link) = state.links.remove(&old) {
                state.departed.push_back(link.session);
                if state.departed.len() > DEPARTED_MAX {
                    state.departed.pop_front();
                }
            }
            state.links.insert(
                members.me,
                Link {
                    client: self.home.clone(),
                    session,
                },
            );
            state.home_id = members.me;
            state.home_address = address;
        }
        tracing::info!(
            server = format!("{:x}", members.me),
            "the mount's server changed"
        );
        self.replaced.notify_one();
    }

    async fn renew_all(&self) {
        let links: Vec<(u64, Link)> = self
            .state()
            .links
            .iter()
            .map(|(id, l)| (*id, l.clone()))
            .collect();
        for (server, link) in links {
            let home = server == self.state().home_id;
            match link.client.keep_alive(link.session).await {
                Ok(_) if home => *self.confirmed.locked() = Instant::now(),
                Ok(_) => {}
                Err(failure) if session_lost(failure.code) => {
                    tracing::warn!(session = link.session, %failure, "lock session lost");
                    if home {
                        self.replace_home(link.session).await;
                    } else {
                        self.state().links.remove(&server);
                    }
                }
                Err(failure) => {
                    tracing::debug!(session = link.session, %failure, "renewing a lock lease")
                }
            }
        }
    }

    /// Ends every session (unmount): the servers release whatever is left.
    pub async fn close(&self) {
        let links: Vec<Link> = self.state().links.values().cloned().collect();
        for link in links {
            if let Err(failure) = link.client.close_lock_session(link.session).await {
                tracing::warn!(%failure, "closing a lock session");
            }
        }
    }
}
