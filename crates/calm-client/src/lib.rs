//! `calm-client`: the Rust client of calm's metadata server. Each method mirrors one of
//! [`calm_types::Meta`] and returns the same [`MetaError`] the server's namespace returned, so
//! code written against the in-process namespace reads the same against a remote one.
//!
//! A [`Client`] is one HTTP/2 connection; clones share it and may be used from many tasks at
//! once (requests are multiplexed). One made with [`Client::connect_servers`] moves to another
//! server of its list when its connection is lost (`failover`).

pub mod batch;
pub mod failover;
mod placement;
pub mod routing;
mod shadow;

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
pub use placement::COMMITTER_OF;

/// Where a namespace keeps its file contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataInfo {
    pub objects_url: String,
    /// The namespace's identity (32 hex digits): caches of its objects are kept per identity.
    pub namespace_id: String,
}

pub type Result<T, E = MetaError> = std::result::Result<T, E>;

/// The stream of a watch served in this process.
pub type LocalWatchStream =
    tokio_stream::wrappers::ReceiverStream<std::result::Result<pb::WatchBatch, tonic::Status>>;

/// The namespace, lock and watch services of a server in this process, called directly: no
/// connection, no encoding, the same requests and answers as over the wire (the embedded
/// mount's path; `calm_server::Server` hands them out).
#[derive(Clone)]
pub struct InProcess {
    pub meta: Arc<dyn pb::meta_server::Meta>,
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
/// several servers share it (`placement.rs`); if that connection is lost, a mutation with a
/// request id is sent again to the client's own server (one without is answered the error:
/// it may have been applied).
macro_rules! rpc_call {
    ($client:expr, $local:ident, $make:ident, |$conn:ident, $request:ident| $remote:expr, $method:ident, $message:expr, $id:expr, $placed:expr) => {{
        let message = $message;
        let id = $id;
        let _in_flight = crate::failover::InFlight::new($client.failover.clone(), id);
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
                None => $remote,
            };
            if let Err(status) = &reply {
                if placed.is_some() && crate::failover::connection_lost(status) {
                    $client.placement.failed(&$conn);
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
    (mutation $client:expr, $method:ident, $message:expr) => {
        rpc_call!(
            $client,
            meta,
            tagged,
            |conn, request| conn.rpc.clone().$method(request).await,
            $method,
            $message,
            $client.next_request(),
            false
        )
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
    // `$placed`: whether the mutation is sent to the member that commits (`placement.rs`).
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
}

/// What a client presents over TLS: the CA that signed the server's certificate, and its
/// own certificate and key (PEM files; the certificate's name says what it is: `admin`,
/// `mount:NAME`, `user:UID[:GID]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The name the server's certificate must carry (default: the address's host).
    pub domain: Option<String>,
}

/// Environment variables that give [`Client::connect`] its TLS files: the CA of the server's
/// certificate, the client certificate and its key.
pub const TLS_ENV: [&str; 3] = ["CALM_TLS_CA", "CALM_TLS_CERT", "CALM_TLS_KEY"];

impl ClientTls {
    /// The files named by [`TLS_ENV`], when all three are set; an error when only some are.
    pub fn from_env() -> Result<Option<ClientTls>> {
        let [ca, cert, key] = TLS_ENV.map(std::env::var_os);
        match (ca, cert, key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(ClientTls {
                ca: ca.into(),
                cert: cert.into(),
                key: key.into(),
                domain: None,
            })),
            (None, None, None) => Ok(None),
            _ => Err(MetaError::Invalid(format!(
                "set all of {} for TLS, or none",
                TLS_ENV.join(", ")
            ))),
        }
    }

    fn config(&self) -> Result<tonic::transport::ClientTlsConfig> {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| MetaError::Invalid(format!("reading {}: {e}", path.display())))
        };
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca)?))
            .identity(tonic::transport::Identity::from_pem(
                read(&self.cert)?,
                read(&self.key)?,
            ));
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}

/// One connection to a server, with a stub per service.
#[derive(Debug)]
struct Conn {
    rpc: MetaClient<Channel>,
    locks: LocksClient<Channel>,
    changelog: ChangelogClient<Channel>,
    watch: WatchClient<Channel>,
    targets: TargetsClient<Channel>,
    /// Namespace calls over the connection, batched (shared by the client's clones).
    batch: Arc<batch::Batcher>,
}

impl Conn {
    fn new(channel: Channel) -> Conn {
        let rpc = MetaClient::new(channel.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        Conn {
            batch: batch::Batcher::new(rpc.clone()),
            rpc,
            locks: LocksClient::new(channel.clone())
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
            changelog: ChangelogClient::new(channel.clone())
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
            targets: TargetsClient::new(channel.clone()),
            watch: WatchClient::new(channel)
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
        }
    }
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
    placement: Arc<placement::Placement>,
    /// Sent with every mutation, for its changelog record.
    caller: Option<Caller>,
    /// The highest changelog index a mutation of this client (or its clones) answered with.
    reached: Arc<AtomicU64>,
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
    /// Connects to `addr`: `unix:PATH` (a server's Unix socket on this machine, which tells
    /// the server who this process is), `HOST:PORT` or a full `http://` URI (plain TCP: a
    /// server takes it from root on loopback only), over TLS when the environment names the
    /// files ([`TLS_ENV`]).
    pub async fn connect(addr: &str) -> Result<Client> {
        if addr.contains(',') {
            let addrs: Vec<String> = addr.split(',').map(str::to_string).collect();
            return Self::connect_servers(&addrs).await;
        }
        let tls = match addr.starts_with("unix:") {
            true => None,
            false => ClientTls::from_env()?,
        };
        Self::connect_with(addr, tls.as_ref()).await
    }

    /// [`Client::connect`], over TLS with the client certificate of `tls` when given
    /// (`HOST:PORT` or `https://`).
    pub async fn connect_with(addr: &str, tls: Option<&ClientTls>) -> Result<Client> {
        let connecting =
            |e: &dyn std::fmt::Display| MetaError::Io(format!("connecting to {addr}: {e}"));
        if let Some(path) = addr.strip_prefix("unix:") {
            let path = std::path::PathBuf::from(path);
            // The URI is not used: every connection is made to the socket.
            let endpoint = tonic::transport::Endpoint::from_static("http://localhost");
            let channel = endpoint
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(&path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(|e| connecting(&e))?;
            return Ok(Self::from_channel(channel));
        }
        let uri = if addr.contains("://") {
            addr.to_string()
        } else if tls.is_some() {
            format!("https://{addr}")
        } else {
            format!("http://{addr}")
        };
        let mut endpoint = Channel::from_shared(uri)
            .map_err(|e| MetaError::Invalid(format!("server address {addr:?}: {e}")))?
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.config()?)
                .map_err(|e| MetaError::Invalid(format!("TLS for {addr}: {e}")))?;
        }
        let channel = endpoint.connect().await.map_err(|e| connecting(&e))?;
        let mut client = Self::from_channel(channel);
        client.placement = Arc::new(placement::Placement::new(true, tls.cloned()));
        Ok(client)
    }

    /// A client over an existing channel.
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            local: None,
            conn: Arc::new(std::sync::RwLock::new(Arc::new(Conn::new(channel)))),
            failover: None,
            placement: Arc::new(placement::Placement::new(false, None)),
            caller: None,
            reached: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Connects to the first of `addrs` that answers (each as [`Client::connect`] takes it);
    /// when the connection is lost, the client moves to the next one that answers and sends
    /// again what was in flight, mutations with their request ids.
    pub async fn connect_servers(addrs: &[String]) -> Result<Client> {
        let tls = match addrs.iter().all(|a| a.starts_with("unix:")) {
            true => None,
            false => ClientTls::from_env()?,
        };
        Self::connect_servers_with(addrs, tls.as_ref()).await
    }

    /// [`Client::connect_servers`] with the client certificate of `tls` for TCP addresses.
    pub async fn connect_servers_with(addrs: &[String], tls: Option<&ClientTls>) -> Result<Client> {
        if addrs.is_empty() {
            return Err(MetaError::Invalid("no server named".into()));
        }
        let tls = tls.cloned();
        let mut last = None;
        for (i, addr) in addrs.iter().enumerate() {
            match Self::connect_with(addr, tls.as_ref()).await {
                Ok(mut client) => {
                    client.failover = Some(Arc::new(failover::Failover::new(
                        addrs.to_vec(),
                        tls.clone(),
                        i,
                    )));
                    return Ok(client);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one address was tried"))
    }

    /// The address of the server this client is connected to, when it has a list.
    pub fn server(&self) -> Option<String> {
        let failover = self.failover.as_ref()?;
        let at = failover.at.load(Ordering::Acquire) as usize;
        failover.addrs.get(at).cloned()
    }

    fn conn(&self) -> Arc<Conn> {
        self.conn.read_locked().clone()
    }

    fn next_request(&self) -> Option<calm_types::RequestId> {
        self.failover.as_ref().map(|f| f.next_request())
    }

    /// Sends a request over the connection with `send`, again on another server of the list
    /// when the connection is lost (the calls that have no in-process path: changelog and
    /// targets).
    async fn remote<T, F, Fut>(&self, send: F) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let mut budget = failover::Budget::default();
        loop {
            let conn = self.conn();
            match send(conn.clone()).await {
                Err(status) if self.move_on(&status, &conn, &mut budget).await => continue,
                reply => return reply,
            }
        }
    }

    /// After `status` on a request sent over `used`: whether to send it again, on another
    /// server (moving there first if no other request did already), within `budget`.
    async fn move_on(
        &self,
        status: &tonic::Status,
        used: &Arc<Conn>,
        budget: &mut failover::Budget,
    ) -> bool {
        let Some(failover) = &self.failover else {
            return false;
        };
        if self.local.is_some() || !failover::connection_lost(status) || !budget.left() {
            return false;
        }
        let mut last_move = failover.moving.lock().await;
        if !Arc::ptr_eq(&self.conn(), used) {
            // Another request moved already.
            return true;
        }
        let interval = std::time::Duration::from_millis(failover::MOVE_INTERVAL_MS_MIN);
        if let Some(at) = *last_move
            && at.elapsed() < interval
        {
            tokio::time::sleep(interval - at.elapsed()).await;
        }
        let count = failover.addrs.len();
        let from = failover.at.load(Ordering::Acquire) as usize;
        while budget.left() {
            for step in 1..=count {
                let at = (from + step) % count;
                let addr = &failover.addrs[at];
                let connecting = Self::connect_with(addr, failover.tls.as_ref());
                let timeout = std::time::Duration::from_millis(failover::CONNECT_MS_MAX);
                if let Ok(Ok(client)) = tokio::time::timeout(timeout, connecting).await {
                    let conn = client.conn();
                    *self.conn.write_locked() = conn;
                    failover.at.store(at as u64, Ordering::Release);
                    failover.moves.fetch_add(1, Ordering::Relaxed);
                    *last_move = Some(std::time::Instant::now());
                    tracing::warn!(
                        from = %failover.addrs[from],
                        to = %addr,
                        %status,
                        "the connection to the server was lost; moved to another"
                    );
                    return true;
                }
            }
            failover::round_pause().await;
        }
        false
    }

    /// This client, calling the namespace and lock services of `local` (a server in this
    /// process) directly; changelog, watch and target requests still go over the connection.
    pub fn in_process(self, local: InProcess) -> Client {
        Client {
            local: Some(local),
            ..self
        }
    }

    /// This client, naming `caller` (session, uid, gid) in every mutation it sends; the
    /// server records it in the mutation's changelog record.
    pub fn with_caller(&self, caller: Caller) -> Client {
        Client {
            caller: Some(caller),
            ..self.clone()
        }
    }

    /// The highest changelog index a mutation or a lock answer of this client (or a clone)
    /// carried: once a watch stream has passed it, every change this client made, and every
    /// change made before a lock it was granted, is in the stream.
    pub fn reached(&self) -> u64 {
        self.reached.load(Ordering::Acquire)
    }

    /// [`check`] for a mutation: notes the changelog index it reached.
    fn mutated<T>(
        &self,
        reply: std::result::Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T> {
        self.note_index(&reply);
        check(reply)
    }

    /// Notes the changelog index an answer says the namespace reached (mutations, and lock
    /// answers: what a lock's previous holder committed is at or below it).
    fn note_index<T>(&self, reply: &std::result::Result<tonic::Response<T>, tonic::Status>) {
        if let Ok(response) = reply
            && let Some(index) = response
                .metadata()
                .get(calm_proto::INDEX_KEY)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        {
            self.reached.fetch_max(index, Ordering::AcqRel);
        }
    }

    fn tagged<T>(&self, message: T, id: Option<calm_types::RequestId>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(id) = id {
            request.metadata_mut().insert(
                calm_proto::REQUEST_KEY,
                id.to_text().parse().expect("hex digits are valid metadata"),
            );
        }
        if let Some(caller) = &self.caller {
            let metadata = request.metadata_mut();
            for (key, value) in [
                (SESSION_KEY, caller.session.to_string()),
                (UID_KEY, caller.uid.to_string()),
                (GID_KEY, caller.gid.to_string()),
            ] {
                metadata.insert(key, value.parse().expect("digits are valid metadata"));
            }
            if !caller.groups.as_slice().is_empty() {
                let groups: Vec<String> = caller
                    .groups
                    .as_slice()
                    .iter()
                    .map(u32::to_string)
                    .collect();
                metadata.insert(
                    GROUPS_KEY,
                    groups.join(",").parse().expect("digits are valid metadata"),
                );
            }
        }
        request
    }

    pub async fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Attr> {
        let request = pb::LookupRequest {
            parent,
            name: name.to_vec(),
        };
        check(batched_call!(self, lookup, Lookup, request))?.try_into()
    }

    pub async fn getattr(&self, handle: Handle) -> Result<Attr> {
        check(batched_call!(
            self,
            get_attr,
            GetAttr,
            pb::HandleRequest { handle }
        ))?
        .try_into()
    }

    pub async fn setattr(&self, handle: Handle, attr: &SetAttr) -> Result<Attr> {
        let request = calm_proto::setattr_to_wire(handle, attr);
        self.mutated(batched_call!(mutation self, set_attr, SetAttr, request))?
            .try_into()
    }

    pub async fn make(
        &self,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
        exclusive: bool,
    ) -> Result<Attr> {
        Ok(self.make_in_dir(parent, name, node, exclusive).await?.0)
    }

    /// [`Client::make`], with `parent`'s attributes right after it when the server sent them.
    pub async fn make_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
        exclusive: bool,
    ) -> Result<(Attr, Option<Attr>)> {
        let request = pb::MakeRequest {
            parent,
            name: name.to_vec(),
            kind: node.kind as u32,
            mode: node.mode,
            uid: node.uid,
            gid: node.gid,
            rdev: node.rdev,
            target: node.target.clone(),
            exclusive,
        };
        calm_proto::entry_from_wire(self.mutated(batched_call!(
            mutation placed,
            self,
            make,
            Make,
            request
        ))?)
    }

    pub async fn create(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, &NewNode::file(mode, 0, 0), true)
            .await
    }

    pub async fn mkdir(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, &NewNode::dir(mode, 0, 0), true)
            .await
    }

    pub async fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Attr> {
        Ok(self.link_in_dir(handle, parent, name).await?.0)
    }

    /// [`Client::link`], with `parent`'s attributes right after it when the server sent them.
    pub async fn link_in_dir(
        &self,
        handle: Handle,
        parent: Handle,
        name: &[u8],
    ) -> Result<(Attr, Option<Attr>)> {
        let request = pb::LinkRequest {
            handle,
            parent,
            name: name.to_vec(),
        };
        calm_proto::entry_from_wire(self.mutated(batched_call!(
            mutation placed,
            self,
            link,
            Link,
            request
        ))?)
    }

    pub async fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.unlink_keeping(parent, name, Vec::new())
            .await
            .map(|_| ())
    }

    /// Unlink, keeping the file as an orphan of this client's session if it loses its last
    /// name and is one of `keep` (files the caller has open): returns it then.
    pub async fn unlink_keeping(
        &self,
        parent: Handle,
        name: &[u8],
        keep: Vec<Handle>,
    ) -> Result<Option<Handle>> {
        Ok(self.unlink_in_dir(parent, name, keep).await?.0)
    }

    /// [`Client::unlink_keeping`], with `parent`'s attributes right after it when the server
    /// sent them.
    pub async fn unlink_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        keep: Vec<Handle>,
    ) -> Result<(Option<Handle>, Option<Attr>)> {
        // A file kept open is an orphan of this client's session, on its own server.
        let placed = keep.is_empty();
        let request = pb::RemoveRequest {
            parent,
            name: name.to_vec(),
            keep,
        };
        removed(
            self.mutated(batched_call!(mutation placed if placed, self, unlink, Unlink, request))?,
        )
    }

    /// The caller's mount closed orphan `handle`: it is destroyed.
    pub async fn release_orphan(&self, handle: Handle) -> Result<()> {
        let request = pb::HandleRequest { handle };
        check(meta_call!(self, release_orphan, request)).map(|_| ())
    }

    /// This client's session takes over these orphans of its mount's lost session.
    pub async fn claim_orphans(&self, handles: Vec<Handle>) -> Result<()> {
        let request = pb::OrphansRequest { handles };
        check(meta_call!(self, claim_orphans, request)).map(|_| ())
    }

    pub async fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let request = pb::RemoveRequest {
            parent,
            name: name.to_vec(),
            keep: Vec::new(),
        };
        self.mutated(batched_call!(mutation placed, self, rmdir, Rmdir, request))
            .map(|_| ())
    }

    pub async fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.rename_keeping(parent, name, new_parent, new_name, flags, Vec::new())
            .await
            .map(|_| ())
    }

    /// Rename, keeping a replaced file as [`Client::unlink_keeping`] does.
    pub async fn rename_keeping(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
        keep: Vec<Handle>,
    ) -> Result<Option<Handle>> {
        Ok(self
            .rename_in_dir(parent, name, new_parent, new_name, flags, keep)
            .await?
            .0)
    }

    /// [`Client::rename_keeping`], with the directory's attributes right after it when both
    /// names are in one directory and the server sent them.
    pub async fn rename_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
        keep: Vec<Handle>,
    ) -> Result<(Option<Handle>, Option<Attr>)> {
        let placed = keep.is_empty();
        let request = pb::RenameRequest {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
            keep,
        };
        removed(
            self.mutated(batched_call!(mutation placed if placed, self, rename, Rename, request))?,
        )
    }

    pub async fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        Ok(check(meta_call!(self, readlink, pb::HandleRequest { handle }))?.target)
    }

    pub async fn readdir(
        &self,
        dir: Handle,
        after_cookie: u64,
        limit: u32,
    ) -> Result<Vec<DirEntry>> {
        let request = pb::ReadDirRequest {
            handle: dir,
            after_cookie,
            limit,
            plus: false,
        };
        check(meta_call!(self, read_dir, request))?
            .entries
            .into_iter()
            .map(DirEntry::try_from)
            .collect()
    }

    /// [`Client::readdir`] with each entry's attributes (None where the caller may read the
    /// directory but not search it), on one snapshot.
    pub async fn readdir_plus(
        &self,
        dir: Handle,
        after_cookie: u64,
        limit: u32,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let request = pb::ReadDirRequest {
            handle: dir,
            after_cookie,
            limit,
            plus: true,
        };
        check(meta_call!(self, read_dir, request))?
            .entries
            .into_iter()
            .map(|mut e| {
                let attr = e.attr.take().map(Attr::try_from).transpose()?;
                Ok((DirEntry::try_from(e)?, attr))
            })
            .collect()
    }

    pub async fn setxattr(
        &self,
        handle: Handle,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        let request = pb::SetXattrRequest {
            handle,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.mutated(meta_call!(mutation self, set_xattr, request))
            .map(|_| ())
    }

    pub async fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        let request = pb::XattrRequest {
            handle,
            name: name.to_vec(),
        };
        Ok(check(meta_call!(self, get_xattr, request))?.value)
    }

    pub async fn listxattr(&self, handle: Handle) -> Result<Vec<Vec<u8>>> {
        Ok(check(meta_call!(self, list_xattr, pb::HandleRequest { handle }))?.names)
    }

    pub async fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        let request = pb::XattrRequest {
            handle,
            name: name.to_vec(),
        };
        self.mutated(meta_call!(mutation self, remove_xattr, request))
            .map(|_| ())
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        let s = check(meta_call!(self, stat_fs, pb::Empty {}))?;
        Ok(StatFs {
            inodes: s.inodes,
            file_bytes: s.file_bytes,
            store_bytes: s.store_bytes,
            name_len_max: s.name_len_max,
        })
    }

    pub async fn status(&self) -> Result<StatusReply> {
        check(meta_call!(self, status, pb::Empty {}))
    }

    // ---- file contents ----

    /// The URL of the namespace's object store and the namespace's identity.
    pub async fn data_info(&self) -> Result<DataInfo> {
        let reply = check(meta_call!(self, data_info, pb::Empty {}))?;
        Ok(DataInfo {
            objects_url: reply.objects_url,
            namespace_id: reply.namespace_id,
        })
    }

    /// A file's attributes and whole slice map, read on one snapshot when it fits one reply
    /// (65 536 records); a larger map is read in parts, again from the start whenever the file
    /// changed between two of them, so the map is always one version of the file.
    pub async fn read_map(&self, handle: Handle) -> Result<FileMap> {
        const TRIES_MAX: u32 = 16;
        'again: for _ in 0..TRIES_MAX {
            let mut map: Option<FileMap> = None;
            let mut from_chunk = 0;
            loop {
                let request = pb::ReadMapRequest {
                    handle,
                    from_chunk,
                    max_records: 0,
                };
                let reply = check(batched_call!(self, read_map, ReadMap, request))?;
                let attr: Attr = reply
                    .attr
                    .ok_or_else(|| MetaError::Io("a map without attributes".into()))?
                    .try_into()?;
                let mut chunks: Vec<(u64, Vec<calm_types::slices::Slice>)> = Vec::new();
                for record in &reply.records {
                    let (chunk, slice) = calm_proto::slice_from_wire(record);
                    match chunks.last_mut() {
                        Some((c, slices)) if *c == chunk => slices.push(slice),
                        _ => chunks.push((chunk, vec![slice])),
                    }
                }
                let next = chunks.last().map(|(c, _)| c + 1);
                let inline: Vec<(u64, Vec<u8>)> =
                    reply.inline.into_iter().map(|b| (b.id, b.data)).collect();
                match &mut map {
                    None => {
                        map = Some(FileMap {
                            attr,
                            chunks,
                            more: false,
                            inline,
                        })
                    }
                    Some(map) => {
                        let same = |a: &Attr, b: &Attr| {
                            a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.size == b.size
                        };
                        if !same(&map.attr, &attr) {
                            continue 'again;
                        }
                        map.chunks.extend(chunks);
                        map.inline.extend(inline);
                    }
                }
                match (reply.more, next) {
                    (true, Some(next)) => from_chunk = next,
                    _ => return Ok(map.expect("set above")),
                }
            }
        }
        Err(MetaError::Busy(format!(
            "file {handle} kept changing while its map was read ({TRIES_MAX} tries)"
        )))
    }

    /// Places slice records in a file and makes it at least `end` bytes long; `inline` holds
    /// the bytes of the records' inline slices, by id.
    pub async fn write(
        &self,
        handle: Handle,
        records: &[(u64, calm_types::slices::Slice)],
        end: u64,
        inline: Vec<(u64, Vec<u8>)>,
    ) -> Result<Attr> {
        let request = pb::WriteRequest {
            handle,
            records: records
                .iter()
                .map(|(chunk, s)| calm_proto::slice_to_wire(*chunk, s))
                .collect(),
            end,
            inline: inline
                .into_iter()
                .map(|(id, data)| pb::InlineBytes { id, data })
                .collect(),
        };
        self.mutated(batched_call!(mutation self, write, Write, request))?
            .try_into()
    }

    /// Places the whole of object `id` at the end of the file; with `inline`, the bytes of
    /// inline slice `id` (refused as not supported where the file's inline bytes may not be).
    pub async fn append(
        &self,
        handle: Handle,
        id: u64,
        size: u32,
        inline: Option<Vec<u8>>,
    ) -> Result<Attr> {
        let request = pb::AppendRequest {
            handle,
            id,
            size,
            inline,
        };
        self.mutated(meta_call!(mutation self, append, request))?
            .try_into()
    }

    /// `count` new slice ids; returns the first.
    pub async fn alloc_slices(&self, count: u64) -> Result<u64> {
        let request = pb::AllocSlicesRequest { count };
        Ok(check(meta_call!(self, alloc_slices, request))?.first)
    }

    // ---- changelog ----

    /// Registers a changelog reader; `mask` is Lustre's type names, comma-separated (empty:
    /// DEFAULT).
    pub async fn changelog_register(&self, name: &str, mask: &str) -> Result<User> {
        let request = pb::ClRegisterRequest {
            name: name.to_string(),
            mask: mask.to_string(),
        };
        user_from_wire(&check(
            self.conn().changelog.clone().register(request).await,
        )?)
    }

    pub async fn changelog_deregister(&self, id: UserId) -> Result<User> {
        let request = pb::ClUserRequest { id };
        user_from_wire(&check(
            self.conn().changelog.clone().deregister(request).await,
        )?)
    }

    /// The last index, the first stored, the global mask and every reader.
    pub async fn changelog_users(&self) -> Result<pb::ClUsersReply> {
        check(
            self.remote(|conn| {
                let request = pb::Empty {};
                async move { conn.changelog.clone().users(request).await }
            })
            .await,
        )
    }

    /// Records from `from` (after what `user` cleared, within its mask); when there are none
    /// yet, waits up to `wait_ms` for some. Returns them and the last index.
    pub async fn changelog_read(
        &self,
        from: u64,
        max_records: u32,
        user: Option<UserId>,
        wait_ms: u32,
    ) -> Result<(Vec<Record>, u64)> {
        self.changelog_follow(
            from,
            max_records,
            user,
            FollowWait {
                wait_ms,
                ..FollowWait::default()
            },
        )
        .await
    }

    /// [`Client::changelog_read`] for a batching follower: see [`FollowWait`].
    pub async fn changelog_follow(
        &self,
        from: u64,
        max_records: u32,
        user: Option<UserId>,
        wait: FollowWait,
    ) -> Result<(Vec<Record>, u64)> {
        let request = pb::ClReadRequest {
            from,
            max_records,
            max_bytes: 0,
            user,
            wait_ms: wait.wait_ms,
            min_records: wait.min_records,
            linger_us: wait.linger_us,
        };
        let reply = check(
            self.remote(|conn| async move { conn.changelog.clone().read(request).await })
                .await,
        )?;
        let records = reply
            .records
            .iter()
            .map(record_from_wire)
            .collect::<Result<_>>()?;
        Ok((records, reply.last))
    }

    pub async fn changelog_clear(&self, id: UserId, index: u64) -> Result<User> {
        let request = pb::ClClearRequest { id, index };
        user_from_wire(&check(
            self.remote(|conn| async move { conn.changelog.clone().clear(request).await })
                .await,
        )?)
    }

    pub async fn changelog_set_mask(&self, id: UserId, mask: &str) -> Result<User> {
        let request = pb::ClMaskRequest {
            id,
            mask: mask.to_string(),
        };
        user_from_wire(&check(
            self.remote(|conn| {
                let request = request.clone();
                async move { conn.changelog.clone().set_mask(request).await }
            })
            .await,
        )?)
    }

    // ---- target registry ----

    /// Registers a node's targets (soft state; `complete`: every target the node holds).
    pub async fn register_targets(&self, registration: pb::TargetRegistration) -> Result<()> {
        check(
            self.remote(|conn| {
                let request = registration.clone();
                async move { conn.targets.clone().register(request).await }
            })
            .await,
        )
        .map(|_| ())
    }

    /// Every registered target.
    pub async fn list_targets(&self) -> Result<Vec<pb::TargetEntry>> {
        Ok(check(
            self.remote(|conn| {
                let request = pb::Empty {};
                async move { conn.targets.clone().list(request).await }
            })
            .await,
        )?
        .targets)
    }
}

// After the macros, which they use.
mod lock_calls;
mod watch;
pub use watch::{Watch, WatchEvent, WatchWhat};
