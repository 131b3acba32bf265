//! What a mount knows of one file's contents: the slice records committed (from the server's
//! map, and this mount's own commits), and the writes not committed yet, buffered in memory as
//! pending slices. Pure and synchronous: the caller uploads the blocks it is handed, commits
//! the records it is given, and fetches the object ranges a read plan names.
//!
//! A write extends the last pending slice when it continues it (or rewrites a part of it whose
//! blocks are not uploaded yet); otherwise it starts a new slice. A block that fills up is
//! handed out for upload at once, so that a long sequential write uploads while it goes on;
//! [`FileData::seal`] hands out the rest before a commit. Reads see the pending slices over
//! the committed ones (a process reads what it wrote before it is committed).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use calm_types::slices::{
    BLOCK_BYTES, CHUNK_BYTES, INLINE, INLINE_FILE_BYTES_MAX, INLINE_SLICE_BYTES_MAX, Slice, Source,
    extent, is_inline, pieces_in, split, view,
};

/// Pending slices of one file past which the writer commits before taking more writes.
pub const PENDING_SLICES_MAX: usize = 1024;

/// A block to upload: block `block` of slice `id`.
#[derive(Debug, Clone)]
pub struct Upload {
    pub id: u64,
    pub block: u32,
    pub data: Bytes,
}

#[derive(Debug)]
enum Block {
    /// Still written to.
    Open(Vec<u8>),
    /// Handed out for upload: never written again.
    Frozen(Bytes),
}

impl Block {
    fn bytes(&self) -> &[u8] {
        match self {
            Block::Open(v) => v,
            Block::Frozen(b) => b,
        }
    }
}

/// A write not committed yet: `len` bytes at `pos` of chunk `chunk`, to become object `id`.
#[derive(Debug)]
pub struct Pending {
    pub id: u64,
    pub chunk: u64,
    pub pos: u32,
    pub len: u32,
    blocks: Vec<Block>,
    /// No more writes go into it (a commit is taking it).
    sealed: bool,
    /// Who wrote its bytes (the caller's tags, each once): told when a commit of it fails.
    writers: Vec<u64>,
}

impl Pending {
    /// Whether `n` bytes at slice offset `at` can be written into this slice.
    fn takes(&self, at: u32, n: u32) -> bool {
        if self.sealed || at > self.len {
            return false;
        }
        let end = u64::from(at) + u64::from(n);
        if u64::from(self.pos) + end > CHUNK_BYTES {
            return false;
        }
        let first = (u64::from(at) / BLOCK_BYTES) as usize;
        let last = ((end - 1) / BLOCK_BYTES) as usize;
        self.blocks
            .get(first..=last.min(self.blocks.len().saturating_sub(1)))
            .is_none_or(|bs| bs.iter().all(|b| matches!(b, Block::Open(_))))
    }

    /// Writes `data` at slice offset `at`; returns the blocks it filled.
    fn put(&mut self, at: u32, data: &[u8], uploads: &mut Vec<Upload>) {
        let mut done = 0usize;
        while done < data.len() {
            let r = u64::from(at) + done as u64;
            let b = (r / BLOCK_BYTES) as usize;
            let in_block = (r % BLOCK_BYTES) as usize;
            let n = (BLOCK_BYTES as usize - in_block).min(data.len() - done);
            while self.blocks.len() <= b {
                self.blocks.push(Block::Open(Vec::new()));
            }
            let Block::Open(buf) = &mut self.blocks[b] else {
                unreachable!("takes() checked that the blocks written are open");
            };
            if buf.len() < in_block + n {
                buf.resize(in_block + n, 0);
            }
            buf[in_block..in_block + n].copy_from_slice(&data[done..done + n]);
            done += n;
            let end = (r + n as u64) as u32;
            self.len = self.len.max(end);
            if buf.len() as u64 == BLOCK_BYTES {
                self.freeze(b, uploads);
            }
        }
    }

    fn freeze(&mut self, b: usize, uploads: &mut Vec<Upload>) {
        if let Block::Open(buf) = &mut self.blocks[b] {
            let data = Bytes::from(std::mem::take(buf));
            uploads.push(Upload {
                id: self.id,
                block: b as u32,
                data: data.clone(),
            });
            self.blocks[b] = Block::Frozen(data);
        }
    }

    /// Bytes `[from, to)` of the slice.
    fn bytes(&self, from: u32, to: u32) -> Vec<u8> {
        let mut out = vec![0u8; (to - from) as usize];
        for (b, block) in self.blocks.iter().enumerate() {
            let start = b as u64 * BLOCK_BYTES;
            let data = block.bytes();
            let (lo, hi) = (
                u64::from(from).max(start),
                u64::from(to).min(start + data.len() as u64),
            );
            if lo < hi {
                out[(lo - u64::from(from)) as usize..(hi - u64::from(from)) as usize]
                    .copy_from_slice(&data[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        out
    }

    /// The record this slice becomes.
    pub fn record(&self) -> (u64, Slice) {
        (
            self.chunk,
            Slice {
                id: self.id,
                size: self.len,
                off: 0,
                len: self.len,
                pos: self.pos,
            },
        )
    }
}

/// One part of a read, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Zeros(u64),
    Memory(Bytes),
    Object {
        id: u64,
        size: u32,
        off: u32,
        len: u32,
    },
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Zeros(n) => *n,
            Part::Memory(b) => b.len() as u64,
            Part::Object { len, .. } => u64::from(*len),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One file's contents as this mount knows them.
#[derive(Debug, Default)]
pub struct FileData {
    chunks: BTreeMap<u64, Vec<Slice>>,
    /// The bytes of the committed inline slices, by id (from the map, and this mount's own
    /// inline commits); at most the server's limit per file.
    inline: HashMap<u64, Bytes>,
    /// The size the server last answered with.
    size: u64,
    pending: Vec<Pending>,
    pending_bytes: u64,
}

/// The pending writes a commit may place inline (their bytes sent with the records, no
/// object written): the records, with inline ids, and the bytes of each.
#[derive(Debug)]
pub struct InlineCommit {
    /// How many pending slices it takes (all of them).
    pub slices: usize,
    pub records: Vec<(u64, Slice)>,
    pub bytes: Vec<(u64, Vec<u8>)>,
}

impl FileData {
    /// The contents the server's map describes (`inline`: the bytes of its inline slices).
    pub fn new(size: u64, chunks: Vec<(u64, Vec<Slice>)>, inline: Vec<(u64, Vec<u8>)>) -> FileData {
        FileData {
            chunks: chunks.into_iter().collect(),
            inline: inline_map(inline),
            size,
            ..FileData::default()
        }
    }

    /// Replaces what was committed by a fresher map; pending writes stay.
    pub fn refresh(
        &mut self,
        size: u64,
        chunks: Vec<(u64, Vec<Slice>)>,
        inline: Vec<(u64, Vec<u8>)>,
    ) {
        self.chunks = chunks.into_iter().collect();
        self.inline = inline_map(inline);
        self.size = size;
    }

    /// The committed size (as the server said it).
    pub fn committed_size(&self) -> u64 {
        self.size
    }

    /// The size with the pending writes.
    pub fn size(&self) -> u64 {
        self.size.max(self.pending_end())
    }

    /// The end of the last byte the pending writes place (0 without any): what a commit
    /// makes the file at least as long as.
    pub fn pending_end(&self) -> u64 {
        self.pending
            .iter()
            .map(|p| p.chunk * CHUNK_BYTES + u64::from(p.pos) + u64::from(p.len))
            .max()
            .unwrap_or(0)
    }

    /// The file was truncated or extended to `size` elsewhere than by a write: the
    /// committed records are stale (fetch the map again before reading).
    pub fn resized(&mut self, size: u64) {
        self.size = size;
        self.chunks.clear();
        self.inline.clear();
    }

    /// Pending slices.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Bytes held by pending writes.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Whether writes are waiting to be committed.
    pub fn is_dirty(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether the writer should commit before taking more writes.
    pub fn wants_commit(&self, bytes_max: u64) -> bool {
        self.pending.len() >= PENDING_SLICES_MAX || self.pending_bytes >= bytes_max
    }

    /// Whether a write of `n` bytes at `pos` of `chunk` goes on in the last pending slice.
    fn extends_last(&self, chunk: u64, pos: u32, n: u32) -> bool {
        self.pending.last().is_some_and(|last| {
            last.chunk == chunk && pos >= last.pos && last.takes(pos - last.pos, n)
        })
    }

    /// How many new slices (and so ids) a write of `len` bytes at `offset` would start: one
    /// per chunk it touches, less one when it goes on in the last pending slice. At most the
    /// number of chunks it touches.
    pub fn slices_needed(&self, offset: u64, len: u64) -> usize {
        self.new_slices(&split(offset, len))
    }

    /// [`FileData::slices_needed`] of a write's pieces (chunk, position, length).
    fn new_slices(&self, pieces: &[(u64, u32, u32)]) -> usize {
        match pieces.first() {
            Some(&(chunk, pos, n)) if self.extends_last(chunk, pos, n) => pieces.len() - 1,
            _ => pieces.len(),
        }
    }

    /// Buffers `data` at file offset `offset`, written by `writer` (a tag of the caller's:
    /// [`FileData::writers`] names it while the bytes are pending), giving the new slices it
    /// starts the ids of `ids` in order. Returns the blocks filled, to upload; `None`, with
    /// nothing changed, when `ids` holds fewer than [`FileData::slices_needed`].
    pub fn write(
        &mut self,
        offset: u64,
        data: &[u8],
        ids: &[u64],
        writer: u64,
    ) -> Option<Vec<Upload>> {
        let pieces = split(offset, data.len() as u64);
        if ids.len() < self.new_slices(&pieces) {
            return None;
        }
        let mut ids = ids.iter().copied();
        let mut uploads = Vec::new();
        let mut done = 0usize;
        for (chunk, pos, n) in pieces {
            let piece = &data[done..done + n as usize];
            done += n as usize;
            let extends = self.extends_last(chunk, pos, n);
            let grew = match self.pending.last_mut() {
                Some(last) if extends => {
                    let before = last.len;
                    last.put(pos - last.pos, piece, &mut uploads);
                    if !last.writers.contains(&writer) {
                        last.writers.push(writer);
                    }
                    u64::from(last.len - before)
                }
                _ => {
                    // Counted above (`slices_needed`): there is an id for every new slice.
                    let Some(id) = ids.next() else {
                        debug_assert!(false, "slices_needed counted every new slice");
                        break;
                    };
                    let mut slice = Pending {
                        id,
                        chunk,
                        pos,
                        len: 0,
                        blocks: Vec::new(),
                        sealed: false,
                        writers: vec![writer],
                    };
                    slice.put(0, piece, &mut uploads);
                    let len = u64::from(slice.len);
                    self.pending.push(slice);
                    len
                }
            };
            self.pending_bytes += grew;
        }
        Some(uploads)
    }

    /// Seals every pending slice and hands out its blocks not uploaded yet. Returns how many
    /// slices the commit takes (the first ones: writes that come later start new slices).
    pub fn seal(&mut self) -> (usize, Vec<Upload>) {
        let mut uploads = Vec::new();
        for slice in &mut self.pending {
            // Also a slice an inline commit closed without handing out its blocks.
            slice.sealed = true;
            for b in 0..slice.blocks.len() {
                slice.freeze(b, &mut uploads);
            }
        }
        (self.pending.len(), uploads)
    }

    /// Seals the first `n` pending slices without handing out their blocks (an inline commit
    /// takes them): later writes start new slices.
    pub fn close_first(&mut self, n: usize) {
        for slice in self.pending.iter_mut().take(n) {
            slice.sealed = true;
        }
    }

    /// Who wrote the bytes of the first `n` pending slices, each once.
    pub fn writers(&self, n: usize) -> Vec<u64> {
        let mut writers: Vec<u64> = Vec::new();
        for slice in self.pending.iter().take(n) {
            for writer in &slice.writers {
                if !writers.contains(writer) {
                    writers.push(*writer);
                }
            }
        }
        writers
    }

    /// Every pending write as inline slices, when all of them can be: none has a block handed
    /// out for upload, each lies below [`INLINE_FILE_BYTES_MAX`] and holds at most
    /// [`INLINE_SLICE_BYTES_MAX`], and together they hold at most `bytes_max` (0: never).
    /// Nothing changes until [`FileData::committed_inline`] (seal them with
    /// [`FileData::close_first`] while the commit is on its way).
    pub fn inline_commit(&self, bytes_max: u64) -> Option<InlineCommit> {
        if self.pending.is_empty() || self.pending_bytes > bytes_max {
            return None;
        }
        let fits = |p: &Pending| {
            p.len <= INLINE_SLICE_BYTES_MAX
                && p.chunk * CHUNK_BYTES + u64::from(p.pos) + u64::from(p.len)
                    <= INLINE_FILE_BYTES_MAX
                && p.blocks.iter().all(|b| matches!(b, Block::Open(_)))
        };
        if !self.pending.iter().all(fits) {
            return None;
        }
        let mut records = Vec::with_capacity(self.pending.len());
        let mut bytes = Vec::with_capacity(self.pending.len());
        for p in &self.pending {
            let (chunk, mut slice) = p.record();
            slice.id |= INLINE;
            records.push((chunk, slice));
            bytes.push((slice.id, p.bytes(0, p.len)));
        }
        Some(InlineCommit {
            slices: self.pending.len(),
            records,
            bytes,
        })
    }

    /// The pending slices of `commit` were committed inline, the file now `size` bytes long.
    pub fn committed_inline(&mut self, commit: InlineCommit, size: u64) {
        for p in self.pending.drain(..commit.slices) {
            self.pending_bytes -= u64::from(p.len);
        }
        for ((chunk, record), (id, data)) in commit.records.into_iter().zip(commit.bytes) {
            self.chunks.entry(chunk).or_default().push(record);
            self.inline.insert(id, Bytes::from(data));
        }
        self.size = self.size.max(size);
    }

    /// Drops the bytes of committed inline slices (the file is closed: an open reads the map
    /// with them again, and a read that finds them missing reads the map again).
    pub fn forget_inline(&mut self) {
        self.inline = HashMap::new();
    }

    /// The records of the first `n` pending slices.
    pub fn records(&self, n: usize) -> Vec<(u64, Slice)> {
        self.pending[..n].iter().map(Pending::record).collect()
    }

    /// The first `n` pending slices are committed, the file now `size` bytes long: they join
    /// the committed records.
    pub fn committed(&mut self, n: usize, size: u64) {
        for slice in self.pending.drain(..n) {
            self.pending_bytes -= u64::from(slice.len);
            let (chunk, record) = slice.record();
            self.chunks.entry(chunk).or_default().push(record);
        }
        self.size = self.size.max(size);
    }

    /// Drops every pending write (the file is gone).
    pub fn discard_pending(&mut self) -> Vec<(u64, u32)> {
        self.discard_first(self.pending.len())
    }

    /// Drops the first `n` pending writes (their commit failed for good); later ones stay.
    /// Returns the objects they were to become: `(id, length)`.
    pub fn discard_first(&mut self, n: usize) -> Vec<(u64, u32)> {
        let n = n.min(self.pending.len());
        self.pending
            .drain(..n)
            .map(|p| {
                self.pending_bytes -= u64::from(p.len);
                (p.id, p.len)
            })
            .collect()
    }

    /// Bytes the first `n` pending writes hold.
    pub fn pending_bytes_of(&self, n: usize) -> u64 {
        self.pending.iter().take(n).map(|p| u64::from(p.len)).sum()
    }

    /// The records of chunk `chunk` as committed.
    pub fn chunk(&self, chunk: u64) -> &[Slice] {
        self.chunks.get(&chunk).map_or(&[], Vec::as_slice)
    }

    /// Chunks whose records are past the compaction threshold.
    pub fn chunks_over(&self, records: usize) -> Vec<u64> {
        self.chunks
            .iter()
            .filter(|(_, s)| s.len() > records)
            .map(|(c, _)| *c)
            .collect()
    }

    /// How to read `len` bytes at `offset`: parts in order, cut at the end of the file.
    pub fn plan(&self, offset: u64, len: u64) -> Vec<Part> {
        let end = offset.saturating_add(len).min(self.size());
        if offset >= end {
            return Vec::new();
        }
        let mut parts = Vec::new();
        for (chunk, pos, n) in split(offset, end - offset) {
            let mut records: Vec<Slice> = self.chunk(chunk).to_vec();
            let mut memory: HashMap<u64, &Pending> = HashMap::new();
            for p in self
                .pending
                .iter()
                .filter(|p| p.chunk == chunk && p.len > 0)
            {
                records.push(p.record().1);
                memory.insert(p.id, p);
            }
            let mut at = pos;
            for piece in pieces_in(&view(&records), pos, pos + n) {
                if piece.pos > at {
                    parts.push(Part::Zeros(u64::from(piece.pos - at)));
                }
                parts.push(match piece.source {
                    Source::Zeros => Part::Zeros(u64::from(piece.len)),
                    Source::Object { id, off, .. } if memory.contains_key(&id) => {
                        Part::Memory(Bytes::from(memory[&id].bytes(off, off + piece.len)))
                    }
                    Source::Object { id, off, .. }
                        if is_inline(id)
                            && self
                                .inline
                                .get(&id)
                                .is_some_and(|b| b.len() >= (off + piece.len) as usize) =>
                    {
                        Part::Memory(
                            self.inline[&id].slice(off as usize..(off + piece.len) as usize),
                        )
                    }
                    Source::Object { id, size, off } => Part::Object {
                        id,
                        size,
                        off,
                        len: piece.len,
                    },
                });
                at = piece.pos + piece.len;
            }
            if at < pos + n {
                parts.push(Part::Zeros(u64::from(pos + n - at)));
            }
        }
        parts
    }

    /// The end of the last byte the committed records of `chunk` place.
    pub fn chunk_extent(&self, chunk: u64) -> u64 {
        extent(self.chunk(chunk))
    }
}

fn inline_map(inline: Vec<(u64, Vec<u8>)>) -> HashMap<u64, Bytes> {
    inline
        .into_iter()
        .map(|(id, data)| (id, Bytes::from(data)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Resolves a plan against uploaded objects.
    fn read(file: &FileData, objects: &HashMap<(u64, u32), Bytes>, off: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for part in file.plan(off, len) {
            match part {
                Part::Zeros(n) => out.extend(std::iter::repeat_n(0, n as usize)),
                Part::Memory(b) => out.extend_from_slice(&b),
                Part::Object { id, off, len, .. } => {
                    for i in off..off + len {
                        let b = (u64::from(i) / BLOCK_BYTES) as u32;
                        let data = &objects[&(id, b)];
                        out.push(data[(u64::from(i) % BLOCK_BYTES) as usize]);
                    }
                }
            }
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Step {
        Write(u64, Vec<u8>),
        Commit,
        /// A commit with the bytes inline when they may be (else as objects).
        CommitInline,
    }

    fn step(base: u64) -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => (0..6000u64, prop::collection::vec(any::<u8>(), 1..2500))
                .prop_map(move |(at, data)| Step::Write(base + at, data)),
            1 => Just(Step::Commit),
            1 => Just(Step::CommitInline),
        ]
    }

    /// Around a chunk's end, so that writes cross it; and at a file's start, where a commit
    /// may be inline.
    const NEAR_CHUNK_END: u64 = CHUNK_BYTES - 3000;

    proptest! {
        /// Buffered writes, uploads and commits (as objects or inline) read back as a plain
        /// byte array written in the same order, before and after each commit.
        #[test]
        fn writes_read_back_as_written(steps in prop::collection::vec(step(NEAR_CHUNK_END), 1..30)) {
            writes_read_back(NEAR_CHUNK_END, steps)?;
        }

        #[test]
        fn writes_at_the_start_read_back_as_written(steps in prop::collection::vec(step(0), 1..30)) {
            writes_read_back(0, steps)?;
        }
    }

    fn writes_read_back(base: u64, steps: Vec<Step>) -> Result<(), TestCaseError> {
        {
            let mut model: Vec<u8> = Vec::new();
            let mut file = FileData::new(0, Vec::new(), Vec::new());
            let mut objects: HashMap<(u64, u32), Bytes> = HashMap::new();
            let mut next = 100;
            for step in steps {
                match step {
                    Step::Write(at, data) => {
                        let end = (at - base) as usize + data.len();
                        if model.len() < end {
                            model.resize(end, 0);
                        }
                        model[(at - base) as usize..end].copy_from_slice(&data);
                        let needed = file.slices_needed(at, data.len() as u64);
                        let ids: Vec<u64> = (next + 1..=next + needed as u64).collect();
                        next += needed as u64;
                        prop_assert!(
                            file.write(at, &data, &ids[..needed.saturating_sub(1)], 7)
                                .is_none()
                                || needed == 0
                        );
                        for up in file.write(at, &data, &ids, 7).expect("ids enough") {
                            objects.insert((up.id, up.block), up.data);
                        }
                    }
                    Step::CommitInline if file.inline_commit(64 << 10).is_some() => {
                        let commit = file.inline_commit(64 << 10).expect("checked");
                        prop_assert!(
                            commit
                                .bytes
                                .iter()
                                .map(|(_, b)| b.len() as u64)
                                .sum::<u64>()
                                <= 64 << 10
                        );
                        for ((_, r), (id, b)) in commit.records.iter().zip(&commit.bytes) {
                            prop_assert!(r.check().is_ok());
                            prop_assert!(
                                is_inline(r.id) && r.id == *id && b.len() == r.size as usize
                            );
                        }
                        let size = file.size();
                        file.committed_inline(commit, size);
                        prop_assert!(!file.is_dirty());
                        prop_assert_eq!(file.pending_bytes(), 0);
                    }
                    Step::Commit | Step::CommitInline => {
                        let (n, uploads) = file.seal();
                        for up in uploads {
                            objects.insert((up.id, up.block), up.data);
                        }
                        let records = file.records(n);
                        for (_, r) in &records {
                            prop_assert!(r.check().is_ok());
                        }
                        let size = file.size();
                        file.committed(n, size);
                        prop_assert!(!file.is_dirty());
                        prop_assert_eq!(file.pending_bytes(), 0);
                    }
                }
                let expected_size = if model.is_empty() {
                    0
                } else {
                    base + model.len() as u64
                };
                prop_assert_eq!(file.size(), expected_size);
                if !model.is_empty() {
                    let got = read(&file, &objects, base, model.len() as u64 + 10);
                    prop_assert_eq!(got, model.clone());
                }
            }
        }
        Ok(())
    }

    #[test]
    fn a_sequential_write_uploads_full_blocks_as_it_goes() {
        let mut file = FileData::new(0, Vec::new(), Vec::new());
        let mut ids = 0;
        let mb = vec![7u8; 1 << 20];
        let mut uploaded = 0;
        for i in 0..9u64 {
            ids += file.slices_needed(i << 20, mb.len() as u64);
            uploaded += file.write(i << 20, &mb, &[1], 7).expect("an id").len();
        }
        assert_eq!(ids, 1, "one slice");
        assert_eq!(uploaded, 2, "two full blocks handed out while writing");
        let (n, rest) = file.seal();
        assert_eq!((n, rest.len()), (1, 1));
        assert_eq!(rest[0].data.len(), 1 << 20);
        // A write after the seal starts a new slice.
        assert_eq!(file.slices_needed(9 << 20, 1), 1);
        let before = file.pending_bytes();
        assert!(
            file.write(9 << 20, b"x", &[], 7).is_none(),
            "no id, nothing written"
        );
        assert_eq!(file.pending_bytes(), before);
        file.write(9 << 20, b"x", &[2], 7).expect("an id");
        assert_eq!(file.records(2).len(), 2);
    }
}
