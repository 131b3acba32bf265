//! The object store against the metadata, for `calm fsck --objects` and `calm gc`: every
//! object a file's record names must be there with its length (else the file reads EIO), and an
//! object no metadata names, older than a grace period, is a leak (an upload whose commit never
//! came: a mount killed mid-write) that `calm gc` may delete. Younger unnamed objects may be
//! uploads whose commit is on its way; they are left alone. An object of the deletion queue
//! may be there or gone already (the deleter removes the object first and the queue entry
//! after, so a server stopped between the two leaves entries whose objects are gone): neither
//! is a problem nor a leak. Pure: one merge of sorted lists.

use crate::objects::{Listed, Objects};
use calm_types::slices::blocks;

/// What the audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Objects in the store, and their bytes.
    pub objects: u64,
    pub bytes: u64,
    /// Slices the metadata names: by a file's record or in the deletion queue.
    pub referenced: u64,
    /// Of those, slices only the deletion queue names.
    pub queued: u64,
    /// Blocks of queued slices whose objects are gone already (deleted by a server stopped
    /// before it cleared their queue entries: the next deleter run clears them).
    pub queued_gone: u64,
    /// Blocks a file's record names that the store does not hold: `(id, block)`.
    pub missing: Vec<(u64, u32)>,
    /// Blocks whose length is not the one their slice's size gives: `(id, block, length,
    /// expected)`.
    pub wrong_length: Vec<(u64, u32, u64, u64)>,
    /// Objects no metadata names, older than the grace period.
    pub leaked: Vec<Listed>,
    /// Objects no metadata names, within the grace period (left alone).
    pub young: u64,
}

impl Audit {
    /// No named object is missing or of the wrong length.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.wrong_length.is_empty()
    }

    pub fn leaked_bytes(&self) -> u64 {
        self.leaked.iter().map(|l| l.len).sum()
    }
}

/// An object the metadata names: `(id, size)` and whether only the deletion queue names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Referenced {
    pub id: u64,
    pub size: u32,
    pub queued_only: bool,
}

/// Compares `referenced` (sorted by id, once each) with `listed` (sorted by id and block).
/// Unnamed objects modified before `now_ms - grace_ms` are leaks.
pub fn audit(referenced: &[Referenced], listed: &[Listed], now_ms: i64, grace_ms: i64) -> Audit {
    let mut report = Audit {
        objects: listed.len() as u64,
        bytes: listed.iter().map(|l| l.len).sum(),
        referenced: referenced.len() as u64,
        queued: referenced.iter().filter(|r| r.queued_only).count() as u64,
        ..Audit::default()
    };
    let mut at = 0;
    for &Referenced {
        id,
        size,
        queued_only,
    } in referenced
    {
        // Unnamed objects before this slice's.
        while at < listed.len() && listed[at].id < id {
            unnamed(&mut report, &listed[at], now_ms, grace_ms);
            at += 1;
        }
        let expected: Vec<(u32, u32)> = {
            let b: Vec<_> = blocks(size).collect();
            if b.is_empty() { vec![(0, 0)] } else { b }
        };
        for (block, len) in expected {
            let want = crate::block::header_len(len) + u64::from(len);
            while at < listed.len() && listed[at].id == id && listed[at].block < block {
                // A block past none the slice has: its index is below this one, so it was
                // counted already; or a stray block of the slice.
                unnamed(&mut report, &listed[at], now_ms, grace_ms);
                at += 1;
            }
            if at < listed.len() && listed[at].id == id && listed[at].block == block {
                if listed[at].len != want && !queued_only {
                    report.wrong_length.push((id, block, listed[at].len, want));
                }
                at += 1;
            } else if queued_only {
                report.queued_gone += 1;
            } else {
                report.missing.push((id, block));
            }
        }
        // Blocks past the slice's last.
        while at < listed.len() && listed[at].id == id {
            unnamed(&mut report, &listed[at], now_ms, grace_ms);
            at += 1;
        }
    }
    for object in &listed[at..] {
        unnamed(&mut report, object, now_ms, grace_ms);
    }
    report
}

fn unnamed(report: &mut Audit, object: &Listed, now_ms: i64, grace_ms: i64) {
    if object.modified_ms <= now_ms.saturating_sub(grace_ms) {
        report.leaked.push(object.clone());
    } else {
        report.young += 1;
    }
}

/// The unfinished writes (see [`crate::local::Unfinished`]) last written before
/// `now_ms - grace_ms`: younger ones may be writes still going on.
pub fn stale_unfinished(
    unfinished: Vec<crate::local::Unfinished>,
    now_ms: i64,
    grace_ms: i64,
) -> Vec<crate::local::Unfinished> {
    unfinished
        .into_iter()
        .filter(|u| u.modified_ms <= now_ms.saturating_sub(grace_ms))
        .collect()
}

/// Deletes the leaked objects of `report`; returns how many went.
pub async fn delete_leaked(objects: &Objects, report: &Audit) -> Result<u64, crate::DataError> {
    let mut deleted = 0;
    for object in &report.leaked {
        objects.delete_block(object.id, object.block).await?;
        deleted += 1;
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(id: u64, block: u32, data: u32, modified_ms: i64) -> Listed {
        Listed {
            id,
            block,
            len: crate::block::header_len(data) + u64::from(data),
            modified_ms,
        }
    }

    fn named(id: u64, size: u32) -> Referenced {
        Referenced {
            id,
            size,
            queued_only: false,
        }
    }

    fn queued(id: u64, size: u32) -> Referenced {
        Referenced {
            id,
            size,
            queued_only: true,
        }
    }

    #[test]
    fn named_unnamed_missing_and_short_objects_are_told_apart() {
        let four = calm_types::slices::BLOCK_BYTES as u32;
        let referenced = [named(2, 10), named(5, four + 3), named(9, 7)];
        let mut short = obj(9, 0, 7, 0);
        short.len -= 1;
        let listed = vec![
            obj(1, 0, 5, 0),     // unnamed, old: leaked
            obj(2, 0, 10, 0),    // named
            obj(3, 0, 5, 9_999), // unnamed, young
            obj(5, 0, four, 0),  // named
            obj(5, 2, 1, 0),     // a block slice 5 does not have: leaked
            short,               // named, wrong length
            obj(12, 0, 1, 0),    // unnamed, old
        ];
        let report = audit(&referenced, &listed, 10_000, 1_000);
        assert_eq!(report.missing, vec![(5, 1)]);
        assert_eq!(report.wrong_length.len(), 1);
        assert_eq!(report.wrong_length[0].0, 9);
        let leaked: Vec<_> = report.leaked.iter().map(|l| (l.id, l.block)).collect();
        assert_eq!(leaked, vec![(1, 0), (5, 2), (12, 0)]);
        assert_eq!(report.young, 1);
        assert_eq!(report.objects, 7);
        assert!(!report.is_clean());
        let clean = audit(&[named(2, 10)], &[obj(2, 0, 10, 0)], 10, 0);
        assert!(clean.is_clean() && clean.leaked.is_empty());
    }

    #[test]
    fn a_queued_object_may_be_there_or_gone_but_a_named_one_must_be_there() {
        let listed = vec![obj(3, 0, 10, 0), obj(8, 0, 4, 0)];
        let referenced = [queued(3, 10), queued(5, 10), named(8, 4), named(9, 4)];
        let report = audit(&referenced, &listed, 10_000, 0);
        assert_eq!(report.queued, 2);
        assert_eq!(
            report.queued_gone, 1,
            "slice 5's object went before its entry"
        );
        assert_eq!(report.missing, vec![(9, 0)], "slice 9 is named and gone");
        assert!(report.leaked.is_empty() && report.young == 0);
    }
}
