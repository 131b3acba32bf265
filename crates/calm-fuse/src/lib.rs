//! `calm-fuse`: the FUSE file system over a calm metadata server. The only crate that knows
//! errno and FUSE.
//!
//! - [`cache`]: the kernel's cache kept exact: the mount follows every change of the
//!   namespace and invalidates what other clients changed, so replies carry long TTLs;
//! - [`contents`]: file contents through the namespace's shared object store (calm-data):
//!   buffered writes uploaded and committed, reads over the file's map;
//! - [`locks`]: fcntl (POSIX, OFD) and flock locks forwarded to the server's lock manager, in
//!   one lock session per mount, with signal-interruptible waits;
//! - [`metrics`]: the kernel's requests counted and timed by kind, and what the mount holds;
//! - [`mount`]: mount and orderly unmount;
//! - [`fs`]: the `fuser::Filesystem` implementation: every namespace operation, attribute and
//!   entry caching, sizes and times kept in the metadata server;
//! - `holding`: the files this mount holds (made here with O_EXCL): which chmod, chown and
//!   utimens it answers itself; `recalls`: sending them, giving files back, the server's
//!   recalls; `dirs`: the directories this mount holds (made here), whose makes and
//!   removals it answers itself and sends after, in order; `local`: answering them;
//! - `shared`: what request tasks share of the mount's state; `convert`: between calm's and
//!   the kernel's shapes; [`groups`]: callers' supplementary groups; [`jobs`]: their jobs.
//!
//! Every request is answered from a task on the tokio runtime, so a slow server or a lock
//! wait never holds up the FUSE reader.

mod behind;
pub mod cache;
pub mod contents;
mod convert;
mod copies;
mod dirs;
pub mod fs;
pub mod groups;
mod holding;
pub mod interrupts;
pub mod jobs;
pub mod listings;
mod local;
pub mod locks;
pub mod metrics;
pub mod mount;
mod recalls;
mod shared;
pub mod shm;

pub use fs::{CalmFs, MountOptions, default_cache_dir, mount_config};
pub use mount::{Mounted, mount};
