//! The value of an orphan record (`H` keys: [`super::orphan_key`]).

use crate::error::{MetaError, Result};
use crate::types::Handle;

/// What an orphan record keeps: the lock session of the mount that has the file open, and
/// where the file's last name was, so that its last close can move it to the trash there and
/// take what it counts from the trees above that directory. Encoded as `session` (u64 le),
/// then `dir` (u64 le) and the name; a record written before format 12 has the session only.
/// A `dir` of 0 says the file counts in no tree: its directory was removed after it (format
/// 14), or is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanRecord {
    pub session: u64,
    pub place: Option<(Handle, Vec<u8>)>,
}

impl OrphanRecord {
    pub fn encode(&self) -> Vec<u8> {
        let name = self.place.as_ref().map_or(&[][..], |(_, name)| name);
        let mut out = Vec::with_capacity(16 + name.len());
        out.extend_from_slice(&self.session.to_le_bytes());
        if let Some((dir, name)) = &self.place {
            out.extend_from_slice(&dir.to_le_bytes());
            out.extend_from_slice(name);
        }
        out
    }

    pub fn decode(value: &[u8]) -> Result<OrphanRecord> {
        let word = |at: usize| -> Option<[u8; 8]> { value.get(at..at + 8)?.try_into().ok() };
        match (word(0), word(8)) {
            (Some(session), _) if value.len() == 8 => Ok(OrphanRecord {
                session: u64::from_le_bytes(session),
                place: None,
            }),
            (Some(session), Some(dir)) if value.len() > 16 => Ok(OrphanRecord {
                session: u64::from_le_bytes(session),
                place: Some((u64::from_le_bytes(dir), value[16..].to_vec())),
            }),
            _ => Err(MetaError::Corrupt(format!(
                "an orphan record of {} bytes",
                value.len()
            ))),
        }
    }

    /// The directory whose trees the file counts in (0: none).
    pub fn tree_dir(&self) -> Handle {
        self.place.as_ref().map_or(0, |(dir, _)| *dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_bad_ones_are_refused() {
        for record in [
            OrphanRecord {
                session: 7,
                place: None,
            },
            OrphanRecord {
                session: u64::MAX,
                place: Some((12, b"name".to_vec())),
            },
            OrphanRecord {
                session: 1,
                place: Some((0, vec![b'x'; 255])),
            },
        ] {
            assert_eq!(OrphanRecord::decode(&record.encode()).unwrap(), record);
        }
        for bad in [&[][..], &[1; 7], &[1; 9], &[1; 16]] {
            assert!(OrphanRecord::decode(bad).is_err(), "{} bytes", bad.len());
        }
    }
}
