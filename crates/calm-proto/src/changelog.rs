//! The changelog service's side of the wire: readers and records.

use calm_changelog::record::RenameFrom;
use calm_changelog::{Mask, Record, RecordType, User};
use calm_types::MetaError;

use crate::pb;

/// Metadata keys naming who asks for a mutation (recorded in its changelog record).
pub const SESSION_KEY: &str = "calm-session";
pub const UID_KEY: &str = "calm-uid";
pub const GID_KEY: &str = "calm-gid";
/// The caller's supplementary groups, decimal, comma-separated (at most
/// `calm_types::GROUPS_MAX`).
pub const GROUPS_KEY: &str = "calm-groups";
/// The job the calling process belongs to, as its mount read it from the process's
/// environment (`calm mount --job-variable`): what the server's load per job is counted by.
pub const JOB_KEY: &str = "calm-job";

/// Longest a follow read may wait, in ms.
pub const CL_WAIT_MS_MAX: u32 = 60_000;
/// Longest a batching follow read lingers after its first record, in µs.
pub const CL_LINGER_US_MAX: u32 = 100_000;

pub fn user_to_wire(user: &User) -> pb::ClUser {
    pb::ClUser {
        id: user.id,
        name: user.name.clone(),
        mask: user.mask.names(),
        cleared: user.cleared,
        registered_ns: user.registered_ns,
        last_clear_ns: user.last_clear_ns,
    }
}

pub fn user_from_wire(user: &pb::ClUser) -> Result<User, MetaError> {
    Ok(User {
        id: user.id,
        name: user.name.clone(),
        mask: mask_from_wire(&user.mask)?,
        cleared: user.cleared,
        registered_ns: user.registered_ns,
        last_clear_ns: user.last_clear_ns,
    })
}

/// A mask as text; empty means DEFAULT.
pub fn mask_from_wire(text: &str) -> Result<Mask, MetaError> {
    let text = if text.trim().is_empty() {
        "DEFAULT"
    } else {
        text
    };
    Mask::parse(text).map_err(|e| MetaError::Invalid(e.to_string()))
}

pub fn record_to_wire(record: &Record) -> pb::ClRecord {
    let rename = record.rename.clone().unwrap_or_default();
    pb::ClRecord {
        index: record.index,
        r#type: record.kind as u32,
        flags: u32::from(record.flags),
        time_ns: record.time_ns,
        target: record.target,
        generation: record.generation,
        parent: record.parent,
        name: record.name.clone(),
        session: record.session,
        uid: record.uid,
        gid: record.gid,
        rename: record.rename.is_some(),
        source_parent: rename.source_parent,
        source_name: rename.source_name,
        overwritten: rename.overwritten,
        overwritten_generation: rename.overwritten_generation,
    }
}

pub fn record_from_wire(record: &pb::ClRecord) -> Result<Record, MetaError> {
    let kind = u8::try_from(record.r#type)
        .ok()
        .and_then(RecordType::from_number)
        .ok_or_else(|| MetaError::Invalid(format!("record type {}", record.r#type)))?;
    Ok(Record {
        index: record.index,
        kind,
        flags: record.flags as u16,
        time_ns: record.time_ns,
        target: record.target,
        generation: record.generation,
        parent: record.parent,
        name: record.name.clone(),
        session: record.session,
        uid: record.uid,
        gid: record.gid,
        rename: record.rename.then(|| RenameFrom {
            source_parent: record.source_parent,
            source_name: record.source_name.clone(),
            overwritten: record.overwritten,
            overwritten_generation: record.overwritten_generation,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_users_survive_the_wire() {
        let record = Record {
            index: 9,
            kind: RecordType::Rename,
            flags: 3,
            time_ns: 5,
            target: 7,
            generation: 2,
            parent: 1,
            name: b"new".to_vec(),
            session: 4,
            uid: 1000,
            gid: 100,
            rename: Some(RenameFrom {
                source_parent: 3,
                source_name: b"old".to_vec(),
                overwritten: 8,
                overwritten_generation: 1,
            }),
        };
        assert_eq!(record_from_wire(&record_to_wire(&record)).unwrap(), record);
        let plain = Record {
            kind: RecordType::Create,
            rename: None,
            ..record
        };
        assert_eq!(record_from_wire(&record_to_wire(&plain)).unwrap(), plain);
        let user = User {
            id: 3,
            name: "backup".into(),
            mask: Mask::parse("CREAT,UNLNK").unwrap(),
            cleared: 10,
            registered_ns: 1,
            last_clear_ns: 2,
        };
        assert_eq!(user_from_wire(&user_to_wire(&user)).unwrap(), user);
        assert!(mask_from_wire("CREAT,BOGUS").is_err());
        assert_eq!(mask_from_wire("").unwrap(), Mask::parse("DEFAULT").unwrap());
    }
}
