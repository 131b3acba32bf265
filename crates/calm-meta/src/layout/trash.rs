//! The value of a trash entry (`E` keys: [`super::trash_key`]).

use crate::error::{MetaError, Result};
use crate::types::Handle;

/// What the trash keeps of a removed file or directory besides its inode: when it was removed,
/// its size then, and the directory and name it had. Encoded as `deleted_ns` (i64 le), `size`
/// (u64 le), `parent` (u64 le), then the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrashEntry {
    pub deleted_ns: i64,
    pub size: u64,
    pub parent: Handle,
    pub name: Vec<u8>,
}

impl TrashEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.name.len());
        out.extend_from_slice(&self.deleted_ns.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.name);
        out
    }

    pub fn decode(value: &[u8]) -> Result<TrashEntry> {
        let word = |at: usize| -> Option<[u8; 8]> { value.get(at..at + 8)?.try_into().ok() };
        match (word(0), word(8), word(16)) {
            (Some(deleted), Some(size), Some(parent)) if value.len() > 24 => Ok(TrashEntry {
                deleted_ns: i64::from_le_bytes(deleted),
                size: u64::from_le_bytes(size),
                parent: u64::from_le_bytes(parent),
                name: value[24..].to_vec(),
            }),
            _ => Err(MetaError::Corrupt(format!(
                "a trash entry of {} bytes",
                value.len()
            ))),
        }
    }
}
