//! Quotas kept in the transaction of every change: usage per user, per group and per directory
//! tree with a limit, limits judged before a mutation writes anything.
//!
//! Keys (docs/design/store-layout.md): `A kind id` → usage (bytes, inodes, directories: three
//! i64 le), `B kind id` → limits and the times soft limits were passed ([`Stored`]),
//! `Nquota_trees` → how many trees have a limit. `kind` is `u`, `g` or `d`
//! ([`QuotaKind::tag`]), `id` a u64 be (a uid, a gid, a directory's handle).
//!
//! A user's and a group's usage is kept always (so that a limit set later is exact at once); a
//! tree's only while it has a limit (setting one counts the tree, [`count`]). Which trees a
//! change counts in: the trees with a limit whose directory is the changed inode's directory
//! or above it (its chain, [`Quotas::chain`]). A directory moves only between directories of
//! one chain, a file with several names keeps them in one chain, so a chain changes only when
//! a tree limit is set or removed (`crate::ops::rename`, `crate::ops::names::link`).
//!
//! Who is held to what: a tree's limits hold for every caller (a tree's quota is the size of
//! a project's space, which the superuser's jobs fill as anyone's); a user's and a group's do
//! not hold for the superuser, as on Linux (CAP_SYS_RESOURCE).

pub mod count;
mod group;
pub mod record;
pub mod shares;

pub use group::Chains;
pub(crate) use group::{Chain, Quotas};
pub use record::*;
pub use shares::{SHARE_INODES_MAX, SHARES_MAX, Shares};

#[cfg(test)]
mod tests;
