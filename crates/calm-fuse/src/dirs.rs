//! Directories this mount holds: a directory it made, which the server let it hold
//! (`calm_proto::HOLD_NAMES`). Nobody else sees into it without the server asking for it
//! back first, so the mount knows every name in it, and answers a create, a mkdir, an unlink
//! or an rmdir in it itself, at once, with a handle the server granted it in advance; the
//! change goes to the server after, in the order answered, through the client's outbox
//! (`calm_client::outbox`), which every other request of the mount waits for.
//!
//! What is answered here (anything else goes to the server, after the directory is given
//! back when it would change the directory's names or attributes otherwise):
//!
//! - a create with O_EXCL or a mkdir by the user and group that made the directory, of a
//!   name it does not hold, with no setuid, setgid or sticky bit; a file so made is held
//!   ([`crate::holding`]), a directory so made is held too;
//! - an unlink of a file, symlink or special file by that user, not open here and not held;
//! - an rmdir of a directory held here with no name in it.
//!
//! The directory is given back (the outbox sent first) when the server asks for it, when a
//! rename, a link, a symlink, a mknod or an attribute change names it here, and when the
//! stream of recalls ends (the server holds nothing of this mount any more). At most
//! [`HELD_DIRS_MAX`] directories are held at once. docs/design/mount.md "Directories held".

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use calm_types::GRANT_USED_FOR;

use calm_types::sync::Locked;
use calm_types::{Attr, Handle, Kind};

use crate::holding::Asker;

/// Directories held at once, at most (the server's bound on one session's holds is larger).
pub const HELD_DIRS_MAX: usize = 16_384;
/// Handles asked for in one grant.
pub const GRANT_COUNT: u64 = 4096;
/// Handles left below which the next grant is asked for.
pub const GRANT_LOW: u64 = 1024;
/// Wait before a directory the server would not let this mount hold is asked for again.
pub const ASK_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(2);
/// Directories remembered as refused, at most (the oldest go first).
const REFUSED_KEPT_MAX: usize = 4096;

/// A directory held, as this mount knows it.
#[derive(Debug)]
struct HeldDir {
    /// The directory it was made in, and its name there (which moves only through the
    /// server, after the directory is given back).
    parent: Handle,
    name: Vec<u8>,
    /// Who made it (who alone makes and removes names in it here).
    maker: Asker,
    /// Its attributes as this mount answers them: its mode (write and search for its owner
    /// are needed), its generation (that of the nodes made in it here), its times and links,
    /// changed by each make and removal answered here.
    attr: Attr,
    /// Every name in it.
    names: HashMap<Vec<u8>, (Handle, Kind)>,
    /// Where quotas limit the makes in it: the directory whose quota share they draw from.
    pool: Option<Handle>,
    /// The generation of the nodes made in it here (the server's now).
    generation: u64,
}

#[derive(Debug, Default)]
struct State {
    dirs: HashMap<Handle, HeldDir>,
    /// Handles granted and not used: ranges `[next, end)`, in order, with when they were
    /// granted (a range is used for [`GRANT_USED_FOR`] at most: the server forgets a grant
    /// unused for longer than any make answered with it takes to reach it).
    handles: VecDeque<(Handle, Handle, Instant)>,
    /// A grant is on its way.
    asking: bool,
    /// Per quota share: the makes left that the server set aside room for.
    rooms: HashMap<Handle, u64>,
    /// Directories this mount asked to hold, which had names already: no make or removal
    /// goes to the server in them until the answer came ([`Dirs::settled`]).
    asked_for: HashSet<Handle>,
    /// Per directory: the makes, removals and renames in it on their way to the server (a
    /// directory is asked for only when none is: the names the server reads are the last).
    busy: HashMap<Handle, u32>,
    /// Directories the server would not let this mount hold, and when (asked again after
    /// [`ASK_AGAIN_AFTER`]).
    refused: HashMap<Handle, Instant>,
}

impl State {
    /// Drops the ranges granted longer ago than [`GRANT_USED_FOR`] before `now`.
    fn drop_old(&mut self, now: Instant) {
        let old = |at: &Instant| now.saturating_duration_since(*at) > GRANT_USED_FOR;
        self.handles.retain(|(_, _, at)| !old(at));
    }

    fn left(&mut self, now: Instant) -> u64 {
        self.drop_old(now);
        self.handles.iter().map(|(next, end, _)| end - next).sum()
    }

    fn take_handle(&mut self, now: Instant) -> Option<Handle> {
        self.drop_old(now);
        let (next, end, _) = self.handles.front_mut()?;
        let handle = *next;
        *next += 1;
        if next == end {
            self.handles.pop_front();
        }
        Some(handle)
    }
}

/// What a make answered here is.
#[derive(Debug, Clone)]
pub(crate) struct LocalMake {
    pub(crate) kind: Kind,
    pub(crate) mode: u32,
    pub(crate) maker: Asker,
}

/// The directories this mount holds, and the handles granted to it.
#[derive(Debug, Default)]
pub(crate) struct Dirs {
    state: Mutex<State>,
    /// An answer to a directory asked for came ([`Dirs::settled`]).
    answered: tokio::sync::Notify,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl Dirs {
    /// The server let this mount hold directory `attr`, made by `maker` as `name` in `parent`;
    /// `room`: where quotas limit the makes in it, how many the server set aside room for.
    pub(crate) fn granted(
        &self,
        attr: &Attr,
        (parent, name): (Handle, &[u8]),
        maker: Asker,
        room: Option<u64>,
    ) {
        let mut state = self.state.locked();
        if state.dirs.len() >= HELD_DIRS_MAX {
            return;
        }
        if let Some(room) = room {
            if state.rooms.len() >= HELD_DIRS_MAX {
                let State { dirs, rooms, .. } = &mut *state;
                rooms.retain(|pool, _| dirs.values().any(|d| d.pool == Some(*pool)));
            }
            state.rooms.insert(attr.handle, room);
        }
        state.dirs.insert(
            attr.handle,
            HeldDir {
                parent,
                name: name.to_vec(),
                maker,
                attr: attr.clone(),
                names: HashMap::new(),
                pool: room.map(|_| attr.handle),
                generation: attr.generation,
            },
        );
    }

    /// The server let this mount hold directory `attr`, which had `names` already, in
    /// `parent`, for `maker`; nodes made in it now get `generation`.
    pub(crate) fn granted_named(
        &self,
        attr: &Attr,
        parent: Handle,
        names: &[calm_types::DirEntry],
        maker: Asker,
        generation: u64,
    ) {
        let mut state = self.state.locked();
        if state.dirs.len() >= HELD_DIRS_MAX {
            return;
        }
        let names = names
            .iter()
            .map(|e| (e.name.clone(), (e.handle, e.kind)))
            .collect();
        let held = HeldDir {
            parent,
            // Its name is not asked for: a name of its parent moved or removed through the
            // server gives back every directory held in the parent (`held_in`).
            name: Vec::new(),
            maker,
            attr: attr.clone(),
            names,
            pool: None,
            generation,
        };
        state.dirs.insert(attr.handle, held);
    }

    /// Whether directory `dir`, which had names before this mount held it, is to be asked
    /// for now (and marks it asked): not held, not asked already, nothing of this mount on
    /// its way to the server in it, not refused within [`ASK_AGAIN_AFTER`].
    pub(crate) fn ask(&self, dir: Handle) -> bool {
        let mut state = self.state.locked();
        let now = Instant::now();
        let refused = state
            .refused
            .get(&dir)
            .is_some_and(|at| now.saturating_duration_since(*at) < ASK_AGAIN_AFTER);
        if refused
            || state.dirs.contains_key(&dir)
            || state.dirs.len() >= HELD_DIRS_MAX
            || state.busy.contains_key(&dir)
            || state.asked_for.contains(&dir)
        {
            return false;
        }
        state.asked_for.insert(dir);
        true
    }

    /// The answer to the ask of `dir` came (`held`: it is held now, [`Dirs::granted_named`]).
    pub(crate) fn asked(&self, dir: Handle, held: bool) {
        let mut state = self.state.locked();
        state.asked_for.remove(&dir);
        if !held {
            if state.refused.len() >= REFUSED_KEPT_MAX {
                let now = Instant::now();
                let fresh = |at: &Instant| now.saturating_duration_since(*at) < ASK_AGAIN_AFTER;
                state.refused.retain(|_, at| fresh(at));
                if state.refused.len() >= REFUSED_KEPT_MAX {
                    state.refused.clear();
                }
            }
            state.refused.insert(dir, Instant::now());
        }
        drop(state);
        self.answered.notify_waiters();
    }

    /// Waits while `dir` is being asked for.
    pub(crate) async fn settled(&self, dir: Handle) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if !self.state.locked().asked_for.contains(&dir) {
                return;
            }
            answered.await;
        }
    }

    /// A make, removal or rename in `dir` goes to the server: counted until the guard is
    /// dropped (after its answer), once no ask of `dir` is on its way.
    pub(crate) async fn through_server(&self, dir: Handle) -> Busy<'_> {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            {
                let mut state = self.state.locked();
                if !state.asked_for.contains(&dir) {
                    *state.busy.entry(dir).or_default() += 1;
                    return Busy { dirs: self, dir };
                }
            }
            answered.await;
        }
    }

    /// Whether this mount holds directory `dir`.
    pub(crate) fn holds(&self, dir: Handle) -> bool {
        self.state.locked().dirs.contains_key(&dir)
    }

    /// Whether few handles are left and no grant is on its way (the keeper is to be woken).
    pub(crate) fn handles_low(&self) -> bool {
        let mut state = self.state.locked();
        !state.asking && state.left(Instant::now()) < GRANT_LOW
    }

    /// Whether a grant of handles should be asked for now (and marks it asked).
    pub(crate) fn wants_handles(&self) -> bool {
        let mut state = self.state.locked();
        if state.asking || state.left(Instant::now()) >= GRANT_LOW {
            return false;
        }
        state.asking = true;
        true
    }

    /// Handles `first .. first + count` were granted (`None`: the grant failed).
    pub(crate) fn handles_granted(&self, granted: Option<(Handle, u64)>) {
        let mut state = self.state.locked();
        state.asking = false;
        if let Some((first, count)) = granted {
            state
                .handles
                .push_back((first, first + count, Instant::now()));
        }
    }

    /// Answers here a make of `name` in `dir` (a mode with the umask applied): the node's
    /// attributes and the directory's after it, or `None` where the server must answer.
    /// `queue` is called, under the directory table's lock, with the handle the node gets and
    /// the time it was answered at, to queue the make to the outbox in the order handles are
    /// taken.
    pub(crate) fn make(
        &self,
        dir: Handle,
        name: &[u8],
        node: &LocalMake,
        queue: impl FnOnce(Handle, i64),
    ) -> Option<(Attr, Attr)> {
        if name.len() > calm_types::NAME_LEN_MAX || node.mode & 0o7000 != 0 {
            return None;
        }
        let mut state = self.state.locked();
        if node.kind == Kind::Dir && state.dirs.len() >= HELD_DIRS_MAX {
            return None;
        }
        let held = state.dirs.get(&dir)?;
        if held.maker != node.maker
            || (node.maker.uid != 0 && held.attr.mode & 0o300 != 0o300)
            || held.names.contains_key(name)
        {
            return None;
        }
        // Where quotas limit it: within the room set aside (past it, the server judges).
        let pool = held.pool;
        if pool.is_some_and(|pool| state.rooms.get(&pool).is_none_or(|left| *left == 0)) {
            return None;
        }
        let generation = held.generation;
        let handle = state.take_handle(Instant::now())?;
        if let Some(left) = pool.and_then(|pool| state.rooms.get_mut(&pool)) {
            *left -= 1;
        }
        let now = now_ns();
        let attr = Attr {
            handle,
            generation,
            kind: node.kind,
            mode: node.mode,
            uid: node.maker.uid,
            gid: node.maker.gid,
            nlink: if node.kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
        };
        let held = state.dirs.get_mut(&dir).expect("looked up above");
        held.names.insert(name.to_vec(), (handle, node.kind));
        held.attr.mtime_ns = now;
        held.attr.ctime_ns = now;
        if node.kind == Kind::Dir {
            held.attr.nlink += 1;
        }
        let dir_attr = held.attr.clone();
        if node.kind == Kind::Dir {
            state.dirs.insert(
                handle,
                HeldDir {
                    parent: dir,
                    name: name.to_vec(),
                    maker: node.maker,
                    attr: attr.clone(),
                    names: HashMap::new(),
                    pool,
                    generation,
                },
            );
        }
        queue(handle, now);
        Some((attr, dir_attr))
    }

    /// Answers here an unlink (`rmdir` false) or rmdir of `name` in `dir` by `asker`: the
    /// handle removed and the directory's attributes after it, or `None` where the server
    /// must answer. `busy` says whether a file
    /// may not be removed here (open or held here); `queue` as for [`Dirs::make`], with the
    /// handle removed.
    pub(crate) fn remove(
        &self,
        dir: Handle,
        name: &[u8],
        rmdir: bool,
        asker: Asker,
        busy: impl FnOnce(Handle) -> bool,
        queue: impl FnOnce(Handle, i64),
    ) -> Option<(Handle, Attr)> {
        let mut state = self.state.locked();
        let held = state.dirs.get(&dir)?;
        if held.maker != asker {
            return None;
        }
        let &(handle, kind) = held.names.get(name)?;
        match (rmdir, kind) {
            (false, Kind::Dir) => return None,
            (false, _) if busy(handle) => return None,
            (false, _) => {}
            (true, Kind::Dir) => {
                // Only a directory held here, whose every name is known: an empty one.
                if !state.dirs.get(&handle).is_some_and(|d| d.names.is_empty()) {
                    return None;
                }
                state.dirs.remove(&handle);
            }
            (true, _) => return None,
        }
        let held = state.dirs.get_mut(&dir).expect("looked up above");
        held.names.remove(name);
        let now = now_ns();
        held.attr.mtime_ns = now;
        held.attr.ctime_ns = now;
        if rmdir {
            held.attr.nlink -= 1;
        }
        let dir_attr = held.attr.clone();
        queue(handle, now);
        Some((handle, dir_attr))
    }

    /// Stops answering in `dir` here: whether it was held (it is to be given back once the
    /// outbox sent what was answered in it).
    pub(crate) fn release(&self, dir: Handle) -> bool {
        self.state.locked().dirs.remove(&dir).is_some()
    }

    /// Forgets the directory held as `name` in `parent` (removed through the server).
    pub(crate) fn removed(&self, parent: Handle, name: &[u8]) {
        let mut state = self.state.locked();
        state
            .dirs
            .retain(|_, d| d.parent != parent || d.name != name);
    }

    /// The directories held that were made in `parent`.
    pub(crate) fn held_in(&self, parent: Handle) -> Vec<Handle> {
        let state = self.state.locked();
        let held = state.dirs.iter();
        held.filter(|(_, d)| d.parent == parent)
            .map(|(handle, _)| *handle)
            .collect()
    }

    /// The stream of recalls ended: the server holds nothing of this mount any more.
    pub(crate) fn stream_ended(&self) {
        let mut state = self.state.locked();
        state.dirs.clear();
        state.rooms.clear();
    }

    /// Directories held now.
    pub(crate) fn count(&self) -> usize {
        self.state.locked().dirs.len()
    }
}

/// A make, removal or rename of this mount on its way to the server in a directory
/// ([`Dirs::through_server`]).
#[derive(Debug)]
pub(crate) struct Busy<'a> {
    dirs: &'a Dirs,
    dir: Handle,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut state = self.dirs.state.locked();
        if let Some(count) = state.busy.get_mut(&self.dir) {
            *count -= 1;
            if *count == 0 {
                state.busy.remove(&self.dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn dir(handle: Handle, uid: u32) -> Attr {
        Attr {
            handle,
            generation: 1,
            kind: Kind::Dir,
            mode: 0o755,
            uid,
            gid: uid,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    fn node(kind: Kind, uid: u32) -> LocalMake {
        LocalMake {
            kind,
            mode: 0o644,
            maker: Asker { uid, gid: uid },
        }
    }

    #[test]
    fn handles_granted_longer_ago_than_they_are_used_for_are_not_taken() {
        let start = Instant::now();
        let mut state = State::default();
        state.handles.push_back((100, 102, start));
        let later = start + GRANT_USED_FOR / 2;
        state.handles.push_back((200, 203, later));
        assert_eq!(state.left(start), 5);
        assert_eq!(state.take_handle(start), Some(100));
        let past_first = start + GRANT_USED_FOR + Duration::from_secs(1);
        assert_eq!(
            state.left(past_first),
            3,
            "the first grant's last handle dropped"
        );
        assert_eq!(state.take_handle(past_first), Some(200));
        let past_both = later + GRANT_USED_FOR + Duration::from_secs(1);
        assert_eq!(state.take_handle(past_both), None);
        assert_eq!(state.left(past_both), 0);
    }

    #[test]
    fn a_held_directory_answers_its_makers_makes_and_removals_with_granted_handles() {
        let dirs = Dirs::default();
        let me = Asker { uid: 7, gid: 7 };
        dirs.granted(&dir(10, 7), (1, b"d"), me, None);
        let mut queued = Vec::new();
        // No handles yet: the server answers.
        assert!(
            dirs.make(10, b"a", &node(Kind::File, 7), |h, _| queued.push(h))
                .is_none()
        );
        assert!(dirs.wants_handles());
        assert!(!dirs.wants_handles(), "one grant asked at a time");
        dirs.handles_granted(Some((100, 2)));
        let (a, d) = dirs
            .make(10, b"a", &node(Kind::File, 7), |h, _| queued.push(h))
            .unwrap();
        assert_eq!((a.handle, a.uid, a.nlink), (100, 7, 1));
        assert_eq!((d.handle, d.nlink, d.mtime_ns), (10, 2, a.mtime_ns));
        // The name is there: the server says so, not this mount.
        assert!(
            dirs.make(10, b"a", &node(Kind::File, 7), |h, _| queued.push(h))
                .is_none()
        );
        // Another user, or a directory not held: the server.
        assert!(
            dirs.make(10, b"b", &node(Kind::File, 8), |h, _| queued.push(h))
                .is_none()
        );
        assert!(
            dirs.make(11, b"b", &node(Kind::File, 7), |h, _| queued.push(h))
                .is_none()
        );
        let (sub, d) = dirs
            .make(10, b"d", &node(Kind::Dir, 7), |h, _| queued.push(h))
            .unwrap();
        assert_eq!(d.nlink, 3, "a directory made in it links to it");
        assert!(dirs.holds(sub.handle), "a directory made here is held");
        assert_eq!(dirs.held_in(10), vec![sub.handle]);
        // The handles are used up.
        assert!(
            dirs.make(10, b"c", &node(Kind::File, 7), |h, _| queued.push(h))
                .is_none()
        );
        assert_eq!(queued, vec![100, 101]);
        // An open file is the server's to unlink; a closed one is unlinked here.
        assert!(
            dirs.remove(10, b"a", false, me, |_| true, |h, _| queued.push(h))
                .is_none()
        );
        let removed = dirs.remove(10, b"a", false, me, |_| false, |h, _| queued.push(h));
        assert_eq!(removed.map(|(h, d)| (h, d.nlink)), Some((100, 3)));
        // rmdir of an empty directory held here; not of a name that is not a directory.
        let removed = dirs.remove(10, b"d", true, me, |_| false, |h, _| queued.push(h));
        assert_eq!(removed.map(|(h, d)| (h, d.nlink)), Some((101, 2)));
        assert!(!dirs.holds(101));
        assert!(dirs.release(10));
        assert!(!dirs.release(10));
        dirs.granted(&dir(10, 7), (1, b"d"), me, None);
        dirs.removed(1, b"d");
        assert!(!dirs.holds(10), "removed through the server: forgotten");
        assert!(
            dirs.make(10, b"e", &node(Kind::File, 7), |h, _| queued.push(h))
                .is_none()
        );
    }

    #[test]
    fn a_directory_with_a_name_in_it_is_removed_by_the_server() {
        let dirs = Dirs::default();
        let me = Asker { uid: 0, gid: 0 };
        dirs.granted(&dir(10, 0), (1, b"d"), me, None);
        dirs.handles_granted(Some((100, 10)));
        let (sub, _) = dirs.make(10, b"d", &node(Kind::Dir, 0), |_, _| {}).unwrap();
        dirs.make(sub.handle, b"f", &node(Kind::File, 0), |_, _| {})
            .unwrap();
        assert!(
            dirs.remove(10, b"d", true, me, |_| false, |_, _| {})
                .is_none()
        );
        assert!(
            dirs.remove(10, b"d", false, me, |_| false, |_, _| {})
                .is_none()
        );
        dirs.remove(sub.handle, b"f", false, me, |_| false, |_, _| {})
            .unwrap();
        assert!(
            dirs.remove(10, b"d", true, me, |_| false, |_, _| {})
                .is_some()
        );
    }

    #[test]
    fn makes_under_a_quota_stop_at_the_room_set_aside_for_them() {
        let dirs = Dirs::default();
        let me = Asker { uid: 7, gid: 7 };
        dirs.granted(&dir(10, 7), (1, b"d"), me, Some(3));
        dirs.granted(&dir(20, 7), (1, b"e"), me, None);
        dirs.handles_granted(Some((100, 100)));
        let searchable = LocalMake {
            mode: 0o755,
            ..node(Kind::Dir, 7)
        };
        let (sub, _) = dirs.make(10, b"s", &searchable, |_, _| {}).unwrap();
        dirs.make(10, b"a", &node(Kind::File, 7), |_, _| {})
            .unwrap();
        // A directory made in it draws from the same room.
        dirs.make(sub.handle, b"b", &node(Kind::File, 7), |_, _| {})
            .unwrap();
        for (dir, name) in [(10, &b"c"[..]), (sub.handle, b"c")] {
            assert!(
                dirs.make(dir, name, &node(Kind::File, 7), |_, _| {})
                    .is_none(),
                "past the room set aside, the server judges"
            );
        }
        // A removal gives no room back here (the server counts it when it comes).
        dirs.remove(10, b"a", false, me, |_| false, |_, _| {})
            .unwrap();
        assert!(
            dirs.make(10, b"a", &node(Kind::File, 7), |_, _| {})
                .is_none()
        );
        // Where no quota limits the makes, no room is counted.
        for i in 0..10u8 {
            dirs.make(20, &[b'f', i], &node(Kind::File, 7), |_, _| {})
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_directory_with_names_is_asked_for_only_when_nothing_of_the_mount_is_on_its_way() {
        let dirs = Dirs::default();
        let me = Asker { uid: 7, gid: 7 };
        // A make on its way to the server in 10: not asked for.
        let busy = dirs.through_server(10).await;
        assert!(!dirs.ask(10));
        drop(busy);
        assert!(dirs.ask(10), "asked once nothing is on its way");
        assert!(!dirs.ask(10), "not twice at once");
        // While asked for, a change through the server waits for the answer.
        let dirs = std::sync::Arc::new(dirs);
        let waiting = {
            let dirs = dirs.clone();
            tokio::spawn(async move {
                let _busy = dirs.through_server(10).await;
                dirs.holds(10)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        let old = |name: &[u8], handle, kind| calm_types::DirEntry {
            name: name.to_vec(),
            handle,
            kind,
            cookie: 0,
        };
        let names = [old(b"f", 50, Kind::File), old(b"s", 51, Kind::Dir)];
        dirs.granted_named(&dir(10, 7), 1, &names, me, 9);
        dirs.asked(10, true);
        assert!(waiting.await.unwrap(), "it waited until the answer");
        // Held with the names it had: an old name is not made again, an old file is removed
        // here, an old directory (not held here) is not, and new nodes get the generation
        // the server gave.
        dirs.handles_granted(Some((100, 10)));
        assert!(
            dirs.make(10, b"f", &node(Kind::File, 7), |_, _| {})
                .is_none()
        );
        let (made, _) = dirs
            .make(10, b"g", &node(Kind::File, 7), |_, _| {})
            .unwrap();
        assert_eq!((made.handle, made.generation), (100, 9));
        let removed = dirs.remove(10, b"f", false, me, |_| false, |_, _| {});
        assert_eq!(removed.map(|(h, _)| h), Some(50));
        assert!(
            dirs.remove(10, b"s", true, me, |_| false, |_, _| {})
                .is_none()
        );
        assert!(!dirs.ask(10), "held: not asked for");
        // Refused: not asked again until a while later.
        assert!(dirs.ask(11));
        dirs.asked(11, false);
        assert!(!dirs.ask(11));
        dirs.state
            .locked()
            .refused
            .insert(11, Instant::now() - ASK_AGAIN_AFTER);
        assert!(dirs.ask(11));
    }
}
