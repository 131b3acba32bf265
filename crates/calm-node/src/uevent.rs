//! Kernel uevents from NETLINK_KOBJECT_UEVENT (no udevd needed), and the kernel's uevent
//! sequence number.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One kernel uevent (the fields the agent uses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: String,
    /// The /dev name (DEVNAME), when the device has a node.
    pub devname: Option<String>,
    pub seqnum: u64,
    pub major: Option<u32>,
    pub minor: Option<u32>,
}

/// What receiving said.
#[derive(Debug)]
pub enum Received {
    Event(Uevent),
    /// The socket's buffer overflowed (ENOBUFS): events were lost.
    Lost,
    /// Nothing within the timeout.
    Idle,
}

/// Socket receive buffer asked for (as root, beyond the system limit): a boot of thousands of
/// disks sends a burst of events.
pub const RCVBUF_BYTES: i32 = 64 << 20;

#[derive(Debug)]
pub struct UeventSocket {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl UeventSocket {
    /// Opens and binds the socket to the kernel's uevent group.
    pub fn open() -> io::Result<UeventSocket> {
        // SAFETY: socket(2) with constants; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_KOBJECT_UEVENT,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = RCVBUF_BYTES;
        // SAFETY: setsockopt(2) with an int option; a failure leaves the default buffer.
        unsafe {
            if libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const i32).cast(),
                4,
            ) != 0
            {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&size as *const i32).cast(),
                    4,
                );
            }
        }
        // SAFETY: sockaddr_nl is plain data.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = 1; // the kernel's group (udevd's is 2)
        // SAFETY: bind(2) with a valid sockaddr_nl of its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(UeventSocket {
            fd,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Waits up to `timeout_ms` for the next event.
    pub fn recv(&mut self, timeout_ms: i32) -> io::Result<Received> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n == 0 {
            return Ok(Received::Idle);
        }
        // SAFETY: recv(2) into our buffer of its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOBUFS) => Ok(Received::Lost),
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(Received::Idle),
                _ => Err(e),
            };
        }
        Ok(match parse(&self.buf[..n as usize]) {
            Some(event) => Received::Event(event),
            None => Received::Idle,
        })
    }
}

/// Parses a kernel uevent message: `action@devpath\0KEY=VALUE\0…`.
pub fn parse(msg: &[u8]) -> Option<Uevent> {
    let mut parts = msg.split(|b| *b == 0).filter(|p| !p.is_empty());
    let head = std::str::from_utf8(parts.next()?).ok()?;
    head.split_once('@')?; // udevd's messages start with "libudev": not ours
    let mut event = Uevent::default();
    for part in parts {
        let Ok(text) = std::str::from_utf8(part) else {
            continue;
        };
        let Some((key, value)) = text.split_once('=') else {
            continue;
        };
        match key {
            "ACTION" => event.action = value.to_string(),
            "DEVPATH" => event.devpath = value.to_string(),
            "SUBSYSTEM" => event.subsystem = value.to_string(),
            "DEVNAME" => event.devname = Some(value.to_string()),
            "SEQNUM" => event.seqnum = value.parse().ok()?,
            "MAJOR" => event.major = value.parse().ok(),
            "MINOR" => event.minor = value.parse().ok(),
            _ => {}
        }
    }
    Some(event)
}

/// The kernel's uevent sequence number now.
pub fn seqnum() -> io::Result<u64> {
    std::fs::read_to_string("/sys/kernel/uevent_seqnum")?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("uevent_seqnum: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_uevent_parses_and_udevd_messages_are_skipped() {
        let msg = b"change@/devices/virtual/block/loop3\0ACTION=change\0DEVPATH=/devices/virtual/block/loop3\0SUBSYSTEM=block\0MAJOR=7\0MINOR=3\0DEVNAME=loop3\0DEVTYPE=disk\0SEQNUM=4242\0";
        let e = parse(msg).unwrap();
        assert_eq!(e.action, "change");
        assert_eq!(e.subsystem, "block");
        assert_eq!(e.devname.as_deref(), Some("loop3"));
        assert_eq!((e.major, e.minor, e.seqnum), (Some(7), Some(3), 4242));
        assert!(parse(b"libudev\0\xfe\xed\xca\xfe").is_none());
    }
}
