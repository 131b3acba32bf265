//! The namespace and lock services as a client in the server's own process calls them (an
//! embedded mount): the same handlers, each call counted as a request from a connection is —
//! by method in the request metrics (when served), its failures by calm's error name, and by
//! the caller's uid and job in the server's load — so what a site sees of its server does not
//! depend on whether its mount runs in the server's process.
//!
//! A `Meta.Batch` is counted as a request but not in the load: its calls are counted each
//! where the batch dispatches them (`batch.rs`), as over a connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use calm_proto::changelog::{JOB_KEY, UID_KEY};
use calm_proto::pb;
use calm_proto::pb::locks_server::Locks as LocksRpc;
use calm_proto::pb::meta_server::Meta as MetaRpc;
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::{LockService, MetaService};

/// The namespace service of [`MetaService`], each call counted.
#[derive(Debug)]
pub struct CountedMeta<S: Store> {
    inner: Arc<MetaService<S>>,
}

/// The lock service of [`LockService`], each call counted where the namespace service counts.
#[derive(Debug)]
pub struct CountedLocks<S: Store> {
    inner: Arc<LockService<S>>,
    meta: Arc<MetaService<S>>,
}

impl<S: Store> CountedMeta<S> {
    pub fn new(inner: Arc<MetaService<S>>) -> CountedMeta<S> {
        CountedMeta { inner }
    }
}

impl<S: Store> CountedLocks<S> {
    pub fn new(inner: Arc<LockService<S>>, meta: Arc<MetaService<S>>) -> CountedLocks<S> {
        CountedLocks { inner, meta }
    }
}

/// Answers `request` with `handle`, counting it under `method` in `meta`'s request metrics
/// and, unless `batch`, in its load by the caller's uid and job.
async fn counted<S, T, R, F>(
    meta: &MetaService<S>,
    method: &'static str,
    batch: bool,
    request: Request<T>,
    handle: impl FnOnce(Request<T>) -> F,
) -> Result<Response<R>, Status>
where
    S: Store,
    F: Future<Output = Result<Response<R>, Status>>,
{
    // The values are shared with the request (no copy): read once it is answered.
    let header = |key: &str| request.metadata().get(key).cloned();
    let who = (!batch).then(|| (header(UID_KEY), header(JOB_KEY)));
    let started = Instant::now();
    let answer = handle(request).await;
    if let Some((uid, job)) = who {
        let namespace = method.starts_with("calm.v1.Meta/");
        meta.loads
            .count(text(&uid), text(&job), started.elapsed(), namespace);
    }
    if let Some(requests) = meta.metrics.get() {
        let failed = answer.as_ref().err().map(calm_proto::batch::calm_code);
        crate::metrics::count_call(requests, method, failed, started.elapsed());
    }
    answer
}

fn text(value: &Option<tonic::metadata::AsciiMetadataValue>) -> Option<&str> {
    value.as_ref().and_then(|v| v.to_str().ok())
}

/// The trait's impl (whole, so that `async_trait` sees its methods), each method a counted
/// call of the wrapped service's own.
macro_rules! counted_methods {
    ($rpc:ident for $counted:ident, $service:literal, $meta:ident, { $($extra:tt)* }, $( ($method:ident, $request:ident, $reply:ident, $name:literal) ),* $(,)?) => {
        #[tonic::async_trait]
        impl<S: Store> $rpc for $counted<S> {
        $($extra)*
        $(
            async fn $method(
                &self,
                request: Request<pb::$request>,
            ) -> Result<Response<pb::$reply>, Status> {
                let inner = &self.inner;
                counted(
                    &self.$meta,
                    concat!("calm.v1.", $service, "/", $name),
                    $name == "Batch",
                    request,
                    |request| inner.$method(request),
                )
                .await
            }
        )*
        }
    };
}

counted_methods!(
    MetaRpc for CountedMeta,
    "Meta",
    inner,
    {
        type HoldsStream = crate::holds::RecallStream;

        // A stream for as long as the mount holds files: not a request to count or time.
        async fn holds(
            &self,
            request: Request<pb::SessionRequest>,
        ) -> Result<Response<Self::HoldsStream>, Status> {
            self.inner.holds(request).await
        }
    },
    (batch, BatchRequest, BatchReply, "Batch"),
    (lookup, LookupRequest, Attr, "Lookup"),
    (get_attr, HandleRequest, Attr, "GetAttr"),
    (set_attr, SetAttrRequest, Attr, "SetAttr"),
    (make, MakeRequest, Attr, "Make"),
    (link, LinkRequest, Attr, "Link"),
    (unlink, RemoveRequest, RemovedReply, "Unlink"),
    (rmdir, RemoveRequest, Empty, "Rmdir"),
    (rename, RenameRequest, RemovedReply, "Rename"),
    (readlink, HandleRequest, ReadlinkReply, "Readlink"),
    (read_dir, ReadDirRequest, ReadDirReply, "ReadDir"),
    (set_xattr, SetXattrRequest, Empty, "SetXattr"),
    (get_xattr, XattrRequest, XattrValue, "GetXattr"),
    (list_xattr, HandleRequest, XattrNames, "ListXattr"),
    (remove_xattr, XattrRequest, Empty, "RemoveXattr"),
    (stat_fs, Empty, StatFsReply, "StatFs"),
    (sync, Empty, Empty, "Sync"),
    (status, Empty, StatusReply, "Status"),
    (data_info, Empty, DataInfoReply, "DataInfo"),
    (read_map, ReadMapRequest, ReadMapReply, "ReadMap"),
    (write, WriteRequest, Attr, "Write"),
    (append, AppendRequest, Attr, "Append"),
    (
        alloc_slices,
        AllocSlicesRequest,
        AllocSlicesReply,
        "AllocSlices"
    ),
    (release_orphan, HandleRequest, Empty, "ReleaseOrphan"),
    (claim_orphans, OrphansRequest, Empty, "ClaimOrphans"),
    (set_quota, SetQuotaRequest, QuotaReport, "SetQuota"),
    (get_quota, QuotaTarget, QuotaReport, "GetQuota"),
    (list_quotas, QuotaListRequest, QuotaReports, "ListQuotas"),
    (check_quotas, Empty, QuotaCheckReply, "CheckQuotas"),
    (summary, HandleRequest, SummaryReply, "Summary"),
    (return_holds, ReturnRequest, Empty, "ReturnHolds"),
    (grant_handles, GrantRequest, GrantReply, "GrantHandles"),
    (hold_dir, HoldDirRequest, HoldDirReply, "HoldDir"),
);

counted_methods!(
    LocksRpc for CountedLocks,
    "Locks",
    meta,
    {},
    (
        open_session,
        OpenSessionRequest,
        SessionReply,
        "OpenSession"
    ),
    (members, Empty, MembersReply, "Members"),
    (
        reclaim_done,
        ReclaimDoneRequest,
        ReclaimDoneReply,
        "ReclaimDone"
    ),
    (keep_alive, SessionRequest, SessionReply, "KeepAlive"),
    (close_session, SessionRequest, Empty, "CloseSession"),
    (apply, LockBatch, LockBatchReply, "Apply"),
    (wait, WaitRequest, LockResult, "Wait"),
    (cancel, CancelRequest, CancelReply, "Cancel"),
    (list, ListLocksRequest, ListLocksReply, "List"),
);
