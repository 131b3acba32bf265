//! fcntl and flock locks of the mount, forwarded to the server's lock manager.
//!
//! One lock session per mount, renewed every third of its lease: when the mount process dies,
//! the lease runs out and the server releases every lock the mount held, waking their
//! waiters. The kernel names a lock's owner with an opaque id (`lock_owner`): the process's
//! file table for POSIX locks, the open file description for OFD and flock locks. That id is
//! the manager's [`Owner::File`]; the pid of the process that last locked for it is kept here,
//! so that F_GETLK reports a POSIX holder's pid (0 for a holder on another mount, whose pid
//! means nothing here).
//!
//! A blocking request (F_SETLKW, flock without LOCK_NB) is a server-side wait tagged with the
//! FUSE request's id; a signal to the waiting process arrives as FUSE_INTERRUPT naming that id,
//! and cancels the wait: the process gets EINTR and nothing is left behind.

use crate::shared::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm_client::Client;
use calm_locks::{LockKind, Owner, Range, Request, Scope, SessionId};
use calm_meta::Handle;
use calm_proto::locks::{LockAnswer, LockCall, LockCode, LockFailure};

/// Default lease of a mount's lock session.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// Most lock owners whose pid is remembered; past it the table starts over (F_GETLK then
/// reports pid 0 for the locks of owners forgotten).
pub const PIDS_MAX: usize = 1 << 20;

/// A blocking lock request of this mount.
#[derive(Debug, Default)]
struct Wait {
    /// The session it waits in, once sent to the server.
    session: Option<SessionId>,
    /// Interrupted before it was sent: it is answered EINTR without being sent.
    interrupted: bool,
}

/// How long an interrupt keeps asking the server to cancel a wait it has not seen yet (the
/// request is on its way), in milliseconds, and how long it waits between two tries.
pub const CANCEL_RETRY_MS_MAX: u64 = 10_000;
const CANCEL_RETRY_PAUSE_MS: u64 = 1;

/// What F_GETLK reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub range: Range,
    pub kind: LockKind,
    pub pid: u32,
}

/// The mount's lock session and bookkeeping.
#[derive(Debug)]
pub struct LockForwarder {
    client: Client,
    lease_ms: u64,
    session: Mutex<SessionId>,
    /// Lock owner → pid of the process that last locked for it.
    pids: Mutex<HashMap<u64, u32>>,
    /// FUSE request id → its blocking request, from when the request was read until it is
    /// answered.
    waits: Mutex<HashMap<u64, Wait>>,
    /// Signalled when the session was replaced by a new one.
    replaced: tokio::sync::Notify,
}

fn errno_of(failure: &LockFailure) -> i32 {
    failure.code.errno()
}

fn answer_errno(answer: &LockAnswer) -> Result<(), i32> {
    if answer.is_ok() {
        Ok(())
    } else {
        Err(answer.code.errno())
    }
}

impl LockForwarder {
    /// Opens the mount's lock session.
    pub async fn open(client: Client, lease_ms: u64) -> Result<Arc<LockForwarder>, LockFailure> {
        let session = client.open_lock_session(lease_ms).await?;
        Ok(Arc::new(LockForwarder {
            client,
            lease_ms,
            session: Mutex::new(session),
            pids: Mutex::new(HashMap::new()),
            waits: Mutex::new(HashMap::new()),
            replaced: tokio::sync::Notify::new(),
        }))
    }

    pub fn session(&self) -> SessionId {
        *lock(&self.session)
    }

    /// Completes when the session has been replaced by a new one since the last call.
    pub async fn replaced(&self) {
        self.replaced.notified().await
    }

    /// Renews the lease until the forwarder is dropped. A session the server no longer knows
    /// (it expired while this process stalled, or the server restarted) is replaced: its
    /// locks are gone, which is logged; new requests go to the new session.
    pub async fn keep_alive(self: Arc<Self>) {
        let period = Duration::from_millis((self.lease_ms / 3).max(10));
        loop {
            tokio::time::sleep(period).await;
            let session = self.session();
            match self.client.keep_alive(session).await {
                Ok(_) => {}
                Err(failure)
                    if matches!(failure.code, LockCode::Fenced | LockCode::NoSuchSession) =>
                {
                    tracing::warn!(session, %failure, "lock session lost; opening a new one");
                    match self.client.open_lock_session(self.lease_ms).await {
                        Ok(new) => {
                            *lock(&self.session) = new;
                            self.replaced.notify_one();
                        }
                        Err(e) => tracing::warn!(%e, "opening a lock session"),
                    }
                }
                Err(failure) => tracing::warn!(session, %failure, "renewing the lock lease"),
            }
        }
    }

    fn remember_pid(&self, owner: u64, pid: u32) {
        let mut pids = lock(&self.pids);
        if pids.len() >= PIDS_MAX && !pids.contains_key(&owner) {
            pids.clear();
        }
        pids.insert(owner, pid);
    }

    fn pid_of(&self, session: SessionId, holder_session: SessionId, owner: Owner) -> u32 {
        match owner {
            Owner::Process { pid } => pid,
            Owner::File { file } if holder_session == session => {
                lock(&self.pids).get(&file).copied().unwrap_or(0)
            }
            Owner::File { .. } => 0,
        }
    }

    async fn one(&self, call: LockCall) -> Result<LockAnswer, i32> {
        let session = self.session();
        let answers = self
            .client
            .lock_batch(session, &[call])
            .await
            .map_err(|f| errno_of(&f))?;
        answers.into_iter().next().ok_or(libc::EIO)
    }

    /// F_GETLK: the lock of another owner in the way, if any.
    pub async fn test(
        &self,
        handle: Handle,
        owner: u64,
        range: Range,
        kind: LockKind,
    ) -> Result<Option<Conflict>, i32> {
        let session = self.session();
        let request = Request {
            resource: handle,
            owner: Owner::File { file: owner },
            scope: Scope::Range(range),
            kind,
        };
        let answer = self.one(LockCall::Test(request)).await?;
        match (answer.code, answer.conflict) {
            (LockCode::Ok, _) => Ok(None),
            (LockCode::Conflict, Some(holder)) => Ok(Some(Conflict {
                range: match holder.scope {
                    Scope::Range(range) => range,
                    Scope::WholeFile => Range {
                        start: 0,
                        end: calm_locks::OFFSET_MAX,
                    },
                },
                kind: holder.kind,
                pid: self.pid_of(session, holder.session, holder.owner),
            })),
            (code, _) => Err(code.errno()),
        }
    }

    /// Takes a lock; with `wait`, waits for it (until granted, refused with EDEADLK, or
    /// interrupted through [`LockForwarder::interrupt`] with `request_id`).
    pub async fn set(
        &self,
        handle: Handle,
        owner: u64,
        pid: u32,
        scope: Scope,
        kind: LockKind,
        wait: Option<u64>,
    ) -> Result<(), i32> {
        self.remember_pid(owner, pid);
        let request = Request {
            resource: handle,
            owner: Owner::File { file: owner },
            scope,
            kind,
        };
        let Some(request_id) = wait else {
            return answer_errno(&self.one(LockCall::Set(request)).await?);
        };
        let session = self.session();
        {
            let mut waits = lock(&self.waits);
            let wait = waits.entry(request_id).or_default();
            if wait.interrupted {
                waits.remove(&request_id);
                return Err(libc::EINTR);
            }
            wait.session = Some(session);
        }
        let answer = self.client.lock_wait(session, request_id, request).await;
        lock(&self.waits).remove(&request_id);
        answer_errno(&answer.map_err(|f| errno_of(&f))?)
    }

    /// A blocking request `request_id` was read: from now on an interrupt naming it is kept
    /// until [`LockForwarder::set`] sends it (or answers EINTR instead). Called in the order
    /// the kernel sent the requests, before the interrupt can be read.
    pub fn expect_wait(&self, request_id: u64) {
        lock(&self.waits).insert(request_id, Wait::default());
    }

    /// Ends the wait of FUSE request `request_id`, if one is running or about to (a signal
    /// reached the waiting process). A wait the server has not seen yet is asked for again
    /// until it has, or until it was answered.
    pub async fn interrupt(&self, request_id: u64) {
        let mut tries = 0;
        loop {
            let session = {
                let mut waits = lock(&self.waits);
                match waits.get_mut(&request_id) {
                    // Answered already, or not a blocking request.
                    None => return,
                    Some(wait) => match wait.session {
                        Some(session) => session,
                        None => {
                            wait.interrupted = true;
                            return;
                        }
                    },
                }
            };
            match self.client.lock_cancel(session, request_id).await {
                Ok(true) => return,
                Ok(false) if tries < CANCEL_RETRY_MS_MAX / CANCEL_RETRY_PAUSE_MS => {
                    // On its way to the server, or being answered: look again.
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(CANCEL_RETRY_PAUSE_MS)).await;
                }
                Ok(false) => {
                    tracing::warn!(request_id, "a lock wait could not be cancelled");
                    return;
                }
                Err(failure) => {
                    tracing::warn!(request_id, %failure, "cancelling a lock wait");
                    return;
                }
            }
        }
    }

    /// Releases `owner`'s locks in `scope`.
    pub async fn unlock(&self, handle: Handle, owner: u64, scope: Scope) -> Result<(), i32> {
        let request = Request {
            resource: handle,
            owner: Owner::File { file: owner },
            scope,
            kind: LockKind::Read,
        };
        answer_errno(&self.one(LockCall::Unlock(request)).await?)
    }

    /// Releases every lock of each of `owners` on `handle` (the last close of an open file).
    pub async fn release(&self, handle: Handle, owners: &[u64]) -> Result<(), i32> {
        if owners.is_empty() {
            return Ok(());
        }
        let calls: Vec<LockCall> = owners
            .iter()
            .map(|owner| LockCall::Release(Owner::File { file: *owner }, Some(handle)))
            .collect();
        let answers = self
            .client
            .lock_batch(self.session(), &calls)
            .await
            .map_err(|f| errno_of(&f))?;
        for answer in &answers {
            answer_errno(answer)?;
        }
        Ok(())
    }

    /// Ends the session (unmount): the server releases whatever is left.
    pub async fn close(&self) {
        if let Err(failure) = self.client.close_lock_session(self.session()).await {
            tracing::warn!(%failure, "closing the lock session");
        }
    }
}
