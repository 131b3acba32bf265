//! `calm-watch`: ordered changes fanned out to many watchers, each with a bounded queue.
//!
//! Pure and deterministic: no I/O, no clock, no threads. The server publishes each committed
//! change once (encoded once, shared by every watcher it matches), in changelog order; watchers
//! are found through an index (by handle, by directory, by subtree), never by testing every
//! watcher; a watcher that falls behind never slows the publisher: its changes are coalesced per
//! object and, past its limit, it gets one "resync from R" and resumes from R without a gap.
//!
//! - [`queue`]: one watcher's coalescing queue;
//! - [`fanout`]: the watchers, the index, catching up from an old index, progress events.

pub mod fanout;
pub mod queue;

use std::sync::Arc;

pub use fanout::{Fanout, FanoutStats, Limits, Target, WatchError, WatcherId};
pub use queue::{Queue, QueueStats};

/// A file's handle (as in calm-meta).
pub type Handle = u64;

/// One committed change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Its changelog index.
    pub index: u64,
    /// The object it is about.
    pub object: Handle,
    /// The directory whose entries it changed (0: none, e.g. an attribute change).
    pub dir: Handle,
    /// A second such directory (a rename's source; 0: none).
    pub other_dir: Handle,
    /// More directories the change is about: those holding the other names of a file with
    /// several, for a change of its attributes (the first is `dir`).
    pub more_dirs: Vec<Handle>,
    /// The change as the wire carries it, encoded once.
    pub encoded: Arc<[u8]>,
}

impl Change {
    /// The directories whose entries this change changed (or whose entry's attributes).
    pub fn dirs(&self) -> impl Iterator<Item = Handle> + '_ {
        [self.dir, self.other_dir]
            .into_iter()
            .chain(self.more_dirs.iter().copied())
            .filter(|d| *d != 0)
    }
}

/// What a watcher receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Change(Arc<Change>),
    /// The watcher fell too far behind: re-read the current state, then apply the changes that
    /// follow, which start at index `from`.
    Resync {
        from: u64,
    },
    /// The stream has passed `index`: no matching change up to it is still to come.
    Progress {
        index: u64,
    },
}
