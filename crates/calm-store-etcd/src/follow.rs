//! The read cache's watch: the revision a transaction begins at (the newest the watch
//! delivered, when it is at or past this store's own last commit), and the task that follows
//! the cluster's changes into the cache.

use calm_types::sync::Locked;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::retry::{retrying, store_error};
use crate::{BEGIN_WATCHED_WAIT, EtcdStore, Inner};
use calm_store::Result;
use etcd_client::{EventType, WatchOptions};

impl EtcdStore {
    /// Where a write transaction may begin without a round trip: the last commit the read
    /// cache's watch delivered, once that is at or past this store's own last commit (waiting
    /// at most [`BEGIN_WATCHED_WAIT`] for it). Its reads then see every commit up to there,
    /// and its commit compares the commit key with that revision as with any other: a commit
    /// of another server the watch had not delivered yet fails it with a conflict, and the
    /// transactions of the next [`BEGIN_READ_AFTER_CONFLICT`] begin at a revision read from
    /// etcd. With one server committing (clients send it every mutation), its transactions
    /// begin on its own last commit, and a group costs etcd its reads ahead and its commit.
    pub(crate) fn watched_base(&self) -> Option<i64> {
        let inner = &self.inner;
        {
            let mut until = inner.begin_read_until.locked();
            match *until {
                Some(at) if Instant::now() < at => return None,
                Some(_) => *until = None,
                None => {}
            }
        }
        let own = inner.own_commit_revision.load(Ordering::Acquire);
        let applied = inner.cache.reached(own, BEGIN_WATCHED_WAIT)?;
        if inner.known_compacted(applied) {
            // The cluster's revision moved on without a commit (a lease ran out, a hold was
            // let go, another program wrote), and history was compacted past the last commit:
            // a read there would fail. The revision read from the cluster holds the same data.
            return None;
        }
        inner.stats.watched_begins.fetch_add(1, Ordering::Relaxed);
        Some(applied)
    }

    /// Hits and misses of the read cache.
    pub fn cache_counts(&self) -> (u64, u64) {
        (
            self.inner.cache.hits.load(Ordering::Relaxed),
            self.inner.cache.misses.load(Ordering::Relaxed),
        )
    }

    /// Starts the watch that keeps the read cache exact: every pair a commit changes is
    /// removed, then the commit counts as applied; from `revision` + 1, the state at
    /// `revision` being that of the commit at `seq_modified`.
    ///
    /// The task holds the store only while it works, not while it waits for the watch: the
    /// last clone of the store dropped ends it (with the store's runtime).
    pub(crate) fn follow_changes(&self, revision: i64, seq_modified: i64) {
        let weak = Arc::downgrade(&self.inner);
        self.inner.cache.start(seq_modified);
        let start = self.inner.data.clone();
        // The data range and the commit key after it: `/d/` .. `/seq` inclusive.
        let end = [self.inner.seq.as_slice(), b"\0"].concat();
        self.inner.handle().spawn(async move {
            let mut from = revision + 1;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let options = WatchOptions::new()
                    .with_range(end.clone())
                    .with_start_revision(from);
                let (member, client) = inner.endpoints.client().await;
                let watched = match client {
                    Ok(mut client) => client.watch(start.clone(), Some(options)).await,
                    Err(error) => Err(error),
                };
                let mut stream = match watched {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%error, "etcd: watching changes for the read cache");
                        inner.endpoints.failed(member);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                drop(inner);
                while let Ok(Some(response)) = stream.message().await {
                    let Some(inner) = weak.upgrade() else { return };
                    if response.compact_revision() > 0 {
                        // History is gone: what the cache holds cannot be vouched for.
                        inner.cache.stop();
                        from = response.compact_revision();
                        tracing::warn!(
                            from,
                            "etcd: the read cache's watch was compacted past; starting over"
                        );
                        break;
                    }
                    let mut changed = Vec::new();
                    let mut committed = 0;
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        from = from.max(kv.mod_revision() + 1);
                        if kv.key() == inner.seq.as_slice() {
                            committed = committed.max(kv.mod_revision());
                        } else {
                            let value = match event.event_type() {
                                EventType::Put => Some(kv.value().to_vec()),
                                EventType::Delete => None,
                            };
                            changed.push((kv.key().to_vec(), value, kv.mod_revision()));
                        }
                    }
                    if !changed.is_empty() || committed > 0 {
                        inner.cache.applied(changed, committed);
                    }
                    if committed > 0 {
                        inner.commits_applied();
                    }
                    if response.canceled() {
                        break;
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                if !inner.cache.following() {
                    // Start over from the present, with an empty cache.
                    let seq = inner.seq.clone();
                    let read = retrying(&inner, |mut client| {
                        let seq = seq.clone();
                        async move { client.get(seq, None).await }
                    })
                    .await;
                    if let Ok(response) = read {
                        let revision = response.header().map_or(0, |h| h.revision());
                        let seq_modified = response.kvs().first().map_or(0, |kv| kv.mod_revision());
                        inner.cache.start(seq_modified);
                        from = revision + 1;
                        // Commits may have gone by unseen.
                        inner.commits_applied();
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    /// [`Self::revision`], read now.
    pub(crate) fn revision_now(&self) -> Result<(i64, i64)> {
        let inner = self.inner.clone();
        self.run(async move { read_commit_key(&inner).await.map_err(store_error) })
    }
}

/// The cluster's current revision and the commit key's modification revision, from a
/// linearizable read of the commit key.
pub(crate) async fn read_commit_key(
    inner: &Inner,
) -> std::result::Result<(i64, i64), etcd_client::Error> {
    inner.stats.revision_reads.fetch_add(1, Ordering::Relaxed);
    let seq = inner.seq.clone();
    let response = retrying(inner, |mut client| {
        let seq = seq.clone();
        async move { client.get(seq, None).await }
    })
    .await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let seq_modified = response.kvs().first().map_or(0, |kv| kv.mod_revision());
    Ok((revision, seq_modified))
}
