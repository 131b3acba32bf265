//! `Meta.Batch`: a client's queued namespace calls in one request. Each call becomes the
//! request it would have been alone — the batch's connection (who the peer is), the call's own
//! metadata (session, uid, gid, groups) — and goes through that request's handler, checks
//! included; the calls run concurrently, as concurrent requests do. An ordered batch (a mount's
//! makes and removals it answered itself) queues its calls to the committer one after the
//! other, so that they are applied in their order. Every call is counted as its own request
//! would have been (by method, failure, uid and job).

use calm_proto::batch::{BATCH_CALLS_MAX, call_reply, failed_reply, metadata_into};
use calm_proto::pb;
use calm_proto::pb::call::Op;
use calm_proto::pb::meta_server::Meta as MetaRpc;
use calm_proto::status_from_error;
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::MetaService;
use crate::listen::Peer;

/// What the batch's request carried that each call's request must carry too.
#[derive(Clone)]
struct Origin {
    peer: Option<Peer>,
    in_process: Option<calm_proto::InProcess>,
}

impl Origin {
    fn request<T>(
        &self,
        message: T,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<Request<T>, Status> {
        let mut request = Request::new(message);
        metadata_into(metadata, request.metadata_mut())?;
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        if let Some(in_process) = self.in_process {
            request.extensions_mut().insert(in_process);
        }
        Ok(request)
    }
}

pub(crate) async fn serve<S: Store>(
    service: &MetaService<S>,
    request: Request<pb::BatchRequest>,
) -> Result<Response<pb::BatchReply>, Status> {
    let origin = Origin {
        peer: request.extensions().get::<Peer>().cloned(),
        in_process: request.extensions().get::<calm_proto::InProcess>().copied(),
    };
    let pb::BatchRequest { calls, ordered } = request.into_inner();
    if calls.len() > BATCH_CALLS_MAX {
        return Err(Status::invalid_argument(format!(
            "a batch holds at most {BATCH_CALLS_MAX} calls, not {}",
            calls.len()
        )));
    }
    service.batched(calls.len());
    if ordered {
        let replies = in_order(service, &origin, calls).await;
        return Ok(Response::new(pb::BatchReply { replies }));
    }
    let replies =
        futures::future::join_all(calls.into_iter().map(|call| one(service, &origin, call))).await;
    Ok(Response::new(pb::BatchReply { replies }))
}

/// A call of an ordered batch, queued to the committer: how its answer is made.
enum Queued {
    Make(calm_meta::Queued, Option<crate::meta_names::HoldAsked>),
    Unlink(calm_meta::Queued),
    Rmdir(calm_meta::Queued),
    Failed(Status),
}

/// An ordered batch: each call checked and queued to the committer after the one before it,
/// so that they are applied in their order (a crash keeps a prefix of them), sharing its
/// groups; then each answered.
async fn in_order<S: Store>(
    service: &MetaService<S>,
    origin: &Origin,
    calls: Vec<pb::Call>,
) -> Vec<pb::CallReply> {
    // Held until every call is applied (`crate::holds::gate`).
    let _pass = service.enter();
    let mut queued = Vec::with_capacity(calls.len());
    for call in calls {
        let who = who(&call.metadata);
        let method = match &call.op {
            Some(Op::Unlink(_)) => "calm.v1.Meta/Unlink",
            Some(Op::Rmdir(_)) => "calm.v1.Meta/Rmdir",
            _ => "calm.v1.Meta/Make",
        };
        let started = std::time::Instant::now();
        let call = queue_one(service, origin, call).await;
        queued.push((call, who, method, started));
    }
    let mut replies = Vec::with_capacity(queued.len());
    for (call, who, method, started) in queued {
        let reply = match call {
            Queued::Make(answer, hold) => call_reply(service.made(answer.answer().await, hold)),
            Queued::Unlink(answer) => call_reply(service.unlinked(answer.answer().await)),
            Queued::Rmdir(answer) => {
                let result = answer.answer().await.map(|(done, _)| done);
                call_reply(service.removed_dir(result))
            }
            Queued::Failed(status) => failed_reply(&status),
        };
        count(service, &who, method, started, &reply);
        replies.push(reply);
    }
    replies
}

/// Who a call says asked it: its uid and its job, as the load counts them.
type Who = (Option<String>, Option<String>);

fn who(metadata: &std::collections::HashMap<String, String>) -> Who {
    (
        metadata.get(calm_proto::changelog::UID_KEY).cloned(),
        metadata.get(calm_proto::changelog::JOB_KEY).cloned(),
    )
}

/// Counts a batched call as its own request would have been: in the load (by uid and job) and
/// in the request metrics (by method and failure).
fn count<S: Store>(
    service: &MetaService<S>,
    who: &Who,
    method: &'static str,
    started: std::time::Instant,
    reply: &pb::CallReply,
) {
    service
        .loads
        .count(who.0.as_deref(), who.1.as_deref(), started.elapsed(), true);
    if let Some(requests) = service.metrics.get() {
        let failed = (reply.code != 0).then_some(reply.calm_code);
        crate::metrics::count_call(requests, method, failed, started.elapsed());
    }
}

async fn queue_one<S: Store>(service: &MetaService<S>, origin: &Origin, call: pb::Call) -> Queued {
    let failed = |error: calm_meta::MetaError| Queued::Failed(status_from_error(&error));
    let metadata = call.metadata;
    match call.op {
        Some(Op::Make(m)) => {
            let prepared = match origin.request(m, metadata) {
                Ok(request) => service.prepare_make(request).await,
                Err(status) => Err(status),
            };
            match prepared.map(|p| (p.op, p.caller, p.id, p.hold, p.at)) {
                Ok((Ok(op), caller, id, hold, at)) => {
                    match service.meta.queue_request_at(caller, op, id, at).await {
                        Ok(answer) => Queued::Make(answer, hold),
                        Err(error) => failed(error),
                    }
                }
                Ok((Err(error), ..)) => failed(error),
                Err(status) => Queued::Failed(status),
            }
        }
        Some(Op::Unlink(m)) => {
            let prepared = match origin.request(m, metadata) {
                Ok(request) => service.prepare_unlink(request).await,
                Err(status) => Err(status),
            };
            queue_prepared(service, prepared, Queued::Unlink).await
        }
        Some(Op::Rmdir(m)) => {
            let prepared = match origin.request(m, metadata) {
                Ok(request) => service.prepare_rmdir(request).await,
                Err(status) => Err(status),
            };
            queue_prepared(service, prepared, Queued::Rmdir).await
        }
        _ => Queued::Failed(Status::invalid_argument(
            "an ordered batch holds makes, unlinks and rmdirs only",
        )),
    }
}

async fn queue_prepared<S: Store>(
    service: &MetaService<S>,
    prepared: Result<crate::meta_names::Prepared, Status>,
    queued: fn(calm_meta::Queued) -> Queued,
) -> Queued {
    match prepared {
        Ok((caller, op, id, at)) => match service.meta.queue_request_at(caller, op, id, at).await {
            Ok(answer) => queued(answer),
            Err(error) => Queued::Failed(status_from_error(&error)),
        },
        Err(status) => Queued::Failed(status),
    }
}

async fn one<S: Store>(service: &MetaService<S>, origin: &Origin, call: pb::Call) -> pb::CallReply {
    let Some(op) = call.op else {
        return failed_reply(&Status::invalid_argument(
            "a batched call names no operation",
        ));
    };
    let metadata = call.metadata;
    let who = who(&metadata);
    let started = std::time::Instant::now();
    // Each arm: the call's request, then the very handler its own request would have reached;
    // and the method the call stands for, which the metrics count it as.
    macro_rules! handled {
        ($message:expr, $handler:ident, $method:literal) => {
            (
                concat!("calm.v1.Meta/", $method),
                match origin.request($message, metadata) {
                    Ok(request) => call_reply(service.$handler(request).await),
                    Err(status) => failed_reply(&status),
                },
            )
        };
    }
    let (method, reply) = match op {
        Op::Lookup(m) => handled!(m, lookup, "Lookup"),
        Op::GetAttr(m) => handled!(m, get_attr, "GetAttr"),
        Op::SetAttr(m) => handled!(m, set_attr, "SetAttr"),
        Op::Make(m) => handled!(m, make, "Make"),
        Op::Link(m) => handled!(m, link, "Link"),
        Op::Unlink(m) => handled!(m, unlink, "Unlink"),
        Op::Rmdir(m) => handled!(m, rmdir, "Rmdir"),
        Op::Rename(m) => handled!(m, rename, "Rename"),
        Op::ReadMap(m) => handled!(m, read_map, "ReadMap"),
        Op::Write(m) => handled!(m, write, "Write"),
    };
    count(service, &who, method, started, &reply);
    reply
}
