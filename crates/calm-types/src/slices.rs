//! File contents as metadata: which object ranges make up which bytes of a file.
//!
//! A file is cut into chunks of [`CHUNK_BYTES`]. Each continuous write becomes a *slice*: an
//! immutable object (stored by calm-data as blocks of [`BLOCK_BYTES`]) of which a range is
//! placed at a position of one chunk. A chunk's value in the store is the list of its slice
//! records in commit order; a later record covers what an earlier one placed below it, and a
//! record with id 0 (a hole) reads as zeros. What the chunk shows is the overlay of its records
//! ([`view`]): a list of disjoint pieces. Bytes no record covers read as zeros; bytes at or past
//! the file's size are not there at all.
//!
//! Every function here is pure: no store, no objects, no clock.

use std::collections::BTreeMap;

use crate::attr::Attr;
use crate::error::{MetaError, Result};

/// Bytes of a file one chunk holds. A slice never crosses a chunk's end.
pub const CHUNK_BYTES: u64 = 64 << 20;
/// Bytes of one block object of a slice (the last block of a slice may be shorter).
pub const BLOCK_BYTES: u64 = 4 << 20;
/// Bytes of one encoded slice record.
pub const SLICE_RECORD_BYTES: usize = 24;
/// Most records one chunk may hold: a write that would go past it is refused as busy, and the
/// server has the chunk compacted before it tries the write again (the namespace's compaction keeps
/// chunks far below it).
pub const CHUNK_SLICES_MAX: usize = 4096;
/// Records in one chunk from which the namespace compacts it whatever the merge costs: the
/// most a chunk keeps once compaction has caught up.
pub const CHUNK_SLICES_COMPACT_ALWAYS: usize = 1024;
// Writers keep adding records while a chunk is compacted: room for them below the hard limit.
const _: () = assert!(CHUNK_SLICES_COMPACT_ALWAYS * 2 <= CHUNK_SLICES_MAX);
/// Most slice ids handed out by one allocation.
pub const SLICE_IDS_PER_ALLOC_MAX: u64 = 1 << 20;

const _: () = assert!(CHUNK_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(CHUNK_BYTES <= u32::MAX as u64);

/// The id of a hole record: no object, zeros.
pub const HOLE: u64 = 0;

/// The flag of an inline slice's id: its bytes are kept in the metadata store (`K id`),
/// written in the same transaction as its record, rather than in an object (as Lustre keeps a
/// small file's data on its metadata target). Ids handed out never reach it.
pub const INLINE: u64 = 1 << 63;
/// Most bytes one inline slice holds.
pub const INLINE_SLICE_BYTES_MAX: u32 = 64 << 10;
/// Most inline bytes one write places (all its inline slices together).
pub const INLINE_WRITE_BYTES_MAX: u64 = 64 << 10;
/// Inline slices of writes and compactions lie in a file's first chunk only (none reaches
/// past this). An append's inline slice may lie in any chunk: the compactor moves the inline
/// bytes of a chunk the file's end has left into an object
/// (the namespace's compaction).
pub const INLINE_FILE_BYTES_MAX: u64 = CHUNK_BYTES;
/// Most bytes the inline slices of one chunk may hold together, so that a page of a file's
/// map with its inline bytes stays a small message. A write past it places objects.
pub const INLINE_CHUNK_BYTES_MAX: u64 = 1 << 20;

const _: () = assert!(INLINE_FILE_BYTES_MAX <= CHUNK_BYTES);
const _: () = assert!(INLINE_SLICE_BYTES_MAX as u64 <= INLINE_WRITE_BYTES_MAX);
const _: () = assert!(INLINE_WRITE_BYTES_MAX <= INLINE_CHUNK_BYTES_MAX);
// A map's inline bytes and records fit one message with room to spare.
const _: () = assert!(INLINE_CHUNK_BYTES_MAX <= 2 << 20);

/// Whether slice id `id` names inline bytes (not an object, not a hole).
pub fn is_inline(id: u64) -> bool {
    id & INLINE != 0
}

/// Bytes the inline slices among `records` hold.
pub fn inline_bytes(records: &[Slice]) -> u64 {
    records
        .iter()
        .filter(|s| is_inline(s.id))
        .map(|s| u64::from(s.size))
        .sum()
}

/// Whether `id` names an object of the object store.
pub fn is_object(id: u64) -> bool {
    id != HOLE && !is_inline(id)
}

/// One record of a chunk: `len` bytes of slice object `id` (whose data is `size` bytes long),
/// starting at byte `off` of the object, placed at byte `pos` of the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    pub id: u64,
    pub size: u32,
    pub off: u32,
    pub len: u32,
    pub pos: u32,
}

impl Slice {
    /// A hole of `len` bytes at `pos`.
    pub fn hole(pos: u32, len: u32) -> Slice {
        Slice {
            id: HOLE,
            size: 0,
            off: 0,
            len,
            pos,
        }
    }

    /// The end of the record in its chunk (exclusive).
    pub fn end(&self) -> u64 {
        u64::from(self.pos) + u64::from(self.len)
    }

    /// Whether the record fits its chunk and its object.
    pub fn check(&self) -> Result<()> {
        let bad = |why: &str| Err(MetaError::Invalid(format!("slice record {self:?}: {why}")));
        if self.len == 0 {
            return bad("empty");
        }
        if self.end() > CHUNK_BYTES {
            return bad("past the chunk's end");
        }
        if self.id != HOLE && u64::from(self.off) + u64::from(self.len) > u64::from(self.size) {
            return bad("past the object's end");
        }
        if self.id != HOLE && u64::from(self.size) > CHUNK_BYTES {
            return bad("an object larger than a chunk");
        }
        if is_inline(self.id) && self.size > INLINE_SLICE_BYTES_MAX {
            return bad("inline bytes past their limit");
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.off.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.pos.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> Slice {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        Slice {
            id: u64::from_le_bytes(bytes[..8].try_into().expect("8")),
            size: u32_at(8),
            off: u32_at(12),
            len: u32_at(16),
            pos: u32_at(20),
        }
    }
}

/// A chunk's records as stored.
pub fn encode_chunk(slices: &[Slice]) -> Vec<u8> {
    let mut out = Vec::with_capacity(slices.len() * SLICE_RECORD_BYTES);
    for slice in slices {
        slice.encode_into(&mut out);
    }
    out
}

/// Decodes a chunk's value.
pub fn decode_chunk(value: &[u8]) -> Result<Vec<Slice>> {
    if !value.len().is_multiple_of(SLICE_RECORD_BYTES) {
        return Err(MetaError::Corrupt(format!(
            "chunk value of {} bytes is not a whole number of slice records",
            value.len()
        )));
    }
    Ok(value
        .chunks_exact(SLICE_RECORD_BYTES)
        .map(Slice::decode)
        .collect())
}

/// A file's slice map (or the part of it one call returns), read on one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMap {
    pub attr: Attr,
    /// `(chunk index, records)` in chunk order; chunks with no record are absent.
    pub chunks: Vec<(u64, Vec<Slice>)>,
    /// The map goes on past the last chunk returned: ask again from the next one.
    pub more: bool,
    /// The bytes of the inline slices the records name ([`INLINE`](crate::slices::INLINE)), by id.
    pub inline: Vec<(u64, Vec<u8>)>,
}

/// Where the bytes of a piece come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Zeros.
    Zeros,
    /// Object `id` (data `size` bytes long), from byte `off` of it.
    Object { id: u64, size: u32, off: u32 },
}

/// A run of visible bytes of a chunk: `len` bytes at `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub pos: u32,
    pub len: u32,
    pub source: Source,
}

impl Piece {
    fn end(&self) -> u32 {
        self.pos + self.len
    }

    /// The part of this piece from chunk position `from` on.
    fn from(&self, from: u32) -> Piece {
        debug_assert!(from >= self.pos && from < self.end());
        let skip = from - self.pos;
        Piece {
            pos: from,
            len: self.len - skip,
            source: match self.source {
                Source::Zeros => Source::Zeros,
                Source::Object { id, size, off } => Source::Object {
                    id,
                    size,
                    off: off + skip,
                },
            },
        }
    }

    /// The part of this piece before chunk position `to`.
    fn until(&self, to: u32) -> Piece {
        debug_assert!(to > self.pos && to <= self.end());
        Piece {
            len: to - self.pos,
            ..*self
        }
    }
}

/// The overlay of `slices` (in commit order): disjoint pieces in position order. Ranges no
/// record covers are absent (they read as zeros, as holes do).
pub fn view(slices: &[Slice]) -> Vec<Piece> {
    let mut pieces: BTreeMap<u32, Piece> = BTreeMap::new();
    for slice in slices {
        let new = Piece {
            pos: slice.pos,
            len: slice.len,
            source: if slice.id == HOLE {
                Source::Zeros
            } else {
                Source::Object {
                    id: slice.id,
                    size: slice.size,
                    off: slice.off,
                }
            },
        };
        if new.len == 0 {
            continue;
        }
        // The piece starting before the new one may reach into it (or across it).
        if let Some((_, before)) = pieces.range(..new.pos).next_back()
            && before.end() > new.pos
        {
            let before = *before;
            pieces.insert(before.pos, before.until(new.pos));
            if before.end() > new.end() {
                let after = before.from(new.end());
                pieces.insert(after.pos, after);
            }
        }
        // Pieces starting inside the new one are covered, the last perhaps in part.
        let inside: Vec<u32> = pieces
            .range(new.pos..new.end())
            .map(|(pos, _)| *pos)
            .collect();
        for pos in inside {
            let covered = pieces.remove(&pos).expect("listed");
            if covered.end() > new.end() {
                let after = covered.from(new.end());
                pieces.insert(after.pos, after);
            }
        }
        pieces.insert(new.pos, new);
    }
    pieces.into_values().collect()
}

/// The pieces of `view` inside `[from, to)` of the chunk, cut to it.
pub fn pieces_in(view: &[Piece], from: u32, to: u32) -> Vec<Piece> {
    let first = view.partition_point(|p| p.end() <= from);
    view[first..]
        .iter()
        .take_while(|p| p.pos < to)
        .map(|p| {
            let p = if p.pos < from { p.from(from) } else { *p };
            if p.end() > to { p.until(to) } else { p }
        })
        .collect()
}

/// The end of the last byte any record of the chunk places (0 when none does).
pub fn extent(slices: &[Slice]) -> u64 {
    slices.iter().map(Slice::end).max().unwrap_or(0)
}

/// Cuts a chunk's records to its first `keep` bytes (a truncate): records wholly past it are
/// dropped (returned), records across it are shortened.
pub fn clip(slices: &[Slice], keep: u32) -> (Vec<Slice>, Vec<Slice>) {
    let mut kept = Vec::with_capacity(slices.len());
    let mut dropped = Vec::new();
    for slice in slices {
        if slice.pos >= keep {
            dropped.push(*slice);
        } else if slice.end() > u64::from(keep) {
            kept.push(Slice {
                len: keep - slice.pos,
                ..*slice
            });
        } else {
            kept.push(*slice);
        }
    }
    (kept, dropped)
}

/// Where `len` bytes at file offset `offset` fall: `(chunk index, position in the chunk,
/// length)` per chunk, in order.
pub fn split(offset: u64, len: u64) -> Vec<(u64, u32, u32)> {
    let mut out = Vec::new();
    let (mut at, end) = (offset, offset.saturating_add(len));
    while at < end {
        let chunk = at / CHUNK_BYTES;
        let pos = at % CHUNK_BYTES;
        let n = (CHUNK_BYTES - pos).min(end - at);
        out.push((chunk, pos as u32, n as u32));
        at += n;
    }
    out
}

/// The blocks of a slice object of `size` bytes: `(block index, block length)`.
pub fn blocks(size: u32) -> impl Iterator<Item = (u32, u32)> {
    let size = u64::from(size);
    (0..size.div_ceil(BLOCK_BYTES)).map(move |b| {
        let start = b * BLOCK_BYTES;
        (b as u32, (size - start).min(BLOCK_BYTES) as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bytes of object `id`: a pattern no other object shares.
    fn object_byte(id: u64, at: u32) -> u8 {
        (id.wrapping_mul(31).wrapping_add(u64::from(at)) % 251) as u8 + 1
    }

    /// Reads a chunk of `len` bytes through its view.
    fn read_view(view: &[Piece], len: u32) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        for piece in pieces_in(view, 0, len) {
            if let Source::Object { id, off, .. } = piece.source {
                for i in 0..piece.len {
                    out[(piece.pos + i) as usize] = object_byte(id, off + i);
                }
            }
        }
        out
    }

    const LEN: u32 = 256;

    #[derive(Debug, Clone)]
    enum Step {
        Write { pos: u32, len: u32, off: u32 },
        Hole { pos: u32, len: u32 },
        Clip { keep: u32 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..LEN, 1..64u32, 0..16u32).prop_map(|(pos, len, off)| Step::Write {
                pos,
                len: len.min(LEN - pos),
                off
            }),
            1 => (0..LEN, 1..64u32).prop_map(|(pos, len)| Step::Hole {
                pos,
                len: len.min(LEN - pos)
            }),
            1 => (0..LEN).prop_map(|keep| Step::Clip { keep }),
        ]
    }

    proptest! {
        /// The overlay of records equals writing each record's bytes, in order, into a plain
        /// byte array (holes and truncates write zeros); the pieces are disjoint and sorted.
        #[test]
        fn the_view_reads_as_a_byte_array_written_in_order(steps in prop::collection::vec(step(), 1..40)) {
            let mut model = vec![0u8; LEN as usize];
            let mut slices: Vec<Slice> = Vec::new();
            let mut next_id = 1;
            for step in steps {
                match step {
                    Step::Write { pos, len, off } => {
                        let id = next_id;
                        next_id += 1;
                        for i in 0..len {
                            model[(pos + i) as usize] = object_byte(id, off + i);
                        }
                        slices.push(Slice { id, size: off + len, off, len, pos });
                    }
                    Step::Hole { pos, len } => {
                        model[pos as usize..(pos + len) as usize].fill(0);
                        slices.push(Slice::hole(pos, len));
                    }
                    Step::Clip { keep } => {
                        model[keep as usize..].fill(0);
                        let (kept, dropped) = clip(&slices, keep);
                        prop_assert_eq!(kept.len() + dropped.len(), slices.len());
                        prop_assert!(dropped.iter().all(|s| s.pos >= keep));
                        slices = kept;
                        prop_assert!(extent(&slices) <= u64::from(keep));
                    }
                }
                for s in &slices {
                    prop_assert!(s.check().is_ok(), "{:?}", s);
                }
                let view = view(&slices);
                for pair in view.windows(2) {
                    prop_assert!(pair[0].end() <= pair[1].pos, "{:?}", pair);
                }
                prop_assert_eq!(read_view(&view, LEN), model.clone());
                let decoded = decode_chunk(&encode_chunk(&slices)).unwrap();
                prop_assert_eq!(decoded, slices.clone());
            }
        }

        /// A window of the view reads as the same window of the whole.
        #[test]
        fn pieces_in_a_window_are_the_window_of_the_view(
            writes in prop::collection::vec((0..LEN, 1..64u32), 1..20),
            from in 0..LEN,
            width in 1..LEN,
        ) {
            let slices: Vec<Slice> = writes
                .iter()
                .enumerate()
                .map(|(i, (pos, len))| {
                    let len = (*len).min(LEN - pos);
                    Slice { id: i as u64 + 1, size: len, off: 0, len, pos: *pos }
                })
                .collect();
            let view = view(&slices);
            let to = (from + width).min(LEN);
            let whole = read_view(&view, LEN);
            let mut window = vec![0u8; LEN as usize];
            for piece in pieces_in(&view, from, to) {
                prop_assert!(piece.pos >= from && piece.end() <= to);
                if let Source::Object { id, off, .. } = piece.source {
                    for i in 0..piece.len {
                        window[(piece.pos + i) as usize] = object_byte(id, off + i);
                    }
                }
            }
            prop_assert_eq!(&window[from as usize..to as usize], &whole[from as usize..to as usize]);
        }
    }

    #[test]
    fn splits_fall_on_chunk_ends() {
        assert_eq!(split(5, 10), vec![(0, 5, 10)]);
        assert_eq!(
            split(CHUNK_BYTES - 3, 10),
            vec![(0, (CHUNK_BYTES - 3) as u32, 3), (1, 0, 7)]
        );
        assert!(split(7, 0).is_empty());
        let blocks: Vec<_> = blocks((BLOCK_BYTES + 5) as u32).collect();
        assert_eq!(blocks, vec![(0, BLOCK_BYTES as u32), (1, 5)]);
        assert_eq!(blocks_of(0), 0);
    }

    fn blocks_of(size: u32) -> usize {
        blocks(size).count()
    }

    #[test]
    fn bad_records_are_refused() {
        let ok = Slice {
            id: 3,
            size: 10,
            off: 2,
            len: 8,
            pos: 0,
        };
        assert!(ok.check().is_ok());
        assert!(Slice { len: 0, ..ok }.check().is_err());
        assert!(Slice { len: 9, ..ok }.check().is_err(), "past the object");
        assert!(
            Slice {
                pos: CHUNK_BYTES as u32 - 4,
                ..ok
            }
            .check()
            .is_err(),
            "past the chunk"
        );
        assert!(Slice::hole(0, 100).check().is_ok());
        assert!(decode_chunk(&[0u8; 25]).is_err());
    }
}
