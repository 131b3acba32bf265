//! What a request asks of the files mounts hold and the copies they keep (`crate::holds`):
//! recalls before a request sees a file, copies asked back after a change, grants.

use calm_meta::Kind;
use calm_proto::pb;
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::MetaService;
use crate::holds::Recall;
use crate::meta_names::HoldAsked;
use calm_types::Share;

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

    /// What a make asking to hold what it makes in `r.parent` needs: the quota share it draws
    /// from where the caller's session holds that directory with one, else a share asked
    /// for (set aside only for a directory, only where quotas limit its makes).
    pub(crate) fn hold_asked(&self, caller: &calm_meta::Caller, r: &pb::MakeRequest) -> HoldAsked {
        let holds = self.holds.as_deref();
        let pool = holds.and_then(|h| h.pool(caller.session, r.parent));
        HoldAsked {
            session: caller.session,
            uid: caller.uid,
            dir: r.parent,
            share: match pool {
                Some(pool) => Share::Draw(pool),
                None => Share::Ask,
            },
            limits: holds.map_or(0, |h| h.limits()),
        }
    }

    /// Grants the hold of `handle`, just made as `asked` says, where the session may: what it
    /// holds (`calm_proto::HOLD_*`) and, for a directory made with a quota share of its own,
    /// the room set aside. The owner too for the superuser (who alone changes owners, and
    /// whom user and group quotas do not hold).
    pub(crate) fn hold(&self, asked: HoldAsked, handle: u64) -> (u32, u64) {
        let shares = self.meta.shares();
        let own_share = match asked.share {
            Share::Ask => shares.left(handle),
            _ => None,
        };
        let held = self.grant_hold(asked, handle, own_share);
        match (held, own_share) {
            (calm_proto::HOLD_NAMES, Some(room)) => (held, room),
            (_, Some(_)) => {
                shares.release(handle);
                (held, 0)
            }
            (_, None) => (held, 0),
        }
    }

    fn grant_hold(&self, asked: HoldAsked, handle: u64, own_share: Option<u64>) -> u32 {
        let Some(holds) = &self.holds else {
            return 0;
        };
        // A quota limit set since the make was asked for: it may have been judged without it.
        if asked.session == 0 || holds.limits() != asked.limits {
            return 0;
        }
        let pool = match (asked.share, own_share) {
            (_, Some(0)) => return 0,
            (Share::Draw(pool), _) => Some(pool),
            (_, Some(_)) => Some(handle),
            _ => None,
        };
        let (session, dir) = (asked.session, asked.dir);
        match self.meta.holdable(handle) {
            // A directory: its names, for the mount to answer makes and removals in it. Not
            // where its share was swept before the hold claimed it (an answer very late).
            Ok(Some(Kind::Dir)) if holds.grant(session, handle, dir, pool) => {
                if own_share.is_some() && self.meta.shares().left(handle) != own_share {
                    holds.give_back(session, &[handle]);
                    return 0;
                }
                calm_proto::HOLD_NAMES
            }
            Ok(Some(Kind::File)) if holds.grant(session, handle, dir, None) => {
                let owner = match asked.uid {
                    0 => calm_proto::HOLD_OWNER,
                    _ => 0,
                };
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
