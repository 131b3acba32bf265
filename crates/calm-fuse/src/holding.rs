//! Files this mount holds: a regular file it made with O_EXCL, which the server let it hold
//! (`Meta.Holds`). Until the mount gives the file back, a chmod, a chown, a change of its
//! times or a truncate that cuts it short by the process that made it is answered here, at
//! once, and kept (see [`holdable`]); the changes go to the server as one, after the file's
//! pending writes, when:
//!
//! - the file is closed (and given back with that change), fsync'd, or locked;
//! - anything else than such a change reaches the file here: a write after the change, an
//!   open, an access check, an extended attribute, a truncate that is not held, a change by
//!   another process;
//! - a name in its directory is linked, removed or renamed here (given back first, so the
//!   server always knows its directory);
//! - the server asks for it back: another mount, or a dump, a clone or a quota, wants to see
//!   the file (the request waits until the changes are there);
//! - the stream of recalls ends (the server restarted or lost the mount's session): the
//!   server holds nothing of this mount any more, and what the mount kept is sent as plain
//!   changes.
//!
//! What is held is bounded by the files open here (a file is given back at its close) and by
//! the server's own bounds (`calm_server::holds`). A mount killed holding files loses the
//! changes it kept, which no fsync asked for. docs/design/mount.md "Held files".

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use calm_client::Client;
use calm_types::sync::Locked;
use calm_types::{Attr, Handle, SetAttr, SetTime};

/// Files given back in one request, at most.
pub const RETURNS_PER_REQUEST_MAX: usize = 4096;

/// The mode bits a held change never touches: a change to or from them goes to the server,
/// whose rules for them depend on groups and privileges the mount does not decide.
const PRIVILEGE_BITS: u32 = 0o7000;

/// Who asks for a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asker {
    pub uid: u32,
    pub gid: u32,
}

/// Whether the change `change` that `asker` asks of a file with attributes `attr` (as
/// answered, over the server's with the changes `kept` so far) may be answered here: only
/// mode, owner (where `owner_too`), times and a size; by the file's owner or the superuser;
/// no setuid, setgid or sticky bit before or after; an owner changed by the superuser only.
/// A size only alone (with times), no larger than the file (a quota may refuse growth), by
/// someone who may write the file, and with no mode, owner or size kept before it nor any
/// after it: the server judges it by the mode it knows and applies it once, so what it
/// judges is what was judged here (the mount's `keep` adds: with no write pending).
pub(crate) fn holdable(
    attr: &Attr,
    change: &SetAttr,
    asker: Asker,
    owner_too: bool,
    kept: Option<&SetAttr>,
) -> bool {
    let root = asker.uid == 0;
    if change.ctime.is_some() {
        return false;
    }
    if !root && asker.uid != attr.uid {
        return false;
    }
    if attr.mode & PRIVILEGE_BITS != 0 || change.mode.is_some_and(|m| m & PRIVILEGE_BITS != 0) {
        return false;
    }
    let owner = change.uid.is_some() || change.gid.is_some();
    if kept.is_some_and(|k| k.size.is_some()) && (owner || change.mode.is_some()) {
        return false;
    }
    if let Some(size) = change.size {
        let writable = root || attr.mode & 0o200 != 0;
        let alone = !owner && change.mode.is_none();
        let before = kept.is_some_and(|k| {
            k.size.is_some() || k.mode.is_some() || k.uid.is_some() || k.gid.is_some()
        });
        if size > attr.size || !writable || !alone || before {
            return false;
        }
    }
    !owner || (owner_too && root)
}

/// `attr` after `change` at `now_ns`, and the change with its times made exact (what the
/// server is sent is what the caller was answered).
pub(crate) fn apply(attr: &mut Attr, change: &SetAttr, now_ns: i64) -> SetAttr {
    let exact = |t: SetTime| match t {
        SetTime::Now => now_ns,
        SetTime::At(ns) => ns,
    };
    let mut sent = SetAttr::default();
    if let Some(mode) = change.mode {
        attr.mode = mode & 0o7777;
        sent.mode = Some(attr.mode);
    }
    if let Some(uid) = change.uid {
        attr.uid = uid;
        sent.uid = Some(uid);
    }
    if let Some(gid) = change.gid {
        attr.gid = gid;
        sent.gid = Some(gid);
    }
    if let Some(atime) = change.atime {
        attr.atime_ns = exact(atime);
        sent.atime = Some(SetTime::At(attr.atime_ns));
    }
    if let Some(mtime) = change.mtime {
        attr.mtime_ns = exact(mtime);
        sent.mtime = Some(SetTime::At(attr.mtime_ns));
    }
    if let Some(size) = change.size {
        // A size that changes sets the modification time where none is given, as the
        // server does.
        if size != attr.size && change.mtime.is_none() {
            attr.mtime_ns = now_ns;
            sent.mtime = Some(SetTime::At(now_ns));
        }
        attr.size = size;
        sent.size = Some(size);
    }
    attr.ctime_ns = attr.ctime_ns.max(now_ns);
    sent
}

/// `later` folded into `kept`: each attribute as the last change set it.
pub(crate) fn fold(kept: &mut SetAttr, later: SetAttr) {
    kept.mode = later.mode.or(kept.mode);
    kept.uid = later.uid.or(kept.uid);
    kept.gid = later.gid.or(kept.gid);
    kept.atime = later.atime.or(kept.atime);
    kept.mtime = later.mtime.or(kept.mtime);
    kept.size = later.size.or(kept.size);
}

/// `attr` as the holder answered it: the kept change over what the server said.
pub(crate) fn overlay(attr: &mut Attr, kept: &SetAttr) {
    if let Some(mode) = kept.mode {
        attr.mode = mode;
    }
    if let Some(uid) = kept.uid {
        attr.uid = uid;
    }
    if let Some(gid) = kept.gid {
        attr.gid = gid;
    }
    // Kept changes hold exact times (`apply`).
    if let Some(SetTime::At(ns)) = kept.atime {
        attr.atime_ns = ns;
    }
    if let Some(SetTime::At(ns)) = kept.mtime {
        attr.mtime_ns = ns;
    }
    if let Some(size) = kept.size {
        attr.size = size;
    }
}

#[derive(Debug)]
struct Held {
    dir: Handle,
    owner_too: bool,
    /// Who made the file: only their changes are kept.
    maker: Asker,
    /// The maker's client: what sends the changes, and commits the file's writes at a recall.
    client: Client,
    /// The changes answered and not sent yet, folded into one, with a count of the changes
    /// folded (a send clears only what it sent).
    kept: Option<(SetAttr, u64)>,
    /// Since when changes are kept (`crate::behind` sends the old ones).
    kept_since: Option<Instant>,
    /// Being given back: nothing more is kept.
    ending: bool,
    /// Taken by whoever sends the file's changes, so that they reach the server in order.
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// What a file's give-back or flush has to send.
#[derive(Debug)]
pub(crate) struct Kept {
    pub change: SetAttr,
    pub client: Client,
    /// Which fold this is (see [`Holding::sent`]).
    pub folds: u64,
}

/// Recalls of files the mount did not hold yet (the answer to their make still on its way)
/// remembered at most.
pub const EARLY_RECALLS_MAX: usize = 4096;

/// Holds and copies to give back in one request.
#[derive(Debug, Default)]
pub(crate) struct Returns {
    pub(crate) holds: Vec<Handle>,
    pub(crate) copies: Vec<Handle>,
}

/// Recalls seen before their grant: looked up at every grant, so by a set; evicted oldest
/// first past [`EARLY_RECALLS_MAX`].
#[derive(Debug, Default)]
struct Early {
    handles: HashSet<Handle>,
    order: VecDeque<Handle>,
}

/// The files this mount holds.
#[derive(Debug, Default)]
pub(crate) struct Holding {
    files: Mutex<HashMap<Handle, Held>>,
    /// Recalls that came before their grant was seen here: such a grant is not taken.
    early: Mutex<Early>,
    /// The server's stream of recalls is open: a make may ask for a hold.
    open: AtomicBool,
    /// Changes answered here, since the mount began: all, and those with a size.
    kept: AtomicU64,
    kept_sizes: AtomicU64,
}

impl Holding {
    /// Changes of files held answered here since the mount began: all, and truncates.
    pub(crate) fn kept_count(&self) -> (u64, u64) {
        let kept = self.kept.load(Ordering::Relaxed);
        (kept, self.kept_sizes.load(Ordering::Relaxed))
    }

    /// Whether a make may ask to hold the file it makes.
    pub(crate) fn may_ask(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The stream of recalls opened (`true`) or ended: when it ends, every hold ends and what
    /// was kept is answered, to be sent as plain changes.
    pub(crate) fn stream_open(&self, open: bool) -> Vec<(Handle, Kept)> {
        self.open.store(open, Ordering::Release);
        if open {
            return Vec::new();
        }
        let mut files = self.files.locked();
        files
            .drain()
            .filter_map(|(handle, held)| {
                let client = held.client;
                held.kept.map(|(change, folds)| {
                    (
                        handle,
                        Kept {
                            change,
                            client,
                            folds,
                        },
                    )
                })
            })
            .collect()
    }

    /// The server let this mount hold `handle`, made by `maker` (through `client`) in `dir`
    /// (`held`: the server's `HOLD_*` bits). Whether the mount holds it now (not if the
    /// server asked for it back already).
    pub(crate) fn granted(
        &self,
        handle: Handle,
        dir: Handle,
        maker: Asker,
        client: &Client,
        held: u32,
    ) -> bool {
        if held & calm_proto::HOLD_MODE_TIMES == 0 {
            return false;
        }
        if self.early.locked().handles.remove(&handle) {
            return false;
        }
        self.files.locked().insert(
            handle,
            Held {
                dir,
                owner_too: held & calm_proto::HOLD_OWNER != 0,
                maker,
                client: client.clone(),
                kept: None,
                kept_since: None,
                ending: false,
                turn: Arc::default(),
            },
        );
        true
    }

    /// The server asked for `handle`, which this mount does not hold (yet): a grant of it seen
    /// later is not taken.
    pub(crate) fn recalled_early(&self, handle: Handle) {
        let mut early = self.early.locked();
        if early.order.len() == EARLY_RECALLS_MAX
            && let Some(oldest) = early.order.pop_front()
        {
            early.handles.remove(&oldest);
        }
        if early.handles.insert(handle) {
            early.order.push_back(handle);
        }
    }

    /// Whether the server asked for `handle` before its grant was seen here (forgotten then).
    pub(crate) fn take_early(&self, handle: Handle) -> bool {
        self.early.locked().handles.remove(&handle)
    }

    /// Whether this mount holds `handle`.
    pub(crate) fn holds(&self, handle: Handle) -> bool {
        self.files.locked().contains_key(&handle)
    }

    /// Whether `handle` has changes kept.
    pub(crate) fn has_kept(&self, handle: Handle) -> bool {
        self.files
            .locked()
            .get(&handle)
            .is_some_and(|h| h.kept.is_some())
    }

    /// Whether `handle` has a size kept.
    pub(crate) fn has_kept_size(&self, handle: Handle) -> bool {
        self.files
            .locked()
            .get(&handle)
            .is_some_and(|h| h.kept.as_ref().is_some_and(|(k, _)| k.size.is_some()))
    }

    /// The lock that orders the sends of `handle`'s changes, if it is held.
    pub(crate) fn turn(&self, handle: Handle) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.files.locked().get(&handle).map(|h| h.turn.clone())
    }

    /// The client of the process that made held file `handle`.
    pub(crate) fn maker_client(&self, handle: Handle) -> Option<Client> {
        self.files.locked().get(&handle).map(|h| h.client.clone())
    }

    /// Answers `change` of `handle` here if the mount holds it and may: `attr` (what the
    /// mount last answered of the file) becomes the file after the change.
    pub(crate) fn keep(
        &self,
        handle: Handle,
        attr: &mut Attr,
        change: &SetAttr,
        asker: Asker,
        now_ns: i64,
    ) -> bool {
        let mut files = self.files.locked();
        let Some(held) = files.get_mut(&handle) else {
            return false;
        };
        if let Some((kept, _)) = &held.kept {
            // What was answered last, over what the caller knew.
            overlay(attr, kept);
        }
        let kept = held.kept.as_ref().map(|(kept, _)| kept);
        if held.ending
            || held.maker != asker
            || !holdable(attr, change, asker, held.owner_too, kept)
        {
            return false;
        }
        let sent = apply(attr, change, now_ns);
        self.kept.fetch_add(1, Ordering::Relaxed);
        if change.size.is_some() {
            self.kept_sizes.fetch_add(1, Ordering::Relaxed);
        }
        match &mut held.kept {
            Some((kept, folds)) => {
                fold(kept, sent);
                *folds += 1;
            }
            None => {
                held.kept = Some((sent, 1));
                held.kept_since = Some(Instant::now());
            }
        }
        true
    }

    /// `attr` as this mount answered it (its kept changes over the server's).
    pub(crate) fn local_view(&self, attr: &mut Attr) {
        if let Some((kept, _)) = self
            .files
            .locked()
            .get(&attr.handle)
            .and_then(|h| h.kept.as_ref())
        {
            overlay(attr, kept);
        }
    }

    /// `handle`'s kept changes, to be sent (they stay kept, and answered, until
    /// [`Holding::sent`]); with `ending`, the hold is being given back: nothing more is kept.
    /// `None` when the file is not held.
    pub(crate) fn to_send(&self, handle: Handle, ending: bool) -> Option<Option<Kept>> {
        let mut files = self.files.locked();
        let held = files.get_mut(&handle)?;
        held.ending |= ending;
        Some(held.kept.as_ref().map(|(change, folds)| Kept {
            change: change.clone(),
            client: held.client.clone(),
            folds: *folds,
        }))
    }

    /// The changes of fold `folds` of `handle` reached the server (or were refused): kept no
    /// more unless more were folded since; with `ending`, the hold ends.
    pub(crate) fn sent(&self, handle: Handle, folds: Option<u64>, ending: bool) {
        let mut files = self.files.locked();
        if ending {
            files.remove(&handle);
            return;
        }
        if let Some(held) = files.get_mut(&handle)
            && held.kept.as_ref().map(|(_, f)| *f) == folds
        {
            held.kept = None;
            held.kept_since = None;
        }
    }

    /// The files held with changes kept since `cutoff` or before.
    pub(crate) fn kept_before(&self, cutoff: Instant) -> Vec<Handle> {
        let files = self.files.locked();
        let due = files
            .iter()
            .filter(|(_, h)| h.kept_since.is_some_and(|at| at <= cutoff));
        due.map(|(handle, _)| *handle).collect()
    }

    /// The files held that were made in `dir`.
    pub(crate) fn in_dir(&self, dir: Handle) -> Vec<Handle> {
        self.files
            .locked()
            .iter()
            .filter(|(_, held)| held.dir == dir)
            .map(|(handle, _)| *handle)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_types::Kind;

    fn file(uid: u32, mode: u32) -> Attr {
        Attr {
            handle: 9,
            generation: 0,
            kind: Kind::File,
            mode,
            uid,
            gid: uid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 100,
        }
    }

    const ALICE: Asker = Asker {
        uid: 1000,
        gid: 1000,
    };
    const ROOT: Asker = Asker { uid: 0, gid: 0 };

    #[test]
    fn only_the_owners_or_the_superusers_plain_changes_are_held() {
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        let chown = SetAttr {
            uid: Some(1),
            gid: Some(1),
            ..SetAttr::default()
        };
        let touch = SetAttr {
            atime: Some(SetTime::Now),
            mtime: Some(SetTime::At(5)),
            ..SetAttr::default()
        };
        let truncate = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        let setuid = SetAttr {
            mode: Some(0o4755),
            ..SetAttr::default()
        };
        let alices = file(1000, 0o644);
        assert!(holdable(&alices, &chmod, ALICE, true, None));
        assert!(holdable(&alices, &touch, ALICE, true, None));
        assert!(holdable(&alices, &chmod, ROOT, true, None));
        assert!(!holdable(
            &alices,
            &chmod,
            Asker { uid: 7, gid: 7 },
            true,
            None
        ));
        assert!(
            !holdable(&alices, &chown, ALICE, true, None),
            "a user's chown"
        );
        assert!(holdable(&alices, &chown, ROOT, true, None));
        assert!(
            !holdable(&alices, &chown, ROOT, false, None),
            "owners not held"
        );
        // A size: no larger, by who may write, alone, and nothing kept of mode or owner.
        let mut written = file(1000, 0o644);
        written.size = 10;
        assert!(holdable(&written, &truncate, ALICE, true, None));
        let grow = SetAttr {
            size: Some(11),
            ..SetAttr::default()
        };
        assert!(!holdable(&written, &grow, ALICE, true, None), "growth");
        assert!(!holdable(&file(1000, 0o444), &truncate, ALICE, true, None));
        assert!(holdable(&file(1000, 0o444), &truncate, ROOT, true, None));
        let both = SetAttr {
            mode: Some(0o600),
            size: Some(0),
            ..SetAttr::default()
        };
        assert!(!holdable(&written, &both, ALICE, true, None));
        assert!(!holdable(&written, &truncate, ALICE, true, Some(&chmod)));
        assert!(holdable(&written, &truncate, ALICE, true, Some(&touch)));
        assert!(!holdable(&written, &truncate, ALICE, true, Some(&truncate)));
        assert!(!holdable(&written, &chmod, ALICE, true, Some(&truncate)));
        assert!(holdable(&written, &touch, ALICE, true, Some(&truncate)));
        assert!(!holdable(&alices, &setuid, ALICE, true, None));
        assert!(!holdable(&file(1000, 0o2755), &chmod, ALICE, true, None));
    }

    #[test]
    fn kept_changes_fold_into_what_was_answered_with_exact_times() {
        let mut attr = file(0, 0o644);
        let first = apply(
            &mut attr,
            &SetAttr {
                mode: Some(0o600),
                mtime: Some(SetTime::Now),
                ..SetAttr::default()
            },
            500,
        );
        let mut kept = first;
        let second = apply(
            &mut attr,
            &SetAttr {
                uid: Some(3),
                mtime: Some(SetTime::At(42)),
                ..SetAttr::default()
            },
            600,
        );
        fold(&mut kept, second);
        assert_eq!(
            kept,
            SetAttr {
                mode: Some(0o600),
                uid: Some(3),
                mtime: Some(SetTime::At(42)),
                ..SetAttr::default()
            }
        );
        assert_eq!(
            (attr.mode, attr.uid, attr.mtime_ns, attr.ctime_ns),
            (0o600, 3, 42, 600)
        );
        let mut from_server = file(0, 0o644);
        overlay(&mut from_server, &kept);
        assert_eq!(
            (from_server.mode, from_server.uid, from_server.mtime_ns),
            (0o600, 3, 42)
        );
    }
}
