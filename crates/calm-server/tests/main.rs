//! The server's tests, one module per part, in one test binary (one link instead of one per
//! file).

mod compaction;
mod identity;
mod ordered_batch;
mod write_then_change;
