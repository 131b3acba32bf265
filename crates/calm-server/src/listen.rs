//! The server's listeners, and who is at the other end of each connection, decided once when
//! it is accepted (the requests then carry it: [`Peer`] is the connection's `ConnectInfo`).
//!
//! - A Unix socket (the default, next to the store): the kernel tells the peer's uid, gid and
//!   pid (SO_PEERCRED).
//! - TCP on a loopback address without TLS: the kernel's socket table tells which uid owns
//!   the peer's socket (`socket_owner.rs`, the peer is on this machine); only the superuser's
//!   connections are taken, anyone else is told to use the Unix socket.
//! - TCP with TLS: the client certificate, checked against the client CA, names the peer.
//!
//! Limits: [`CONNECTIONS_MAX`] open connections in all and [`CONNECTIONS_PER_PEER_MAX`] per
//! peer (a uid, a certificate, an address); a TLS handshake must end within
//! [`HANDSHAKE_TIMEOUT`] and so must the client's HTTP/2 preface (counted from the accept,
//! however slowly it trickles in), at most [`IDENTIFYING_MAX`] TCP connections per listener
//! are being identified at once, and a connection that sends nothing for [`IDLE_TIMEOUT`]
//! (pings answered count) is closed. A connection over a limit is closed at once.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tonic::transport::server::Connected;

use crate::connections::{Connections, Refusal};

/// Connections open at once, in all.
pub const CONNECTIONS_MAX: usize = 4096;
/// Connections open at once from one peer (uid, certificate or address).
pub const CONNECTIONS_PER_PEER_MAX: usize = 256;
/// How long a client has from the accept to finish its TLS handshake and send its HTTP/2
/// preface.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may send nothing before it is closed. The server pings every
/// client every [`KEEPALIVE_INTERVAL`], and a live client's answers count: only a peer that
/// is gone or does not speak HTTP/2 is idle this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the server pings a connection (HTTP/2 PING); a ping unanswered for
/// [`KEEPALIVE_TIMEOUT`] closes it.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Accepted connections waiting to be served (the accept loops wait past it).
const ACCEPTED_QUEUE: usize = 64;
/// TCP connections of one listener still being identified (a TLS handshake, the lookup of a
/// loopback peer's uid); more are closed at once.
pub const IDENTIFYING_MAX: usize = 256;

/// Who is at the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A process of this machine on the Unix socket, with its supplementary groups then.
    Local {
        uid: u32,
        gid: u32,
        pid: u32,
        groups: calm_meta::Groups,
    },
    /// A socket of the superuser of this machine, over TCP on loopback.
    LoopbackRoot,
    /// A TLS client whose certificate (signed by the client CA) names it.
    Certificate { name: String },
    /// A connection that is served only to be told why each request is refused (so that the
    /// client sees the reason, not a closed connection).
    Refused { key: String, why: String },
}

impl Peer {
    /// The listener and identity kind of the peer, as indexes of
    /// [`crate::connections::LISTENERS`] and [`crate::connections::IDENTITIES`].
    pub fn kind(&self) -> (usize, usize) {
        match self {
            Peer::Local { uid: 0, .. } => (0, 1),
            Peer::Local { .. } => (0, 0),
            Peer::LoopbackRoot => (1, 1),
            Peer::Certificate { .. } => (2, 2),
            // Only plain TCP refuses a peer on each request (a user's loopback socket).
            Peer::Refused { .. } => (1, 3),
        }
    }

    /// What the per-peer connection limit counts by.
    fn key(&self) -> String {
        match self {
            Peer::Local { uid, .. } => format!("uid:{uid}"),
            Peer::LoopbackRoot => "uid:0".into(),
            Peer::Certificate { name } => format!("cert:{name}"),
            Peer::Refused { key, .. } => format!("refused:{key}"),
        }
    }
}

/// A listener the server accepts on.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    /// Plain TCP: loopback only (checked when the server starts).
    Tcp(TcpListener),
    /// TCP with TLS and client certificates.
    Tls(TcpListener, Arc<crate::tls::TlsServer>),
}

trait Io: AsyncRead + AsyncWrite + Send {}
impl<T: AsyncRead + AsyncWrite + Send> Io for T {}

/// An accepted stream and its peer, or nothing when the peer was refused.
type Accepted = std::io::Result<Option<(Pin<Box<dyn Io>>, Peer)>>;

/// One accepted connection and its peer; leaves the connection counts when dropped.
pub struct Conn {
    io: Pin<Box<dyn Io>>,
    peer: Peer,
    _counted: Counted,
    /// When the connection is closed unless it sends something before.
    idle: Idle,
}

/// Bytes of the HTTP/2 client preface (`PRI * HTTP/2.0…`), which every client sends first.
pub const PREFACE_BYTES: usize = 24;

/// The idle timer of a connection: it fires [`HANDSHAKE_TIMEOUT`] after the connection was
/// accepted unless the client's whole preface ([`PREFACE_BYTES`]) came by then, however it
/// trickled in, and [`IDLE_TIMEOUT`] after the last bytes read once it came. Reads only note
/// the time; the timer is moved when it fires early.
struct Idle {
    sleep: Pin<Box<tokio::time::Sleep>>,
    last_read: Option<tokio::time::Instant>,
    /// Bytes of the preface still to come.
    preface_left: usize,
}

impl Idle {
    fn new(accepted: tokio::time::Instant) -> Idle {
        Idle {
            sleep: Box::pin(tokio::time::sleep_until(accepted + HANDSHAKE_TIMEOUT)),
            last_read: None,
            preface_left: PREFACE_BYTES,
        }
    }

    /// `n` bytes were read.
    fn read(&mut self, n: usize) {
        if self.preface_left > 0 {
            self.preface_left = self.preface_left.saturating_sub(n);
            if self.preface_left > 0 {
                // Still within the handshake's deadline, however little comes at a time.
                return;
            }
        }
        self.last_read = Some(tokio::time::Instant::now());
    }

    /// Whether the connection has been idle too long (registers the waker otherwise).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            match self.last_read {
                Some(at) if at + IDLE_TIMEOUT > tokio::time::Instant::now() => {
                    self.sleep.as_mut().reset(at + IDLE_TIMEOUT);
                }
                _ => return true,
            }
        }
    }
}

impl Conn {
    /// The connection `io` from `peer`, accepted at `accepted` (before a TLS handshake).
    fn new(
        io: Pin<Box<dyn Io>>,
        peer: Peer,
        counted: Counted,
        accepted: tokio::time::Instant,
    ) -> Conn {
        Conn {
            io,
            peer,
            _counted: counted,
            idle: Idle::new(accepted),
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish()
    }
}

impl Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match self.io.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                let read = buf.filled().len() - before;
                self.idle.read(read);
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.idle.expired(cx) => {
                tracing::info!(peer = ?self.peer, "idle connection closed");
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connection idle for too long",
                )))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Open connections, in all and per peer.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<String, usize>,
}

/// A place in the connection counts, given back when dropped.
struct Counted {
    counts: Arc<Mutex<Counts>>,
    key: String,
    /// The connections' figures, and the peer's kind in them.
    figures: Arc<Connections>,
    kind: (usize, usize),
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.figures.closed(self.kind);
        let mut counts = self.counts.locked();
        counts.total -= 1;
        if let Some(n) = counts.per_peer.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.per_peer.remove(&self.key);
            }
        }
    }
}

fn count(counts: &Arc<Mutex<Counts>>, figures: &Arc<Connections>, peer: &Peer) -> Option<Counted> {
    let key = peer.key();
    let kind = peer.kind();
    let mut c = counts.locked();
    let mine = c.per_peer.get(&key).copied().unwrap_or(0);
    if c.total >= CONNECTIONS_MAX || mine >= CONNECTIONS_PER_PEER_MAX {
        let why = match c.total >= CONNECTIONS_MAX {
            true => Refusal::Connections,
            false => Refusal::ConnectionsPerPeer,
        };
        figures.refused(kind.0, why);
        return None;
    }
    c.total += 1;
    *c.per_peer.entry(key.clone()).or_default() += 1;
    figures.opened(kind);
    Some(Counted {
        counts: counts.clone(),
        key,
        figures: figures.clone(),
        kind,
    })
}

/// Binds `addr`: `unix:PATH` (a socket anyone on this machine may connect to; the kernel
/// tells who they are), or `HOST:PORT` (TLS with `tls`; without, only on a loopback
/// address). Returns the listener and its address as clients name it (`unix:/abs/path`,
/// `HOST:PORT` with the port picked when 0 was asked for).
pub async fn bind(
    addr: &str,
    tls: Option<Arc<crate::tls::TlsServer>>,
) -> Result<(Listener, String), String> {
    if let Some(path) = addr.strip_prefix("unix:") {
        let path = std::path::absolute(path).map_err(|e| format!("{addr}: {e}"))?;
        if path.exists() {
            // A socket left by a server that died: nobody answers it any more.
            if tokio::net::UnixStream::connect(&path).await.is_ok() {
                return Err(format!(
                    "{}: another server is listening there",
                    path.display()
                ));
            }
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok((Listener::Unix(listener), format!("unix:{}", path.display())));
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listening on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("listening on {addr}: {e}"))?;
    match tls {
        Some(tls) => Ok((Listener::Tls(listener, tls), local.to_string())),
        None if local.ip().is_loopback() => Ok((Listener::Tcp(listener), local.to_string())),
        None => Err(format!(
            "{local}: a TCP listener beyond loopback needs TLS (--tls-cert, --tls-key, \
             --tls-client-ca): without it anyone who reaches the port could claim any uid"
        )),
    }
}

/// The connections accepted on every listener, each with its peer, as tonic takes them.
pub fn incoming(
    listeners: Vec<Listener>,
    figures: Arc<Connections>,
) -> (
    tokio_stream::wrappers::ReceiverStream<std::io::Result<Conn>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    let counts = Arc::new(Mutex::new(Counts::default()));
    let tasks = listeners
        .into_iter()
        .map(|listener| {
            tokio::spawn(accept_loop(
                listener,
                tx.clone(),
                counts.clone(),
                figures.clone(),
            ))
        })
        .collect();
    (tokio_stream::wrappers::ReceiverStream::new(rx), tasks)
}

async fn accept_loop(
    listener: Listener,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Conn>>,
    counts: Arc<Mutex<Counts>>,
    figures: Arc<Connections>,
) {
    let acceptor = Arc::new(Acceptor {
        listener_index: match &listener {
            Listener::Unix(_) => 0,
            Listener::Tcp(_) => 1,
            Listener::Tls(..) => 2,
        },
        identifying: Arc::new(tokio::sync::Semaphore::new(IDENTIFYING_MAX)),
        tx,
        counts,
        figures,
    });
    loop {
        let accepted: Accepted = match &listener {
            Listener::Unix(l) => match l.accept().await {
                Ok((stream, _)) => Ok(local_peer(&stream).map(|peer| {
                    let io: Pin<Box<dyn Io>> = Box::pin(stream);
                    (io, peer)
                })),
                Err(e) => Err(e),
            },
            Listener::Tcp(l) => match l.accept().await {
                Ok((stream, addr)) => {
                    acceptor.identify_tcp(stream, addr);
                    continue;
                }
                Err(e) => Err(e),
            },
            Listener::Tls(l, tls) => match l.accept().await {
                Ok((stream, addr)) => {
                    acceptor.handshake(tls.clone(), stream, addr);
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        match accepted {
            Ok(Some((io, peer))) => {
                if !acceptor
                    .deliver(io, peer, tokio::time::Instant::now())
                    .await
                {
                    return;
                }
            }
            Ok(None) => acceptor
                .figures
                .refused(acceptor.listener_index, Refusal::Unidentified),
            Err(e) => {
                // EMFILE and the like: wait a little rather than spin.
                tracing::warn!(%e, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if acceptor.tx.is_closed() {
            return;
        }
    }
}

/// What one listener's accepts share: where identified connections go, the counts they enter,
/// the figures, and the places among the connections being identified.
struct Acceptor {
    listener_index: usize,
    identifying: Arc<tokio::sync::Semaphore>,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Conn>>,
    counts: Arc<Mutex<Counts>>,
    figures: Arc<Connections>,
}

impl Acceptor {
    /// A place among the connections being identified, or None (the connection is dropped).
    fn place(&self, addr: SocketAddr) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let place = self.identifying.clone().try_acquire_owned().ok();
        if place.is_none() {
            self.figures
                .refused(self.listener_index, Refusal::Identifying);
            tracing::warn!(%addr, "too many connections being identified: closed");
        }
        place
    }

    /// A TCP connection just accepted: when, set to send without delay, and its place among
    /// those being identified (None: it is dropped).
    fn admit(
        &self,
        stream: &tokio::net::TcpStream,
        addr: SocketAddr,
    ) -> Option<(tokio::time::Instant, tokio::sync::OwnedSemaphorePermit)> {
        let accepted = tokio::time::Instant::now();
        let _ = stream.set_nodelay(true);
        Some((accepted, self.place(addr)?))
    }

    /// Counts an identified connection in and hands it to the server; false once the server
    /// takes no more.
    async fn deliver(
        &self,
        io: Pin<Box<dyn Io>>,
        peer: Peer,
        accepted: tokio::time::Instant,
    ) -> bool {
        match count(&self.counts, &self.figures, &peer) {
            Some(counted) => {
                let conn = Conn::new(io, peer, counted, accepted);
                self.tx.send(Ok(conn)).await.is_ok()
            }
            None => {
                tracing::warn!(?peer, "connection over the limits closed");
                true
            }
        }
    }

    /// A plain TCP connection: who owns the peer socket is read from the kernel's socket
    /// tables, a read of every TCP socket of the machine, on a thread of the blocking pool, for
    /// each connection on a task of its own, so that neither the runtime nor the next accept
    /// waits for it.
    fn identify_tcp(self: &Arc<Self>, stream: tokio::net::TcpStream, addr: SocketAddr) {
        let Some((accepted, place)) = self.admit(&stream, addr) else {
            return;
        };
        let acceptor = self.clone();
        tokio::spawn(async move {
            let _place = place;
            let peer = match stream.local_addr() {
                Ok(local) => tokio::task::spawn_blocking(move || loopback_peer(addr, local))
                    .await
                    .ok()
                    .flatten(),
                Err(_) => None,
            };
            let Some(peer) = peer else {
                acceptor.figures.refused(1, Refusal::Unidentified);
                return;
            };
            acceptor.deliver(Box::pin(stream), peer, accepted).await;
        });
    }

    /// A TLS connection: the handshake runs on a task of its own, bounded in time, so that a
    /// slow client holds up no one; the peer is the name its certificate gives.
    fn handshake(
        self: &Arc<Self>,
        tls: Arc<crate::tls::TlsServer>,
        stream: tokio::net::TcpStream,
        addr: SocketAddr,
    ) {
        let Some((accepted, place)) = self.admit(&stream, addr) else {
            return;
        };
        let acceptor = self.clone();
        tokio::spawn(async move {
            let _place = place;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok((io, name))) => {
                    let peer = Peer::Certificate { name };
                    acceptor.deliver(Box::pin(io), peer, accepted).await;
                }
                Ok(Err(e)) => {
                    acceptor.figures.refused(2, Refusal::Handshake);
                    tracing::info!(%addr, %e, "TLS client refused")
                }
                Err(_) => {
                    acceptor.figures.refused(2, Refusal::Handshake);
                    tracing::info!(%addr, "TLS handshake timed out")
                }
            }
        });
    }
}

fn local_peer(stream: &tokio::net::UnixStream) -> Option<Peer> {
    match stream.peer_cred() {
        Ok(cred) => {
            let pid = cred.pid().unwrap_or(0).max(0) as u32;
            // The groups the process has now; a process that changes them reconnects.
            let groups = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|status| calm_meta::Groups::from_proc_status(&status))
                .unwrap_or_default();
            Some(Peer::Local {
                uid: cred.uid(),
                gid: cred.gid(),
                pid,
                groups,
            })
        }
        Err(e) => {
            tracing::warn!(%e, "the peer of a Unix connection is unknown: closed");
            None
        }
    }
}

/// A plain TCP connection is taken only from the superuser's socket on loopback (anyone
/// else's is told why on every request).
fn loopback_peer(peer: SocketAddr, local: SocketAddr) -> Option<Peer> {
    if !peer.ip().is_loopback() {
        tracing::warn!(%peer, "plain TCP from another machine: closed (TLS is required)");
        return None;
    }
    match crate::socket_owner::socket_owner(peer, local) {
        Some(0) => Some(Peer::LoopbackRoot),
        Some(uid) => {
            tracing::info!(%peer, uid, "plain TCP from an unprivileged user: refused");
            Some(Peer::Refused {
                key: format!("uid:{uid}"),
                why: format!(
                    "plain TCP is taken from the superuser only (this connection is uid {uid}'s): \
                     connect to the server's Unix socket, which tells the server who you are"
                ),
            })
        }
        None => {
            tracing::warn!(%peer, "the owner of a loopback connection is unknown: closed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_peer() {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let figures = Arc::new(Connections::default());
        let peer = Peer::Local {
            uid: 7,
            gid: 7,
            pid: 1,
            groups: calm_meta::Groups::default(),
        };
        let held: Vec<Counted> = (0..CONNECTIONS_PER_PEER_MAX)
            .map(|_| count(&counts, &figures, &peer).expect("under the limit"))
            .collect();
        assert!(
            count(&counts, &figures, &peer).is_none(),
            "one over the per-peer limit"
        );
        assert!(
            count(&counts, &figures, &Peer::LoopbackRoot).is_some(),
            "another peer"
        );
        assert_eq!(figures.open(0, 0), CONNECTIONS_PER_PEER_MAX as i64);
        assert_eq!(figures.refusals(0, Refusal::ConnectionsPerPeer), 1);
        drop(held);
        assert_eq!(figures.open(0, 0), 0, "closed");
        assert!(
            count(&counts, &figures, &peer).is_some(),
            "given back when closed"
        );
    }
}
