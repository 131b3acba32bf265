//! What a request asks of the files mounts hold and the copies they keep (`crate::holds`):
//! recalls before a request sees a file, copies asked back after a change, grants.

use calm_store::Store;

use crate::MetaService;
use crate::holds::Recall;

impl<S: Store> MetaService<S> {
    /// Waits until other sessions gave back the holds `recall` names (`crate::holds`).
    pub(crate) async fn recall(&self, session: u64, recall: Recall) {
        if let Some(holds) = &self.holds {
            holds.recall(session, recall).await;
        }
    }

    /// A change of `handle` by `session` committed (or was refused): other sessions' copies of
    /// the file are asked back, and given back, before it is answered (`crate::holds`).
    pub(crate) async fn changed(&self, session: u64, handle: u64) {
        if let Some(holds) = &self.holds {
            holds.changed(session, handle).await;
        }
    }

    /// Grants `session` the hold of `handle`, which it just made in `dir` as `uid`, where it
    /// may: what it holds (`calm_proto::HOLD_*`). The owner too for the superuser (who alone
    /// changes owners, and whom user and group quotas do not hold).
    pub(crate) fn hold(&self, session: u64, uid: u32, handle: u64, dir: u64) -> u32 {
        let Some(holds) = &self.holds else {
            return 0;
        };
        match self.meta.holdable(handle) {
            Ok(true) if session != 0 && holds.grant(session, handle, dir) => {
                let owner = if uid == 0 { calm_proto::HOLD_OWNER } else { 0 };
                calm_proto::HOLD_MODE_TIMES | owner
            }
            _ => 0,
        }
    }
}
