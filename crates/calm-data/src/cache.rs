//! A mount's bounded local cache of a remote store's block objects, on disk.
//!
//! Block objects are immutable and their names (slice id, block index) are never reused within
//! a namespace, so a cached object is never stale: the cache needs no invalidation. It is
//! kept per namespace identity (`ROOT/NAMESPACE/SLOT/HH/ID-BBBB`), so a namespace created again
//! over the same object store never reads another's bytes. Each file is the whole object as
//! the store holds it (header and data) and is checked again on every read: a damaged cache
//! file is dropped and fetched again, never returned.
//!
//! One mount process uses one slot, held by an exclusive lock on `SLOT/lock` for its life;
//! mounts on the same machine take the first free slot of [`SLOTS_MAX`], so each keeps a
//! cache that outlives it without two processes writing one index. The files a slot holds
//! add up to at most its size: the least recently used go first (after a restart, the
//! least recently written).

use calm_types::sync::Locked;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use crate::block;
use crate::error::DataError;

/// Default bytes of a mount's disk cache (`calm mount --cache-size`).
pub const DISK_CACHE_BYTES_DEFAULT: u64 = 1 << 30;
/// Slots of one namespace's cache directory: mounts of one machine beyond this run without
/// a disk cache (and say so).
pub const SLOTS_MAX: u32 = 16;

type Key = (u64, u32);

#[derive(Debug, Default)]
struct Index {
    /// Each cached object: its length and its last use.
    entries: HashMap<Key, (u64, u64)>,
    /// Last use → object, oldest first.
    by_use: BTreeMap<u64, Key>,
    clock: u64,
    bytes: u64,
    /// Objects being written, with their lengths: room is made for them first, so that the
    /// files on disk never add up to more than the size, however many are written at once.
    /// (As many as the mount's reads fetching blocks at once: a few.)
    writing: HashMap<Key, u64>,
}

impl Index {
    fn touch(&mut self, key: Key) {
        if let Some((_, used)) = self.entries.get_mut(&key) {
            self.by_use.remove(used);
            self.clock += 1;
            *used = self.clock;
            self.by_use.insert(self.clock, key);
        }
    }

    fn insert(&mut self, key: Key, len: u64) {
        self.remove(key);
        self.clock += 1;
        self.entries.insert(key, (len, self.clock));
        self.by_use.insert(self.clock, key);
        self.bytes += len;
    }

    fn remove(&mut self, key: Key) -> bool {
        match self.entries.remove(&key) {
            Some((len, used)) => {
                self.by_use.remove(&used);
                self.bytes -= len;
                true
            }
            None => false,
        }
    }

    /// Sets room aside for `key` of `len` bytes, which is about to be written; false when it
    /// is cached or being written already, or the room set aside for others leaves too little.
    fn reserve(&mut self, key: Key, len: u64, max: u64) -> bool {
        if self.entries.contains_key(&key)
            || self.writing.contains_key(&key)
            || self.reserved() + len > max
        {
            return false;
        }
        self.writing.insert(key, len);
        true
    }

    /// The room set aside for the objects being written.
    fn reserved(&self) -> u64 {
        self.writing.values().sum()
    }

    /// `key`'s write ended: its room is no longer set aside; `written`: it is cached.
    fn written(&mut self, key: Key, written: bool) {
        if let Some(len) = self.writing.remove(&key)
            && written
        {
            self.insert(key, len);
        }
    }

    /// The least recently used object, while the total with the room set aside is over `max`.
    fn evict(&mut self, max: u64) -> Option<Key> {
        if self.bytes + self.reserved() <= max {
            return None;
        }
        let (_, key) = self.by_use.pop_first()?;
        let (len, _) = self.entries.remove(&key).expect("indexed both ways");
        self.bytes -= len;
        Some(key)
    }
}

/// One mount's disk cache (see the module documentation).
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    bytes_max: u64,
    index: Mutex<Index>,
    /// Holds the slot for this process.
    _lock: File,
}

impl DiskCache {
    /// Opens a slot of the cache of namespace `namespace` under `root` (created when absent),
    /// keeping at most `bytes_max` bytes. `None`: every slot is taken by other mounts.
    pub fn open(
        root: &Path,
        namespace: &str,
        bytes_max: u64,
    ) -> Result<Option<DiskCache>, DataError> {
        let unavailable = |what: &str, path: &Path, e: std::io::Error| {
            DataError::Unavailable(format!("{what} {}: {e}", path.display()))
        };
        if namespace.is_empty() || !namespace.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(DataError::Invalid(format!(
                "a namespace identity of hex digits, not {namespace:?}"
            )));
        }
        for slot in 0..SLOTS_MAX {
            let dir = root.join(namespace).join(slot.to_string());
            std::fs::create_dir_all(&dir).map_err(|e| unavailable("creating", &dir, e))?;
            let lock_path = dir.join("lock");
            let lock =
                File::create(&lock_path).map_err(|e| unavailable("opening", &lock_path, e))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(unavailable("locking", &lock_path, e)),
            }
            let cache = DiskCache {
                index: Mutex::new(scan(&dir).map_err(|e| unavailable("reading", &dir, e))?),
                dir,
                bytes_max,
                _lock: lock,
            };
            cache.evict();
            return Ok(Some(cache));
        }
        Ok(None)
    }

    /// The slot's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.index().bytes
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        // The index holds no invariant a panic in another thread could break half-way.
        self.index.locked()
    }

    fn path(&self, (id, block): Key) -> PathBuf {
        self.dir
            .join(format!("{:02x}", id & 0xff))
            .join(format!("{id:016x}-{block:04}"))
    }

    /// Data of block `block` of slice `id` (`block_len` bytes), checked; `None` when it is
    /// not cached or its file is damaged (which is then dropped).
    pub fn get(&self, id: u64, block: u32, block_len: u32) -> Option<Bytes> {
        let key = (id, block);
        if !self.index().entries.contains_key(&key) {
            return None;
        }
        let path = self.path(key);
        let header_len = block::header_len(block_len) as usize;
        let checked = std::fs::read(&path).ok().and_then(|object| {
            if object.len() != header_len + block_len as usize {
                return None;
            }
            let mut object = Bytes::from(object);
            let data = object.split_off(header_len);
            block::verify(block_len, &object, data, 0, block_len).ok()
        });
        match checked {
            Some(data) => {
                self.index().touch(key);
                Some(data)
            }
            None => {
                tracing::warn!(path = %path.display(), "dropping a damaged cache file");
                self.index().remove(key);
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keeps the object of block `block` of slice `id` (its header, then its data), after
    /// dropping the least recently used objects that leave it no room. A failure to write only
    /// means the object is not cached; so does a write while others fill the room.
    pub fn put(&self, id: u64, block: u32, header: &[u8], data: &[u8]) {
        let key = (id, block);
        let len = (header.len() + data.len()) as u64;
        if !self.index().reserve(key, len, self.bytes_max) {
            return;
        }
        self.evict();
        let path = self.path(key);
        let tmp = path.with_extension("tmp");
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().expect("in a directory"))?;
            let mut file = File::create(&tmp)?;
            file.write_all(header)?;
            file.write_all(data)?;
            // Whole or absent: a crash leaves a .tmp file, which the next open removes.
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = &written {
            tracing::debug!(path = %path.display(), "not cached: {e}");
            let _ = std::fs::remove_file(&tmp);
        }
        self.index().written(key, written.is_ok());
    }

    /// Drops the least recently used objects while the cache and the room set aside exceed
    /// the size; their files go before the index lets another write in.
    fn evict(&self) {
        let mut index = self.index();
        while let Some(key) = index.evict(self.bytes_max) {
            let _ = std::fs::remove_file(self.path(key));
        }
    }
}

/// The index of a slot's files, oldest written first; unfinished writes are removed.
fn scan(dir: &Path) -> std::io::Result<Index> {
    let mut found = Vec::new();
    for sub in std::fs::read_dir(dir)? {
        let sub = sub?;
        if !sub.file_type()?.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(sub.path())? {
            let file = file?;
            let name = file.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(file.path());
                continue;
            }
            let Some(key) = parse_name(&name) else {
                continue;
            };
            let meta = file.metadata()?;
            found.push((meta.modified()?, key, meta.len()));
        }
    }
    found.sort();
    let mut index = Index::default();
    for (_, key, len) in found {
        index.insert(key, len);
    }
    Ok(index)
}

fn parse_name(name: &str) -> Option<Key> {
    let (id, block) = name.split_once('-')?;
    Some((u64::from_str_radix(id, 16).ok()?, block.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn object(data: &[u8]) -> (Bytes, Bytes) {
        let mut object = block::encode(data);
        let data = object.split_off(block::header_len(data.len() as u32) as usize);
        (object, data)
    }

    #[test]
    fn objects_come_back_checked_and_the_size_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let ns = "00ff";
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 249) as u8).collect();
        let (header, body) = object(&data);
        let one = (header.len() + body.len()) as u64;
        let cache = DiskCache::open(root.path(), ns, 3 * one).unwrap().unwrap();
        for id in 1..=3 {
            cache.put(id, 0, &header, &body);
        }
        assert_eq!(cache.bytes(), 3 * one);
        // Use 1, then add a fourth: 2, the least recently used, goes.
        assert_eq!(cache.get(1, 0, 10_000).unwrap(), &data[..]);
        cache.put(4, 0, &header, &body);
        assert!(cache.get(2, 0, 10_000).is_none());
        assert!(
            !cache.path((2, 0)).exists(),
            "an evicted object's file is removed"
        );
        assert_eq!(cache.bytes(), 3 * one);

        // A second mount takes the next slot; the first keeps its own.
        let other = DiskCache::open(root.path(), ns, one).unwrap().unwrap();
        assert_ne!(other.dir(), cache.dir());
        assert!(other.get(1, 0, 10_000).is_none());
        drop(other);

        // A damaged file is dropped, not returned.
        let damaged = cache.path((3, 0));
        let mut bytes = std::fs::read(&damaged).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&damaged, bytes).unwrap();
        assert!(cache.get(3, 0, 10_000).is_none());
        assert!(!damaged.exists());
        assert_eq!(cache.bytes(), 2 * one);

        // Reopened, the slot keeps what it held; unfinished writes are removed.
        let dir = cache.dir().to_path_buf();
        drop(cache);
        std::fs::write(dir.join("01/0000000000000001-0001.tmp"), b"half").unwrap();
        let cache = DiskCache::open(root.path(), ns, 3 * one).unwrap().unwrap();
        assert_eq!(cache.dir(), dir);
        assert_eq!(cache.bytes(), 2 * one);
        assert_eq!(cache.get(4, 0, 10_000).unwrap(), &data[..]);
        assert!(!dir.join("01/0000000000000001-0001.tmp").exists());

        // Another namespace's cache is another directory.
        let elsewhere = DiskCache::open(root.path(), "01", one).unwrap().unwrap();
        assert!(elsewhere.get(4, 0, 10_000).is_none());
        assert!(DiskCache::open(root.path(), "../x", one).is_err());
    }

    /// The cached objects' files in `dir` added up (not those still being written: a file
    /// renamed while the directory is listed may be listed under both names).
    fn on_disk(dir: &Path) -> u64 {
        let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
        let done = files.filter(|f| f.path().extension().is_none());
        done.filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    #[test]
    fn objects_written_at_once_never_add_up_to_more_than_the_size() {
        let root = tempfile::tempdir().unwrap();
        let (header, body) = object(&[7u8; 300_000]);
        let one = (header.len() + body.len()) as u64;
        let max = 3 * one + one / 2;
        let cache = DiskCache::open(root.path(), "ab", max).unwrap().unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        // Every object in one directory (ids alike in their last byte), listed at once.
        let objects = cache.dir().join("07");
        let most = std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut most = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    most = most.max(on_disk(&objects));
                }
                most
            });
            let writers: Vec<_> = (0..6u64)
                .map(|t| {
                    let (cache, header, body) = (&cache, &header, &body);
                    s.spawn(move || {
                        for i in 0..40 {
                            cache.put(((t * 1000 + i) << 8) | 7, 0, header, body);
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            sampler.join().unwrap()
        });
        assert!(most > 0, "the sampler saw the cache");
        assert!(most <= max, "{most} bytes on disk for a cache of {max}");
        assert_eq!(on_disk(&objects), cache.bytes());
        assert!(cache.bytes() <= max && cache.bytes() >= one);
    }

    proptest! {
        /// Against a model of LRU: the cache holds exactly the most recently used objects that
        /// fit, and every one of them reads back whole.
        #[test]
        fn the_cache_keeps_the_most_recently_used(
            ops in prop::collection::vec((any::<bool>(), 1u64..12, 1usize..2000), 1..80),
            max in 1_000u64..8_000,
        ) {
            let root = tempfile::tempdir().unwrap();
            let cache = DiskCache::open(root.path(), "ab", max).unwrap().unwrap();
            // Model: (id, len) in use order, most recent last.
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut lens: HashMap<u64, usize> = HashMap::new();
            for (put, id, len) in ops {
                if put {
                    let len = *lens.entry(id).or_insert(len);
                    let data = vec![id as u8; len];
                    let (header, body) = object(&data);
                    let total = (header.len() + body.len()) as u64;
                    cache.put(id, 0, &header, &body);
                    if total <= max && !model.iter().any(|(i, _)| *i == id) {
                        model.push((id, total));
                        while model.iter().map(|(_, l)| l).sum::<u64>() > max {
                            model.remove(0);
                        }
                    }
                } else if let Some(len) = lens.get(&id) {
                    let got = cache.get(id, 0, *len as u32);
                    let held = model.iter().position(|(i, _)| *i == id);
                    prop_assert_eq!(got.is_some(), held.is_some(), "object {}", id);
                    if let Some(at) = held {
                        prop_assert!(got.unwrap().iter().all(|b| *b == id as u8));
                        let entry = model.remove(at);
                        model.push(entry);
                    }
                }
                prop_assert_eq!(cache.bytes(), model.iter().map(|(_, l)| l).sum::<u64>());
                prop_assert!(cache.bytes() <= max);
            }
        }
    }
}
