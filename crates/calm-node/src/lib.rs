//! `calm-node`: the storage-node agent.
//!
//! - [`mounts`]: an exact in-memory mount table of a mount namespace, kept from the kernel's
//!   mount events;
//! - [`label`]: the target label (versioned, checksummed) that makes a device or directory a
//!   calm target;
//! - [`pools`]: pool assembly, O(1) per arrival, each pool activated exactly once;
//! - [`uevent`]: kernel uevents (NETLINK_KOBJECT_UEVENT) and the uevent sequence number;
//! - [`agent`]: `calm node`: enumerate at sequence R, follow uevents from R, activate pools.

pub mod agent;
pub mod label;
pub mod mounts;
pub mod pools;
pub mod pools_file;
pub mod uevent;
