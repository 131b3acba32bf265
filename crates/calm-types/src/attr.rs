//! The namespace's public value types and its named limits.

/// A 64-bit inode handle. Handed out once and never reused; 0 is never a handle.
pub type Handle = u64;

/// The root directory's handle, fixed by the format.
pub const ROOT: Handle = 1;

/// Longest name of a directory entry, in bytes (NAME_MAX).
pub const NAME_LEN_MAX: usize = 255;
/// Longest symlink target, in bytes (PATH_MAX less the terminating NUL).
pub const SYMLINK_LEN_MAX: usize = 4095;
/// Longest extended-attribute name, in bytes (XATTR_NAME_MAX).
pub const XATTR_NAME_LEN_MAX: usize = 255;
/// Largest extended-attribute value, in bytes (XATTR_SIZE_MAX).
pub const XATTR_VALUE_LEN_MAX: usize = 64 * 1024;
/// Largest total of one inode's xattr names, each with its NUL, in bytes (XATTR_LIST_MAX).
pub const XATTR_LIST_BYTES_MAX: usize = 64 * 1024;
/// Bytes of names and values one inode's extended attributes hold at most (its default ACL
/// aside); past it a set answers ENOSPC, as a local file system's full attribute space does.
pub const XATTR_INODE_BYTES_MAX: u64 = 1 << 20;
/// Most links to one inode (and most subdirectories of one directory), as ext4.
pub const LINK_COUNT_MAX: u32 = 65_000;
/// Largest file size the namespace records, in bytes.
pub const FILE_SIZE_MAX: u64 = i64::MAX as u64;
/// Most entries one readdir call returns.
pub const READDIR_ENTRIES_MAX: usize = 4096;
/// Permission and set-id bits a mode may carry; the file type lives in [`Kind`].
pub const MODE_PERMISSION_MASK: u32 = 0o7777;

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    CharDevice = 4,
    BlockDevice = 5,
    Fifo = 6,
    Socket = 7,
}

impl Kind {
    pub fn from_u8(value: u8) -> Option<Kind> {
        Some(match value {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::CharDevice,
            5 => Kind::BlockDevice,
            6 => Kind::Fifo,
            7 => Kind::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this kind.
    pub fn type_bits(self) -> u32 {
        match self {
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::CharDevice => 0o020000,
            Kind::BlockDevice => 0o060000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        [
            Kind::File,
            Kind::Dir,
            Kind::Symlink,
            Kind::CharDevice,
            Kind::BlockDevice,
            Kind::Fifo,
            Kind::Socket,
        ]
        .into_iter()
        .find(|k| k.type_bits() == mode & 0o170000)
    }
}

/// The attributes of an inode, as getattr returns them. Times are nanoseconds since the Unix
/// epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub handle: Handle,
    pub generation: u64,
    pub kind: Kind,
    /// Permission bits only (see [`MODE_PERMISSION_MASK`]).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// A time to set: now (by the server's clock) or a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(i64),
}

/// The attributes setattr changes; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<i64>,
}

/// The mode of a regular file after a write by a caller without the superuser's privilege, as
/// Linux decides it: setuid goes; setgid goes where it means set-group-id on execution (group
/// execute set) or the writer is not in the file's group.
pub fn mode_after_unprivileged_write(mode: u32, writer_in_group: bool) -> u32 {
    let mut mode = mode & !0o4000;
    if mode & 0o010 != 0 || !writer_in_group {
        mode &= !0o2000;
    }
    mode
}

/// What to create: the kind and its initial attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNode {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number, for character and block devices.
    pub rdev: u64,
    /// Target, for symlinks.
    pub target: Vec<u8>,
    /// `mode` as asked for, before the creating process's umask took bits from it: what a
    /// directory's default ACL stands in for the umask with (absent: `mode` is taken).
    /// `mode` itself has the umask applied, so a server that knows no ACL gives what a
    /// local file system without ACLs would.
    pub mode_before_umask: Option<u32>,
    /// A handle granted in advance to the client that asks (its mount answered the make
    /// before sending it): the node gets it, if the grant is that client's.
    pub granted: Option<Granted>,
    /// The room of a quota share this make takes or draws from (set by the server alone).
    pub share: Share,
}

/// A make's part in a quota share: the room a mount may fill itself in a directory it holds,
/// set aside in every quota the directory's makes count in (docs/design/mount.md,
/// "Directories held").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// None: judged against the room left as any make.
    #[default]
    None,
    /// A directory made to be held: set aside a share of the room left for the makes in it.
    Ask,
    /// A make in a held directory, by its holder: fills the share set aside for directory
    /// `pool` (where the directory's quotas are the share's).
    Draw(Handle),
}

/// A handle a client was granted in advance, named by the client it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub handle: Handle,
    /// The client making the node (its request ids' client), set by the server.
    pub client: u64,
}

impl NewNode {
    pub fn file(mode: u32, uid: u32, gid: u32) -> Self {
        Self::node(Kind::File, mode, uid, gid, 0)
    }
    pub fn dir(mode: u32, uid: u32, gid: u32) -> Self {
        Self::node(Kind::Dir, mode, uid, gid, 0)
    }
    pub fn symlink(target: &[u8], uid: u32, gid: u32) -> Self {
        Self {
            target: target.to_vec(),
            ..Self::node(Kind::Symlink, 0o777, uid, gid, 0)
        }
    }
    pub fn node(kind: Kind, mode: u32, uid: u32, gid: u32, rdev: u64) -> Self {
        Self {
            kind,
            mode,
            uid,
            gid,
            rdev,
            target: Vec::new(),
            mode_before_umask: None,
            granted: None,
            share: Share::None,
        }
    }

    /// The same node made under `umask`: its mode less the umask's bits, and the mode as
    /// asked for kept for a default ACL (a symlink's mode is always 0777: none applies).
    pub fn with_umask(self, umask: u32) -> Self {
        if self.kind == Kind::Symlink {
            return self;
        }
        Self {
            mode: self.mode & !(umask & 0o777),
            mode_before_umask: Some(self.mode),
            ..self
        }
    }
}

/// One entry of a directory listing. `cookie` resumes the listing right after this entry,
/// and stays valid whatever else is created or removed in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub handle: Handle,
    pub kind: Kind,
    pub cookie: u64,
}

/// Rename flags, with Linux's values.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// setxattr flags, with Linux's values.
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// File-system wide figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    /// Live inodes.
    pub inodes: u64,
    /// Sum of the sizes of regular files, in bytes.
    pub file_bytes: u64,
    /// Bytes the store occupies.
    pub store_bytes: u64,
    pub name_len_max: u32,
    /// The root's tree quota, when it has one.
    pub root_quota: Option<crate::quota::QuotaReport>,
}
