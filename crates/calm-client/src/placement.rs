//! Where a client sends a mutation (of names, contents or attributes) when several servers
//! share the namespace: to the one member that commits them all, the server that decides the
//! root directory's locks (`calm_locks::cluster::owner_of` over the servers' view). Every commit on the store
//! rewrites its commit key (`docs/design/etcd.md`), so commits are serialized whichever
//! server makes them: two servers committing at once conflict, and the loser runs its whole
//! group again. Sent to one member, the mutations of every client are grouped by one
//! committer instead. This is placement only, never correctness: the store serializes every
//! commit wherever it is sent, so a stale view costs a conflict at worst. Reads stay on the
//! client's own server. A removal that keeps a file the client has open (an orphan of the
//! client's lock session) is placed too: the orphan names the session, and the session's own
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
/// How long a member the client could not connect to is left out of placement (unless the
/// view changes first), in milliseconds: a dead member stays in the view for up to its lease,
/// and without this every mutation for its directories would wait for a connection first.
const UNREACHABLE_MS: u64 = 5_000;

#[derive(Debug, Default)]
struct View {
    asked: Option<Instant>,
    clustered: bool,
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

/// A client's placement of mutations (shared by its clones).
#[derive(Debug)]
pub(crate) struct Placement {
    /// TCP (with this TLS, if any): a Unix-socket client never places elsewhere.
    enabled: bool,
    tls: Option<ClientTls>,
    view: Mutex<View>,
    refreshing: AtomicBool,
}

impl Placement {
    pub fn new(enabled: bool, tls: Option<ClientTls>) -> Placement {
        Placement {
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
        if self.local.is_some() || !self.placement.enabled {
            return None;
        }
        let asked = self.placement.view().asked;
        match asked {
            None => self.ask_view().await,
            Some(at) if at.elapsed() > Duration::from_millis(VIEW_REFRESH_MS) => {
                if !self.placement.refreshing.swap(true, Ordering::AcqRel) {
                    let client = self.clone();
                    tokio::spawn(async move {
                        client.ask_view().await;
                        client.placement.refreshing.store(false, Ordering::Release);
                    });
                }
            }
            Some(_) => {}
        }
        let owner = {
            let view = self.placement.view();
            let owner = calm_locks::cluster::owner_of(COMMITTER_OF, &view.members);
            owner.filter(|o| view.clustered && *o != view.me)
        };
        self.conn_to(owner?).await
    }

    /// Asks the client's own server for the view (on failure: no placement until the next
    /// refresh).
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
        let mut view = self.placement.view();
        view.asked = Some(Instant::now());
        match reply {
            Ok(members) if members.clustered => {
                let mut ids: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
                ids.sort_unstable();
                if ids != view.members {
                    view.unreachable.clear();
                }
                view.clustered = true;
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
                view.clustered = false;
                view.conns.clear();
            }
        }
    }

    /// The connection to member `id`, made if needed.
    async fn conn_to(&self, id: u64) -> Option<Arc<Conn>> {
        let address = {
            let view = self.placement.view();
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
        let connecting = Client::connect_with(&address, self.placement.tls.as_ref());
        let connected =
            tokio::time::timeout(Duration::from_millis(CONNECT_MS_MAX), connecting).await;
        let mut view = self.placement.view();
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
