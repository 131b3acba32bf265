//! Dump and load: the whole namespace at one snapshot as one file, and a new store made from
//! such a file (`calm dump`, `calm load`, the server's automatic backups).
//!
//! A dump holds every pair of the store's keyspace that makes up the namespace, in key order:
//! inodes (with their attributes, ACLs and symlink targets), names, xattrs, slice records and
//! inline bytes, shared-object counts, the deletion queue, orphans, quotas, counters and the
//! superblock (the object store's URL, the handle and slice counters). Three families are left
//! out, because they belong to the servers and clients of the moment, not to the namespace:
//! the request records of clients (`Q`), the changelog's readers (`U`) and its records. The
//! changelog's last index is kept (a loaded store's records go on from it), and locks and
//! sessions live outside the keyspace.
//!
//! The file, version 1 (every number little-endian):
//!
//! ```text
//! header   "CALMDUMP" version:u32 store_format:u32 created_ns:i64 crc32(previous 24 bytes):u32
//! frame    'F' length:u32 payload crc32(payload):u32       (payload: up to FRAME_BYTES + 1 pair)
//! trailer  'E' pairs:u64 payload_bytes:u64 crc32(all payloads):u32 crc32(previous 21 bytes):u32
//! ```
//!
//! A payload is pairs, each `varint key length, key, varint value length, value`, keys strictly
//! ascending across the whole file. The trailer is the proof of a whole dump: a file cut short
//! (a dump killed half-way, a copy that stopped) has none and is refused. A dump is written
//! frame by frame as the snapshot is read, so memory stays at a frame whatever the store's size.
//!
//! Loading checks the whole file before it writes anything (a damaged or cut file changes
//! nothing), refuses a store that holds anything, writes the pairs in transactions of a bounded
//! size, and writes the format field (`Sformat`) last: a load killed half-way leaves a store
//! that holds data and no format field, which no server opens and `calm load` refuses, never a
//! partial namespace that looks whole. The handle high-water mark and the next slice id are
//! moved [`LOAD_ID_GAP`] past the dump's, so that handles and objects the lost store made after
//! the dump are never made again by the loaded one.

use std::io::{Read, Write};
use std::ops::ControlFlow;

use calm_store::{ReadTxn, Store, StoreError, WriteTxn};

use crate::layout::{
    self, KEY_CL_LAST, KEY_FORMAT, KEY_HWM, KEY_SLICE_NEXT, TAG_CL_USER, TAG_REQUEST,
};

/// The first bytes of a dump.
pub const DUMP_MAGIC: &[u8; 8] = b"CALMDUMP";
/// The version of the dump's own framing (the pairs inside follow the store's format version,
/// written in the header).
pub const DUMP_VERSION: u32 = 1;
/// Payload bytes after which a frame is closed: what a dump or a load holds in memory.
pub const FRAME_BYTES: usize = 1 << 20;
/// The longest frame a reader accepts: a full frame and one more pair of the largest size.
pub const FRAME_BYTES_MAX: usize =
    FRAME_BYTES + calm_store::KEY_LEN_MAX + calm_store::VALUE_LEN_MAX + 20;
/// How far past the dump's handle high-water mark and next slice id a loaded store starts.
pub const LOAD_ID_GAP: u64 = 1 << 32;
/// Pairs and bytes of one load transaction on a shared store (etcd takes 128 operations and
/// 1.5 MiB per transaction by default).
pub const LOAD_TXN_SHARED: (usize, usize) = (100, 1 << 20);
/// Pairs and bytes of one load transaction on a store of one machine.
pub const LOAD_TXN_LOCAL: (usize, usize) = (4096, 16 << 20);

const HEADER_LEN: usize = 28;
const FRAME_TAG: u8 = b'F';
const TRAILER_TAG: u8 = b'E';
const TRAILER_LEN: usize = 1 + 8 + 8 + 4 + 4;

/// Why a dump or a load could not be made. Nothing was written to the store being loaded
/// unless the error says so.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("reading the store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Namespace(#[from] crate::MetaError),
    #[error("{what}: {error}")]
    Io {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("not a calm dump: {0}")]
    NotADump(String),
    #[error("the dump is damaged: {0}")]
    Damaged(String),
    #[error(
        "the dump is incomplete (it ends after {pairs} entries without its closing record): \
         it was cut short, or its writer was stopped before it finished"
    )]
    Incomplete { pairs: u64 },
    #[error(
        "the store to load into is not empty: load makes a new store, and never writes over one"
    )]
    NotEmpty,
    #[error(
        "the load stopped after writing part of the dump ({0}): the store holds part of a \
         namespace and no server will open it; remove it and load again"
    )]
    Partial(String),
    #[error("{0}")]
    Refused(String),
}

pub type DumpResult<T> = std::result::Result<T, DumpError>;

/// What [`DumpReader::next_frame`] calls with each pair (key, value) of a frame, in order.
pub type PairVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> DumpResult<()> + 'a;

/// What a dump holds, or what a load wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// The store format version of the pairs.
    pub format: u32,
    /// When the dump was made (ns since the epoch).
    pub created_ns: i64,
    /// Pairs in the dump.
    pub pairs: u64,
    /// Bytes of keys and values (with their lengths) in the dump.
    pub payload_bytes: u64,
    /// Inodes among the pairs.
    pub inodes: u64,
    /// Pairs of the store left out (request records, changelog readers).
    pub left_out: u64,
    /// The changelog's last index the dump keeps.
    pub changelog_last: u64,
    /// The object store the dumped namespace keeps its file contents in.
    pub objects_url: Option<String>,
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> DumpError {
    move |error| DumpError::Io { what, error }
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Whether the dump keeps pairs of this key: everything but the clients' request records and
/// grants of handles, the changelog's readers and its records.
pub fn kept(key: &[u8]) -> bool {
    !matches!(
        key.first(),
        Some(&TAG_REQUEST) | Some(&TAG_CL_USER) | Some(&crate::ops::grants::TAG_GRANT)
    ) && key.first() != Some(&calm_store::LOG_FAMILY)
}

/// Writes the dump of `snapshot` to `out`, frame by frame. `progress` gets the payload bytes
/// written so far after each frame.
pub fn dump<R: ReadTxn + ?Sized>(
    snapshot: &R,
    out: &mut dyn Write,
    created_ns: i64,
    progress: &mut dyn FnMut(u64),
) -> DumpResult<DumpSummary> {
    dump_in_frames(snapshot, out, created_ns, FRAME_BYTES, progress)
}

/// [`dump`] with frames closed after `frame_bytes` (at most [`FRAME_BYTES`]; tests use small
/// ones to make many frames of a small namespace).
pub fn dump_in_frames<R: ReadTxn + ?Sized>(
    snapshot: &R,
    out: &mut dyn Write,
    created_ns: i64,
    frame_bytes: usize,
    progress: &mut dyn FnMut(u64),
) -> DumpResult<DumpSummary> {
    let frame_bytes = frame_bytes.clamp(1, FRAME_BYTES);
    let format = match snapshot.get(KEY_FORMAT)? {
        Some(value) => layout::check_format(&value)?,
        None => {
            return Err(DumpError::Namespace(crate::MetaError::Corrupt(
                "the store holds no calm namespace (no format field)".into(),
            )));
        }
    };
    let counted = match snapshot.get(KEY_CL_LAST)? {
        Some(bytes) => calm_store::decode_counter(KEY_CL_LAST, &bytes)?,
        None => 0,
    };
    let changelog_last = counted.max(snapshot.log_last()?.unwrap_or(0));
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(DUMP_MAGIC);
    header.extend_from_slice(&DUMP_VERSION.to_le_bytes());
    header.extend_from_slice(&format.to_le_bytes());
    header.extend_from_slice(&created_ns.to_le_bytes());
    header.extend_from_slice(&crc(&header).to_le_bytes());
    out.write_all(&header).map_err(io("writing the dump"))?;
    let mut writer = FrameWriter {
        out,
        frame: Vec::with_capacity(frame_bytes + 1024),
        frame_bytes,
        all: crc32fast::Hasher::new(),
        summary: DumpSummary {
            format,
            created_ns,
            changelog_last,
            ..DumpSummary::default()
        },
        progress,
        failed: None,
    };
    let mut cl_last_written = false;
    snapshot.visit(b"", b"", &mut |key, value| {
        if !kept(key) {
            writer.summary.left_out += 1;
            return ControlFlow::Continue(());
        }
        // The changelog's last index goes where its counter sorts, written or not.
        if !cl_last_written && key >= KEY_CL_LAST {
            cl_last_written = true;
            if changelog_last > 0 {
                writer.pair(KEY_CL_LAST, &changelog_last.to_le_bytes())?;
            }
            if key == KEY_CL_LAST {
                return ControlFlow::Continue(());
            }
        }
        writer.pair(key, value)
    })?;
    if let Some(error) = writer.failed.take() {
        return Err(error);
    }
    if !cl_last_written && changelog_last > 0 {
        // A failure is kept in `failed`, read at once.
        let _ = writer.pair(KEY_CL_LAST, &changelog_last.to_le_bytes());
        if let Some(error) = writer.failed.take() {
            return Err(error);
        }
    }
    writer.flush_frame()?;
    let summary = writer.summary.clone();
    let mut trailer = Vec::with_capacity(TRAILER_LEN);
    trailer.push(TRAILER_TAG);
    trailer.extend_from_slice(&summary.pairs.to_le_bytes());
    trailer.extend_from_slice(&summary.payload_bytes.to_le_bytes());
    trailer.extend_from_slice(&writer.all.clone().finalize().to_le_bytes());
    trailer.extend_from_slice(&crc(&trailer).to_le_bytes());
    writer
        .out
        .write_all(&trailer)
        .map_err(io("writing the dump"))?;
    writer.out.flush().map_err(io("writing the dump"))?;
    Ok(summary)
}

struct FrameWriter<'a> {
    out: &'a mut dyn Write,
    frame: Vec<u8>,
    frame_bytes: usize,
    all: crc32fast::Hasher,
    summary: DumpSummary,
    progress: &'a mut dyn FnMut(u64),
    failed: Option<DumpError>,
}

impl FrameWriter<'_> {
    fn pair(&mut self, key: &[u8], value: &[u8]) -> ControlFlow<()> {
        let before = self.frame.len();
        layout::put_varint(&mut self.frame, key.len() as u64);
        self.frame.extend_from_slice(key);
        layout::put_varint(&mut self.frame, value.len() as u64);
        self.frame.extend_from_slice(value);
        self.summary.pairs += 1;
        self.summary.payload_bytes += (self.frame.len() - before) as u64;
        if key.first() == Some(&layout::TAG_INODE) {
            self.summary.inodes += 1;
        }
        if self.frame.len() >= self.frame_bytes
            && let Err(error) = self.flush_frame()
        {
            self.failed = Some(error);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn flush_frame(&mut self) -> DumpResult<()> {
        if self.frame.is_empty() {
            return Ok(());
        }
        let mut head = [0u8; 5];
        head[0] = FRAME_TAG;
        head[1..].copy_from_slice(&(self.frame.len() as u32).to_le_bytes());
        let sum = crc(&self.frame);
        self.all.update(&self.frame);
        let out = &mut self.out;
        out.write_all(&head)
            .and_then(|()| out.write_all(&self.frame))
            .and_then(|()| out.write_all(&sum.to_le_bytes()))
            .map_err(io("writing the dump"))?;
        self.frame.clear();
        (self.progress)(self.summary.payload_bytes);
        Ok(())
    }
}

/// Reads a dump frame by frame, checking every checksum and the order of the keys; the pairs
/// come out through [`DumpReader::next_frame`].
#[derive(Debug)]
pub struct DumpReader<R: Read> {
    input: R,
    /// What the header and the frames read so far say.
    pub summary: DumpSummary,
    all: crc32fast::Hasher,
    last_key: Vec<u8>,
    frame: Vec<u8>,
    done: bool,
}

impl<R: Read> DumpReader<R> {
    /// Reads and checks the header.
    pub fn new(mut input: R) -> DumpResult<Self> {
        let mut header = [0u8; HEADER_LEN];
        read_exact_or(&mut input, &mut header, || {
            DumpError::NotADump("the file is shorter than a dump's header".into())
        })?;
        if &header[..8] != DUMP_MAGIC {
            return Err(DumpError::NotADump(
                "the file does not begin as a calm dump does".into(),
            ));
        }
        if crc(&header[..24]) != u32_at(&header, 24) {
            return Err(DumpError::Damaged(
                "the header's checksum does not match".into(),
            ));
        }
        let version = u32_at(&header, 8);
        if version != DUMP_VERSION {
            return Err(DumpError::NotADump(format!(
                "dump version {version}; this build reads version {DUMP_VERSION}"
            )));
        }
        let format = u32_at(&header, 12);
        if !(layout::FORMAT_VERSION_MIN..=layout::FORMAT_VERSION).contains(&format) {
            return Err(DumpError::NotADump(format!(
                "the dump holds a store of format version {format}; this build reads versions \
                 {} to {}",
                layout::FORMAT_VERSION_MIN,
                layout::FORMAT_VERSION
            )));
        }
        let created_ns = i64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        Ok(DumpReader {
            input,
            summary: DumpSummary {
                format,
                created_ns,
                ..DumpSummary::default()
            },
            all: crc32fast::Hasher::new(),
            last_key: Vec::new(),
            frame: Vec::new(),
            done: false,
        })
    }

    /// The next frame's pairs, checked, passed to `each` in order; `Ok(false)` once the
    /// trailer was read and checked (and nothing follows it).
    pub fn next_frame(&mut self, each: &mut PairVisitor<'_>) -> DumpResult<bool> {
        if self.done {
            return Ok(false);
        }
        let pairs = self.summary.pairs;
        let incomplete = move || DumpError::Incomplete { pairs };
        let mut tag = [0u8; 1];
        read_exact_or(&mut self.input, &mut tag, incomplete)?;
        match tag[0] {
            FRAME_TAG => {}
            TRAILER_TAG => {
                self.trailer()?;
                return Ok(false);
            }
            other => {
                return Err(DumpError::Damaged(format!(
                    "a record of unknown kind {other:#04x} after {pairs} entries"
                )));
            }
        }
        let mut len = [0u8; 4];
        read_exact_or(&mut self.input, &mut len, incomplete)?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > FRAME_BYTES_MAX {
            return Err(DumpError::Damaged(format!(
                "a frame of {len} bytes after {pairs} entries"
            )));
        }
        self.frame.resize(len, 0);
        read_exact_or(&mut self.input, &mut self.frame, incomplete)?;
        let mut sum = [0u8; 4];
        read_exact_or(&mut self.input, &mut sum, incomplete)?;
        if crc(&self.frame) != u32::from_le_bytes(sum) {
            return Err(DumpError::Damaged(format!(
                "the checksum of the frame after {pairs} entries does not match"
            )));
        }
        self.all.update(&self.frame);
        self.summary.payload_bytes += len as u64;
        let frame = std::mem::take(&mut self.frame);
        let result = self.pairs_of(&frame, each);
        self.frame = frame;
        result.map(|()| true)
    }

    fn pairs_of(&mut self, frame: &[u8], each: &mut PairVisitor<'_>) -> DumpResult<()> {
        let mut at = 0;
        while at < frame.len() {
            let damaged = |what: &str| {
                DumpError::Damaged(format!("{what} after {} entries", self.summary.pairs))
            };
            let key = take_bytes(frame, &mut at).ok_or_else(|| damaged("a cut key"))?;
            let value = take_bytes(frame, &mut at).ok_or_else(|| damaged("a cut value"))?;
            if key.is_empty() || key.len() > calm_store::KEY_LEN_MAX {
                return Err(damaged("a key of no or too many bytes"));
            }
            if value.len() > calm_store::VALUE_LEN_MAX {
                return Err(damaged("a value of too many bytes"));
            }
            if key <= self.last_key.as_slice() {
                return Err(damaged("keys out of order"));
            }
            if !kept(key) {
                return Err(damaged("an entry a dump never holds"));
            }
            self.last_key.clear();
            self.last_key.extend_from_slice(key);
            self.summary.pairs += 1;
            if key.first() == Some(&layout::TAG_INODE) {
                self.summary.inodes += 1;
            }
            if key == KEY_CL_LAST {
                self.summary.changelog_last = counter(key, value)?;
            }
            if key == layout::KEY_OBJECTS {
                self.summary.objects_url = Some(String::from_utf8_lossy(value).into_owned());
            }
            each(key, value)?;
        }
        Ok(())
    }

    fn trailer(&mut self) -> DumpResult<()> {
        let pairs = self.summary.pairs;
        let mut rest = [0u8; TRAILER_LEN - 1];
        read_exact_or(&mut self.input, &mut rest, || DumpError::Incomplete {
            pairs,
        })?;
        let mut whole = vec![TRAILER_TAG];
        whole.extend_from_slice(&rest);
        if crc(&whole[..TRAILER_LEN - 4]) != u32_at(&whole, TRAILER_LEN - 4) {
            return Err(DumpError::Damaged(
                "the closing record's checksum does not match".into(),
            ));
        }
        let said_pairs = u64::from_le_bytes(whole[1..9].try_into().expect("8 bytes"));
        let said_bytes = u64::from_le_bytes(whole[9..17].try_into().expect("8 bytes"));
        let said_crc = u32_at(&whole, 17);
        if said_pairs != self.summary.pairs
            || said_bytes != self.summary.payload_bytes
            || said_crc != self.all.clone().finalize()
        {
            return Err(DumpError::Damaged(format!(
                "the closing record counts {said_pairs} entries of {said_bytes} bytes; the \
                 file holds {} of {}",
                self.summary.pairs, self.summary.payload_bytes
            )));
        }
        let mut extra = [0u8; 1];
        match self.input.read(&mut extra) {
            Ok(0) => {}
            Ok(_) => {
                return Err(DumpError::Damaged("bytes follow the closing record".into()));
            }
            Err(error) => return Err(io("reading the dump")(error)),
        }
        self.done = true;
        Ok(())
    }
}

fn read_exact_or(
    input: &mut impl Read,
    buf: &mut [u8],
    short: impl FnOnce() -> DumpError,
) -> DumpResult<()> {
    match input.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Err(short()),
        Err(error) => Err(io("reading the dump")(error)),
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn take_bytes<'a>(frame: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let len = usize::try_from(layout::take_varint(frame, at)?).ok()?;
    let end = at.checked_add(len)?;
    let bytes = frame.get(*at..end)?;
    *at = end;
    Some(bytes)
}

fn counter(key: &[u8], value: &[u8]) -> DumpResult<u64> {
    calm_store::decode_counter(key, value).map_err(|_| {
        DumpError::Damaged(format!("{} is not a counter", String::from_utf8_lossy(key)))
    })
}

/// Reads a whole dump and checks it (every checksum, the order of the keys, the closing
/// record), writing nothing: what [`load`] does first.
pub fn verify<R: Read>(input: R) -> DumpResult<DumpSummary> {
    let mut reader = DumpReader::new(input)?;
    while reader.next_frame(&mut |_, _| Ok(()))? {}
    Ok(reader.summary)
}

/// Pairs and bytes of one load transaction into `store`.
pub fn load_txn<S: Store>(store: &S) -> (usize, usize) {
    if store.shared() {
        LOAD_TXN_SHARED
    } else {
        LOAD_TXN_LOCAL
    }
}

/// Makes a new namespace in `store`, which must be empty, from the dump `open()` reads (called
/// twice: once to check the whole dump, once to load it), in transactions of at most `txn`
/// pairs and bytes ([`load_txn`]). `progress` gets the pairs written so far.
pub fn load<S: Store, R: Read>(
    store: &S,
    open: &mut dyn FnMut() -> DumpResult<R>,
    txn: (usize, usize),
    progress: &mut dyn FnMut(u64),
) -> DumpResult<DumpSummary> {
    let mut plan = LoadPlan {
        txn,
        replace: Vec::new(),
        progress,
        before_format: &mut || Ok(()),
    };
    load_with(store, open, &mut plan)
}

/// What a load changes of the dump, and what it does before the new store is whole.
#[allow(missing_debug_implementations)] // holds callbacks
pub struct LoadPlan<'a> {
    /// Pairs and bytes of one transaction ([`load_txn`]).
    pub txn: (usize, usize),
    /// Superblock fields whose value the load sets, whatever the dump holds (written also when
    /// the dump has none): the object store a copy keeps its contents in, its claim on it.
    pub replace: Vec<(Vec<u8>, Vec<u8>)>,
    /// Gets the pairs written so far.
    pub progress: &'a mut dyn FnMut(u64),
    /// Called once every pair but the format field is written, before the one transaction
    /// that makes the store whole: the last work a load must finish first (the copy of the
    /// objects its files name into a store of its own).
    pub before_format: &'a mut dyn FnMut() -> DumpResult<()>,
}

/// [`load`] by a plan: `plan.replace` overrides the dump's superblock fields and
/// `plan.before_format` runs before the format field is written.
pub fn load_with<S: Store, R: Read>(
    store: &S,
    open: &mut dyn FnMut() -> DumpResult<R>,
    plan: &mut LoadPlan<'_>,
) -> DumpResult<DumpSummary> {
    let (txn, progress) = (plan.txn, &mut *plan.progress);
    let mut replace = std::mem::take(&mut plan.replace);
    // A load never makes a second owner of an object store: the copy's claim is its own.
    if !replace.iter().any(|(k, _)| k == layout::KEY_OBJECTS_OWNER) {
        replace.push((
            layout::KEY_OBJECTS_OWNER.to_vec(),
            crate::open::random_id().to_vec(),
        ));
    }
    let checked = verify(open()?)?;
    {
        let snapshot = store.snapshot()?;
        if snapshot.any_in(b"", b"")? || snapshot.log_last()?.is_some() {
            return Err(DumpError::NotEmpty);
        }
    }
    let (pairs_max, bytes_max) = (txn.0.max(1), txn.1.max(1));
    let mut reader = DumpReader::new(open()?)?;
    let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut format = None;
    let mut written = 0u64;
    let partial = |error: DumpError| match error {
        DumpError::Store(error) => DumpError::Partial(error.to_string()),
        other => other,
    };
    loop {
        let more = reader
            .next_frame(&mut |key, value| {
                let value = match key {
                    KEY_FORMAT => {
                        format = Some(value.to_vec());
                        return Ok(());
                    }
                    _ if replace.iter().any(|(k, _)| k == key) => return Ok(()),
                    KEY_HWM | KEY_SLICE_NEXT => counter(key, value)?
                        .checked_add(LOAD_ID_GAP)
                        .ok_or_else(|| {
                            DumpError::Damaged(format!(
                                "{} is too large to move past",
                                String::from_utf8_lossy(key)
                            ))
                        })?
                        .to_le_bytes()
                        .to_vec(),
                    _ => value.to_vec(),
                };
                batch_bytes += key.len() + value.len();
                batch.push((key.to_vec(), value));
                if batch.len() >= pairs_max || batch_bytes >= bytes_max {
                    written += write_batch(store, &mut batch)?;
                    batch_bytes = 0;
                    progress(written);
                }
                Ok(())
            })
            .map_err(partial)?;
        if !more {
            break;
        }
    }
    // The format field last, alone: until it is there, no server opens the store.
    let format =
        format.ok_or_else(|| DumpError::Damaged("the dump holds no format field".into()))?;
    batch.append(&mut replace);
    write_batch(store, &mut batch).map_err(partial)?;
    (plan.before_format)().map_err(|e| match e {
        DumpError::Partial(_) => e,
        other => DumpError::Partial(other.to_string()),
    })?;
    batch.push((KEY_FORMAT.to_vec(), format));
    write_batch(store, &mut batch).map_err(partial)?;
    Ok(checked)
}

fn write_batch<S: Store>(store: &S, batch: &mut Vec<(Vec<u8>, Vec<u8>)>) -> DumpResult<u64> {
    let mut txn = store.begin()?;
    for (key, value) in batch.iter() {
        txn.put(key, value)?;
    }
    txn.commit()?;
    let n = batch.len() as u64;
    batch.clear();
    Ok(n)
}
