//! What a request asks of the files mounts hold and the copies they keep (`crate::holds`):
//! recalls before a request sees a file, copies asked back after a change, grants.

use calm_meta::Kind;
use calm_proto::pb;
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::MetaService;
use crate::holds::gate::Pass;
use crate::holds::{Holds, Recall};
use crate::meta_names::HoldAsked;
use calm_types::Share;

/// Names a directory that has names already may have to be held (a mount is given them all).
pub const HELD_DIR_NAMES_MAX: usize = calm_types::READDIR_ENTRIES_MAX;

impl<S: Store> MetaService<S> {
    /// A pass through the holds' gate (`crate::holds::gate`): taken before a request looks at
    /// the holds, and held until its change is applied.
    #[must_use = "a pass counts only while it is held"]
    pub(crate) fn enter(&self) -> Option<Pass<'_>> {
        self.holds.as_deref().map(Holds::enter)
    }

    /// Waits until other sessions gave back the holds `recall` names (`crate::holds`); the
    /// pass returned is held by the request until its change is applied.
    #[must_use = "a pass counts only while it is held"]
    pub(crate) async fn recall(&self, session: u64, recall: Recall) -> Option<Pass<'_>> {
        let pass = self.enter();
        self.recall_within(session, recall).await;
        pass
    }

    /// [`MetaService::recall`] for a request that holds a pass already.
    pub(crate) async fn recall_within(&self, session: u64, recall: Recall) {
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

    /// `Meta.HoldDir`: holds directory `r.dir`, which has names already, for the caller's
    /// session, where no other mount keeps a cache of this server's names (the caller's watch
    /// of every change is the only one) and the caller may make names in it: marked first,
    /// then every request that looked at the holds before is waited for (`crate::holds::gate`),
    /// then the names are read (any later request of another session asks for the directory
    /// back before it changes or reads it).
    pub(crate) async fn hold_named_dir(
        &self,
        r: Request<pb::HoldDirRequest>,
    ) -> Result<Response<pb::HoldDirReply>, Status> {
        self.auth.trusted(&r, "holding a directory")?;
        let caller = self.auth.caller(&r)?;
        let key = self.auth.identity(&r)?.key().to_string();
        // As for a make that asks to hold: the mount answers for the very caller it named.
        let as_claimed =
            crate::auth::claimed(&r).is_ok_and(|c| (c.uid, c.gid) == (caller.uid, caller.gid));
        let r = r.into_inner();
        let not_held = || Ok(Response::new(pb::HoldDirReply::default()));
        let (Some(holds), Some(hub)) = (self.holds.as_deref(), self.watch.as_deref()) else {
            return not_held();
        };
        if caller.session == 0 || !as_claimed || !hub.followed_only_by(r.watch_id, &key) {
            return not_held();
        }
        let may_make = |attr: &calm_meta::Attr| {
            caller.uid == 0 || (caller.uid == attr.uid && attr.mode & 0o300 == 0o300)
        };
        let limits = holds.limits();
        let Ok(Some((_, parent, _))) = self.meta.dir_to_hold(r.dir, HELD_DIR_NAMES_MAX) else {
            return not_held();
        };
        if !holds.grant(caller.session, r.dir, parent, None) {
            return not_held();
        }
        holds.settled().await;
        let read = self.meta.dir_to_hold(r.dir, HELD_DIR_NAMES_MAX);
        // Still held (not asked back meanwhile), in the same place, under the same limits.
        let held = match read {
            Ok(Some((attr, now_in, names))) if now_in == parent && may_make(&attr) => {
                let kept = holds.limits() == limits && holds.held_by(caller.session, r.dir);
                kept.then_some((attr, names))
            }
            _ => None,
        };
        let Some((attr, names)) = held else {
            holds.give_back(caller.session, &[r.dir]);
            return not_held();
        };
        Ok(Response::new(pb::HoldDirReply {
            held: calm_proto::HOLD_NAMES,
            attr: Some((&attr).into()),
            names: names.iter().map(pb::DirEntry::from).collect(),
            parent,
            generation: self.meta.epoch(),
        }))
    }
}
