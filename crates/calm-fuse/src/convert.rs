//! Between calm's and the kernel's shapes: errno, times, file types and attributes, lock
//! kinds and ranges, xattr replies, the statfs of a directory; any reply refused with an
//! errno, and what a request's task fails with as one.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use calm_locks::{LockKind, Range};
use calm_types::{Attr, Kind, MetaError, SetTime};
use fuser::{
    Errno, FileAttr, FileType, INodeNo, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, TimeOrNow,
};

pub(crate) fn errno(e: &MetaError) -> Errno {
    let errno = e.errno();
    // The application sees a code only; what went wrong inside goes to the mount's log.
    if errno == libc::EIO || errno == libc::EROFS {
        tracing::warn!(error = %e, "a request failed");
    }
    Errno::from_i32(errno)
}

/// The errno of a request on a node by its number (open, getattr, setattr): one that is gone,
/// removed through another mount after this mount's kernel looked it up, is stale, as NFS says.
/// The kernel then looks the path up again and tries once more, so that an open or a stat by
/// name finds what the name holds now (a file made again under it, or none: ENOENT).
pub(crate) fn node_errno(e: &MetaError) -> Errno {
    match e {
        MetaError::NotFound => Errno::ESTALE,
        other => errno(other),
    }
}

pub(crate) fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(crate) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
            Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
        }),
    }
}

pub(crate) fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
    }
}

pub(crate) fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.handle),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: time(attr.atime_ns),
        mtime: time(attr.mtime_ns),
        ctime: time(attr.ctime_ns),
        crtime: time(attr.ctime_ns),
        kind: file_type(attr.kind),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// The attributes of a name sent alone: its inode number and kind, nothing else. Node 0 is a
/// name's absence, which the kernel keeps for an entry reply's TTL.
pub(crate) fn plain_attr(handle: u64, kind: Kind) -> FileAttr {
    FileAttr {
        ino: INodeNo(handle),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(kind),
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// A lock's kind from `struct flock`'s type, or None for F_UNLCK.
pub(crate) fn lock_kind(typ: i32) -> Result<Option<LockKind>, Errno> {
    match typ {
        libc::F_RDLCK => Ok(Some(LockKind::Read)),
        libc::F_WRLCK => Ok(Some(LockKind::Write)),
        libc::F_UNLCK => Ok(None),
        _ => Err(Errno::EINVAL),
    }
}

pub(crate) fn lock_range(start: u64, end: u64) -> Result<Range, Errno> {
    if start > end || end > calm_locks::OFFSET_MAX {
        return Err(Errno::EINVAL);
    }
    Ok(Range { start, end })
}

pub(crate) fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

/// (blocks, free blocks, blocks available to users, block size) of the file system holding
/// `path`.
pub(crate) fn statvfs(path: &Path) -> Option<(u64, u64, u64, u32)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data; all zeros is a valid value.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `v` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut v) } != 0 {
        return None;
    }
    let frsize = v.f_frsize.max(1);
    Some((
        v.f_blocks,
        v.f_bfree,
        v.f_bavail,
        u32::try_from(frsize).unwrap_or(4096),
    ))
}

/// A FUSE reply that can carry an errno (every `fuser` reply can; it names no trait for it).
pub(crate) trait Refusable: Send + 'static {
    fn refuse(self, errno: Errno);
    /// A second way to answer the request, with EINTR only (`crate::interrupts`).
    fn interrupter(&self) -> fuser::ReplyInterrupted;
}

macro_rules! refusable {
    ($($reply:ty),*) => {
        $(impl Refusable for $reply {
            fn refuse(self, errno: Errno) {
                self.error(errno)
            }

            fn interrupter(&self) -> fuser::ReplyInterrupted {
                <$reply>::interrupter(self)
            }
        })*
    };
}

refusable!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyEmpty,
    ReplyEntry,
    ReplyLock,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// What a request's task fails with, as the errno it answers.
pub(crate) trait IntoErrno: Send + 'static {
    fn into_errno(self) -> Errno;
}

impl IntoErrno for Errno {
    fn into_errno(self) -> Errno {
        self
    }
}

/// An errno as calm-data and the contents give it.
impl IntoErrno for i32 {
    fn into_errno(self) -> Errno {
        Errno::from_i32(self)
    }
}

impl IntoErrno for MetaError {
    fn into_errno(self) -> Errno {
        errno(&self)
    }
}
