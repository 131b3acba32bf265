//! `calm-lockfree`: the parts of calm that race without a lock, apart, so that each is checked
//! by a model of its races under loom, which runs a test under every interleaving of its
//! threads it finds (`cargo test -p calm-lockfree --features loom`; `scripts/test` runs them in
//! every tier). In a build with the `loom` feature the atomics and locks are loom's, which only
//! those tests may use.
//!
//! - [`last_index`]: the changelog's last committed index, published by the committer without
//!   a lock, and the followers waiting for an index, each woken once it is reached.
//! - [`changes`]: a mount cache's count of the changes it has seen, which a reply is checked
//!   against before it is cached.
//! - [`load`]: a server's table of requests and time per user or job, counted without a lock.
//!
//! Loom does not model `SeqCst` loads and stores (it treats them as acquire and release): where
//! two threads each write, then read what the other wrote, a `SeqCst` fence stands between the
//! two, which loom does model and the hardware needs anyway.

pub mod changes;
pub mod last_index;
pub mod load;
mod sync;
