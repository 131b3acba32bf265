//! The changelog on etcd, in batches: the records one transaction appends share a key, so a
//! group of mutations writes one changelog key where it wrote one per record, and a purge
//! deletes one key per batch. Under a churn of creates and unlinks on three servers, the
//! records were two in five of the keys etcd wrote, deleted and compacted
//! (`docs/design/etcd.md`, "Changelog batches").
//!
//! The layout, under the log's key family ([`calm_store::LOG_FAMILY`]):
//! - `log_key(i)` → record `i`, as it is: a batch of one (and every record written before
//!   batches were);
//! - `log_key(last) ++ [BATCH_MARK]` → the records `first..=last`: `first` (8 bytes,
//!   big-endian), then each record as its length (4 bytes, little-endian) and its bytes;
//! - `[LOG_FAMILY]` → the floor (8 bytes, little-endian): no record below it is stored. A
//!   purge deletes the keys of the batches that end at or below its last index, in one range,
//!   and moves the floor past it; the records of a batch it cut in two stay stored under the
//!   floor until a later purge deletes their batch, and are never read.
//!
//! Every key is named by the last record it holds, so a batch holding record `i` is the first
//! key at or above `log_key(i)`, and the keys of the purged records are one range.

use std::ops::ControlFlow;

use calm_store::{LOG_FAMILY, LogVisitor, ReadTxn, Result, StoreError, log_key};

/// Marks a key that holds a batch of records (the byte after the last record's index).
pub(crate) const BATCH_MARK: u8 = 1;
/// Largest batch value: a record that would take a batch past it begins a new key.
pub(crate) const BATCH_BYTES_MAX: usize = 64 << 10;
/// The floor's key: below every record's.
pub(crate) const FLOOR_KEY: [u8; 1] = [LOG_FAMILY];
/// Bytes before a batch's records: the index of its first.
const BATCH_HEADER_BYTES: usize = 8;
/// Bytes before each record in a batch: its length.
pub(crate) const LENGTH_BYTES: usize = 4;

/// The key of the batch whose last record is `last`.
pub(crate) fn batch_key(last: u64) -> Vec<u8> {
    [log_key(last).as_slice(), &[BATCH_MARK]].concat()
}

/// The key holding records `first..=last`: a batch, or a record alone.
pub(crate) fn key_of(first: u64, last: u64) -> Vec<u8> {
    if first == last {
        log_key(last).to_vec()
    } else {
        batch_key(last)
    }
}

/// A batch's value holding `record` (index `index`) alone, to be extended by [`push`].
pub(crate) fn batch_of(index: u64, record: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(batch_bytes(record.len(), 1));
    value.extend_from_slice(&index.to_be_bytes());
    push(&mut value, record);
    value
}

/// Appends `record` to a batch's value.
pub(crate) fn push(batch: &mut Vec<u8>, record: &[u8]) {
    batch.extend_from_slice(&(record.len() as u32).to_le_bytes());
    batch.extend_from_slice(record);
}

/// What a batch of one record costs once more records join it.
pub(crate) fn batch_bytes(records_bytes: usize, records: usize) -> usize {
    BATCH_HEADER_BYTES + LENGTH_BYTES * records + records_bytes
}

fn malformed(key: &[u8], what: &str) -> StoreError {
    StoreError::Io(format!(
        "the changelog's key {key:02x?} on etcd is malformed: {what}"
    ))
}

/// Records of the log: (index, bytes), in order.
type Records<'v> = Vec<(u64, &'v [u8])>;

/// The records a log key holds: `None` for a key of the family that is no record's (the
/// floor).
fn records<'v>(key: &[u8], value: &'v [u8]) -> Result<Option<Records<'v>>> {
    if key.len() < 9 || key[0] != LOG_FAMILY {
        return Ok(None);
    }
    let last = u64::from_be_bytes(key[1..9].try_into().expect("8 bytes"));
    match &key[9..] {
        [] => Ok(Some(vec![(last, value)])),
        [BATCH_MARK] => {
            let header: [u8; BATCH_HEADER_BYTES] = value
                .get(..BATCH_HEADER_BYTES)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| malformed(key, "no first index"))?;
            let first = u64::from_be_bytes(header);
            if first > last {
                return Err(malformed(key, "first index above the last"));
            }
            let mut out = Vec::with_capacity((last - first + 1).min(1 << 16) as usize);
            let mut rest = &value[BATCH_HEADER_BYTES..];
            for index in first..=last {
                let length: [u8; 4] = rest
                    .get(..4)
                    .and_then(|l| l.try_into().ok())
                    .ok_or_else(|| malformed(key, "a record's length is cut off"))?;
                let length = u32::from_le_bytes(length) as usize;
                let record = rest
                    .get(4..4 + length)
                    .ok_or_else(|| malformed(key, "a record is cut off"))?;
                out.push((index, record));
                rest = &rest[4 + length..];
            }
            if !rest.is_empty() {
                return Err(malformed(key, "bytes after the last record"));
            }
            Ok(Some(out))
        }
        _ => Err(malformed(key, "not a record's key")),
    }
}

/// The floor: no record below it is stored (0: none purged since batches began).
pub(crate) fn floor<R: ReadTxn + ?Sized>(view: &R) -> Result<u64> {
    match view.get(&FLOOR_KEY)? {
        None => Ok(0),
        Some(value) => {
            let bytes: [u8; 8] = value
                .as_ref()
                .try_into()
                .map_err(|_| malformed(&FLOOR_KEY, "the floor is not 8 bytes"))?;
            Ok(u64::from_le_bytes(bytes))
        }
    }
}

/// [`ReadTxn::log_visit`]: the records at or above `from` and the floor.
pub(crate) fn visit<R: ReadTxn + ?Sized>(
    view: &R,
    from: u64,
    visit: &mut LogVisitor<'_>,
) -> Result<usize> {
    let from = from.max(floor(view)?);
    let mut visited = 0;
    let mut failed = None;
    view.visit(&log_key(from), b"", &mut |key, value| {
        let held = match records(key, value) {
            Ok(Some(held)) => held,
            Ok(None) => return ControlFlow::Break(()),
            Err(error) => {
                failed = Some(error);
                return ControlFlow::Break(());
            }
        };
        for (index, record) in held.into_iter().filter(|(index, _)| *index >= from) {
            visited += 1;
            if visit(index, record).is_break() {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    match failed {
        Some(error) => Err(error),
        None => Ok(visited),
    }
}

/// [`ReadTxn::log_first`].
pub(crate) fn first<R: ReadTxn + ?Sized>(view: &R) -> Result<Option<u64>> {
    let mut first = None;
    visit(view, 0, &mut |index, _| {
        first = Some(index);
        ControlFlow::Break(())
    })?;
    Ok(first)
}

/// [`ReadTxn::log_last`]: the index the greatest key names, unless the floor is past it.
pub(crate) fn last<R: ReadTxn + ?Sized>(view: &R) -> Result<Option<u64>> {
    let Some((key, _)) = view.last_in(&log_key(0), b"")? else {
        return Ok(None);
    };
    let last = u64::from_be_bytes(
        key.get(1..9)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| malformed(&key, "not a record's key"))?,
    );
    Ok((last >= floor(view)?).then_some(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A batch's value read back gives the records pushed, in order, under their indices.
        #[test]
        fn a_batch_reads_back_as_written(
            first in 1u64..u64::MAX / 2,
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 2..20)
        ) {
            let mut value = batch_of(first, &records[0]);
            for record in &records[1..] {
                push(&mut value, record);
            }
            let last = first + records.len() as u64 - 1;
            prop_assert_eq!(
                value.len(),
                batch_bytes(records.iter().map(Vec::len).sum(), records.len())
            );
            let expected: Vec<(u64, Vec<u8>)> =
                records.iter().enumerate().map(|(i, r)| (first + i as u64, r.clone())).collect();
            prop_assert_eq!(records_of(&key_of(first, last), &value), expected);
        }
    }

    #[test]
    fn a_record_alone_is_stored_as_it_is() {
        assert_eq!(key_of(7, 7), log_key(7).to_vec());
        assert_eq!(
            records_of(&key_of(7, 7), b"rec"),
            vec![(7, b"rec".to_vec())]
        );
    }

    fn records_of(key: &[u8], value: &[u8]) -> Vec<(u64, Vec<u8>)> {
        records(key, value)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|(i, r)| (i, r.to_vec()))
            .collect()
    }

    #[test]
    fn a_malformed_batch_is_an_error_not_a_guess() {
        let mut value = batch_of(5, b"abc");
        push(&mut value, b"de");
        let key = batch_key(6);
        assert_eq!(records_of(&key, &value).len(), 2);
        // One record too few for the indices the key and header name.
        assert!(records(&batch_key(7), &value).is_err());
        // Cut off, and trailing bytes.
        assert!(records(&key, &value[..value.len() - 1]).is_err());
        assert!(records(&key, &[value.as_slice(), &[0]].concat()).is_err());
        // First above last, and no header.
        assert!(records(&batch_key(4), &value).is_err());
        assert!(records(&key, &[1, 2]).is_err());
        // A key of the family of no known form.
        assert!(records(&[log_key(3).as_slice(), &[9]].concat(), b"x").is_err());
        // The floor is no record.
        assert_eq!(records(&FLOOR_KEY, &[0; 8]).unwrap(), None);
    }
}
