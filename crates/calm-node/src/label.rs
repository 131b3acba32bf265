//! The target label: what makes a block device or a directory a calm target. Versioned and
//! checksummed; the format is in docs/design/targets.md.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "CALMTGT\0"
//!      8     2  version (1), little-endian like every number here
//!     10     2  length of the label in bytes, checksum included
//!     12    16  target uuid
//!     28    16  pool uuid
//!     44     4  member index
//!     48     4  member count
//!     52     8  generation
//!     60     1  pool name length (1..=64)
//!     61     n  pool name (UTF-8)
//!   61+n     4  CRC-32 (IEEE) of every byte before it
//! ```
//!
//! A block device carries it in its first 512 bytes, the boot area that ext4 and btrfs leave
//! unused (make the file system first, then format the target; XFS, whose superblock is in
//! sector 0, cannot carry it); a directory in the file `.calm-target`.

/// Where the label sits on a block device.
pub const DEVICE_OFFSET: u64 = 0;
/// The label file of a directory target.
pub const DIR_FILE: &str = ".calm-target";
pub const MAGIC: [u8; 8] = *b"CALMTGT\0";
pub const VERSION: u16 = 1;
pub const POOL_NAME_MAX: usize = 64;
/// Most members in one pool.
pub const MEMBERS_MAX: u32 = 1 << 16;
/// The largest label (the bytes read from a device).
pub const LABEL_MAX: usize = 61 + POOL_NAME_MAX + 4;

pub type Uuid = [u8; 16];

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Label {
    pub target: Uuid,
    pub pool: Uuid,
    pub pool_name: String,
    pub index: u32,
    pub count: u32,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    /// No label at all (not a calm target).
    NotALabel,
    UnknownVersion(u16),
    BadChecksum,
    Truncated,
    Invalid(String),
}

impl std::fmt::Display for LabelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LabelError::NotALabel => write!(f, "no calm target label"),
            LabelError::UnknownVersion(v) => write!(f, "target label version {v} is not known"),
            LabelError::BadChecksum => write!(f, "target label checksum mismatch (damaged)"),
            LabelError::Truncated => write!(f, "target label truncated"),
            LabelError::Invalid(why) => write!(f, "invalid target label: {why}"),
        }
    }
}

impl std::error::Error for LabelError {}

/// CRC-32 (IEEE 802.3, reflected), bitwise: labels are tiny.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Reads the label of a block device (`dev`) or a directory target.
pub fn read(path: &std::path::Path) -> Result<Label, ReadError> {
    use std::os::unix::fs::FileExt;
    let bytes = if path.is_dir() {
        std::fs::read(path.join(DIR_FILE)).map_err(ReadError::Io)?
    } else {
        let file = std::fs::File::open(path).map_err(ReadError::Io)?;
        let mut buf = vec![0u8; LABEL_MAX];
        let n = file
            .read_at(&mut buf, DEVICE_OFFSET)
            .map_err(ReadError::Io)?;
        buf.truncate(n);
        buf
    };
    Label::decode(&bytes).map_err(ReadError::Label)
}

/// Writes `label` to a block device or a directory target, durably.
pub fn write(path: &std::path::Path, label: &Label) -> Result<(), ReadError> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let bytes = label.encode().map_err(ReadError::Label)?;
    if path.is_dir() {
        let tmp = path.join(format!("{DIR_FILE}.tmp"));
        let mut file = std::fs::File::create(&tmp).map_err(ReadError::Io)?;
        file.write_all(&bytes).map_err(ReadError::Io)?;
        file.sync_all().map_err(ReadError::Io)?;
        std::fs::rename(&tmp, path.join(DIR_FILE)).map_err(ReadError::Io)?;
        std::fs::File::open(path)
            .and_then(|d| d.sync_all())
            .map_err(ReadError::Io)
    } else {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(ReadError::Io)?;
        file.write_all_at(&bytes, DEVICE_OFFSET)
            .map_err(ReadError::Io)?;
        file.sync_all().map_err(ReadError::Io)
    }
}

/// Why a label could not be read or written.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    Label(LabelError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Label(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// A fresh random uuid.
pub fn random_uuid() -> std::io::Result<Uuid> {
    let mut u = [0u8; 16];
    // SAFETY: getrandom(2) into our 16-byte buffer.
    let n = unsafe { libc::getrandom(u.as_mut_ptr().cast(), u.len(), 0) };
    if n != 16 {
        return Err(std::io::Error::last_os_error());
    }
    u[6] = (u[6] & 0x0f) | 0x40; // version 4
    u[8] = (u[8] & 0x3f) | 0x80; // RFC 4122 variant
    Ok(u)
}

/// Parses a uuid's text form.
pub fn parse_uuid(text: &str) -> Option<Uuid> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, byte) in u.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(u)
}

impl Label {
    /// A new target's label: member `index` of `count` of pool `pool_name`, whose uuid is
    /// `pool_uuid` (its text; a new one when absent), checked.
    pub fn new_member(
        pool_name: String,
        index: u32,
        count: u32,
        pool_uuid: Option<&str>,
        generation: u64,
    ) -> Result<Label, LabelError> {
        let pool = match pool_uuid {
            Some(text) => parse_uuid(text).ok_or_else(|| {
                LabelError::Invalid(format!("--pool-uuid {text:?} is not a uuid"))
            })?,
            None => random_uuid().map_err(|e| LabelError::Invalid(format!("a new uuid: {e}")))?,
        };
        let target = random_uuid().map_err(|e| LabelError::Invalid(format!("a new uuid: {e}")))?;
        let label = Label {
            target,
            pool,
            pool_name,
            index,
            count,
            generation,
        };
        label.validate()?;
        Ok(label)
    }

    /// The label as a person reads it: `target UUID member I of N of pool "NAME" UUID
    /// generation G`.
    pub fn describe(&self) -> String {
        format!(
            "target {} member {} of {} of pool {:?} {} generation {}",
            uuid_text(&self.target),
            self.index,
            self.count,
            self.pool_name,
            uuid_text(&self.pool),
            self.generation
        )
    }

    /// Checks the fields a label must satisfy.
    pub fn validate(&self) -> Result<(), LabelError> {
        if self.pool_name.is_empty() || self.pool_name.len() > POOL_NAME_MAX {
            return Err(LabelError::Invalid(format!(
                "pool name must be 1 to {POOL_NAME_MAX} bytes"
            )));
        }
        if self.pool_name.contains('/') || self.pool_name.contains('\0') {
            return Err(LabelError::Invalid(
                "pool name may not contain '/' or NUL".into(),
            ));
        }
        if self.count == 0 || self.count > MEMBERS_MAX {
            return Err(LabelError::Invalid(format!(
                "member count must be 1 to {MEMBERS_MAX}"
            )));
        }
        if self.index >= self.count {
            return Err(LabelError::Invalid(format!(
                "member index {} is not below the count {}",
                self.index, self.count
            )));
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<Vec<u8>, LabelError> {
        self.validate()?;
        let name = self.pool_name.as_bytes();
        let len = 61 + name.len() + 4;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&self.target);
        out.extend_from_slice(&self.pool);
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        let crc = crc32(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Label, LabelError> {
        if bytes.len() < 8 || bytes[..8] != MAGIC {
            return Err(LabelError::NotALabel);
        }
        if bytes.len() < 12 {
            return Err(LabelError::Truncated);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != VERSION {
            return Err(LabelError::UnknownVersion(version));
        }
        let len = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
        if !(65..=LABEL_MAX).contains(&len) {
            return Err(LabelError::Invalid(format!("length {len}")));
        }
        if bytes.len() < len {
            return Err(LabelError::Truncated);
        }
        let stored = u32::from_le_bytes(bytes[len - 4..len].try_into().expect("4 bytes"));
        if crc32(&bytes[..len - 4]) != stored {
            return Err(LabelError::BadChecksum);
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let name_len = bytes[60] as usize;
        if 61 + name_len + 4 != len {
            return Err(LabelError::Invalid("pool name length".into()));
        }
        let label = Label {
            target: bytes[12..28].try_into().expect("16 bytes"),
            pool: bytes[28..44].try_into().expect("16 bytes"),
            index: u32_at(44),
            count: u32_at(48),
            generation: u64::from_le_bytes(bytes[52..60].try_into().expect("8 bytes")),
            pool_name: String::from_utf8(bytes[61..61 + name_len].to_vec())
                .map_err(|_| LabelError::Invalid("pool name is not UTF-8".into()))?,
        };
        label.validate()?;
        Ok(label)
    }
}

/// A uuid in its usual text form.
pub fn uuid_text(uuid: &Uuid) -> String {
    let h: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label() -> Label {
        Label {
            target: [1; 16],
            pool: [2; 16],
            pool_name: "tank".into(),
            index: 2,
            count: 4,
            generation: 7,
        }
    }

    #[test]
    fn a_label_round_trips_and_damage_is_caught() {
        let bytes = label().encode().unwrap();
        assert_eq!(Label::decode(&bytes).unwrap(), label());
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            assert!(
                Label::decode(&damaged).is_err(),
                "a flipped bit at {at} went unnoticed"
            );
        }
        assert_eq!(Label::decode(&[0; 100]), Err(LabelError::NotALabel));
        assert_eq!(Label::decode(&bytes[..40]), Err(LabelError::Truncated));
    }

    #[test]
    fn bad_fields_are_refused() {
        let bad = Label {
            index: 4,
            ..label()
        };
        assert!(
            bad.encode()
                .unwrap_err()
                .to_string()
                .contains("not below the count")
        );
        let bad = Label {
            pool_name: "a/b".into(),
            ..label()
        };
        assert!(bad.encode().is_err());
        let bad = Label {
            count: 0,
            index: 0,
            ..label()
        };
        assert!(bad.encode().is_err());
    }

    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
