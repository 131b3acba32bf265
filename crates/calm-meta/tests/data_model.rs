//! Model-based test of file contents in the metadata: random writes (as objects, and with
//! their bytes inline), holes, appends, truncates and compactions of one file, applied to the
//! real namespace (over the in-memory store) and to a plain byte array side by side. After
//! every step the file reads (through its map, its inline bytes and a stand-in object store) as
//! the byte array, and no object is lost or leaked: every object ever placed is named by a
//! record of the file or waits in the deletion queue, never both; inline bytes are never
//! queued, and fsck (which checks that every inline slice named has its bytes and no bytes are
//! left unnamed) finds nothing wrong after any step. After the file's unlink, every object is
//! in the queue and no inline bytes are left. Run twice: near a chunk's end (writes and
//! appends cross it; nothing may be inline there) and at a file's start.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use calm_meta::slices::{
    CHUNK_BYTES, INLINE, INLINE_CHUNK_BYTES_MAX, INLINE_FILE_BYTES_MAX, INLINE_SLICE_BYTES_MAX,
    Slice, Source, encode_chunk, is_inline, pieces_in, split, view,
};
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use proptest::prelude::*;

/// Offsets are kept near a chunk's end, so that writes and appends cross it; or at the start
/// of the file, where writes may be inline.
const NEAR_CHUNK_END: u64 = CHUNK_BYTES - 200;
const SPAN: u64 = 400;

#[derive(Debug, Clone)]
enum Step {
    Write {
        at: u64,
        len: u64,
    },
    /// A write whose bytes go inline (where they may: else as an object).
    InlineWrite {
        at: u64,
        len: u64,
    },
    Hole {
        at: u64,
        len: u64,
    },
    Append {
        len: u64,
    },
    /// An append with its bytes inline (as an object where the server refuses them, as a
    /// mount does).
    InlineAppend {
        len: u64,
    },
    Truncate {
        size: u64,
    },
    /// A compaction of every chunk, as the server's compactor makes it (forced: it always
    /// merges); with `between`, a write lands after the compaction read the chunk and before it
    /// commits, and stays on top. With `flush`, of every chunk but the first, the compaction
    /// that moves the chunk's inline bytes into an object.
    Compact {
        between: Option<(u64, u64)>,
        flush: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..SPAN, 1..120u64).prop_map(|(at, len)| Step::Write { at, len }),
        3 => (0..SPAN, 1..120u64).prop_map(|(at, len)| Step::InlineWrite { at, len }),
        1 => (0..SPAN, 1..120u64).prop_map(|(at, len)| Step::Hole { at, len }),
        2 => (1..150u64).prop_map(|len| Step::Append { len }),
        2 => (1..150u64).prop_map(|len| Step::InlineAppend { len }),
        1 => (0..SPAN + 100).prop_map(|size| Step::Truncate { size }),
        1 => (prop::option::of((0..SPAN, 1..120u64)), any::<bool>())
            .prop_map(|(between, flush)| Step::Compact { between, flush }),
    ]
}

/// One stand-in object: `skip` zero bytes (a compacted chunk's unwritten head, up to 64 MiB,
/// is not kept), then `bytes`.
struct Object {
    skip: usize,
    bytes: Vec<u8>,
}

impl Object {
    fn at(&self, off: usize) -> u8 {
        if off < self.skip {
            0
        } else {
            self.bytes[off - self.skip]
        }
    }
}

/// The stand-in object store: each object's bytes.
type Objects = HashMap<u64, Object>;

fn content(id: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| ((id * 31 + i) % 251 + 1) as u8).collect()
}

/// The file as its map reads: bytes `[base, size)`.
fn read(
    meta: &Meta<Arc<MemStore>>,
    handle: Handle,
    objects: &Objects,
    base: u64,
) -> (u64, Vec<u8>) {
    let map = meta.read_map(handle, 0, MAP_RECORDS_MAX).unwrap();
    let inline: HashMap<u64, Object> = map
        .inline
        .iter()
        .map(|(id, bytes)| {
            (
                *id,
                Object {
                    skip: 0,
                    bytes: bytes.clone(),
                },
            )
        })
        .collect();
    let size = map.attr.size;
    let mut out = vec![0u8; size.saturating_sub(base) as usize];
    for (chunk, records) in &map.chunks {
        let start = chunk * CHUNK_BYTES;
        for piece in pieces_in(&view(records), 0, CHUNK_BYTES as u32) {
            if let Source::Object { id, off, .. } = piece.source {
                let object = match is_inline(id) {
                    true => &inline[&id],
                    false => &objects[&id],
                };
                // Only the bytes of [base, size): a piece may start at the chunk's head.
                let from = base
                    .saturating_sub(start + u64::from(piece.pos))
                    .min(u64::from(piece.len));
                for i in from as u32..piece.len {
                    let at = start + u64::from(piece.pos + i);
                    if at < size {
                        out[(at - base) as usize] = object.at((off + i) as usize);
                    }
                }
            }
        }
    }
    (size, out)
}

/// The bytes `[pos, pos + len)` of a chunk holding `records`: `(zero bytes at the head, the
/// rest)` (a compacted range's unwritten head, up to 64 MiB, is not kept).
fn range_bytes(
    meta: &Meta<Arc<MemStore>>,
    records: &[Slice],
    objects: &Objects,
    pos: u32,
    len: u32,
) -> (usize, Vec<u8>) {
    let pieces = pieces_in(&view(records), pos, pos + len);
    let inline_ids: Vec<u64> = pieces
        .iter()
        .filter_map(|p| match p.source {
            Source::Object { id, .. } if is_inline(id) => Some(id),
            _ => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let inline: HashMap<u64, Vec<u8>> = meta
        .inline_bytes(&inline_ids)
        .unwrap()
        .into_iter()
        .collect();
    let at = |id: u64, off: usize| -> u8 {
        if is_inline(id) {
            inline[&id][off]
        } else {
            objects[&id].at(off)
        }
    };
    // Where each piece's kept bytes begin: past its object's zero head.
    let zero_head = |id: u64, off: u32, n: u32| -> u32 {
        if is_inline(id) {
            0
        } else {
            (objects[&id].skip as u32).saturating_sub(off).min(n)
        }
    };
    let skip = pieces
        .iter()
        .filter_map(|p| match p.source {
            Source::Object { id, off, .. } => Some(p.pos - pos + zero_head(id, off, p.len)),
            _ => None,
        })
        .min()
        .unwrap_or(len) as usize;
    let mut bytes = vec![0u8; len as usize - skip];
    for piece in pieces {
        if let Source::Object { id, off, .. } = piece.source {
            for i in zero_head(id, off, piece.len) as usize..piece.len as usize {
                bytes[(piece.pos - pos) as usize + i - skip] = at(id, off as usize + i);
            }
        }
    }
    (skip, bytes)
}

/// The whole bytes of a merged range (small enough to be inline).
fn merged_bytes(
    meta: &Meta<Arc<MemStore>>,
    records: &[Slice],
    objects: &Objects,
    pos: u32,
    len: u32,
) -> Vec<u8> {
    let (skip, bytes) = range_bytes(meta, records, objects, pos, len);
    let mut whole = vec![0u8; skip];
    whole.extend_from_slice(&bytes);
    whole
}

/// The new slice of a compaction merging `[pos, pos + len)` of `chunk`, as the server's
/// compactor makes it (inline when small at the file's start, unless it is a flush), and its
/// object when it is one.
#[allow(clippy::too_many_arguments)]
fn merged(
    runtime: &tokio::runtime::Runtime,
    meta: &Meta<Arc<MemStore>>,
    records: &[Slice],
    objects: &Objects,
    chunk: u64,
    pos: u32,
    len: u32,
    flush: bool,
) -> (Slice, Option<Object>) {
    let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
    let small = !flush
        && len <= INLINE_SLICE_BYTES_MAX
        && chunk * CHUNK_BYTES + u64::from(pos + len) <= INLINE_FILE_BYTES_MAX;
    let slice = Slice {
        id: if small { id | INLINE } else { id },
        size: len,
        off: 0,
        len,
        pos,
    };
    if small {
        return (slice, None);
    }
    let (skip, bytes) = range_bytes(meta, records, objects, pos, len);
    (slice, Some(Object { skip, bytes }))
}

/// Objects named by the file's records.
fn named(meta: &Meta<Arc<MemStore>>, handle: Handle) -> BTreeSet<u64> {
    match meta.read_map(handle, 0, MAP_RECORDS_MAX) {
        Ok(map) => map
            .chunks
            .iter()
            .flat_map(|(_, r)| r.iter().map(|s| s.id))
            .filter(|id| slices::is_object(*id))
            .collect(),
        Err(MetaError::NotFound) => BTreeSet::new(),
        Err(e) => panic!("{e}"),
    }
}

fn queued(meta: &Meta<Arc<MemStore>>) -> Vec<u64> {
    meta.garbage(u64::MAX, usize::MAX)
        .unwrap()
        .iter()
        .map(|g| g.id)
        .collect()
}

fn check_no_loss(
    meta: &Meta<Arc<MemStore>>,
    handle: Handle,
    placed: &BTreeSet<u64>,
) -> Result<(), TestCaseError> {
    let named = named(meta, handle);
    let queued = queued(meta);
    let queued_set: BTreeSet<u64> = queued.iter().copied().collect();
    prop_assert_eq!(queued.len(), queued_set.len(), "an object queued twice");
    prop_assert!(
        named.is_disjoint(&queued_set),
        "queued while named: {:?}",
        named.intersection(&queued_set).collect::<Vec<_>>()
    );
    let all: BTreeSet<u64> = named.union(&queued_set).copied().collect();
    prop_assert_eq!(&all, placed, "an object was lost or appeared");
    Ok(())
}

fn clean(store: &Arc<MemStore>) -> Result<(), TestCaseError> {
    let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
    prop_assert!(report.is_clean(), "fsck: {:?}", report.problems);
    Ok(())
}

/// What a step changes: the namespace's file and the models beside it.
struct Files<'a> {
    runtime: &'a tokio::runtime::Runtime,
    meta: &'a Meta<Arc<MemStore>>,
    file: Handle,
    base: u64,
    model: &'a mut Vec<u8>,
    objects: &'a mut Objects,
    placed: &'a mut BTreeSet<u64>,
}

impl Files<'_> {
    /// A write of `len` bytes at `at`: one slice per chunk the write touches, as a mount
    /// makes them, inline where `inline_asked` and where it may be.
    fn write(&mut self, at: u64, len: u64, inline_asked: bool) {
        let (runtime, meta, base) = (self.runtime, self.meta, self.base);
        let inline_asked = inline_asked && base + at + len <= INLINE_FILE_BYTES_MAX;
        let mut records = Vec::new();
        let mut inline = Vec::new();
        let mut done = 0;
        for (chunk, pos, n) in split(base + at, len) {
            let mut id = runtime.block_on(meta.alloc_slices(1)).unwrap();
            let bytes = content(id, u64::from(n));
            if inline_asked {
                id |= INLINE;
                inline.push((id, bytes.clone()));
            } else {
                self.objects.insert(
                    id,
                    Object {
                        skip: 0,
                        bytes: bytes.clone(),
                    },
                );
                self.placed.insert(id);
            }
            records.push((
                chunk,
                Slice {
                    id,
                    size: n,
                    off: 0,
                    len: n,
                    pos,
                },
            ));
            let from = (at + done) as usize;
            if self.model.len() < from + n as usize {
                self.model.resize(from + n as usize, 0);
            }
            self.model[from..from + n as usize].copy_from_slice(&bytes);
            done += u64::from(n);
        }
        runtime
            .block_on(meta.write(Caller::default(), self.file, records, 0, inline))
            .unwrap();
    }
}

/// Runs `steps` on a file whose bytes before `base` are not looked at.
fn run(base: u64, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let file = runtime
        .block_on(meta.create(ROOT, b"f", 0o644))
        .unwrap()
        .handle;
    // Everything happens past base: make the file start there.
    if base > 0 {
        runtime
            .block_on(meta.setattr(
                file,
                SetAttr {
                    size: Some(base),
                    ..SetAttr::default()
                },
            ))
            .unwrap();
    }
    let caller = Caller::default();
    let mut model: Vec<u8> = Vec::new();
    let mut objects: Objects = HashMap::new();
    let mut placed: BTreeSet<u64> = BTreeSet::new();
    for step in steps {
        match step {
            Step::Write { at, len } | Step::InlineWrite { at, len } => {
                let inline_asked = matches!(step, Step::InlineWrite { .. });
                let mut files = Files {
                    runtime: &runtime,
                    meta: &meta,
                    file,
                    base,
                    model: &mut model,
                    objects: &mut objects,
                    placed: &mut placed,
                };
                files.write(at, len, inline_asked);
            }
            Step::Hole { at, len } => {
                let size = base + model.len() as u64;
                let end = (base + at + len).min(size);
                if base + at >= end {
                    continue;
                }
                let holes: Vec<_> = split(base + at, end - base - at)
                    .into_iter()
                    .map(|(chunk, pos, n)| (chunk, Slice::hole(pos, n)))
                    .collect();
                model[at as usize..(end - base) as usize].fill(0);
                runtime
                    .block_on(meta.write(caller.clone(), file, holes, 0, Vec::new()))
                    .unwrap();
            }
            Step::Append { len } => {
                let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
                objects.insert(
                    id,
                    Object {
                        skip: 0,
                        bytes: content(id, len),
                    },
                );
                placed.insert(id);
                model.extend_from_slice(&objects[&id].bytes);
                runtime
                    .block_on(meta.append(caller.clone(), file, id, len as u32, None))
                    .unwrap();
            }
            Step::InlineAppend { len } => {
                let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
                let bytes = content(id, len);
                let inline = runtime.block_on(meta.append(
                    caller.clone(),
                    file,
                    id | INLINE,
                    len as u32,
                    Some(bytes.clone()),
                ));
                match inline {
                    Ok(_) => {}
                    // Across a chunk's end: as an object.
                    Err(MetaError::NotSupported(_)) => {
                        objects.insert(
                            id,
                            Object {
                                skip: 0,
                                bytes: bytes.clone(),
                            },
                        );
                        placed.insert(id);
                        runtime
                            .block_on(meta.append(caller.clone(), file, id, len as u32, None))
                            .unwrap();
                    }
                    Err(error) => panic!("inline append: {error}"),
                }
                model.extend_from_slice(&bytes);
            }
            Step::Truncate { size } => {
                model.resize(size as usize, 0);
                let change = SetAttr {
                    size: Some(base + size),
                    ..SetAttr::default()
                };
                runtime.block_on(meta.setattr(file, change)).unwrap();
            }
            Step::Compact { between, flush } => {
                let map = meta.read_map(file, 0, MAP_RECORDS_MAX).unwrap();
                for (chunk, _) in map.chunks {
                    let read = meta.read_chunk(file, chunk).unwrap();
                    let plan = match flush {
                        true if chunk == 0 => None,
                        true => compaction::plan_flush(&read.records),
                        false => compaction::plan(&read.records, true),
                    };
                    let Some(plan) = plan else {
                        continue;
                    };
                    let (slice, inline_bytes) = match plan.merge {
                        None => (None, None),
                        Some((pos, len)) => {
                            let (slice, object) = merged(
                                &runtime,
                                &meta,
                                &read.records,
                                &objects,
                                chunk,
                                pos,
                                len,
                                flush,
                            );
                            match object {
                                Some(object) => {
                                    objects.insert(slice.id, object);
                                    placed.insert(slice.id);
                                    (Some(slice), None)
                                }
                                None => {
                                    let bytes =
                                        merged_bytes(&meta, &read.records, &objects, pos, len);
                                    (Some(slice), Some(bytes))
                                }
                            }
                        }
                    };
                    if let Some((at, len)) = between {
                        let mut files = Files {
                            runtime: &runtime,
                            meta: &meta,
                            file,
                            base,
                            model: &mut model,
                            objects: &mut objects,
                            placed: &mut placed,
                        };
                        files.write(at, len, false);
                    }
                    runtime
                        .block_on(meta.compact(
                            file,
                            chunk,
                            read.value,
                            plan.kept,
                            slice,
                            inline_bytes,
                        ))
                        .unwrap();
                    if flush {
                        // Writes between are never inline: the flush leaves none.
                        let after = meta.read_chunk(file, chunk).unwrap();
                        prop_assert!(after.records.iter().all(|r| !is_inline(r.id)));
                    }
                }
            }
        }
        let (size, bytes) = read(&meta, file, &objects, base);
        prop_assert_eq!(size, base + model.len() as u64);
        prop_assert_eq!(&bytes, &model);
        check_no_loss(&meta, file, &placed)?;
        clean(&store)?;
    }
    // A compaction over a chunk that changed meanwhile is refused and changes nothing. The
    // read it names holds a slice id just allocated, so no chunk can hold it.
    let never_written = runtime.block_on(meta.alloc_slices(1)).unwrap();
    let before = store.dump();
    let stale = runtime.block_on(meta.compact(
        file,
        0,
        encode_chunk(&[Slice {
            id: never_written,
            size: 1,
            off: 0,
            len: 1,
            pos: 0,
        }]),
        Vec::new(),
        None,
        None,
    ));
    prop_assert!(stale.is_err());
    prop_assert!(store.dump() == before);

    runtime.block_on(meta.unlink(ROOT, b"f")).unwrap();
    check_no_loss(&meta, file, &placed)?;
    prop_assert!(named(&meta, file).is_empty());
    let left = store
        .dump()
        .into_iter()
        .filter(|(k, _)| k[0] == b'K')
        .count();
    prop_assert_eq!(left, 0, "inline bytes outlived their file");
    clean(&store)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn contents_read_as_written_and_no_object_is_lost(steps in prop::collection::vec(step(), 1..60)) {
        run(NEAR_CHUNK_END, steps)?;
    }

    #[test]
    fn inline_contents_read_as_written_and_leave_nothing_behind(steps in prop::collection::vec(step(), 1..60)) {
        run(0, steps)?;
    }
}

/// A file's inline bytes are bounded: once its first chunk's inline slices hold
/// `INLINE_CHUNK_BYTES_MAX`, a write with more is refused as not supported (the writer places
/// objects instead) and changes nothing; bad inline writes are refused too.
#[test]
fn inline_bytes_stop_at_their_limit_and_bad_ones_are_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    let file = runtime
        .block_on(meta.create(ROOT, b"f", 0o644))
        .unwrap()
        .handle;
    let size = INLINE_SLICE_BYTES_MAX;
    let write = |id: u64, bytes: Vec<u8>, pos: u32| {
        let slice = Slice {
            id,
            size: bytes.len() as u32,
            off: 0,
            len: bytes.len() as u32,
            pos,
        };
        runtime.block_on(meta.write(
            Caller::default(),
            file,
            vec![(0, slice)],
            0,
            vec![(id, bytes)],
        ))
    };
    let full = (INLINE_CHUNK_BYTES_MAX / u64::from(size)) as usize;
    for _ in 0..full {
        let id = runtime.block_on(meta.alloc_slices(1)).unwrap() | INLINE;
        write(id, vec![7u8; size as usize], 0).unwrap();
    }
    let id = runtime.block_on(meta.alloc_slices(1)).unwrap() | INLINE;
    let before = store.dump();
    assert!(matches!(
        write(id, vec![8u8; 1], 0),
        Err(MetaError::NotSupported(_))
    ));
    // Wrong length, past the file's first chunk, never handed out, or without its bytes.
    assert!(matches!(
        write(id, vec![8u8; 0], 0),
        Err(MetaError::Invalid(_))
    ));
    let far = (INLINE_FILE_BYTES_MAX - 1) as u32;
    assert!(matches!(
        write(id, vec![8u8; 2], far),
        Err(MetaError::Invalid(_))
    ));
    assert!(matches!(
        write((1 << 40) | INLINE, vec![8u8; 2], 0),
        Err(MetaError::Invalid(_))
    ));
    let bare = Slice {
        id,
        size: 3,
        off: 0,
        len: 3,
        pos: 0,
    };
    assert!(matches!(
        runtime.block_on(meta.write(Caller::default(), file, vec![(0, bare)], 0, Vec::new())),
        Err(MetaError::Invalid(_))
    ));
    assert!(store.dump() == before, "a refused write changed the store");
    // As an object it goes in.
    let object = runtime.block_on(meta.alloc_slices(1)).unwrap();
    let slice = Slice {
        id: object,
        size: 1,
        off: 0,
        len: 1,
        pos: 0,
    };
    runtime
        .block_on(meta.write(Caller::default(), file, vec![(0, slice)], 0, Vec::new()))
        .unwrap();
    let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    assert_eq!(report.inline_slices, full as u64);
}
