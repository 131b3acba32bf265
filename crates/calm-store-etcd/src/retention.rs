//! How long etcd keeps history for calm: this store compacts the cluster's history behind
//! what it needs (`crate::history` decides to which revision), and a [`HistoryHold`] keeps
//! history from one revision for as long as it lives (a reader that resumes from there).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::history::Retention;
use crate::retry::compacted_away;
use crate::retry::retrying;
use crate::{EtcdStore, Inner, random_u64};
use calm_store::Result;
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

/// How long a hold on history outlives its holder (renewed every third of it while held).
pub const HOLD_LEASE_S: u64 = 60;

/// History kept from the revision it names while this lives ([`EtcdStore::hold_history`]).
pub struct HistoryHold {
    store: EtcdStore,
    lease: i64,
    revision: i64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for HistoryHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryHold")
            .field("lease", &self.lease)
            .field("revision", &self.revision)
            .finish()
    }
}

impl HistoryHold {
    /// The revision history is kept from.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl Drop for HistoryHold {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let lease = self.lease;
        // Revoked: the hold goes at once (else with its lease).
        if let Err(error) = self
            .store
            .call(move |mut client| async move { client.lease_revoke(lease).await })
        {
            tracing::warn!(%error, "etcd: letting go of a hold on history");
        }
    }
}

impl EtcdStore {
    /// Keeps every calm store of this namespace from compacting the cluster's history past its
    /// current revision until the hold is dropped: for a reader of one snapshot that may take
    /// longer than the history kept (fsck of a large namespace). The hold is a key under a
    /// lease of [`HOLD_LEASE_S`], renewed while held, so a holder that dies lets go by itself.
    pub fn hold_history(&self) -> Result<HistoryHold> {
        let (revision, _) = self.revision_now()?;
        let ttl = HOLD_LEASE_S as i64;
        let lease = self
            .call(move |mut client| async move { client.lease_grant(ttl, None).await })?
            .id();
        let key = [
            &self.inner.holds[..],
            format!("{:016x}", random_u64()).as_bytes(),
        ]
        .concat();
        self.call(move |mut client| {
            let key = key.clone();
            async move {
                client
                    .put(
                        key,
                        revision.to_string(),
                        Some(etcd_client::PutOptions::new().with_lease(lease)),
                    )
                    .await
            }
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let inner = Arc::downgrade(&self.inner);
        self.inner.handle().spawn(async move {
            let renew = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(HOLD_LEASE_S / 3)).await;
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let renewed = retrying(&inner, |mut client| async move {
                        let (mut keeper, _) = client.lease_keep_alive(lease).await?;
                        keeper.keep_alive().await
                    })
                    .await;
                    if let Err(error) = renewed {
                        tracing::warn!(%error, "etcd: renewing a hold on history");
                    }
                }
            };
            tokio::select! {
                _ = renew => {}
                _ = stopped => {}
            }
        });
        Ok(HistoryHold {
            store: self.clone(),
            lease,
            revision,
            stop: Some(stop),
        })
    }

    /// Compacts the cluster's history, every [`history::period`], to what was current
    /// `history_kept` ago (see [`history`]; only the committer compacts so far,
    /// [`Retention`]); until the store is dropped.
    pub(crate) fn keep_history_short(&self) {
        let kept = self.inner.options.history_kept;
        if kept.is_zero() {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        self.inner.handle().spawn(async move {
            let started = Instant::now();
            let mut retention = Retention::new(kept);
            loop {
                tokio::time::sleep(crate::history::period(kept)).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let Some((revision, last_commit, holds)) = revision_and_holds(&inner).await else {
                    continue;
                };
                let own = inner.own_commit_revision.load(Ordering::Acquire);
                let Some(to) = retention.observe(started.elapsed(), revision, last_commit, own)
                else {
                    continue;
                };
                let to = holds.into_iter().fold(to, i64::min);
                if to <= retention.compacted_to() {
                    continue;
                }
                let compacted = retrying(&inner, |mut client| async move {
                    client.compact(to, None).await
                })
                .await;
                match compacted {
                    Ok(_) => {
                        inner.stats.compactions.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(revision = to, "etcd: history compacted");
                    }
                    // Another server of the namespace (or the operator) compacted further.
                    Err(error) if compacted_away(&error) => {}
                    Err(error) => {
                        tracing::warn!(%error, revision = to, "etcd: compacting the history");
                        continue;
                    }
                }
                retention.compacted(to);
                inner.compacted_before(to);
                inner
                    .stats
                    .compacted_revision
                    .fetch_max(to, Ordering::Relaxed);
            }
        });
    }
}

/// One request: the cluster's revision, the namespace's last commit's revision (0: none) and
/// the revisions the holds of long readers keep history from ([`EtcdStore::hold_history`]),
/// which history is not compacted past. `None` when the cluster did not answer.
async fn revision_and_holds(inner: &Inner) -> Option<(i64, i64, Vec<i64>)> {
    let (holds, seq) = (inner.holds.clone(), inner.seq.clone());
    let read = retrying(inner, |mut client| {
        let reads = vec![
            TxnOp::get(holds.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(seq.clone(), None),
        ];
        async move { client.txn(Txn::new().and_then(reads)).await }
    })
    .await;
    let response = match read {
        Ok(response) => response,
        Err(error) => {
            tracing::debug!(%error, "etcd: reading the revision to compact to");
            return None;
        }
    };
    let revision = response.header().map_or(0, |h| h.revision());
    let mut gets = response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        });
    let holds = gets.next().map_or_else(Vec::new, |get| {
        get.kvs()
            .iter()
            .filter_map(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<i64>().ok())
            .collect()
    });
    let last_commit = gets
        .next()
        .and_then(|get| get.kvs().first().map(|kv| kv.mod_revision()))
        .unwrap_or(0);
    Some((revision, last_commit, holds))
}
