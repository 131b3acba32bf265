//! The key layout and record encodings of format version 1 (docs/design/store-layout.md is the
//! written form of this module; change both together and bump [`FORMAT_VERSION`]).
//!
//! One flat, ordered keyspace. The first byte of a key names its family; handles in keys are
//! big-endian so that key order is handle order; numbers in values are little-endian.
//!
//! | family | key                                   | value                                  |
//! |--------|---------------------------------------|----------------------------------------|
//! | `D`    | `D` parent:u64be `c` cookie:u64be     | child:u64 kind:u8 name (readdir index) |
//! | `D`    | `D` parent:u64be `n` name             | child:u64 cookie:u64 kind:u8 (dentry)  |
//! | `I`    | `I` handle:u64be                      | inode record (96 bytes + symlink target)|
//! | `N`    | `N` counter-name                      | u64 counter                            |
//! | `S`    | `S` field-name                        | superblock field                       |
//! | `U`    | `U` reader:u32be                      | changelog reader (calm-changelog)      |
//! | `X`    | `X` handle:u64be name                 | xattr value                            |
//! | `G`    | `G` queued_ns:u64be id:u64be          | object size:u32 (deletion queue)       |
//! | `J`    | `J` handle:u64be chunk:u64be          | slice records (crate::slices)          |
//! | `L`    | `L` handle:u64be parent:u64be         | names of a multi-link file there: u32  |
//! | `R`    | `R` id:u64be                          | records naming the object, when > 1    |
//! | `0xFF` | `0xFF` index:u64be                    | changelog record (calm-changelog)      |
//!
//! A directory's readdir index and its names share the prefix `D parent`, so they sit side by
//! side in the tree: creating a name in a small or medium directory dirties one leaf page, not
//! two pages in distant subtrees (half the write amplification of a group commit spread over
//! many directories).

use crate::error::{MetaError, Result};
use crate::types::{Handle, Kind};

/// The format this build writes. Version 2 added the changelog (`0xFF`, `U`, `Ncl_*`);
/// version 3 the file contents (`J` chunks, `G` deletion queue, `R` shared objects,
/// `Sobjects`, `Nslice_next`); version 4 the parents of non-directories (their inode's
/// `parent`, the `L` links of multi-link files, `Sparents_from`); version 5 inline slices
/// (`K`, ids with [`crate::slices::INLINE`]); version 6 request records (`Q`); version 7 the
/// time a request record was written, at the end of its value (a version-6 record, without
/// it, is read and then swept). An older store has none of those keys and is upgraded in place
/// when opened for writing.
pub const FORMAT_VERSION: u32 = 7;
/// The oldest format this build opens.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// First bytes of the format field, so a foreign store is refused rather than misread.
pub const FORMAT_MAGIC: &[u8; 8] = b"CALMMETA";

pub const TAG_DENTRY: u8 = b'D';
/// Second tag inside a directory's `D` range: the readdir index, by cookie.
pub const SUB_INDEX: u8 = b'c';
/// Second tag inside a directory's `D` range: the names.
pub const SUB_NAME: u8 = b'n';
pub const TAG_INODE: u8 = b'I';
/// The changelog's records are the store's record log (`calm_store::WriteTxn::log_append`):
/// in the default layout, keys of this family, the last of the keyspace, so that a new
/// record (the highest index) is the greatest key and is appended (full pages, no split in
/// the middle); the LMDB store with its write-ahead log keeps them in segment files instead.
pub const TAG_CHANGELOG: u8 = calm_store::LOG_FAMILY;
pub const TAG_COUNTER: u8 = b'N';
pub const TAG_SUPER: u8 = b'S';
pub const TAG_CL_USER: u8 = b'U';
pub const TAG_XATTR: u8 = b'X';
/// A file's chunk: its slice records (crate::slices). After `I`, so that fsck checks each
/// against the live inodes as it does xattrs.
pub const TAG_CHUNK: u8 = b'J';
/// The deletion queue: objects no record names any more, by the time they were queued.
pub const TAG_GC: u8 = b'G';
/// Files kept after their last name went because the mount that removed it still has them
/// open (orphans, `nlink` 0): handle → the lock session of that mount (u64 le). Before `I`,
/// so that fsck knows them when it checks the inodes.
pub const TAG_ORPHAN: u8 = b'H';
/// Objects named by more than one record (an append split over two chunks): the count.
pub const TAG_REF: u8 = b'R';
/// The bytes of an inline slice (`crate::slices::INLINE`): id → its data, written and
/// deleted with the one record that names it.
pub const TAG_INLINE: u8 = b'K';
/// The directories holding the names of a non-directory with more than one name, each with
/// how many (u32 le): Lustre's link EA as keys. After `I`, so that fsck checks each against
/// the live inodes.
pub const TAG_LINKS: u8 = b'L';
/// Request records (`crate::requests`): client id and sequence number (both u64 BE) → what
/// the mutation answered (a kind byte and a u64 le).
pub const TAG_REQUEST: u8 = b'Q';

/// Superblock: the handle high-water mark when the store was upgraded to version 4; a
/// non-directory below it may have no parent recorded (absent: every one has).
pub const KEY_PARENTS_FROM: &[u8] = b"Sparents_from";
/// Superblock: magic and format version.
pub const KEY_FORMAT: &[u8] = b"Sformat";
/// Superblock: the handle high-water mark. Every handle ever handed out is below it.
pub const KEY_HWM: &[u8] = b"Shwm";
/// Superblock: how many times the store was opened for writing (the generation of inodes
/// created during that opening).
pub const KEY_EPOCH: &[u8] = b"Sepoch";
/// Counter: live inodes.
pub const KEY_INODES: &[u8] = b"Ninodes";
/// Counter: sum of regular-file sizes, in bytes.
pub const KEY_FILE_BYTES: &[u8] = b"Nfile_bytes";
/// Counter: the index of the last changelog record written, as of the last purge step (the
/// last record's own key is the live value; this keeps it when every record is purged).
pub const KEY_CL_LAST: &[u8] = b"Ncl_last";
/// Superblock: the URL of the object store holding the namespace's file contents.
pub const KEY_OBJECTS: &[u8] = b"Sobjects";
/// Superblock: the namespace's identity, 16 random bytes chosen when it is created. Caches
/// outside the metadata (a mount's block cache) are kept per identity, so that a namespace
/// created again over the same object store never reads another's cached bytes.
pub const KEY_NAMESPACE_ID: &[u8] = b"Sid";
/// Counter: the next slice id (ids are never reused; 0 is the hole).
pub const KEY_SLICE_NEXT: &[u8] = b"Nslice_next";
/// Counter: the next changelog reader id (ids are never reused).
pub const KEY_CL_USER_NEXT: &[u8] = b"Ncl_user_next";

/// Length of the fixed part of an inode record.
pub const INODE_FIXED_LEN: usize = 96;

pub fn format_value() -> Vec<u8> {
    let mut v = FORMAT_MAGIC.to_vec();
    v.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    v
}

/// Checks the format field of an existing store; returns its version.
pub fn check_format(value: &[u8]) -> Result<u32> {
    if value.len() != 12 || &value[..8] != FORMAT_MAGIC {
        return Err(MetaError::Corrupt(
            "the store's format field is not calm's (not a calm store?)".into(),
        ));
    }
    let version = u32::from_le_bytes(value[8..12].try_into().expect("4 bytes"));
    if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
        return Err(MetaError::Corrupt(format!(
            "store format version {version}; this build reads versions \
             {FORMAT_VERSION_MIN} to {FORMAT_VERSION}"
        )));
    }
    Ok(version)
}

pub fn cl_user_key(id: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = TAG_CL_USER;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The reader id a reader key names.
pub fn cl_user_id(key: &[u8]) -> Option<u32> {
    (key.len() == 5 && key[0] == TAG_CL_USER)
        .then(|| u32::from_be_bytes(key[1..5].try_into().expect("4 bytes")))
}

pub const CL_USER_END: &[u8] = &[TAG_CL_USER + 1];

pub fn inode_key(handle: Handle) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = TAG_INODE;
    k[1..].copy_from_slice(&handle.to_be_bytes());
    k
}

fn handle_prefix(tag: u8, handle: Handle) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = tag;
    k[1..].copy_from_slice(&handle.to_be_bytes());
    k
}

pub fn dentry_key(parent: Handle, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + name.len());
    k.extend_from_slice(&handle_prefix(TAG_DENTRY, parent));
    k.push(SUB_NAME);
    k.extend_from_slice(name);
    k
}

pub fn readdir_key(parent: Handle, cookie: u64) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[..9].copy_from_slice(&handle_prefix(TAG_DENTRY, parent));
    k[9] = SUB_INDEX;
    k[10..].copy_from_slice(&cookie.to_be_bytes());
    k
}

/// The end (exclusive) of `parent`'s readdir index.
pub fn readdir_end(parent: Handle) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..9].copy_from_slice(&handle_prefix(TAG_DENTRY, parent));
    k[9] = SUB_INDEX + 1;
    k
}

pub fn xattr_key(handle: Handle, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.extend_from_slice(&handle_prefix(TAG_XATTR, handle));
    k.extend_from_slice(name);
    k
}

/// `[start, end)` of every xattr of `handle`.
pub fn xattr_range(handle: Handle) -> ([u8; 9], [u8; 9]) {
    (
        handle_prefix(TAG_XATTR, handle),
        handle_prefix(TAG_XATTR, handle + 1),
    )
}

/// The count of `handle`'s names in directory `parent` (multi-link files only).
pub fn links_key(handle: Handle, parent: Handle) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..9].copy_from_slice(&handle_prefix(TAG_LINKS, handle));
    k[9..].copy_from_slice(&parent.to_be_bytes());
    k
}

/// `[start, end)` of every links key of `handle`.
pub fn links_range(handle: Handle) -> ([u8; 9], [u8; 9]) {
    (
        handle_prefix(TAG_LINKS, handle),
        handle_prefix(TAG_LINKS, handle + 1),
    )
}

/// The directory a links key names.
pub fn links_key_parent(key: &[u8]) -> Option<Handle> {
    (key.len() == 17 && key[0] == TAG_LINKS)
        .then(|| Handle::from_be_bytes(key[9..17].try_into().expect("8 bytes")))
}

pub fn chunk_key(handle: Handle, chunk: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..9].copy_from_slice(&handle_prefix(TAG_CHUNK, handle));
    k[9..].copy_from_slice(&chunk.to_be_bytes());
    k
}

/// `[start, end)` of every chunk of `handle`.
pub fn chunk_range(handle: Handle) -> ([u8; 9], [u8; 9]) {
    (
        handle_prefix(TAG_CHUNK, handle),
        handle_prefix(TAG_CHUNK, handle + 1),
    )
}

/// The chunk index a chunk key names.
pub fn key_chunk(key: &[u8]) -> Option<u64> {
    (key.len() == 17).then(|| u64::from_be_bytes(key[9..17].try_into().expect("8 bytes")))
}

pub fn gc_key(queued_ns: u64, id: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = TAG_GC;
    k[1..9].copy_from_slice(&queued_ns.to_be_bytes());
    k[9..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `(queued_ns, id)` of a deletion-queue key.
pub fn gc_key_parts(key: &[u8]) -> Option<(u64, u64)> {
    (key.len() == 17 && key[0] == TAG_GC).then(|| {
        (
            u64::from_be_bytes(key[1..9].try_into().expect("8 bytes")),
            u64::from_be_bytes(key[9..17].try_into().expect("8 bytes")),
        )
    })
}

pub const GC_END: &[u8] = &[TAG_GC + 1];

pub fn orphan_key(handle: Handle) -> [u8; 9] {
    handle_prefix(TAG_ORPHAN, handle)
}

pub const ORPHAN_END: &[u8] = &[TAG_ORPHAN + 1];

pub fn ref_key(id: u64) -> [u8; 9] {
    handle_prefix(TAG_REF, id)
}

/// The key of inline slice `id`'s bytes.
pub fn inline_key(id: u64) -> [u8; 9] {
    handle_prefix(TAG_INLINE, id)
}

pub const INLINE_END: &[u8] = &[TAG_INLINE + 1];

/// Reads the big-endian handle at `key[1..9]`.
pub fn key_handle(key: &[u8]) -> Option<Handle> {
    Some(u64::from_be_bytes(key.get(1..9)?.try_into().ok()?))
}

/// A directory entry's value under its `D` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dentry {
    pub child: Handle,
    pub cookie: u64,
    pub kind: Kind,
}

impl Dentry {
    pub const LEN: usize = 17;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[..8].copy_from_slice(&self.child.to_le_bytes());
        v[8..16].copy_from_slice(&self.cookie.to_le_bytes());
        v[16] = self.kind as u8;
        v
    }

    pub fn decode(value: &[u8]) -> Result<Dentry> {
        if value.len() != Self::LEN {
            return Err(MetaError::Corrupt(format!(
                "dentry value of {} bytes",
                value.len()
            )));
        }
        Ok(Dentry {
            child: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
            cookie: u64::from_le_bytes(value[8..16].try_into().expect("8 bytes")),
            kind: Kind::from_u8(value[16])
                .ok_or_else(|| MetaError::Corrupt(format!("dentry kind {}", value[16])))?,
        })
    }
}

/// The value of a readdir index entry: what readdir returns without reading the names.
pub fn encode_readdir_value(child: Handle, kind: Kind, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + name.len());
    v.extend_from_slice(&child.to_le_bytes());
    v.push(kind as u8);
    v.extend_from_slice(name);
    v
}

pub fn decode_readdir_value(value: &[u8]) -> Result<(Handle, Kind, &[u8])> {
    if value.len() < 10 {
        return Err(MetaError::Corrupt(format!(
            "readdir value of {} bytes",
            value.len()
        )));
    }
    let child = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
    let kind = Kind::from_u8(value[8])
        .ok_or_else(|| MetaError::Corrupt(format!("readdir kind {}", value[8])))?;
    Ok((child, kind, &value[9..]))
}

/// An inode record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub handle: Handle,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub generation: u64,
    pub size: u64,
    pub rdev: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Directories: the one directory holding this one (the root holds itself). Others: the
    /// directory holding one of its names (with several names, `L` keys list them all); 0
    /// when it has none (an orphan) or when it was made before format 4.
    pub parent: Handle,
    /// Directories: the cookie the next entry gets. Cookies only grow.
    pub next_cookie: u64,
    /// Directories: the number of entries.
    pub entries: u64,
    /// Symlinks: the target.
    pub target: Vec<u8>,
}

impl Inode {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(INODE_FIXED_LEN + self.target.len());
        v.push(self.kind as u8);
        v.extend_from_slice(&[0u8; 3]);
        v.extend_from_slice(&self.mode.to_le_bytes());
        v.extend_from_slice(&self.uid.to_le_bytes());
        v.extend_from_slice(&self.gid.to_le_bytes());
        v.extend_from_slice(&self.nlink.to_le_bytes());
        v.extend_from_slice(&[0u8; 4]);
        for field in [self.generation, self.size, self.rdev] {
            v.extend_from_slice(&field.to_le_bytes());
        }
        for time in [self.atime_ns, self.mtime_ns, self.ctime_ns] {
            v.extend_from_slice(&time.to_le_bytes());
        }
        for field in [self.parent, self.next_cookie, self.entries] {
            v.extend_from_slice(&field.to_le_bytes());
        }
        debug_assert_eq!(v.len(), INODE_FIXED_LEN);
        v.extend_from_slice(&self.target);
        v
    }

    pub fn decode(handle: Handle, value: &[u8]) -> Result<Inode> {
        if value.len() < INODE_FIXED_LEN {
            return Err(MetaError::Corrupt(format!(
                "inode {handle}: record of {} bytes",
                value.len()
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes(value[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8"));
        let kind = Kind::from_u8(value[0])
            .ok_or_else(|| MetaError::Corrupt(format!("inode {handle}: kind {}", value[0])))?;
        Ok(Inode {
            handle,
            kind,
            mode: u32_at(4),
            uid: u32_at(8),
            gid: u32_at(12),
            nlink: u32_at(16),
            generation: u64_at(24),
            size: u64_at(32),
            rdev: u64_at(40),
            atime_ns: u64_at(48) as i64,
            mtime_ns: u64_at(56) as i64,
            ctime_ns: u64_at(64) as i64,
            parent: u64_at(72),
            next_cookie: u64_at(80),
            entries: u64_at(88),
            target: value[INODE_FIXED_LEN..].to_vec(),
        })
    }

    /// What a permission check looks at.
    pub fn owner(&self) -> crate::perm::Owner {
        crate::perm::Owner {
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
        }
    }

    pub fn attr(&self) -> crate::types::Attr {
        crate::types::Attr {
            handle: self.handle,
            generation: self.generation,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            rdev: self.rdev,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_round_trips() {
        let inode = Inode {
            handle: 42,
            kind: Kind::Symlink,
            mode: 0o777,
            uid: 1000,
            gid: 100,
            nlink: 1,
            generation: 7,
            size: 3,
            rdev: 0,
            atime_ns: -5,
            mtime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 9,
            parent: 0,
            next_cookie: 0,
            entries: 0,
            target: b"a/b".to_vec(),
        };
        assert_eq!(Inode::decode(42, &inode.encode()).unwrap(), inode);
        assert!(matches!(
            Inode::decode(1, &[0u8; 10]),
            Err(MetaError::Corrupt(_))
        ));
    }

    #[test]
    fn a_directory_keeps_its_index_then_its_names_together() {
        assert!(dentry_key(1, &[0xff; 255]) < readdir_key(2, 0).to_vec());
        assert!(readdir_key(3, 9) < readdir_key(3, 256));
        assert!(readdir_key(3, u64::MAX).as_slice() < readdir_end(3).as_slice());
        assert!(readdir_end(3).as_slice() <= dentry_key(3, b"\x01").as_slice());
        assert!(inode_key(255) < inode_key(256));
    }

    #[test]
    fn format_is_checked() {
        assert_eq!(check_format(&format_value()).unwrap(), FORMAT_VERSION);
        let mut older = format_value();
        older[8] = 1;
        assert_eq!(
            check_format(&older).unwrap(),
            1,
            "version 1 opens (and is upgraded)"
        );
        let mut newer = format_value();
        newer[8] = FORMAT_VERSION as u8 + 1;
        assert!(matches!(check_format(&newer), Err(MetaError::Corrupt(_))));
        older[8] = 0;
        assert!(matches!(check_format(&older), Err(MetaError::Corrupt(_))));
        assert!(matches!(
            check_format(b"garbage"),
            Err(MetaError::Corrupt(_))
        ));
    }
}
