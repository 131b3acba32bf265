//! Changelog records: what changed, where, when and by whom, in a versioned binary form.
//!
//! The index of a record is its key in the store, not part of the encoding. Numbers are
//! little-endian. Layout of version 1:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format version (1) |
//! | 1 | 1 | type ([`RecordType`] number) |
//! | 2 | 2 | flags ([`flags`]) |
//! | 4 | 4 | uid |
//! | 8 | 4 | gid |
//! | 12 | 8 | time, ns since the epoch, signed |
//! | 20 | 8 | target handle |
//! | 28 | 8 | target generation |
//! | 36 | 8 | parent handle |
//! | 44 | 8 | client session (0: none) |
//! | 52 | 2 | name length N |
//! | 54 | N | name |
//! | 54+N | … | RENME only: source parent:u64, overwritten target:u64 (0: none), overwritten generation:u64, source name length:u16, source name |

/// Format version written by this build.
pub const RECORD_VERSION: u8 = 1;
/// Length of the fixed part.
pub const RECORD_FIXED_LEN: usize = 54;
/// Longest name in a record (a namespace name is at most 255 bytes; a MARK text likewise).
pub const RECORD_NAME_LEN_MAX: usize = 255;

/// Record types, with Lustre's names and numbers (`changelog_rec_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RecordType {
    Mark = 0,
    Create = 1,
    Mkdir = 2,
    Hardlink = 3,
    Softlink = 4,
    Mknod = 5,
    Unlink = 6,
    Rmdir = 7,
    Rename = 8,
    /// RNMTO: Lustre's second rename record; reserved (calm's RENME carries both ends).
    RenameTo = 9,
    Open = 10,
    Close = 11,
    Layout = 12,
    Trunc = 13,
    Setattr = 14,
    Xattr = 15,
    Hsm = 16,
    Mtime = 17,
    Ctime = 18,
    Atime = 19,
    Migrate = 20,
}

impl RecordType {
    pub const ALL: [RecordType; 21] = [
        RecordType::Mark,
        RecordType::Create,
        RecordType::Mkdir,
        RecordType::Hardlink,
        RecordType::Softlink,
        RecordType::Mknod,
        RecordType::Unlink,
        RecordType::Rmdir,
        RecordType::Rename,
        RecordType::RenameTo,
        RecordType::Open,
        RecordType::Close,
        RecordType::Layout,
        RecordType::Trunc,
        RecordType::Setattr,
        RecordType::Xattr,
        RecordType::Hsm,
        RecordType::Mtime,
        RecordType::Ctime,
        RecordType::Atime,
        RecordType::Migrate,
    ];

    /// Lustre's short name.
    pub fn name(self) -> &'static str {
        match self {
            RecordType::Mark => "MARK",
            RecordType::Create => "CREAT",
            RecordType::Mkdir => "MKDIR",
            RecordType::Hardlink => "HLINK",
            RecordType::Softlink => "SLINK",
            RecordType::Mknod => "MKNOD",
            RecordType::Unlink => "UNLNK",
            RecordType::Rmdir => "RMDIR",
            RecordType::Rename => "RENME",
            RecordType::RenameTo => "RNMTO",
            RecordType::Open => "OPEN",
            RecordType::Close => "CLOSE",
            RecordType::Layout => "LYOUT",
            RecordType::Trunc => "TRUNC",
            RecordType::Setattr => "SATTR",
            RecordType::Xattr => "XATTR",
            RecordType::Hsm => "HSM",
            RecordType::Mtime => "MTIME",
            RecordType::Ctime => "CTIME",
            RecordType::Atime => "ATIME",
            RecordType::Migrate => "MIGRT",
        }
    }

    pub fn from_number(n: u8) -> Option<RecordType> {
        RecordType::ALL.get(n as usize).copied()
    }

    pub fn from_name(name: &str) -> Option<RecordType> {
        RecordType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether calm emits this type (the others are reserved).
    pub fn is_emitted(self) -> bool {
        matches!(
            self,
            RecordType::Mark
                | RecordType::Create
                | RecordType::Mkdir
                | RecordType::Hardlink
                | RecordType::Softlink
                | RecordType::Mknod
                | RecordType::Unlink
                | RecordType::Rmdir
                | RecordType::Rename
                | RecordType::Trunc
                | RecordType::Setattr
                | RecordType::Xattr
                | RecordType::Mtime
                | RecordType::Ctime
                | RecordType::Atime
        )
    }
}

/// Record flags.
pub mod flags {
    /// UNLNK, RMDIR, RENME: the removed (or overwritten) name was the last link; the inode is
    /// gone.
    pub const LAST_LINK: u16 = 1;
    /// RENME: an existing name was replaced.
    pub const OVERWRITE: u16 = 2;
    /// RENME: the two names were exchanged (RENAME_EXCHANGE).
    pub const EXCHANGE: u16 = 4;
}

/// A set of record types: bit `n` stands for type number `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mask(pub u32);

impl Mask {
    pub const NONE: Mask = Mask(0);
    /// Every type calm emits.
    pub fn all() -> Mask {
        RecordType::ALL
            .into_iter()
            .filter(|t| t.is_emitted())
            .fold(Mask::NONE, |m, t| m.with(t))
    }

    /// Lustre's default: everything but the access-time and open/close noise.
    pub fn default_for_readers() -> Mask {
        Mask(Mask::all().0 & !Mask::NONE.with(RecordType::Atime).0)
    }

    pub fn with(self, t: RecordType) -> Mask {
        Mask(self.0 | 1 << (t as u8))
    }

    pub fn contains(self, t: RecordType) -> bool {
        self.0 & (1 << (t as u8)) != 0
    }

    pub fn union(self, other: Mask) -> Mask {
        Mask(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Parses `CREAT,MKDIR,…` (names as Lustre spells them, any case), `ALL` or `DEFAULT`.
    /// MARK is always included: it tells a reader about gaps.
    pub fn parse(text: &str) -> Result<Mask, RecordError> {
        let mut mask = Mask::NONE.with(RecordType::Mark);
        for word in text.split([',', ' ']).filter(|w| !w.is_empty()) {
            mask = match word.to_ascii_uppercase().as_str() {
                "ALL" => mask.union(Mask::all()),
                "DEFAULT" => mask.union(Mask::default_for_readers()),
                _ => mask.with(
                    RecordType::from_name(word)
                        .ok_or_else(|| RecordError::UnknownType(word.to_string()))?,
                ),
            };
        }
        Ok(mask)
    }

    /// The names of the types in the mask, comma-separated, in number order.
    pub fn names(self) -> String {
        RecordType::ALL
            .into_iter()
            .filter(|t| self.contains(*t))
            .map(RecordType::name)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Why bytes are not a record, or a mask is not a mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    Truncated,
    Version(u8),
    UnknownType(String),
    NameTooLong(usize),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Truncated => write!(f, "changelog record truncated"),
            RecordError::Version(v) => {
                write!(f, "changelog record version {v}; this build reads 1")
            }
            RecordError::UnknownType(t) => write!(f, "unknown changelog record type {t:?}"),
            RecordError::NameTooLong(n) => write!(f, "a record name of {n} bytes (at most 255)"),
        }
    }
}

impl std::error::Error for RecordError {}

/// The rename-specific part of a RENME record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RenameFrom {
    pub source_parent: u64,
    pub source_name: Vec<u8>,
    /// The inode the rename replaced (0: none), and its generation.
    pub overwritten: u64,
    pub overwritten_generation: u64,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Dense, strictly increasing in commit order; the record's key.
    pub index: u64,
    pub kind: RecordType,
    pub flags: u16,
    pub time_ns: i64,
    /// The inode changed (created, removed, renamed, whose attributes changed).
    pub target: u64,
    pub generation: u64,
    /// The directory the name is in (for RENME: the destination).
    pub parent: u64,
    pub name: Vec<u8>,
    pub session: u64,
    pub uid: u32,
    pub gid: u32,
    /// RENME only.
    pub rename: Option<RenameFrom>,
}

/// A record's fields, borrowed: what the committer encodes for each operation without
/// building a [`Record`] (whose owned names cost an allocation per record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub kind: RecordType,
    pub flags: u16,
    pub time_ns: i64,
    pub target: u64,
    pub generation: u64,
    pub parent: u64,
    pub name: &'a [u8],
    pub session: u64,
    pub uid: u32,
    pub gid: u32,
    /// RENME only.
    pub rename: Option<RenameRef<'a>>,
}

/// The rename-specific part of a [`RecordRef`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenameRef<'a> {
    pub source_parent: u64,
    pub source_name: &'a [u8],
    pub overwritten: u64,
    pub overwritten_generation: u64,
}

impl RecordRef<'_> {
    /// Encodes the record at the end of `out` (the same bytes as [`Record::encode_into`]);
    /// on an error `out` is as it was.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let source_name = self.rename.map(|r| r.source_name);
        for name in [Some(self.name), source_name].into_iter().flatten() {
            if name.len() > RECORD_NAME_LEN_MAX {
                return Err(RecordError::NameTooLong(name.len()));
            }
        }
        let extra = source_name.map_or(0, |n| 26 + n.len());
        out.reserve(RECORD_FIXED_LEN + self.name.len() + extra);
        out.push(RECORD_VERSION);
        out.push(self.kind as u8);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        out.extend_from_slice(&self.target.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.extend_from_slice(self.name);
        if let Some(r) = &self.rename {
            out.extend_from_slice(&r.source_parent.to_le_bytes());
            out.extend_from_slice(&r.overwritten.to_le_bytes());
            out.extend_from_slice(&r.overwritten_generation.to_le_bytes());
            out.extend_from_slice(&(r.source_name.len() as u16).to_le_bytes());
            out.extend_from_slice(r.source_name);
        }
        Ok(())
    }
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], RecordError> {
    if bytes.len() < n {
        return Err(RecordError::Truncated);
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn u16_of(b: &[u8]) -> u16 {
    u16::from_le_bytes(b.try_into().expect("2 bytes"))
}

fn u32_of(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn u64_of(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

impl Record {
    /// The encoded form (without the index). Names are at most [`RECORD_NAME_LEN_MAX`].
    pub fn encode(&self) -> Result<Vec<u8>, RecordError> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Encodes the record at the end of `out` (a buffer used again and again saves an
    /// allocation per record); on an error `out` is as it was.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        self.as_ref().encode_into(out)
    }

    /// The record's fields, borrowed (its index aside, which is not encoded).
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            kind: self.kind,
            flags: self.flags,
            time_ns: self.time_ns,
            target: self.target,
            generation: self.generation,
            parent: self.parent,
            name: &self.name,
            session: self.session,
            uid: self.uid,
            gid: self.gid,
            rename: self.rename.as_ref().map(|r| RenameRef {
                source_parent: r.source_parent,
                source_name: &r.source_name,
                overwritten: r.overwritten,
                overwritten_generation: r.overwritten_generation,
            }),
        }
    }

    pub fn decode(index: u64, mut bytes: &[u8]) -> Result<Record, RecordError> {
        let b = &mut bytes;
        let version = take(b, 1)?[0];
        if version != RECORD_VERSION {
            return Err(RecordError::Version(version));
        }
        let type_number = take(b, 1)?[0];
        let kind = RecordType::from_number(type_number)
            .ok_or_else(|| RecordError::UnknownType(type_number.to_string()))?;
        let flags = u16_of(take(b, 2)?);
        let uid = u32_of(take(b, 4)?);
        let gid = u32_of(take(b, 4)?);
        let time_ns = u64_of(take(b, 8)?) as i64;
        let target = u64_of(take(b, 8)?);
        let generation = u64_of(take(b, 8)?);
        let parent = u64_of(take(b, 8)?);
        let session = u64_of(take(b, 8)?);
        let name_len = u16_of(take(b, 2)?) as usize;
        let name = take(b, name_len)?.to_vec();
        let rename = if kind == RecordType::Rename {
            let source_parent = u64_of(take(b, 8)?);
            let overwritten = u64_of(take(b, 8)?);
            let overwritten_generation = u64_of(take(b, 8)?);
            let len = u16_of(take(b, 2)?) as usize;
            Some(RenameFrom {
                source_parent,
                source_name: take(b, len)?.to_vec(),
                overwritten,
                overwritten_generation,
            })
        } else {
            None
        };
        Ok(Record {
            index,
            kind,
            flags,
            time_ns,
            target,
            generation,
            parent,
            name,
            session,
            uid,
            gid,
            rename,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: RecordType) -> Record {
        Record {
            index: 42,
            kind,
            flags: flags::LAST_LINK,
            time_ns: -5,
            target: 7,
            generation: 3,
            parent: 1,
            name: b"file".to_vec(),
            session: 9,
            uid: 1000,
            gid: 100,
            rename: (kind == RecordType::Rename).then(|| RenameFrom {
                source_parent: 2,
                source_name: b"old".to_vec(),
                overwritten: 11,
                overwritten_generation: 4,
            }),
        }
    }

    #[test]
    fn records_round_trip_and_refuse_garbage() {
        for kind in RecordType::ALL {
            let r = record(kind);
            let bytes = r.encode().unwrap();
            assert_eq!(Record::decode(42, &bytes).unwrap(), r);
            for cut in 0..bytes.len() {
                assert!(
                    Record::decode(42, &bytes[..cut]).is_err(),
                    "{kind:?} cut at {cut}"
                );
            }
        }
        let mut bytes = record(RecordType::Create).encode().unwrap();
        bytes[0] = 2;
        assert_eq!(Record::decode(1, &bytes), Err(RecordError::Version(2)));
        bytes[0] = 1;
        bytes[1] = 99;
        assert!(Record::decode(1, &bytes).is_err());
        let mut long = record(RecordType::Create);
        long.name = vec![b'x'; 256];
        assert_eq!(long.encode(), Err(RecordError::NameTooLong(256)));
    }

    #[test]
    fn masks_parse_lustre_names() {
        let m = Mask::parse("CREAT,unlnk").unwrap();
        assert!(m.contains(RecordType::Create) && m.contains(RecordType::Unlink));
        assert!(m.contains(RecordType::Mark), "MARK is always in");
        assert!(!m.contains(RecordType::Mkdir));
        assert_eq!(m.names(), "MARK,CREAT,UNLNK");
        assert!(Mask::parse("CREAT,NOPE").is_err());
        assert!(Mask::parse("ALL").unwrap().contains(RecordType::Atime));
        assert!(!Mask::parse("DEFAULT").unwrap().contains(RecordType::Atime));
        assert!(
            !Mask::all().contains(RecordType::Open),
            "reserved types are not emitted"
        );
        for t in RecordType::ALL {
            assert_eq!(RecordType::from_name(t.name()), Some(t));
            assert_eq!(RecordType::from_number(t as u8), Some(t));
        }
    }
}
