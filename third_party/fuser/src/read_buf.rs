use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
}

impl FuseReadBuf {
    /// calm: a buffer for the requests of a session whose writes are at most `max_write`
    /// bytes (what the handshake told the kernel), instead of the largest any session may
    /// have: each of a mount's threads keeps one for as long as it runs, and glibc's malloc may
    /// serve (and zero) the whole of it from its heap. The kernel needs room for a write's
    /// headers beside its bytes, and for a SETXATTR's value (up to 64 KiB) whatever
    /// `max_write` is (it answers E2BIG when the buffer is smaller than the request).
    pub(crate) fn for_writes_of(max_write: usize) -> Self {
        const XATTR_SIZE_MAX: usize = 64 * 1024;
        let size = max_write.clamp(XATTR_SIZE_MAX, MAX_WRITE_SIZE) + 4096;
        Self {
            buffer: vec![0; size],
        }
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        let alignment = align_of::<abi::fuse_in_header>();
        let off = alignment - (self.buffer.as_ptr() as usize) % alignment;
        if off == alignment {
            &mut self.buffer
        } else {
            &mut self.buffer[off..]
        }
    }
}
