//! What the data plane can fail with, split by what a caller does about it.

/// A data-plane error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The object store URL or a request is malformed.
    #[error("invalid: {0}")]
    Invalid(String),
    /// An object the metadata names is not in the store.
    #[error("object missing: {0}")]
    Missing(String),
    /// An object does not check out (checksum, length, format): never returned as contents.
    #[error("object corrupt: {0}")]
    Corrupt(String),
    /// The store is full (or over its quota).
    #[error("object store full: {0}")]
    NoSpace(String),
    /// The store could not be reached or failed.
    #[error("object store unavailable: {0}")]
    Unavailable(String),
    /// The store belongs to another namespace: nothing is deleted from it.
    #[error("object store not this namespace's: {0}")]
    Taken(String),
}

impl DataError {
    /// The errno a file operation answers with.
    pub fn errno(&self) -> i32 {
        match self {
            DataError::Invalid(_) => libc_einval(),
            DataError::NoSpace(_) => 28, // ENOSPC
            DataError::Missing(_)
            | DataError::Corrupt(_)
            | DataError::Unavailable(_)
            | DataError::Taken(_) => 5, // EIO
        }
    }
}

const fn libc_einval() -> i32 {
    22
}

impl From<object_store::Error> for DataError {
    fn from(error: object_store::Error) -> Self {
        if let object_store::Error::NotFound { path, .. } = &error {
            return DataError::Missing(path.clone());
        }
        // A full local disk surfaces as an io::Error somewhere in the chain; a full S3 store as
        // an HTTP status in the text.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>()
                && matches!(io.raw_os_error(), Some(28) | Some(122))
            {
                return DataError::NoSpace(error.to_string());
            }
            source = cause.source();
        }
        let text = error.to_string();
        if text.contains("No space left") || text.contains("InsufficientStorage") {
            DataError::NoSpace(text)
        } else {
            DataError::Unavailable(text)
        }
    }
}
