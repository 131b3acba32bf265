//! A file's map as a snapshot holds it: its records from a chunk on and the bytes of its
//! inline slices (read by the namespace's readers and by a rename keeping a replaced file,
//! `crate::replaced`).

use std::ops::ControlFlow;

use calm_store::ReadTxn;

use crate::error::{MetaError, Result};
use crate::layout::*;
use crate::slices::{FileMap, Slice, decode_chunk};
use crate::types::Attr;

/// Most slice records one `Meta::read_map` returns (about 1.5 MiB); a larger map is read in
/// several calls.
pub const MAP_RECORDS_MAX: usize = 65_536;

/// The map of file `attr` (a regular file) in `snap` from chunk `from_chunk` on, at most
/// `max_records` records (and [`MAP_RECORDS_MAX`]) and one chunk's worth of inline bytes.
pub(crate) fn map_of<R: ReadTxn>(
    snap: &R,
    attr: Attr,
    from_chunk: u64,
    max_records: usize,
) -> Result<FileMap> {
    let handle = attr.handle;
    let max_records = max_records.clamp(1, MAP_RECORDS_MAX);
    let (_, end) = chunk_range(handle);
    let mut chunks = Vec::new();
    let (mut records, mut inline_bytes, mut more) = (0, 0u64, false);
    let mut bad = None;
    snap.visit(&chunk_key(handle, from_chunk), &end, &mut |key, value| {
        if !chunks.is_empty() && records + value.len() / 24 > max_records {
            more = true;
            return ControlFlow::Break(());
        }
        match (key_chunk(key), decode_chunk(value)) {
            (Some(chunk), Ok(slices)) => {
                // A page's inline bytes: at most one chunk's worth.
                let inline = crate::slices::inline_bytes(&slices);
                if !chunks.is_empty()
                    && inline_bytes + inline > crate::slices::INLINE_CHUNK_BYTES_MAX
                {
                    more = true;
                    return ControlFlow::Break(());
                }
                inline_bytes += inline;
                records += slices.len();
                chunks.push((chunk, slices));
                ControlFlow::Continue(())
            }
            (_, Err(error)) => {
                bad = Some(error);
                ControlFlow::Break(())
            }
            (None, _) => {
                bad = Some(MetaError::Corrupt(format!("chunk key {key:?}")));
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(error) = bad {
        return Err(error);
    }
    let inline = inline_of(snap, chunks.iter().flat_map(|(_, s)| s))?;
    Ok(FileMap {
        attr,
        chunks,
        more,
        inline,
    })
}

/// The bytes of the inline slices among `records`, by id, once each.
pub(crate) fn inline_of<'a, R: ReadTxn>(
    snap: &R,
    records: impl Iterator<Item = &'a Slice>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut ids: Vec<u64> = records
        .filter(|s| crate::slices::is_inline(s.id))
        .map(|s| s.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|id| match snap.get(&inline_key(id))? {
            Some(data) => Ok((id, data.into_owned())),
            None => Err(MetaError::Corrupt(format!(
                "inline slice {id:#x} is named but has no bytes"
            ))),
        })
        .collect()
}
