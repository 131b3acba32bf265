//! `calm-locks`: byte-range and whole-file locks as a pure, deterministic state machine.
//!
//! No I/O, no async, no clock, no threads: a request goes in, an answer comes out, and what
//! happened to waiting requests comes out as events. The server owns the clock (it passes
//! `now`) and the sockets.
//!
//! - [`range`]: byte ranges as `struct flock` names them, and lock types;
//! - [`ranges`]: the POSIX/OFD record locks of one resource, O(log n + k) per operation;
//! - [`peers`]: which server of several decides a file's locks, fencing and takeovers;
//! - [`flock`]: the BSD flock locks of one resource;
//! - [`manager`]: every resource, owners and sessions with leases, waiting in arrival order,
//!   deadlock detection over the whole wait-for graph.

pub mod flock;
pub mod manager;
pub mod peers;
pub mod range;
pub mod ranges;
pub mod recovery;
mod treap;

pub use flock::FlockTable;
pub use manager::{
    Account, Counts, Event, Holder, Limits, LockError, LockManager, Outcome, Owner, Request,
    ResourceId, Scope, SessionId, Stats, WaitId, Waiting,
};
pub use range::{LockKind, OFFSET_MAX, Range, RangeError};
pub use ranges::{Lock, RangeLocks};
pub use treap::Treap;
