//! fcntl and flock locks of the mount, forwarded to the server's lock manager.
//!
//! One lock session per mount on each server it locks through (`calm_client::routing`: with
//! several servers, each file's locks go to the server that decides them, and follow the
//! file when it moves), renewed every third of its lease: when the mount process dies, the
//! leases run out and the servers release every lock the mount held, waking their waiters. The kernel names a lock's owner with an opaque id (`lock_owner`): the process's
//! file table for POSIX locks, the open file description for OFD and flock locks. That id is
//! the manager's [`Owner::File`]; the pid of the process that last locked for it is kept here,
//! so that F_GETLK reports a POSIX holder's pid (0 for a holder on another mount, whose pid
//! means nothing here).
//!
//! A blocking request (F_SETLKW, flock without LOCK_NB) is a server-side wait tagged with the
//! FUSE request's id; a signal to the waiting process arrives as FUSE_INTERRUPT naming that id,
//! and cancels the wait: the process gets EINTR and nothing is left behind.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm_client::Client;
use calm_client::routing::LockRouter;
use calm_locks::{LockKind, Owner, Range, Request, Scope, SessionId};
use calm_proto::locks::{LockAnswer, LockCall, LockCode, LockFailure};
use calm_types::Handle;

/// Default lease of a mount's lock session.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// Most lock owners whose pid is remembered; past it the table starts over (F_GETLK then
/// reports pid 0 for the locks of owners forgotten).
pub const PIDS_MAX: usize = 1 << 20;

/// A blocking lock request of this mount.
#[derive(Debug, Default)]
struct Wait {
    /// Handed to the router, which sends it (and cancels it by its tag).
    sent: bool,
    /// Interrupted before it was sent: it is answered EINTR without being sent.
    interrupted: bool,
}

/// How long an interrupt keeps asking the server to cancel a wait it has not seen yet (the
/// request is on its way), in milliseconds, and how long it waits between two tries.
pub const CANCEL_RETRY_MS_MAX: u64 = 10_000;
const CANCEL_RETRY_PAUSE_MS: u64 = 1;
/// Longest an interrupt waits for the server to confirm the cancel of a wait before the mount
/// answers the waiting request EINTR itself.
pub const CANCEL_ANSWER_MS_MAX: u64 = 1_000;

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
    router: Arc<LockRouter>,
    /// Lock owner → pid of the process that last locked for it.
    pids: Mutex<HashMap<u64, u32>>,
    /// FUSE request id → its blocking request, from when the request was read until it is
    /// answered.
    waits: Mutex<HashMap<u64, Wait>>,
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
    /// Opens the mount's lock session (on its server; on the others when it first locks
    /// through them).
    pub async fn open(client: Client, lease_ms: u64) -> Result<Arc<LockForwarder>, LockFailure> {
        let router = LockRouter::open(client, lease_ms).await?;
        Ok(Arc::new(LockForwarder {
            router,
            pids: Mutex::new(HashMap::new()),
            waits: Mutex::new(HashMap::new()),
        }))
    }

    /// The session on the mount's own server, which its namespace calls name.
    pub fn session(&self) -> SessionId {
        self.router.home_session()
    }

    /// Completes when the session has been replaced by a new one since the last call.
    pub async fn replaced(&self) {
        self.router.replaced().await
    }

    /// Renews the leases and follows the servers' view until the forwarder is dropped (see
    /// [`LockRouter::run`]).
    pub async fn keep_alive(self: Arc<Self>) {
        self.router.clone().run().await
    }

    fn remember_pid(&self, owner: u64, pid: u32) {
        let mut pids = self.pids.locked();
        if pids.len() >= PIDS_MAX && !pids.contains_key(&owner) {
            pids.clear();
        }
        pids.insert(owner, pid);
    }

    fn pid_of(&self, holder_session: SessionId, owner: Owner) -> u32 {
        match owner {
            Owner::Process { pid } => pid,
            Owner::File { file } if self.router.is_mine(holder_session) => {
                self.pids.locked().get(&file).copied().unwrap_or(0)
            }
            Owner::File { .. } => 0,
        }
    }

    async fn one(&self, handle: Handle, call: LockCall) -> Result<LockAnswer, i32> {
        let answers = self
            .router
            .call(handle, &[call])
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
        let request = Request {
            resource: handle,
            owner: Owner::File { file: owner },
            scope: Scope::Range(range),
            kind,
        };
        let answer = self.one(handle, LockCall::Test(request)).await?;
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
                pid: self.pid_of(holder.session, holder.owner),
            })),
            (code, _) => Err(code.errno()),
        }
    }

    /// Whether a lock of another mount's session covers part of `range` (this mount's own
    /// processes' locks do not count).
    pub async fn held_elsewhere(&self, handle: Handle, range: Range) -> Result<bool, i32> {
        // An owner no process of this mount is: any lock on the range is in its way.
        let request = Request {
            resource: handle,
            owner: Owner::File { file: u64::MAX },
            scope: Scope::Range(range),
            kind: LockKind::Write,
        };
        let answer = self.one(handle, LockCall::Test(request)).await?;
        match (answer.code, answer.conflict) {
            (LockCode::Ok, _) => Ok(false),
            (LockCode::Conflict, Some(holder)) => Ok(!self.router.is_mine(holder.session)),
            (code, _) => Err(code.errno()),
        }
    }

    /// Takes a lock for a process of user `uid` (whose locks the server counts against that
    /// user's limit); with `wait`, waits for it (until granted, refused with EDEADLK, or
    /// interrupted through [`LockForwarder::interrupt`] with `request_id`).
    #[allow(clippy::too_many_arguments)]
    pub async fn set(
        &self,
        handle: Handle,
        owner: u64,
        pid: u32,
        uid: u32,
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
            return answer_errno(&self.one(handle, LockCall::SetFor(request, uid)).await?);
        };
        {
            let mut waits = self.waits.locked();
            let wait = waits.entry(request_id).or_default();
            if wait.interrupted {
                waits.remove(&request_id);
                return Err(libc::EINTR);
            }
            wait.sent = true;
        }
        let answer = self.router.wait(request_id, request, Some(uid)).await;
        self.waits.locked().remove(&request_id);
        answer_errno(&answer.map_err(|f| errno_of(&f))?)
    }

    /// A blocking request `request_id` was read: from now on an interrupt naming it is kept
    /// until [`LockForwarder::set`] sends it (or answers EINTR instead). Called in the order
    /// the kernel sent the requests, before the interrupt can be read.
    pub fn expect_wait(&self, request_id: u64) {
        self.waits.locked().insert(request_id, Wait::default());
    }

    /// Ends the wait of FUSE request `request_id`, if one is running or about to (a signal
    /// reached the waiting process). A wait the server has not seen yet is asked for again
    /// until it has, or until it was answered.
    ///
    /// False when the server did not confirm the cancel within [`CANCEL_ANSWER_MS_MAX`] (it
    /// is stopped, or gone): the caller answers the request EINTR itself, and a grant that
    /// comes later is given back.
    pub async fn interrupt(&self, request_id: u64) -> bool {
        let mut tries = 0;
        loop {
            {
                let mut waits = self.waits.locked();
                match waits.get_mut(&request_id) {
                    // Answered already, or not a blocking request.
                    None => return true,
                    Some(wait) if !wait.sent => {
                        wait.interrupted = true;
                        return true;
                    }
                    Some(_) => {}
                }
            }
            let answer = Duration::from_millis(CANCEL_ANSWER_MS_MAX);
            match tokio::time::timeout(answer, self.router.cancel(request_id)).await {
                Ok(Ok(true)) => return true,
                Ok(Ok(false)) if tries < CANCEL_RETRY_MS_MAX / CANCEL_RETRY_PAUSE_MS => {
                    // On its way to the server, or being answered: look again.
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(CANCEL_RETRY_PAUSE_MS)).await;
                }
                Ok(Ok(false)) => {
                    tracing::warn!(request_id, "a lock wait could not be cancelled");
                    return true;
                }
                Ok(Err(failure)) => {
                    tracing::warn!(request_id, %failure, "cancelling a lock wait");
                    return false;
                }
                Err(_) => {
                    tracing::warn!(
                        request_id,
                        "the server did not confirm the cancel of a lock wait"
                    );
                    return false;
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
        answer_errno(&self.one(handle, LockCall::Unlock(request)).await?)
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
            .router
            .call(handle, &calls)
            .await
            .map_err(|f| errno_of(&f))?;
        for answer in &answers {
            answer_errno(answer)?;
        }
        Ok(())
    }

    /// Completes when locks were lost since the last call (the server restarted and did not
    /// give them back: [`LockForwarder::take_lost`] says which).
    pub async fn lost_changed(&self) {
        self.router.lost_changed().await
    }

    /// Whether a lock on `handle` was lost and [`LockForwarder::take_lost`] did not say so yet.
    pub fn lost_untaken(&self, handle: Handle) -> bool {
        self.router.lost_untaken(handle)
    }

    /// The locks lost since the last call: `(file, lock owner)`.
    pub fn take_lost(&self) -> Vec<(Handle, u64)> {
        self.router
            .take_lost()
            .into_iter()
            .filter_map(|(handle, owner)| match owner {
                Owner::File { file } => Some((handle, file)),
                Owner::Process { .. } => None,
            })
            .collect()
    }

    /// Before this mount commits writes to `handle`: when it holds a lock on the file and its
    /// server has not confirmed the session within half the lease, the session is renewed
    /// first (a mount cut off longer than its lease may have lost its locks to another
    /// holder; it finds out here, before its writes land).
    pub async fn confirm(&self, handle: Handle) {
        if self.router.holds(handle) && !self.router.fresh() {
            self.router.confirm().await;
        }
    }

    /// Ends the session (unmount): the server releases whatever is left.
    pub async fn close(&self) {
        self.router.close().await
    }
}
