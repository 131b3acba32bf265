//! The upkeep of the namespace, in the background of a server: nothing here is on a client's
//! path.
//!
//! - [`data`]: the deleter (objects of the deletion queue, once they have waited their delay)
//!   and the tasks that run the compactor;
//! - [`compactor`]: rewrites a chunk whose map has grown many records into one object;
//! - [`backup`]: the metadata backups a server takes on a schedule, and the dump they share
//!   with an administrator's.
//!
//! The server starts these tasks and reports their figures; the binary's `calm dump` names its
//! files the way the backups do.

pub mod backup;
pub mod compactor;
pub mod data;
