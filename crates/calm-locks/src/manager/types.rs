//! The words of the lock manager's interface: resources, sessions, owners and scopes, what a
//! request asks and a holder holds, the limits, the errors, and the events and outcomes a
//! call reports.

use crate::range::{LockKind, OFFSET_MAX, Range};

/// A lockable object: the server uses the inode handle.
pub type ResourceId = u64;
pub type SessionId = u64;
/// A waiting request, numbered in arrival order.
pub type WaitId = u64;

/// Who asks, inside a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A POSIX record-lock owner: one process of the session's client.
    Process { pid: u32 },
    /// An open file description: the owner of OFD record locks and of flock locks.
    File { file: u64 },
}

impl Owner {
    /// The pid F_GETLK reports for a lock of this owner: -1 for an open file description.
    pub fn pid(self) -> i32 {
        match self {
            Owner::Process { pid } => pid as i32,
            Owner::File { .. } => -1,
        }
    }
}

/// What a request locks: a byte range (POSIX and OFD record locks) or the whole file (flock).
/// The two never conflict with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Range(Range),
    WholeFile,
}

impl Scope {
    /// The bytes a change of this scope can matter to, for waking waiters.
    pub(super) fn span(self) -> Range {
        match self {
            Scope::Range(range) => range,
            Scope::WholeFile => Range {
                start: 0,
                end: OFFSET_MAX,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    pub resource: ResourceId,
    pub owner: Owner,
    pub scope: Scope,
    pub kind: LockKind,
}

/// A held lock as the outside sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub session: SessionId,
    pub owner: Owner,
    pub scope: Scope,
    pub kind: LockKind,
}

/// A waiting request as the outside sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub wait: WaitId,
    pub session: SessionId,
    pub request: Request,
}

/// Named limits. A request past one is refused with an error that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub sessions_max: usize,
    /// Locks one session may hold over all its owners and resources (ENOLCK past it).
    pub locks_per_session_max: u64,
    /// Locks held in all, over every session: the bound on the manager's memory for locks
    /// (about 68 bytes each; ENOLCK past it).
    pub locks_max: u64,
    /// Locks one account (a user, whatever session and mount it locks through: see
    /// [`LockManager::set_for`]) may hold in all (ENOLCK past it).
    pub locks_per_account_max: u64,
    /// Requests one session may have waiting at once.
    pub waits_per_session_max: u64,
    pub lease_ms_min: u64,
    pub lease_ms_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions_max: 65_536,
            locks_per_session_max: 1 << 24,
            locks_max: 1 << 25,
            locks_per_account_max: 1 << 18,
            waits_per_session_max: 65_536,
            lease_ms_min: 100,
            lease_ms_max: 600_000,
        }
    }
}

/// Why a request is refused. Expected conditions, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// EAGAIN: a held lock conflicts (F_SETLK, LOCK_NB); here is one.
    Conflict(Holder),
    /// EAGAIN: no held lock conflicts, but an earlier waiting request asked first.
    Queued,
    /// EDEADLK: waiting would close a cycle in the wait-for graph.
    Deadlock,
    /// The session's lease ran out (or it was closed): everything it held is gone.
    Fenced(SessionId),
    NoSuchSession(SessionId),
    /// ENOLCK: the session holds `locks_per_session_max` locks, its account
    /// `locks_per_account_max`, or the manager `locks_max`.
    TooManyLocks {
        limit: u64,
    },
    TooManyWaits {
        limit: u64,
    },
    TooManySessions {
        limit: usize,
    },
    /// A lease outside `[lease_ms_min, lease_ms_max]`.
    BadLease {
        min_ms: u64,
        max_ms: u64,
    },
    /// The waiting request was cancelled (EINTR).
    Cancelled,
    /// The file's locks are now decided by another server (several servers on one store).
    Moved,
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Conflict(holder) => write!(
                f,
                "conflicts with a {:?} lock of session {} {:?} on {:?}",
                holder.kind, holder.session, holder.owner, holder.scope
            ),
            LockError::Queued => write!(f, "an earlier waiting request conflicts"),
            LockError::Deadlock => write!(f, "waiting would deadlock"),
            LockError::Fenced(session) => write!(
                f,
                "session {session} has expired or was closed and its locks were released; \
                 open a new session"
            ),
            LockError::NoSuchSession(session) => write!(f, "no session {session}"),
            LockError::TooManyLocks { limit } => {
                write!(f, "the session holds its limit of {limit} locks")
            }
            LockError::TooManyWaits { limit } => {
                write!(f, "the session has its limit of {limit} waiting requests")
            }
            LockError::TooManySessions { limit } => {
                write!(f, "the server has its limit of {limit} sessions")
            }
            LockError::BadLease { min_ms, max_ms } => {
                write!(f, "a lease must be between {min_ms} and {max_ms} ms")
            }
            LockError::Cancelled => write!(f, "the waiting request was cancelled"),
            LockError::Moved => write!(f, "another server decides this file's locks now"),
        }
    }
}

impl std::error::Error for LockError {}

/// What became of a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Granted(WaitId),
    /// Refused after waiting: its session expired or was closed.
    Refused(WaitId, LockError),
}

/// The answer to a request that may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Granted,
    /// Queued; an [`Event`] with this id will say how it ended.
    Waiting(WaitId),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub resources: usize,
    pub locks: u64,
    pub waits: usize,
}

/// Lock requests by how they ended, and sessions ended by their lease, since the manager was
/// made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Granted when asked.
    pub granted: u64,
    /// Granted after waiting.
    pub granted_after_wait: u64,
    /// Refused at once for a conflicting lock (a request that does not wait).
    pub conflicts: u64,
    /// Refused because waiting would have deadlocked.
    pub deadlocks: u64,
    /// Sessions ended because their lease ran out.
    pub expired: u64,
}
