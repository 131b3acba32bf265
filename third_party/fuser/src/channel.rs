use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;

use crate::dev_fuse::DevFuse;
use crate::passthrough::BackingId;

/// A raw communication channel to the FUSE kernel driver
/// calm: with the observer its replies are reported to, if any.
#[derive(Debug, Clone)]
pub(crate) struct Channel(Arc<DevFuse>, Option<Observer>);

/// calm: the observer of a session's replies (see [`crate::ReplyObserver`]).
#[derive(Clone)]
pub(crate) struct Observer(pub(crate) Arc<dyn crate::ReplyObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Channel {
    /// Create a new communication channel to the kernel driver by mounting the
    /// given path. The kernel driver will delegate filesystem operations of
    /// the given path to the channel.
    pub(crate) fn new(device: Arc<DevFuse>) -> Self {
        Self(device, None)
    }

    /// calm: reports every reply sent through this channel (and its clones made after) to
    /// `observer`.
    pub(crate) fn observe(&mut self, observer: Arc<dyn crate::ReplyObserver>) {
        self.1 = Some(Observer(observer));
    }

    /// Receives data up to the capacity of the given buffer (can block).
    fn receive(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        nix::unistd::read(&self.0, buffer)
    }

    /// Receives data up to the capacity of the given buffer (can block),
    /// retrying on errors that are safe to retry (ENOENT, EINTR, EAGAIN).
    ///
    /// - ENOENT: Operation interrupted. According to FUSE, this is safe to retry.
    /// - EINTR: Interrupted system call, retry.
    /// - EAGAIN: Explicitly instructed to try again.
    pub(crate) fn receive_retrying(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        loop {
            match self.receive(buffer) {
                Ok(size) => return Ok(size),
                Err(Errno::ENOENT | Errno::EINTR | Errno::EAGAIN) => continue,
                Err(err) => return Err(err),
            }
        }
    }

    /// Returns a sender object for this channel. The sender object can be
    /// used to send to the channel. Multiple sender objects can be used
    /// and they can safely be sent to other threads.
    pub(crate) fn sender(&self) -> ChannelSender {
        // Since write/writev syscalls are threadsafe, we can simply create
        // a sender by using the same file and use it in other threads.
        ChannelSender {
            device: self.0.clone(),
            observer: self.1.clone(),
            request: None,
            ring: None,
        }
    }

    /// Clone the FUSE device fd using FUSE_DEV_IOC_CLONE ioctl.
    ///
    /// This creates a new fd that can read FUSE requests independently,
    /// enabling true parallel request processing. The kernel distributes
    /// requests across all cloned fds.
    ///
    /// Requires Linux 4.5+. Returns an error on older kernels or non-Linux.
    #[cfg(target_os = "linux")]
    pub(crate) fn clone_fd(&self) -> io::Result<Channel> {
        use std::os::fd::AsRawFd;

        let new_dev = DevFuse::open()?;

        let mut source_fd = self.0.as_raw_fd() as u32;
        // SAFETY: fuse_dev_ioc_clone is a valid ioctl for /dev/fuse
        unsafe {
            crate::ll::ioctl::fuse_dev_ioc_clone(new_dev.as_raw_fd(), &mut source_fd)?;
        }

        Ok(Channel(Arc::new(new_dev), self.1.clone()))
    }
}

/// calm: with the observer of replies and, for a request's reply, its opcode and when it was
/// read.
#[derive(Clone, Debug)]
pub(crate) struct ChannelSender {
    device: Arc<DevFuse>,
    observer: Option<Observer>,
    request: Option<(u32, Instant)>,
    /// calm: for a request that came through a ring, the entry its answer goes to.
    ring: Option<crate::uring::RingReply>,
}

impl ChannelSender {
    /// calm: the sender of the reply to a request of `opcode` read at `started`.
    pub(crate) fn for_request(self, opcode: u32, started: Instant) -> ChannelSender {
        ChannelSender {
            request: self.observer.is_some().then_some((opcode, started)),
            ..self
        }
    }

    /// calm: the sender of the answer to a request that came through a ring.
    pub(crate) fn on_ring(self, reply: crate::uring::RingReply) -> ChannelSender {
        ChannelSender {
            ring: Some(reply),
            ..self
        }
    }

    pub(crate) fn send(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<()> {
        if let Some(ring) = &self.ring {
            ring.send(bufs)?;
        } else {
            let rc = nix::sys::uio::writev(&self.device, bufs)?;
            // writev is atomic, so do not need to check how many bytes are written.
            // libfuse does not do it either
            // https://github.com/libfuse/libfuse/blob/6278995cca991978abd25ebb2c20ebd3fc9e8a13/lib/fuse_lowlevel.c#L267
            debug_assert_eq!(bufs.iter().map(|b| b.len()).sum::<usize>(), rc);
        }
        if let (Some(observer), Some((opcode, started))) = (&self.observer, self.request) {
            // The reply's header: its length, then the error (minus an errno, or 0).
            let error = bufs
                .first()
                .and_then(|header| header.get(4..8))
                .and_then(|bytes| bytes.try_into().ok())
                .map_or(0, i32::from_ne_bytes);
            observer.0.replied(opcode, started, error.saturating_neg());
        }
        Ok(())
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> std::io::Result<BackingId> {
        BackingId::create(&self.device, fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { BackingId::wrap_raw(&self.device, id) }
    }
}
