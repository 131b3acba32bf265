//! The key layout and record encodings of format version 1 (docs/design/store-layout.md is the
//! written form of this module; change both together and bump [`FORMAT_VERSION`]).
//!
//! One flat, ordered keyspace. The first byte of a key names its family; handles in keys are
//! big-endian so that key order is handle order; numbers in values are little-endian.
//!
//! | family | key                                   | value                                  |
//! |--------|---------------------------------------|----------------------------------------|
//! | `D`    | `D` parent:u64be `h` hash:u64be name  | child:u64 kind:u8 (a name)             |
//! | `I`    | `I` handle:u64be                      | inode record (96 bytes + symlink target)|
//! | `N`    | `N` counter-name                      | u64 counter                            |
//! | `S`    | `S` field-name                        | superblock field                       |
//! | `U`    | `U` reader:u32be                      | changelog reader (calm-changelog)      |
//! | `X`    | `X` handle:u64be name                 | xattr value                            |
//! | `G`    | `G` queued_ns:u64be id:u64be          | object size:u32 (deletion queue)       |
//! | `J`    | `J` handle:u64be chunk:u64be          | slice records (crate::slices)          |
//! | `L`    | `L` handle:u64be parent:u64be         | names of a multi-link file there: u32  |
//! | `R`    | `R` id:u64be                          | records naming the object, when > 1    |
//! | `A`    | `A` kind:u8 id:u64be                  | quota usage (crate::quota)             |
//! | `B`    | `B` kind:u8 id:u64be                  | quota limits (crate::quota)            |
//! | `W`    | `W` client:u64be first:u64be          | handles granted (crate::ops::grants)   |
//! | `0xFF` | `0xFF` index:u64be                    | changelog record (calm-changelog)      |
//!
//! A name is one key, ordered by a keyed hash of the name ([`NameHash`]): a lookup reads the
//! key it computes, and a listing walks the keys in hash order, each position in it a cookie
//! that stays valid while names come and go (see [`NameHash`]).

use crate::error::{MetaError, Result};
use crate::types::{Handle, Kind};

mod inode;
mod orphan;
mod trash;
pub use inode::{ACL_ACCESS, ACL_DEFAULT, INODE_COMPACT, INODE_FIXED_LEN, Inode};
pub(crate) use inode::{put_varint, take_varint};
pub use orphan::OrphanRecord;
pub use trash::TrashEntry;

/// The format this build writes. Version 2 added the changelog (`0xFF`, `U`, `Ncl_*`);
/// version 3 the file contents (`J` chunks, `G` deletion queue, `R` shared objects,
/// `Sobjects`, `Nslice_next`); version 4 the parents of non-directories (their inode's
/// `parent`, the `L` links of multi-link files, `Sparents_from`); version 5 inline slices
/// (`K`, ids with [`crate::slices::INLINE`]); version 6 request records (`Q`); version 7 the
/// time a request record was written, at the end of its value (a version-6 record, without
/// it, is read and then swept); version 8 one key per name, by the hash of the name (before,
/// a name had a second key in a readdir index by creation order); version 9 quotas (`A`
/// usage, `B` limits, `Nquota_trees`: `crate::quota`), every user's and group's usage kept;
/// version 10 POSIX ACLs (flagged in the inode's mode field from bit 16: [`Inode::acls`]; the
/// access ACL in the inode record, a default ACL as an `X` key). An older store is upgraded in place when opened for
/// writing (`crate::upgrade`); version 11 objects collected while the namespace is served
/// (`C`: [`collected_key`]); version 12 the trash (`E`: [`trash_key`], `Ntrash_*`); version 13
/// xattrs counted in their owners' and trees' bytes (no new key: the usage is counted again
/// when an older store is opened, `crate::upgrade::usage`); version 14 the trash counted in its
/// owners' quotas until purged, and an open file with no name in the trees above its last
/// directory until its last close (an orphan record's directory 0 when that directory was
/// removed since: [`OrphanRecord`]; the usage is counted again, and the records of orphans
/// whose directory is gone are rewritten, when an older store is opened); version 15 grants (`W`).
pub const FORMAT_VERSION: u32 = 15;
/// The oldest format this build opens.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// First bytes of the format field, so a foreign store is refused rather than misread.
pub const FORMAT_MAGIC: &[u8; 8] = b"CALMMETA";

pub const TAG_DENTRY: u8 = b'D';
/// Second tag inside a directory's `D` range: its names, by hash.
pub const SUB_ENTRY: u8 = b'h';
/// Up to format 7, second tag inside a directory's `D` range: the readdir index, by cookie
/// (`crate::upgrade` removes these keys).
pub const SUB_INDEX_V7: u8 = b'c';
/// Up to format 7, second tag inside a directory's `D` range: the names, by name.
pub const SUB_NAME_V7: u8 = b'n';
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
/// Objects `calm gc` collected (or is about to) while the namespace was served: id (u64 BE)
/// → when (i64 le ns). A mutation that names one is refused. Before `J`, so that fsck knows
/// them when it reads the records.
pub const TAG_COLLECTED: u8 = b'C';
/// The trash: files and directories removed while the namespace keeps removed things for a
/// while (`crate::ops::trash`): handle (u64 BE) → [`TrashEntry`]. Their inodes stay, with
/// `nlink` 0 and no name. Before `I`, so that fsck knows them when it checks the inodes.
pub const TAG_TRASH: u8 = b'E';

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
/// Superblock: the namespace's claim on its object store, 16 random bytes. The object store
/// names its owner with the same bytes; a server deletes nothing from an object store that
/// names another owner (see `calm_data::owner`). Chosen when the namespace is created, and
/// anew by every `calm load`: a loaded copy is never the owner of the original's objects.
pub const KEY_OBJECTS_OWNER: &[u8] = b"Sobjects_owner";
/// Superblock: the namespace's identity, 16 random bytes chosen when it is created. Caches
/// outside the metadata (a mount's block cache) are kept per identity, so that a namespace
/// created again over the same object store never reads another's cached bytes.
pub const KEY_NAMESPACE_ID: &[u8] = b"Sid";
/// Superblock: the key of the hash that orders names (16 random bytes chosen when the
/// namespace is created or upgraded to format 8; see [`NameHash`]).
pub const KEY_NAME_HASH: &[u8] = b"Snamehash";
/// Superblock: the store's place in a namespace over several metadata clusters, its number
/// and the count (2 bytes; absent: a namespace of one store). See [`crate::place`].
pub const KEY_PLACE: &[u8] = b"Splace";
/// Counter: entries in the trash.
pub const KEY_TRASH_ENTRIES: &[u8] = b"Ntrash_entries";
/// Counter: bytes of the files in the trash (each file's size when it was removed).
pub const KEY_TRASH_BYTES: &[u8] = b"Ntrash_bytes";
/// Counter: the next slice id (ids are never reused; 0 is the hole).
pub const KEY_SLICE_NEXT: &[u8] = b"Nslice_next";
/// Counter: the next changelog reader id (ids are never reused).
pub const KEY_CL_USER_NEXT: &[u8] = b"Ncl_user_next";

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

/// The first key of `parent`'s names, and the end (exclusive) of them.
pub fn entries_range(parent: Handle) -> ([u8; 10], [u8; 10]) {
    let mut start = [0u8; 10];
    start[..9].copy_from_slice(&handle_prefix(TAG_DENTRY, parent));
    start[9] = SUB_ENTRY;
    let mut end = start;
    end[9] = SUB_ENTRY + 1;
    (start, end)
}

/// The key where `parent`'s names of hash `hash` begin.
pub fn entries_from(parent: Handle, hash: u64) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[..10].copy_from_slice(&entries_range(parent).0);
    k[10..].copy_from_slice(&hash.to_be_bytes());
    k
}

/// A name's key (`D parent h hash name`), split: its directory, hash and name.
pub fn entry_key_parts(key: &[u8]) -> Option<(Handle, u64, &[u8])> {
    if key.len() < 19 || key[0] != TAG_DENTRY || key[9] != SUB_ENTRY {
        return None;
    }
    let parent = key_handle(key)?;
    let hash = u64::from_be_bytes(key[10..18].try_into().ok()?);
    Some((parent, hash, &key[18..]))
}

/// Bits of a cookie that number the names sharing one hash, in name order.
pub const COOKIE_GROUP_BITS: u32 = 8;
/// Names of one directory with one hash that each get a cookie of their own; past it (which
/// takes 256 names whose 54-bit hashes under the namespace's secret key are equal: never by
/// chance) the later ones share the last cookie, and a listing resumed among them may return
/// one of them twice.
pub const COOKIE_GROUP_NAMES: u64 = 1 << COOKIE_GROUP_BITS;
/// Cookies below this are not names': 0 (from the start), 1 and 2 ("." and "..").
pub const COOKIE_NAMES_MIN: u64 = COOKIE_GROUP_NAMES;

/// The keyed hash that orders a directory's names (SipHash-1-3 under the namespace's own
/// 128-bit key, `Snamehash`): a name's key is `D parent h hash name`, so a lookup reads one
/// key it computes, and a listing walks a directory's keys in hash order.
///
/// A readdir cookie is a position in that order: the name's hash (54 bits, shifted left by
/// [`COOKIE_GROUP_BITS`], and at least [`COOKIE_NAMES_MIN`]) plus its rank among the names of
/// the directory that share its hash (almost always 0). Resuming after a cookie continues with
/// the names after that position, so a listing resumed after any number of creates and
/// removals returns every name that existed throughout exactly once (among names sharing a
/// hash, a removal can shift the rank of the later ones: one of them may then be skipped or
/// repeated). Cookies stay below 2^63, as the kernel's directory offsets are signed. The key
/// is secret (only the servers read the superblock), so nobody can choose names that collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameHash {
    k0: u64,
    k1: u64,
}

impl NameHash {
    pub const LEN: usize = 16;

    pub fn from_value(value: &[u8]) -> Result<NameHash> {
        if value.len() != Self::LEN {
            return Err(MetaError::Corrupt(format!(
                "the name hash key is {} bytes, not {}",
                value.len(),
                Self::LEN
            )));
        }
        Ok(NameHash {
            k0: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
            k1: u64::from_le_bytes(value[8..].try_into().expect("8 bytes")),
        })
    }

    /// The hash of `name`: the first cookie of the names that share it.
    pub fn hash(&self, name: &[u8]) -> u64 {
        use std::hash::Hasher;
        let mut hasher = siphasher::sip::SipHasher13::new_with_keys(self.k0, self.k1);
        hasher.write(name);
        let bits = hasher.finish() >> (64 - 54);
        (bits + 1) << COOKIE_GROUP_BITS
    }

    /// The key of `name` in directory `parent`.
    pub fn entry_key(&self, parent: Handle, name: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(18 + name.len());
        k.extend_from_slice(&entries_from(parent, self.hash(name)));
        k.extend_from_slice(name);
        k
    }
}

/// A cookie split: the hash it falls in, and how many names of that hash come before the
/// position it names and at it (the names to skip when resuming after it; all of them after
/// the last cookie of a hash, which a listing never leaves in the middle).
pub fn cookie_position(cookie: u64) -> (u64, u64) {
    if cookie < COOKIE_NAMES_MIN {
        return (0, 0);
    }
    let rank_mask = COOKIE_GROUP_NAMES - 1;
    let rank = cookie & rank_mask;
    let skip = if rank == rank_mask {
        u64::MAX
    } else {
        rank + 1
    };
    (cookie & !rank_mask, skip)
}

/// The cookie of the name of hash `hash` with `rank` names of that hash before it.
pub fn cookie_of(hash: u64, rank: u64) -> u64 {
    hash + rank.min(COOKIE_GROUP_NAMES - 1)
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

/// The key that marks object `id` as collected by an online gc.
pub fn collected_key(id: u64) -> [u8; 9] {
    handle_prefix(TAG_COLLECTED, id)
}

/// The key of `handle`'s entry in the trash.
pub fn trash_key(handle: Handle) -> [u8; 9] {
    handle_prefix(TAG_TRASH, handle)
}

pub const TRASH_END: &[u8] = &[TAG_TRASH + 1];

/// The key of inline slice `id`'s bytes.
pub fn inline_key(id: u64) -> [u8; 9] {
    handle_prefix(TAG_INLINE, id)
}

pub const INLINE_END: &[u8] = &[TAG_INLINE + 1];

/// Reads the big-endian handle at `key[1..9]`.
pub fn key_handle(key: &[u8]) -> Option<Handle> {
    Some(u64::from_be_bytes(key.get(1..9)?.try_into().ok()?))
}

/// A name's value under its `D` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dentry {
    pub child: Handle,
    pub kind: Kind,
}

impl Dentry {
    pub const LEN: usize = 9;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[..8].copy_from_slice(&self.child.to_le_bytes());
        v[8] = self.kind as u8;
        v
    }

    pub fn decode(value: &[u8]) -> Result<Dentry> {
        if value.len() != Self::LEN {
            return Err(MetaError::Corrupt(format!(
                "name value of {} bytes",
                value.len()
            )));
        }
        Ok(Dentry {
            child: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
            kind: Kind::from_u8(value[8])
                .ok_or_else(|| MetaError::Corrupt(format!("name kind {}", value[8])))?,
        })
    }

    /// A format-7 name's value: child:u64 cookie:u64 kind:u8.
    pub fn decode_v7(value: &[u8]) -> Result<Dentry> {
        if value.len() != 17 {
            return Err(MetaError::Corrupt(format!(
                "format-7 name value of {} bytes",
                value.len()
            )));
        }
        Dentry::decode(&[&value[..8], &value[16..]].concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directorys_names_sit_together_in_hash_order() {
        let names = NameHash::from_value(&[7u8; 16]).unwrap();
        let (start, end) = entries_range(3);
        for name in [&b"a"[..], b"\xff", &[0xff; 255], b"file-000001"] {
            let key = names.entry_key(3, name);
            assert!(start.as_slice() < key.as_slice() && key.as_slice() < end.as_slice());
            assert_eq!(entry_key_parts(&key), Some((3, names.hash(name), name)));
            assert!(names.entry_key(2, name) < start.to_vec());
            assert!(key < inode_key(0).to_vec());
        }
        // Another key orders names differently; one key always the same way.
        let other = NameHash::from_value(&[8u8; 16]).unwrap();
        assert_ne!(names.hash(b"a"), other.hash(b"a"));
        assert_eq!(names.hash(b"a"), names.hash(b"a"));
    }

    #[test]
    fn cookies_are_positions_below_the_kernels_signed_offsets() {
        let names = NameHash::from_value(&[1u8; 16]).unwrap();
        for i in 0..10_000u32 {
            let hash = names.hash(format!("n{i}").as_bytes());
            assert!(hash >= COOKIE_NAMES_MIN && hash.is_multiple_of(COOKIE_GROUP_NAMES));
            assert!(cookie_of(hash, COOKIE_GROUP_NAMES + 5) < 1 << 63);
            assert_eq!(cookie_position(cookie_of(hash, 0)), (hash, 1));
            assert_eq!(cookie_position(cookie_of(hash, 3)), (hash, 4));
            // The last cookie of a hash is shared by every later name of it: resuming after
            // it skips them all.
            assert_eq!(cookie_position(cookie_of(hash, 900)), (hash, u64::MAX));
        }
        for start in [0, 1, 2, COOKIE_NAMES_MIN - 1] {
            assert_eq!(cookie_position(start), (0, 0));
        }
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
