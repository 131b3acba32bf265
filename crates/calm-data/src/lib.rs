//! `calm-data`: the data plane. File contents live in an object store shared by every mount
//! and server of a namespace; the metadata ([`calm_types::slices`]) records which
//! object ranges make up which bytes of each file.
//!
//! - [`url`]: the object store's URL (`file:///dir`, `s3://bucket/prefix?endpoint=…`);
//! - [`block`]: the block object format, checksummed piece by piece;
//! - [`objects`]: the store (Apache Arrow's `object_store`): put, checked reads, sync, delete,
//!   list; [`local`]: a local directory's small objects written and read on the calling thread;
//! - [`cache`]: a mount's bounded disk cache of a remote store's blocks;
//! - [`memory`]: a remote store's blocks kept in memory, and the reads in order that are
//!   fetched ahead;
//! - [`file`]: one file's contents as a mount sees them: committed records, pending writes
//!   buffered in memory, read plans;
//! - [`audit`]: the store against the metadata (missing, short and leaked objects).
//!
//! Invariant: knows no FUSE, no gRPC and no metadata store. Objects are written once and never
//! modified; an object is named by metadata only after it is completely written, so a crash
//! leaves at worst an object nothing names (which `calm gc` removes), never a name without its
//! object. Bytes are returned only after their checksums matched.

pub mod audit;
pub mod block;
pub mod cache;
pub mod error;
pub mod file;
pub mod local;
pub mod memory;
pub mod meter;
pub mod named;
pub mod objects;
pub mod owner;
pub mod url;

pub use cache::DiskCache;
pub use error::DataError;
pub use file::{FileData, InlineCommit, Part, Upload};
pub use objects::Objects;
pub use url::ObjectsUrl;
