//! Where a client sends a mutation (of names, contents or attributes) when several servers
//! share the namespace: to the one member that commits them all, the server that decides the
//! root directory's locks (`calm_locks::peers::owner_of` over the servers' view). Every commit
//! on the store rewrites its commit key (`docs/design/etcd.md`), so commits are serialized
//! whichever server makes them: two servers committing at once conflict, and the loser runs
//! its whole group again. Sent to one member, the mutations of every client are grouped by one
//! committer instead. This is a choice of route only, never correctness: the store serializes
//! every commit wherever it is sent, so a stale view costs a conflict at worst. Reads stay on
//! the client's own server. A removal that keeps a file the client has open (an orphan of the
//! client's lock session) is routed too: the orphan names the session, and the session's own
//! server sweeps it when the session ends, whichever server committed it.
//!
//! The view is asked of the client's server at the first mutation and again, in the
//! background, when it is older than [`VIEW_REFRESH_MS`]. A client of a server alone on its
//! store, in the server's process, or on a Unix socket (whose peer credentials another
//! server cannot see) sends everything to its own server.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_types::Handle;

use crate::{Client, ClientTls, Conn};

/// The handle whose decider commits the namespace's mutations: every client computes the same
/// member from the same view, and when that member leaves the view another one takes over.
pub const COMMITTER_OF: Handle = calm_types::ROOT;
/// How old a view may be before the client asks for it again, in milliseconds.
pub const VIEW_REFRESH_MS: u64 = 1_000;
/// Longest a connection to another member may take before the mutation goes to the client's
/// own server instead, in milliseconds.
const CONNECT_MS_MAX: u64 = 1_000;
/// How long a member the client could not connect to is left out of the choice (unless the
/// view changes first), in milliseconds: a dead member stays in the view for up to its lease,
/// and without this every mutation for its directories would wait for a connection first.
const UNREACHABLE_MS: u64 = 5_000;

#[derive(Debug, Default)]
struct View {
    asked: Option<Instant>,
    has_peers: bool,
    /// The member the client's own connection reaches.
    me: u64,
    /// Sorted member ids.
    members: Vec<u64>,
    addresses: HashMap<u64, String>,
    /// Connections to other members, made on first use.
    conns: HashMap<u64, Arc<Conn>>,
    /// Members a connection to failed, and when.
    unreachable: HashMap<u64, Instant>,
}

/// Where a client sends its mutations (shared by its clones).
#[derive(Debug)]
pub(crate) struct Committer {
    /// TCP (with this TLS, if any): a Unix-socket client never places elsewhere.
    enabled: bool,
    tls: Option<ClientTls>,
    view: Mutex<View>,
    refreshing: AtomicBool,
}

impl Committer {
    pub fn new(enabled: bool, tls: Option<ClientTls>) -> Committer {
        Committer {
            enabled,
            tls,
            view: Mutex::new(View::default()),
            refreshing: AtomicBool::new(false),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.locked()
    }

    /// Forgets the connection `conn` (it failed): the next mutation for its member connects
    /// again, and the view is asked for again.
    pub fn failed(&self, conn: &Arc<Conn>) {
        let mut view = self.view();
        view.conns.retain(|_, c| !Arc::ptr_eq(c, conn));
        view.asked = None;
    }
}

impl Client {
    /// The connection to the member that commits the namespace's mutations, when it is not this
    /// client's own server; `None`: send to the client's own server.
    pub(crate) async fn placed(&self) -> Option<Arc<Conn>> {
        if self.local.is_some() || !self.committer.enabled {
            return None;
        }
        let asked = self.committer.view().asked;
        match asked {
            None => self.ask_view().await,
            Some(at) if at.elapsed() > Duration::from_millis(VIEW_REFRESH_MS) => {
                if !self.committer.refreshing.swap(true, Ordering::AcqRel) {
                    let client = self.clone();
                    tokio::spawn(async move {
                        client.ask_view().await;
                        client.committer.refreshing.store(false, Ordering::Release);
                    });
                }
            }
            Some(_) => {}
        }
        let owner = {
            let view = self.committer.view();
            let owner = calm_locks::peers::owner_of(COMMITTER_OF, &view.members);
            owner.filter(|o| view.has_peers && *o != view.me)
        };
        self.conn_to(owner?).await
    }

    /// Asks the client's own server for the view (on failure: every mutation goes to its own
    /// server until the next refresh).
    async fn ask_view(&self) {
        // Straight over the connection (not through the call macros, which place).
        let request = self.untagged(calm_proto::pb::Empty {}, None);
        let reply = self
            .conn()
            .locks
            .clone()
            .members(request)
            .await
            .map(tonic::Response::into_inner);
        let mut view = self.committer.view();
        view.asked = Some(Instant::now());
        match reply {
            Ok(members) if members.has_peers => {
                let mut ids: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
                ids.sort_unstable();
                if ids != view.members {
                    view.unreachable.clear();
                }
                view.has_peers = true;
                view.me = members.me;
                view.members = ids;
                view.addresses = members
                    .servers
                    .into_iter()
                    .map(|m| (m.id, m.address))
                    .collect();
                let View {
                    conns, addresses, ..
                } = &mut *view;
                conns.retain(|id, _| addresses.contains_key(id));
            }
            _ => {
                view.has_peers = false;
                view.conns.clear();
            }
        }
    }

    /// The connection to member `id`, made if needed.
    async fn conn_to(&self, id: u64) -> Option<Arc<Conn>> {
        let address = {
            let view = self.committer.view();
            if let Some(conn) = view.conns.get(&id) {
                return Some(conn.clone());
            }
            if view
                .unreachable
                .get(&id)
                .is_some_and(|at| at.elapsed() < Duration::from_millis(UNREACHABLE_MS))
            {
                return None;
            }
            view.addresses.get(&id)?.clone()
        };
        let connecting = Client::connect_with(&address, self.committer.tls.as_ref());
        let connected =
            tokio::time::timeout(Duration::from_millis(CONNECT_MS_MAX), connecting).await;
        let mut view = self.committer.view();
        match connected {
            Ok(Ok(client)) => {
                view.unreachable.remove(&id);
                Some(view.conns.entry(id).or_insert(client.conn()).clone())
            }
            _ => {
                view.unreachable.insert(id, Instant::now());
                None
            }
        }
    }
}
