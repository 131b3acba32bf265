//! How a mount behaves (`MountOptions`, from `calm mount`'s flags), its limits, and the
//! `fuser` configuration they make.

use std::time::Duration;

use fuser::MountOption;

/// Largest write the kernel sends in one request, in bytes.
pub const WRITE_BYTES_MAX: u32 = 1 << 20;
/// Largest write(2) with O_APPEND that lands whole at the file's end whatever the alignment of
/// its buffer, in bytes: the kernel hands the mount at most 256 pages of the caller's memory in
/// one request (Linux's `fs.fuse.max_pages_limit`, 256 by default), and a buffer that does not
/// start on a page boundary spans one page more than its length. (A page-aligned buffer of up
/// to [`WRITE_BYTES_MAX`] lands whole too.)
pub const APPEND_WHOLE_BYTES_MAX: u32 = WRITE_BYTES_MAX - 4096;
/// Most bytes the kernel reads ahead of a sequential reader, in bytes.
pub const READAHEAD_BYTES_MAX: u32 = 1 << 20;

/// Threads reading FUSE requests: as many as the processes of a busy node that call at once
/// (16 processes creating and unlinking were as fast or faster with 8 and 16 than with 4, on
/// 2 cores: docs/benchmarks/2026-12-06/mount-threads). Each holds a buffer of a request's
/// largest size, about 1 MiB.
pub const FUSE_THREADS: usize = 16;
/// Most threads reading the FUSE device (`--fuse-threads`).
pub const FUSE_THREADS_MAX: usize = 64;

/// Entries a readdir asks the server for at once (the kernel's buffer usually fills first).
pub const READDIR_BATCH: u32 = 512;

/// How the mount behaves.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Bytes of writes buffered in memory, not committed yet, for the whole mount.
    pub write_buffer_bytes: u64,
    /// How long the kernel may trust attributes and names without asking again.
    pub ttl: Duration,
    /// Lease of the mount's lock session: a mount that dies loses its locks this long after.
    pub lease_ms: u64,
    /// Let every user use the mount (FUSE's `allow_other`; permission bits still apply).
    /// Without it only the user who mounted may.
    pub allow_other: bool,
    /// Where to keep a remote store's blocks on local disk (a directory per namespace under
    /// it; see `calm_data::cache`), and how many bytes at most. None or 0 bytes: no disk
    /// cache. A local store is never cached.
    pub cache_dir: Option<std::path::PathBuf>,
    pub cache_bytes: u64,
    /// Most bytes of small writes one commit sends inline, kept by the metadata instead of
    /// written as objects (0: never; at most `calm_types::slices::INLINE_WRITE_BYTES_MAX`).
    pub inline_bytes_max: u64,
    /// Files opened with O_APPEND go through the kernel's page cache like the others, which
    /// then cuts a write at every page it has not read: appends of several mounts may tear.
    /// Only for measuring what the default (direct I/O: `fs::data::append_direct`) costs.
    pub append_through_cache: bool,
    /// Where the mount's metrics are registered (a server's in the same process, or one
    /// `calm mount --metrics` serves); `None`: a registry of its own, read only through
    /// [`crate::metrics::METRICS_XATTR`].
    pub metrics: Option<calm_metrics::Registry>,
    /// Count and time the kernel's requests (false only to measure what counting costs).
    pub count_requests: bool,
    /// The environment variable naming a calling process's job (`SLURM_JOB_ID`, …): sent with
    /// its requests, so that the server counts its load per job. `None`: no job is sent.
    pub job_variable: Option<String>,
    /// How the kernel's requests reach the mount.
    pub channel: Channel,
    /// Threads reading the FUSE device (each with a device of its own).
    pub device_threads: usize,
    /// Hold the files this mount makes where the server allows (`crate::holding`): their
    /// mode, owner and times are changed here and sent when they are closed or asked for.
    pub hold_files: bool,
    /// Keep copies of files this mount reads where the server allows (`crate::copies`): an
    /// open of a file unchanged since is answered here, with the kernel's pages kept.
    pub keep_copies: bool,
}

/// How the kernel's requests reach the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Channel {
    /// The FUSE device (a `read` and a `writev` per request, on each reading thread).
    #[default]
    Device,
    /// FUSE over io_uring when the kernel offers it (Linux 6.14 with the fuse module's
    /// `enable_uring` set): a ring per CPU, a request answered and the next one taken in one
    /// system call; the device when the kernel does not offer it.
    IoUring,
}

impl Default for MountOptions {
    /// The mount's defaults: for its user alone, small writes inline, appends whole, requests
    /// counted in a registry of its own; and no disk cache (`calm mount` keeps one for a
    /// remote store unless told not to).
    fn default() -> MountOptions {
        MountOptions {
            write_buffer_bytes: crate::contents::WRITE_BUFFER_BYTES_DEFAULT,
            ttl: TTL_DEFAULT,
            lease_ms: crate::locks::LEASE_MS_DEFAULT,
            allow_other: false,
            cache_dir: None,
            cache_bytes: 0,
            inline_bytes_max: calm_types::slices::INLINE_WRITE_BYTES_MAX,
            append_through_cache: false,
            metrics: None,
            count_requests: true,
            job_variable: None,
            channel: Channel::Device,
            device_threads: FUSE_THREADS,
            hold_files: true,
            keep_copies: true,
        }
    }
}

/// Where a mount keeps a remote store's blocks when not told: `$XDG_CACHE_HOME/calm/blocks`,
/// or `~/.cache/calm/blocks`.
pub fn default_cache_dir() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".cache"))
        })?;
    Some(base.join("calm").join("blocks"))
}

/// Default attribute and entry timeout (the mount invalidates what other clients change:
/// [`crate::cache`]).
pub const TTL_DEFAULT: Duration = Duration::from_secs(60);

/// The `fuser` configuration of a calm mount.
pub fn mount_config(options: &MountOptions) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("calm".into()),
        MountOption::Subtype("calm".into()),
        // The kernel checks permission bits against the attributes it is given.
        MountOption::DefaultPermissions,
    ];
    // Several readers, each with a device of its own: one request that must do something
    // slow on its reader (a large local object, a cold read) does not hold up the others.
    // Releases, lock requests and interrupts are dispatched in the kernel's order (see the
    // `calm:` note in the fuser copy's session loop).
    config.n_threads = Some(options.device_threads.clamp(1, FUSE_THREADS_MAX));
    config.clone_fd = true;
    config.io_uring = options.channel == Channel::IoUring;
    if options.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config
}
