//! `calm-cli`: what calm's commands print, apart from what they ask. Each module turns the
//! answers of a server or a mount into a plain table a person reads and the same as JSON a
//! script reads (field names scripts rely on):
//!
//! - [`tables`]: `calm status` and `calm locks`;
//! - [`json`]: changelog records, changelog readers and the target registry;
//! - [`quota_tables`]: `calm quota` and `calm summary`, sizes in the units people type;
//! - [`stats`]: `calm stats`, a server's rates and levels every interval;
//! - [`mount_stats`]: `calm stats MOUNTPOINT`, a mount's.

pub mod json;
pub mod mount_stats;
pub mod quota_tables;
pub mod stats;
pub mod tables;
