//! The lock service's side of the wire: owners, ranges, holders, and the stable lock codes
//! (see the `Locks` service in proto/calm.proto). Both sides convert here, so what a client
//! decodes is what the manager said.

use calm_locks::{Holder, LockError, LockKind, OFFSET_MAX, Owner, Range, Request, Scope};

use crate::pb;

/// The metadata key holding a [`LockCode`] on a status that refuses a whole lock RPC.
pub const LOCK_CODE_KEY: &str = "calm-lock-code";

/// Largest number of operations in one [`pb::LockBatch`].
pub const LOCK_BATCH_OPS_MAX: usize = 65_536;

/// The stable code of a lock answer. Numbers are part of the protocol: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockCode {
    Ok = 0,
    /// EAGAIN, with the conflicting holder.
    Conflict = 1,
    /// EAGAIN: an earlier waiting request conflicts.
    Queued = 2,
    /// EDEADLK.
    Deadlock = 3,
    /// The session expired or was closed.
    Fenced = 4,
    NoSuchSession = 5,
    /// ENOLCK.
    TooManyLocks = 6,
    TooManyWaits = 7,
    TooManySessions = 8,
    BadLease = 9,
    /// EINTR.
    Cancelled = 10,
    /// EINVAL: a malformed request.
    Invalid = 11,
    /// ENOENT: no file with that handle.
    NoSuchFile = 12,
    /// The server could not be reached or answered with something else than a lock answer.
    Unavailable = 13,
    /// Another server decides the file's locks (the client's view is old): ask for the
    /// members again and send it there.
    Moved = 14,
    /// The server took the file over and its clients are still reclaiming: send it again
    /// shortly.
    Grace = 15,
    /// A reclaim came too late (after the grace that followed the server's restart) or from
    /// an identity that held nothing before it: the lock is lost. EIO.
    Lost = 16,
}

impl LockCode {
    const ALL: [LockCode; 17] = [
        LockCode::Ok,
        LockCode::Conflict,
        LockCode::Queued,
        LockCode::Deadlock,
        LockCode::Fenced,
        LockCode::NoSuchSession,
        LockCode::TooManyLocks,
        LockCode::TooManyWaits,
        LockCode::TooManySessions,
        LockCode::BadLease,
        LockCode::Cancelled,
        LockCode::Invalid,
        LockCode::NoSuchFile,
        LockCode::Unavailable,
        LockCode::Moved,
        LockCode::Grace,
        LockCode::Lost,
    ];

    pub fn from_wire(code: u32) -> LockCode {
        LockCode::ALL
            .into_iter()
            .find(|c| *c as u32 == code)
            .unwrap_or(LockCode::Unavailable)
    }

    /// The errno a file system reports for it.
    pub fn errno(self) -> i32 {
        match self {
            LockCode::Ok => 0,
            LockCode::Conflict | LockCode::Queued => 11, // EAGAIN
            LockCode::Deadlock => 35,                    // EDEADLK
            LockCode::TooManyLocks | LockCode::TooManyWaits | LockCode::TooManySessions => 37, // ENOLCK
            LockCode::Cancelled => 4,                     // EINTR
            LockCode::NoSuchFile => 2,                    // ENOENT
            LockCode::Invalid | LockCode::BadLease => 22, // EINVAL
            LockCode::Fenced
            | LockCode::NoSuchSession
            | LockCode::Unavailable
            | LockCode::Moved
            | LockCode::Grace
            | LockCode::Lost => 5, // EIO
        }
    }
}

pub fn code_of(error: &LockError) -> LockCode {
    match error {
        LockError::Conflict(_) => LockCode::Conflict,
        LockError::Queued => LockCode::Queued,
        LockError::Deadlock => LockCode::Deadlock,
        LockError::Fenced(_) => LockCode::Fenced,
        LockError::NoSuchSession(_) => LockCode::NoSuchSession,
        LockError::TooManyLocks { .. } => LockCode::TooManyLocks,
        LockError::TooManyWaits { .. } => LockCode::TooManyWaits,
        LockError::TooManySessions { .. } => LockCode::TooManySessions,
        LockError::BadLease { .. } => LockCode::BadLease,
        LockError::Cancelled => LockCode::Cancelled,
        LockError::Moved => LockCode::Moved,
        _ => LockCode::Invalid,
    }
}

/// A lock answer that is not a success, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockFailure {
    pub code: LockCode,
    pub message: String,
}

impl std::fmt::Display for LockFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl std::error::Error for LockFailure {}

impl LockFailure {
    pub fn new(code: LockCode, message: impl Into<String>) -> Self {
        LockFailure {
            code,
            message: message.into(),
        }
    }
}

impl From<&LockError> for LockFailure {
    fn from(error: &LockError) -> Self {
        LockFailure::new(code_of(error), error.to_string())
    }
}

/// The status refusing a whole lock RPC (a fenced or unknown session, a bad batch).
pub fn status_from_lock_failure(failure: &LockFailure) -> tonic::Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(
        LOCK_CODE_KEY,
        (failure.code as u32)
            .to_string()
            .parse()
            .expect("digits are valid metadata"),
    );
    let code = match failure.code {
        LockCode::Invalid | LockCode::BadLease => tonic::Code::InvalidArgument,
        LockCode::TooManySessions | LockCode::TooManyLocks | LockCode::TooManyWaits => {
            tonic::Code::ResourceExhausted
        }
        LockCode::NoSuchFile => tonic::Code::NotFound,
        _ => tonic::Code::FailedPrecondition,
    };
    tonic::Status::with_metadata(code, failure.message.clone(), metadata)
}

pub fn lock_failure_from_status(status: &tonic::Status) -> LockFailure {
    match status
        .metadata()
        .get(LOCK_CODE_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
    {
        Some(code) => LockFailure::new(LockCode::from_wire(code), status.message()),
        None => LockFailure::new(
            LockCode::Unavailable,
            format!("{:?}: {}", status.code(), status.message()),
        ),
    }
}

pub fn owner_to_wire(owner: Owner) -> pb::LockOwner {
    let who = match owner {
        Owner::Process { pid } => pb::lock_owner::Who::Pid(pid),
        Owner::File { file } => pb::lock_owner::Who::File(file),
    };
    pb::LockOwner { who: Some(who) }
}

pub fn owner_from_wire(owner: Option<&pb::LockOwner>) -> Result<Owner, LockFailure> {
    match owner.and_then(|o| o.who) {
        Some(pb::lock_owner::Who::Pid(pid)) => Ok(Owner::Process { pid }),
        Some(pb::lock_owner::Who::File(file)) => Ok(Owner::File { file }),
        None => Err(LockFailure::new(
            LockCode::Invalid,
            "a lock request needs an owner",
        )),
    }
}

pub fn scope_to_wire(scope: Scope) -> Option<pb::LockRange> {
    match scope {
        Scope::Range(range) => Some(pb::LockRange {
            start: range.start,
            end: range.end,
        }),
        Scope::WholeFile => None,
    }
}

pub fn scope_from_wire(range: Option<&pb::LockRange>) -> Result<Scope, LockFailure> {
    match range {
        None => Ok(Scope::WholeFile),
        Some(r) if r.start <= r.end && r.end <= OFFSET_MAX => Ok(Scope::Range(Range {
            start: r.start,
            end: r.end,
        })),
        Some(r) => Err(LockFailure::new(
            LockCode::Invalid,
            format!(
                "byte range {}..={} is not a range within 0..={OFFSET_MAX}",
                r.start, r.end
            ),
        )),
    }
}

pub fn kind_to_wire(kind: LockKind) -> u32 {
    match kind {
        LockKind::Read => 1,
        LockKind::Write => 2,
    }
}

pub fn kind_from_wire(kind: u32) -> Result<LockKind, LockFailure> {
    match kind {
        1 => Ok(LockKind::Read),
        2 => Ok(LockKind::Write),
        other => Err(LockFailure::new(
            LockCode::Invalid,
            format!("lock type {other} is neither 1 (read) nor 2 (write)"),
        )),
    }
}

pub fn holder_to_wire(holder: &Holder) -> pb::LockHolder {
    pb::LockHolder {
        session: holder.session,
        owner: Some(owner_to_wire(holder.owner)),
        range: scope_to_wire(holder.scope),
        kind: kind_to_wire(holder.kind),
        pid: holder.owner.pid(),
    }
}

pub fn holder_from_wire(holder: &pb::LockHolder) -> Result<Holder, LockFailure> {
    Ok(Holder {
        session: holder.session,
        owner: owner_from_wire(holder.owner.as_ref())?,
        scope: scope_from_wire(holder.range.as_ref())?,
        kind: kind_from_wire(holder.kind)?,
    })
}

/// One operation of a lock batch, in the manager's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockCall {
    /// Take a lock without waiting (F_SETLK, LOCK_NB).
    Set(Request),
    /// [`LockCall::Set`] for a process of user `uid` (a mount's request: the server counts
    /// the locks of each user it serves against one limit).
    SetFor(Request, u32),
    /// Report a conflicting holder (F_GETLK).
    Test(Request),
    /// Release the owner's locks in the request's scope (its kind is ignored).
    Unlock(Request),
    /// Release every lock of the owner, on one file or (None) everywhere.
    Release(Owner, Option<u64>),
    /// Take again a lock held through the file's previous server (after a takeover).
    Reclaim(Request),
}

impl LockCall {
    pub fn to_wire(&self) -> pb::LockOp {
        let (op, request, uid) = match self {
            LockCall::Set(r) => (1, r, 0),
            LockCall::SetFor(r, uid) => (1, r, *uid),
            LockCall::Test(r) => (2, r, 0),
            LockCall::Unlock(r) => (3, r, 0),
            LockCall::Reclaim(r) => (5, r, 0),
            LockCall::Release(owner, resource) => {
                return pb::LockOp {
                    op: 4,
                    resource: resource.unwrap_or(0),
                    owner: Some(owner_to_wire(*owner)),
                    range: None,
                    kind: 0,
                    uid: 0,
                };
            }
        };
        pb::LockOp {
            op,
            resource: request.resource,
            owner: Some(owner_to_wire(request.owner)),
            range: scope_to_wire(request.scope),
            kind: kind_to_wire(request.kind),
            uid,
        }
    }
}

/// The answer to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockAnswer {
    pub code: LockCode,
    /// With [`LockCode::Conflict`]: the holder in the way.
    pub conflict: Option<Holder>,
    /// For a release: how many locks the owner held.
    pub released: u64,
    pub message: String,
}

impl LockAnswer {
    pub fn from_wire(result: &pb::LockResult) -> LockAnswer {
        LockAnswer {
            code: LockCode::from_wire(result.code),
            conflict: result
                .conflict
                .as_ref()
                .and_then(|h| holder_from_wire(h).ok()),
            released: result.released,
            message: result.message.clone(),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.code == LockCode::Ok
    }

    /// An answer of `code` made by the client itself.
    pub fn failed(code: LockCode, message: impl Into<String>) -> LockAnswer {
        LockAnswer {
            code,
            conflict: None,
            released: 0,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_holders_survive_the_wire() {
        for code in LockCode::ALL {
            assert_eq!(LockCode::from_wire(code as u32), code);
            let status = status_from_lock_failure(&LockFailure::new(code, "why"));
            assert_eq!(
                lock_failure_from_status(&status),
                LockFailure::new(code, "why")
            );
        }
        let holder = Holder {
            session: 7,
            owner: Owner::File { file: 3 },
            scope: Scope::Range(Range {
                start: 1,
                end: OFFSET_MAX,
            }),
            kind: LockKind::Write,
        };
        let wire = holder_to_wire(&holder);
        assert_eq!(wire.pid, -1);
        assert_eq!(holder_from_wire(&wire), Ok(holder));
        let bad = pb::LockRange { start: 5, end: 4 };
        assert_eq!(
            scope_from_wire(Some(&bad)).unwrap_err().code,
            LockCode::Invalid
        );
        let past = pb::LockRange {
            start: 0,
            end: OFFSET_MAX + 1,
        };
        assert_eq!(
            scope_from_wire(Some(&past)).unwrap_err().code,
            LockCode::Invalid
        );
        assert_eq!(kind_from_wire(3).unwrap_err().code, LockCode::Invalid);
        assert_eq!(owner_from_wire(None).unwrap_err().code, LockCode::Invalid);
    }
}
