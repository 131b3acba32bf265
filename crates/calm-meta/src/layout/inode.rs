//! The inode record (`I` keys): the fixed encoding of the first formats and the compact one of
//! later ones, with the access ACL inside the record.

use crate::error::{MetaError, Result};
use crate::types::{Handle, Kind};

/// Length of the fixed part of an inode record.
pub const INODE_FIXED_LEN: usize = 96;

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
    /// Directories: the number of entries.
    pub entries: u64,
    /// Symlinks: the target.
    pub target: Vec<u8>,
    /// Which POSIX ACLs the inode has ([`ACL_ACCESS`], [`ACL_DEFAULT`]). The access ACL is
    /// `access_acl`, kept in the record (its bit is set exactly when that is `Some`); a
    /// directory's default ACL is its `system.posix_acl_default` xattr (an `X` key).
    pub acls: u8,
    /// The access ACL, part of the record: every permission decision on the inode has it at
    /// hand, without a read of its own.
    pub access_acl: Option<std::sync::Arc<crate::acl::Acl>>,
}

pub use crate::acl::{ACL_ACCESS, ACL_DEFAULT};

/// First byte of a compact inode record: the kind with this bit set (a fixed record's first
/// byte is the kind alone).
pub const INODE_COMPACT: u8 = 0x80;

pub(crate) fn put_varint(v: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        v.push(n as u8 | 0x80);
        n >>= 7;
    }
    v.push(n as u8);
}

pub(crate) fn take_varint(value: &[u8], at: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *value.get(*at)?;
        *at += 1;
        n |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            // The tenth byte holds one bit.
            return (shift < 63 || byte <= 1).then_some(n);
        }
    }
    None
}

/// The bits of the mode field that are the mode (the permission and set-id bits take 12; the
/// ACL flags sit above, from bit 16).
const MODE_BITS: u32 = 0xFFFF;

/// The form of an access ACL in the inode record.
const ACL_RECORD_VERSION: u8 = 1;

/// An access ACL as the inode record keeps it: a version byte ([`ACL_RECORD_VERSION`]), then
/// per entry, in order, a byte of its tag (0 owner, 1 named user, 2 owning group, 3 named
/// group, 4 mask, 5 other) times 8 plus its permissions, and for a named entry its id as a
/// varint. About 8 bytes for an ACL with one named entry, where the xattr form takes 44: the
/// record of every file a default ACL gives one stays small.
fn put_acl(v: &mut Vec<u8>, acl: &crate::acl::Acl) {
    use crate::acl::Tag;
    v.push(ACL_RECORD_VERSION);
    for e in acl.entries() {
        let (code, id) = match e.tag {
            Tag::UserObj => (0, None),
            Tag::User(uid) => (1, Some(uid)),
            Tag::GroupObj => (2, None),
            Tag::Group(gid) => (3, Some(gid)),
            Tag::Mask => (4, None),
            Tag::Other => (5, None),
        };
        v.push(code << 3 | (e.perm & 0o7) as u8);
        if let Some(id) = id {
            put_varint(v, u64::from(id));
        }
    }
}

/// The access ACL [`put_acl`] wrote as `tail`: what is wrong with it, if anything.
fn take_acl(tail: &[u8]) -> std::result::Result<crate::acl::Acl, String> {
    use crate::acl::{Entry, Tag};
    if tail.first() != Some(&ACL_RECORD_VERSION) {
        return Err("not an ACL of a known form".into());
    }
    let mut at = 1;
    let mut entries = Vec::new();
    while at < tail.len() {
        let byte = tail[at];
        at += 1;
        let mut id = || -> std::result::Result<u32, String> {
            let n = take_varint(tail, &mut at).ok_or("an id cut short")?;
            u32::try_from(n).map_err(|_| "an id over 32 bits".to_string())
        };
        let tag = match byte >> 3 {
            0 => Tag::UserObj,
            1 => Tag::User(id()?),
            2 => Tag::GroupObj,
            3 => Tag::Group(id()?),
            4 => Tag::Mask,
            5 => Tag::Other,
            other => return Err(format!("entry tag {other}")),
        };
        entries.push(Entry {
            tag,
            perm: u32::from(byte & 0o7),
        });
    }
    crate::acl::Acl::new(entries).map_err(|e| e.to_string())
}

fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

impl Inode {
    /// The compact record (format 8): the kind with [`INODE_COMPACT`], then as LEB128 varints
    /// mode (from format 10 with [`Inode::acls`] in bits 16 and up), uid, gid, nlink,
    /// generation, size, rdev, ctime (zigzag), mtime and atime (zigzag differences from
    /// ctime, usually one byte), parent and entries; then a symlink's target, or another
    /// node's access ACL ([`put_acl`], format 10). About 30 bytes for a file, where the fixed
    /// record takes 96.
    pub fn encode(&self) -> Vec<u8> {
        let acls = (self.acls & ACL_DEFAULT)
            | if self.access_acl.is_some() {
                ACL_ACCESS
            } else {
                0
            };
        let mut v = Vec::with_capacity(48 + self.target.len());
        v.push(self.kind as u8 | INODE_COMPACT);
        for field in [
            u64::from(self.mode & MODE_BITS) | u64::from(acls) << 16,
            u64::from(self.uid),
            u64::from(self.gid),
            u64::from(self.nlink),
            self.generation,
            self.size,
            self.rdev,
            zigzag(self.ctime_ns),
            zigzag(self.mtime_ns.wrapping_sub(self.ctime_ns)),
            zigzag(self.atime_ns.wrapping_sub(self.ctime_ns)),
            self.parent,
            self.entries,
        ] {
            put_varint(&mut v, field);
        }
        match &self.access_acl {
            Some(acl) => put_acl(&mut v, acl),
            None => v.extend_from_slice(&self.target),
        }
        v
    }

    /// The fixed record of formats 1 to 7 (96 bytes, then the symlink target), which
    /// [`Inode::decode`] still reads: an inode is written compact the next time it changes.
    /// (Those formats had no ACLs: it keeps none.)
    pub fn encode_fixed(&self) -> Vec<u8> {
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
        // Offset 80 held a directory's next readdir cookie up to format 7.
        for field in [self.parent, 0, self.entries] {
            v.extend_from_slice(&field.to_le_bytes());
        }
        debug_assert_eq!(v.len(), INODE_FIXED_LEN);
        v.extend_from_slice(&self.target);
        v
    }

    pub fn decode(handle: Handle, value: &[u8]) -> Result<Inode> {
        match value.first() {
            Some(&first) if first & INODE_COMPACT != 0 => Self::decode_compact(handle, value),
            _ => Self::decode_fixed(handle, value),
        }
    }

    fn decode_compact(handle: Handle, value: &[u8]) -> Result<Inode> {
        let corrupt = |what: &str| MetaError::Corrupt(format!("inode {handle}: {what}"));
        let kind = Kind::from_u8(value[0] & !INODE_COMPACT)
            .ok_or_else(|| corrupt(&format!("kind {}", value[0] & !INODE_COMPACT)))?;
        let mut at = 1;
        let mut fields = [0u64; 12];
        for field in &mut fields {
            *field = take_varint(value, &mut at).ok_or_else(|| corrupt("record cut short"))?;
        }
        let [
            mode,
            uid,
            gid,
            nlink,
            generation,
            size,
            rdev,
            ctime,
            mtime,
            atime,
            parent,
            entries,
        ] = fields;
        let small = |n: u64, what: &str| u32::try_from(n).map_err(|_| corrupt(what));
        let ctime_ns = unzigzag(ctime);
        // Bits 16 and up of the mode field: the ACL flags (a mode has 12 bits).
        let acls = u8::try_from(mode >> 16)
            .ok()
            .filter(|a| a & !(ACL_ACCESS | ACL_DEFAULT) == 0)
            .ok_or_else(|| corrupt("a mode field past its flags"))?;
        let tail = &value[at..];
        let (target, access_acl) = if acls & ACL_ACCESS != 0 {
            if kind == Kind::Symlink {
                return Err(corrupt("a symlink with an access ACL"));
            }
            let acl = take_acl(tail).map_err(|e| corrupt(&format!("its access ACL: {e}")))?;
            (Vec::new(), Some(std::sync::Arc::new(acl)))
        } else {
            (tail.to_vec(), None)
        };
        Ok(Inode {
            handle,
            kind,
            mode: (mode & u64::from(MODE_BITS)) as u32,
            uid: small(uid, "uid over 32 bits")?,
            gid: small(gid, "gid over 32 bits")?,
            nlink: small(nlink, "link count over 32 bits")?,
            generation,
            size,
            rdev,
            atime_ns: ctime_ns.wrapping_add(unzigzag(atime)),
            mtime_ns: ctime_ns.wrapping_add(unzigzag(mtime)),
            ctime_ns,
            parent,
            entries,
            target,
            acls,
            access_acl,
        })
    }

    fn decode_fixed(handle: Handle, value: &[u8]) -> Result<Inode> {
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
            entries: u64_at(88),
            target: value[INODE_FIXED_LEN..].to_vec(),
            acls: 0,
            access_acl: None,
        })
    }

    /// What a permission check looks at: with the access ACL when the inode has one.
    pub fn owner(&self) -> crate::perm::Owner {
        let acl = self.access_acl.clone();
        crate::perm::Owner {
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            acl,
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
            entries: 0,
            target: b"a/b".to_vec(),
            acls: 0,
            access_acl: None,
        };
        assert_eq!(Inode::decode(42, &inode.encode()).unwrap(), inode);
        assert_eq!(Inode::decode(42, &inode.encode_fixed()).unwrap(), inode);
        assert!(matches!(
            Inode::decode(1, &[0u8; 10]),
            Err(MetaError::Corrupt(_))
        ));
        // A compact record cut anywhere before its target is corrupt, never a panic.
        let compact = inode.encode();
        let target_at = compact.len() - inode.target.len();
        for cut in 1..target_at {
            assert!(
                matches!(
                    Inode::decode(1, &compact[..cut]),
                    Err(MetaError::Corrupt(_))
                ),
                "cut at {cut}"
            );
        }
        // Flags past the two ACLs in the mode field: corrupt, not read as a mode.
        let mut flagged = vec![compact[0]];
        put_varint(&mut flagged, 0o777 | 4 << 16);
        flagged.extend_from_slice(&compact[3..]);
        assert!(matches!(
            Inode::decode(42, &flagged),
            Err(MetaError::Corrupt(_))
        ));
        // An empty file's record: a third of the fixed one.
        let file = Inode {
            kind: Kind::File,
            target: Vec::new(),
            mode: 0o644,
            atime_ns: 1_764_000_000_123_456_789,
            mtime_ns: 1_764_000_000_123_456_789,
            ctime_ns: 1_764_000_000_123_456_789,
            parent: 70_000,
            generation: 3,
            acls: 0,
            ..inode
        };
        assert!(file.encode().len() <= 32, "{} bytes", file.encode().len());
        // A directory with both ACLs: the access ACL rides in the record, in a few bytes.
        use crate::acl::{Acl, Entry, Tag};
        let entry = |tag, perm| Entry { tag, perm };
        let acl = Acl::new(vec![
            entry(Tag::UserObj, 7),
            entry(Tag::User(1000), 6),
            entry(Tag::GroupObj, 5),
            entry(Tag::Group(70_000), 4),
            entry(Tag::Mask, 5),
            entry(Tag::Other, 0),
        ])
        .unwrap();
        let dir = Inode {
            kind: Kind::Dir,
            mode: 0o750,
            acls: ACL_ACCESS | ACL_DEFAULT,
            access_acl: Some(std::sync::Arc::new(acl)),
            ..file.clone()
        };
        assert_eq!(Inode::decode(42, &dir.encode()).unwrap(), dir);
        assert!(
            dir.encode().len() <= file.encode().len() + 14,
            "{} bytes",
            dir.encode().len()
        );
        // An access ACL cut short, or one on a symlink, is corrupt.
        let record = dir.encode();
        assert!(matches!(
            Inode::decode(42, &record[..record.len() - 1]),
            Err(MetaError::Corrupt(_))
        ));
        let link = Inode {
            kind: Kind::Symlink,
            ..dir
        };
        assert!(matches!(
            Inode::decode(42, &link.encode()),
            Err(MetaError::Corrupt(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn every_inode_round_trips_compact_and_fixed(
            kind in 1u8..=7,
            small in proptest::array::uniform4(proptest::num::u32::ANY),
            wide in proptest::array::uniform5(proptest::num::u64::ANY),
            times in proptest::array::uniform3(proptest::num::i64::ANY),
            target in proptest::collection::vec(proptest::num::u8::ANY, 0..8),
            default in proptest::bool::ANY,
            access in proptest::option::of(0u32..0o777),
        ) {
            let kind = Kind::from_u8(kind).unwrap();
            // A symlink has a target and no access ACL; another node the other way round.
            let (target, access) = if kind == Kind::Symlink { (target, None) } else { (Vec::new(), access) };
            let access_acl = access.map(|m| std::sync::Arc::new(crate::acl::Acl::from_mode(m)));
            let acls = if default { ACL_DEFAULT } else { 0 } | if access.is_some() { ACL_ACCESS } else { 0 };
            let inode = Inode {
                handle: 9,
                kind,
                mode: small[0] & MODE_BITS,
                uid: small[1],
                gid: small[2],
                nlink: small[3],
                generation: wide[0],
                size: wide[1],
                rdev: wide[2],
                atime_ns: times[0],
                mtime_ns: times[1],
                ctime_ns: times[2],
                parent: wide[3],
                entries: wide[4],
                target,
                acls,
                access_acl,
            };
            proptest::prop_assert_eq!(Inode::decode(9, &inode.encode()).unwrap(), inode.clone());
            // The fixed record of formats before ACLs keeps none.
            let plain = Inode { acls: 0, access_acl: None, ..inode };
            proptest::prop_assert_eq!(Inode::decode(9, &plain.encode_fixed()).unwrap(), plain);
        }
    }
}
