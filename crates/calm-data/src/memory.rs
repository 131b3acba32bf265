//! What a mount keeps in memory of its store: the verified headers of blocks read, whole
//! verified blocks of a remote store (least recently fetched dropped first), and which slices are being read in order, so that the blocks ahead
//! of a sequential reader are fetched before it asks (pure; the fetching is in
//! [`crate::objects`]).

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// Bytes of whole blocks a remote store's reader keeps in memory, by default: a read of a
/// remote block fetches all of it (a request costs far more than its bytes), and the reads
/// that follow in the same block are answered from here.
pub const BLOCK_CACHE_BYTES_DEFAULT: u64 = 256 << 20;

/// Bytes of verified block headers a reader keeps in memory (a random read of a block whose
/// header is known reads only its data pieces: one request, one disk read, instead of two).
pub const HEADER_CACHE_BYTES: u64 = 8 << 20;
/// What an entry of the header cache is counted for beyond its bytes (key, map and queue).
pub(crate) const HEADER_ENTRY_BYTES: u64 = 96;

/// Whole verified blocks of a remote store (or verified block headers), least recently
/// fetched dropped first.
#[derive(Debug, Default)]
pub(crate) struct BlockCache {
    pub(crate) blocks: HashMap<(u64, u32), Bytes>,
    pub(crate) order: VecDeque<(u64, u32)>,
    pub(crate) bytes: u64,
    pub(crate) bytes_max: u64,
    /// Counted per entry on top of its bytes.
    pub(crate) entry_bytes: u64,
}

impl BlockCache {
    pub(crate) fn get(&self, key: (u64, u32)) -> Option<Bytes> {
        self.blocks.get(&key).cloned()
    }

    pub(crate) fn put(&mut self, key: (u64, u32), data: Bytes) {
        if self.bytes_max == 0 || self.blocks.contains_key(&key) {
            return;
        }
        self.bytes += data.len() as u64 + self.entry_bytes;
        self.blocks.insert(key, data);
        self.order.push_back(key);
        while self.bytes > self.bytes_max {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.blocks.remove(&old) {
                self.bytes -= gone.len() as u64 + self.entry_bytes;
            }
        }
    }
}

/// Blocks fetched ahead of a sequential reader of a remote store.
pub const PREFETCH_BLOCKS: u32 = 4;
/// Slices whose last block read is remembered; past it the memory starts over.
pub const RECENT_SLICES_MAX: usize = 4096;

/// The last block read of recently read slices.
#[derive(Debug, Default)]
pub(crate) struct RecentReads {
    last: HashMap<u64, u32>,
}

impl RecentReads {
    /// Block `b` of slice `id` (of `count` blocks) is read: the blocks to fetch ahead, when
    /// the slice is being read in order (this block follows, or repeats, the last one read).
    pub(crate) fn read(&mut self, id: u64, b: u32, count: u32) -> std::ops::Range<u32> {
        if self.last.len() >= RECENT_SLICES_MAX && !self.last.contains_key(&id) {
            self.last.clear();
        }
        let in_order = self
            .last
            .insert(id, b)
            .is_some_and(|last| b == last || b == last + 1);
        if in_order {
            b + 1..(b + 1 + PREFETCH_BLOCKS).min(count)
        } else {
            0..0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_in_order_fetch_ahead() {
        let mut recent = RecentReads::default();
        assert_eq!(
            recent.read(7, 0, 16),
            0..0,
            "a first read says nothing of order"
        );
        assert_eq!(
            recent.read(7, 0, 16),
            1..5,
            "the same block again: in order"
        );
        assert_eq!(recent.read(7, 1, 16), 2..6);
        assert_eq!(recent.read(7, 14, 16), 0..0, "a jump is not in order");
        assert_eq!(
            recent.read(7, 15, 16),
            16..16,
            "nothing past the slice's end"
        );
        assert_eq!(recent.read(8, 1, 16), 0..0, "slices are apart");
    }

    #[test]
    fn the_block_cache_keeps_its_size() {
        let mut cache = BlockCache {
            bytes_max: 10,
            ..BlockCache::default()
        };
        for i in 0..5u64 {
            cache.put((i, 0), Bytes::from(vec![0u8; 4]));
        }
        assert!(cache.bytes <= 10);
        assert!(cache.get((4, 0)).is_some() && cache.get((0, 0)).is_none());
    }
}
