//! What `calm status` shows of a server: its namespace's, locks', watches', compaction's,
//! backups' and memory's figures.

use std::sync::atomic::{AtomicU64, Ordering};

use calm_meta::MetaError;
use calm_proto::pb;
use calm_store::Store;

use crate::{MetaService, compactor, heap};

impl<S: Store> MetaService<S> {
    /// What `calm status` shows, as of now (also what the metrics read at each scrape).
    pub fn status_now(&self) -> Result<pb::StatusReply, MetaError> {
        let locks = self.locks.stats();
        let watch = self.watch.as_ref().map(|w| w.stats()).unwrap_or_default();
        let heap = heap::figures();
        let (by_uid, by_job) = self.loads.status();
        let (namespace_calls, namespace_ns_total) = self.loads.namespace_time();
        let (holds, holds_recalled, holds_taken) =
            self.holds.as_ref().map_or((0, 0, 0), |h| h.figures());
        let (copies, copies_recalled, copies_taken) =
            self.holds.as_ref().map_or((0, 0, 0), |h| h.copy_figures());
        let cached = self
            .data
            .as_ref()
            .map_or((0, 0), |d| d.options.objects.cached_bytes());
        let compaction = |figure: fn(&compactor::CompactStats) -> &AtomicU64| {
            self.data
                .as_ref()
                .map_or(0, |d| figure(&d.compactor.stats).load(Ordering::Relaxed))
        };
        self.meta.status().map(|s| pb::StatusReply {
            version: env!("CARGO_PKG_VERSION").to_string(),
            data_dir: self.info.data_dir.clone(),
            epoch: s.epoch,
            inodes: s.inodes,
            file_bytes: s.file_bytes,
            handle_high_water: s.handle_high_water,
            store_bytes: s.store_bytes,
            commits: s.commits,
            ops_committed: s.ops_committed,
            failed_commits: s.failed_commits,
            largest_batch: s.largest_batch,
            commit_ns_total: s.commit_ns_total,
            uptime_ms: self.info.started.elapsed().as_millis() as u64,
            ready_ms: self.info.ready_ms,
            requests: self.requests.load(Ordering::Relaxed),
            namespace_calls,
            namespace_ns_total,
            request_errors: self.request_errors.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            batched_calls: self.batched_calls.load(Ordering::Relaxed),
            lock_sessions: locks.sessions as u64,
            locks: locks.locks,
            lock_waits: locks.waits as u64,
            locked_files: locks.resources as u64,
            changelog_last: s.changelog_last,
            changelog_first: s.changelog_first,
            changelog_readers: s.changelog_readers,
            changelog_purged: s.changelog_purged,
            objects_url: self.meta.objects_url().ok().flatten().unwrap_or_default(),
            objects_queued: self
                .meta
                .garbage(u64::MAX, 1_000_000)
                .map_or(0, |g| g.len() as u64),
            objects_deleted: self
                .data
                .as_ref()
                .map_or(0, |d| d.stats.deleted.load(Ordering::Relaxed)),
            backups_made: self.backup(|b| &b.made),
            backups_failed: self.backup(|b| &b.failed),
            backup_last_ms: self.backup(|b| &b.last_ms),
            backup_last_bytes: self.backup(|b| &b.last_bytes),
            backup_every_s: match (&self.info.backups, &self.data) {
                (Some(policy), Some(_)) => policy.every.as_secs(),
                _ => 0,
            },
            trash_entries: s.trash_entries,
            trash_bytes: s.trash_bytes,
            trash_kept_s: self.meta.trash_kept().as_secs(),
            by_uid,
            by_job,
            chunks_compacted: compaction(|c| &c.compacted),
            compaction_records_replaced: compaction(|c| &c.records_replaced),
            compaction_bytes: compaction(|c| &c.merged_bytes),
            compaction_failures: compaction(|c| &c.failed),
            room_waits: compaction(|c| &c.room_waits),
            room_waiting: compaction(|c| &c.room_waiting),
            room_wait_ms_max: compaction(|c| &c.room_wait_ms_max),
            chunk_records_max: compaction(|c| &c.chunk_records_max),
            watchers: watch.watchers as u64,
            watch_resyncs: watch.resyncs,
            watch_queued: watch.queued,
            watch_queued_max: watch.queued_max,
            heap_in_use_bytes: heap.in_use,
            heap_free_bytes: heap.free,
            cached_block_bytes: cached.0,
            cached_header_bytes: cached.1,
            store: s
                .store_figures
                .into_iter()
                .map(|(name, value)| pb::StoreFigure {
                    name: name.to_string(),
                    value,
                })
                .collect(),
            nearest: crate::nearest::nearest(&self.auth.sessions, &self.locks, &self.meta),
            holds,
            holds_recalled,
            holds_taken,
            copies,
            copies_recalled,
            copies_taken,
        })
    }
    /// A figure of the metadata backups (0 without an object store).
    pub(crate) fn backup(&self, figure: fn(&crate::backup::BackupStats) -> &AtomicU64) -> u64 {
        self.data
            .as_ref()
            .map_or(0, |d| figure(&d.backups).load(Ordering::Relaxed))
    }
}
