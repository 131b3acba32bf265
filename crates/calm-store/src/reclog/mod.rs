//! The record log of an LMDB store with a write-ahead log: the records of
//! [`crate::WriteTxn::log_append`] kept in segment files beside the B-tree instead of as keys
//! in it, so that appending one costs its bytes in the commit's log record and no B-tree page.
//!
//! Layout (directory `log/` of the store): segment `n` holds the records with indices
//! `n * S ..= n * S + S - 1` (S, the records per segment, is fixed for a store and kept in its
//! checkpoint slot) in two files. `<n:016x>.rec` holds the records' bytes back to back;
//! `<n:016x>.idx` holds one `u64` (little-endian) per slot `index % S`: the record's start
//! offset in `.rec` shifted left by [`LEN_BITS`], or'ed with its length; 0 for a slot without a
//! record (a record is never empty). Finding a record is two reads at computed offsets: nothing
//! is scanned, at start-up or ever.
//!
//! Durability: a commit's records are durable in its write-ahead log record; the commit only
//! adds them to memory (a chunk per commit, readers take them from there). Every checkpoint
//! writes the chunks since the last one to the segment files — one write per file and run
//! instead of two small writes per commit, which measurably slowed commits — makes them
//! durable (`fdatasync` of the segments written, and of the directory when files came or went)
//! and keeps the log's first and last index in its slot. Recovery starts from those bounds and
//! replays the log operations of the records after the checkpoint into memory; the next
//! checkpoint writes the same bytes at the same offsets as the lost one would have. A purge
//! moves the first index and, once committed, retires the segments wholly below it: up to
//! [`SPARE_SEGMENTS_MAX`] are renamed to spares, which the next new segments take (written
//! over from offset 0; what lies past the log's last record in a reused file is never read:
//! readers and the tail both go by the bounds), the others deleted. The next writable open
//! removes every spare and every segment file outside the log's bounds (a retirement lost to
//! a crash, or a segment a lost checkpoint made). Memory holds at most the records of one
//! checkpoint interval of the write-ahead log (`wal::SEGMENT_BYTES_MAX`, 16 MiB, and one
//! transaction).
//!
//! Readers see the bounds published by the last commit, and take records up to the last one
//! written to the files from the files, later ones from the chunks (shared, immutable).

use calm_types::sync::{Locked, RwLocked};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::disk::DiskFile;
use crate::{LogVisitor, Result, StoreError, VALUE_LEN_MAX};

mod flush;

/// The directory of the record log inside the store's directory.
pub(crate) const LOG_DIR: &str = "log";
/// Records per segment for a new store: with records of about 100 bytes, segments of 6–7 MB
/// and index files of 512 KiB.
pub const SEGMENT_RECORDS_DEFAULT: u64 = 1 << 16;
/// Most records per segment a store may ask for (an index file of 128 MiB).
pub const SEGMENT_RECORDS_MAX: u64 = 1 << 24;
/// Bits of an index entry that hold the record's length.
const LEN_BITS: u32 = 24;
const _: () = assert!(VALUE_LEN_MAX < 1 << LEN_BITS);
/// Purged segments kept for reuse (renamed `spare-<k>.rec`/`.idx`, `k` below this) instead of
/// deleted. The purge runs on the commit path, and deleting a segment's two files (6 MB) took
/// 1.4–1.9 ms there on the test machine (ext4 mounted with `discard`: the freed blocks are
/// discarded) and slowed the next `fdatasync`s by about 0.5 ms in all; renaming them took
/// 0.03 ms. A new segment takes a spare when one is free, and then also overwrites blocks its
/// files already have. A purge that drops more segments at once than there is room for
/// deletes the rest.
pub const SPARE_SEGMENTS_MAX: usize = 2;
/// Most records, and about the most bytes, one read of a visit fetches.
const VISIT_RECORDS_MAX: u64 = 4096;
const VISIT_BYTES_MAX: u64 = 1 << 20;

/// An I/O error as the store reports it: ENOSPC from anything but a sync is
/// [`StoreError::Full`] (Linux's local file systems reserve space when data is written, so a
/// write that fails for room wrote nothing that counts, and the commit can be tried again);
/// a failed sync is never `Full`, whatever its errno, because the kernel may have dropped the
/// dirty pages it could not write (the caller poisons the store).
fn io(what: &str, path: &Path, error: std::io::Error) -> StoreError {
    if error.raw_os_error() == Some(28) && !what.starts_with("syncing") {
        return StoreError::Full(format!("{what} {}: {error}", path.display()));
    }
    StoreError::Io(format!("{what} {}: {error}", path.display()))
}

/// First and last index of the log; it holds no record when `first > last`. `last` stays
/// the last index ever appended when a purge empties the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub first: u64,
    pub last: u64,
}

impl Bounds {
    pub const EMPTY: Bounds = Bounds { first: 1, last: 0 };

    pub fn is_empty(&self) -> bool {
        self.first > self.last
    }

    /// The first index, when the log holds a record.
    pub fn first_record(&self) -> Option<u64> {
        (!self.is_empty()).then_some(self.first)
    }

    /// The last index, when the log holds a record.
    pub fn last_record(&self) -> Option<u64> {
        (!self.is_empty()).then_some(self.last)
    }

    /// Checks `index` for an append: above `last`, and right after it unless the log is
    /// empty.
    pub fn check_append(&self, index: u64) -> Result<()> {
        if index <= self.last || (!self.is_empty() && index != self.last + 1) {
            return Err(StoreError::Limit(format!(
                "log append of index {index} after {}: indices must follow the last one",
                self.last
            )));
        }
        Ok(())
    }

    /// The bounds after appending `index` (checked).
    pub fn appended(self, index: u64) -> Bounds {
        Bounds {
            first: if self.is_empty() { index } else { self.first },
            last: index,
        }
    }

    /// The bounds after purging every index up to `upto`.
    pub fn purged(self, upto: u64) -> Bounds {
        Bounds {
            first: self.first.max(upto.min(self.last).saturating_add(1)),
            last: self.last,
        }
    }
}

/// One change to the log, as a transaction makes it and the write-ahead log replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogOp {
    Append { index: u64, record: Vec<u8> },
    Purge { upto: u64 },
}

struct Segment {
    rec: DiskFile,
    idx: DiskFile,
}

/// Records with consecutive indices from `first`, back to back (one commit's appends).
struct Chunk {
    first: u64,
    bytes: Vec<u8>,
    /// End offset in `bytes` of each record.
    ends: Vec<usize>,
}

impl Chunk {
    fn last(&self) -> u64 {
        self.first + self.ends.len() as u64 - 1
    }

    fn record(&self, index: u64) -> &[u8] {
        let k = (index - self.first) as usize;
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        &self.bytes[start..self.ends[k]]
    }
}

struct State {
    bounds: Bounds,
    /// Records up to this index are in the segment files; later ones are in `recent`.
    flushed: u64,
    segments: BTreeMap<u64, Arc<Segment>>,
    /// Records appended since the last checkpoint, in index order.
    recent: Vec<Arc<Chunk>>,
}

/// What only the writer touches (the store's write lock held).
struct Writer {
    /// The segment of the last record written to the files and where its file ends.
    tail: Option<(u64, u64)>,
    /// Segment files came or went since the last checkpoint.
    dir_dirty: bool,
    /// Purged segments kept for reuse, by spare number (see [`SPARE_SEGMENTS_MAX`]). A spare
    /// is only reused once no reader holds it any more (a reader that found its segment
    /// before the purge may still be reading it): it is then written over.
    spares: Vec<(usize, Arc<Segment>)>,
}

impl Writer {
    /// Keeps the purged segment `number` as a spare when there is room (its files renamed);
    /// otherwise deletes its files.
    fn retire(&mut self, dir: &Path, number: u64, segment: Arc<Segment>) -> Result<()> {
        self.dir_dirty = true;
        if self.tail.is_some_and(|(n, _)| n == number) {
            self.tail = None;
        }
        let free = (0..SPARE_SEGMENTS_MAX).find(|k| self.spares.iter().all(|(s, _)| s != k));
        if let Some(k) = free {
            for ext in ["rec", "idx"] {
                let (from, to) = (dir.join(segment_name(number, ext)), spare_path(dir, k, ext));
                std::fs::rename(&from, &to).map_err(|e| io("renaming", &from, e))?;
            }
            self.spares.push((k, segment));
            return Ok(());
        }
        // Both files are tried: one that stays is removed by the next writable open.
        let mut outcome = Ok(());
        for ext in ["rec", "idx"] {
            let path = dir.join(segment_name(number, ext));
            let removed = std::fs::remove_file(&path).map_err(|e| io("removing", &path, e));
            outcome = outcome.and(removed);
        }
        outcome
    }

    /// A spare no reader holds, renamed to be segment `number`; `None` when there is none.
    fn reuse(&mut self, dir: &Path, number: u64) -> Result<Option<Arc<Segment>>> {
        let Some(at) = self
            .spares
            .iter()
            .position(|(_, segment)| Arc::strong_count(segment) == 1)
        else {
            return Ok(None);
        };
        let (k, segment) = self.spares.swap_remove(at);
        for ext in ["rec", "idx"] {
            let (from, to) = (spare_path(dir, k, ext), dir.join(segment_name(number, ext)));
            std::fs::rename(&from, &to).map_err(|e| io("renaming", &from, e))?;
        }
        self.dir_dirty = true;
        Ok(Some(segment))
    }
}

fn spare_path(dir: &Path, k: usize, ext: &str) -> PathBuf {
    dir.join(format!("spare-{k}.{ext}"))
}

/// The log of one store.
pub(crate) struct RecordLog {
    dir: PathBuf,
    /// The directory itself, open for syncing its entries; `None` for a read-only open.
    dir_file: Option<File>,
    segment_records: u64,
    state: RwLock<State>,
    writer: Mutex<Writer>,
}

impl std::fmt::Debug for RecordLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLog")
            .field("dir", &self.dir)
            .field("bounds", &self.bounds())
            .finish()
    }
}

/// A commit's log operations as it makes them: each checked against the bounds so far (the
/// published ones, then the commit's own changes), its records gathered into chunks, nothing
/// visible to readers until [`RecordLog::publish`].
pub(crate) struct Pending {
    bounds: Bounds,
    /// Whether an operation changed the bounds (an append always does).
    changed: bool,
    chunks: Vec<Chunk>,
}

impl Pending {
    /// Nothing yet, on top of `bounds`.
    pub fn new(bounds: Bounds) -> Pending {
        Pending {
            bounds,
            changed: false,
            chunks: Vec::new(),
        }
    }

    /// The bounds with this commit's operations.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Whether there is anything to publish.
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// Appends `record` at `index`, the next index, or refuses (nothing changes then).
    pub fn append(&mut self, index: u64, record: &[u8]) -> Result<()> {
        self.bounds.check_append(index)?;
        let chunk = match self.chunks.last_mut() {
            Some(chunk) if chunk.last() + 1 == index => chunk,
            _ => {
                self.chunks.push(Chunk {
                    first: index,
                    bytes: Vec::new(),
                    ends: Vec::new(),
                });
                self.chunks.last_mut().expect("a chunk")
            }
        };
        chunk.bytes.extend_from_slice(record);
        chunk.ends.push(chunk.bytes.len());
        self.bounds = self.bounds.appended(index);
        self.changed = true;
        Ok(())
    }

    /// Purges every index up to `upto`; returns whether that moved the first index.
    pub fn purge(&mut self, upto: u64) -> bool {
        let purged = self.bounds.purged(upto);
        let moved = purged != self.bounds;
        self.bounds = purged;
        self.changed |= moved;
        moved
    }

    /// Visits this commit's own records from `from` on (not below the first index), in
    /// order, until `visit` stops; returns how many it visited.
    pub fn visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> usize {
        let from = from.max(self.bounds.first);
        let mut count = 0;
        for chunk in &self.chunks {
            for index in from.max(chunk.first)..=chunk.last() {
                count += 1;
                if visit(index, chunk.record(index)).is_break() {
                    return count;
                }
            }
        }
        count
    }
}

fn segment_name(number: u64, ext: &str) -> String {
    format!("{number:016x}.{ext}")
}

fn entry(start: u64, len: u64) -> u64 {
    (start << LEN_BITS) | len
}

fn read_exact(file: &DiskFile, buf: &mut [u8], at: u64, path: &Path) -> Result<()> {
    file.read_exact_at(buf, at)
        .map_err(|e| io("reading", path, e))
}

impl RecordLog {
    /// Opens the log of the store in `dir` at `bounds` (from the checkpoint slot). A writable
    /// open creates the directory and removes every segment file outside the bounds (purged,
    /// or written by a commit that never completed).
    pub fn open(
        dir: &Path,
        bounds: Bounds,
        segment_records: u64,
        writable: bool,
    ) -> Result<RecordLog> {
        if !(1..=SEGMENT_RECORDS_MAX).contains(&segment_records) {
            return Err(StoreError::Io(format!(
                "record log of {segment_records} records per segment (1 to {SEGMENT_RECORDS_MAX})"
            )));
        }
        let dir = dir.join(LOG_DIR);
        if writable {
            std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        }
        // The segments that may hold records: from the first's to the last's. An empty log
        // keeps the last's segment when the next append goes there.
        let keep_from = bounds.first / segment_records;
        let keep_to = bounds.last.max(bounds.first) / segment_records;
        let mut segments = BTreeMap::new();
        let listing = match std::fs::read_dir(&dir) {
            Ok(listing) => Some(listing),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !writable => None,
            Err(e) => return Err(io("listing", &dir, e)),
        };
        for item in listing.into_iter().flatten() {
            let item = item.map_err(|e| io("listing", &dir, e))?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            let Some(number) = name
                .strip_suffix(".rec")
                .or_else(|| name.strip_suffix(".idx"))
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                // Spares of the last run hold nothing: a writable open starts without them.
                if writable && name.starts_with("spare-") {
                    let path = item.path();
                    std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
                }
                continue;
            };
            if (keep_from..=keep_to).contains(&number) {
                if name.ends_with(".rec") {
                    segments.insert(number, Arc::new(open_segment(&dir, number, writable)?));
                }
            } else if writable {
                let path = item.path();
                std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
            }
        }
        let dir_file = match writable {
            true => Some(File::open(&dir).map_err(|e| io("opening", &dir, e))?),
            false => None,
        };
        let dir_file_present = dir_file.is_some();
        let log = RecordLog {
            dir,
            dir_file,
            segment_records,
            state: RwLock::new(State {
                bounds,
                flushed: bounds.last,
                segments: BTreeMap::new(),
                recent: Vec::new(),
            }),
            writer: Mutex::new(Writer {
                tail: None,
                dir_dirty: dir_file_present,
                spares: Vec::new(),
            }),
        };
        if !bounds.is_empty() {
            for number in bounds.first / segment_records..=bounds.last / segment_records {
                if !segments.contains_key(&number) {
                    return Err(StoreError::Io(format!(
                        "record log segment {} is missing (records {} to {} are in the log)",
                        log.dir.join(segment_name(number, "rec")).display(),
                        bounds.first,
                        bounds.last
                    )));
                }
            }
        }
        let tail_number = bounds.last / segment_records;
        let tail = match segments.get(&tail_number) {
            Some(segment) if bounds.last > 0 => {
                let (start, len) = log.entry(segment, bounds.last)?;
                Some((tail_number, start + len))
            }
            _ => None,
        };
        log.writer.locked().tail = tail;
        log.state.write_locked().segments = segments;
        Ok(log)
    }

    pub fn segment_records(&self) -> u64 {
        self.segment_records
    }

    /// The bounds the last commit published.
    pub fn bounds(&self) -> Bounds {
        self.state.read_locked().bounds
    }

    /// Runs `f` with the published bounds held still (a commit publishing waits).
    pub fn with_bounds<T>(&self, f: impl FnOnce(Bounds) -> T) -> T {
        let state = self.state.read_locked();
        f(state.bounds)
    }

    /// Bytes the log's files occupy.
    pub fn size_bytes(&self) -> Result<u64> {
        let state = self.state.read_locked();
        let mut total = 0;
        for segment in state.segments.values() {
            for file in [&segment.rec, &segment.idx] {
                total += file.len().map_err(|e| io("reading", &self.dir, e))?;
            }
        }
        Ok(total)
    }

    /// Start and length of record `index` in `segment`; an empty slot is an error (the
    /// caller only asks for indices inside the bounds).
    fn entry(&self, segment: &Segment, index: u64) -> Result<(u64, u64)> {
        let mut bytes = [0u8; 8];
        let path = self
            .dir
            .join(segment_name(index / self.segment_records, "idx"));
        read_exact(
            &segment.idx,
            &mut bytes,
            (index % self.segment_records) * 8,
            &path,
        )?;
        let value = u64::from_le_bytes(bytes);
        if value == 0 {
            return Err(StoreError::Io(format!(
                "record log: record {index} is missing from {}",
                path.display()
            )));
        }
        Ok((value >> LEN_BITS, value & ((1 << LEN_BITS) - 1)))
    }

    /// Calls `visit` for the records `from..=bounds.last` (and at or above `bounds.first`)
    /// in order; records whose segment a later purge removed are skipped.
    pub fn visit(&self, bounds: Bounds, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        let mut index = from.max(bounds.first);
        let mut count = 0;
        while index <= bounds.last {
            let number = index / self.segment_records;
            let segment_end = (number + 1) * self.segment_records - 1;
            // Where the record is now: in the files, or in memory (a checkpoint may move it
            // from memory to the files between two steps; each step looks again).
            let (flushed, segment, chunk) = {
                let state = self.state.read_locked();
                if index <= state.flushed {
                    (state.flushed, state.segments.get(&number).cloned(), None)
                } else {
                    let at = state.recent.partition_point(|c| c.last() < index);
                    (state.flushed, None, state.recent.get(at).cloned())
                }
            };
            if index > flushed {
                let chunk = chunk.filter(|c| c.first <= index).ok_or_else(|| {
                    StoreError::Io(format!("record log: record {index} is not in memory"))
                })?;
                while index <= bounds.last.min(chunk.last()) {
                    count += 1;
                    if visit(index, chunk.record(index)).is_break() {
                        return Ok(count);
                    }
                    index += 1;
                }
                continue;
            }
            let Some(segment) = segment else {
                // Purged since the snapshot: its records are gone.
                index = segment_end + 1;
                continue;
            };
            let upto = bounds
                .last
                .min(flushed)
                .min(segment_end)
                .min(index + VISIT_RECORDS_MAX - 1);
            let idx_path = self.dir.join(segment_name(number, "idx"));
            let mut raw = vec![0u8; ((upto - index + 1) * 8) as usize];
            read_exact(
                &segment.idx,
                &mut raw,
                (index % self.segment_records) * 8,
                &idx_path,
            )?;
            let mut entries = Vec::with_capacity(raw.len() / 8);
            for (i, chunk) in raw.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                if value == 0 {
                    return Err(StoreError::Io(format!(
                        "record log: record {} is missing from {}",
                        index + i as u64,
                        idx_path.display()
                    )));
                }
                let (start, len) = (value >> LEN_BITS, value & ((1 << LEN_BITS) - 1));
                // One read per run of contiguous records, of about VISIT_BYTES_MAX at most.
                if let Some(&(first_start, _)) = entries.first()
                    && (start + len - first_start > VISIT_BYTES_MAX)
                {
                    break;
                }
                entries.push((start, len));
            }
            let span_start = entries[0].0;
            let (last_start, last_len) = *entries.last().expect("one entry at least");
            let mut bytes = vec![0u8; (last_start + last_len - span_start) as usize];
            read_exact(
                &segment.rec,
                &mut bytes,
                span_start,
                &self.dir.join(segment_name(number, "rec")),
            )?;
            for (start, len) in entries {
                count += 1;
                let at = (start - span_start) as usize;
                let record = bytes.get(at..at + len as usize).ok_or_else(|| {
                    StoreError::Io(format!("record log: record {index} lies outside its span"))
                })?;
                if visit(index, record).is_break() {
                    return Ok(count);
                }
                index += 1;
            }
        }
        Ok(count)
    }

    /// A commit's log operations on top of the published bounds, checked and gathered (a
    /// replayed commit's); nothing is visible until [`RecordLog::publish`].
    pub fn write(&self, ops: &[LogOp]) -> Result<Pending> {
        let mut pending = Pending::new(self.bounds());
        for op in ops {
            match op {
                LogOp::Purge { upto } => {
                    pending.purge(*upto);
                }
                LogOp::Append { index, record } => pending.append(*index, record)?,
            }
        }
        Ok(pending)
    }

    /// Runs `commit` (the commit that carries what `pending` gathered) and, when
    /// it succeeds, publishes its records at the same instant for readers (snapshots take the
    /// bounds under the same lock); then removes the segments a purge left wholly below the
    /// first index. When `commit` fails nothing is published.
    pub fn publish(&self, pending: Pending, commit: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut writer = self.writer.locked();
        let mut gone = Vec::new();
        {
            let mut state = self.state.write_locked();
            commit()?;
            state.bounds = pending.bounds;
            state
                .recent
                .extend(pending.chunks.into_iter().map(Arc::new));
            let below = pending.bounds.first / self.segment_records;
            while let Some((&number, _)) = state.segments.first_key_value() {
                if number >= below {
                    break;
                }
                let segment = state.segments.remove(&number).expect("the first segment");
                gone.push((number, segment));
            }
        }
        for (number, segment) in gone {
            if let Err(error) = writer.retire(&self.dir, number, segment) {
                // The segment lies below the first index: the next writable open removes it.
                tracing::warn!(%error, segment = number, "retiring a purged log segment");
            }
        }
        Ok(())
    }
}

fn open_segment(dir: &Path, number: u64, writable: bool) -> Result<Segment> {
    let open = |ext: &str| {
        let path = dir.join(segment_name(number, ext));
        DiskFile::open(
            &path,
            OpenOptions::new()
                .read(true)
                .write(writable)
                .create(writable)
                .truncate(false),
        )
        .map_err(|e| io("opening", &path, e))
    };
    Ok(Segment {
        rec: open("rec")?,
        idx: open("idx")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::ControlFlow;

    fn append(index: u64, record: &[u8]) -> LogOp {
        LogOp::Append {
            index,
            record: record.to_vec(),
        }
    }

    fn all(log: &RecordLog, from: u64) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        log.visit(log.bounds(), from, &mut |i, r| {
            out.push((i, r.to_vec()));
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn bounds_take_dense_appends_and_purges() {
        let b = Bounds::EMPTY;
        assert!(b.is_empty());
        b.check_append(7).unwrap();
        let b = b.appended(7);
        assert_eq!(b, Bounds { first: 7, last: 7 });
        assert!(b.check_append(9).is_err());
        assert!(b.check_append(7).is_err());
        let b = b.appended(8).purged(100);
        assert_eq!(b, Bounds { first: 9, last: 8 });
        assert!(b.is_empty());
        b.check_append(12).unwrap();
        assert_eq!(b.purged(3), b);
    }

    #[test]
    fn records_cross_segments_survive_reopen_and_purge_removes_whole_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 4, true).unwrap();
        let ops: Vec<LogOp> = (1..=10)
            .map(|i| append(i, format!("record {i}").as_bytes()))
            .collect();
        let written = log.write(&ops).unwrap();
        // Nothing is visible before publication.
        assert!(all(&log, 0).is_empty());
        log.publish(written, || Ok(())).unwrap();
        let records = all(&log, 3);
        assert_eq!(records.len(), 8);
        assert_eq!(records[0], (3, b"record 3".to_vec()));
        assert_eq!(records[7], (10, b"record 10".to_vec()));
        let bounds = log.sync().unwrap();
        drop(log);

        let log = RecordLog::open(dir.path(), bounds, 4, true).unwrap();
        assert_eq!(all(&log, 0).len(), 10);
        // Purging up to 8 retires segments 0 and 1 (indices 0..=7) as spares, keeps 2
        // (8..=11).
        let written = log
            .write(&[LogOp::Purge { upto: 8 }, append(11, b"eleven")])
            .unwrap();
        log.publish(written, || Ok(())).unwrap();
        assert_eq!(names(dir.path()), names_of(&[2], SPARE_SEGMENTS_MAX.min(2)));
        let records = all(&log, 0);
        assert_eq!(
            records.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![9, 10, 11]
        );
        assert_eq!(records[2].1, b"eleven");
    }

    /// The files of the log directory.
    fn names(dir: &Path) -> std::collections::BTreeSet<String> {
        std::fs::read_dir(dir.join(LOG_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// The files of `segments` and of spares `0..spares`.
    fn names_of(segments: &[u64], spares: usize) -> std::collections::BTreeSet<String> {
        let mut names = std::collections::BTreeSet::new();
        for ext in ["rec", "idx"] {
            names.extend(segments.iter().map(|&n| segment_name(n, ext)));
            names.extend((0..spares).map(|k| format!("spare-{k}.{ext}")));
        }
        names
    }

    #[test]
    fn purged_segments_are_reused_once_no_reader_holds_them() {
        const _: () = assert!(SPARE_SEGMENTS_MAX == 2);
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 4, true).unwrap();
        // Segments 0 to 3 (indices 1..=15), with long records: a reused file is longer than
        // what it gets again.
        let long = |i: u64| format!("an old and long record number {i}").into_bytes();
        let ops: Vec<LogOp> = (1..=15).map(|i| append(i, &long(i))).collect();
        log.publish(log.write(&ops).unwrap(), || Ok(())).unwrap();
        log.sync().unwrap();
        // A reader holds segment 0 (as a visit does between its reads).
        let held = log.state.read_locked().segments.get(&0).cloned().unwrap();
        // Purging up to 11 retires segments 0 and 1 as spares and deletes segment 2: there
        // is no room for a third spare.
        log.publish(log.write(&[LogOp::Purge { upto: 11 }]).unwrap(), || Ok(()))
            .unwrap();
        assert_eq!(names(dir.path()), names_of(&[3], 2));
        // Segment 4 takes the spare no reader holds (segment 1's files); segment 0's stays.
        let ops: Vec<LogOp> = (16..=19)
            .map(|i| append(i, format!("new {i}").as_bytes()))
            .collect();
        log.publish(log.write(&ops).unwrap(), || Ok(())).unwrap();
        let bounds = log.sync().unwrap();
        assert_eq!(names(dir.path()).len(), 6, "segments 3 and 4 and one spare");
        let expected: Vec<(u64, Vec<u8>)> = (12..=15)
            .map(|i| (i, long(i)))
            .chain((16..=19).map(|i| (i, format!("new {i}").into_bytes())))
            .collect();
        assert_eq!(all(&log, 0), expected);
        // The reader's view of its segment was not written over.
        let mut entry = [0u8; 8];
        held.idx.read_exact_at(&mut entry, 8).unwrap();
        let (start, len) = (
            u64::from_le_bytes(entry) >> LEN_BITS,
            u64::from_le_bytes(entry) & 0xFF_FFFF,
        );
        let mut record = vec![0u8; len as usize];
        held.rec.read_exact_at(&mut record, start).unwrap();
        assert_eq!(record, long(1));
        // Once the reader lets it go, segment 5 takes it.
        drop(held);
        let ops: Vec<LogOp> = (20..=23)
            .map(|i| append(i, format!("newer {i}").as_bytes()))
            .collect();
        log.publish(log.write(&ops).unwrap(), || Ok(())).unwrap();
        let bounds_later = log.sync().unwrap();
        assert_eq!(names(dir.path()), names_of(&[3, 4, 5], 0));
        assert_eq!(all(&log, 20).len(), 4);
        drop(log);
        // Reopened: the records are read from the reused files, stale bytes past them unseen.
        let log = RecordLog::open(dir.path(), bounds_later, 4, true).unwrap();
        assert_eq!(all(&log, 0).len(), 12);
        assert_eq!(all(&log, 23), vec![(23, b"newer 23".to_vec())]);
        assert!(bounds.last < bounds_later.last);
    }

    #[test]
    fn a_writable_open_removes_the_spares_of_the_last_run() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 4, true).unwrap();
        let ops: Vec<LogOp> = (1..=9).map(|i| append(i, b"record")).collect();
        log.publish(log.write(&ops).unwrap(), || Ok(())).unwrap();
        log.sync().unwrap();
        log.publish(log.write(&[LogOp::Purge { upto: 8 }]).unwrap(), || Ok(()))
            .unwrap();
        let bounds = log.sync().unwrap();
        assert_eq!(names(dir.path()), names_of(&[2], 2));
        drop(log);
        let log = RecordLog::open(dir.path(), bounds, 4, false).unwrap();
        assert_eq!(all(&log, 0), vec![(9, b"record".to_vec())]);
        drop(log);
        assert_eq!(
            names(dir.path()),
            names_of(&[2], 2),
            "a read-only open changes nothing"
        );
        let log = RecordLog::open(dir.path(), bounds, 4, true).unwrap();
        assert_eq!(names(dir.path()), names_of(&[2], 0));
        assert_eq!(all(&log, 0), vec![(9, b"record".to_vec())]);
    }

    #[test]
    fn an_unpublished_write_is_overwritten_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 8, true).unwrap();
        log.publish(log.write(&[append(1, b"one")]).unwrap(), || Ok(()))
            .unwrap();
        // A commit that failed after writing: never published.
        drop(log.write(&[append(2, b"lost record")]).unwrap());
        log.publish(log.write(&[append(2, b"two")]).unwrap(), || Ok(()))
            .unwrap();
        assert_eq!(
            all(&log, 0),
            vec![(1, b"one".to_vec()), (2, b"two".to_vec())]
        );
        assert!(log.write(&[append(4, b"gap")]).is_err());
    }

    #[test]
    fn records_purged_before_their_checkpoint_still_end_their_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 4, true).unwrap();
        log.publish(
            log.write(&[append(4, b"four"), append(5, b"five")])
                .unwrap(),
            || Ok(()),
        )
        .unwrap();
        log.sync().unwrap();
        // Appended and purged between two checkpoints: the log is empty, its last index 6.
        let written = log
            .write(&[append(6, b"six"), LogOp::Purge { upto: 6 }])
            .unwrap();
        log.publish(written, || Ok(())).unwrap();
        let bounds = log.sync().unwrap();
        assert_eq!(bounds, Bounds { first: 7, last: 6 });
        drop(log);
        let log = RecordLog::open(dir.path(), bounds, 4, true).unwrap();
        log.publish(log.write(&[append(7, b"seven")]).unwrap(), || Ok(()))
            .unwrap();
        let bounds = log.sync().unwrap();
        drop(log);
        let log = RecordLog::open(dir.path(), bounds, 4, false).unwrap();
        assert_eq!(all(&log, 0), vec![(7, b"seven".to_vec())]);
    }

    #[test]
    fn a_missing_segment_inside_the_bounds_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = RecordLog::open(dir.path(), Bounds::EMPTY, 2, true).unwrap();
        log.publish(
            log.write(&[append(1, b"a"), append(2, b"b")]).unwrap(),
            || Ok(()),
        )
        .unwrap();
        let bounds = log.sync().unwrap();
        drop(log);
        std::fs::remove_file(dir.path().join(LOG_DIR).join(segment_name(1, "rec"))).unwrap();
        let error = RecordLog::open(dir.path(), bounds, 2, true).unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
    }
}
