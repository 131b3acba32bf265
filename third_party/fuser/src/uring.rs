//! calm: FUSE over io_uring (Linux 6.14, with the fuse module's `enable_uring` set).
//!
//! Once the handshake agreed on it, each CPU gets a queue: an io_uring whose entries each
//! own a header buffer and a payload buffer registered with the kernel. The kernel writes a
//! request into a free entry of the queue of the CPU its caller runs on and completes that
//! entry's command; the answer goes back in the same buffers with a command that also asks
//! for the entry's next request (`COMMIT_AND_FETCH`). Forgets and interrupts still come
//! through the device, as do requests sent before every queue registered.
//!
//! Order: every completion of every queue is taken under one lock and dispatched in the
//! order the kernel numbered the requests (`unique`); releases and lock requests are
//! dispatched under that lock, and the device's reader takes it (and takes every queue's
//! completions first) before it dispatches an interrupt. So an interrupt finds the request it
//! names, and a lock request does not overtake a release posted before it. A ring posts a
//! request only when its thread runs, though: a release the kernel sent first can still come
//! after a lock request taken from another ring, and the file system must allow for it.
//!
//! Limits: [`QUEUE_DEPTH`] requests in progress per CPU (a request waiting for a lock holds
//! its entry until it is answered); each entry's payload is as large as the largest request
//! or reply the handshake allows, and its pages are only touched by requests that fill them.

use std::alloc::Layout;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll::fuse_abi as abi;
use crate::ll::fuse_abi::fuse_opcode;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// Requests one queue (one CPU) has in progress at most.
pub(crate) const QUEUE_DEPTH: usize = 64;

/// The kernel's command codes (`enum fuse_uring_cmd`).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: the request's or answer's header, the operation's own
/// header, then `struct fuse_uring_ent_in_out`.
const IN_OUT_BYTES: usize = 128;
const OP_IN_BYTES: usize = 128;
const ENT_IN_OUT_AT: usize = IN_OUT_BYTES + OP_IN_BYTES;
const HEADER_BYTES: usize = ENT_IN_OUT_AT + 32;
/// Where `commit_id` and `payload_sz` sit in `fuse_uring_ent_in_out`.
const COMMIT_ID_AT: usize = ENT_IN_OUT_AT + 8;
const PAYLOAD_SZ_AT: usize = ENT_IN_OUT_AT + 16;
const PAGE: usize = 4096;

/// The completion that tells a queue's thread to stop.
const STOP: u64 = u64::MAX;

const IN_HEADER_BYTES: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER_BYTES: usize = size_of::<abi::fuse_out_header>();
const _: () = assert!(IN_HEADER_BYTES <= IN_OUT_BYTES && HEADER_BYTES <= PAGE);
const _: () = assert!(size_of::<squeue::Entry128>() == 128);

/// A buffer at a fixed address that the kernel reads and writes (so never moved, never
/// borrowed as a Rust reference while the kernel may write it).
struct Buffer {
    at: *mut u8,
    layout: Layout,
}

// SAFETY: the memory is owned by this value; who may touch it when is the entry's protocol
// (see `Entry`).
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(len: usize) -> io::Result<Buffer> {
        let layout = Layout::from_size_align(len.max(PAGE), PAGE)
            .map_err(|_| io::Error::other("ring buffer size"))?;
        // SAFETY: the layout has a non-zero size.
        let at = unsafe { std::alloc::alloc_zeroed(layout) };
        if at.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(Buffer { at, layout })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    /// Copies `len` bytes from `at`.
    ///
    /// # Safety
    /// The kernel is not writing the buffer (its entry holds a request not yet answered).
    unsafe fn read(&self, at: usize, out: &mut Vec<u8>, len: usize) {
        assert!(at + len <= self.len());
        // SAFETY: in bounds (above); nothing writes it meanwhile (the caller's promise).
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(self.at.add(at), len) });
    }

    /// # Safety
    /// As for [`Buffer::read`]; and nothing else writes the buffer meanwhile.
    unsafe fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len());
        // SAFETY: in bounds (above); the caller holds the entry.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at.add(at), bytes.len()) };
    }

    fn u32_at(&self, at: usize) -> u32 {
        assert!(at + 4 <= self.len());
        // SAFETY: in bounds (above); read only while the entry holds a request (the callers').
        unsafe { std::ptr::read_unaligned(self.at.add(at).cast::<u32>()) }
    }

    fn u64_at(&self, at: usize) -> u64 {
        assert!(at + 8 <= self.len());
        // SAFETY: as for `u32_at`.
        unsafe { std::ptr::read_unaligned(self.at.add(at).cast::<u64>()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout; the ring that used it is gone (queues drop
        // their ring before their entries).
        unsafe { std::alloc::dealloc(self.at, self.layout) };
    }
}

/// One entry of a queue: its buffers, and the request it holds.
///
/// Protocol: the kernel writes a request into the buffers and completes the entry's command;
/// from then until the answer is submitted only this side touches them (the request is
/// copied out before it is dispatched; the one answer that finds `commit_id` still set writes
/// them, under the queue's submission lock). After the answer the kernel owns them again.
struct Entry {
    header: Buffer,
    payload: Buffer,
    /// The two buffers, as the register command hands them to the kernel.
    iov: [libc::iovec; 2],
    /// The request held (its `unique`, the answer's commit id), or 0 when none.
    commit_id: AtomicU64,
}

// SAFETY: `iov` only points at the entry's own buffers.
unsafe impl Send for Entry {}
unsafe impl Sync for Entry {}

/// One CPU's ring.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Held while the submission queue is written and submitted.
    submitting: std::sync::Mutex<()>,
    entries: Vec<Entry>,
    fd: i32,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({})", self.qid)
    }
}

/// An answer's place: the queue and entry of the request, and its commit id.
#[derive(Clone, Debug)]
pub(crate) struct RingReply {
    queue: Arc<Queue>,
    index: usize,
    commit_id: u64,
}

impl RingReply {
    /// Sends the answer `bufs` (the out header, then the body) through the request's entry,
    /// unless the request was already answered (then it is dropped, as the kernel drops a
    /// second answer on the device).
    pub(crate) fn send(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<()> {
        let queue = &self.queue;
        let entry = &queue.entries[self.index];
        let body_len: usize = bufs.iter().skip(1).map(|b| b.len()).sum();
        let _submitting = queue.submitting.lock().unwrap_or_else(|e| e.into_inner());
        if entry
            .commit_id
            .compare_exchange(self.commit_id, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            debug!("a second answer to request {} dropped", self.commit_id);
            return Ok(());
        }
        let header = bufs.first().map_or(&[][..], |b| &b[..]);
        let mut out = [0u8; OUT_HEADER_BYTES];
        let n = header.len().min(OUT_HEADER_BYTES);
        out[..n].copy_from_slice(&header[..n]);
        if body_len > entry.payload.len() {
            // Larger than any answer the handshake allows: the request fails instead.
            error!("an answer of {body_len} bytes is larger than the ring's payload");
            out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        }
        let body_len = if body_len > entry.payload.len() { 0 } else { body_len };
        out[0..4].copy_from_slice(&((OUT_HEADER_BYTES + body_len) as u32).to_ne_bytes());
        // SAFETY: this side holds the entry (the commit id was still set, and is now taken
        // under the submission lock).
        unsafe {
            entry.header.write(0, &out);
            let mut at = 0;
            if body_len > 0 {
                for buf in bufs.iter().skip(1) {
                    entry.payload.write(at, buf);
                    at += buf.len();
                }
            }
            entry
                .header
                .write(PAYLOAD_SZ_AT, &(body_len as u32).to_ne_bytes());
        }
        queue.push(commit(queue, self.index, self.commit_id))?;
        queue.ring.submit()?;
        Ok(())
    }
}

fn command(queue: &Queue, index: usize, cmd_op: u32, commit_id: u64) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&queue.qid.to_ne_bytes());
    opcode::UringCmd80::new(types::Fd(queue.fd), cmd_op)
        .cmd(cmd)
        .build()
        .user_data(index as u64)
}

fn commit(queue: &Queue, index: usize, commit_id: u64) -> squeue::Entry128 {
    command(queue, index, CMD_COMMIT_AND_FETCH, commit_id)
}

fn register(queue: &Queue, index: usize) -> squeue::Entry128 {
    let entry = command(queue, index, CMD_REGISTER, 0);
    // The buffers, as an array of two iovecs (`addr` and `len` of the SQE).
    let mut raw: [u8; 128] = unsafe {
        // SAFETY: a 128-byte SQE is plain bytes (checked size above).
        std::mem::transmute::<squeue::Entry128, [u8; 128]>(entry)
    };
    let iov = queue.entries[index].iov.as_ptr() as u64;
    raw[16..24].copy_from_slice(&iov.to_ne_bytes());
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above, back to the SQE it was.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The kernel may still write a request into an entry while it tears the ring down
        // (after this drop closed it): the buffers are left to the process's end.
        std::mem::forget(std::mem::take(&mut self.entries));
    }
}

impl Queue {
    fn new(qid: u16, fd: i32, payload_bytes: usize) -> io::Result<Queue> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * (QUEUE_DEPTH as u32 + 1))
            .setup_submit_all()
            .build(QUEUE_DEPTH as u32 + 1)?;
        let mut entries = Vec::with_capacity(QUEUE_DEPTH);
        for _ in 0..QUEUE_DEPTH {
            let header = Buffer::new(HEADER_BYTES)?;
            let payload = Buffer::new(payload_bytes)?;
            let iov = [
                libc::iovec {
                    iov_base: header.at.cast(),
                    iov_len: HEADER_BYTES,
                },
                libc::iovec {
                    iov_base: payload.at.cast(),
                    iov_len: payload.len(),
                },
            ];
            entries.push(Entry {
                header,
                payload,
                iov,
                commit_id: AtomicU64::new(0),
            });
        }
        Ok(Queue {
            qid,
            ring,
            submitting: std::sync::Mutex::new(()),
            entries,
            fd,
        })
    }

    /// Pushes `sqe` (the caller holds `submitting`).
    fn push(&self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: only one submission queue exists at a time (the caller holds
        // `submitting`); the entry's buffers and iovecs outlive the ring.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: as above.
        unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("ring submission queue full"))?;
        sq.sync();
        Ok(())
    }

    fn register_all(&self) -> io::Result<()> {
        let _submitting = self.submitting.lock().unwrap_or_else(|e| e.into_inner());
        for index in 0..self.entries.len() {
            self.push(register(self, index))?;
        }
        self.ring.submit()?;
        Ok(())
    }

    fn stop(&self) {
        let _submitting = self.submitting.lock().unwrap_or_else(|e| e.into_inner());
        let nop = opcode::Nop::new().build().user_data(STOP);
        let mut raw = [0u8; 128];
        // SAFETY: a 64-byte SQE is plain bytes; the second half stays zero.
        let nop: [u8; 64] = unsafe { std::mem::transmute::<squeue::Entry, [u8; 64]>(nop) };
        raw[..64].copy_from_slice(&nop);
        // SAFETY: a zero-padded 64-byte SQE is a valid 128-byte one.
        let nop = unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) };
        if self.push(nop).is_ok() {
            let _ = self.ring.submit();
        }
    }

    /// The request entry `index` holds, as the device would have given it: the in header
    /// (its length made the whole), the operation's own header, the payload.
    fn request(&self, index: usize, into: &mut Vec<u8>) -> Option<u64> {
        let entry = &self.entries[index];
        into.clear();
        let commit_id = entry.header.u64_at(COMMIT_ID_AT);
        let payload_len = entry.header.u32_at(PAYLOAD_SZ_AT) as usize;
        let opcode = entry.header.u32_at(4);
        let op_len = op_header_len(opcode);
        if payload_len > entry.payload.len() || op_len > OP_IN_BYTES {
            error!("a ring request with a payload of {payload_len} bytes");
            return None;
        }
        // SAFETY: the entry holds a request not yet answered (its completion was just taken).
        unsafe {
            entry.header.read(0, into, IN_HEADER_BYTES);
            entry.header.read(IN_OUT_BYTES, into, op_len);
            entry.payload.read(0, into, payload_len);
        }
        let len = into.len() as u32;
        into[0..4].copy_from_slice(&len.to_ne_bytes());
        entry.commit_id.store(commit_id, Ordering::Release);
        Some(commit_id)
    }
}

/// The size of the operation's own header, which the kernel puts apart from the payload
/// (the struct the request's parser reads first; none for operations whose first argument
/// is a name, or that have no argument).
fn op_header_len(opcode: u32) -> usize {
    use fuse_opcode::*;
    let Ok(opcode) = fuse_opcode::try_from(opcode) else {
        return 0;
    };
    match opcode {
        FUSE_GETATTR => size_of::<abi::fuse_getattr_in>(),
        FUSE_SETATTR => size_of::<abi::fuse_setattr_in>(),
        FUSE_MKNOD => size_of::<abi::fuse_mknod_in>(),
        FUSE_MKDIR => size_of::<abi::fuse_mkdir_in>(),
        FUSE_RENAME => size_of::<abi::fuse_rename_in>(),
        FUSE_RENAME2 => size_of::<abi::fuse_rename2_in>(),
        FUSE_LINK => size_of::<abi::fuse_link_in>(),
        FUSE_OPEN | FUSE_OPENDIR => size_of::<abi::fuse_open_in>(),
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => size_of::<abi::fuse_read_in>(),
        FUSE_WRITE => size_of::<abi::fuse_write_in>(),
        FUSE_RELEASE | FUSE_RELEASEDIR => size_of::<abi::fuse_release_in>(),
        FUSE_FSYNC | FUSE_FSYNCDIR => size_of::<abi::fuse_fsync_in>(),
        FUSE_SETXATTR => size_of::<abi::fuse_setxattr_in>(),
        FUSE_GETXATTR | FUSE_LISTXATTR => size_of::<abi::fuse_getxattr_in>(),
        FUSE_FLUSH => size_of::<abi::fuse_flush_in>(),
        FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => size_of::<abi::fuse_lk_in>(),
        FUSE_ACCESS => size_of::<abi::fuse_access_in>(),
        FUSE_CREATE => size_of::<abi::fuse_create_in>(),
        FUSE_BMAP => size_of::<abi::fuse_bmap_in>(),
        FUSE_IOCTL => size_of::<abi::fuse_ioctl_in>(),
        FUSE_POLL => size_of::<abi::fuse_poll_in>(),
        FUSE_FALLOCATE => size_of::<abi::fuse_fallocate_in>(),
        FUSE_LSEEK => size_of::<abi::fuse_lseek_in>(),
        FUSE_COPY_FILE_RANGE => size_of::<abi::fuse_copy_file_range_in>(),
        FUSE_FORGET => size_of::<abi::fuse_forget_in>(),
        FUSE_BATCH_FORGET => size_of::<abi::fuse_batch_forget_in>(),
        FUSE_INTERRUPT => size_of::<abi::fuse_interrupt_in>(),
        _ => 0,
    }
}

/// Every queue of a session.
#[derive(Debug)]
pub(crate) struct Rings {
    queues: Vec<Arc<Queue>>,
    /// Held while completions are taken, and while the order-sensitive ones are dispatched.
    order: std::sync::Mutex<()>,
    stopping: AtomicBool,
}

/// A completion taken from a queue, to dispatch.
struct Taken {
    queue: Arc<Queue>,
    index: usize,
    unique: u64,
}

impl Rings {
    /// A queue for each CPU the kernel may run a caller on, each entry registered with the
    /// kernel through the session's device `ch`.
    pub(crate) fn start(ch: &Channel, payload_bytes: usize) -> io::Result<Arc<Rings>> {
        // SAFETY: no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        let fd = ch.as_fd().as_raw_fd();
        let mut queues = Vec::with_capacity(cpus);
        for qid in 0..cpus {
            let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
            queues.push(Arc::new(Queue::new(qid, fd, payload_bytes)?));
        }
        for queue in &queues {
            queue.register_all()?;
        }
        Ok(Arc::new(Rings {
            queues,
            order: std::sync::Mutex::new(()),
            stopping: AtomicBool::new(false),
        }))
    }

    pub(crate) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Wakes every queue's thread to end.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for queue in &self.queues {
            queue.stop();
        }
    }

    /// The loop of queue `qid`'s thread: waits for its completions, then takes and
    /// dispatches every queue's.
    pub(crate) fn run<FS: Filesystem>(&self, qid: usize, se: &SessionEventLoop<FS>) {
        let queue = &self.queues[qid];
        let mut scratch = Vec::new();
        while !self.stopping.load(Ordering::Acquire) {
            match queue.ring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    error!("ring {qid}: {e}");
                    return;
                }
            }
            if !self.take_and_dispatch(se, &mut scratch) {
                return;
            }
        }
    }

    /// Takes every queue's completions and dispatches them in the kernel's order: what must
    /// keep it (releases, lock requests) under the order lock, the rest after. False when
    /// the session ended.
    pub(crate) fn take_and_dispatch<FS: Filesystem>(
        &self,
        se: &SessionEventLoop<FS>,
        scratch: &mut Vec<u8>,
    ) -> bool {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let (mut taken, alive) = self.take();
        taken.sort_by_key(|t| t.unique);
        let mut later = Vec::with_capacity(taken.len());
        for t in taken {
            let opcode = t.queue.entries[t.index].header.u32_at(4);
            if matches!(
                fuse_opcode::try_from(opcode),
                Ok(fuse_opcode::FUSE_RELEASE
                    | fuse_opcode::FUSE_SETLK
                    | fuse_opcode::FUSE_SETLKW
                    | fuse_opcode::FUSE_GETLK)
            ) {
                dispatch(se, &t, scratch);
            } else {
                later.push(t);
            }
        }
        drop(order);
        for t in &later {
            dispatch(se, t, scratch);
        }
        alive
    }

    /// Takes every completion of every queue (the caller holds the order lock): requests to
    /// dispatch, and whether the session goes on.
    fn take(&self) -> (Vec<Taken>, bool) {
        let mut taken = Vec::new();
        let mut alive = true;
        for queue in &self.queues {
            // SAFETY: completion queues are only read under the order lock.
            let cq = unsafe { queue.ring.completion_shared() };
            for cqe in cq {
                let user_data = cqe.user_data();
                if user_data == STOP {
                    alive = false;
                    continue;
                }
                let index = user_data as usize;
                match cqe.result() {
                    0 => {
                        let unique = queue.entries[index].header.u64_at(8);
                        taken.push(Taken {
                            queue: queue.clone(),
                            index,
                            unique,
                        });
                    }
                    e if e == -libc::ENOTCONN || e == -libc::ENODEV => alive = false,
                    e => {
                        // The kernel refused the command (a registration or an answer):
                        // nothing more will come through this entry.
                        warn!(
                            "ring {} entry {index}: {}",
                            queue.qid,
                            io::Error::from_raw_os_error(-e)
                        );
                    }
                }
            }
        }
        (taken, alive && !self.stopping.load(Ordering::Acquire))
    }
}

fn dispatch<FS: Filesystem>(se: &SessionEventLoop<FS>, t: &Taken, scratch: &mut Vec<u8>) {
    let Some(commit_id) = t.queue.request(t.index, scratch) else {
        return;
    };
    let reply = RingReply {
        queue: t.queue.clone(),
        index: t.index,
        commit_id,
    };
    let sender = se.ch.sender().on_ring(reply.clone());
    match RequestWithSender::new(sender, scratch) {
        Some(req) => req.dispatch(se),
        None => {
            // Unreadable: answered EIO so that its caller is not left waiting.
            let header = abi::fuse_out_header {
                len: OUT_HEADER_BYTES as u32,
                error: -libc::EIO,
                unique: commit_id,
            };
            let bytes = zerocopy::IntoBytes::as_bytes(&header);
            let _ = reply.send(&[io::IoSlice::new(bytes)]);
        }
    }
}
