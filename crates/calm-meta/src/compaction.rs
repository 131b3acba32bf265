//! Which records of a chunk a compaction replaces, and by what. Pure: no store, no objects.
//!
//! A chunk's records only grow with writes; compaction keeps their number, and so a map's
//! size and a read's cost, bounded, with bounded work per byte written:
//!
//! - A record every byte of which later records cover is invisible: it goes for free (a file
//!   rewritten whole leaves nothing behind but its last version).
//! - The newest records are merged into one new slice holding the chunk's visible bytes over
//!   the range they span (bytes of older records showing through gaps included). The run starts
//!   at the oldest record that is not more than twice the size of everything newer than it, so
//!   merged slices grow geometrically, as the levels of a log-structured tree: a log appended
//!   line by line has each byte written again about log2(size / line) times, not once per
//!   compaction.
//! - A merge is worth it when the bytes it writes are at most [`COMPACT_WRITE_FACTOR`] times
//!   the bytes of the newer records it folds in (plus [`COMPACT_WRITE_FREE_BYTES`], so small
//!   files always compact), or when the chunk has [`CHUNK_SLICES_COMPACT_ALWAYS`] records:
//!   small writes scattered over a large file wait until enough of them have come to pay for
//!   rewriting it.
//!
//! The plan replaces the records a compaction read, which are a prefix of the chunk when it
//! commits: records added meanwhile stay on top, untouched, so a stream of writers never
//! starves the compactor (see `crate::ops::data::compact`).

use std::collections::BTreeMap;

use crate::slices::{Slice, is_inline};

/// Records in one chunk past which a write asks for the chunk to be compacted.
pub const CHUNK_SLICES_COMPACT: usize = 32;
pub use crate::slices::CHUNK_SLICES_COMPACT_ALWAYS;
/// A merge writes at most this many bytes per byte of the newer records it folds in…
pub const COMPACT_WRITE_FACTOR: u64 = 8;
/// …plus this many: a file of up to this size is compacted whenever it passes
/// [`CHUNK_SLICES_COMPACT`] records, so its reads never gather many small objects.
pub const COMPACT_WRITE_FREE_BYTES: u64 = 1 << 20;

const _: () = assert!(CHUNK_SLICES_COMPACT < CHUNK_SLICES_COMPACT_ALWAYS);

/// What a compaction does with the records it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The records read that stay, in their order.
    pub kept: Vec<Slice>,
    /// The range `(pos, len)` of the chunk a new slice takes, placed after `kept` (and under
    /// every record added since the read): the chunk's visible bytes there, as read.
    pub merge: Option<(u32, u32)>,
    /// The records read that go (their objects are released).
    pub dropped: Vec<Slice>,
}

impl Plan {
    /// Bytes the new slice holds.
    pub fn merged_bytes(&self) -> u64 {
        self.merge.map_or(0, |(_, len)| u64::from(len))
    }
}

/// Which records of `records` (a chunk's, in commit order) are invisible: every byte of them
/// is covered by later records.
pub fn hidden(records: &[Slice]) -> Vec<bool> {
    // Disjoint covered ranges, start → end, of the records seen so far (from the newest).
    let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out = vec![false; records.len()];
    for (i, record) in records.iter().enumerate().rev() {
        let (start, end) = (u64::from(record.pos), record.end());
        out[i] = covered
            .range(..=start)
            .next_back()
            .is_some_and(|(_, e)| *e >= end);
        if out[i] {
            continue;
        }
        // Merge [start, end) with the ranges it touches.
        let (mut from, mut to) = (start, end);
        if let Some((s, e)) = covered.range(..=start).next_back()
            && *e >= start
        {
            from = *s;
            to = to.max(*e);
        }
        let touching: Vec<u64> = covered.range(from..=to).map(|(s, _)| *s).collect();
        for s in touching {
            let e = covered.remove(&s).expect("listed");
            to = to.max(e);
        }
        covered.insert(from, to);
    }
    out
}

/// The plan for a chunk holding `records`, or `None` when nothing is worth doing. With
/// `force` (a writer waits for room), the newest records are merged whatever it costs.
pub fn plan(records: &[Slice], force: bool) -> Option<Plan> {
    let hidden = hidden(records);
    let visible = visible(records, &hidden);
    let merge = choose_merge(
        &visible,
        force || records.len() >= CHUNK_SLICES_COMPACT_ALWAYS,
    );
    plan_with(records, &hidden, merge)
}

/// The plan that leaves no inline record in the chunk (a chunk the file's end has left:
/// appends keep their bytes inline in the chunk they land in, and these go into an object
/// once the file moves on): the newest run of records is merged from the oldest visible
/// inline record on (for a log, its last lines: the chunk's older merged slices stay as
/// they are). `None` when the chunk holds no inline record.
pub fn plan_flush(records: &[Slice]) -> Option<Plan> {
    let hidden = hidden(records);
    if !records.iter().any(|r| is_inline(r.id)) {
        return None;
    }
    let visible = visible(records, &hidden);
    let Some(oldest_inline) = visible.iter().position(|r| is_inline(r.id)) else {
        // Every inline record is hidden: dropping them is the whole plan.
        return plan_with(records, &hidden, None);
    };
    let (start, end) = visible[oldest_inline..]
        .iter()
        .fold((u64::MAX, 0), |(s, e), r| {
            (s.min(u64::from(r.pos)), e.max(r.end()))
        });
    plan_with(records, &hidden, Some((oldest_inline, start, end)))
}

/// The records of `records` that `hidden` does not mark.
fn visible(records: &[Slice], hidden: &[bool]) -> Vec<Slice> {
    records
        .iter()
        .zip(hidden)
        .filter(|(_, h)| !**h)
        .map(|(r, _)| *r)
        .collect()
}

/// The plan that merges the visible records from `merge`'s first index on over its range
/// (`None`: no merge) and drops hidden records; `None` when it would change nothing.
fn plan_with(records: &[Slice], hidden: &[bool], merge: Option<(usize, u64, u64)>) -> Option<Plan> {
    let any_hidden = hidden.iter().any(|h| *h);
    if merge.is_none() && !any_hidden {
        return None;
    }
    let visible_count = hidden.iter().filter(|h| !**h).count();
    let mut kept = Vec::with_capacity(visible_count);
    let mut dropped = Vec::new();
    let (first, range) = merge.map_or((visible_count, None), |(first, pos, end)| {
        (first, Some((pos, end)))
    });
    let mut seen_visible = 0;
    for (record, hidden) in records.iter().zip(hidden) {
        let index = seen_visible;
        if !hidden {
            seen_visible += 1;
        }
        let under_merge = range.is_some_and(|(pos, end)| {
            index >= first || (u64::from(record.pos) >= pos && record.end() <= end)
        });
        if *hidden || under_merge {
            dropped.push(*record);
        } else {
            kept.push(*record);
        }
    }
    Some(Plan {
        kept,
        merge: range.map(|(pos, end)| (pos as u32, (end - pos) as u32)),
        dropped,
    })
}

/// The run of `visible` records to merge: `(first index, start, end)` of the range it spans,
/// or `None` when no merge is worth it (see the module's rules).
fn choose_merge(visible: &[Slice], whatever_it_costs: bool) -> Option<(usize, u64, u64)> {
    let n = visible.len();
    if n < 2 {
        return None;
    }
    // span[k]: the range records k.. cover, from its lowest start to its highest end.
    let mut span = vec![(u64::MAX, 0u64); n + 1];
    for k in (0..n).rev() {
        let (s, e) = span[k + 1];
        span[k] = (s.min(u64::from(visible[k].pos)), e.max(visible[k].end()));
    }
    let width = |k: usize| span[k].1.saturating_sub(span[k].0);
    let mut first = 0;
    while first + 2 < n && width(first) > 2 * width(first + 1) {
        first += 1;
    }
    let cost = width(first);
    let newer: u64 = visible[first + 1..].iter().map(|r| u64::from(r.len)).sum();
    let worth = cost <= COMPACT_WRITE_FACTOR.saturating_mul(newer) + COMPACT_WRITE_FREE_BYTES;
    (worth || whatever_it_costs).then_some((first, span[first].0, span[first].1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::{HOLE, INLINE, Source, pieces_in, view};
    use proptest::prelude::*;

    fn object_byte(id: u64, at: u32) -> u8 {
        (id.wrapping_mul(31).wrapping_add(u64::from(at)) % 251) as u8 + 1
    }

    /// The bytes a chunk of `len` bytes reads (zeros where nothing is placed); the new slice of
    /// a plan reads as `merged`.
    fn read(records: &[Slice], len: u32, merged: Option<(u64, &[u8])>) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        for piece in pieces_in(&view(records), 0, len) {
            match piece.source {
                Source::Object { id, off, .. } if Some(id) == merged.map(|m| m.0) => {
                    let bytes = merged.expect("merged").1;
                    out[piece.pos as usize..(piece.pos + piece.len) as usize]
                        .copy_from_slice(&bytes[off as usize..(off + piece.len) as usize]);
                }
                Source::Object { id, off, .. } => {
                    for i in 0..piece.len {
                        out[(piece.pos + i) as usize] = object_byte(id, off + i);
                    }
                }
                Source::Zeros => {}
            }
        }
        out
    }

    /// Applies `plan` to the records read, with `later` records added meanwhile on top;
    /// returns the new records and the new slice's bytes.
    fn apply(read: &[Slice], later: &[Slice], plan: &Plan, new_id: u64) -> (Vec<Slice>, Vec<u8>) {
        let mut out = plan.kept.clone();
        let mut bytes = Vec::new();
        if let Some((pos, len)) = plan.merge {
            let whole = super::tests::read(read, pos + len, None);
            bytes = whole[pos as usize..].to_vec();
            out.push(Slice {
                id: new_id,
                size: len,
                off: 0,
                len,
                pos,
            });
        }
        out.extend_from_slice(later);
        (out, bytes)
    }

    const LEN: u32 = 512;

    /// `records` as records added after a compaction read the chunk (ids none of it has).
    fn added_later(records: Vec<Slice>) -> Vec<Slice> {
        records
            .into_iter()
            .map(|s| {
                if s.id == HOLE {
                    s
                } else {
                    Slice {
                        id: s.id + 1000,
                        ..s
                    }
                }
            })
            .collect()
    }

    /// What the chunk reads before `plan` is applied to `read_records`, and after (`later`
    /// added meanwhile on top both times).
    fn read_before_and_after(
        read_records: &[Slice],
        later: &[Slice],
        plan: &Plan,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut all: Vec<Slice> = read_records.to_vec();
        all.extend_from_slice(later);
        let before = read(&all, LEN, None);
        let (after_records, merged) = apply(read_records, later, plan, 999_999);
        let after = read(&after_records, LEN, Some((999_999, &merged)));
        (before, after)
    }

    fn record(id: u64, pos: u32, len: u32, off: u32, hole: bool) -> Slice {
        let len = len.min(LEN - pos).max(1);
        if hole {
            Slice::hole(pos, len)
        } else {
            Slice {
                id,
                size: off + len,
                off,
                len,
                pos,
            }
        }
    }

    fn records(count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Slice>> {
        prop::collection::vec(
            (0..LEN - 1, 1..200u32, 0..8u32, prop::bool::weighted(0.1)),
            count,
        )
        .prop_map(|raw| {
            raw.into_iter()
                .enumerate()
                .map(|(i, (pos, len, off, hole))| record(i as u64 + 1, pos, len, off, hole))
                .collect()
        })
    }

    proptest! {
        /// Whatever the plan, the chunk reads the same before and after it, with records
        /// added after the read on top; the records read are kept or dropped, each once; the
        /// plan leaves fewer records.
        #[test]
        fn a_plan_never_changes_what_the_chunk_reads(
            read_records in records(2..80),
            later in records(0..5),
            force in any::<bool>(),
        ) {
            let later = added_later(later);
            let Some(plan) = plan(&read_records, force) else {
                prop_assert!(!force, "a forced plan always merges");
                prop_assert!(hidden(&read_records).iter().all(|h| !h));
                return Ok(());
            };
            prop_assert_eq!(plan.kept.len() + plan.dropped.len(), read_records.len());
            prop_assert!(plan.kept.len() + usize::from(plan.merge.is_some()) < read_records.len());
            let mut kept = plan.kept.iter().peekable();
            for r in &read_records {
                if kept.peek() == Some(&r) {
                    kept.next();
                }
            }
            prop_assert!(kept.next().is_none(), "kept records are read records in order");
            let (before, after) = read_before_and_after(&read_records, &later, &plan);
            prop_assert_eq!(before, after);
        }

        /// A flush leaves no inline record of those read, and the chunk reads the same, with
        /// records added after the read on top.
        #[test]
        fn a_flush_leaves_no_inline_record_and_changes_no_byte(
            read_records in records(1..80),
            inline in prop::collection::vec(prop::bool::weighted(0.3), 80),
            later in records(0..5),
        ) {
            let read_records: Vec<Slice> = read_records
                .into_iter()
                .zip(&inline)
                .map(|(s, i)| if *i && s.id != HOLE { Slice { id: s.id | INLINE, ..s } } else { s })
                .collect();
            let later = added_later(later);
            let Some(plan) = plan_flush(&read_records) else {
                prop_assert!(read_records.iter().all(|r| !is_inline(r.id)));
                return Ok(());
            };
            prop_assert_eq!(plan.kept.len() + plan.dropped.len(), read_records.len());
            prop_assert!(plan.kept.iter().all(|r| !is_inline(r.id)), "{:?}", plan);
            let (before, after) = read_before_and_after(&read_records, &later, &plan);
            prop_assert_eq!(before, after);
        }

        /// A record is hidden exactly when every byte of it is covered by later records.
        #[test]
        fn hidden_records_are_those_later_records_cover(records in records(1..40)) {
            let hidden = hidden(&records);
            for (i, r) in records.iter().enumerate() {
                let mut covered = vec![false; LEN as usize];
                for later in &records[i + 1..] {
                    covered[later.pos as usize..later.end() as usize].fill(true);
                }
                let all = covered[r.pos as usize..r.end() as usize].iter().all(|c| *c);
                prop_assert_eq!(hidden[i], all, "record {} {:?}", i, r);
            }
        }
    }

    /// Writes of `(pos, len)` applied one by one, with a compaction each time the chunk passes
    /// [`CHUNK_SLICES_COMPACT`], as the server runs them: (bytes written by compactions, most
    /// records the chunk held).
    fn simulate(writes: impl Iterator<Item = (u32, u32)>) -> (u64, u64, usize) {
        let (mut records, mut next_id) = (Vec::new(), 1u64);
        let (mut written, mut compacted, mut most) = (0u64, 0u64, 0usize);
        let mut new_slice = |pos, len| {
            next_id += 1;
            Slice {
                id: next_id - 1,
                size: len,
                off: 0,
                len,
                pos,
            }
        };
        for (pos, len) in writes {
            written += u64::from(len);
            records.push(new_slice(pos, len));
            most = most.max(records.len());
            if records.len() > CHUNK_SLICES_COMPACT
                && let Some(plan) = plan(&records, false)
            {
                records = plan.kept.clone();
                if let Some((pos, len)) = plan.merge {
                    compacted += u64::from(len);
                    records.push(new_slice(pos, len));
                }
            }
        }
        (written, compacted, most)
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// The costs the module's rules promise, on the shapes that broke before: a log, small
    /// writes scattered over a database file, a file rewritten whole.
    #[test]
    fn compaction_work_and_records_stay_bounded() {
        // A log: 100 000 lines of 20 to 200 bytes.
        let mut seed = 1;
        let mut end = 0u32;
        let log = (0..100_000).map(|_| {
            let len = 20 + lcg(&mut seed) % 180;
            end += len;
            (end - len, len)
        });
        let (written, compacted, most) = simulate(log);
        assert!(most <= CHUNK_SLICES_COMPACT + 1, "log: {most} records");
        assert!(
            compacted <= 12 * written,
            "log: {compacted} bytes for {written}"
        );

        // 20 000 writes of 1 to 200 bytes at random places of a 4 MiB file.
        let scattered = (0..20_000).map(|_| {
            let len = 1 + lcg(&mut seed) % 200;
            ((lcg(&mut seed) % (4 << 20)).min((4 << 20) - len), len)
        });
        let (written, compacted, most) = simulate(scattered);
        assert!(
            most <= CHUNK_SLICES_COMPACT_ALWAYS,
            "scattered: {most} records"
        );
        assert!(
            compacted <= 64 * written,
            "scattered: {compacted} for {written}"
        );

        // 4 KiB pages at random places of the same file: as many bytes merged as written.
        let pages = (0..20_000).map(|_| ((lcg(&mut seed) % 1024) * 4096, 4096));
        let (written, compacted, most) = simulate(pages);
        assert!(most <= 256, "pages: {most} records");
        assert!(
            compacted <= 12 * written,
            "pages: {compacted} for {written}"
        );

        // A 256 KiB file rewritten whole 10 000 times: nothing to merge, ever.
        let (_, compacted, most) = simulate((0..10_000).map(|_| (0, 256 << 10)));
        assert_eq!(compacted, 0);
        assert!(most <= CHUNK_SLICES_COMPACT + 1);
    }
}
