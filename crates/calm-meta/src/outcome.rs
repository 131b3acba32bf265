//! What a mutation answers: what it did ([`Done`]) or why it failed ([`Failure`]: the
//! namespace said no and nothing was written, or the store failed and the whole group is
//! dropped).

use calm_store::StoreError;

use calm_changelog::User;

use crate::error::MetaError;
use crate::types::*;

/// What a successful mutation returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Attr(Attr),
    Nothing,
    User(User),
    /// The first of the slice ids or of the handles handed out.
    Ids(u64),
    /// The file lost its last name and is kept as an orphan of the caller's session.
    Orphaned(Handle),
    /// A quota as it is after the mutation.
    Quota(calm_types::QuotaReport),
    /// Entries of a directory cloned: the subdirectories made (source, copy), where to go on
    /// (the last source name key done; `None`: the directory is done), and how many.
    Cloned {
        dirs: Vec<(Handle, Handle)>,
        next: Option<Vec<u8>>,
        entries: u64,
    },
    /// An entry of the trash named again: its attributes, directory and name.
    Restored {
        attr: Attr,
        parent: Handle,
        name: Vec<u8>,
    },
}

/// Why a mutation failed.
#[derive(Debug)]
pub enum Failure {
    /// The namespace said no; nothing was written.
    Meta(MetaError),
    /// The store failed; the transaction must be dropped.
    Store(StoreError),
}

impl From<MetaError> for Failure {
    fn from(error: MetaError) -> Self {
        Failure::Meta(error)
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Store(error)
    }
}

impl From<Failure> for MetaError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Meta(error) => error,
            Failure::Store(error) => error.into(),
        }
    }
}

pub(crate) type Outcome<T> = Result<T, Failure>;
