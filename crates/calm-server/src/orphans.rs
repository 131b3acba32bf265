//! The orphan sweeper: a file a mount kept open after its last name went (calm_meta::orphans)
//! is destroyed when the mount closes it, or here, when the mount's lock session has ended
//! without doing so (the mount was killed, or lost its lease).
//!
//! A session of this server's epoch is ended when the lock table no longer has it. A session
//! of an earlier epoch belonged to a server that is gone (a restart): its mounts open new
//! sessions and claim their orphans back; what is unclaimed a grace period after the start
//! (`calm serve --orphan-claim-grace-s`, [`CLAIM_GRACE_DEFAULT`]) is destroyed. On a shared store (several servers), sessions of other epochs may be other live
//! servers': they are left alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use calm_meta::Meta;
use calm_store::Store;

use crate::data::DataTasks;
use crate::locks::LockTable;

/// How often the server looks for orphans whose session ended.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);
/// After a start, how long mounts of the previous run have to claim their orphans, by default.
pub const CLAIM_GRACE_DEFAULT: Duration = Duration::from_secs(60);

/// Sweeps until the task is dropped.
pub async fn sweep<S: Store>(
    meta: Arc<Meta<S>>,
    table: Arc<LockTable>,
    data: Option<Arc<DataTasks>>,
) {
    let started = Instant::now();
    let grace = data
        .as_ref()
        .map_or(CLAIM_GRACE_DEFAULT, |d| d.options.orphan_claim_grace);
    loop {
        tokio::time::sleep(SWEEP_PERIOD).await;
        let orphans = match meta.orphans() {
            Ok(orphans) => orphans,
            Err(e) => {
                tracing::warn!(%e, "listing orphans");
                continue;
            }
        };
        for (handle, session) in orphans {
            let gone = if session >> 32 == meta.epoch() {
                !table.session_live(session)
            } else {
                !meta.shared() && started.elapsed() >= grace
            };
            if !gone {
                continue;
            }
            match meta.release_orphan(handle).await {
                Ok(()) => {
                    tracing::info!(handle, session, "released an orphan whose session ended");
                    if let Some(data) = &data {
                        data.queued();
                    }
                }
                Err(e) => tracing::warn!(handle, %e, "releasing an orphan"),
            }
        }
    }
}
