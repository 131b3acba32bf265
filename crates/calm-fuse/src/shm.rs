//! sqlite's shared-memory files, which mounts cannot share.
//!
//! A sqlite database in WAL mode coordinates its users through `DB-shm`, a file every user
//! maps into memory and writes without system calls: its users must share memory, which
//! processes on different mounts (different machines, or one machine's separate mounts) do not.
//! Two mounts using one WAL database each see their own copy of that memory, and committed
//! transactions are lost without an error (sqlite documents that WAL does not work over a
//! network file system). A mount cannot make the memory shared, so it makes the second user
//! fail loudly instead: every connection holds a read lock on byte 128 of `DB-shm` (the
//! "dead man switch") for as long as it is open, and locks hold across mounts, so a mount
//! refuses to open a `-shm` file, or to lock that byte, while another mount holds a lock on it.
//! sqlite then answers "unable to open database file" (or "database is locked"), and the
//! mount's log says why. Processes of one mount share the kernel's pages of the file, and use
//! WAL databases on it as on a local file system.
//!
//! Which files are `-shm` files is known from the names this mount looked up, listed with
//! their attributes or created (at most [`NAMES_KEPT_MAX`]; past it the set starts again, and a file forgotten is checked
//! again from its next lookup).

use calm_types::sync::Locked;
use std::collections::HashSet;
use std::sync::Mutex;

use calm_locks::Range;
use calm_types::Handle;

use crate::locks::LockForwarder;

/// `-shm` files remembered at once.
pub const NAMES_KEPT_MAX: usize = 65_536;
/// The byte of a `-shm` file every open sqlite connection holds a read lock on.
pub const DEAD_MAN_SWITCH: u64 = 128;

/// The `-shm` files this mount knows of.
#[derive(Debug, Default)]
pub struct SharedMemoryFiles {
    handles: Mutex<HashSet<Handle>>,
}

impl SharedMemoryFiles {
    /// `handle` (a regular file) was looked up or created as `name`.
    pub fn named(&self, handle: Handle, name: &[u8]) {
        if name.ends_with(b"-shm") {
            let mut handles = self.handles.locked();
            if handles.len() >= NAMES_KEPT_MAX {
                handles.clear();
            }
            handles.insert(handle);
        }
    }

    pub fn contains(&self, handle: Handle) -> bool {
        self.handles.locked().contains(&handle)
    }

    /// Whether this mount must refuse to let a process use `handle` as shared memory: it is
    /// a `-shm` file a connection on another mount holds open. A lock request on `range` asks
    /// only when it covers the dead man switch (an open passes the whole file).
    pub async fn used_elsewhere(
        &self,
        locks: &LockForwarder,
        handle: Handle,
        range: Range,
    ) -> bool {
        // (Ranges are inclusive.)
        if !self.contains(handle) || range.start > DEAD_MAN_SWITCH || range.end < DEAD_MAN_SWITCH {
            return false;
        }
        let switch = Range {
            start: DEAD_MAN_SWITCH,
            end: DEAD_MAN_SWITCH,
        };
        match locks.held_elsewhere(handle, switch).await {
            Ok(false) => false,
            Ok(true) => {
                tracing::warn!(
                    handle,
                    "refused a sqlite WAL database's shared memory (-shm) that a process on \
                     another mount uses: WAL needs memory shared between its users, which \
                     mounts do not share; use journal_mode=DELETE or TRUNCATE for a database \
                     used from several mounts"
                );
                true
            }
            // Unknown: let sqlite go on, as it would without this check.
            Err(_) => false,
        }
    }
}
