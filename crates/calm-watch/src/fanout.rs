//! Every watcher, the index that finds the ones a change matters to, and delivery.
//!
//! A change names the object it is about and the directories whose entries it changes (a
//! rename: both). Watchers are found through three maps, never by testing every watcher:
//! watchers of a handle, watchers of a directory (its entries), and recursive watchers of a
//! directory (everything below it), looked up for each ancestor of the changed directories. So
//! publishing costs O(depth + m) for m matching watchers, whatever the number of watchers.
//! Watchers of everything (mounts) are a list of their own, matched by every change.
//!
//! A watcher that starts from an index already published catches up first: the caller reads
//! the changelog from there and hands the records to [`Fanout::catch_up`]; live changes skip it
//! until it reaches the live index, so nothing is delivered twice or out of order.

use std::collections::HashMap;
use std::sync::Arc;

use crate::queue::{Queue, QueueStats};
use crate::{Change, Event, Handle};

pub type WatcherId = u64;

/// What a watcher watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The entries of a directory; with `recursive`, everything below it.
    Dir { handle: Handle, recursive: bool },
    /// These objects, wherever they are.
    Handles(Vec<Handle>),
    /// Every change, in order and never coalesced (a mount keeping its cache exact).
    All,
}

impl Target {
    /// The queue a watcher of this target gets.
    fn queue(&self, max: usize) -> Queue {
        match self {
            Target::All => Queue::exact(max),
            _ => Queue::new(max),
        }
    }
}

/// Named limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub watchers_max: usize,
    /// Changes one watcher may have queued before it is told to resync.
    pub queue_max: usize,
    pub handles_per_watcher_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            watchers_max: 1 << 20,
            queue_max: 4096,
            handles_per_watcher_max: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchError {
    TooManyWatchers(usize),
    TooManyHandles(usize),
    NoHandles,
    NoSuchWatcher(WatcherId),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchError::TooManyWatchers(max) => write!(f, "too many watchers (limit {max})"),
            WatchError::TooManyHandles(max) => {
                write!(f, "too many handles in one watch (limit {max})")
            }
            WatchError::NoHandles => write!(f, "a watch of handles needs at least one"),
            WatchError::NoSuchWatcher(id) => write!(f, "no watcher {id}"),
        }
    }
}

impl std::error::Error for WatchError {}

#[derive(Debug, Clone)]
struct Watcher {
    target: Target,
    queue: Queue,
    /// Live: receives published changes. Otherwise catching up, at `position`.
    live: bool,
    /// Highest index this watcher has been told about (a change or a progress event).
    told: u64,
    /// Catching up: the highest index replayed to it. (A live watcher is at the fan-out's
    /// last index: nothing per watcher changes when a change does not match it.)
    position: u64,
    /// A progress event is wanted once the position reaches this index.
    wanted: Option<u64>,
    /// Publication stamp, so a watcher matched twice by one change queues it once.
    stamp: u64,
}

/// Figures of the whole fan-out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanoutStats {
    pub watchers: usize,
    pub published: u64,
    /// Queued deliveries (one per matching watcher and change).
    pub matched: u64,
    pub coalesced: u64,
    pub resyncs: u64,
    /// Changes queued for their watchers now, in all, and in the fullest queue.
    pub queued: u64,
    pub queued_max: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Fanout {
    limits: Limits,
    watchers: HashMap<WatcherId, Watcher>,
    by_handle: HashMap<Handle, Vec<WatcherId>>,
    by_dir: HashMap<Handle, Vec<WatcherId>>,
    by_tree: HashMap<Handle, Vec<WatcherId>>,
    /// Watchers of every change.
    all: Vec<WatcherId>,
    next_id: WatcherId,
    /// Index of the last change published.
    last: u64,
    stamp: u64,
    published: u64,
    matched: u64,
    /// Queue figures of watchers that are gone.
    gone: QueueStats,
    /// Reused by `publish`.
    woken: Vec<WatcherId>,
    /// Watchers that asked for a progress event (see [`Fanout::due`]).
    wanting: Vec<WatcherId>,
}

fn unindex(map: &mut HashMap<Handle, Vec<WatcherId>>, key: Handle, id: WatcherId) {
    if let Some(list) = map.get_mut(&key) {
        list.retain(|w| *w != id);
        if list.is_empty() {
            map.remove(&key);
        }
    }
}

impl Fanout {
    /// A fan-out whose stream has published everything up to `last`.
    pub fn new(limits: Limits, last: u64) -> Fanout {
        Fanout {
            limits,
            last,
            next_id: 1,
            ..Fanout::default()
        }
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    /// Whether some watcher watches a directory or a subtree (the publisher then looks up
    /// the other directories of a multi-link file whose attributes changed).
    pub fn watches_directories(&self) -> bool {
        !self.by_dir.is_empty()
    }

    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    /// Adds a watcher that wants every matching change from index `from` on. Returns its id
    /// and whether it is live at once (`from` past the last published change); otherwise the
    /// caller feeds it the changes from `from` through [`Fanout::catch_up`].
    pub fn watch(&mut self, target: Target, from: u64) -> Result<(WatcherId, bool), WatchError> {
        if self.watchers.len() >= self.limits.watchers_max {
            return Err(WatchError::TooManyWatchers(self.limits.watchers_max));
        }
        match &target {
            Target::Handles(handles) if handles.is_empty() => return Err(WatchError::NoHandles),
            Target::Handles(handles) if handles.len() > self.limits.handles_per_watcher_max => {
                return Err(WatchError::TooManyHandles(
                    self.limits.handles_per_watcher_max,
                ));
            }
            _ => {}
        }
        let id = self.next_id;
        self.next_id += 1;
        match &target {
            Target::Dir { handle, recursive } => {
                self.by_dir.entry(*handle).or_default().push(id);
                if *recursive {
                    self.by_tree.entry(*handle).or_default().push(id);
                }
            }
            Target::Handles(handles) => {
                let mut seen = handles.clone();
                seen.sort_unstable();
                seen.dedup();
                for handle in seen {
                    self.by_handle.entry(handle).or_default().push(id);
                }
            }
            Target::All => self.all.push(id),
        }
        let live = from > self.last;
        let position = if live {
            self.last
        } else {
            from.saturating_sub(1)
        };
        let queue = target.queue(self.limits.queue_max);
        self.watchers.insert(
            id,
            Watcher {
                target,
                queue,
                live,
                told: position,
                position,
                wanted: None,
                stamp: 0,
            },
        );
        Ok((id, live))
    }

    /// Removes a watcher (its stream ended).
    pub fn unwatch(&mut self, id: WatcherId) -> Result<(), WatchError> {
        let watcher = self
            .watchers
            .remove(&id)
            .ok_or(WatchError::NoSuchWatcher(id))?;
        match &watcher.target {
            Target::Dir { handle, recursive } => {
                unindex(&mut self.by_dir, *handle, id);
                if *recursive {
                    unindex(&mut self.by_tree, *handle, id);
                }
            }
            Target::Handles(handles) => {
                for handle in handles {
                    unindex(&mut self.by_handle, *handle, id);
                }
            }
            Target::All => self.all.retain(|w| *w != id),
        }
        let stats = watcher.queue.stats();
        self.gone.pushed += stats.pushed;
        self.gone.coalesced += stats.coalesced;
        self.gone.resyncs += stats.resyncs;
        Ok(())
    }

    /// Whether `target` wants `change`, given the ancestors of the change's directories.
    fn wants(target: &Target, change: &Change, ancestors: &[Handle]) -> bool {
        match target {
            Target::Handles(handles) => handles.contains(&change.object),
            Target::All => true,
            Target::Dir { handle, recursive } => {
                change.dirs().any(|d| d == *handle) || (*recursive && ancestors.contains(handle))
            }
        }
    }

    /// Publishes the next change (indices strictly increase). `ancestors`: every directory
    /// above the change's directories, up to the root (the caller knows the tree). Returns the
    /// watchers that have something new to take.
    pub fn publish(&mut self, change: Change, ancestors: &[Handle]) -> &[WatcherId] {
        debug_assert!(change.index > self.last, "publish in index order");
        self.last = change.index;
        self.published += 1;
        self.stamp += 1;
        self.woken.clear();
        let change = Arc::new(change);
        let stamp = self.stamp;
        let mut candidates: Vec<WatcherId> = Vec::new();
        if let Some(list) = self.by_handle.get(&change.object) {
            candidates.extend_from_slice(list);
        }
        for dir in change.dirs() {
            if let Some(list) = self.by_dir.get(&dir) {
                candidates.extend_from_slice(list);
            }
        }
        for ancestor in ancestors {
            if let Some(list) = self.by_tree.get(ancestor) {
                candidates.extend_from_slice(list);
            }
        }
        candidates.extend_from_slice(&self.all);
        for id in candidates {
            let Some(watcher) = self.watchers.get_mut(&id) else {
                continue;
            };
            if watcher.stamp == stamp || !watcher.live {
                continue;
            }
            watcher.stamp = stamp;
            watcher.queue.push(change.clone());
            self.matched += 1;
            self.woken.push(id);
        }
        &self.woken
    }

    /// Feeds a catching-up watcher the changes after its position (in order), up to `through`
    /// (the changelog's last index when the caller read it). Changes the watcher does not want
    /// are skipped here. Returns whether the watcher is now live. A catching-up watcher whose
    /// history is gone (purged) is told to resync: pass `purged = true`.
    pub fn catch_up(
        &mut self,
        id: WatcherId,
        changes: Vec<(Change, Vec<Handle>)>,
        through: u64,
        purged: bool,
    ) -> Result<bool, WatchError> {
        let last = self.last;
        let watcher = self
            .watchers
            .get_mut(&id)
            .ok_or(WatchError::NoSuchWatcher(id))?;
        if watcher.live {
            return Ok(true);
        }
        if purged {
            // Nothing to replay from: resync from the live stream on.
            let mut queue = watcher.target.queue(self.limits.queue_max);
            queue.force_resync(last + 1);
            watcher.queue = queue;
            watcher.live = true;
            watcher.position = last;
            return Ok(true);
        }
        for (change, ancestors) in changes {
            if change.index <= watcher.position {
                continue;
            }
            if change.index > last {
                // Not published by the feed yet (it reads the changelog behind the caller):
                // the feed delivers it, in order, once the watcher is live.
                break;
            }
            watcher.position = change.index;
            if Self::wants(&watcher.target, &change, &ancestors) {
                watcher.queue.push(Arc::new(change));
                self.matched += 1;
            }
        }
        watcher.position = watcher.position.max(through.min(last));
        if watcher.position >= last {
            watcher.live = true;
        }
        Ok(watcher.live)
    }

    /// Asks for a progress event once the watcher's stream has passed `index` (the completion
    /// of the caller's own operation).
    pub fn want_progress(&mut self, id: WatcherId, index: u64) -> Result<(), WatchError> {
        let watcher = self
            .watchers
            .get_mut(&id)
            .ok_or(WatchError::NoSuchWatcher(id))?;
        watcher.wanted = Some(watcher.wanted.map_or(index, |w| w.min(index)));
        if !self.wanting.contains(&id) {
            self.wanting.push(id);
        }
        Ok(())
    }

    /// Watchers that asked for a progress event and whose stream has now passed the index
    /// they named (to be woken): O(watchers that asked), not O(watchers).
    pub fn due(&mut self) -> Vec<WatcherId> {
        let last = self.last;
        let watchers = &self.watchers;
        let mut due = Vec::new();
        self.wanting.retain(|id| match watchers.get(id) {
            Some(w) => {
                let position = if w.live { last } else { w.position };
                if w.wanted.is_some_and(|want| want <= position) {
                    due.push(*id);
                    false
                } else {
                    w.wanted.is_some()
                }
            }
            None => false,
        });
        due
    }

    /// Whether `id` has something to take now (with `tick`: counting a periodic progress
    /// event that would tell it about changes that did not match it).
    pub fn ready(&self, id: WatcherId, tick: bool) -> bool {
        self.watchers.get(&id).is_some_and(|w| {
            let position = self.position(w);
            !w.queue.is_empty()
                || (position > w.told && (tick || w.wanted.is_some_and(|want| want <= position)))
        })
    }

    fn position(&self, watcher: &Watcher) -> u64 {
        if watcher.live {
            self.last
        } else {
            watcher.position
        }
    }

    /// Up to `max` events for watcher `id`. When its queue is empty and its stream has moved
    /// past what it was told (changes that did not match it), a progress event tells it so:
    /// when asked for (`want_progress`) or on a periodic `tick` (about once a second for an
    /// idle watcher).
    pub fn take(
        &mut self,
        id: WatcherId,
        max: usize,
        tick: bool,
    ) -> Result<Vec<Event>, WatchError> {
        let last = self.last;
        let watcher = self
            .watchers
            .get_mut(&id)
            .ok_or(WatchError::NoSuchWatcher(id))?;
        let position = if watcher.live { last } else { watcher.position };
        let mut out = Vec::new();
        watcher.queue.take(max, &mut out);
        for event in &out {
            if let Event::Change(change) = event {
                watcher.told = watcher.told.max(change.index);
            }
        }
        let wanted = watcher.wanted.is_some_and(|w| w <= position);
        if watcher.queue.is_empty()
            && position > watcher.told
            && (tick || wanted)
            && out.len() < max.max(1)
        {
            out.push(Event::Progress { index: position });
            watcher.told = position;
        }
        if watcher.wanted.is_some_and(|w| w <= watcher.told) {
            watcher.wanted = None;
        }
        Ok(out)
    }

    pub fn stats(&self) -> FanoutStats {
        let mut stats = FanoutStats {
            watchers: self.watchers.len(),
            published: self.published,
            matched: self.matched,
            coalesced: self.gone.coalesced,
            resyncs: self.gone.resyncs,
            queued: 0,
            queued_max: 0,
        };
        for watcher in self.watchers.values() {
            let q = watcher.queue.stats();
            stats.coalesced += q.coalesced;
            stats.resyncs += q.resyncs;
            let len = watcher.queue.len() as u64;
            stats.queued += len;
            stats.queued_max = stats.queued_max.max(len);
        }
        stats
    }
}
