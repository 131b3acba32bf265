//! Commits acknowledged once written, made durable within a bound (`CommitSync::Within`).
//!
//! With the write-ahead log, a commit is one sequential write and one `fdatasync`. A program
//! that makes one change after the other (an archiver, a build) waits for the device at every
//! change; a local file system answers such changes from memory and writes them back later.
//! Here a commit may instead return once its record is written (in the page cache: a kill of
//! the process loses nothing), and this module makes the records durable: on [`Durable::sync`]
//! (which the namespace calls when a client asks for durability: `fsync`, and before anything
//! that acts outside the store on a change), and on a thread of its own at most `within` after
//! a record was written. A power loss keeps a prefix of the commits: recovery replays the
//! records in order up to the first one that is torn, stale or absent (`wal::scan`).
//!
//! A commit that removes files (the record log's purge) is synced before it is applied, as
//! every commit is without this module.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use calm_types::sync::Locked;

use crate::disk::DiskFile;
use crate::{Result, StoreError};

/// Longest bound a store may be opened with (`CommitSync::Within`), in ms.
pub const SYNC_WITHIN_MS_MAX: u64 = 1_000;

/// When a commit is on the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitSync {
    /// Before the commit returns (one `fdatasync` per commit).
    #[default]
    EveryCommit,
    /// Within this long after it returns, or at the next [`crate::Store::sync`].
    Within(Duration),
}

/// The records written but maybe not on the medium yet.
#[derive(Debug)]
pub(crate) struct Durable {
    written: Mutex<Written>,
    /// The last record known to be on the medium.
    synced: AtomicU64,
    /// A sync failed: what reached the medium is unknown; the store takes no more writes.
    pub(crate) failed: AtomicBool,
    /// Wakes the syncing thread when a record is written, and ends it.
    wake: Condvar,
    within: Duration,
    /// The log's figures: its flushes are timed with the commits' own.
    counts: Arc<crate::latency::LogCounts>,
}

#[derive(Debug)]
struct Written {
    /// The active segment (a descriptor of its own).
    segment: Arc<DiskFile>,
    /// The last record written to it.
    seq: u64,
    /// The store closes: the syncing thread ends.
    closing: bool,
}

impl Durable {
    /// Records after `seq` are written to `segment` from now on; everything up to `seq` is
    /// durable.
    pub(crate) fn new(
        segment: &DiskFile,
        seq: u64,
        within: Duration,
        counts: Arc<crate::latency::LogCounts>,
    ) -> Result<Arc<Durable>> {
        let segment = Arc::new(clone(segment)?);
        Ok(Arc::new(Durable {
            written: Mutex::new(Written {
                segment,
                seq,
                closing: false,
            }),
            synced: AtomicU64::new(seq),
            failed: AtomicBool::new(false),
            wake: Condvar::new(),
            within,
            counts,
        }))
    }

    /// Record `seq` was written (not synced) to the active segment.
    pub(crate) fn wrote(&self, seq: u64) {
        let mut written = self.written.locked();
        let was_synced = written.seq <= self.synced.load(Ordering::Acquire);
        written.seq = seq;
        if was_synced {
            self.wake.notify_one();
        }
    }

    /// Record `seq` is durable (synced by the log itself, or covered by a checkpoint).
    pub(crate) fn durable_at(&self, seq: u64) {
        self.synced.fetch_max(seq, Ordering::AcqRel);
    }

    /// A checkpoint made everything up to `seq` durable; records now go to `segment`.
    pub(crate) fn switched(&self, segment: &DiskFile, seq: u64) -> Result<()> {
        let segment = Arc::new(clone(segment)?);
        let mut written = self.written.locked();
        written.segment = segment;
        written.seq = written.seq.max(seq);
        self.durable_at(seq);
        Ok(())
    }

    /// Makes every record written so far durable.
    pub(crate) fn sync(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned);
        }
        let (segment, seq) = {
            let written = self.written.locked();
            (written.segment.clone(), written.seq)
        };
        if seq <= self.synced.load(Ordering::Acquire) {
            return Ok(());
        }
        // A checkpoint may switch segments meanwhile: it made these records durable itself,
        // and syncing the segment they are in is then merely redundant.
        let started = std::time::Instant::now();
        let synced = segment.sync_data();
        self.counts
            .syncs
            .observe(started.elapsed().as_nanos() as u64);
        if let Err(error) = synced {
            self.failed.store(true, Ordering::Release);
            return Err(StoreError::Io(format!(
                "syncing the write-ahead log: {error}"
            )));
        }
        self.durable_at(seq);
        Ok(())
    }

    /// Ends the syncing thread (after one last sync).
    pub(crate) fn close(&self) {
        self.written.locked().closing = true;
        self.wake.notify_one();
    }

    /// The syncing thread: waits for a record written, lets `within` pass (commits made
    /// meanwhile share the sync), syncs.
    pub(crate) fn run(self: Arc<Self>) {
        loop {
            {
                let mut written = self.written.locked();
                while !written.closing && written.seq <= self.synced.load(Ordering::Acquire) {
                    written = self
                        .wake
                        .wait(written)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if written.closing {
                    drop(written);
                    let _ = self.sync();
                    return;
                }
            }
            std::thread::sleep(self.within);
            if let Err(error) = self.sync() {
                tracing::error!(%error, "the store takes no more writes");
                return;
            }
        }
    }
}

fn clone(segment: &DiskFile) -> Result<DiskFile> {
    segment
        .try_clone()
        .map_err(|e| StoreError::Io(format!("duplicating a log segment's descriptor: {e}")))
}
