//! The lock service (`calm.v1.Locks`) over a server's [`LockTable`].
//!
//! - A waiting request (`Wait`) is a oneshot channel the manager's events complete: the
//!   client never polls. `Cancel` by tag is EINTR; a `Wait` RPC dropped by its client (the
//!   connection went away) cancels too.
//! - Session ids start at `epoch << 32`: the store's epoch grows at every start, so a session
//!   of an earlier server life is fenced, never confused with a new one.
//! - Several servers on one store: a request for a file decided elsewhere is answered `Moved`,
//!   one for a file in a takeover's grace `Grace` (reclaims excepted).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use calm_locks::{LockError, Outcome, Request as LockRequest, SessionId, WaitId};
use calm_meta::{Meta, MetaError};
use calm_proto::locks::{
    LOCK_BATCH_OPS_MAX, LockCode, LockFailure, code_of, holder_to_wire, kind_from_wire,
    kind_to_wire, owner_from_wire, owner_to_wire, scope_from_wire, scope_to_wire,
    status_from_lock_failure,
};
use calm_proto::pb;
use calm_proto::pb::locks_server::Locks as LocksRpc;
use calm_store::Store;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::lock_table::Inner;
pub use crate::lock_table::LockTable;

/// Most locks (and, separately, waiting requests) one `List` reply carries: 65 536 holders
/// of about 40 bytes stay well under the message limit. `total` says how many there are.
pub const LIST_LOCKS_MAX: usize = 65_536;

/// Operation numbers of [`pb::LockOp`].
const OP_SET: u32 = 1;
const OP_TEST: u32 = 2;
const OP_UNLOCK: u32 = 3;
const OP_RELEASE: u32 = 4;
const OP_RECLAIM: u32 = 5;

/// Cancels a waiting request whose RPC is dropped before it completes.
struct WaitGuard<'a> {
    table: &'a LockTable,
    wait: WaitId,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut inner = self.table.lock();
        if inner.pending.remove(&self.wait).is_some() {
            inner.manager.cancel(self.wait);
            inner.forget(self.wait);
            inner.deliver();
        }
    }
}

/// One parsed operation.
enum Call {
    /// A set; `true`: a reclaim. With the uid a mount said it asks for.
    Set(LockRequest, bool, u32),
    Test(LockRequest),
    Unlock(LockRequest),
    Release(calm_locks::Owner, Option<u64>),
}

fn failure(code: LockCode, message: impl Into<String>) -> LockFailure {
    LockFailure::new(code, message)
}

fn parse(op: &pb::LockOp) -> Result<Call, LockFailure> {
    let owner = owner_from_wire(op.owner.as_ref())?;
    if op.op == OP_RELEASE {
        return Ok(Call::Release(
            owner,
            (op.resource != 0).then_some(op.resource),
        ));
    }
    if op.resource == 0 {
        return Err(failure(LockCode::Invalid, "a lock needs a file handle"));
    }
    let scope = scope_from_wire(op.range.as_ref())?;
    let kind = if op.op == OP_UNLOCK {
        calm_locks::LockKind::Read
    } else {
        kind_from_wire(op.kind)?
    };
    let request = LockRequest {
        resource: op.resource,
        owner,
        scope,
        kind,
    };
    match op.op {
        OP_SET => Ok(Call::Set(request, false, op.uid)),
        OP_RECLAIM => Ok(Call::Set(request, true, op.uid)),
        OP_TEST => Ok(Call::Test(request)),
        OP_UNLOCK => Ok(Call::Unlock(request)),
        other => Err(failure(
            LockCode::Invalid,
            format!(
                "lock operation {other} is not 1 set, 2 test, 3 unlock, 4 release or 5 reclaim"
            ),
        )),
    }
}

/// Whom a set's locks count against ([`calm_locks::Limits::locks_per_account_max`]): a user
/// identity's own uid; through a mount (an administrator's or a mount's connection), the uid
/// the mount says its process has (root as nobody where the mount's root is squashed). Root's
/// locks, and those of a client that says no uid, are held to the server's limits only.
fn account(identity: &crate::auth::Identity, said: u32) -> Option<calm_locks::Account> {
    let uid = match identity {
        crate::auth::Identity::User { uid, .. } => *uid,
        crate::auth::Identity::Mount { squash: true, .. } if said == 0 => crate::auth::NOBODY,
        crate::auth::Identity::Admin { .. } | crate::auth::Identity::Mount { .. } => said,
    };
    (uid != 0).then_some(uid)
}

fn result_of(outcome: Result<u64, LockError>) -> pb::LockResult {
    match outcome {
        Ok(released) => pb::LockResult {
            code: LockCode::Ok as u32,
            released,
            ..Default::default()
        },
        Err(error) => {
            let conflict = match &error {
                LockError::Conflict(holder) => Some(holder_to_wire(holder)),
                _ => None,
            };
            pb::LockResult {
                code: code_of(&error) as u32,
                conflict,
                message: error.to_string(),
                released: 0,
            }
        }
    }
}

fn result_of_failure(failure: LockFailure) -> pb::LockResult {
    pb::LockResult {
        code: failure.code as u32,
        message: failure.message,
        ..Default::default()
    }
}

/// The `calm.v1.Locks` service.
#[derive(Debug)]
pub struct LockService<S: Store> {
    meta: Arc<Meta<S>>,
    table: Arc<LockTable>,
    /// Also who opened each session (`auth.sessions`): only its owner (or an administrator)
    /// uses or closes it.
    auth: Arc<crate::auth::Auth>,
}

impl<S: Store> LockService<S> {
    pub fn new(meta: Arc<Meta<S>>, table: Arc<LockTable>, auth: Arc<crate::auth::Auth>) -> Self {
        LockService { meta, table, auth }
    }

    /// `reply` with the changelog index the namespace has reached (response metadata
    /// [`calm_proto::INDEX_KEY`]): whatever the previous holder of a lock granted here
    /// committed is at or below it, so a mount whose change stream has passed it has dropped
    /// every stale page of the file (`docs/design/mount.md`, "Caches").
    fn indexed<T>(&self, reply: T) -> Response<T> {
        let mut response = Response::new(reply);
        let index = self
            .meta
            .changelog_last()
            .max(self.table.client_index.load(Ordering::Acquire));
        response.metadata_mut().insert(
            calm_proto::INDEX_KEY,
            index
                .to_string()
                .parse()
                .expect("digits are valid metadata"),
        );
        response
    }

    /// The identity of `request`, if it may use `session`: the one that opened it, or an
    /// administrator.
    fn owner_of<T>(
        &self,
        request: &Request<T>,
        session: SessionId,
    ) -> Result<crate::auth::Identity, Status> {
        let identity = self.auth.identity(request)?;
        // Unknown to this server (ended, or never opened): the manager says so.
        if self.auth.sessions.may_use(session, &identity) {
            Ok(identity)
        } else {
            Err(Status::permission_denied(format!(
                "lock session {session} belongs to another client"
            )))
        }
    }

    /// A set names a file that exists (locks of a file unlinked while open stay until
    /// released, as POSIX wants, but a new lock needs a live handle); a user (not a mount,
    /// whose kernel checked the open file) needs read permission for a read lock and write
    /// permission for a write lock, as fcntl asks of the descriptor.
    fn check_file(
        &self,
        request: &LockRequest,
        identity: &crate::auth::Identity,
    ) -> Result<(), LockFailure> {
        // First on a snapshot of what this server has followed (no round trip to a shared
        // store); a refusal, or a file not seen yet (created through another server a moment
        // ago), is confirmed on a fresh one. So an advisory lock may miss only another
        // server's removal of the file or of the caller's permission in the last moments; the
        // namespace checks every access to the contents on a fresh snapshot.
        self.check_file_on(request, identity, self.meta.owner(request.resource, true))
            .or_else(|_| {
                self.check_file_on(request, identity, self.meta.owner(request.resource, false))
            })
    }

    /// [`LockService::check_file`] against the file's attributes `found`.
    fn check_file_on(
        &self,
        request: &LockRequest,
        identity: &crate::auth::Identity,
        found: calm_meta::Result<calm_meta::perm::Owner>,
    ) -> Result<(), LockFailure> {
        match found {
            Ok(owner) => {
                if let crate::auth::Identity::User {
                    uid, gid, groups, ..
                } = identity
                {
                    let caller = calm_meta::Caller {
                        session: 0,
                        uid: *uid,
                        gid: *gid,
                        groups: groups.clone(),
                    };
                    let allowed = match request.kind {
                        calm_locks::LockKind::Read => {
                            calm_meta::perm::may_read_contents(&caller, &owner)
                        }
                        calm_locks::LockKind::Write => {
                            calm_meta::perm::may_write_contents(&caller, &owner)
                        }
                    };
                    if let Err(error) = allowed {
                        return Err(failure(LockCode::Invalid, error.to_string()));
                    }
                }
                Ok(())
            }
            Err(MetaError::NotFound | MetaError::Stale) => Err(failure(
                LockCode::NoSuchFile,
                format!("no file with handle {}", request.resource),
            )),
            Err(error) => Err(failure(LockCode::Unavailable, error.to_string())),
        }
    }

    fn session_ok(inner: &Inner, session: SessionId) -> Result<(), Status> {
        inner
            .manager
            .live(session)
            .map_err(|error| status_from_lock_failure(&LockFailure::from(&error)))
    }
}

#[tonic::async_trait]
impl<S: Store> LocksRpc for LockService<S> {
    async fn open_session(
        &self,
        r: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::SessionReply>, Status> {
        let identity = self.auth.identity(&r)?;
        // A client in this process ends with it: after a restart nobody waits for its reclaim.
        let in_process = r.extensions().get::<calm_proto::InProcess>().is_some();
        let lease_ms = r.into_inner().lease_ms;
        let _reservation = self
            .auth
            .sessions
            .reserve(&identity, |s| self.table.lock().manager.live(s).is_ok())
            .map_err(|limit| {
                Status::resource_exhausted(format!(
                    "{} has {limit} lock sessions open, its limit (sessions per user)",
                    identity.key()
                ))
            })?;
        let locks_max = match identity.is_trusted() {
            true => u64::MAX,
            false => crate::auth::LOCKS_PER_USER_SESSION_MAX,
        };
        let session = {
            let mut inner = self.table.lock();
            inner
                .manager
                .open_session_with(self.table.lease_now_ms(), lease_ms, locks_max)
        }
        .map_err(|error| status_from_lock_failure(&LockFailure::from(&error)))?;
        // Written down before it may hold anything: a server that takes this one's files over,
        // or this one restarted, waits for the session's reclaim.
        if !in_process && let Err(e) = self.table.hold(session, identity.key(), lease_ms).await {
            let _ = self.table.lock().manager.close_session(session);
            return Err(status_from_lock_failure(&failure(LockCode::Unavailable, e)));
        }
        self.auth.sessions.opened(session, identity.key(), |s| {
            self.table.lock().manager.live(s).is_ok()
        });
        self.table.lease_changed.notify_one();
        Ok(Response::new(pb::SessionReply { session, lease_ms }))
    }

    async fn keep_alive(
        &self,
        r: Request<pb::SessionRequest>,
    ) -> Result<Response<pb::SessionReply>, Status> {
        let session = r.get_ref().session;
        self.owner_of(&r, session)?;
        let mut inner = self.table.lock();
        let result = inner.manager.renew(session, self.table.lease_now_ms());
        inner.deliver();
        let deadline_ms =
            result.map_err(|error| status_from_lock_failure(&LockFailure::from(&error)))?;
        let lease_ms = deadline_ms.saturating_sub(self.table.lease_now_ms());
        Ok(Response::new(pb::SessionReply { session, lease_ms }))
    }

    async fn close_session(
        &self,
        r: Request<pb::SessionRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let session = r.get_ref().session;
        self.owner_of(&r, session)?;
        let mut inner = self.table.lock();
        let result = inner.manager.close_session(session);
        inner.deliver();
        drop(inner);
        self.auth.sessions.closed(session);
        if result.is_ok() {
            self.table.forget_session(session);
        }
        result.map_err(|error| status_from_lock_failure(&LockFailure::from(&error)))?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn apply(
        &self,
        r: Request<pb::LockBatch>,
    ) -> Result<Response<pb::LockBatchReply>, Status> {
        let identity = self.owner_of(&r, r.get_ref().session)?;
        self.table.note_client_index(&r);
        let batch = r.into_inner();
        if batch.ops.len() > LOCK_BATCH_OPS_MAX {
            return Err(status_from_lock_failure(&failure(
                LockCode::Invalid,
                format!(
                    "{} operations in one batch; the limit is {LOCK_BATCH_OPS_MAX}",
                    batch.ops.len()
                ),
            )));
        }
        // Parse and check files before taking the mutex.
        let calls: Vec<Result<Call, LockFailure>> = batch
            .ops
            .iter()
            .map(|op| {
                let call = parse(op)?;
                if let Call::Set(request, _, _) = &call {
                    self.check_file(request, &identity)?;
                }
                Ok(call)
            })
            .collect();
        let session = batch.session;
        let mut inner = self.table.lock();
        Self::session_ok(&inner, session)?;
        let table = &self.table;
        let results = calls
            .into_iter()
            .map(|call| {
                let routed = match &call {
                    Ok(Call::Set(request, reclaim, _)) => {
                        let reclaimer = reclaim.then_some(identity.key());
                        table.route(&inner, request.resource, reclaimer, false)
                    }
                    Ok(Call::Test(request)) => table.route(&inner, request.resource, None, false),
                    Ok(Call::Unlock(request)) => table.route(&inner, request.resource, None, true),
                    Ok(Call::Release(_, Some(resource))) => {
                        table.route(&inner, *resource, None, true)
                    }
                    Ok(Call::Release(_, None)) | Err(_) => Ok(()),
                };
                match routed {
                    Ok(()) => call,
                    Err(failure) => Err(failure),
                }
            })
            .collect::<Vec<_>>();
        let manager = &mut inner.manager;
        let results = results
            .into_iter()
            .map(|call| match call {
                Err(failure) => result_of_failure(failure),
                Ok(Call::Set(request, _, uid)) => result_of(
                    manager
                        .set_for(session, account(&identity, uid), request, false)
                        .map(|_| 0),
                ),
                Ok(Call::Test(request)) => match manager.test(session, request) {
                    Ok(Some(holder)) => result_of(Err(LockError::Conflict(holder))),
                    Ok(None) => result_of(Ok(0)),
                    Err(error) => result_of(Err(error)),
                },
                Ok(Call::Unlock(request)) => result_of(
                    manager
                        .unlock(session, request.resource, request.owner, request.scope)
                        .map(|()| 0),
                ),
                Ok(Call::Release(owner, resource)) => {
                    result_of(manager.release(session, owner, resource))
                }
            })
            .collect();
        inner.deliver();
        drop(inner);
        Ok(self.indexed(pb::LockBatchReply { results }))
    }

    async fn wait(&self, r: Request<pb::WaitRequest>) -> Result<Response<pb::LockResult>, Status> {
        let identity = self.owner_of(&r, r.get_ref().session)?;
        self.table.note_client_index(&r);
        let r = r.into_inner();
        let op = r.op.unwrap_or_default();
        let (request, uid) = match parse(&op) {
            Ok(Call::Set(request, false, uid)) => (request, uid),
            Ok(_) => {
                return Ok(Response::new(result_of_failure(failure(
                    LockCode::Invalid,
                    "only a set can wait",
                ))));
            }
            Err(failure) => return Ok(Response::new(result_of_failure(failure))),
        };
        if let Err(failure) = self.check_file(&request, &identity) {
            return Ok(Response::new(result_of_failure(failure)));
        }
        let (sender, receiver) = oneshot::channel();
        let wait = {
            let mut inner = self.table.lock();
            Self::session_ok(&inner, r.session)?;
            if let Err(failure) = self.table.route(&inner, request.resource, None, false) {
                return Ok(Response::new(result_of_failure(failure)));
            }
            if inner.by_tag.contains_key(&(r.session, r.tag)) {
                return Ok(Response::new(result_of_failure(failure(
                    LockCode::Invalid,
                    format!("tag {} already names a waiting request", r.tag),
                ))));
            }
            let outcome = inner
                .manager
                .set_for(r.session, account(&identity, uid), request, true);
            let wait = match outcome {
                Ok(Outcome::Granted) => None,
                Ok(Outcome::Waiting(wait)) => {
                    inner.pending.insert(wait, sender);
                    inner.by_tag.insert((r.session, r.tag), wait);
                    inner.tags.insert(wait, (r.session, r.tag));
                    Some(wait)
                }
                Err(error) => {
                    inner.deliver();
                    return Ok(Response::new(result_of(Err(error))));
                }
            };
            inner.deliver();
            wait
        };
        let Some(wait) = wait else {
            return Ok(self.indexed(result_of(Ok(0))));
        };
        let mut guard = WaitGuard {
            table: &self.table,
            wait,
            armed: true,
        };
        let reply = tokio::select! {
            reply = receiver => reply,
            // The wait is cancelled here (the guard) and goes on at the file's next decider,
            // or here once the server is back.
            _ = self.table.stopping.wait() => return Err(crate::stopping::stopping_status()),
        };
        guard.armed = false;
        let reply = reply.unwrap_or(Err(LockError::Cancelled));
        Ok(self.indexed(result_of(reply.map(|()| 0))))
    }

    async fn cancel(
        &self,
        r: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelReply>, Status> {
        self.owner_of(&r, r.get_ref().session)?;
        let r = r.into_inner();
        let mut inner = self.table.lock();
        Self::session_ok(&inner, r.session)?;
        let Some(wait) = inner.by_tag.get(&(r.session, r.tag)).copied() else {
            return Ok(Response::new(pb::CancelReply { cancelled: false }));
        };
        let cancelled = inner.manager.cancel(wait);
        inner.forget(wait);
        if let Some(sender) = inner.pending.remove(&wait) {
            let _ = sender.send(Err(LockError::Cancelled));
        }
        inner.deliver();
        Ok(Response::new(pb::CancelReply { cancelled }))
    }

    async fn members(&self, r: Request<pb::Empty>) -> Result<Response<pb::MembersReply>, Status> {
        self.auth.identity(&r)?;
        Ok(Response::new(self.table.members_reply()))
    }

    async fn reclaim_done(
        &self,
        r: Request<pb::ReclaimDoneRequest>,
    ) -> Result<Response<pb::ReclaimDoneReply>, Status> {
        // A report counts only for the sessions the caller opened (the registry recorded who
        // opened each).
        let identity = self.auth.identity(&r)?;
        let r = r.into_inner();
        let accepted = match self.table.has_peers() {
            true => self
                .table
                .reclaim_done(&r.sessions, &r.view, identity.key()),
            false => self.table.recovery_reported(&r.sessions, identity.key()),
        };
        Ok(Response::new(pb::ReclaimDoneReply { accepted }))
    }

    async fn list(
        &self,
        r: Request<pb::ListLocksRequest>,
    ) -> Result<Response<pb::ListLocksReply>, Status> {
        self.auth.identity(&r)?;
        let resource = r.into_inner().resource;
        let inner = self.table.lock();
        // Another server's file, or one whose clients are still reclaiming after a takeover:
        // what this server holds of it is not the whole answer, so it gives none.
        self.table
            .route(&inner, resource, None, false)
            .map_err(|failure| status_from_lock_failure(&failure))?;
        let held = inner.manager.locks(resource);
        let total = held.len() as u64;
        let locks = held
            .iter()
            .take(LIST_LOCKS_MAX)
            .map(holder_to_wire)
            .collect();
        let waiting = inner
            .manager
            .waiting(resource)
            .into_iter()
            .take(LIST_LOCKS_MAX)
            .map(|w| pb::LockWaiter {
                wait: w.wait,
                session: w.session,
                owner: Some(owner_to_wire(w.request.owner)),
                range: scope_to_wire(w.request.scope),
                kind: kind_to_wire(w.request.kind),
            })
            .collect();
        Ok(Response::new(pb::ListLocksReply {
            locks,
            waiting,
            total,
        }))
    }
}
