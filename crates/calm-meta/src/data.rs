//! The namespace's face for file contents: the object store's URL, a file's slice map read on
//! one snapshot, writes, appends and compactions through the committer, slice id allocation,
//! and the deletion queue for the background deleter. The bytes themselves never come here:
//! calm-data moves them between clients and the object store.

use std::ops::ControlFlow;

use calm_store::{ReadTxn, Store};
use calm_types::sync::Locked;

use crate::error::{MetaError, Result};
use crate::layout::*;
use crate::ops::{self, Done, Failure, Op};
use crate::slices::{FileMap, Slice, decode_chunk};
use crate::types::{Attr, Handle, Kind};
use crate::{Caller, Meta};

pub use crate::file_map::MAP_RECORDS_MAX;
use crate::file_map::map_of;

/// One chunk as a compaction reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkRead {
    pub records: Vec<Slice>,
    /// The chunk's value as stored.
    pub value: Vec<u8>,
}

/// An entry of the deletion queue: object `id` of `size` bytes, queued at `queued_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Garbage {
    pub queued_ns: u64,
    pub id: u64,
    pub size: u32,
}

impl<S: Store> Meta<S> {
    /// The URL of the object store holding the namespace's file contents (absent on a store
    /// opened without one).
    pub fn objects_url(&self) -> Result<Option<String>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(snap
                .get(KEY_OBJECTS)?
                .map(|url| String::from_utf8_lossy(&url).into_owned()))
        })
    }

    /// The namespace's claim on its object store (see [`objects_owner`]).
    pub fn objects_owner(&self) -> Result<Option<Vec<u8>>> {
        self.blocking(|| objects_owner(&self.store.snapshot()?))
    }

    /// The namespace's identity, in 32 hex digits (see [`KEY_NAMESPACE_ID`]).
    pub fn namespace_id(&self) -> Result<String> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let id = snap
                .get(KEY_NAMESPACE_ID)?
                .ok_or_else(|| MetaError::Corrupt("the namespace has no identity".into()))?;
            Ok(id.iter().map(|b| format!("{b:02x}")).collect())
        })
    }

    /// The attributes and the slice map of file `handle` from chunk `from_chunk` on, at most
    /// `max_records` records (and [`MAP_RECORDS_MAX`]) and one chunk's worth of inline bytes
    /// (`INLINE_CHUNK_BYTES_MAX`); whole chunks, at least one.
    pub fn read_map(&self, handle: Handle, from_chunk: u64, max_records: usize) -> Result<FileMap> {
        self.read_map_as(&Caller::default(), handle, from_chunk, max_records)
    }

    /// [`Meta::read_map`] for `caller`, who may read or write the file (an open for writing
    /// reads the map too; `crate::perm::may_read_contents`).
    pub fn read_map_as(
        &self,
        caller: &Caller,
        handle: Handle,
        from_chunk: u64,
        max_records: usize,
    ) -> Result<FileMap> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = match ops::load(&snap, handle) {
                Err(Failure::Meta(MetaError::NotFound)) => {
                    return self.replaced_map(caller, handle, from_chunk);
                }
                other => other?,
            };
            let owner = inode.owner();
            crate::perm::may_read_contents(caller, &owner)
                .or_else(|_| crate::perm::may_write_contents(caller, &owner))?;
            let attr = inode.attr();
            if attr.kind != Kind::File {
                return Err(if attr.kind == Kind::Dir {
                    MetaError::IsDir
                } else {
                    MetaError::Invalid("file contents of a non-regular file".into())
                });
            }
            map_of(&snap, attr, from_chunk, max_records)
        })
    }

    /// The map of `handle` if it is a small file replaced moments ago (`crate::replaced`),
    /// for `caller`, who may read or write it; else `NotFound`.
    fn replaced_map(&self, caller: &Caller, handle: Handle, from_chunk: u64) -> Result<FileMap> {
        let now = crate::commit::now_ns();
        let Some(file) = self.replaced.locked().get(handle, now) else {
            return Err(MetaError::NotFound);
        };
        crate::perm::may_read_contents(caller, &file.owner)
            .or_else(|_| crate::perm::may_write_contents(caller, &file.owner))?;
        let mut map = file.map;
        map.chunks.retain(|(chunk, _)| *chunk >= from_chunk);
        Ok(map)
    }

    /// How many records chunk `chunk` of `handle` holds.
    pub fn chunk_record_count(&self, handle: Handle, chunk: u64) -> Result<usize> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(snap
                .get(&chunk_key(handle, chunk))?
                .map_or(0, |v| v.len() / crate::slices::SLICE_RECORD_BYTES))
        })
    }

    /// The records of one chunk and its value as stored (for a compaction's check).
    pub fn read_chunk(&self, handle: Handle, chunk: u64) -> Result<ChunkRead> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(match snap.get(&chunk_key(handle, chunk))? {
                Some(value) => ChunkRead {
                    records: decode_chunk(&value)?,
                    value: value.into_owned(),
                },
                None => ChunkRead::default(),
            })
        })
    }

    /// The bytes of inline slices `ids` (an inline slice's bytes never change while a record
    /// names it). `NotFound` when one is gone: the record naming it went meanwhile.
    pub fn inline_bytes(&self, ids: &[u64]) -> Result<Vec<(u64, Vec<u8>)>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            ids.iter()
                .map(|id| match snap.get(&inline_key(*id))? {
                    Some(data) => Ok((*id, data.into_owned())),
                    None => Err(MetaError::NotFound),
                })
                .collect()
        })
    }

    /// Places `slices` (`(chunk, record)`) in file `handle` and makes it at least `end` bytes
    /// long, in one commit with its size, mtime and changelog record; `inline` holds the bytes
    /// of its inline slices.
    pub async fn write(
        &self,
        caller: Caller,
        handle: Handle,
        slices: Vec<(u64, Slice)>,
        end: u64,
        inline: Vec<(u64, Vec<u8>)>,
    ) -> Result<Attr> {
        let op = Op::Write {
            handle,
            slices,
            end,
            inline,
        };
        attr_of(self.apply_as(caller, op).await?)
    }

    /// Places the whole of object `id` (`size` bytes) at the end of file `handle`; with
    /// `inline`, the bytes of inline slice `id` (see [`Op::Append`]).
    pub async fn append(
        &self,
        caller: Caller,
        handle: Handle,
        id: u64,
        size: u32,
        inline: Option<Vec<u8>>,
    ) -> Result<Attr> {
        let op = Op::Append {
            handle,
            id,
            size,
            inline,
        };
        attr_of(self.apply_as(caller, op).await?)
    }

    /// Compacts chunk `chunk` of `handle`: if the chunk still begins with the records `read`
    /// (its value as a compaction read it), they are replaced by `kept` and `slice` (an inline
    /// one with its bytes `inline`); see [`Op::Compact`]. Busy when the chunk changed.
    pub async fn compact(
        &self,
        handle: Handle,
        chunk: u64,
        read: Vec<u8>,
        kept: Vec<Slice>,
        slice: Option<Slice>,
        inline: Option<Vec<u8>>,
    ) -> Result<()> {
        let op = Op::Compact {
            handle,
            chunk,
            read,
            kept,
            slice,
            inline,
        };
        self.apply_as(Caller::default(), op).await.map(|_| ())
    }

    /// Marks the objects `ids` collected (`on`: no mutation names them from now on) or takes
    /// the marks away; at most [`crate::ops::data::COLLECTED_PER_OP_MAX`] at once.
    pub async fn mark_collected(&self, ids: Vec<u64>, on: bool) -> Result<()> {
        self.apply_as(Caller::default(), Op::Collected { ids, on })
            .await
            .map(|_| ())
    }

    /// Hands out `count` new slice ids; returns the first.
    pub async fn alloc_slices(&self, count: u64) -> Result<u64> {
        match self
            .apply_as(Caller::default(), Op::AllocSlices { count })
            .await?
        {
            Done::Ids(first) => Ok(first),
            other => Err(MetaError::Io(format!("unexpected answer {other:?}"))),
        }
    }

    /// Grants `count` handles to `client` for the nodes its mount makes before the server
    /// answers (`crate::ops::grants`); returns the first.
    pub async fn grant_handles(&self, caller: Caller, client: u64, count: u64) -> Result<Handle> {
        match self.apply_as(caller, Op::Grant { client, count }).await? {
            Done::Ids(first) => Ok(first),
            other => Err(MetaError::Io(format!("unexpected answer {other:?}"))),
        }
    }

    /// Up to `max` entries of the deletion queue queued at or before `queued_before_ns`, oldest
    /// first.
    pub fn garbage(&self, queued_before_ns: u64, max: usize) -> Result<Vec<Garbage>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let mut out = Vec::new();
            snap.visit(&[TAG_GC], GC_END, &mut |key, value| {
                match gc_key_parts(key) {
                    Some((queued_ns, _)) if queued_ns > queued_before_ns => {
                        return ControlFlow::Break(());
                    }
                    Some((queued_ns, id)) if value.len() == 4 => out.push(Garbage {
                        queued_ns,
                        id,
                        size: u32::from_le_bytes(value.try_into().expect("4 bytes")),
                    }),
                    _ => {} // fsck reports it
                }
                if out.len() >= max {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            Ok(out)
        })
    }

    /// The deletion-queue entries whose objects are gone.
    pub async fn garbage_deleted(&self, entries: Vec<(u64, u64)>) -> Result<()> {
        self.apply_as(Caller::default(), Op::GcDone { entries })
            .await
            .map(|_| ())
    }

    /// Every object the metadata names (see [`referenced_objects`]).
    pub fn referenced_objects(&self) -> Result<Referenced> {
        self.blocking(|| referenced_objects(&self.store.snapshot()?))
    }
}

/// The objects the metadata names, each list `(id, size)` sorted by id, once each.
#[derive(Debug, Default)]
pub struct Referenced {
    /// Named by a file's record: they must be in the store.
    pub named: Vec<(u64, u32)>,
    /// Named by the deletion queue only: there, or deleted by a server stopped before it
    /// cleared their entries.
    pub queued: Vec<(u64, u32)>,
    /// The next slice id (every id ever handed out is below it).
    pub next: u64,
}

/// Every object the metadata names: by a record, or in the deletion queue. One pass over the
/// chunks: for `calm gc` and `calm fsck --objects`, not for the request path. Memory: 16
/// bytes per object.
pub fn referenced_objects<R: ReadTxn>(snap: &R) -> Result<Referenced> {
    let mut named = Vec::new();
    let mut bad = None;
    snap.visit(&[TAG_CHUNK], &[TAG_CHUNK + 1], &mut |_, value| {
        match decode_chunk(value) {
            Ok(slices) => named.extend(
                slices
                    .iter()
                    .filter(|s| crate::slices::is_object(s.id))
                    .map(|s| (s.id, s.size)),
            ),
            Err(error) => {
                bad = Some(error);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    if let Some(error) = bad {
        return Err(error);
    }
    named.sort_unstable();
    named.dedup_by_key(|(id, _)| *id);
    let mut queued = Vec::new();
    snap.visit(&[TAG_GC], GC_END, &mut |key, value| {
        if let (Some((_, id)), Ok(size)) = (gc_key_parts(key), value.try_into()) {
            // An object both named and queued is fsck's problem to report; here it is named.
            if named.binary_search_by_key(&id, |(n, _)| *n).is_err() {
                queued.push((id, u32::from_le_bytes(size)));
            }
        }
        ControlFlow::Continue(())
    })?;
    queued.sort_unstable();
    queued.dedup_by_key(|(id, _)| *id);
    let next = match snap.get(KEY_SLICE_NEXT)? {
        Some(bytes) => calm_store::decode_counter(KEY_SLICE_NEXT, &bytes)?,
        None => 1,
    };
    Ok(Referenced {
        named,
        queued,
        next,
    })
}

/// The namespace's claim on its object store ([`KEY_OBJECTS_OWNER`]); absent on a store no
/// server of this version opened yet.
pub fn objects_owner<R: ReadTxn>(snap: &R) -> Result<Option<Vec<u8>>> {
    Ok(snap.get(KEY_OBJECTS_OWNER)?.map(|v| v.to_vec()))
}

/// The URL of the object store a snapshot's namespace keeps its contents in.
pub fn objects_url<R: ReadTxn>(snap: &R) -> Result<Option<String>> {
    Ok(snap
        .get(KEY_OBJECTS)?
        .map(|url| String::from_utf8_lossy(&url).into_owned()))
}

fn attr_of(done: Done) -> Result<Attr> {
    match done {
        Done::Attr(attr) => Ok(attr),
        other => Err(MetaError::Io(format!("unexpected answer {other:?}"))),
    }
}
