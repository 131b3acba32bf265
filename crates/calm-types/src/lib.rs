//! The words every part of calm speaks: inode handles, kinds and attributes and their
//! changes, the namespace's errors with their stable codes, the caller's identity, a file's
//! slice records and request ids; and the one way every crate takes a mutex ([`sync::Locked`]).
//!
//! No I/O and no other calm crate: the data plane, the mount, the client and the wire use
//! these without linking the namespace engine or a metadata store.

pub mod attr;
pub mod caller;
pub mod error;
pub mod quota;
pub mod request;
pub mod slices;
pub mod sync;

pub use crate::attr::*;
pub use crate::caller::{Caller, GROUPS_MAX, Groups};
pub use crate::error::{CODES, MetaError, Result};
pub use crate::quota::{QuotaKind, QuotaLimits, QuotaReport, QuotaTarget, QuotaUsage};
pub use crate::request::{GRANT_USED_FOR, RequestId};
pub use crate::slices::FileMap;
