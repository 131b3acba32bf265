//! The mutations of file contents: writes and appends (slice records placed in chunks, with the
//! size, mtime and changelog record in the same transaction), truncation, compaction, slice id
//! allocation, and the deletion queue.
//!
//! An object is named by one record, or, after an append split over two chunks, by several
//! (then `R id` holds the count). When the last record naming an object goes (truncate,
//! compaction, the file's destruction), the object is queued for deletion (`G`) in the same
//! transaction: the background deleter removes it later, so nothing leaks and nothing is
//! deleted that a record still names. An inline slice's bytes (`K id`) are written with the
//! one record that names them and deleted with it.
//!
//! Same rule as every mutation: all checks first, then writes.

use std::ops::ControlFlow;

use calm_changelog::RecordType;
use calm_store::WriteTxn;

use crate::ctx::Ctx;
use crate::error::MetaError;
use crate::layout::{
    KEY_SLICE_NEXT, chunk_key, chunk_range, collected_key, gc_key, inline_key, key_chunk, ref_key,
};
use crate::outcome::{Done, Outcome};
use crate::slices::{
    CHUNK_BYTES, CHUNK_SLICES_MAX, HOLE, INLINE, INLINE_CHUNK_BYTES_MAX, INLINE_FILE_BYTES_MAX,
    INLINE_SLICE_BYTES_MAX, INLINE_WRITE_BYTES_MAX, SLICE_IDS_PER_ALLOC_MAX, Slice, decode_chunk,
    encode_chunk, extent, inline_bytes, is_inline, split,
};
use crate::types::{FILE_SIZE_MAX, Handle, Kind};

/// The records of chunk `chunk` of `handle`.
fn load_chunk<T: WriteTxn>(txn: &T, handle: Handle, chunk: u64) -> Outcome<Vec<Slice>> {
    match txn.get(&chunk_key(handle, chunk))? {
        Some(value) => Ok(decode_chunk(&value)?),
        None => Ok(Vec::new()),
    }
}

fn store_chunk<T: WriteTxn>(
    txn: &mut T,
    handle: Handle,
    chunk: u64,
    slices: &[Slice],
) -> Outcome<()> {
    if slices.is_empty() {
        txn.delete(&chunk_key(handle, chunk))?;
    } else {
        txn.put(&chunk_key(handle, chunk), &encode_chunk(slices))?;
    }
    Ok(())
}

/// The next slice id not yet handed out.
pub(crate) fn slice_next<T: WriteTxn>(txn: &T) -> Outcome<u64> {
    Ok(match txn.get(KEY_SLICE_NEXT)? {
        Some(bytes) => calm_store::decode_counter(KEY_SLICE_NEXT, &bytes)?.max(1),
        None => 1,
    })
}

/// Records that name objects no longer: each object whose last record this was is queued for
/// deletion; inline bytes go at once.
fn release<T: WriteTxn>(ctx: &mut Ctx<'_, T>, dropped: &[Slice]) -> Outcome<()> {
    for slice in dropped.iter().filter(|s| s.id != HOLE) {
        if is_inline(slice.id) {
            ctx.txn.delete(&inline_key(slice.id))?;
            continue;
        }
        let key = ref_key(slice.id);
        match ctx.txn.get(&key)? {
            Some(bytes) => {
                let count = calm_store::decode_counter(&key, &bytes)?;
                if count > 2 {
                    ctx.txn.add(&key, -1)?;
                } else {
                    ctx.txn.delete(&key)?;
                }
            }
            None => {
                ctx.txn.put(
                    &gc_key(ctx.now.max(0) as u64, slice.id),
                    &slice.size.to_le_bytes(),
                )?;
            }
        }
    }
    Ok(())
}

/// The records of `handle`'s chunks from chunk `first` on, in order.
pub(crate) fn chunks_from<T: WriteTxn>(
    txn: &T,
    handle: Handle,
    first: u64,
) -> Outcome<Vec<(u64, Vec<Slice>)>> {
    let (_, end) = chunk_range(handle);
    let start = chunk_key(handle, first);
    let mut chunks: Vec<(u64, Vec<Slice>)> = Vec::new();
    let mut bad = None;
    txn.visit(&start, &end, &mut |key, value| {
        match (key_chunk(key), decode_chunk(value)) {
            (Some(chunk), Ok(slices)) => chunks.push((chunk, slices)),
            (None, _) => bad = Some(MetaError::Corrupt(format!("chunk key {key:?}"))),
            (_, Err(error)) => bad = Some(error),
        }
        if bad.is_some() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    match bad {
        Some(error) => Err(error.into()),
        None => Ok(chunks),
    }
}

/// Cuts `handle`'s contents to `size` bytes: chunks wholly past it go, the chunk across it is
/// clipped, and the objects no record names any more are queued for deletion.
pub(crate) fn truncate_chunks<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    size: u64,
) -> Outcome<()> {
    for (chunk, slices) in chunks_from(ctx.txn, handle, size / CHUNK_BYTES)? {
        let chunk_start = chunk * CHUNK_BYTES;
        let keep = size.saturating_sub(chunk_start).min(CHUNK_BYTES) as u32;
        let (kept, dropped) = crate::slices::clip(&slices, keep);
        store_chunk(ctx.txn, handle, chunk, &kept)?;
        release(ctx, &dropped)?;
    }
    Ok(())
}

/// A regular file; with `change`, one whose contents may change (not in the trash).
fn load_file<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    change: bool,
) -> Outcome<crate::layout::Inode> {
    let inode = if change {
        ctx.load_changeable(handle)?
    } else {
        ctx.load(handle)?
    };
    match inode.kind {
        Kind::File => Ok(inode),
        Kind::Dir => Err(MetaError::IsDir.into()),
        _ => Err(MetaError::Invalid("file contents of a non-regular file".into()).into()),
    }
}

/// The last check of a write: the bytes a file grows by to reach `end`, in its quotas.
fn charge_growth<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    inode: &crate::layout::Inode,
    end: u64,
) -> Outcome<()> {
    if end <= inode.size {
        return Ok(());
    }
    let grown = crate::quota::QuotaUsage {
        bytes: (end - inode.size) as i64,
        ..Default::default()
    };
    let dir = ctx.tree_dir(inode)?;
    ctx.charge(inode.uid, inode.gid, dir, grown)
}

/// Makes the file at least `end` bytes long and sets its mtime, ctime and size counter (and
/// takes setuid and setgid away, for a writer who is not the superuser), and appends the
/// changelog record.
fn written<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    mut inode: crate::layout::Inode,
    end: u64,
) -> Outcome<Done> {
    inode.mode = crate::perm::after_write(&ctx.caller, inode.kind, inode.mode, inode.gid);
    crate::ctx::kill_capability(ctx, inode.handle)?;
    if end > inode.size {
        ctx.file_bytes_delta += (end - inode.size) as i64;
        inode.size = end;
    }
    inode.mtime_ns = ctx.now;
    inode.ctime_ns = ctx.now;
    let attr = inode.attr();
    let (handle, generation) = (inode.handle, inode.generation);
    let parent = crate::ctx::record_parent(&inode);
    ctx.store(inode);
    ctx.record(RecordType::Mtime, 0, handle, generation, parent, b"", None)?;
    Ok(Done::Attr(attr))
}

/// Checks the inline bytes of a write: each names an inline slice of the write with the
/// right length, once, within the limits. Returns their total.
fn check_inline(slices: &[(u64, Slice)], inline: &[(u64, Vec<u8>)]) -> Outcome<u64> {
    let invalid = |why: String| Err(MetaError::Invalid(format!("inline bytes: {why}")).into());
    let named = slices.iter().filter(|(_, s)| is_inline(s.id)).count();
    if named != inline.len() {
        return invalid(format!(
            "{named} inline records, {} inline bytes",
            inline.len()
        ));
    }
    let mut total = 0u64;
    for (id, data) in inline {
        let Some((chunk, slice)) = slices.iter().find(|(_, s)| s.id == *id) else {
            return invalid(format!("slice {id:#x} is not written"));
        };
        if slices.iter().filter(|(_, s)| s.id == *id).count() != 1 {
            return invalid(format!("slice {id:#x} is placed twice"));
        }
        if data.len() != slice.size as usize {
            return invalid(format!(
                "slice {id:#x}: {} bytes for a record of {}",
                data.len(),
                slice.size
            ));
        }
        let file_end = chunk.saturating_mul(CHUNK_BYTES) + slice.end();
        if file_end > INLINE_FILE_BYTES_MAX {
            return invalid(format!(
                "slice {id:#x} reaches past byte {INLINE_FILE_BYTES_MAX}"
            ));
        }
        total += data.len() as u64;
    }
    if total > INLINE_WRITE_BYTES_MAX {
        return invalid(format!(
            "{total} bytes in one write, at most {INLINE_WRITE_BYTES_MAX}"
        ));
    }
    Ok(total)
}

/// Bytes the inline slices named by `records` hold.
pub(crate) fn write<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    slices: &[(u64, Slice)],
    end: u64,
    inline: &[(u64, Vec<u8>)],
) -> Outcome<Done> {
    let inode = load_file(ctx, handle, true)?;
    crate::perm::may_write_contents(&ctx.caller, &inode.owner())?;
    let next = slice_next(ctx.txn)?;
    let mut end = end;
    let inline_total = check_inline(slices, inline)?;
    // Checks first: every record fits, names an id handed out, and the file stays in bounds.
    let mut by_chunk: std::collections::BTreeMap<u64, Vec<Slice>> = Default::default();
    for (chunk, slice) in slices {
        slice.check()?;
        if slice.id & !INLINE >= next {
            return Err(
                MetaError::Invalid(format!("slice id {} was never handed out", slice.id)).into(),
            );
        }
        not_collected(ctx.txn, slice.id)?;
        let slice_end = chunk
            .checked_mul(CHUNK_BYTES)
            .and_then(|start| start.checked_add(slice.end()))
            .filter(|e| *e <= FILE_SIZE_MAX)
            .ok_or(MetaError::FileTooBig)?;
        end = end.max(slice_end);
        by_chunk.entry(*chunk).or_default().push(*slice);
    }
    if end > FILE_SIZE_MAX {
        return Err(MetaError::FileTooBig.into());
    }
    let mut merged = Vec::with_capacity(by_chunk.len());
    let mut replayed = 0;
    for (chunk, new) in by_chunk {
        let mut records = load_chunk(ctx.txn, handle, chunk)?;
        // A write sent again (its answer was lost) finds its records there already.
        let present = new
            .iter()
            .filter(|s| s.id != HOLE && records.iter().any(|r| r.id == s.id))
            .count();
        if present == new.len() {
            replayed += 1;
            continue;
        }
        if present > 0 {
            return Err(MetaError::Invalid(
                "a write names objects another write placed already".into(),
            )
            .into());
        }
        if records.len() + new.len() > CHUNK_SLICES_MAX {
            return Err(MetaError::Busy(format!(
                "chunk {chunk} of file {handle} holds {CHUNK_SLICES_MAX} records; compaction \
                 has not caught up"
            ))
            .into());
        }
        let added = inline_bytes(&new);
        if added > 0 && inline_bytes(&records) + added > INLINE_CHUNK_BYTES_MAX {
            // The writer sends the bytes as objects instead.
            return Err(MetaError::NotSupported(format!(
                "inline bytes: file {handle} holds {INLINE_CHUNK_BYTES_MAX} already"
            ))
            .into());
        }
        records.extend_from_slice(&new);
        merged.push((chunk, records));
    }
    if replayed > 0 && merged.is_empty() && !slices.is_empty() {
        return Ok(Done::Attr(inode.attr()));
    }
    if replayed > 0 && inline_total > 0 {
        return Err(MetaError::Invalid(
            "a write with inline bytes was placed in part already".into(),
        )
        .into());
    }
    for (id, _) in inline {
        if ctx.txn.get(&inline_key(*id))?.is_some() {
            return Err(MetaError::Invalid(format!("inline slice {id:#x} exists already")).into());
        }
    }
    charge_growth(ctx, &inode, end)?;

    for (chunk, records) in &merged {
        store_chunk(ctx.txn, handle, *chunk, records)?;
    }
    for (id, data) in inline {
        ctx.txn.put(&inline_key(*id), data)?;
    }
    written(ctx, inode, end)
}

pub(crate) fn append<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    id: u64,
    size: u32,
    inline: Option<&[u8]>,
) -> Outcome<Done> {
    let inode = load_file(ctx, handle, true)?;
    crate::perm::may_write_contents(&ctx.caller, &inode.owner())?;
    let id_ok = id != HOLE
        && id & !INLINE < slice_next(ctx.txn)?
        && is_inline(id) == inline.is_some()
        && inline.is_none_or(|data| data.len() == size as usize);
    if !id_ok || size == 0 || u64::from(size) > CHUNK_BYTES {
        return Err(MetaError::Invalid(format!("append of object {id} ({size} bytes)")).into());
    }
    not_collected(ctx.txn, id)?;
    let at = inode.size;
    let end = at
        .checked_add(u64::from(size))
        .filter(|e| *e <= FILE_SIZE_MAX)
        .ok_or(MetaError::FileTooBig)?;
    let mut placed = Vec::new();
    let mut off = 0u32;
    for (chunk, pos, len) in split(at, u64::from(size)) {
        let mut records = load_chunk(ctx.txn, handle, chunk)?;
        if records.len() >= CHUNK_SLICES_MAX {
            return Err(MetaError::Busy(format!(
                "chunk {chunk} of file {handle} holds {CHUNK_SLICES_MAX} records"
            ))
            .into());
        }
        records.push(Slice {
            id,
            size,
            off,
            len,
            pos,
        });
        off += len;
        placed.push((chunk, records));
    }
    if inline.is_some() {
        // Where appended inline bytes may be (one slice, in one chunk, within the chunk's
        // inline bytes; any chunk: the compactor moves them into an object once the file's
        // end has left the chunk): else the writer sends an object.
        let fits = size <= INLINE_SLICE_BYTES_MAX
            && placed.len() == 1
            && inline_bytes(&placed[0].1) <= INLINE_CHUNK_BYTES_MAX;
        if !fits {
            return Err(MetaError::NotSupported(format!(
                "inline bytes appended at byte {at} of file {handle}"
            ))
            .into());
        }
        if ctx.txn.get(&inline_key(id))?.is_some() {
            return Err(MetaError::Invalid(format!("inline slice {id:#x} exists already")).into());
        }
    }
    charge_growth(ctx, &inode, end)?;

    if let Some(data) = inline {
        ctx.txn.put(&inline_key(id), data)?;
    }
    let parts = placed.len() as i64;
    for (chunk, records) in &placed {
        store_chunk(ctx.txn, handle, *chunk, records)?;
    }
    if parts > 1 {
        ctx.txn.add(&ref_key(id), parts)?;
    }
    written(ctx, inode, end)
}

/// A compaction (see [`crate::compaction`] for what it replaces and why): the records `read`
/// (the chunk's value as the compactor read it) must still begin the chunk; they become `kept`
/// (a subsequence of them) and `slice`, and the records added since stay on top.
pub(crate) fn compact<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    handle: Handle,
    chunk: u64,
    read: &[u8],
    kept: &[Slice],
    slice: Option<&Slice>,
    inline: Option<&[u8]>,
) -> Outcome<Done> {
    load_file(ctx, handle, false)?;
    let read_records = decode_chunk(read)?;
    // Checks first: what is kept was read, in order; what goes is the rest.
    let mut dropped = Vec::with_capacity(read_records.len());
    let mut kept_left = kept.iter().peekable();
    for record in &read_records {
        if kept_left.peek() == Some(&record) {
            kept_left.next();
        } else {
            dropped.push(*record);
        }
    }
    if kept_left.next().is_some() {
        return Err(MetaError::Invalid("a compaction keeps records it did not read".into()).into());
    }
    if dropped.is_empty() {
        return Err(MetaError::Invalid("a compaction that replaces nothing".into()).into());
    }
    match (slice, inline) {
        (Some(slice), _) => {
            slice.check()?;
            if slice.id == HOLE
                || slice.id & !INLINE >= slice_next(ctx.txn)?
                || read_records.iter().any(|r| r.id == slice.id)
            {
                return Err(
                    MetaError::Invalid(format!("compaction into object {}", slice.id)).into(),
                );
            }
            not_collected(ctx.txn, slice.id)?;
            if slice.end() > extent(&read_records) {
                return Err(MetaError::Invalid(
                    "a compaction reaches past the records it read".into(),
                )
                .into());
            }
            match inline {
                Some(data) => {
                    check_inline(&[(chunk, *slice)], &[(slice.id, data.to_vec())])?;
                }
                None if is_inline(slice.id) => {
                    return Err(MetaError::Invalid(
                        "an inline compaction without its bytes".into(),
                    )
                    .into());
                }
                None => {}
            }
        }
        (None, Some(_)) => {
            return Err(MetaError::Invalid("inline bytes without a slice".into()).into());
        }
        (None, None) => {}
    }
    let current = ctx.txn.get(&chunk_key(handle, chunk))?;
    let Some(later) = current.as_deref().and_then(|c| c.strip_prefix(read)) else {
        return Err(MetaError::Busy("the chunk changed while it was compacted".into()).into());
    };
    let mut records = kept.to_vec();
    records.extend(slice.copied());
    records.extend(decode_chunk(later)?);
    if inline.is_some() && inline_bytes(&records) > INLINE_CHUNK_BYTES_MAX {
        // The compactor writes the bytes as an object instead.
        return Err(MetaError::NotSupported(format!(
            "inline bytes: file {handle} holds {INLINE_CHUNK_BYTES_MAX} already"
        ))
        .into());
    }

    store_chunk(ctx.txn, handle, chunk, &records)?;
    release(ctx, &dropped)?;
    if let (Some(slice), Some(data)) = (slice, inline) {
        ctx.txn.put(&inline_key(slice.id), data)?;
    }
    Ok(Done::Nothing)
}

pub(crate) fn alloc_slices<T: WriteTxn>(ctx: &mut Ctx<'_, T>, count: u64) -> Outcome<Done> {
    if count == 0 || count > SLICE_IDS_PER_ALLOC_MAX {
        return Err(MetaError::Invalid(format!(
            "{count} slice ids asked for; 1 to {SLICE_IDS_PER_ALLOC_MAX} at once"
        ))
        .into());
    }
    let first = slice_next(ctx.txn)?;
    ctx.txn
        .put(KEY_SLICE_NEXT, &(first + count).to_le_bytes())?;
    Ok(Done::Ids(first))
}

/// Objects one [`Op::Collected`](crate::ops::Op::Collected) marks at most.
pub const COLLECTED_PER_OP_MAX: usize = 4096;

/// Marks objects as collected, or takes the marks away.
pub(crate) fn collected<T: WriteTxn>(ctx: &mut Ctx<'_, T>, ids: &[u64], on: bool) -> Outcome<Done> {
    if ids.len() > COLLECTED_PER_OP_MAX {
        return Err(MetaError::Invalid(format!(
            "{} objects in one mark; at most {COLLECTED_PER_OP_MAX}",
            ids.len()
        ))
        .into());
    }
    for &id in ids {
        if !crate::slices::is_object(id) {
            return Err(MetaError::Invalid(format!("{id:#x} names no object")).into());
        }
        match on {
            true => ctx.txn.put(&collected_key(id), &ctx.now.to_le_bytes())?,
            false => {
                ctx.txn.delete(&collected_key(id))?;
            }
        }
    }
    Ok(Done::Nothing)
}

/// Refuses a record naming an object an online gc collected (it may be gone already).
fn not_collected<T: WriteTxn>(txn: &T, id: u64) -> Outcome<()> {
    // ESTALE, final: the bytes the mutation names are gone (the writer uploaded them longer
    // ago than gc's grace and had not named them); its writes are lost, and it is told so.
    if crate::slices::is_object(id) && txn.get(&collected_key(id))?.is_some() {
        return Err(MetaError::Stale.into());
    }
    Ok(())
}

pub(crate) fn gc_done<T: WriteTxn>(ctx: &mut Ctx<'_, T>, entries: &[(u64, u64)]) -> Outcome<Done> {
    for (queued, id) in entries {
        ctx.txn.delete(&gc_key(*queued, *id))?;
    }
    Ok(Done::Nothing)
}
