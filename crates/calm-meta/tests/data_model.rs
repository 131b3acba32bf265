//! Model-based test of file contents in the metadata: random writes, holes, appends, truncates
//! and compactions of one file, applied to the real namespace (over the in-memory store) and to
//! a plain byte array side by side. After every step the file reads (through its map and a
//! stand-in object store) as the byte array, and no object is lost or leaked: every object ever
//! placed is named by a record of the file or waits in the deletion queue, never both. After
//! the file's unlink, every object is in the queue. fsck finds nothing wrong throughout.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use calm_meta::slices::{CHUNK_BYTES, Slice, Source, pieces_in, split, view};
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use proptest::prelude::*;

/// Offsets are kept near a chunk's end, so that writes and appends cross it.
const BASE: u64 = CHUNK_BYTES - 200;
const SPAN: u64 = 400;

#[derive(Debug, Clone)]
enum Step {
    Write { at: u64, len: u64 },
    Hole { at: u64, len: u64 },
    Append { len: u64 },
    Truncate { size: u64 },
    Compact,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..SPAN, 1..120u64).prop_map(|(at, len)| Step::Write { at, len }),
        1 => (0..SPAN, 1..120u64).prop_map(|(at, len)| Step::Hole { at, len }),
        2 => (1..150u64).prop_map(|len| Step::Append { len }),
        1 => (0..SPAN + 100).prop_map(|size| Step::Truncate { size }),
        1 => Just(Step::Compact),
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

/// The file as its map reads: bytes `[BASE, size)`.
fn read(meta: &Meta<Arc<MemStore>>, handle: Handle, objects: &Objects) -> (u64, Vec<u8>) {
    let map = meta.read_map(handle, 0, MAP_RECORDS_MAX).unwrap();
    let size = map.attr.size;
    let mut out = vec![0u8; size.saturating_sub(BASE) as usize];
    for (chunk, records) in &map.chunks {
        let start = chunk * CHUNK_BYTES;
        for piece in pieces_in(&view(records), 0, CHUNK_BYTES as u32) {
            if let Source::Object { id, off, .. } = piece.source {
                let object = &objects[&id];
                // Only the bytes of [BASE, size): a piece may start at the chunk's head.
                let from = BASE
                    .saturating_sub(start + u64::from(piece.pos))
                    .min(u64::from(piece.len));
                for i in from as u32..piece.len {
                    let at = start + u64::from(piece.pos + i);
                    if at < size {
                        out[(at - BASE) as usize] = object.at((off + i) as usize);
                    }
                }
            }
        }
    }
    (size, out)
}

/// Objects named by the file's records.
fn named(meta: &Meta<Arc<MemStore>>, handle: Handle) -> BTreeSet<u64> {
    match meta.read_map(handle, 0, MAP_RECORDS_MAX) {
        Ok(map) => map
            .chunks
            .iter()
            .flat_map(|(_, r)| r.iter().map(|s| s.id))
            .filter(|id| *id != slices::HOLE)
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn contents_read_as_written_and_no_object_is_lost(steps in prop::collection::vec(step(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Arc::new(MemStore::new());
        let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
        let file = runtime.block_on(meta.create(ROOT, b"f", 0o644)).unwrap().handle;
        // Everything happens past BASE: make the file start there.
        runtime.block_on(meta.setattr(file, SetAttr { size: Some(BASE), ..SetAttr::default() })).unwrap();
        let caller = Caller::default();
        let mut model: Vec<u8> = Vec::new();
        let mut objects: Objects = HashMap::new();
        let mut placed: BTreeSet<u64> = BTreeSet::new();
        for step in steps {
            match step {
                Step::Write { at, len } => {
                    // One object per chunk the write touches, as a mount makes them.
                    let mut records = Vec::new();
                    let mut done = 0;
                    for (chunk, pos, n) in split(BASE + at, len) {
                        let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
                        objects.insert(id, Object { skip: 0, bytes: content(id, u64::from(n)) });
                        placed.insert(id);
                        records.push((chunk, Slice { id, size: n, off: 0, len: n, pos }));
                        let bytes = &objects[&id].bytes;
                        let from = (at + done) as usize;
                        if model.len() < from + n as usize { model.resize(from + n as usize, 0); }
                        model[from..from + n as usize].copy_from_slice(bytes);
                        done += u64::from(n);
                    }
                    runtime.block_on(meta.write(caller.clone(), file, records, 0)).unwrap();
                }
                Step::Hole { at, len } => {
                    let size = BASE + model.len() as u64;
                    let end = (BASE + at + len).min(size);
                    if BASE + at >= end { continue; }
                    let holes: Vec<_> = split(BASE + at, end - BASE - at)
                        .into_iter()
                        .map(|(chunk, pos, n)| (chunk, Slice::hole(pos, n)))
                        .collect();
                    model[at as usize..(end - BASE) as usize].fill(0);
                    runtime.block_on(meta.write(caller.clone(), file, holes, 0)).unwrap();
                }
                Step::Append { len } => {
                    let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
                    objects.insert(id, Object { skip: 0, bytes: content(id, len) });
                    placed.insert(id);
                    model.extend_from_slice(&objects[&id].bytes);
                    runtime.block_on(meta.append(caller.clone(), file, id, len as u32)).unwrap();
                }
                Step::Truncate { size } => {
                    model.resize(size as usize, 0);
                    let change = SetAttr { size: Some(BASE + size), ..SetAttr::default() };
                    runtime.block_on(meta.setattr(file, change)).unwrap();
                }
                Step::Compact => {
                    // As the server's compactor: every chunk's visible bytes as one object.
                    let map = meta.read_map(file, 0, MAP_RECORDS_MAX).unwrap();
                    for (chunk, _) in map.chunks {
                        let (records, value) = meta.read_chunk(file, chunk).unwrap();
                        let len = slices::extent(&records) as u32;
                        let pieces = view(&records);
                        // Where each piece's kept bytes begin: past its object's zero head.
                        let kept = |id: u64, off: u32, len: u32| {
                            (objects[&id].skip as u32).saturating_sub(off).min(len)
                        };
                        let skip = pieces
                            .iter()
                            .filter_map(|p| match p.source {
                                Source::Object { id, off, .. } => Some(p.pos + kept(id, off, p.len)),
                                _ => None,
                            })
                            .min()
                            .unwrap_or(len) as usize;
                        let mut bytes = vec![0u8; len as usize - skip];
                        for piece in pieces {
                            if let Source::Object { id, off, .. } = piece.source {
                                let object = &objects[&id];
                                for i in kept(id, off, piece.len) as usize..piece.len as usize {
                                    bytes[piece.pos as usize + i - skip] = object.at(off as usize + i);
                                }
                            }
                        }
                        let id = runtime.block_on(meta.alloc_slices(1)).unwrap();
                        objects.insert(id, Object { skip, bytes });
                        placed.insert(id);
                        let slice = Slice { id, size: len, off: 0, len, pos: 0 };
                        runtime.block_on(meta.compact(file, chunk, value, slice)).unwrap();
                    }
                }
            }
            let (size, bytes) = read(&meta, file, &objects);
            prop_assert_eq!(size, BASE + model.len() as u64);
            prop_assert_eq!(&bytes, &model);
            check_no_loss(&meta, file, &placed)?;
        }
        // A compaction over a chunk that changed meanwhile is refused and changes nothing.
        let before = store.dump();
        let stale = runtime.block_on(meta.compact(file, 0, b"not the chunk".to_vec(), Slice { id: 1, size: 1, off: 0, len: 1, pos: 0 }));
        prop_assert!(stale.is_err());
        prop_assert!(store.dump() == before);

        runtime.block_on(meta.unlink(ROOT, b"f")).unwrap();
        check_no_loss(&meta, file, &placed)?;
        prop_assert!(named(&meta, file).is_empty());
        let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
        prop_assert!(report.is_clean(), "fsck: {:?}", report.problems);
    }
}
