//! The watch service: one feed task reads the changelog as it commits (a long poll on the
//! committer's last index), encodes each record once, and publishes it into the fan-out
//! (`calm-watch`); one task per watch stream takes its events and sends them. A slow stream
//! only lets its own queue coalesce or resync: the feed never waits for a watcher, and the
//! committer never waits for the feed.
//!
//! The changelog writes only the record types some reader wants, so the first watch registers
//! an internal reader, `calm-watch`, wanting every type; the feed clears it as it publishes,
//! keeping the last [`HISTORY_RECORDS`] records so that a watch can resume from a recent index.
//! A watch from an index the changelog no longer holds starts with a resync.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_changelog::{Mask, Record};
use calm_meta::{Handle, Kind, Meta, MetaError, ROOT};
use calm_proto::changelog::record_to_wire;
use calm_proto::pb::watch_server::Watch as WatchRpc;
use calm_proto::{pb, status_from_error};
use calm_store::Store;
use calm_watch::{Change, Event, Fanout, Limits, Target, WatcherId};
use prost::Message;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Name of the internal changelog reader that keeps records flowing to watches.
pub const READER_NAME: &str = "calm-watch";
/// Most events in one batch of a stream (a request may ask for fewer).
pub const BATCH_MAX: usize = 65_536;
/// Default events per batch.
pub const BATCH_DEFAULT: usize = 1024;
/// Records the feed reads from the changelog at once.
const FEED_READ_RECORDS: usize = 4096;
/// An idle watcher hears from its stream at least this often (a progress event).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Records the internal reader keeps behind the feed, so that a watch can resume from an index
/// up to this far back (further back, it starts with a resync).
pub const HISTORY_RECORDS: u64 = 65_536;
/// The feed clears its reader at most this often when it has caught up (and once per 65 536
/// records when it has not).
const FEED_CLEAR_EVERY: Duration = Duration::from_secs(1);
/// Most directories whose parent the feed remembers (for subtree watches).
const PARENTS_MAX: usize = 1 << 20;

#[derive(Debug, Default)]
struct Inner {
    fanout: Fanout,
    wakers: HashMap<WatcherId, Arc<Notify>>,
    /// The watches of every change (a mount's cache follows one), with the identity that
    /// opened each.
    followers: HashMap<WatcherId, String>,
}

/// What every watch shares.
#[derive(Debug)]
pub struct WatchHub<S: Store> {
    meta: Arc<Meta<S>>,
    inner: Mutex<Inner>,
    /// Directory → its parent, kept from the records themselves (MKDIR, RENME, RMDIR).
    parents: Mutex<HashMap<Handle, Handle>>,
    feed: tokio::sync::OnceCell<()>,
    /// Set when the server stops: every watch stream ends at once.
    pub(crate) stopping: crate::stopping::Stopping,
    /// The feed clears its reader only while this server commits the namespace's mutations
    /// ([`WatchHub::clear_only_when_committing`]; unset: always).
    clears: std::sync::OnceLock<Arc<crate::lock_table::LockTable>>,
}

fn meta_status(error: &MetaError) -> Status {
    status_from_error(error)
}

impl<S: Store> WatchHub<S> {
    pub fn new(meta: Arc<Meta<S>>, limits: Limits) -> Arc<WatchHub<S>> {
        let last = meta.changelog_last();
        Arc::new(WatchHub {
            meta,
            inner: Mutex::new(Inner {
                fanout: Fanout::new(limits, last),
                wakers: HashMap::new(),
                followers: HashMap::new(),
            }),
            parents: Mutex::new(HashMap::new()),
            feed: tokio::sync::OnceCell::new(),
            stopping: Default::default(),
            clears: std::sync::OnceLock::new(),
        })
    }

    /// Makes the feed clear its reader only while `table` says this server commits the
    /// namespace's mutations. Several servers of one namespace share the feed's reader, and a
    /// clear is a commit: made by a server that does not commit the mutations, it conflicts
    /// with the one that does (which runs its whole group again). So only that one clears;
    /// the others read.
    pub fn clear_only_when_committing(&self, table: Arc<crate::lock_table::LockTable>) {
        let _ = self.clears.set(table);
    }

    fn clears_here(&self) -> bool {
        self.clears.get().is_none_or(|table| table.commits_here())
    }

    /// Starts the feed now when an earlier run left the internal reader registered (so that
    /// its records keep being cleared).
    pub async fn resume(self: &Arc<Self>) -> Result<(), MetaError> {
        let registered = self
            .meta
            .changelog_users()?
            .users
            .iter()
            .any(|u| u.name == READER_NAME);
        if registered {
            self.start_feed().await?;
        }
        Ok(())
    }

    /// Starts the feed (registering the internal reader when needed) if it is not running.
    pub async fn start_feed(self: &Arc<Self>) -> Result<(), MetaError> {
        self.feed
            .get_or_try_init(|| async {
                let users = self.meta.changelog_users()?;
                let reader = match users.users.iter().find(|u| u.name == READER_NAME) {
                    Some(user) => user.id,
                    None => {
                        self.meta
                            .changelog_register(READER_NAME, Mask::all())
                            .await?
                            .id
                    }
                };
                tokio::spawn(self.clone().feed(reader));
                Ok::<_, MetaError>(())
            })
            .await
            .map(|_| ())
    }

    /// The directories above `dir`, up to the root.
    fn ancestors_of(&self, mut dir: Handle, out: &mut Vec<Handle>) {
        let mut parents = self.parents.locked();
        for _ in 0..4096 {
            if dir == ROOT || dir == 0 {
                return;
            }
            let parent = match parents.get(&dir) {
                Some(parent) => *parent,
                None => match self.meta.lookup(dir, b"..") {
                    Ok(attr) => {
                        if parents.len() >= PARENTS_MAX {
                            parents.clear();
                        }
                        parents.insert(dir, attr.handle);
                        attr.handle
                    }
                    Err(_) => return, // gone since: nothing above it to match
                },
            };
            if !out.contains(&parent) {
                out.push(parent);
            }
            dir = parent;
        }
    }

    /// The changes `records` are, with the ancestors of their directories.
    fn changes_of(&self, records: &[Record]) -> Vec<(Change, Vec<Handle>)> {
        let directories = self.inner.locked().fanout.watches_directories();
        records
            .iter()
            .map(|record| {
                let more = match directories {
                    true => self.other_parents(record),
                    false => Vec::new(),
                };
                self.change_of(record, more)
            })
            .collect()
    }

    /// For a change of a file's attributes: the directories holding its other names (a file
    /// with several; the record names one). Read when the feed publishes the change.
    fn other_parents(&self, record: &Record) -> Vec<Handle> {
        use calm_changelog::RecordType as T;
        let attributes = matches!(
            record.kind,
            T::Trunc | T::Setattr | T::Xattr | T::Mtime | T::Ctime | T::Atime
        );
        if !attributes || record.parent == 0 {
            return Vec::new();
        }
        match self.meta.parents(record.target) {
            Ok(mut parents) => {
                parents.retain(|p| *p != record.parent);
                parents
            }
            Err(_) => Vec::new(), // gone since
        }
    }

    /// The change a record is, with the ancestors of its directories; keeps the parent map up
    /// to date from the record.
    fn change_of(&self, record: &Record, more_dirs: Vec<Handle>) -> (Change, Vec<Handle>) {
        use calm_changelog::RecordType as T;
        {
            let mut parents = self.parents.locked();
            match record.kind {
                T::Mkdir => {
                    parents.insert(record.target, record.parent);
                }
                T::Rmdir => {
                    parents.remove(&record.target);
                }
                T::Rename => {
                    if let Some(parent) = parents.get_mut(&record.target) {
                        *parent = record.parent;
                    }
                }
                _ => {}
            }
        }
        let change = Change {
            index: record.index,
            object: record.target,
            dir: record.parent,
            other_dir: record.rename.as_ref().map_or(0, |r| r.source_parent),
            more_dirs,
            encoded: Arc::from(record_to_wire(record).encode_to_vec()),
        };
        let mut ancestors = Vec::new();
        for dir in change.dirs() {
            self.ancestors_of(dir, &mut ancestors);
        }
        (change, ancestors)
    }

    async fn feed(self: Arc<Self>, reader: calm_changelog::UserId) {
        let mut next = self.inner.locked().fanout.last() + 1;
        let mut cleared = next - 1;
        let mut last_clear = Instant::now();
        loop {
            let records =
                match self
                    .meta
                    .changelog_read_known(next, FEED_READ_RECORDS, usize::MAX, None)
                {
                    Ok(records) => records,
                    Err(e) => {
                        tracing::warn!(%e, "watch feed: reading the changelog");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
            if records.is_empty() {
                // Nothing new: let the purge have what is older than the history kept (at most
                // once per FEED_CLEAR_EVERY: a clear is a commit, and the feed of a busy
                // namespace finds nothing new many times a second), then wait for the next
                // commit.
                let keep_from = (next - 1).saturating_sub(HISTORY_RECORDS);
                // Asked once a second at most: the answer takes the lock table's mutex.
                let due = cleared < keep_from && last_clear.elapsed() >= FEED_CLEAR_EVERY;
                if due {
                    last_clear = Instant::now();
                }
                if due && self.clears_here() {
                    match self.meta.changelog_clear(reader, keep_from).await {
                        Ok(_) => cleared = keep_from,
                        Err(e) => tracing::warn!(%e, "watch feed: clearing its reader"),
                    }
                }
                if let Err(e) = self.meta.changelog_wait(next - 1, PROGRESS_EVERY).await {
                    // Too many followers waiting: read again a little later.
                    tracing::warn!(%e, "watch feed: waiting for the changelog");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
            let changes: Vec<(Change, Vec<Handle>)> = self.changes_of(&records);
            next = records.last().expect("not empty").index + 1;
            {
                let mut inner = self.inner.locked();
                let Inner { fanout, wakers, .. } = &mut *inner;
                for (change, ancestors) in changes {
                    for id in fanout.publish(change, &ancestors) {
                        if let Some(waker) = wakers.get(id) {
                            waker.notify_one();
                        }
                    }
                }
                // Watchers waiting to hear that their stream passed an index now passed.
                for id in fanout.due() {
                    if let Some(waker) = wakers.get(&id) {
                        waker.notify_one();
                    }
                }
            }
            let published = next - 1;
            let keep_from = published.saturating_sub(HISTORY_RECORDS);
            if keep_from >= cleared + 65_536 && self.clears_here() {
                last_clear = Instant::now();
                match self.meta.changelog_clear(reader, keep_from).await {
                    Ok(_) => cleared = keep_from,
                    Err(e) => tracing::warn!(%e, "watch feed: clearing its reader"),
                }
            }
        }
    }

    fn validate(&self, request: &pb::WatchRequest) -> Result<Target, MetaError> {
        if request.all {
            if request.dir != 0 || !request.handles.is_empty() || request.recursive {
                return Err(MetaError::Invalid(
                    "a watch of every change names no directory and no handles".into(),
                ));
            }
            return Ok(Target::All);
        }
        if request.dir != 0 {
            if !request.handles.is_empty() {
                return Err(MetaError::Invalid(
                    "a watch names a directory or handles, not both".into(),
                ));
            }
            let attr = self.meta.getattr(request.dir)?;
            if attr.kind != Kind::Dir {
                return Err(MetaError::NotDir);
            }
            return Ok(Target::Dir {
                handle: request.dir,
                recursive: request.recursive,
            });
        }
        if request.recursive {
            return Err(MetaError::Invalid(
                "recursive applies to a directory watch".into(),
            ));
        }
        for handle in &request.handles {
            self.meta.getattr(*handle)?;
        }
        Ok(Target::Handles(request.handles.clone()))
    }

    /// Replays the changelog to a watcher that starts in the past, until it is live.
    pub async fn catch_up(&self, id: WatcherId, from: u64) -> Result<(), MetaError> {
        let mut position = from.saturating_sub(1);
        loop {
            let first = self.meta.changelog_users()?.first;
            let records =
                self.meta
                    .changelog_read(position + 1, FEED_READ_RECORDS, usize::MAX, None)?;
            // The history asked for is gone when its first record has been purged.
            let purged = position + 1 < first;
            let through = records
                .last()
                .map_or(self.meta.changelog_last(), |r| r.index);
            let changes: Vec<(Change, Vec<Handle>)> = self.changes_of(&records);
            let live = self
                .inner
                .locked()
                .fanout
                .catch_up(id, changes, through, purged)
                .map_err(|e| MetaError::Io(e.to_string()))?;
            if live {
                return Ok(());
            }
            position = through;
            if records.is_empty() {
                // Caught up with the changelog, not yet with the fan-out: wait for the feed.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// One stream: takes the watcher's events whenever it is woken (or every second, for a
    /// progress event) and sends them; ends when the client goes away.
    async fn stream(
        self: Arc<Self>,
        id: WatcherId,
        from: u64,
        live: bool,
        batch_max: usize,
        waker: Arc<Notify>,
        tx: mpsc::Sender<Result<pb::WatchBatch, Status>>,
    ) {
        if !live && let Err(e) = self.catch_up(id, from).await {
            let _ = tx.send(Err(meta_status(&e))).await;
            self.unwatch(id);
            return;
        }
        loop {
            let woken = tokio::select! {
                woken = tokio::time::timeout(PROGRESS_EVERY, waker.notified()) => woken,
                _ = self.stopping.wait() => {
                    // The mount watches again at another server, or at this one restarted.
                    let _ = tx.send(Err(crate::stopping::stopping_status())).await;
                    break;
                }
            };
            let tick = woken.is_err();
            let events = {
                let mut inner = self.inner.locked();
                match inner.fanout.take(id, batch_max, tick) {
                    Ok(events) => events,
                    Err(_) => return,
                }
            };
            if events.is_empty() {
                if tx.is_closed() {
                    break;
                }
                continue;
            }
            let more = events.len() == batch_max;
            let batch = pb::WatchBatch {
                watch_id: id,
                events: events.into_iter().map(event_to_wire).collect(),
            };
            if tx.send(Ok(batch)).await.is_err() {
                break;
            }
            if more {
                waker.notify_one();
            }
        }
        self.unwatch(id);
    }

    /// Adds an in-process watcher (what a stream does, without the stream): from index `from`
    /// (`u64::MAX`: from now). Returns its id, the `Notify` woken when it has something to
    /// take, and whether it is live already (otherwise run [`WatchHub::catch_up`] first).
    pub async fn subscribe(
        self: &Arc<Self>,
        target: Target,
        from: u64,
    ) -> Result<(WatcherId, Arc<Notify>, bool), MetaError> {
        self.start_feed().await?;
        let waker = Arc::new(Notify::new());
        let mut inner = self.inner.locked();
        let (id, live) = inner
            .fanout
            .watch(target, from)
            .map_err(|e| MetaError::NoSpace(e.to_string()))?;
        inner.wakers.insert(id, waker.clone());
        Ok((id, waker, live))
    }

    /// Up to `max` events of watcher `id` (see [`Fanout::take`]).
    pub fn take(&self, id: WatcherId, max: usize, tick: bool) -> Vec<Event> {
        self.inner
            .locked()
            .fanout
            .take(id, max, tick)
            .unwrap_or_default()
    }

    /// Removes a watcher.
    pub fn unwatch(&self, id: WatcherId) {
        let mut inner = self.inner.locked();
        let _ = inner.fanout.unwatch(id);
        inner.wakers.remove(&id);
        inner.followers.remove(&id);
    }

    /// Whether the only watch of every change open here is `id`, opened by identity `key`:
    /// no other mount keeps a cache of this server's names (a mount drops its whole cache when
    /// its watch breaks, and starts with none).
    pub fn followed_only_by(&self, id: WatcherId, key: &str) -> bool {
        let inner = self.inner.locked();
        inner.followers.len() == 1 && inner.followers.get(&id).is_some_and(|k| k == key)
    }

    /// Watchers, published changes, deliveries, coalesced changes and resyncs so far.
    pub fn stats(&self) -> calm_watch::FanoutStats {
        self.inner.locked().fanout.stats()
    }
}

fn event_to_wire(event: Event) -> pb::WatchEvent {
    use pb::watch_event::Event as E;
    pb::WatchEvent {
        event: Some(match event {
            Event::Change(change) => E::Record(change.encoded.to_vec()),
            Event::Resync { from } => E::ResyncFrom(from),
            Event::Progress { index } => E::Progress(index),
        }),
    }
}

#[derive(Debug)]
pub struct WatchService<S: Store> {
    hub: Arc<WatchHub<S>>,
    /// Watches are for mounts and administrators: a change names entries of directories a
    /// user may not read.
    auth: Arc<crate::auth::Auth>,
}

impl<S: Store> WatchService<S> {
    pub fn new(hub: Arc<WatchHub<S>>, auth: Arc<crate::auth::Auth>) -> Self {
        WatchService { hub, auth }
    }

    pub(crate) fn hub(&self) -> &Arc<WatchHub<S>> {
        &self.hub
    }
}

#[tonic::async_trait]
impl<S: Store> WatchRpc for WatchService<S> {
    type WatchStream = ReceiverStream<Result<pb::WatchBatch, Status>>;

    async fn watch(
        &self,
        r: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.auth.trusted(&r, "watching changes")?;
        let key = self.auth.identity(&r)?.key().to_string();
        let r = r.into_inner();
        let target = self.hub.validate(&r).map_err(|e| meta_status(&e))?;
        let follows = matches!(target, Target::All);
        let batch_max = match r.batch_max as usize {
            0 => BATCH_DEFAULT,
            n => n.min(BATCH_MAX),
        };
        let from = if r.from == 0 { u64::MAX } else { r.from };
        let (id, waker, live) = self
            .hub
            .subscribe(target, from)
            .await
            .map_err(|e| meta_status(&e))?;
        if follows {
            self.hub.inner.locked().followers.insert(id, key);
        }
        let (tx, rx) = mpsc::channel(4);
        // The first batch names the watch at once, so that WatchPast can be used before any
        // change arrives.
        let _ = tx
            .send(Ok(pb::WatchBatch {
                watch_id: id,
                events: Vec::new(),
            }))
            .await;
        tokio::spawn(
            self.hub
                .clone()
                .stream(id, from, live, batch_max, waker, tx),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn watch_past(
        &self,
        r: Request<pb::WatchPastRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.trusted(&r, "watching changes")?;
        let r = r.into_inner();
        let mut inner = self.hub.inner.locked();
        inner
            .fanout
            .want_progress(r.watch_id, r.index)
            .map_err(|e| Status::not_found(e.to_string()))?;
        if let Some(waker) = inner.wakers.get(&r.watch_id) {
            waker.notify_one();
        }
        Ok(Response::new(pb::Empty {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_meta::MetaOptions;
    use calm_store::mem::MemStore;

    /// A panic while the hub's lock is held (a publish that failed midway) does not take the
    /// hub down: watchers are still added, and every change after it reaches them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hub_serves_on_after_a_panic_while_its_lock_was_held() {
        let meta = Arc::new(Meta::open(MemStore::new(), MetaOptions::default()).unwrap());
        let hub = WatchHub::new(meta.clone(), Limits::default());
        hub.start_feed().await.unwrap();
        let holder = hub.clone();
        let panicked = std::thread::spawn(move || {
            let _held = holder.inner.lock().unwrap();
            panic!("a publish failed while it held the hub");
        })
        .join();
        assert!(panicked.is_err());
        assert!(hub.inner.is_poisoned(), "the panic happened under the lock");
        let (id, waker, live) = hub.subscribe(Target::All, u64::MAX).await.unwrap();
        assert!(live);
        for i in 0..20 {
            meta.create(ROOT, format!("after-{i}").as_bytes(), 0o644)
                .await
                .unwrap();
        }
        let mut seen = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while seen < 20 && tokio::time::Instant::now() < deadline {
            let events = hub.take(id, 64, false);
            seen += events
                .iter()
                .filter(|e| matches!(e, Event::Change(_)))
                .count();
            // Woken when the watcher has more; looked at again at least every 50 ms.
            let _ = tokio::time::timeout(Duration::from_millis(50), waker.notified()).await;
        }
        assert_eq!(seen, 20);
        hub.unwatch(id);
        assert_eq!(hub.stats().watchers, 0);
    }
}
