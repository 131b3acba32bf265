//! `Meta.Batch`: a client's queued namespace calls in one request. Each call becomes the
//! request it would have been alone — the batch's connection (who the peer is), the call's own
//! metadata (session, uid, gid, groups) — and goes through that request's handler, checks
//! included; the calls run concurrently, as concurrent requests do.

use calm_proto::batch::{BATCH_CALLS_MAX, call_reply, failed_reply, metadata_into};
use calm_proto::pb;
use calm_proto::pb::call::Op;
use calm_proto::pb::meta_server::Meta as MetaRpc;
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
    let calls = request.into_inner().calls;
    if calls.len() > BATCH_CALLS_MAX {
        return Err(Status::invalid_argument(format!(
            "a batch holds at most {BATCH_CALLS_MAX} calls, not {}",
            calls.len()
        )));
    }
    service.batched(calls.len());
    let replies =
        futures::future::join_all(calls.into_iter().map(|call| one(service, &origin, call))).await;
    Ok(Response::new(pb::BatchReply { replies }))
}

async fn one<S: Store>(service: &MetaService<S>, origin: &Origin, call: pb::Call) -> pb::CallReply {
    let Some(op) = call.op else {
        return failed_reply(&Status::invalid_argument(
            "a batched call names no operation",
        ));
    };
    let metadata = call.metadata;
    let who = (
        metadata.get(calm_proto::changelog::UID_KEY).cloned(),
        metadata.get(calm_proto::changelog::JOB_KEY).cloned(),
    );
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
    service
        .loads
        .count(who.0.as_deref(), who.1.as_deref(), started.elapsed(), true);
    if let Some(requests) = service.metrics.get() {
        let failed = (reply.code != 0).then_some(reply.calm_code);
        crate::metrics::count_call(requests, method, failed, started.elapsed());
    }
    reply
}
