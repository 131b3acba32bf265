//! Which uid owns the peer's end of a loopback TCP connection.
//!
//! The kernel's socket diagnostics (`sock_diag`, netlink; what `ss` uses) look up the one
//! socket by its addresses: a few microseconds, whatever the number of sockets. Reading
//! `/proc/net/tcp{,6}` instead walks the whole established-connection hash table again for
//! every 4 KiB read (262 144 buckets on a 24 GiB machine): about 7 ms per table with a few
//! hundred sockets, on the thread accepting the connection. The tables remain the fallback
//! for a kernel without `inet_diag`.

use std::net::{IpAddr, SocketAddr};

/// The uid owning the TCP socket whose local end is `their` and remote end `ours`.
pub fn socket_owner(their: SocketAddr, ours: SocketAddr) -> Option<u32> {
    match diag::owner(their, ours) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(%e, "socket diagnostics unavailable: reading the socket tables");
            socket_owner_from_tables(their, ours)
        }
    }
}

/// [`socket_owner`] from the text tables, when the kernel answers no socket diagnostics.
fn socket_owner_from_tables(their: SocketAddr, ours: SocketAddr) -> Option<u32> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        if let Some(uid) = owner_in(&text, their, ours) {
            return Some(uid);
        }
    }
    None
}

/// [`socket_owner`] in the text of one table.
fn owner_in(table: &str, their: SocketAddr, ours: SocketAddr) -> Option<u32> {
    let (local, remote) = (proc_addr(their), proc_addr(ours));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let matches = fields.get(1).is_some_and(|l| local.iter().any(|a| a == l))
            && fields.get(2).is_some_and(|r| remote.iter().any(|a| a == r));
        if matches {
            fields.get(7)?.parse().ok()
        } else {
            None
        }
    })
}

/// How `/proc/net/tcp{,6}` writes `addr` (IPv4 in tcp and as a mapped address in tcp6).
fn proc_addr(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let v6 = |bytes: [u8; 16]| {
        let words: String = bytes
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        format!("{words}:{port:04X}")
    };
    match addr.ip() {
        IpAddr::V4(ip) => vec![
            format!("{:08X}:{port:04X}", u32::from_ne_bytes(ip.octets())),
            v6(ip.to_ipv6_mapped().octets()),
        ],
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => proc_addr(SocketAddr::new(IpAddr::V4(v4), port)),
            None => vec![v6(ip.octets())],
        },
    }
}

/// The kernel's socket diagnostics over netlink (`linux/inet_diag.h`).
mod diag {
    use std::net::{IpAddr, SocketAddr};

    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLMSG_ERROR: u16 = 2;
    const NLM_F_REQUEST: u16 = 1;
    const HEADER: usize = 16;
    /// `inet_diag_req_v2`: family, protocol, ext, pad, states, then the socket id.
    const REQUEST: usize = 8 + SOCKID;
    /// `inet_diag_sockid`: ports, source and destination (4 words each), interface, cookie.
    const SOCKID: usize = 4 + 16 + 16 + 4 + 8;
    /// Offset of `idiag_uid` in `inet_diag_msg`: 4 bytes, the socket id, expires, queues.
    const UID_AT: usize = 4 + SOCKID + 12;

    fn words(ip: IpAddr) -> [u8; 16] {
        match ip {
            IpAddr::V4(v4) => {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&v4.octets());
                bytes
            }
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    /// The request for the socket `src` → `dst` of `family`.
    fn request(family: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
        let mut message = Vec::with_capacity(HEADER + REQUEST);
        message.extend_from_slice(&((HEADER + REQUEST) as u32).to_ne_bytes());
        message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        message.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        message.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        message.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        message.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
        message.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
        message.extend_from_slice(&src.port().to_be_bytes());
        message.extend_from_slice(&dst.port().to_be_bytes());
        message.extend_from_slice(&words(src.ip()));
        message.extend_from_slice(&words(dst.ip()));
        message.extend_from_slice(&0u32.to_ne_bytes()); // any interface
        message.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
        message
    }

    /// The uid in the kernel's answer; `Ok(None)` when it has no such socket.
    pub(super) fn parse(answer: &[u8]) -> std::io::Result<Option<u32>> {
        let field = |at: usize, len: usize| {
            answer.get(at..at + len).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "short sock_diag answer")
            })
        };
        let kind = u16::from_ne_bytes(field(4, 2)?.try_into().expect("2 bytes"));
        if kind == NLMSG_ERROR {
            let errno = i32::from_ne_bytes(field(HEADER, 4)?.try_into().expect("4 bytes"));
            return match -errno {
                libc::ENOENT => Ok(None),
                errno => Err(std::io::Error::from_raw_os_error(errno)),
            };
        }
        if kind != SOCK_DIAG_BY_FAMILY {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("sock_diag answered message type {kind}"),
            ));
        }
        let uid = field(HEADER + UID_AT, 4)?;
        Ok(Some(u32::from_ne_bytes(uid.try_into().expect("4 bytes"))))
    }

    /// Asks the kernel for one socket; `Ok(None)`: there is none.
    fn ask(family: u8, src: SocketAddr, dst: SocketAddr) -> std::io::Result<Option<u32>> {
        // SAFETY: a plain socket(2) call; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let message = request(family, src, dst);
        // SAFETY: `message` is valid for its length; the kernel is the destination.
        let sent = unsafe { libc::send(raw, message.as_ptr().cast(), message.len(), 0) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: `timeout` is a valid timeval for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let mut answer = [0u8; 8192];
        // SAFETY: `answer` is valid for writes of its length.
        let got = unsafe { libc::recv(raw, answer.as_mut_ptr().cast(), answer.len(), 0) };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        parse(&answer[..got as usize])
    }

    /// The owner of the socket `their` → `ours`, as an IPv4 socket (mapped addresses
    /// unmapped) or else an IPv6 one.
    pub(super) fn owner(their: SocketAddr, ours: SocketAddr) -> std::io::Result<Option<u32>> {
        let v4 = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => Some(SocketAddr::new(IpAddr::V4(ip), a.port())),
            IpAddr::V6(ip) => ip
                .to_ipv4_mapped()
                .map(|ip| SocketAddr::new(IpAddr::V4(ip), a.port())),
        };
        if let (Some(src), Some(dst)) = (v4(their), v4(ours))
            && let Some(uid) = ask(libc::AF_INET as u8, src, dst)?
        {
            return Ok(Some(uid));
        }
        let v6 = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        ask(libc::AF_INET6 as u8, v6(their), v6(ours))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn the_owner_of_a_loopback_socket_is_found() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, peer) = listener.accept().await.unwrap();
            assert_eq!(peer, client.local_addr().unwrap());
            let uid = socket_owner(peer, server.local_addr().unwrap());
            // SAFETY: getuid(2) cannot fail.
            assert_eq!(uid, Some(unsafe { libc::getuid() }));
        });
    }

    #[test]
    fn a_proc_table_line_is_read() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when \
                     retrnsmt   uid  timeout inode\n   0: 0100007F:C350 0100007F:1F90 01 \
                     00000000:00000000 00:00000000 00000000  1000        0 12345\n";
        let their: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        let ours: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(owner_in(table, their, ours), Some(1000));
        assert_eq!(owner_in(table, ours, their), None);
    }

    #[test]
    fn the_diagnostics_and_the_tables_agree_and_a_missing_socket_is_none() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let from_diag = diag::owner(peer, addr).expect("sock_diag answers");
        assert!(from_diag.is_some());
        assert_eq!(from_diag, socket_owner_from_tables(peer, addr));
        // The other direction is the server's socket, which is not the peer's: the listener
        // side socket of the same connection exists too, so ask for a port nobody uses.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(diag::owner(nobody, addr).unwrap(), None);
        assert!(diag::parse(&[0u8; 8]).is_err(), "not an answer");
        assert!(diag::parse(&[0u8; 3]).is_err(), "short");
    }
}
