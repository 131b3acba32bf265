//! `calm-changelog`: the metadata changelog's pure parts.
//!
//! - [`record`]: record types (Lustre's names and numbers), masks, the record and its encoding
//!   (format version 1, docs/design/changelog.md);
//! - [`users`]: the registered readers ("cl1", …) with their masks and cleared indices, and the
//!   decisions made from them: which types are written at all, what may be purged, which
//!   reader an over-full backlog or idleness gets rid of.
//!
//! No store, no clock, no threads: calm-meta writes records inside the transaction of the
//! operation they describe and keeps a [`users::Registry`] in its committer.

pub mod record;
pub mod text;
pub mod users;

pub use record::{Mask, Record, RecordError, RecordType, flags};
pub use users::{BacklogPolicy, ChangelogConfig, ChangelogError, Registry, User, UserId};
