//! `calm-meta`: the POSIX namespace over a [`calm_store::Store`].
//!
//! [`Meta`] is the namespace's face: reads (lookup, getattr, readdir, xattrs, statfs) run at
//! once on a store snapshot, on the caller's thread (`reads`); mutations go to the group
//! committer ([`commit`]) and their futures complete once the commit that holds them is
//! durable (`mutations`); the changelog's readers read and follow it (`feed`). Every
//! mutation and every checked read applies Linux's permission rules to its [`Caller`]
//! ([`perm`]).
//!
//! The modules, bottom up: the vocabulary (calm-types: [`types`], [`error`], [`slices`]);
//! the key layout ([`layout`]), the handle allocator ([`alloc`]), names' links ([`links`]),
//! the committer's changelog state ([`changelog`]), a file's map as a snapshot holds it
//! (`file_map`); what a mutation answers ([`outcome`]) and
//! what it works with (`ctx`); one file per family of mutations under [`ops`], its dispatcher
//! on top; request records ([`requests`]); what the committer remembers of recent nodes
//! ([`young`], [`replaced`]); the committer ([`commit`]); opening a store
//! (`open`, [`upgrade`], [`place`]); the verifier ([`fsck`]).
//!
//! What it deliberately does not know: the wire (gRPC lives in calm-server), errno beyond the
//! mapping table in [`error`], the bytes of files (only which object ranges make them up:
//! [`slices`]; calm-data moves the bytes), who a caller is (the server decides that before a
//! [`Caller`] exists), and clocks other than the committer's `now`.
//!
//! Opening a store reads the superblock and bumps the epoch: a constant amount of work,
//! whatever the number of files. Nothing is ever scanned at start.

pub mod alloc;
pub mod changelog;
pub mod commit;
pub mod commit_stats;
pub mod compaction;
pub(crate) mod ctx;
pub mod data;
pub mod dump;
mod feed;
mod file_map;
pub mod fsck;
mod housekeeping;
pub mod layout;
pub mod links;
mod mutations;
mod open;
pub mod ops;
pub mod outcome;
pub mod place;
pub mod quota;
mod quotas;
mod reads;
pub mod replaced;
pub mod requests;
mod trash_clone;
pub mod upgrade;
pub mod young;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::thread::JoinHandle;

use calm_changelog::{Mask, Record, User, UserId};
use calm_store::{ReadTxn, Store, WriteTxn, decode_counter};
use tokio::sync::{mpsc, oneshot};

pub use crate::commit::{CommitStats, FOLLOWERS_WAITING_MAX, MetaOptions, SHARED_BATCH_OPS_MAX};
pub use crate::commit_stats::CommitDistributions;
pub use crate::data::{Garbage, MAP_RECORDS_MAX};
pub use crate::error::{MetaError, Result};
use crate::layout::*;
pub use crate::open::random_id;
use crate::ops::{Done, Op};
pub use crate::quotas::{QUOTA_LIST_MAX, Summary};
pub use crate::trash_clone::{
    ClonedEntries, Restored, TRASH_PAGE_BYTES_MAX, TrashListing, TrashPage,
};
pub use crate::types::*;
pub use calm_perm::{acl, perm};
pub use calm_types::FileMap;
pub use calm_types::{Caller, Groups, attr as types, error, slices};
pub use feed::{
    CL_FOLLOW_BATCH_RECORDS, CL_FOLLOW_LINGER, CL_READ_BYTES_MAX, CL_READ_RECORDS_MAX,
    ChangelogUsers, Follow,
};

/// The namespace, open on a store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Meta<S: Store> {
    store: Arc<S>,
    queue: Option<mpsc::Sender<commit::Request>>,
    committer: Option<JoinHandle<()>>,
    /// Dropping it stops the housekeeping thread (changelog GC, request-record sweeps).
    housekeeping_stop: Option<std::sync::mpsc::Sender<()>>,
    housekeeping: Option<JoinHandle<()>>,
    /// The index of the last changelog record committed (published before the answers;
    /// followers woken after them).
    last_index: Arc<commit::LastIndex>,
    stats: Arc<CommitStats>,
    epoch: u64,
    /// Where names are kept.
    names: layout::NameHash,
    /// The store is shared with other servers (reads cross the network).
    shared: bool,
    /// How long the trash keeps what is removed (zero: no trash).
    trash_kept: std::time::Duration,
    /// Small files replaced moments ago, readable by their handle (`crate::replaced`).
    replaced: Arc<std::sync::Mutex<crate::replaced::Replaced>>,
    /// Quota shares set aside for directories mounts hold (`crate::quota::shares`).
    shares: Arc<crate::quota::Shares>,
}

impl<S: Store> std::fmt::Debug for Meta<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("epoch", &self.epoch).finish()
    }
}

/// Figures for `calm status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaStatus {
    pub epoch: u64,
    pub inodes: u64,
    pub file_bytes: u64,
    pub handle_high_water: u64,
    pub store_bytes: u64,
    pub commits: u64,
    pub ops_committed: u64,
    pub failed_commits: u64,
    pub largest_batch: u64,
    pub commit_ns_total: u64,
    /// Index of the last changelog record.
    pub changelog_last: u64,
    /// Index of the first changelog record still stored.
    pub changelog_first: u64,
    pub changelog_readers: u64,
    /// Records purged since the server started.
    pub changelog_purged: u64,
    /// What the store counts of its own work (see `Store::figures`).
    pub store_figures: Vec<(&'static str, u64)>,
    /// Entries of the trash, and the bytes of its files.
    pub trash_entries: u64,
    pub trash_bytes: u64,
}

fn counter<R: ReadTxn>(view: &R, key: &[u8]) -> Result<u64> {
    match view.get(key)? {
        Some(bytes) => Ok(decode_counter(key, &bytes)?),
        None => Ok(0),
    }
}

impl<S: Store> Meta<S> {
    /// Runs a read. On a shared store a read waits for the network: inside a multi-threaded
    /// tokio runtime the worker hands its other tasks over first, so that many reads can be in
    /// flight at once (on a local store a read is too short for that to pay).
    fn blocking<T>(&self, read: impl FnOnce() -> T) -> T {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if self.shared && multi_thread {
            tokio::task::block_in_place(read)
        } else {
            read()
        }
    }

    /// The namespace's name hash key and identity: what the other clusters of a namespace
    /// over several are formatted with ([`place::Place::namespace`]).
    pub fn namespace_keys(&self) -> Result<place::NamespaceKeys> {
        place::namespace_keys(&self.store.snapshot()?)
    }

    /// The store under the namespace.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Whether the store is shared with other servers (etcd).
    pub fn shared(&self) -> bool {
        self.store.shared()
    }

    /// This opening's epoch: the generation of inodes created now.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The quota shares set aside for directories mounts hold: a make with
    /// [`calm_types::Share::Ask`] sets one aside, which the server releases when the last
    /// directory drawing from it is given back (`crate::quota::shares`).
    pub fn shares(&self) -> &Arc<crate::quota::Shares> {
        &self.shares
    }

    /// Makes every change answered so far durable (the store may answer a commit before it
    /// is on the medium: `calm_store::CommitSync`).
    pub async fn sync(&self) -> Result<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.sync())
            .await
            .map_err(|e| MetaError::Io(format!("syncing the store: {e}")))?
            .map_err(|e| MetaError::from(crate::outcome::Failure::from(e)))
    }

    async fn submit(&self, op: Op) -> Result<Done> {
        self.apply_as(Caller::default(), op).await
    }

    /// Applies a mutation on behalf of `caller` (recorded in its changelog record).
    pub async fn apply_as(&self, caller: Caller, op: Op) -> Result<Done> {
        self.apply_request(caller, op, None).await
    }

    /// [`Meta::apply_as`], for a request with an id: applied at most once, however often it
    /// is sent (`requests`).
    pub async fn apply_request(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
    ) -> Result<Done> {
        self.apply_request_in_dir(caller, op, id)
            .await
            .map(|(done, _)| done)
    }

    /// [`Meta::apply_request`], with the attributes of the directory whose names the mutation
    /// changed (make, link, unlink, rmdir, a rename inside one directory) as they were right
    /// after it: what a client that keeps that directory's attributes takes instead of asking
    /// again. `None` for other mutations and for a request answered from its record.
    pub async fn apply_request_in_dir(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
    ) -> Result<(Done, Option<Attr>)> {
        self.queue_request(caller, op, id).await?.answer().await
    }

    /// Queues a mutation to the committer and returns without waiting for its answer: the
    /// mutations queued one after the other are applied in that order (a mount's changes it
    /// answered itself, sent as one ordered batch, share the committer's groups).
    pub async fn queue_request(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
    ) -> Result<Queued> {
        self.queue_request_at(caller, op, id, None).await
    }

    /// [`Meta::queue_request`] for a change answered at `at` (ns since the epoch) where it was
    /// made: its times are `at`, not the group's.
    pub async fn queue_request_at(
        &self,
        caller: Caller,
        op: Op,
        id: Option<requests::RequestId>,
        at: Option<i64>,
    ) -> Result<Queued> {
        let (reply, answer) = oneshot::channel();
        let queued = std::time::Instant::now();
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| MetaError::Io("namespace is shutting down".into()))?;
        queue
            .send(commit::Request {
                op,
                caller,
                id,
                reply,
                queued,
                at,
            })
            .await
            .map_err(|_| MetaError::Io("committer stopped".into()))?;
        Ok(Queued(answer))
    }

    /// Applies `first` (with request id `id`) and then `then` on behalf of `caller`, both
    /// queued before either is answered, so that one group of the committer most often
    /// carries both: one wait for two changes. `then` is applied whatever `first` answered
    /// (each answers for itself); a caller that wants it only after a success sends it
    /// alone.
    pub async fn apply_pair(
        &self,
        caller: Caller,
        first: Op,
        id: Option<requests::RequestId>,
        then: Op,
    ) -> (Result<Done>, Result<Done>) {
        let queue = match self.queue.as_ref() {
            Some(queue) => queue,
            None => {
                let closing = || MetaError::Io("namespace is shutting down".into());
                return (Err(closing()), Err(closing()));
            }
        };
        let mut answers = Vec::with_capacity(2);
        for (op, id) in [(first, id), (then, None)] {
            let (reply, answer) = oneshot::channel();
            let request = commit::Request {
                op,
                caller: caller.clone(),
                id,
                reply,
                queued: std::time::Instant::now(),
                at: None,
            };
            let sent = queue.send(request).await.is_ok();
            answers.push((sent, answer));
        }
        let mut results = Vec::with_capacity(2);
        for (sent, answer) in answers {
            let result = match sent {
                false => Err(MetaError::Io("committer stopped".into())),
                true => answer
                    .await
                    .map_err(|_| MetaError::Io("committer stopped before answering".into()))
                    .and_then(|answered| answered.map(|(done, _)| done)),
            };
            results.push(result);
        }
        let then = results.pop().expect("two answers");
        (results.pop().expect("two answers"), then)
    }

    async fn submit_attr(&self, op: Op) -> Result<Attr> {
        match self.submit(op).await? {
            Done::Attr(attr) => Ok(attr),
            _ => unreachable!("operation answers with attributes"),
        }
    }

    async fn submit_unit(&self, op: Op) -> Result<()> {
        self.submit(op).await.map(|_| ())
    }

    // ----- reads -----

    /// How long the requests to a shared store's cluster took (`None`: a store in this
    /// process).
    pub fn store_latencies(&self) -> Option<calm_store::latency::Latencies> {
        self.store.request_latencies()
    }

    /// What the store's own write-ahead log counts (`None`: a store without one).
    pub fn store_log(&self) -> Option<calm_store::latency::LogFigures> {
        self.store.log_figures()
    }

    /// The distributions of commit groups' sizes and durations since the store was opened.
    pub fn commit_distributions(&self) -> CommitDistributions {
        self.stats.distributions()
    }

    pub fn status(&self) -> Result<MetaStatus> {
        use std::sync::atomic::Ordering::Relaxed;
        let changelog = self.changelog_users()?;
        let snap = self.store.snapshot()?;
        Ok(MetaStatus {
            epoch: self.epoch,
            inodes: counter(&snap, KEY_INODES)?,
            file_bytes: counter(&snap, KEY_FILE_BYTES)?,
            handle_high_water: counter(&snap, KEY_HWM)?,
            store_bytes: self.store.size_bytes()?,
            commits: self.stats.commits.load(Relaxed),
            ops_committed: self.stats.ops.load(Relaxed),
            failed_commits: self.stats.failed_commits.load(Relaxed),
            largest_batch: self.stats.largest_batch.load(Relaxed),
            commit_ns_total: self.stats.commit_ns_total.load(Relaxed),
            changelog_last: self.changelog_last(),
            changelog_first: changelog.first,
            changelog_readers: changelog.users.len() as u64,
            changelog_purged: self.stats.cl_purged.load(Relaxed),
            store_figures: self.store.figures(),
            trash_entries: counter(&snap, KEY_TRASH_ENTRIES)?,
            trash_bytes: counter(&snap, KEY_TRASH_BYTES)?,
        })
    }

    /// How long the trash keeps what is removed (zero: there is no trash).
    pub fn trash_kept(&self) -> std::time::Duration {
        self.trash_kept
    }

    // ----- mutations (durable when they return) -----

    // ----- changelog -----

    /// Stops taking mutations, lets the committer finish what is queued, and returns the
    /// store. Dropping a `Meta` does the same.
    pub fn shutdown(mut self) -> Arc<S> {
        self.stop();
        self.store.clone()
    }

    fn stop(&mut self) {
        self.housekeeping_stop.take();
        if let Some(thread) = self.housekeeping.take() {
            let _ = thread.join();
        }
        self.queue.take();
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
    }
}

impl<S: Store> Drop for Meta<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A mutation queued to the committer ([`Meta::queue_request`]), not answered yet.
#[derive(Debug)]
pub struct Queued(oneshot::Receiver<Result<(Done, Option<Attr>)>>);

impl Queued {
    /// Its answer, with the attributes of the directory whose names it changed (as
    /// [`Meta::apply_request_in_dir`]).
    pub async fn answer(self) -> Result<(Done, Option<Attr>)> {
        self.0
            .await
            .map_err(|_| MetaError::Io("committer stopped before answering".into()))?
    }
}
