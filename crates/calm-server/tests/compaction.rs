//! The compactor through the server's own write and append calls: a write into a full chunk
//! waits for the chunk's compaction instead of failing, and writers that never pause are never
//! refused and never starve the compactor; the file reads as written throughout.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use calm_data::Objects;
use calm_meta::compaction::CHUNK_SLICES_COMPACT_ALWAYS;
use calm_meta::slices::{
    CHUNK_BYTES, CHUNK_SLICES_MAX, INLINE, Slice, Source, is_inline, pieces_in, view,
};
use calm_meta::{Caller, MAP_RECORDS_MAX, Meta, MetaError, MetaOptions, ROOT};
use calm_proto::pb;
use calm_store::mem::MemStore;

struct Fixture {
    meta: Arc<Meta<Arc<MemStore>>>,
    service: Arc<dyn pb::meta_server::Meta<HoldsStream = calm_server::holds::RecallStream>>,
    objects: Objects,
    _server: calm_server::Server<Arc<MemStore>>,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = Objects::open(&calm_data::url::ObjectsUrl::file(
        &dir.path().join("objects"),
    ))
    .unwrap();
    let meta = Arc::new(Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap());
    let info = calm_server::ServerInfo {
        data: Some(calm_upkeep::data::DataOptions {
            objects: objects.clone(),
            delete_delay: Duration::from_secs(3600),
            orphan_claim_grace: Duration::from_secs(60),
        }),
        ..calm_server::ServerInfo::plain()
    };
    let server = calm_server::Server::start(meta.clone(), info).await;
    Fixture {
        service: server.meta_service(),
        meta,
        objects,
        _server: server,
        _dir: dir,
    }
}

/// A request as a client in the server's own process sends it.
fn local<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(calm_proto::InProcess);
    request
}

impl Fixture {
    async fn ids(&self, count: u64) -> u64 {
        self.meta.alloc_slices(count).await.unwrap()
    }

    /// Writes `data` at `pos` of the file's first chunk through the server: inline, or as an
    /// object when the file's inline bytes are at their limit (as a mount does).
    async fn write(&self, file: u64, id: u64, pos: u32, data: Vec<u8>) -> Result<(), MetaError> {
        let len = data.len() as u32;
        let slice = |id| Slice {
            id,
            size: len,
            off: 0,
            len,
            pos,
        };
        let request = |id, inline| pb::WriteRequest {
            handle: file,
            records: vec![calm_proto::slice_to_wire(0, &slice(id))],
            end: 0,
            inline,
            set_attr: None,
        };
        let inline = vec![pb::InlineBytes {
            id: id | INLINE,
            data: data.clone(),
        }];
        match self
            .service
            .write(local(request(id | INLINE, inline)))
            .await
        {
            Ok(_) => Ok(()),
            Err(status) => match calm_proto::error_from_status(&status) {
                MetaError::NotSupported(_) => {
                    self.put(id, data).await;
                    let written = self.service.write(local(request(id, Vec::new()))).await;
                    written
                        .map(|_| ())
                        .map_err(|s| calm_proto::error_from_status(&s))
                }
                error => Err(error),
            },
        }
    }

    /// Appends `data` through the server, inline or as an object (as [`Fixture::write`]).
    async fn append(&self, file: u64, id: u64, data: Vec<u8>) -> Result<(), MetaError> {
        let request = |id, inline| pb::AppendRequest {
            handle: file,
            id,
            size: data.len() as u32,
            inline,
        };
        match self
            .service
            .append(local(request(id | INLINE, Some(data.clone()))))
            .await
        {
            Ok(_) => Ok(()),
            Err(status) => match calm_proto::error_from_status(&status) {
                MetaError::NotSupported(_) => {
                    self.put(id, data.clone()).await;
                    let appended = self.service.append(local(request(id, None))).await;
                    appended
                        .map(|_| ())
                        .map_err(|s| calm_proto::error_from_status(&s))
                }
                error => Err(error),
            },
        }
    }

    async fn put(&self, id: u64, data: Vec<u8>) {
        self.objects
            .put_block(id, 0, bytes::Bytes::from(data))
            .await
            .unwrap();
    }

    async fn status(&self) -> pb::StatusReply {
        self.service
            .status(local(pb::Empty {}))
            .await
            .unwrap()
            .into_inner()
    }

    /// The file's bytes, read through its map, its inline bytes and the object store.
    async fn read(&self, file: u64) -> Vec<u8> {
        self.read_from(file, 0).await
    }

    /// The file's bytes from byte `from` (a multiple of the chunk size) on.
    async fn read_from(&self, file: u64, from: u64) -> Vec<u8> {
        assert_eq!(from % CHUNK_BYTES, 0);
        let map = self
            .meta
            .read_map(file, from / CHUNK_BYTES, MAP_RECORDS_MAX)
            .unwrap();
        assert!(!map.more);
        let inline: HashMap<u64, Vec<u8>> = map.inline.into_iter().collect();
        let mut out = vec![0u8; (map.attr.size - from) as usize];
        for (chunk, records) in &map.chunks {
            let base = chunk * CHUNK_BYTES - from;
            let end = (map.attr.size - chunk * CHUNK_BYTES).min(CHUNK_BYTES) as u32;
            for piece in pieces_in(&view(records), 0, end) {
                let Source::Object { id, size, off } = piece.source else {
                    continue;
                };
                let at = (base + u64::from(piece.pos)) as usize
                    ..(base + u64::from(piece.pos + piece.len)) as usize;
                if is_inline(id) {
                    out[at].copy_from_slice(&inline[&id][off as usize..][..piece.len as usize]);
                } else {
                    let bytes = self.objects.read(id, size, off, piece.len).await.unwrap();
                    out[at].copy_from_slice(&bytes);
                }
            }
        }
        out
    }

    fn records(&self, file: u64) -> usize {
        self.meta.chunk_record_count(file, 0).unwrap()
    }

    fn inline_records(&self, file: u64, chunk: u64) -> usize {
        let read = self.meta.read_chunk(file, chunk).unwrap();
        read.records.iter().filter(|r| is_inline(r.id)).count()
    }
}

fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(131).wrapping_add(i * 7) % 251 + 1) as u8)
        .collect()
}

/// A chunk filled to its limit behind the compactor's back: the next write through the server
/// has it compacted, waits, and succeeds; so does the next append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_into_a_full_chunk_waits_for_its_compaction_instead_of_failing() {
    let f = fixture().await;
    let file = f.meta.create(ROOT, b"full", 0o644).await.unwrap().handle;
    let first = f.ids(CHUNK_SLICES_MAX as u64 + 2).await;
    let mut model = vec![0u8; 4 * CHUNK_SLICES_MAX + 4];
    // Written through the namespace directly, which asks for no compaction.
    let (records, inline): (Vec<_>, Vec<_>) = (0..CHUNK_SLICES_MAX)
        .map(|i| {
            let id = (first + i as u64) | INLINE;
            let data = bytes_of(i as u64, 8);
            let pos = (i * 4) as u32; // each overlaps half of the one before
            model[pos as usize..pos as usize + 8].copy_from_slice(&data);
            let slice = Slice {
                id,
                size: 8,
                off: 0,
                len: 8,
                pos,
            };
            ((0, slice), (id, data))
        })
        .unzip();
    f.meta
        .write(Caller::default(), file, records, 0, inline)
        .await
        .unwrap();
    assert_eq!(f.records(file), CHUNK_SLICES_MAX);

    let data = bytes_of(99_999, 16);
    f.write(file, first + CHUNK_SLICES_MAX as u64, 100, data.clone())
        .await
        .expect("the write waits for room, it is not refused");
    model[100..116].copy_from_slice(&data);
    let status = f.status().await;
    assert_eq!(status.room_waits, 1, "{status:?}");
    assert_eq!(status.room_waiting, 0);
    assert!(status.chunks_compacted >= 1);
    assert!(
        f.records(file) < CHUNK_SLICES_COMPACT_ALWAYS,
        "{}",
        f.records(file)
    );
    assert_eq!(f.read(file).await, model);

    let tail = bytes_of(7, 10);
    f.append(file, first + CHUNK_SLICES_MAX as u64 + 1, tail.clone())
        .await
        .unwrap();
    model.extend_from_slice(&tail);
    assert_eq!(f.read(file).await, model);
}

/// Four writers that never pause, each in a region of its own of a 1 MiB file, and one
/// appender, 6 000 changes in all (inline until the file's inline bytes are full, then as
/// objects): every call succeeds, the compactor keeps up (records stay bounded though the chunk
/// never stops changing), and the file reads as the writers' models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_that_never_pause_never_starve_the_compactor() {
    let f = Arc::new(fixture().await);
    let file = f.meta.create(ROOT, b"busy", 0o644).await.unwrap().handle;
    const REGION: usize = 256 << 10;
    const WRITES: u64 = 1200;
    f.meta
        .setattr(
            file,
            calm_meta::SetAttr {
                size: Some(4 * REGION as u64),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let first = f.ids(6 * WRITES).await;
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut model = vec![0u8; REGION];
                let mut seed = w + 1;
                for i in 0..WRITES {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let len = 1 + (seed >> 40) as usize % 300;
                    let at = (seed >> 20) as usize % (REGION - len);
                    let data = bytes_of(seed, len);
                    model[at..at + len].copy_from_slice(&data);
                    let pos = (w as usize * REGION + at) as u32;
                    f.write(file, first + w * WRITES + i, pos, data)
                        .await
                        .unwrap_or_else(|e| panic!("writer {w}, write {i}: {e}"));
                }
                model
            })
        })
        .collect();
    let appender = {
        let f = f.clone();
        tokio::spawn(async move {
            let mut appended = Vec::new();
            for i in 0..WRITES {
                let data = bytes_of(1_000_000 + i, 1 + i as usize % 50);
                appended.extend_from_slice(&data);
                f.append(file, first + 4 * WRITES + i, data)
                    .await
                    .unwrap_or_else(|e| panic!("append {i}: {e}"));
            }
            appended
        })
    };
    let mut model = Vec::new();
    for writer in writers {
        model.extend_from_slice(&writer.await.unwrap());
    }
    model.extend_from_slice(&appender.await.unwrap());
    assert_eq!(f.read(file).await, model);
    let status = f.status().await;
    assert!(status.chunks_compacted > 0, "{status:?}");
    assert_eq!(status.compaction_failures, 0, "{status:?}");
    assert!(
        status.chunk_records_max < CHUNK_SLICES_MAX as u64,
        "writers filled a chunk: {status:?}"
    );
    // Once the writers stop, the compactor settles within its bound.
    let mut waited = 0;
    while f.records(file) > CHUNK_SLICES_COMPACT_ALWAYS && waited < 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(f.records(file) <= CHUNK_SLICES_COMPACT_ALWAYS);
    assert_eq!(f.read(file).await, model);
}

/// A log appended line by line across chunks: each line lands inline in the chunk the file's
/// end is in (the appends that cross a chunk's end go as objects), and the chunk the log has
/// left has its inline bytes moved into an object, so the metadata store does not keep the
/// inline bytes of every chunk a log passed through. The log reads as appended throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_the_log_has_left_keeps_no_inline_bytes() {
    let f = fixture().await;
    let file = f.meta.create(ROOT, b"log", 0o644).await.unwrap().handle;
    // The log's end 6 000 bytes before the end of its second chunk.
    let start = 2 * CHUNK_BYTES - 6_000;
    f.meta
        .setattr(
            file,
            calm_meta::SetAttr {
                size: Some(start),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    const LINES: u64 = 1_500;
    let first = f.ids(LINES).await;
    let mut model = vec![0u8; (start - CHUNK_BYTES) as usize];
    for i in 0..LINES {
        let line = bytes_of(i, 10 + i as usize % 21);
        model.extend_from_slice(&line);
        f.append(file, first + i, line)
            .await
            .unwrap_or_else(|e| panic!("line {i}: {e}"));
    }
    assert!(
        f.inline_records(file, 2) > 0,
        "lines of the third chunk are inline"
    );
    let mut waited = 0;
    while f.inline_records(file, 1) > 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(
        f.inline_records(file, 1),
        0,
        "the chunk the log left keeps inline records"
    );
    assert_eq!(f.read_from(file, CHUNK_BYTES).await, model);
    let status = f.status().await;
    assert_eq!(status.compaction_failures, 0, "{status:?}");
}
