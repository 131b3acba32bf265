//! The namespace service (`calm.v1.Meta`): each RPC becomes one call on [`Meta`], with the
//! caller's identity from its connection and its request id from its metadata, and each
//! [`MetaError`] a status with its stable code.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use calm_meta::ops::{Done, Op};
use calm_meta::{Meta, MetaError};
use calm_proto::pb::meta_server::Meta as MetaRpc;
use calm_proto::{pb, status_from_error};
use calm_store::Store;
use tonic::{Request, Response, Status};

use crate::holds::Recall;
use crate::meta_answers::{attr, done_attr, done_empty, done_entry, done_removed};
use crate::meta_names::request_id;
use crate::{LockTable, ServerInfo, auth, batch, compactor, data, watch};

/// The attributes a write or an append answered.
/// Runs `read`, which may walk much of the namespace, on a thread of its own.
async fn off_runtime<S: Store, T: Send + 'static>(
    meta: Arc<Meta<S>>,
    read: impl FnOnce(&Meta<S>) -> Result<T, MetaError> + Send + 'static,
) -> Result<T, MetaError> {
    tokio::task::spawn_blocking(move || read(&meta))
        .await
        .unwrap_or_else(|e| Err(MetaError::Io(format!("the server stopped the read: {e}"))))
}

fn done_to_attr(done: calm_meta::Result<Done>) -> calm_meta::Result<calm_meta::Attr> {
    match done? {
        Done::Attr(attr) => Ok(attr),
        other => Err(calm_meta::MetaError::Io(format!(
            "a write answered {other:?} instead of attributes"
        ))),
    }
}

/// The metadata service.
#[derive(Debug)]
pub struct MetaService<S: Store> {
    pub(crate) meta: Arc<Meta<S>>,
    pub(crate) auth: Arc<auth::Auth>,
    pub(crate) locks: Arc<LockTable>,
    pub(crate) info: ServerInfo,
    pub(crate) data: Option<Arc<data::DataTasks>>,
    /// For the watch figures of `status`.
    pub(crate) watch: Option<Arc<watch::WatchHub<S>>>,
    pub(crate) requests: AtomicU64,
    pub(crate) request_errors: AtomicU64,
    /// `Meta.Batch` requests, and the calls they carried.
    pub(crate) batches: AtomicU64,
    pub(crate) batched_calls: AtomicU64,
    /// The batched calls' counters, when metrics are served.
    pub(crate) metrics: std::sync::OnceLock<calm_metrics::TimedSet>,
    /// Requests and time per uid and per job.
    pub(crate) loads: Arc<crate::load::Loads>,
    /// Files mounts hold (granted only by a server alone on its store).
    pub(crate) holds: Option<Arc<crate::holds::Holds>>,
}

impl<S: Store> MetaService<S> {
    pub fn new(
        meta: Arc<Meta<S>>,
        auth: Arc<auth::Auth>,
        locks: Arc<LockTable>,
        info: ServerInfo,
        data: Option<Arc<data::DataTasks>>,
    ) -> Self {
        Self {
            meta,
            auth,
            locks,
            info,
            data,
            watch: None,
            requests: AtomicU64::new(0),
            request_errors: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batched_calls: AtomicU64::new(0),
            metrics: std::sync::OnceLock::new(),
            loads: Arc::default(),
            holds: None,
        }
    }

    /// Counts the request and turns a namespace answer into a gRPC one.
    pub(crate) fn answer<T>(&self, result: Result<T, MetaError>) -> Result<Response<T>, Status> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(reply) => Ok(Response::new(reply)),
            Err(error) => {
                self.request_errors.fetch_add(1, Ordering::Relaxed);
                Err(status_from_error(&error))
            }
        }
    }
}

impl<S: Store> MetaService<S> {
    /// Applies a mutation that adds up to `adding` records to chunks of `handle` (the ones
    /// `chunks` names), and has those chunks compacted: when a chunk is full, the mutation is
    /// refused as busy, so the chunk is compacted now and the mutation tried again, up to
    /// [`compactor::WRITE_ROOM_WAIT_MAX`]; once applied, chunks with many records are queued
    /// for compaction.
    pub(crate) async fn apply_with_room(
        &self,
        caller: calm_meta::Caller,
        op: Op,
        id: Option<calm_meta::requests::RequestId>,
        handle: u64,
        adding: usize,
        chunks: impl Fn(&Meta<S>) -> Vec<u64>,
    ) -> Result<Done, MetaError> {
        let deadline = std::time::Instant::now() + compactor::WRITE_ROOM_WAIT_MAX;
        loop {
            let result = self
                .meta
                .apply_request(caller.clone(), op.clone(), id)
                .await;
            let Some(data) = &self.data else {
                return result;
            };
            let compactor = &data.compactor;
            match result {
                Ok(done) => {
                    compactor.written(&self.meta, handle, &chunks(&self.meta));
                    return Ok(done);
                }
                Err(MetaError::Busy(why)) if std::time::Instant::now() < deadline => {
                    let full = compactor.full(&self.meta, handle, &chunks(&self.meta), adding);
                    if full.is_empty() {
                        return Err(MetaError::Busy(why));
                    }
                    if !compactor.make_room(&self.meta, handle, &full).await? {
                        // Nothing could be compacted yet (the chunk kept changing): a breath.
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Counts a batch of `calls` calls (each is counted again as a request when answered).
    pub(crate) fn batched(&self, calls: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_calls
            .fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// A mutation that may have queued objects for deletion (an unlink, a rename over a file,
    /// a truncate) succeeded: the deleter looks.
    pub(crate) fn maybe_queued<T>(&self, result: &Result<T, MetaError>) {
        if result.is_ok()
            && let Some(data) = &self.data
        {
            data.queued();
        }
    }

    /// [`MetaService::answer`] for a mutation: the reply carries the changelog index reached
    /// (response metadata [`calm_proto::INDEX_KEY`]), at least the index of the mutation's own
    /// record; a watcher waits for its stream to pass it (own-operation completion).
    /// Refuses a removal that may keep an orphan for a user identity's session that keeps
    /// [`crate::auth::ORPHANS_PER_USER_SESSION_MAX`] already (RESOURCE_EXHAUSTED, naming it).
    pub(crate) fn room_for_orphans<T>(
        &self,
        r: &Request<T>,
        caller: &calm_meta::Caller,
        keeps: bool,
    ) -> Result<(), Status> {
        if !keeps || caller.session == 0 || self.auth.identity(r)?.is_trusted() {
            return Ok(());
        }
        let kept = self
            .meta
            .orphans()
            .map_err(|e| status_from_error(&e))?
            .iter()
            .filter(|(_, session)| *session == caller.session)
            .count();
        if kept >= crate::auth::ORPHANS_PER_USER_SESSION_MAX {
            return Err(Status::resource_exhausted(format!(
                "session {} keeps {kept} files open after their last name went, the most a \
                 user's session may (orphans per user session): close some first",
                caller.session
            )));
        }
        Ok(())
    }

    pub(crate) fn mutated<T>(&self, result: Result<T, MetaError>) -> Result<Response<T>, Status> {
        let mut response = self.answer(result)?;
        let index = self.meta.changelog_last();
        response.metadata_mut().insert(
            calm_proto::INDEX_KEY,
            index
                .to_string()
                .parse()
                .expect("digits are valid metadata"),
        );
        Ok(response)
    }
}

#[tonic::async_trait]
impl<S: Store> MetaRpc for MetaService<S> {
    async fn batch(
        &self,
        r: Request<pb::BatchRequest>,
    ) -> Result<Response<pb::BatchReply>, Status> {
        batch::serve(self, r).await
    }

    type HoldsStream = crate::holds::RecallStream;

    async fn holds(
        &self,
        r: Request<pb::SessionRequest>,
    ) -> Result<Response<Self::HoldsStream>, Status> {
        let caller = self.auth.caller(&r)?;
        crate::holds::serve(self.holds.clone(), caller.session)
    }

    async fn return_holds(
        &self,
        r: Request<pb::ReturnRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let caller = self.auth.caller(&r)?;
        if let Some(holds) = &self.holds {
            holds.give_back(caller.session, &r.get_ref().handles);
            holds.give_back_copies(caller.session, &r.get_ref().copies);
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn lookup(&self, r: Request<pb::LookupRequest>) -> Result<Response<pb::Attr>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let r = r.into_inner();
        self.answer(attr(self.meta.lookup_as(&caller, r.parent, &r.name)))
    }

    async fn get_attr(&self, r: Request<pb::HandleRequest>) -> Result<Response<pb::Attr>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        self.answer(attr(self.meta.getattr(r.into_inner().handle)))
    }

    async fn set_attr(&self, r: Request<pb::SetAttrRequest>) -> Result<Response<pb::Attr>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let truncate = r.size.is_some();
        let op = Op::SetAttr {
            handle: r.handle,
            attr: calm_proto::setattr_from_wire(&r),
        };
        let session = caller.session;
        let result = self.meta.apply_request(caller, op, id).await;
        self.changed(session, r.handle).await;
        if r.release_hold
            && let Some(holds) = &self.holds
        {
            holds.give_back(session, &[r.handle]);
        }
        if truncate {
            self.maybe_queued(&result);
            if let (Ok(Done::Attr(attr)), Some(data)) = (&result, &self.data) {
                // The chunk the file now ends in was clipped: compacted if it calls for it.
                let chunk = attr.size / calm_meta::slices::CHUNK_BYTES;
                data.compactor.written(&self.meta, attr.handle, &[chunk]);
            }
        }
        self.mutated(done_attr(result))
    }

    async fn make(&self, r: Request<pb::MakeRequest>) -> Result<Response<pb::Attr>, Status> {
        let _pass = self.enter();
        let prepared = self.prepare_make(r).await?;
        let result = match prepared.op {
            Ok(op) => {
                let (caller, id) = (prepared.caller, prepared.id);
                self.meta.apply_request_in_dir(caller, op, id).await
            }
            Err(error) => Err(error),
        };
        self.made(result, prepared.hold)
    }

    async fn link(&self, r: Request<pb::LinkRequest>) -> Result<Response<pb::Attr>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let _pass = self
            .recall(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let op = Op::Link {
            handle: r.handle,
            parent: r.parent,
            name: r.name,
        };
        self.mutated(done_entry(
            self.meta.apply_request_in_dir(caller, op, id).await,
        ))
    }

    async fn unlink(
        &self,
        r: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemovedReply>, Status> {
        // A request alone has the server's times (a mount's own only in an ordered batch).
        let _pass = self.enter();
        let (caller, op, id, _) = self.prepare_unlink(r).await?;
        self.unlinked(self.meta.apply_request_in_dir(caller, op, id).await)
    }

    async fn rmdir(&self, r: Request<pb::RemoveRequest>) -> Result<Response<pb::Empty>, Status> {
        let _pass = self.enter();
        let (caller, op, id, _) = self.prepare_rmdir(r).await?;
        self.removed_dir(self.meta.apply_request(caller, op, id).await)
    }

    async fn rename(
        &self,
        r: Request<pb::RenameRequest>,
    ) -> Result<Response<pb::RemovedReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::Dir(r.get_ref().parent))
            .await;
        let _pass = self
            .recall(caller.session, Recall::Dir(r.get_ref().new_parent))
            .await;
        let id = request_id(&self.auth, &r)?;
        self.room_for_orphans(&r, &caller, !r.get_ref().keep.is_empty())?;
        let r = r.into_inner();
        let op = Op::Rename {
            parent: r.parent,
            name: r.name,
            new_parent: r.new_parent,
            new_name: r.new_name,
            flags: r.flags,
            keep: r.keep,
        };
        let result = self.meta.apply_request_in_dir(caller, op, id).await;
        self.maybe_queued(&result);
        self.mutated(done_removed(result))
    }

    async fn readlink(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::ReadlinkReply>, Status> {
        self.auth.identity(&r)?;
        let result = self.meta.readlink(r.into_inner().handle);
        self.answer(result.map(|target| pb::ReadlinkReply { target }))
    }

    async fn read_dir(
        &self,
        r: Request<pb::ReadDirRequest>,
    ) -> Result<Response<pb::ReadDirReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::Dir(r.get_ref().handle))
            .await;
        let r = r.into_inner();
        if r.plus {
            let result =
                self.meta
                    .readdir_plus_as(&caller, r.handle, r.after_cookie, r.limit as usize);
            return self.answer(result.map(|entries| {
                pb::ReadDirReply {
                    entries: entries
                        .iter()
                        .map(|(entry, attr)| pb::DirEntry {
                            attr: attr.as_ref().map(pb::Attr::from),
                            ..pb::DirEntry::from(entry)
                        })
                        .collect(),
                }
            }));
        }
        let result = self
            .meta
            .readdir_as(&caller, r.handle, r.after_cookie, r.limit as usize);
        self.answer(result.map(|entries| pb::ReadDirReply {
            entries: entries.iter().map(pb::DirEntry::from).collect(),
        }))
    }

    async fn set_xattr(
        &self,
        r: Request<pb::SetXattrRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let (session, handle) = (caller.session, r.handle);
        let op = Op::SetXattr {
            handle: r.handle,
            name: r.name,
            value: r.value,
            flags: r.flags,
        };
        let result = self.meta.apply_request(caller, op, id).await;
        self.changed(session, handle).await;
        self.mutated(done_empty(result))
    }

    async fn get_xattr(
        &self,
        r: Request<pb::XattrRequest>,
    ) -> Result<Response<pb::XattrValue>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let r = r.into_inner();
        let result = self.meta.getxattr_as(&caller, r.handle, &r.name);
        self.answer(result.map(|value| pb::XattrValue { value }))
    }

    async fn list_xattr(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::XattrNames>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let result = self.meta.listxattr_as(&caller, r.into_inner().handle);
        self.answer(result.map(|names| pb::XattrNames { names }))
    }

    async fn remove_xattr(
        &self,
        r: Request<pb::XattrRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let (session, handle) = (caller.session, r.handle);
        let op = Op::RemoveXattr {
            handle: r.handle,
            name: r.name,
        };
        let result = self.meta.apply_request(caller, op, id).await;
        self.changed(session, handle).await;
        self.mutated(done_empty(result))
    }

    async fn stat_fs(&self, r: Request<pb::Empty>) -> Result<Response<pb::StatFsReply>, Status> {
        self.auth.identity(&r)?;
        self.answer(self.meta.statfs().map(|s| pb::StatFsReply {
            inodes: s.inodes,
            file_bytes: s.file_bytes,
            store_bytes: s.store_bytes,
            name_len_max: s.name_len_max,
            root_quota: s.root_quota.as_ref().map(calm_proto::quota::report_to_wire),
        }))
    }

    async fn sync(&self, r: Request<pb::Empty>) -> Result<Response<pb::Empty>, Status> {
        self.auth.identity(&r)?;
        self.answer(self.meta.sync().await.map(|()| pb::Empty {}))
    }

    async fn set_quota(
        &self,
        r: Request<pb::SetQuotaRequest>,
    ) -> Result<Response<pb::QuotaReport>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall(caller.session, Recall::All).await;
        let r = r.into_inner();
        let result = match calm_proto::quota::target_from_wire(r.target.as_ref()) {
            Ok(target) => {
                let limits = calm_proto::quota::limits_from_wire(r.limits.as_ref());
                self.meta.set_quota(caller.clone(), target, limits).await
            }
            Err(error) => Err(error),
        };
        // Holds granted since the recall above may have been judged without the new limit:
        // asked back, and none asked for before is granted.
        if let Some(holds) = &self.holds {
            holds.limits_changed();
        }
        let _pass = self.recall(caller.session, Recall::All).await;
        self.mutated(result.map(|report| calm_proto::quota::report_to_wire(&report)))
    }

    async fn get_quota(
        &self,
        r: Request<pb::QuotaTarget>,
    ) -> Result<Response<pb::QuotaReport>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall(caller.session, Recall::All).await;
        let result = calm_proto::quota::target_from_wire(Some(r.get_ref()))
            .and_then(|target| self.meta.quota(&caller, target));
        self.answer(result.map(|report| calm_proto::quota::report_to_wire(&report)))
    }

    async fn list_quotas(
        &self,
        r: Request<pb::QuotaListRequest>,
    ) -> Result<Response<pb::QuotaReports>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall(caller.session, Recall::All).await;
        let result = self.meta.quotas(&caller, r.get_ref().all);
        self.answer(result.map(|reports| {
            pb::QuotaReports {
                reports: reports
                    .iter()
                    .map(calm_proto::quota::report_to_wire)
                    .collect(),
            }
        }))
    }

    async fn check_quotas(
        &self,
        r: Request<pb::Empty>,
    ) -> Result<Response<pb::QuotaCheckReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall(caller.session, Recall::All).await;
        // Reads every inode: off the runtime's threads.
        let result = off_runtime(self.meta.clone(), move |meta| meta.quota_check(&caller)).await;
        self.answer(result.map(|mismatches| {
            pb::QuotaCheckReply {
                mismatches: mismatches
                    .iter()
                    .map(calm_proto::quota::mismatch_to_wire)
                    .collect(),
            }
        }))
    }

    async fn summary(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::SummaryReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall(caller.session, Recall::All).await;
        let dir = r.get_ref().handle;
        let result = off_runtime(self.meta.clone(), move |meta| meta.summary(&caller, dir)).await;
        self.answer(result.map(|s| pb::SummaryReply {
            usage: Some(calm_proto::quota::usage_to_wire(s.usage)),
            kept: s.kept,
        }))
    }

    async fn status(&self, r: Request<pb::Empty>) -> Result<Response<pb::StatusReply>, Status> {
        let identity = self.auth.identity(&r)?;
        let result = self.status_now().map(|mut status| {
            crate::load::visible_to(&identity, &mut status);
            status
        });
        self.answer(result)
    }

    async fn data_info(
        &self,
        r: Request<pb::Empty>,
    ) -> Result<Response<pb::DataInfoReply>, Status> {
        self.auth.trusted(&r, "the object store's address")?;
        let result = self.meta.objects_url().and_then(|url| {
            let url =
                url.ok_or_else(|| MetaError::Invalid("this namespace has no object store".into()))?;
            Ok((url, self.meta.namespace_id()?))
        });
        self.answer(result.map(|(objects_url, namespace_id)| pb::DataInfoReply {
            objects_url,
            namespace_id,
            chunk_bytes: calm_meta::slices::CHUNK_BYTES,
            block_bytes: calm_meta::slices::BLOCK_BYTES,
        }))
    }

    async fn read_map(
        &self,
        r: Request<pb::ReadMapRequest>,
    ) -> Result<Response<pb::ReadMapReply>, Status> {
        self.auth.trusted(&r, "read_map")?;
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        // A copy only for a client whose callers the server checks as it names them (opens
        // answered from the copy are checked by its kernel alone), of a file without an access
        // ACL (as for holds); and only if no change of the file is counted between here,
        // before the map is read, and the grant.
        let copies = r.get_ref().copy && caller.session != 0 && self.auth.acts_as_named(&r);
        let r = r.into_inner();
        let changes = match (&self.holds, copies) {
            (Some(holds), true) => Some(holds.changes(r.handle)),
            _ => None,
        };
        let session = caller.session;
        let result = self
            .meta
            .read_map_as(&caller, r.handle, r.from_chunk, r.max_records as usize)
            .map(|map| pb::ReadMapReply {
                attr: Some(pb::Attr::from(&map.attr)),
                records: map
                    .chunks
                    .iter()
                    .flat_map(|(chunk, slices)| {
                        slices.iter().map(|s| calm_proto::slice_to_wire(*chunk, s))
                    })
                    .collect(),
                more: map.more,
                inline: map
                    .inline
                    .into_iter()
                    .map(|(id, data)| pb::InlineBytes { id, data })
                    .collect(),
                copy: false,
            })
            .map(|mut reply| {
                reply.copy = !reply.more
                    && r.from_chunk == 0
                    && matches!(
                        self.meta.holdable(r.handle),
                        Ok(Some(calm_meta::Kind::File))
                    )
                    && matches!((&self.holds, changes), (Some(holds), Some(changes))
                        if holds.grant_copy(session, r.handle, changes));
                reply
            });
        self.answer(result)
    }

    async fn write(&self, r: Request<pb::WriteRequest>) -> Result<Response<pb::Attr>, Status> {
        self.auth.trusted(&r, "write")?;
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let slices: Vec<_> = r.records.iter().map(calm_proto::slice_from_wire).collect();
        let mut chunks: Vec<u64> = slices.iter().map(|(c, _)| *c).collect();
        chunks.sort_unstable();
        chunks.dedup();
        let adding = slices.len();
        let inline = r.inline.into_iter().map(|b| (b.id, b.data)).collect();
        let session = caller.session;
        let op = Op::Write {
            handle: r.handle,
            slices,
            end: r.end,
            inline,
        };
        let then = crate::meta_write::change_after_write(r.handle, r.set_attr)?;
        let result = self
            .write_then_change(caller, op, id, r.handle, adding, chunks, then)
            .await;
        self.changed(session, r.handle).await;
        self.mutated(attr(done_to_attr(result)))
    }

    async fn append(&self, r: Request<pb::AppendRequest>) -> Result<Response<pb::Attr>, Status> {
        self.auth.trusted(&r, "append")?;
        let caller = self.auth.caller(&r)?;
        let _pass = self
            .recall(caller.session, Recall::File(r.get_ref().handle))
            .await;
        let id = request_id(&self.auth, &r)?;
        let r = r.into_inner();
        let (handle, size) = (r.handle, r.size);
        let op = Op::Append {
            handle,
            id: r.id,
            size,
            inline: r.inline,
        };
        // The chunks at the file's end, where the bytes go.
        let at_end = |meta: &Meta<S>| match meta.getattr(handle) {
            Ok(attr) => calm_meta::slices::split(attr.size, u64::from(size).max(1))
                .into_iter()
                .map(|(chunk, _, _)| chunk)
                .collect(),
            Err(_) => Vec::new(),
        };
        let session = caller.session;
        let result = done_to_attr(
            self.apply_with_room(caller, op, id, handle, 1, at_end)
                .await,
        );
        self.changed(session, handle).await;
        if let (Ok(attr), Some(data)) = (&result, &self.data) {
            let start = attr.size.saturating_sub(u64::from(size));
            data.compactor
                .appended(&self.meta, handle, start, attr.size);
        }
        self.mutated(attr(result))
    }

    async fn grant_handles(
        &self,
        r: Request<pb::GrantRequest>,
    ) -> Result<Response<pb::GrantReply>, Status> {
        self.grant(r).await
    }

    async fn hold_dir(
        &self,
        r: Request<pb::HoldDirRequest>,
    ) -> Result<Response<pb::HoldDirReply>, Status> {
        self.hold_named_dir(r).await
    }

    async fn alloc_slices(
        &self,
        r: Request<pb::AllocSlicesRequest>,
    ) -> Result<Response<pb::AllocSlicesReply>, Status> {
        self.auth.trusted(&r, "alloc_slices")?;
        let result = self.meta.alloc_slices(r.into_inner().count).await;
        self.answer(result.map(|first| pb::AllocSlicesReply { first }))
    }

    async fn release_orphan(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.trusted(&r, "release_orphan")?;
        let caller = self.auth.caller(&r)?;
        let op = Op::ReleaseOrphan {
            handle: r.into_inner().handle,
            any_session: false,
        };
        let result = self.meta.apply_as(caller, op).await;
        self.maybe_queued(&result);
        self.answer(done_empty(result))
    }

    async fn claim_orphans(
        &self,
        r: Request<pb::OrphansRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.trusted(&r, "claim_orphans")?;
        let caller = self.auth.caller(&r)?;
        let op = Op::ClaimOrphans {
            handles: r.into_inner().handles,
        };
        self.answer(done_empty(self.meta.apply_as(caller, op).await))
    }
}
