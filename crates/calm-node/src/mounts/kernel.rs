//! The kernel's side: fanotify mount events (FAN_MARK_MNTNS with FAN_MNT_ATTACH and
//! FAN_MNT_DETACH, Linux >= 6.15), `statmount(2)` and `listmount(2)` (Linux >= 6.8), and
//! /proc/self/mountinfo for the fallback and for checking.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use super::table::Mount;

// Not in the libc crate yet (include/uapi/linux/fanotify.h, mount.h; the syscall numbers are
// the same on every architecture).
const FAN_REPORT_MNT: u32 = 0x0000_4000;
const FAN_MARK_MNTNS: u32 = 0x0000_0110;
pub const FAN_MNT_ATTACH: u64 = 0x0100_0000;
pub const FAN_MNT_DETACH: u64 = 0x0200_0000;
const FAN_EVENT_INFO_TYPE_MNT: u8 = 7;
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
const LSMT_ROOT: u64 = u64::MAX;
const MNT_ID_REQ_SIZE_VER0: u32 = 24;
const STATMOUNT_MNT_BASIC: u64 = 0x2;
const STATMOUNT_MNT_POINT: u64 = 0x10;
const STATMOUNT_FS_TYPE: u64 = 0x20;
const STATMOUNT_FS_SUBTYPE: u64 = 0x100;
const STATMOUNT_SB_SOURCE: u64 = 0x200;
/// Where a `struct statmount`'s strings start.
const STATMOUNT_STR_OFFSET: usize = 512;

#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// One thing the fanotify queue said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvent {
    Attach(u64),
    Detach(u64),
    /// Events were lost: re-read everything.
    Overflow,
}

/// A fanotify group watching this process's mount namespace.
#[derive(Debug)]
pub struct MountEvents {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl MountEvents {
    /// Opens the group (needs CAP_SYS_ADMIN and Linux >= 6.15).
    pub fn open() -> io::Result<MountEvents> {
        // SAFETY: fanotify_init(2) with flags only; the result is checked.
        let fd = unsafe { libc::fanotify_init(FAN_REPORT_MNT | libc::FAN_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ns = std::fs::File::open("/proc/self/ns/mnt")?;
        // SAFETY: fanotify_mark(2) on our group with the namespace's descriptor and no path.
        let rc = unsafe {
            libc::fanotify_mark(
                fd.as_raw_fd(),
                libc::FAN_MARK_ADD | FAN_MARK_MNTNS,
                FAN_MNT_ATTACH | FAN_MNT_DETACH,
                ns.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(MountEvents {
            fd,
            buf: vec![0u8; 64 * 1024],
        })
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Blocks until events arrive and returns them, in order.
    pub fn read(&mut self) -> io::Result<Vec<KernelEvent>> {
        let n = loop {
            // SAFETY: read(2) into our buffer of its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        Ok(parse_events(&self.buf[..n]))
    }
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_ne_bytes([b[at], b[at + 1]]) as usize
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses `struct fanotify_event_metadata` records and their mount info records.
pub fn parse_events(buf: &[u8]) -> Vec<KernelEvent> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 24 <= buf.len() {
        let event_len = u32_at(buf, at) as usize;
        let metadata_len = u16_at(buf, at + 6);
        if event_len < 24 || at + event_len > buf.len() {
            break;
        }
        let mask = u64_at(buf, at + 8);
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(KernelEvent::Overflow);
        }
        let mut info = at + metadata_len;
        while info + 4 <= at + event_len {
            let kind = buf[info];
            let len = u16_at(buf, info + 2);
            if len < 4 {
                break;
            }
            // struct fanotify_event_info_mnt: the 4-byte header, 4 bytes of padding, the id.
            if kind == FAN_EVENT_INFO_TYPE_MNT && info + 16 <= buf.len() {
                let id = u64_at(buf, info + 8);
                if mask & FAN_MNT_ATTACH != 0 {
                    out.push(KernelEvent::Attach(id));
                }
                if mask & FAN_MNT_DETACH != 0 {
                    out.push(KernelEvent::Detach(id));
                }
            }
            info += len;
        }
        at += event_len;
    }
    out
}

/// `statmount(2)` of the mount with 64-bit id `unique`; None when it is gone already.
pub fn statmount(unique: u64, buf: &mut Vec<u8>) -> io::Result<Option<Mount>> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let req = MntIdReq {
        size: MNT_ID_REQ_SIZE_VER0,
        spare: 0,
        mnt_id: unique,
        param: STATMOUNT_MNT_BASIC
            | STATMOUNT_MNT_POINT
            | STATMOUNT_FS_TYPE
            | STATMOUNT_FS_SUBTYPE
            | STATMOUNT_SB_SOURCE,
    };
    loop {
        // SAFETY: statmount(2) with a valid request and a writable buffer of its length.
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &req as *const MntIdReq,
                buf.as_mut_ptr(),
                buf.len(),
                0u32,
            )
        };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOVERFLOW) => {
                let bigger = buf.len() * 2;
                buf.resize(bigger, 0);
            }
            Some(libc::ENOENT) => return Ok(None),
            _ => return Err(e),
        }
    }
    let string = |field_at: usize| -> String {
        let offset = u32_at(buf, field_at) as usize;
        let start = STATMOUNT_STR_OFFSET + offset;
        let end = buf[start..]
            .iter()
            .position(|b| *b == 0)
            .map_or(buf.len(), |n| start + n);
        String::from_utf8_lossy(&buf[start..end]).into_owned()
    };
    let mask = u64_at(buf, 8);
    let source = if mask & STATMOUNT_SB_SOURCE != 0 {
        string(124)
    } else {
        String::new()
    };
    // A FUSE file system's subtype (`fuse.sshfs`, `fuse.calm`) is part of its type in
    // mountinfo: the table names it the same way, whichever way it learned of the mount.
    let mut fs_type = string(36);
    if mask & STATMOUNT_FS_SUBTYPE != 0 {
        let subtype = string(120);
        if !subtype.is_empty() {
            fs_type = format!("{fs_type}.{subtype}");
        }
    }
    Ok(Some(Mount {
        id: u32_at(buf, 56),
        parent: u32_at(buf, 60),
        mount_point: PathBuf::from(string(108)),
        fs_type,
        source,
    }))
}

/// `listmount(2)`: the 64-bit ids of every mount of this namespace.
pub fn listmount() -> io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    let mut chunk = vec![0u64; 4096];
    let mut last = 0u64;
    loop {
        let req = MntIdReq {
            size: MNT_ID_REQ_SIZE_VER0,
            spare: 0,
            mnt_id: LSMT_ROOT,
            param: last,
        };
        // SAFETY: listmount(2) with a valid request and a writable array of its length.
        let n = unsafe {
            libc::syscall(
                SYS_LISTMOUNT,
                &req as *const MntIdReq,
                chunk.as_mut_ptr(),
                chunk.len(),
                0u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        ids.extend_from_slice(&chunk[..n]);
        if n < chunk.len() {
            return Ok(ids);
        }
        last = chunk[n - 1];
    }
}

/// Every mount now, through listmount and statmount: `(64-bit id, mount)`.
pub fn list_all(buf: &mut Vec<u8>) -> io::Result<Vec<(u64, Mount)>> {
    let mut out = Vec::new();
    for id in listmount()? {
        if let Some(mount) = statmount(id, buf)? {
            out.push((id, mount));
        }
    }
    Ok(out)
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/self/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = line.split(' ');
        let (Some(id), Some(parent), _, _, Some(point)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        // After the optional fields comes "-", then fs type and source.
        let mut rest = fields.skip_while(|f| *f != "-");
        rest.next();
        let fs_type = rest.next().unwrap_or_default();
        let source = rest.next().unwrap_or_default();
        let (Ok(id), Ok(parent)) = (id.parse(), parent.parse()) else {
            continue;
        };
        out.push(Mount {
            id,
            parent,
            mount_point: PathBuf::from(unescape(point)),
            fs_type: unescape(fs_type),
            source: unescape(source),
        });
    }
    out
}

/// The mount table as /proc/self/mountinfo shows it now.
pub fn read_mountinfo() -> io::Result<Vec<Mount>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// A descriptor on /proc/self/mountinfo that polls POLLPRI when the table changes.
pub fn mountinfo_fd() -> io::Result<OwnedFd> {
    let path = CString::new("/proc/self/mountinfo").expect("no NUL");
    // SAFETY: open(2) of a constant path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_optional_fields_and_escapes() {
        let text = "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                    95 22 0:45 / /mnt/a\\040b rw - tmpfs none rw\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].fs_type, "ext4");
        assert_eq!(mounts[0].source, "/dev/vda1");
        assert_eq!(mounts[1].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(mounts[1].parent, 22);
    }

    #[test]
    fn fanotify_records_parse() {
        // One attach event of mount 0x1234 with a mount info record, then an overflow.
        let mut buf = Vec::new();
        let mut event = |mask: u64, info: Option<u64>| {
            let len = 24 + if info.is_some() { 16 } else { 0 };
            buf.extend_from_slice(&(len as u32).to_ne_bytes());
            buf.push(3); // version
            buf.push(0);
            buf.extend_from_slice(&24u16.to_ne_bytes());
            buf.extend_from_slice(&mask.to_ne_bytes());
            buf.extend_from_slice(&(-1i32).to_ne_bytes());
            buf.extend_from_slice(&0i32.to_ne_bytes());
            if let Some(id) = info {
                buf.push(FAN_EVENT_INFO_TYPE_MNT);
                buf.push(0);
                buf.extend_from_slice(&16u16.to_ne_bytes());
                buf.extend_from_slice(&[0; 4]);
                buf.extend_from_slice(&id.to_ne_bytes());
            }
        };
        event(FAN_MNT_ATTACH, Some(0x1234));
        event(FAN_MNT_DETACH, Some(0x1235));
        event(libc::FAN_Q_OVERFLOW, None);
        assert_eq!(
            parse_events(&buf),
            [
                KernelEvent::Attach(0x1234),
                KernelEvent::Detach(0x1235),
                KernelEvent::Overflow
            ]
        );
    }
}
