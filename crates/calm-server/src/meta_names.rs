//! The makes and removals of names, in two halves: what a request asks of the committer
//! (checked, with other sessions' holds recalled), and its answer. A request alone runs both;
//! an ordered batch (`crate::batch`) queues the first halves of its calls one after the other
//! and then answers them, so that its calls share the committer's groups in their order.

use calm_meta::ops::{Done, Op};
use calm_meta::requests::RequestId;
use calm_meta::{Attr, Caller, MetaError};
use calm_proto::pb;
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::MetaService;
use crate::auth;
use crate::holds::Recall;
use crate::meta_answers::{done_empty, done_entry, done_removed};

/// A removal as the committer gets it: who asks, the operation, its request id, and when a
/// mount answered it.
pub(crate) type Prepared = (Caller, Op, Option<RequestId>, Option<i64>);

/// A make as the committer gets it, and the hold its answer asks for.
pub(crate) struct PreparedMake {
    pub(crate) caller: Caller,
    pub(crate) id: Option<RequestId>,
    pub(crate) op: Result<Op, MetaError>,
    /// A make that asked to hold what it made: what the hold needs.
    pub(crate) hold: Option<HoldAsked>,
    /// When a mount answered it (its times), where a mount says so.
    pub(crate) at: Option<i64>,
}

/// What a make that asked to hold what it made needs for the hold (`crate::meta_holds`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldAsked {
    pub(crate) session: u64,
    pub(crate) uid: u32,
    /// The directory it is made in.
    pub(crate) dir: u64,
    /// The quota share it set aside or draws from.
    pub(crate) share: calm_types::Share,
    /// The count of quota limit changes when it was asked (`crate::holds::Holds::limits`).
    pub(crate) limits: u64,
}

/// The time a mount says it answered a change at, taken from a mount (or an administrator)
/// alone: a user's is the server's own.
fn answered_at<T, S: Store>(service: &MetaService<S>, r: &Request<T>, time_ns: i64) -> Option<i64> {
    let trusted = service.auth.identity(r).is_ok_and(|i| i.is_trusted());
    (time_ns != 0 && trusted).then_some(time_ns)
}

/// The caller of each `prepare_` holds a pass (`MetaService::enter`) until the prepared
/// change is applied.
impl<S: Store> MetaService<S> {
    pub(crate) async fn prepare_make(
        &self,
        r: Request<pb::MakeRequest>,
    ) -> Result<PreparedMake, Status> {
        let caller = self.auth.caller(&r)?;
        self.recall_within(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let id = request_id(&self.auth, &r)?;
        // Held only where the server acts for the very caller the mount named (no root
        // squash, no identity of a certificate in its place): the mount decides by it.
        let as_claimed =
            auth::claimed(&r).is_ok_and(|c| (c.uid, c.gid) == (caller.uid, caller.gid));
        let hold = (as_claimed && r.get_ref().hold && r.get_ref().exclusive)
            .then(|| self.hold_asked(&caller, r.get_ref()));
        // A handle granted in advance is its client's alone: the client of the request's id,
        // which the server binds to the caller's identity.
        let granted = match (r.get_ref().handle, id) {
            (0, _) => None,
            (handle, Some(id)) => Some(calm_types::Granted {
                handle,
                client: id.client,
            }),
            (_, None) => {
                return Err(Status::invalid_argument(
                    "a make with a granted handle needs a request id",
                ));
            }
        };
        let at = answered_at(self, &r, r.get_ref().time_ns);
        let r = r.into_inner();
        let share = hold.map_or(calm_types::Share::None, |h| h.share);
        let op = calm_proto::node_from_request(&r).map(|mut node| {
            node.granted = granted;
            // A share is set aside for a directory, and drawn from by any make.
            node.share = match share {
                calm_types::Share::Ask if node.kind != calm_types::Kind::Dir => {
                    calm_types::Share::None
                }
                share => share,
            };
            Op::Make {
                parent: r.parent,
                name: r.name,
                node,
                exclusive: r.exclusive,
            }
        });
        Ok(PreparedMake {
            caller,
            id,
            op,
            hold,
            at,
        })
    }

    /// A make's answer, with the hold it asked for where it may have it.
    pub(crate) fn made(
        &self,
        result: Result<(Done, Option<Attr>), MetaError>,
        hold: Option<HoldAsked>,
    ) -> Result<Response<pb::Attr>, Status> {
        let made = result.as_ref().ok().and_then(|(done, _)| match done {
            Done::Attr(attr) => Some(attr.handle),
            _ => None,
        });
        let reply = self.mutated(done_entry(result));
        let Some(hold) = hold else {
            return reply;
        };
        let Ok(mut reply) = reply else {
            // A share set aside for a directory made is released when the answer fails.
            if let (Some(handle), calm_types::Share::Ask) = (made, hold.share) {
                self.meta.shares().release(handle);
            }
            return reply;
        };
        let (held, room) = self.hold(hold, reply.get_ref().handle);
        reply.get_mut().held = held;
        reply.get_mut().held_room = room;
        Ok(reply)
    }

    pub(crate) async fn prepare_unlink(
        &self,
        r: Request<pb::RemoveRequest>,
    ) -> Result<Prepared, Status> {
        let caller = self.auth.caller(&r)?;
        self.recall_within(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let id = request_id(&self.auth, &r)?;
        self.room_for_orphans(&r, &caller, !r.get_ref().keep.is_empty())?;
        let at = answered_at(self, &r, r.get_ref().time_ns);
        let r = r.into_inner();
        let op = Op::Unlink {
            parent: r.parent,
            name: r.name,
            keep: r.keep,
        };
        Ok((caller, op, id, at))
    }

    pub(crate) fn unlinked(
        &self,
        result: Result<(Done, Option<Attr>), MetaError>,
    ) -> Result<Response<pb::RemovedReply>, Status> {
        self.maybe_queued(&result);
        self.mutated(done_removed(result))
    }

    pub(crate) async fn prepare_rmdir(
        &self,
        r: Request<pb::RemoveRequest>,
    ) -> Result<Prepared, Status> {
        let caller = self.auth.caller(&r)?;
        // A directory another mount holds the names of may have makes in it not sent yet.
        self.recall_within(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let id = request_id(&self.auth, &r)?;
        let at = answered_at(self, &r, r.get_ref().time_ns);
        let r = r.into_inner();
        let op = Op::Rmdir {
            parent: r.parent,
            name: r.name,
        };
        Ok((caller, op, id, at))
    }

    pub(crate) fn removed_dir(
        &self,
        result: Result<Done, MetaError>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.mutated(done_empty(result))
    }
}

/// The request id a mutation carries (`calm-request`), if any, bound to the identity that
/// sent it (`RequestId::bound_to`): applied at most once however often it is sent
/// (`calm_meta::requests`), and never taken for another identity's.
pub(crate) fn request_id<T>(
    auth: &auth::Auth,
    r: &Request<T>,
) -> Result<Option<calm_meta::requests::RequestId>, Status> {
    let Some(value) = r.metadata().get(calm_proto::REQUEST_KEY) else {
        return Ok(None);
    };
    let id = value
        .to_str()
        .ok()
        .and_then(calm_meta::requests::RequestId::from_text)
        .ok_or_else(|| Status::invalid_argument("calm-request is not CLIENT:SEQ:ACKED in hex"))?;
    Ok(Some(id.bound_to(auth.identity(r)?.key())))
}
