//! A write-ahead log in front of LMDB (opt-in: [`crate::lmdb::LmdbOptions::wal`]).
//!
//! A commit writes its changes (puts and deletes, in order) as one record to a preallocated
//! log segment with one `fdatasync` — a sequential write — and then commits to LMDB without
//! syncing. Every [`CHECKPOINT_BYTES`] of B-tree changes (or [`SEGMENT_BYTES_MAX`] of log,
//! record log appends included), a checkpoint makes LMDB durable
//! (`fdatasync` of `data.mdb`) and writes a checkpoint slot holding the sequence number of
//! the last record applied, the segment the next records go to, and a copy of LMDB's two
//! meta pages as they were at that snapshot.
//!
//! Power loss can leave `data.mdb` with a meta page whose pages never reached the disk. So
//! the checkpointed snapshot is pinned (a read transaction on it) until the next checkpoint
//! is durable: LMDB reuses none of its pages, and after a crash recovery writes the saved
//! meta pages back — `data.mdb` is then exactly the checkpointed snapshot — and replays the
//! records after it. Recovery runs on every writable open that finds records after the
//! checkpoint (after kill -9 as after power loss: one path, exercised by every crash test).
//!
//! Files: `wal.ckpt` (two slots, written alternately; the valid one with the highest
//! generation counts; locked exclusively by the one writer), `wal.0` and `wal.1` (segments:
//! a checkpoint switches to the other one, whose stale records carry older sequence numbers
//! and are never taken for new ones).
//!
//! The store's record log (`reclog.rs`) rides on the same records and checkpoints: a commit's
//! log appends and purges are changes of its record, and a checkpoint makes the log's files
//! durable and keeps its bounds in the slot.
//!
//! Record: magic u32, payload length u32, sequence u64, CRC-32 u32 (of sequence, length and
//! payload), 4 reserved bytes, then the payload: per change, `1` key-length:u16
//! value-length:u32 key value (put), `2` key-length:u16 key (delete), `3` index:u64
//! length:u32 bytes (log append) or `4` upto:u64 (log purge). Little-endian.
//!
//! Slot (version 2; version 1, without the log fields, reads as an empty log): magic
//! `CALMCKP2`, generation u64, sequence u64, segment u32, meta length u32, CRC-32 u32 (of the
//! header from the generation to the end of the log fields, and the meta pages), 4 reserved
//! bytes, log first u64, log last u64, log records per segment u64, then the meta pages.

use std::fs::{File, OpenOptions};
use std::path::Path;

use heed::{Env, RoTxn, WithoutTls};

use crate::disk::DiskFile;
use crate::latency::LogCounts;
use crate::reclog::{Bounds, LogOp, RecordLog, SEGMENT_RECORDS_DEFAULT};
use crate::{Result, StoreError};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Bytes of B-tree changes (puts and deletes, as logged) after which a commit checkpoints.
/// Bounds what recovery replays into LMDB, and the pages a checkpoint writes back. The
/// record log's appends do not count: they dirty no LMDB page, and counting them made
/// checkpoints a third more frequent with the changelog on (a measured cost; see
/// docs/design/wal.md).
pub const CHECKPOINT_BYTES: u64 = 4 << 20;
/// Log bytes (everything) after which a commit checkpoints anyway: bounds a segment, the
/// records the record log keeps in memory, and what recovery reads.
pub const SEGMENT_BYTES_MAX: u64 = 16 << 20;
const _: () = assert!(CHECKPOINT_BYTES <= SEGMENT_BYTES_MAX);
/// Growth step of a segment (zero-filled and synced ahead, so that a commit's `fdatasync`
/// never has to make the file longer).
const SEGMENT_CHUNK: u64 = 1 << 20;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CWAL");
const HEADER_BYTES: usize = 24;
const SLOT_MAGIC: [u8; 8] = *b"CALMCKP2";
const SLOT_MAGIC_V1: [u8; 8] = *b"CALMCKP1";
/// Bytes reserved per checkpoint slot: a header and two meta pages of up to 64 KiB.
const SLOT_BYTES: u64 = 160 << 10;
const SLOT_HEADER_BYTES: usize = 64;
const SLOT_HEADER_BYTES_V1: usize = 40;

pub const CKPT_FILE: &str = "wal.ckpt";
const SEGMENT_FILES: [&str; 2] = ["wal.0", "wal.1"];

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_LOG_APPEND: u8 = 3;
const OP_LOG_PURGE: u8 = 4;

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

fn in_use(dir: &Path) -> StoreError {
    StoreError::Io(format!(
        "{} is open for writing elsewhere (one writer per store)",
        dir.display()
    ))
}

/// CRC-32 (IEEE) of `parts` back to back. crc32fast folds with carry-less multiplication
/// where the CPU has it: a byte-at-a-time table took about 2 ns a byte on the committer's
/// path, a fifth of the cost a changelog record added to a commit.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// Appends a put to a record payload.
pub(crate) fn push_put(payload: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    payload.push(OP_PUT);
    payload.extend_from_slice(&(key.len() as u16).to_le_bytes());
    payload.extend_from_slice(&(value.len() as u32).to_le_bytes());
    payload.extend_from_slice(key);
    payload.extend_from_slice(value);
}

/// Appends a delete to a record payload.
pub(crate) fn push_delete(payload: &mut Vec<u8>, key: &[u8]) {
    payload.push(OP_DELETE);
    payload.extend_from_slice(&(key.len() as u16).to_le_bytes());
    payload.extend_from_slice(key);
}

/// Appends a log append to a record payload.
pub(crate) fn push_log_append(payload: &mut Vec<u8>, index: u64, record: &[u8]) {
    payload.push(OP_LOG_APPEND);
    payload.extend_from_slice(&index.to_le_bytes());
    payload.extend_from_slice(&(record.len() as u32).to_le_bytes());
    payload.extend_from_slice(record);
}

/// Appends a log purge to a record payload.
pub(crate) fn push_log_purge(payload: &mut Vec<u8>, upto: u64) {
    payload.push(OP_LOG_PURGE);
    payload.extend_from_slice(&upto.to_le_bytes());
}

/// One change of a record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    Put(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
    Log(LogOp),
}

/// The changes of a record payload, in order.
pub(crate) fn changes(payload: &[u8]) -> Result<Vec<Change<'_>>> {
    let bad = || StoreError::Io("a write-ahead log record does not decode".into());
    let mut out = Vec::new();
    let mut at = 0;
    let take = |at: &mut usize, n: usize| -> Result<&[u8]> {
        let end = at
            .checked_add(n)
            .filter(|e| *e <= payload.len())
            .ok_or_else(bad)?;
        let bytes = &payload[*at..end];
        *at = end;
        Ok(bytes)
    };
    let u64_of = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    while at < payload.len() {
        let op = take(&mut at, 1)?[0];
        if op == OP_LOG_APPEND {
            let index = u64_of(take(&mut at, 8)?);
            let len = u32::from_le_bytes(take(&mut at, 4)?.try_into().expect("4 bytes")) as usize;
            let record = take(&mut at, len)?.to_vec();
            out.push(Change::Log(LogOp::Append { index, record }));
            continue;
        }
        if op == OP_LOG_PURGE {
            let upto = u64_of(take(&mut at, 8)?);
            out.push(Change::Log(LogOp::Purge { upto }));
            continue;
        }
        let klen = u16::from_le_bytes(take(&mut at, 2)?.try_into().expect("2 bytes")) as usize;
        match op {
            OP_PUT => {
                let vlen =
                    u32::from_le_bytes(take(&mut at, 4)?.try_into().expect("4 bytes")) as usize;
                let key = take(&mut at, klen)?;
                out.push(Change::Put(key, take(&mut at, vlen)?));
            }
            OP_DELETE => out.push(Change::Delete(take(&mut at, klen)?)),
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

/// A checkpoint slot.
#[derive(Debug, Clone)]
struct Slot {
    generation: u64,
    /// The last record applied at this checkpoint.
    seq: u64,
    /// The segment records after `seq` go to.
    segment: usize,
    /// LMDB's meta pages (the first two pages of `data.mdb`) at the checkpointed snapshot.
    meta: Vec<u8>,
    /// The record log's bounds at the checkpoint, and its records per segment.
    log: Bounds,
    log_segment_records: u64,
}

impl Slot {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SLOT_HEADER_BYTES + self.meta.len());
        out.extend_from_slice(&SLOT_MAGIC);
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(self.segment as u32).to_le_bytes());
        out.extend_from_slice(&(self.meta.len() as u32).to_le_bytes());
        let mut log = Vec::with_capacity(24);
        log.extend_from_slice(&self.log.first.to_le_bytes());
        log.extend_from_slice(&self.log.last.to_le_bytes());
        log.extend_from_slice(&self.log_segment_records.to_le_bytes());
        let crc = crc32(&[&out[8..32], &log, &self.meta]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&log);
        out.extend_from_slice(&self.meta);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Slot> {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let v1 = bytes.get(..8) == Some(&SLOT_MAGIC_V1[..]);
        let header = if v1 {
            SLOT_HEADER_BYTES_V1
        } else {
            SLOT_HEADER_BYTES
        };
        if bytes.len() < header || !(v1 || bytes[..8] == SLOT_MAGIC) {
            return None;
        }
        let meta_len = u32_at(28) as usize;
        let meta = bytes.get(header..header + meta_len)?;
        let log = if v1 { &[][..] } else { &bytes[40..64] };
        let segment = u32_at(24) as usize;
        if crc32(&[&bytes[8..32], log, meta]) != u32_at(32) || segment > 1 {
            return None;
        }
        let (log, log_segment_records) = if v1 {
            // A store logged before the record log existed keeps its records as keys.
            (Bounds::EMPTY, SEGMENT_RECORDS_DEFAULT)
        } else {
            let bounds = Bounds {
                first: u64_at(40),
                last: u64_at(48),
            };
            (bounds, u64_at(56))
        };
        Some(Slot {
            generation: u64_at(8),
            seq: u64_at(16),
            segment,
            meta: meta.to_vec(),
            log,
            log_segment_records,
        })
    }
}

fn read_slots(ckpt: &DiskFile, path: &Path) -> Result<Option<Slot>> {
    let mut best: Option<Slot> = None;
    for i in 0..2 {
        let mut bytes = vec![0u8; SLOT_BYTES as usize];
        let n =
            read_at_most(ckpt, &mut bytes, i * SLOT_BYTES).map_err(|e| io("reading", path, e))?;
        if let Some(slot) = Slot::decode(&bytes[..n])
            && best.as_ref().is_none_or(|b| slot.generation > b.generation)
        {
            best = Some(slot);
        }
    }
    Ok(best)
}

/// Reads up to `buf.len()` bytes at `offset` (fewer at the end of the file).
fn read_at_most(file: &DiskFile, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

/// The records after `seq` in a segment.
pub(crate) struct Scanned {
    /// Their payloads, in order.
    pub records: Vec<Vec<u8>>,
    /// Where the next record goes (the end of the last one).
    end: u64,
}

/// Reads the records after `seq` in `segment`, in order, up to the first record that is torn,
/// stale (an older sequence number) or absent. Reads as far as the records go (a segment
/// after a clean close, whose first record is stale, costs one read of its first bytes).
fn scan(segment: &DiskFile, path: &Path, seq: u64) -> Result<Scanned> {
    /// Bytes read at once.
    const READ_BYTES: usize = 1 << 20;
    let mut bytes: Vec<u8> = Vec::new();
    let mut eof = false;
    // Makes `bytes` hold at least `len` bytes when the file has them.
    let mut fill = |bytes: &mut Vec<u8>, len: usize| -> Result<bool> {
        while bytes.len() < len && !eof {
            let from = bytes.len();
            bytes.resize(from + READ_BYTES.max(len - from), 0);
            let n = read_at_most(segment, &mut bytes[from..], from as u64)
                .map_err(|e| io("reading", path, e))?;
            bytes.truncate(from + n);
            eof = n == 0;
        }
        Ok(bytes.len() >= len)
    };
    let mut records = Vec::new();
    let mut at = 0usize;
    let mut expected = seq + 1;
    while fill(&mut bytes, at + HEADER_BYTES)? {
        let header = &bytes[at..at + HEADER_BYTES];
        let magic = u32::from_le_bytes(header[0..4].try_into().expect("4"));
        let length = u32::from_le_bytes(header[4..8].try_into().expect("4")) as usize;
        let record_seq = u64::from_le_bytes(header[8..16].try_into().expect("8"));
        let crc = u32::from_le_bytes(header[16..20].try_into().expect("4"));
        let end = at + HEADER_BYTES + length;
        if magic != RECORD_MAGIC || record_seq != expected || !fill(&mut bytes, end)? {
            break;
        }
        let header = &bytes[at..at + HEADER_BYTES];
        let payload = &bytes[at + HEADER_BYTES..end];
        if crc32(&[&header[4..16], payload]) != crc {
            break;
        }
        records.push(payload.to_vec());
        expected += 1;
        at = end;
    }
    Ok(Scanned {
        records,
        end: at as u64,
    })
}

/// Opens `path` for reading and writing, creating it empty when absent.
fn open_or_create(path: &Path) -> Result<DiskFile> {
    DiskFile::open(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    )
    .map_err(|e| io("opening", path, e))
}

/// Opens (creating) a segment file; returns it and its length.
fn open_segment(dir: &Path, i: usize) -> Result<(DiskFile, u64)> {
    let path = dir.join(SEGMENT_FILES[i]);
    let file = open_or_create(&path)?;
    let len = file.len().map_err(|e| io("reading", &path, e))?;
    Ok((file, len))
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|n| *n > 0).unwrap_or(4096)
}

/// What a writable open found before LMDB is opened.
pub(crate) struct Recovered {
    ckpt: DiskFile,
    slot: Option<Slot>,
    /// The records after the checkpoint, to replay.
    pub scanned: Scanned,
}

impl Recovered {
    /// The record log's bounds and records per segment at the checkpoint (a new store's
    /// when there is none; `segment_records` is then what the caller asks for).
    pub(crate) fn log(&self, segment_records: u64) -> (Bounds, u64) {
        match &self.slot {
            Some(slot) => (slot.log, slot.log_segment_records),
            None => (Bounds::EMPTY, segment_records),
        }
    }
}

/// The record log's bounds and records per segment kept by a cleanly closed store's last
/// checkpoint; `None` when the store has no write-ahead log.
pub(crate) fn log_at_checkpoint(dir: &Path) -> Result<Option<(Bounds, u64)>> {
    let path = dir.join(CKPT_FILE);
    let Ok(ckpt) = DiskFile::open(&path, OpenOptions::new().read(true)) else {
        return Ok(None);
    };
    Ok(read_slots(&ckpt, &path)?.map(|slot| (slot.log, slot.log_segment_records)))
}

/// Locks the log, reads the checkpoint and the records after it, and writes the checkpoint's
/// meta pages back into `data.mdb` (which is then the checkpointed snapshot) so that the
/// records can be replayed on it. Runs before LMDB opens the file.
pub(crate) fn recover(dir: &Path) -> Result<Recovered> {
    let path = dir.join(CKPT_FILE);
    let ckpt = open_or_create(&path)?;
    ckpt.try_lock().map_err(|_| in_use(dir))?;
    let slot = read_slots(&ckpt, &path)?;
    let mut scanned = Scanned {
        records: Vec::new(),
        end: 0,
    };
    if let Some(slot) = &slot {
        let (segment, _) = open_segment(dir, slot.segment)?;
        scanned = scan(&segment, &dir.join(SEGMENT_FILES[slot.segment]), slot.seq)?;
        // Without records LMDB is at the checkpoint already (every later commit wrote its
        // record first) and this rewrites the same bytes; it is done anyway, so that nothing
        // LMDB may have written after the checkpoint without a record (a commit that failed
        // and was cancelled) is ever taken for the state.
        {
            let data_path = dir.join("data.mdb");
            let data = DiskFile::open(&data_path, OpenOptions::new().write(true))
                .map_err(|e| io("opening", &data_path, e))?;
            data.write_all_at(&slot.meta, 0)
                .and_then(|()| data.sync_data())
                .map_err(|e| io("restoring the checkpoint's meta pages in", &data_path, e))?;
        }
    }
    Ok(Recovered {
        ckpt,
        slot,
        scanned,
    })
}

/// For a read-only open: how many records the log holds after its checkpoint (0 when the
/// store has no log or was closed cleanly).
pub(crate) fn pending(dir: &Path) -> Result<usize> {
    let path = dir.join(CKPT_FILE);
    let Ok(ckpt) = DiskFile::open(&path, OpenOptions::new().read(true)) else {
        return Ok(0);
    };
    let Some(slot) = read_slots(&ckpt, &path)? else {
        return Ok(0);
    };
    let segment_path = dir.join(SEGMENT_FILES[slot.segment]);
    let Ok(segment) = DiskFile::open(&segment_path, OpenOptions::new().read(true)) else {
        return Ok(0);
    };
    Ok(scan(&segment, &segment_path, slot.seq)?.records.len())
}

/// A cleanly closed store with a log that a writable open without the log is leaving: the
/// log is locked until [`Leaving::finish`].
pub(crate) struct Leaving {
    ckpt: DiskFile,
    /// The record log's bounds and records per segment at the last checkpoint: records
    /// the opener moves into keys before finishing.
    pub log: (Bounds, u64),
}

/// Before a writable open without the log: a store that had one (closed cleanly, see
/// [`pending`]) leaves it, so that a later open with the log does not take its old checkpoint
/// for the current state. `None` when the store has no log.
pub(crate) fn leave(dir: &Path) -> Result<Option<Leaving>> {
    let path = dir.join(CKPT_FILE);
    let Ok(ckpt) = DiskFile::open(&path, OpenOptions::new().read(true).write(true)) else {
        return Ok(None);
    };
    ckpt.try_lock().map_err(|_| in_use(dir))?;
    let log = match read_slots(&ckpt, &path)? {
        Some(slot) => (slot.log, slot.log_segment_records),
        None => (Bounds::EMPTY, SEGMENT_RECORDS_DEFAULT),
    };
    Ok(Some(Leaving { ckpt, log }))
}

impl Leaving {
    /// Removes the log, the checkpoint first: once it is gone, the segments and the record
    /// log's files are garbage to every later open (a writable open with the log starts a
    /// new one and removes the record log's files outside its bounds).
    pub(crate) fn finish(self, dir: &Path) -> Result<()> {
        let path = dir.join(CKPT_FILE);
        std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing", dir, e))?;
        drop(self.ckpt);
        for name in SEGMENT_FILES {
            let segment = dir.join(name);
            if segment.exists() {
                std::fs::remove_file(&segment).map_err(|e| io("removing", &segment, e))?;
            }
        }
        let log = dir.join(crate::reclog::LOG_DIR);
        if log.exists() {
            std::fs::remove_dir_all(&log).map_err(|e| io("removing", &log, e))?;
        }
        Ok(())
    }
}

/// The log of an open store. Only the writer (holding the store's write lock) touches it.
pub(crate) struct Wal {
    dir: std::path::PathBuf,
    env: Env<WithoutTls>,
    data: DiskFile,
    ckpt: DiskFile,
    segments: [DiskFile; 2],
    /// Zero-filled length of each segment.
    lengths: [u64; 2],
    active: usize,
    /// Where the next record goes in the active segment.
    offset: u64,
    /// The last record written and applied.
    seq: u64,
    generation: u64,
    page_bytes: usize,
    /// A read transaction on the last checkpoint's snapshot: LMDB reuses none of its pages.
    pin: Option<RoTxn<'static, WithoutTls>>,
    /// The store's record log, made durable with every checkpoint.
    log: Arc<RecordLog>,
    /// Bytes of record log operations in the active segment (not B-tree changes).
    log_bytes: u64,
    /// Sync times, bytes written and checkpoint times, read by the store's figures.
    counts: Arc<LogCounts>,
    /// Commits synced later than they return (`CommitSync::Within`), if so.
    durable: Option<Arc<crate::durable::Durable>>,
}

impl Wal {
    /// Starts the log after recovery, whose records the caller has replayed into `env` with
    /// `pin` — a read transaction taken on the checkpointed snapshot before the replay — held.
    /// The store is then exactly as it was before the crash: the checkpoint durable and
    /// pinned, the records after it in the active segment, LMDB's pages since in the page
    /// cache. So no checkpoint is taken: new records follow the replayed ones, and the next
    /// checkpoint comes when it is due. A new store (no checkpoint yet) checkpoints at once.
    pub(crate) fn start(
        dir: &Path,
        env: Env<WithoutTls>,
        recovered: Recovered,
        pin: RoTxn<'static, WithoutTls>,
        log: Arc<RecordLog>,
        counts: Arc<LogCounts>,
    ) -> Result<Wal> {
        let data_path = dir.join("data.mdb");
        let data = DiskFile::open(&data_path, OpenOptions::new().read(true).write(true))
            .map_err(|e| io("opening", &data_path, e))?;
        let (s0, l0) = open_segment(dir, 0)?;
        let (s1, l1) = open_segment(dir, 1)?;
        let (seq, generation, active) = match &recovered.slot {
            Some(slot) => (
                slot.seq + recovered.scanned.records.len() as u64,
                slot.generation,
                slot.segment,
            ),
            None => (0, 0, 0),
        };
        let fresh = recovered.slot.is_none();
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            env,
            data,
            ckpt: recovered.ckpt,
            segments: [s0, s1],
            lengths: [l0, l1],
            active,
            offset: recovered.scanned.end,
            seq,
            generation,
            page_bytes: page_bytes(),
            pin: Some(pin),
            log,
            // The replayed records' log appends are not told apart: the next checkpoint
            // may come early, never late.
            log_bytes: 0,
            counts,
            durable: None,
        };
        if fresh {
            wal.checkpoint()?;
            // The segment files exist for good now: make their names durable.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("syncing", dir, e))?;
        }
        Ok(wal)
    }

    fn segment_path(&self, i: usize) -> std::path::PathBuf {
        self.dir.join(SEGMENT_FILES[i])
    }

    /// From now on a record is synced later than its commit returns (`sync_now` aside):
    /// within `within`, or at the returned [`Durable`](crate::durable::Durable)'s `sync`.
    pub(crate) fn defer_syncs(
        &mut self,
        within: std::time::Duration,
    ) -> Result<Arc<crate::durable::Durable>> {
        let segment = &self.segments[self.active];
        let durable = crate::durable::Durable::new(segment, self.seq, within, self.counts.clone())?;
        self.durable = Some(durable.clone());
        Ok(durable)
    }

    /// Writes `payload` as the next record and, unless syncs are deferred and `sync_now` is
    /// false, waits until it is on the medium. Returns where it went, for [`Wal::cancel`].
    pub(crate) fn write(&mut self, payload: &[u8], sync_now: bool) -> Result<u64> {
        let seq = self.seq + 1;
        let length = u32::try_from(payload.len())
            .map_err(|_| StoreError::Limit("a transaction of 4 GiB or more".into()))?;
        let mut record = Vec::with_capacity(HEADER_BYTES + payload.len());
        record.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        record.extend_from_slice(&length.to_le_bytes());
        record.extend_from_slice(&seq.to_le_bytes());
        let crc = crc32(&[&record[4..16], payload]);
        record.extend_from_slice(&crc.to_le_bytes());
        record.extend_from_slice(&[0; 4]);
        record.extend_from_slice(payload);
        let at = self.offset;
        let end = at + record.len() as u64;
        let path = self.segment_path(self.active);
        let segment = &self.segments[self.active];
        if end > self.lengths[self.active] {
            let grown = end.div_ceil(SEGMENT_CHUNK) * SEGMENT_CHUNK;
            let from = self.lengths[self.active];
            let zeros = vec![0u8; (grown - from) as usize];
            segment
                .write_all_at(&zeros, from)
                .and_then(|()| segment.sync_all())
                .map_err(|e| io("growing", &path, e))?;
            self.lengths[self.active] = grown;
        }
        // A record that fails to be written is overwritten by the next one (the offset does
        // not move); one whose sync fails is of unknown fate, and the store is poisoned.
        segment
            .write_all_at(&record, at)
            .map_err(|e| io("writing", &path, e))?;
        if let Some(durable) = &self.durable {
            durable.wrote(seq);
        }
        if sync_now || self.durable.is_none() {
            let started = std::time::Instant::now();
            segment.sync_data().map_err(|e| io("syncing", &path, e))?;
            self.counts
                .syncs
                .observe(started.elapsed().as_nanos() as u64);
            if let Some(durable) = &self.durable {
                durable.durable_at(seq);
            }
        }
        self.counts
            .bytes
            .fetch_add(record.len() as u64, Ordering::Relaxed);
        Ok(at)
    }

    /// The record written at `at` was applied: the next one follows it. `log_bytes` of its
    /// payload were record log operations. Returns whether a checkpoint is due (the segment
    /// holds [`CHECKPOINT_BYTES`] of B-tree changes, or [`SEGMENT_BYTES_MAX`] in all).
    pub(crate) fn applied(&mut self, at: u64, payload_bytes: usize, log_bytes: usize) -> bool {
        self.seq += 1;
        self.offset = at + (HEADER_BYTES + payload_bytes) as u64;
        self.log_bytes += log_bytes as u64;
        self.offset - self.log_bytes >= CHECKPOINT_BYTES || self.offset >= SEGMENT_BYTES_MAX
    }

    /// The record written at `at` must never be replayed (its LMDB commit failed): its header
    /// is overwritten with zeros and synced.
    pub(crate) fn cancel(&mut self, at: u64) -> Result<()> {
        let path = self.segment_path(self.active);
        let segment = &self.segments[self.active];
        segment
            .write_all_at(&[0u8; HEADER_BYTES], at)
            .and_then(|()| segment.sync_data())
            .map_err(|e| io("syncing (cancelling a record in)", &path, e))
    }

    /// Makes LMDB durable at its last commit and records it as the checkpoint: pin the
    /// snapshot, copy its meta pages, `fdatasync` the data file, write the slot, then switch
    /// segments and let the previous pin go. Called with no write transaction open.
    pub(crate) fn checkpoint(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        self.checkpoint_now()?;
        self.counts
            .checkpoints
            .observe(started.elapsed().as_nanos() as u64);
        Ok(())
    }

    /// [`Wal::checkpoint`], untimed.
    fn checkpoint_now(&mut self) -> Result<()> {
        let data_path = self.dir.join("data.mdb");
        let pin = self
            .env
            .clone()
            .static_read_txn()
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let mut meta = vec![0u8; 2 * self.page_bytes];
        let n = read_at_most(&self.data, &mut meta, 0).map_err(|e| io("reading", &data_path, e))?;
        if n != meta.len() {
            return Err(StoreError::Io(format!(
                "{} is shorter than its two meta pages",
                data_path.display()
            )));
        }
        // The data file and the record log's files are made durable at the same time (each
        // fdatasync waits for the device; one after the other they added up on the commit path).
        let (data, log) = std::thread::scope(|scope| {
            let log = scope.spawn(|| self.log.sync());
            let data = self
                .data
                .sync_data()
                .map_err(|e| io("syncing", &data_path, e));
            (data, log.join().expect("the record log's sync panicked"))
        });
        data?;
        let log = log?;
        let next = 1 - self.active;
        let slot = Slot {
            generation: self.generation + 1,
            seq: self.seq,
            segment: next,
            meta,
            log,
            log_segment_records: self.log.segment_records(),
        };
        let ckpt_path = self.dir.join(CKPT_FILE);
        self.ckpt
            .write_all_at(&slot.encode(), (slot.generation % 2) * SLOT_BYTES)
            .and_then(|()| self.ckpt.sync_data())
            .map_err(|e| io("writing", &ckpt_path, e))?;
        self.generation = slot.generation;
        self.active = next;
        if let Some(durable) = &self.durable {
            durable.switched(&self.segments[next], self.seq)?;
        }
        self.offset = 0;
        self.log_bytes = 0;
        self.pin = Some(pin);
        Ok(())
    }

    /// Lets the pinned snapshot go (before the environment closes).
    pub(crate) fn unpin(&mut self) {
        self.pin = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(crc32(&[b"1234", b"56789"]), 0xCBF4_3926);
    }

    #[test]
    fn a_payload_decodes_to_its_changes_and_garbage_is_refused() {
        let mut payload = Vec::new();
        push_put(&mut payload, b"k", b"value");
        push_delete(&mut payload, b"gone");
        push_put(&mut payload, b"e", b"");
        push_log_append(&mut payload, 9, b"record");
        push_log_purge(&mut payload, 4);
        assert_eq!(
            changes(&payload).unwrap(),
            vec![
                Change::Put(b"k", b"value"),
                Change::Delete(b"gone"),
                Change::Put(b"e", b""),
                Change::Log(LogOp::Append {
                    index: 9,
                    record: b"record".to_vec()
                }),
                Change::Log(LogOp::Purge { upto: 4 }),
            ]
        );
        assert!(changes(&payload[..payload.len() - 1]).is_err());
        assert!(changes(&[9, 0, 0]).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// A commit's payload or a checkpoint slot of any bytes decodes or is refused, never
        /// a panic: a torn or damaged log is what recovery reads.
        #[test]
        fn a_payload_or_a_slot_of_any_bytes_decodes_or_is_refused(
            mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            magic in 0u8..3,
        ) {
            let _ = changes(&bytes);
            match magic {
                1 => drop(bytes.splice(0..bytes.len().min(8), SLOT_MAGIC)),
                2 => drop(bytes.splice(0..bytes.len().min(8), SLOT_MAGIC_V1)),
                _ => {}
            }
            let _ = Slot::decode(&bytes);
        }
    }

    #[test]
    fn a_slot_round_trips_and_a_damaged_one_is_not_taken() {
        let slot = Slot {
            generation: 7,
            seq: 42,
            segment: 1,
            meta: vec![5; 8192],
            log: Bounds { first: 3, last: 99 },
            log_segment_records: 16,
        };
        let bytes = slot.encode();
        let back = Slot::decode(&bytes).unwrap();
        assert_eq!((back.generation, back.seq, back.segment), (7, 42, 1));
        assert_eq!((back.log, back.log_segment_records), (slot.log, 16));
        assert_eq!(back.meta, slot.meta);
        let mut damaged = bytes.clone();
        damaged[SLOT_HEADER_BYTES + 100] ^= 1;
        assert!(Slot::decode(&damaged).is_none());
        assert!(Slot::decode(&bytes[..SLOT_HEADER_BYTES + 10]).is_none());
    }
}
