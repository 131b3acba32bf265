//! The namespace's error type. Every variant has a stable wire code and maps one to one to a
//! POSIX errno, so a FUSE adapter or a remote client can hand the caller exactly what Linux
//! would. Codes are part of the protocol: never renumber, only add.

/// What a namespace operation can fail with. Expected conditions only: a broken invariant is
/// an assertion, not a variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("file name too long")]
    NameTooLong,
    #[error("no such attribute")]
    NoData,
    #[error("attribute name out of range")]
    Range,
    #[error("attribute value too large")]
    TooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("resource busy: {0}")]
    Busy(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("file too large")]
    FileTooBig,
    #[error("I/O error: {0}")]
    Io(String),
    #[error("store is read-only: {0}")]
    ReadOnly(String),
    #[error("stale handle")]
    Stale,
    #[error("store needs repair: {0}")]
    Corrupt(String),
    #[error("permission denied: {0}")]
    Access(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The two names are on different metadata clusters (one namespace over several): a rename or a link
    /// between them is refused, as between two file systems.
    #[error("invalid cross-device link: {0}")]
    CrossDevice(String),
    /// A quota's limit would be passed (its name and figures in the detail).
    #[error("disk quota exceeded: {0}")]
    QuotaExceeded(String),
}

/// `(code, errno, name)` for every variant, in code order. The single source of truth for
/// the mapping; a test checks that it is one to one.
pub const CODES: &[(u32, i32, &str)] = &[
    (1, 2, "NotFound"),         // ENOENT
    (2, 17, "Exists"),          // EEXIST
    (3, 20, "NotDir"),          // ENOTDIR
    (4, 21, "IsDir"),           // EISDIR
    (5, 39, "NotEmpty"),        // ENOTEMPTY
    (6, 22, "Invalid"),         // EINVAL
    (7, 36, "NameTooLong"),     // ENAMETOOLONG
    (8, 61, "NoData"),          // ENODATA
    (9, 34, "Range"),           // ERANGE
    (10, 7, "TooBig"),          // E2BIG
    (11, 31, "TooManyLinks"),   // EMLINK
    (12, 1, "NotPermitted"),    // EPERM
    (13, 16, "Busy"),           // EBUSY
    (14, 28, "NoSpace"),        // ENOSPC
    (15, 27, "FileTooBig"),     // EFBIG
    (16, 5, "Io"),              // EIO
    (17, 30, "ReadOnly"),       // EROFS
    (18, 116, "Stale"),         // ESTALE
    (19, 117, "Corrupt"),       // EUCLEAN
    (20, 13, "Access"),         // EACCES
    (21, 95, "NotSupported"),   // EOPNOTSUPP
    (22, 18, "CrossDevice"),    // EXDEV
    (23, 122, "QuotaExceeded"), // EDQUOT
];

impl MetaError {
    /// The stable wire code of this error.
    pub fn code(&self) -> u32 {
        match self {
            MetaError::NotFound => 1,
            MetaError::Exists => 2,
            MetaError::NotDir => 3,
            MetaError::IsDir => 4,
            MetaError::NotEmpty => 5,
            MetaError::Invalid(_) => 6,
            MetaError::NameTooLong => 7,
            MetaError::NoData => 8,
            MetaError::Range => 9,
            MetaError::TooBig => 10,
            MetaError::TooManyLinks => 11,
            MetaError::NotPermitted(_) => 12,
            MetaError::Busy(_) => 13,
            MetaError::NoSpace(_) => 14,
            MetaError::FileTooBig => 15,
            MetaError::Io(_) => 16,
            MetaError::ReadOnly(_) => 17,
            MetaError::Stale => 18,
            MetaError::Corrupt(_) => 19,
            MetaError::Access(_) => 20,
            MetaError::NotSupported(_) => 21,
            MetaError::CrossDevice(_) => 22,
            MetaError::QuotaExceeded(_) => 23,
        }
    }

    /// The POSIX errno this error stands for.
    pub fn errno(&self) -> i32 {
        let code = self.code();
        CODES
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, errno, _)| *errno)
            .expect("every code is in CODES")
    }

    /// The detail carried by the variant, if any (what crosses the wire beside the code).
    pub fn detail(&self) -> &str {
        match self {
            MetaError::Invalid(d)
            | MetaError::NotPermitted(d)
            | MetaError::Busy(d)
            | MetaError::NoSpace(d)
            | MetaError::Io(d)
            | MetaError::ReadOnly(d)
            | MetaError::Corrupt(d)
            | MetaError::Access(d)
            | MetaError::NotSupported(d)
            | MetaError::CrossDevice(d)
            | MetaError::QuotaExceeded(d) => d,
            _ => "",
        }
    }

    /// Rebuilds an error from its wire code and detail; `None` for an unknown code.
    pub fn from_code(code: u32, detail: &str) -> Option<MetaError> {
        let d = detail.to_string();
        Some(match code {
            1 => MetaError::NotFound,
            2 => MetaError::Exists,
            3 => MetaError::NotDir,
            4 => MetaError::IsDir,
            5 => MetaError::NotEmpty,
            6 => MetaError::Invalid(d),
            7 => MetaError::NameTooLong,
            8 => MetaError::NoData,
            9 => MetaError::Range,
            10 => MetaError::TooBig,
            11 => MetaError::TooManyLinks,
            12 => MetaError::NotPermitted(d),
            13 => MetaError::Busy(d),
            14 => MetaError::NoSpace(d),
            15 => MetaError::FileTooBig,
            16 => MetaError::Io(d),
            17 => MetaError::ReadOnly(d),
            18 => MetaError::Stale,
            19 => MetaError::Corrupt(d),
            20 => MetaError::Access(d),
            21 => MetaError::NotSupported(d),
            22 => MetaError::CrossDevice(d),
            23 => MetaError::QuotaExceeded(d),
            _ => return None,
        })
    }
}

pub type Result<T, E = MetaError> = std::result::Result<T, E>;
