//! What a request asks of the files mounts hold and the copies they keep (`crate::holds`):
//! recalls before a request sees a file, copies asked back after a change, grants.

use calm_meta::Kind;
use calm_proto::pb;
use calm_store::Store;
use tonic::{Request, Response, Status};

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
        if session == 0 {
            return 0;
        }
        match self.meta.holdable(handle) {
            // A directory: its names, for the mount to answer makes and removals in it.
            Ok(Some(Kind::Dir)) if holds.grant(session, handle, dir) => calm_proto::HOLD_NAMES,
            Ok(Some(Kind::File)) if holds.grant(session, handle, dir) => {
                let owner = if uid == 0 { calm_proto::HOLD_OWNER } else { 0 };
                calm_proto::HOLD_MODE_TIMES | owner
            }
            _ => 0,
        }
    }

    /// `Meta.GrantHandles`: handles for the caller's client (a mount's) to make nodes with.
    pub(crate) async fn grant(
        &self,
        r: Request<pb::GrantRequest>,
    ) -> Result<Response<pb::GrantReply>, Status> {
        self.auth.trusted(&r, "grant_handles")?;
        let caller = self.auth.caller(&r)?;
        let Some(id) = crate::meta_names::request_id(&self.auth, &r)? else {
            return Err(Status::invalid_argument(
                "a grant of handles needs a request id",
            ));
        };
        let count = r.get_ref().count;
        let result = self.meta.grant_handles(caller, id.client, count).await;
        self.answer(result.map(|first| pb::GrantReply { first, count }))
    }
}
