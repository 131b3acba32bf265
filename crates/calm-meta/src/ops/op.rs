//! The mutations of the namespace, as the committer receives them: what every family of
//! operations applies and the dispatcher routes.

use calm_changelog::{Mask, UserId};

use crate::slices::Slice;
use crate::types::*;

/// A mutation of the namespace, as the committer receives it.
#[derive(Debug, Clone)]
pub enum Op {
    Make {
        parent: Handle,
        name: Vec<u8>,
        node: NewNode,
        exclusive: bool,
    },
    Link {
        handle: Handle,
        parent: Handle,
        name: Vec<u8>,
    },
    /// Removes a name. A regular file that loses its last name and is one of `keep` (files
    /// the caller's mount has open) is kept as an orphan of the caller's session
    /// ([`crate::ops::orphans`]) instead of being destroyed.
    Unlink {
        parent: Handle,
        name: Vec<u8>,
        keep: Vec<Handle>,
    },
    Rmdir {
        parent: Handle,
        name: Vec<u8>,
    },
    Rename {
        parent: Handle,
        name: Vec<u8>,
        new_parent: Handle,
        new_name: Vec<u8>,
        flags: u32,
        /// As for [`Op::Unlink`]: a replaced file the caller has open is kept.
        keep: Vec<Handle>,
    },
    SetAttr {
        handle: Handle,
        attr: SetAttr,
    },
    /// Sets a quota's limits (all 0: removes them).
    SetQuota {
        target: calm_types::QuotaTarget,
        limits: calm_types::QuotaLimits,
    },
    SetXattr {
        handle: Handle,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    RemoveXattr {
        handle: Handle,
        name: Vec<u8>,
    },
    /// Changelog: register a reader.
    ClRegister {
        name: String,
        mask: Mask,
    },
    ClDeregister {
        id: UserId,
    },
    /// Changelog: `id` has processed every record up to `index` (0: up to the last).
    ClClear {
        id: UserId,
        index: u64,
    },
    ClMask {
        id: UserId,
        mask: Mask,
    },
    /// Changelog: deregister readers idle past the limits, if a GC pass is due.
    ClGc,
    /// Deletes expired request records (`requests::expired` found them).
    ForgetRequests {
        keys: Vec<[u8; 17]>,
    },
    /// Deletes the grants of handles `keys` still unused since `before_ns`
    /// (`grants::expired` found them; one without a time counts as used at `unknown_ns`).
    ForgetGrants {
        keys: Vec<[u8; 17]>,
        before_ns: i64,
        unknown_ns: i64,
    },
    /// File contents: place slice records (written objects, or holes) in a file's chunks and
    /// make the size at least `end` (and at least the end of every record); sets mtime.
    Write {
        handle: Handle,
        slices: Vec<(u64, Slice)>,
        end: u64,
        /// The bytes of the write's inline slices (`crate::slices::INLINE`), by id.
        inline: Vec<(u64, Vec<u8>)>,
    },
    /// File contents: place the whole of object `id` (`size` bytes) at the file's current end;
    /// with `inline`, `id` is an inline slice's and these are its bytes (not supported where
    /// the file's inline bytes may not be: the writer sends an object instead).
    Append {
        handle: Handle,
        id: u64,
        size: u32,
        inline: Option<Vec<u8>>,
    },
    /// File contents: a compaction of a chunk (`crate::compaction`). The records it read,
    /// `read` as stored, must still begin the chunk (else busy: it changed meanwhile); they are
    /// replaced by `kept` (some of them, in order) and `slice`, a new slice holding the
    /// chunk's visible bytes over its range, and records added since stay on top.
    Compact {
        handle: Handle,
        chunk: u64,
        read: Vec<u8>,
        kept: Vec<Slice>,
        slice: Option<Slice>,
        /// The new slice's bytes, when it is inline.
        inline: Option<Vec<u8>>,
    },
    /// Hands out `count` new slice ids.
    AllocSlices {
        count: u64,
    },
    /// Grants `count` handles to `client` for the nodes it makes (`crate::ops::grants`).
    Grant {
        client: u64,
        count: u64,
    },
    /// Marks the objects `ids` as collected (`on`), so that no mutation names them from now
    /// on, or takes the mark away (an online gc found them named after all).
    Collected {
        ids: Vec<u64>,
        on: bool,
    },
    /// The objects of these deletion-queue entries `(queued_ns, id)` are deleted.
    GcDone {
        entries: Vec<(u64, u64)>,
    },
    /// Orphan `handle` is closed: destroy it, if it is the caller's session's (or anyone's,
    /// with `any_session`: its session ended).
    ReleaseOrphan {
        handle: Handle,
        any_session: bool,
    },
    /// The caller's session (a mount's new one, after its old one was lost) takes over these
    /// orphans.
    ClaimOrphans {
        handles: Vec<Handle>,
    },
    /// Clones node `src` as `name` in `parent` (a directory empty: `CloneEntries` fills it),
    /// sharing its objects (`crate::ops::clone`).
    Clone {
        src: Handle,
        parent: Handle,
        name: Vec<u8>,
    },
    /// Clones up to `max` entries of directory `src`, after its name key `after`, into `dst`.
    CloneEntries {
        src: Handle,
        dst: Handle,
        after: Vec<u8>,
        max: u32,
    },
    /// Names entry `handle` of the trash again (`crate::ops::trash`).
    TrashRestore {
        handle: Handle,
    },
    /// Destroys entry `handle` of the trash; with `removed_at`, only if it was removed then
    /// (the expiry's purge).
    TrashPurge {
        handle: Handle,
        removed_at: Option<i64>,
    },
}
