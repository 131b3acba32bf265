//! `calm-client`: the Rust client of calm's metadata server. Each method mirrors one of the
//! namespace's (calm-meta's `Meta`) and returns the same [`MetaError`] the server's namespace
//! returned, so code written against the in-process namespace reads the same against a
//! remote one.
//!
//! A [`Client`] is one HTTP/2 connection; clones share it and may be used from many tasks at
//! once (requests are multiplexed). One made with [`Client::connect_servers`] moves to another
//! server of its list when its connection is lost (`failover`).
//!
//! Its calls by family: `connection` (connecting, moving on, request ids), `namespace`,
//! `contents` (maps, writes, appends), `lock_calls`, `changelog_calls`, `watch`, `admin`
//! (status, targets); `batch` queues namespace calls into batches, `routing` sends lock calls
//! to the server deciding each file, `committer` sends mutations to the one server that
//! commits them.

pub mod batch;
pub mod clone;
mod committer;
pub mod failover;
pub mod routing;
mod shadow;
pub mod trash;

use calm_changelog::{Record, User, UserId};
use calm_locks::{Holder, Request as LockRequest, SessionId};
use calm_proto::changelog::{
    GID_KEY, GROUPS_KEY, SESSION_KEY, UID_KEY, record_from_wire, user_from_wire,
};
use calm_proto::locks::{
    LockAnswer, LockCall, LockFailure, holder_from_wire, lock_failure_from_status, owner_from_wire,
    scope_from_wire,
};
use calm_proto::pb::changelog_client::ChangelogClient;
use calm_proto::pb::locks_client::LocksClient;
use calm_proto::pb::meta_client::MetaClient;
use calm_proto::pb::targets_client::TargetsClient;
use calm_proto::pb::watch_client::WatchClient;
use calm_proto::{MESSAGE_BYTES_MAX, error_from_status, pb};
use calm_types::sync::RwLocked;
use calm_types::{Attr, Caller, DirEntry, FileMap, Handle, MetaError, NewNode, SetAttr, StatFs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::transport::Channel;

pub use calm_proto::pb::StatusReply;
pub use committer::COMMITTER_OF;

/// Where a namespace keeps its file contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataInfo {
    pub objects_url: String,
    /// The namespace's identity (32 hex digits): caches of its objects are kept per identity.
    pub namespace_id: String,
}

pub use calm_types::{QuotaLimits, QuotaTarget};

pub type Result<T, E = MetaError> = std::result::Result<T, E>;

/// The stream of a watch served in this process.
pub type LocalWatchStream =
    tokio_stream::wrappers::ReceiverStream<std::result::Result<pb::WatchBatch, tonic::Status>>;

/// The stream of recalls of files held, served in this process.
pub type LocalRecallStream =
    tokio_stream::wrappers::ReceiverStream<std::result::Result<pb::Recalls, tonic::Status>>;

/// The namespace, lock and watch services of a server in this process, called directly: no
/// connection, no encoding, the same requests and answers as over the wire (the embedded
/// mount's path; `calm_server::Server` hands them out).
#[derive(Clone)]
pub struct InProcess {
    pub meta: Arc<dyn pb::meta_server::Meta<HoldsStream = LocalRecallStream>>,
    pub locks: Arc<dyn pb::locks_server::Locks>,
    pub watch: Arc<dyn pb::watch_server::Watch<WatchStream = LocalWatchStream>>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

/// Sends `$message` with `$method` (in-process through `local.$local`, else with
/// `$remote`, which names the connection `$conn` and the request `$request`): tagged with the
/// caller and, for a mutation, a request id; sent again on another server of the client's
/// list when the connection is lost (`failover`).
///
/// `$placed`: a mutation sent to the member that commits the namespace's mutations when
/// several servers share it (`committer.rs`); if that connection is lost, a mutation with a
/// request id is sent again to the client's own server (one without is answered the error:
/// it may have been applied).
macro_rules! rpc_call {
    ($client:expr, $local:ident, $make:ident, |$conn:ident, $request:ident| $remote:expr, $method:ident, $message:expr, $id:expr, $placed:expr) => {
        rpc_call!(
            $client,
            $local,
            $make,
            |$conn, $request| $remote,
            $method,
            $message,
            $id,
            $placed,
            true,
            true
        )
    };
    // `$fresh`: the request id was made for this call, which marks it answered when it ends
    // (else its holder does: `failover::HeldRequest`). `$bounded`: the call gives up when no
    // answer came within `failover::ANSWER_MS_MAX` (a server that stopped answering without
    // closing its connection); only a lock wait and the calls that read the whole namespace
    // are not.
    ($client:expr, $local:ident, $make:ident, |$conn:ident, $request:ident| $remote:expr, $method:ident, $message:expr, $id:expr, $placed:expr, $fresh:expr, $bounded:expr) => {{
        // The changes the mount answered itself go first (`outbox`).
        $client.after_outbox().await;
        let message = $message;
        let id = $id;
        let _in_flight =
            crate::failover::InFlight::new($client.failover.clone().filter(|_| $fresh), id);
        let mut placing: bool = $placed;
        let mut budget = crate::failover::Budget::default();
        let reply = loop {
            let mut $request = $client.$make(message.clone(), id);
            let placed = match placing {
                true => $client.placed().await,
                false => None,
            };
            let $conn = placed.clone().unwrap_or_else(|| $client.conn());
            let reply = match &$client.local {
                Some(local) => {
                    $request.extensions_mut().insert(calm_proto::InProcess);
                    local.$local.$method($request).await
                }
                None => budget.bound($bounded, async { $remote }).await,
            };
            if let Err(status) = &reply {
                if placed.is_some() && crate::failover::connection_lost(status) {
                    $client.committer.failed(&$conn);
                    if id.is_some() {
                        placing = false;
                        continue;
                    }
                    break reply;
                }
                if $client.move_on(status, &$conn, &mut budget).await {
                    continue;
                }
            }
            break reply;
        };
        reply
    }};
}

/// Calls a namespace RPC: on the server in this process if there is one, else over the
/// connection. `mutation`: with a request id.
macro_rules! meta_call {
    ($client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn.rpc.clone().$method(request).await,
            $method,
            $message,
            None,
            false
        )
    };
    // A call that reads the whole namespace: as long as it takes.
    (unbounded $client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn.rpc.clone().$method(request).await,
            $method,
            $message,
            None,
            false,
            true,
            false
        )
    };
    (mutation placed, $client:expr, $method:ident, $message:expr) => {
        meta_call!(mutation placed if true, $client, $method, $message)
    };
    // `$placed`: whether the mutation is sent to the member that commits (`committer.rs`).
    (mutation placed if $placed:expr, $client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn.rpc.clone().$method(request).await,
            $method,
            $message,
            $client.next_request(),
            $placed
        )
    };
    (mutation $client:expr, $method:ident, $message:expr) => {
        meta_call!(mutation placed if false, $client, $method, $message)
    };
}

/// [`meta_call`] for the namespace calls a batch may carry (`Meta.Batch`): over the
/// connection, they go through the client's [`batch::Batcher`] as the call `$op`.
macro_rules! batched_call {
    ($client:expr, $method:ident, $op:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn
                .batch
                .call(request, calm_proto::pb::call::Op::$op)
                .await,
            $method,
            $message,
            None,
            false
        )
    };
    (mutation placed, $client:expr, $method:ident, $op:ident, $message:expr) => {
        batched_call!(mutation placed if true, $client, $method, $op, $message)
    };
    // `$placed`: whether the mutation is sent to the member that commits (`committer.rs`).
    (mutation placed if $placed:expr, $client:expr, $method:ident, $op:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn
                .batch
                .call(request, calm_proto::pb::call::Op::$op)
                .await,
            $method,
            $message,
            $client.next_request(),
            $placed
        )
    };
    (mutation $client:expr, $method:ident, $op:ident, $message:expr) => {
        batched_call!(mutation placed if false, $client, $method, $op, $message)
    };
    // A mutation sent to the member that commits with a request id its caller holds
    // (`failover::HeldRequest`): the same id however many times the caller sends it.
    (mutation placed held $id:expr, $client:expr, $method:ident, $op:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn
                .batch
                .call(request, calm_proto::pb::call::Op::$op)
                .await,
            $method,
            $message,
            $id,
            true,
            false,
            true
        )
    };
}

/// [`meta_call`] for the lock service.
macro_rules! locks_call {
    ($client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            locks,
            untagged,
            |conn, request| conn.locks.clone().$method(request).await,
            $method,
            $message,
            None,
            false
        )
    };
    (indexed $client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            locks,
            with_index,
            |conn, request| conn.locks.clone().$method(request).await,
            $method,
            $message,
            None,
            false
        )
    };
    // A lock wait: as long as it takes (a signal cancels it).
    (indexed unbounded $client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            locks,
            with_index,
            |conn, request| conn.locks.clone().$method(request).await,
            $method,
            $message,
            None,
            false,
            true,
            false
        )
    };
}

/// A connection to a metadata server.
#[derive(Debug, Clone)]
pub struct Client {
    /// The namespace and lock services in this process, used instead of the connection's.
    local: Option<InProcess>,
    /// The connection, replaced when the client moves to another server (shared by clones).
    conn: Arc<std::sync::RwLock<Arc<Conn>>>,
    /// The servers it may move to, and its request ids (`connect_servers`).
    failover: Option<Arc<failover::Failover>>,
    /// Where its mutations go when several servers share the namespace (shared by clones).
    committer: Arc<committer::Committer>,
    /// Sent with every mutation, for its changelog record.
    caller: Option<Caller>,
    /// The job of the calling process, sent with every request (the server counts its load
    /// per job).
    job: Option<Arc<str>>,
    /// The highest changelog index a mutation of this client (or its clones) answered with.
    reached: Arc<AtomicU64>,
    /// The changes its mount answered itself, which its requests wait for (shared by clones).
    outbox: Option<Arc<outbox::Outbox>>,
}

/// A file's locks and waiting requests as the server lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockListing {
    pub locks: Vec<Holder>,
    /// `(wait id, session, request)` in arrival order.
    pub waiting: Vec<(u64, SessionId, LockRequest)>,
    /// Every lock held, even past what one reply carries.
    pub total: u64,
}

fn check_lock<T>(
    reply: std::result::Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, LockFailure> {
    reply
        .map(tonic::Response::into_inner)
        .map_err(|status| lock_failure_from_status(&status))
}

/// An unlink's or a rename's answer: the file kept as an orphan, and the directory's
/// attributes when the server sent them.
fn removed(reply: pb::RemovedReply) -> Result<(Option<Handle>, Option<Attr>)> {
    let orphan = (reply.orphan != 0).then_some(reply.orphan);
    Ok((orphan, reply.dir.map(Attr::try_from).transpose()?))
}

fn check<T>(reply: std::result::Result<tonic::Response<T>, tonic::Status>) -> Result<T> {
    reply
        .map(tonic::Response::into_inner)
        .map_err(|status| error_from_status(&status))
}

/// How a changelog read waits for records (the server's long poll): until `min_records` are
/// there, or, when some are, `linger_us` after the request; with none by then, up to
/// `wait_ms` for the first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowWait {
    pub wait_ms: u32,
    pub min_records: u32,
    pub linger_us: u32,
}

impl Client {
    // ---- file contents ----

    // ---- changelog ----

    // ---- target registry ----
}

// After the macros, which they use.
mod admin;
mod changelog_calls;
pub use changelog_calls::CL_EACH_BATCH_RECORDS;
mod connection;
mod contents;
mod holds;
mod lock_calls;
mod namespace;
pub use namespace::{Held, make_request};
pub mod outbox;
mod quota_calls;
mod tls;
mod watch;
use connection::Conn;
pub use holds::RecallStream;
pub use tls::{ClientTls, TLS_ENV};
pub use watch::{Watch, WatchEvent, WatchWhat};
