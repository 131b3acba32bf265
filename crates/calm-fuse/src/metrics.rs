//! What a mount counts: every request the kernel sends, by its kind, timed from when it was
//! read to when its reply was sent, and its failures by errno (told by the FUSE session for
//! every reply, whichever path answers it: atomics only, each kind's counters found by its
//! opcode in a table made at start); and at each scrape what the mount holds (writes buffered,
//! blocks cached, invalidations sent to the kernel). Served by `calm mount --metrics ADDR`, and
//! read by `calm stats MOUNTPOINT` through the root's `calm.metrics` extended attribute.

use std::sync::Arc;
use std::time::Instant;

use calm_metrics::{MetricFamily, Registry, Scrape, Timed, TimedSet};

/// The extended attribute of a mount's root that holds the mount's figures
/// ([`calm_metrics::samples`]); read-only, never listed.
pub const METRICS_XATTR: &str = "calm.metrics";

/// The largest value of an extended attribute Linux hands out (XATTR_SIZE_MAX).
const XATTR_BYTES_MAX: usize = 65536;

/// The kernel's request kinds, by opcode (`include/uapi/linux/fuse.h`).
const OPCODES: &[(u32, &str)] = &[
    (1, "lookup"),
    (3, "getattr"),
    (4, "setattr"),
    (5, "readlink"),
    (6, "symlink"),
    (8, "mknod"),
    (9, "mkdir"),
    (10, "unlink"),
    (11, "rmdir"),
    (12, "rename"),
    (13, "link"),
    (14, "open"),
    (15, "read"),
    (16, "write"),
    (17, "statfs"),
    (18, "release"),
    (20, "fsync"),
    (21, "setxattr"),
    (22, "getxattr"),
    (23, "listxattr"),
    (24, "removexattr"),
    (25, "flush"),
    (27, "opendir"),
    (28, "readdir"),
    (29, "releasedir"),
    (30, "fsyncdir"),
    (31, "getlk"),
    (32, "setlk"),
    (33, "setlkw"),
    (34, "access"),
    (35, "create"),
    (37, "bmap"),
    (39, "ioctl"),
    (40, "poll"),
    (43, "fallocate"),
    (44, "readdirplus"),
    (45, "rename2"),
    (46, "lseek"),
    (47, "copy_file_range"),
    (50, "syncfs"),
    (51, "tmpfile"),
    (52, "statx"),
];

/// The errnos a failed request is counted under, by name; anything else is "other".
const ERRNOS: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::EBADF, "EBADF"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::EXDEV, "EXDEV"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::EFBIG, "EFBIG"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::EROFS, "EROFS"),
    (libc::EMLINK, "EMLINK"),
    (libc::ERANGE, "ERANGE"),
    (libc::EDEADLK, "EDEADLK"),
    (libc::ENAMETOOLONG, "ENAMETOOLONG"),
    (libc::ENOLCK, "ENOLCK"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::ENOTEMPTY, "ENOTEMPTY"),
    (libc::ELOOP, "ELOOP"),
    (libc::ENODATA, "ENODATA"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ETIMEDOUT, "ETIMEDOUT"),
    (libc::ESTALE, "ESTALE"),
    (libc::EDQUOT, "EDQUOT"),
];

/// The largest opcode named in [`OPCODES`].
const OPCODE_MAX: usize = 52;

/// A mount's counters of the kernel's requests (the FUSE session's reply observer).
#[derive(Debug)]
pub struct MountMetrics {
    registry: Registry,
    /// Each opcode's counters, by opcode (unnamed ones: "other").
    by_opcode: Vec<Timed>,
    other: Timed,
    /// When false, nothing is counted (`calm-bench mount` measures what counting costs).
    counting: bool,
}

impl MountMetrics {
    /// The mount's families, registered in `registry` (a server's in the same process, or the
    /// mount's own).
    pub fn new(registry: Registry, counting: bool) -> Result<Arc<MountMetrics>, String> {
        let names: Vec<&'static str> = OPCODES.iter().map(|(_, name)| *name).collect();
        let mut errors: Vec<&'static str> = ERRNOS.iter().map(|(_, name)| *name).collect();
        errors.push("other");
        let set = TimedSet::new(
            &registry,
            "calm_mount_requests",
            "requests the kernel sent the mount (from when each was read to its reply)",
            &names,
            &errors,
        )
        .map_err(|e| format!("registering the mount's requests: {e}"))?;
        let by_opcode = (0..=OPCODE_MAX as u32)
            .map(|opcode| {
                let name = OPCODES
                    .iter()
                    .find(|(op, _)| *op == opcode)
                    .map_or("other", |(_, name)| name);
                set.op(name).clone()
            })
            .collect();
        Ok(Arc::new(MountMetrics {
            registry,
            by_opcode,
            other: set.op("other").clone(),
            counting,
        }))
    }

    /// The registry the families are in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The mount's samples ([`calm_metrics::samples`]) as the root's [`METRICS_XATTR`] holds
    /// them: the mount's families alone (with a server in the same process, not the server's),
    /// within the largest value an extended attribute may have.
    pub(crate) fn samples(&self) -> String {
        let mut out = String::new();
        for line in calm_metrics::samples(&self.registry).lines() {
            let mount_own = line.starts_with("calm_mount_")
                || (["calm_objects_", "calm_block_cache_reads"]
                    .iter()
                    .any(|prefix| line.starts_with(prefix))
                    && line.contains("part=\"mount\""));
            if mount_own && out.len() + line.len() < XATTR_BYTES_MAX {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// What the mount holds, read at each scrape by `figures` from the counters its parts
    /// keep.
    pub(crate) fn scrape(
        &self,
        figures: impl Fn() -> Vec<MetricFamily> + Send + Sync + 'static,
    ) -> Result<(), String> {
        let scrape = Scrape::new(&self.registry, "mount")
            .map_err(|e| format!("registering the mount's figures: {e}"))?;
        scrape.add(figures);
        Ok(())
    }
}

fn errno_index(errno: i32) -> usize {
    ERRNOS
        .iter()
        .position(|(e, _)| *e == errno)
        .unwrap_or(ERRNOS.len())
}

impl fuser::ReplyObserver for MountMetrics {
    fn replied(&self, opcode: u32, started: Instant, errno: i32) {
        if !self.counting {
            return;
        }
        let timed = self.by_opcode.get(opcode as usize).unwrap_or(&self.other);
        timed.observe(started.elapsed());
        if errno != 0 {
            timed.failed(errno_index(errno));
        }
    }
}
