//! The object store: where the blocks of every slice live, shared by every mount and server of
//! a namespace. Object names: `PREFIX/chunks/HH/ID-BBBB` (HH: the slice id's low byte in hex,
//! ID: the id in 16 hex digits, BBBB: the block index), so a listing can be spread and an
//! object's slice is known from its name alone.
//!
//! Reads check every byte against the block's checksums ([`crate::block`]); a missing,
//! truncated or corrupted object is an error, never file contents.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::block;
use crate::cache::DiskCache;
use crate::error::DataError;
use crate::memory::{BlockCache, RecentReads};
use crate::meter::{Found, Kind, Meter};
use crate::url::ObjectsUrl;
use calm_types::slices::{BLOCK_BYTES, blocks};

/// How long one request to a remote store may take, and how often it is retried, before the
/// operation fails with EIO (an unreachable store must not hang a close for minutes).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const REQUEST_RETRIES_MAX: usize = 3;

/// An object the store holds, as a listing names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: u64,
    pub block: u32,
    /// The object's length in bytes (header included).
    pub len: u64,
    /// When it was written, in ms since the epoch.
    pub modified_ms: i64,
}

pub use crate::memory::BLOCK_CACHE_BYTES_DEFAULT;

/// A whole-block fetch of a remote store, shared by whoever waits for it.
type Fetch = futures::future::Shared<futures::future::BoxFuture<'static, Result<Bytes, DataError>>>;

/// The object store of a namespace.
#[derive(Debug, Clone)]
pub struct Objects {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Where the namespace's objects begin (the URL's prefix; empty for a local directory).
    pub(crate) root: Path,
    prefix: Path,
    /// The directory of a local store (objects are files under it).
    local: Option<PathBuf>,
    url: String,
    /// Whole blocks of a remote store (empty for a local one, which the page cache serves).
    cache: Arc<std::sync::Mutex<BlockCache>>,
    /// Slices of a remote store being read, to fetch ahead of sequential readers.
    recent: Arc<std::sync::Mutex<RecentReads>>,
    /// Verified headers of blocks read: objects never change, so a header read once holds.
    headers: Arc<std::sync::Mutex<BlockCache>>,
    /// Whole-block fetches in flight: a read and a fetch ahead of one block share a request.
    inflight: Arc<std::sync::Mutex<HashMap<(u64, u32), Fetch>>>,
    /// Whole block objects of a remote store on local disk, when the mount keeps them.
    disk: Option<Arc<DiskCache>>,
    /// The requests made and how reads were served, for the metrics.
    meter: Arc<Meter>,
    /// Set on a server's handle: deletions only while the store is its namespace's.
    pub(crate) fence: Option<Arc<Fence>>,
}

/// A handle's claim on its store, checked before its deletions (`crate::owner`).
#[derive(Debug)]
pub(crate) struct Fence {
    pub(crate) claim: Vec<u8>,
    /// When the owner was last read and found to be this claim.
    pub(crate) checked: std::sync::Mutex<Option<Instant>>,
}

impl Objects {
    /// Opens the store `url` names (a local directory is created when missing).
    pub fn open(url: &str) -> Result<Objects, DataError> {
        Objects::open_with(url, true)
    }

    /// [`Objects::open`] for a store that must exist already (to read from it: a listing of
    /// its backups, a backup to load): a local directory that is not there is an error, not
    /// made.
    pub fn open_existing(url: &str) -> Result<Objects, DataError> {
        Objects::open_with(url, false)
    }

    fn open_with(url: &str, create: bool) -> Result<Objects, DataError> {
        match ObjectsUrl::parse(url)? {
            ObjectsUrl::File { root } => {
                if create {
                    std::fs::create_dir_all(&root).map_err(|e| {
                        DataError::Unavailable(format!("creating {}: {e}", root.display()))
                    })?;
                } else if !root.is_dir() {
                    return Err(DataError::Unavailable(format!(
                        "{} is not a directory",
                        root.display()
                    )));
                }
                let store = object_store::local::LocalFileSystem::new_with_prefix(&root)?;
                Ok(Objects {
                    store: Arc::new(store),
                    root: Path::default(),
                    prefix: Path::from("chunks"),
                    local: Some(root),
                    url: url.to_string(),
                    cache: Arc::default(),
                    recent: Arc::default(),
                    headers: header_cache(),
                    inflight: Arc::default(),
                    disk: None,
                    meter: Arc::default(),
                    fence: None,
                })
            }
            ObjectsUrl::S3 {
                bucket,
                prefix,
                endpoint,
                region,
            } => {
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(object_store::RetryConfig {
                        max_retries: REQUEST_RETRIES_MAX,
                        retry_timeout: REQUEST_TIMEOUT,
                        ..Default::default()
                    })
                    .with_client_options(
                        object_store::ClientOptions::new()
                            .with_timeout(REQUEST_TIMEOUT)
                            .with_connect_timeout(Duration::from_secs(5)),
                    );
                if let Some(endpoint) = endpoint {
                    builder = builder
                        .with_allow_http(endpoint.starts_with("http://"))
                        .with_endpoint(endpoint);
                }
                if let Some(region) = region {
                    builder = builder.with_region(region);
                }
                let store = builder.build()?;
                let root = Path::from(prefix.as_str());
                Ok(Objects {
                    store: Arc::new(store),
                    prefix: root.clone().join("chunks"),
                    root,
                    local: None,
                    url: url.to_string(),
                    cache: Arc::new(std::sync::Mutex::new(BlockCache {
                        bytes_max: BLOCK_CACHE_BYTES_DEFAULT,
                        ..BlockCache::default()
                    })),
                    recent: Arc::default(),
                    headers: header_cache(),
                    inflight: Arc::default(),
                    disk: None,
                    meter: Arc::default(),
                    fence: None,
                })
            }
        }
    }

    /// Bytes the in-memory caches hold now, as they count them against their bounds: whole
    /// blocks of a remote store (at most [`BLOCK_CACHE_BYTES_DEFAULT`] unless set), and
    /// verified block headers (at most [`crate::memory::HEADER_CACHE_BYTES`]).
    pub fn cached_bytes(&self) -> (u64, u64) {
        let blocks = self.cache.locked().bytes;
        let headers = self.headers.locked().bytes;
        (blocks, headers)
    }

    /// What this handle and its clones counted (requests by kind, where reads were found).
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Sets the bytes of whole blocks kept in memory for a remote store (0: none).
    pub fn set_block_cache_bytes(&self, bytes: u64) {
        if self.local.is_none() {
            self.cache.locked().bytes_max = bytes;
        }
    }

    /// Keeps the blocks of a remote store read or written through this handle (and its
    /// clones made afterwards) in `cache` too. A local store needs no cache: it is ignored.
    pub fn with_disk_cache(mut self, cache: DiskCache) -> Objects {
        if self.local.is_none() {
            self.disk = Some(Arc::new(cache));
        }
        self
    }

    /// The URL this store was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the store is a local directory.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// The directory of a local store.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local.as_deref()
    }

    fn path(&self, id: u64, block: u32) -> Path {
        self.prefix
            .clone()
            .join(format!("{:02x}", id & 0xff))
            .join(format!("{id:016x}-{block:04}"))
    }

    /// Reads an object's name back: `(id, block)`.
    fn parse_name(location: &Path) -> Option<(u64, u32)> {
        let name = location.filename()?;
        let (id, block) = name.split_once('-')?;
        Some((u64::from_str_radix(id, 16).ok()?, block.parse().ok()?))
    }

    /// Where block `block` of slice `id` of a local store lives.
    fn local_path(&self, root: &std::path::Path, id: u64, block: u32) -> PathBuf {
        root.join(self.path(id, block).as_ref())
    }

    /// Writes block `block` of slice `id`. The object appears whole or not at all.
    pub async fn put_block(&self, id: u64, block: u32, data: Bytes) -> Result<(), DataError> {
        let (started, bytes) = (Instant::now(), data.len() as u64);
        let put = self.put_block_unmetered(id, block, data).await;
        self.meter.request(Kind::Put, started, bytes, put.is_ok());
        put
    }

    async fn put_block_unmetered(&self, id: u64, block: u32, data: Bytes) -> Result<(), DataError> {
        let header = block::header(&data);
        if let Some(root) = &self.local {
            let path = self.local_path(root, id, block);
            let inline = (header.len() + data.len()) as u64 <= crate::local::INLINE_BYTES_MAX;
            let put = move || {
                if data.len() as u64 == BLOCK_BYTES {
                    crate::local::put_direct(&path, &header, &data)
                } else {
                    crate::local::put(&path, &[&header, &data])
                }
                .map_err(|e| local_error(&path, e))
            };
            return if inline {
                put()
            } else {
                tokio::task::spawn_blocking(put)
                    .await
                    .map_err(|e| DataError::Unavailable(e.to_string()))?
            };
        }
        self.store
            .put(
                &self.path(id, block),
                PutPayload::from_iter([header.clone(), data.clone()]),
            )
            .await?;
        // Partial blocks (small files, the tails of large ones) are kept on disk as written:
        // they are the ones read back soon and the ones a request costs most for. Full
        // blocks of large writes would only push everything else out.
        if let Some(disk) = &self.disk
            && (data.len() as u64) < BLOCK_BYTES
        {
            let disk = disk.clone();
            tokio::task::spawn_blocking(move || disk.put(id, block, &header, &data));
        }
        Ok(())
    }

    /// Bytes `[off, off + len)` of slice `id`, whose data is `size` bytes long, checked.
    pub async fn read(&self, id: u64, size: u32, off: u32, len: u32) -> Result<Bytes, DataError> {
        let end = off
            .checked_add(len)
            .filter(|end| *end <= size)
            .ok_or_else(|| DataError::Invalid(format!("read past the end of slice {id}")))?;
        let mut parts = Vec::new();
        for (b, block_len) in blocks(size) {
            let start = b as u64 * BLOCK_BYTES;
            let stop = start + u64::from(block_len);
            let (from, to) = (u64::from(off).max(start), u64::from(end).min(stop));
            if from >= to {
                continue;
            }
            let (from, to) = ((from - start) as u32, (to - start) as u32);
            parts.push(self.read_block(id, size, b, block_len, from, to));
        }
        let parts = futures::future::try_join_all(parts).await?;
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one"));
        }
        let mut out = bytes::BytesMut::with_capacity(len as usize);
        for part in parts {
            out.extend_from_slice(&part);
        }
        Ok(out.freeze())
    }

    async fn read_block(
        &self,
        id: u64,
        size: u32,
        b: u32,
        block_len: u32,
        from: u32,
        to: u32,
    ) -> Result<Bytes, DataError> {
        let memory = self.local.is_none() && self.cache.locked().bytes_max > 0;
        if !memory && self.disk.is_none() {
            return Ok(self.read_block_ranges(id, b, block_len, from, to).await?.1);
        }
        // A remote store: the whole block, once, then from memory or disk; the next blocks
        // of a slice read in order are fetched ahead.
        let count = blocks(size).count() as u32;
        let ahead = self.recent.locked().read(id, b, count);
        for next in ahead {
            let cached = self.cache.locked().get((id, next)).is_some();
            if !cached && let Some((_, len)) = blocks(size).nth(next as usize) {
                drop(self.fetch_whole(id, next, len));
            }
        }
        if let Some(whole) = self.cache.locked().get((id, b)) {
            self.meter.found(Found::Memory);
            return Ok(whole.slice(from as usize..to as usize));
        }
        let whole = self.fetch_whole(id, b, block_len).await?;
        Ok(whole.slice(from as usize..to as usize))
    }

    /// Block `b` of slice `id`, whole and checked: from the disk cache or the store, then kept
    /// in memory (and on disk). One request per block however many wait for it; it runs to
    /// its end whether anyone waits or not (a fetch ahead).
    fn fetch_whole(&self, id: u64, b: u32, block_len: u32) -> Fetch {
        let mut inflight = self.inflight.locked();
        if let Some(fetch) = inflight.get(&(id, b)) {
            return fetch.clone();
        }
        let this = self.clone();
        let fetch = async move {
            let result = this.fetch_and_keep(id, b, block_len).await;
            this.inflight.locked().remove(&(id, b));
            result
        }
        .boxed()
        .shared();
        inflight.insert((id, b), fetch.clone());
        // Driven to its end even if every reader waiting for it goes away.
        tokio::spawn(fetch.clone());
        fetch
    }

    async fn fetch_and_keep(&self, id: u64, b: u32, block_len: u32) -> Result<Bytes, DataError> {
        let on_disk = match &self.disk {
            Some(disk) => {
                let disk = disk.clone();
                tokio::task::spawn_blocking(move || disk.get(id, b, block_len))
                    .await
                    .ok()
                    .flatten()
            }
            None => None,
        };
        let whole = match on_disk {
            Some(whole) => {
                self.meter.found(Found::Disk);
                whole
            }
            None => {
                self.meter.found(Found::Store);
                let (header, whole) = self
                    .read_block_ranges(id, b, block_len, 0, block_len)
                    .await?;
                if let Some(disk) = &self.disk {
                    let (disk, whole) = (disk.clone(), whole.clone());
                    tokio::task::spawn_blocking(move || disk.put(id, b, &header, &whole));
                }
                whole
            }
        };
        self.cache.locked().put((id, b), whole.clone());
        Ok(whole)
    }

    /// The header and bytes `[from, to)` of block `b` of slice `id`, fetched and checked piece
    /// by piece.
    async fn read_block_ranges(
        &self,
        id: u64,
        b: u32,
        block_len: u32,
        from: u32,
        to: u32,
    ) -> Result<(Bytes, Bytes), DataError> {
        let started = Instant::now();
        let read = self
            .read_block_ranges_unmetered(id, b, block_len, from, to)
            .await;
        let bytes = read.as_ref().map_or(0, |(_, data)| data.len() as u64);
        self.meter.request(Kind::Get, started, bytes, read.is_ok());
        read
    }

    async fn read_block_ranges_unmetered(
        &self,
        id: u64,
        b: u32,
        block_len: u32,
        from: u32,
        to: u32,
    ) -> Result<(Bytes, Bytes), DataError> {
        let path = self.path(id, b);
        let data = block::data_range(block_len, from, to);
        let known = self.headers.locked().get((id, b));
        if let Some(header) = known {
            let fetched = match &self.local {
                Some(root) => {
                    let file = self.local_path(root, id, b);
                    let range = data.clone();
                    let read = move || read_local(&file, id, b, block_len, &[range]);
                    if data.end - data.start <= crate::local::INLINE_BYTES_MAX {
                        read()?
                    } else {
                        tokio::task::spawn_blocking(read)
                            .await
                            .map_err(|e| DataError::Unavailable(e.to_string()))??
                    }
                    .pop()
                    .expect("one range")
                }
                None => self
                    .store
                    .get_range(&path, data)
                    .await
                    .map_err(|e| remote_error(e, id, b))?,
            };
            return check_block(id, b, block_len, header, fetched, from, to);
        }
        let header = 0..block::header_len(block_len);
        let checked = self
            .read_header_and(id, b, block_len, header, data, from, to)
            .await?;
        self.headers.locked().put((id, b), checked.0.clone());
        Ok(checked)
    }

    /// [`Objects::read_block_ranges`] with the header fetched too.
    #[allow(clippy::too_many_arguments)]
    async fn read_header_and(
        &self,
        id: u64,
        b: u32,
        block_len: u32,
        header: std::ops::Range<u64>,
        data: std::ops::Range<u64>,
        from: u32,
        to: u32,
    ) -> Result<(Bytes, Bytes), DataError> {
        let path = self.path(id, b);
        if let Some(root) = &self.local {
            let file = self.local_path(root, id, b);
            let inline = data.end - data.start <= crate::local::INLINE_BYTES_MAX;
            let read = move || read_local(&file, id, b, block_len, &[header, data]);
            let fetched = if inline {
                read()?
            } else {
                tokio::task::spawn_blocking(read)
                    .await
                    .map_err(|e| DataError::Unavailable(e.to_string()))??
            };
            let (header, data) = two_ranges(fetched, id, b)?;
            return check_block(id, b, block_len, header, data, from, to);
        }
        let fetched = self.store.get_ranges(&path, &[header, data]).await;
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(error @ object_store::Error::NotFound { .. }) => {
                return Err(remote_error(error, id, b));
            }
            Err(error) => {
                // A range past the object's end: the object is shorter than its header says.
                let expected = block::header_len(block_len) + u64::from(block_len);
                return match self.store.head(&path).await {
                    Ok(meta) if meta.size != expected => Err(DataError::Corrupt(format!(
                        "block {b} of slice {id} is {} bytes long, not {expected}",
                        meta.size
                    ))),
                    _ => Err(error.into()),
                };
            }
        };
        let (header, data) = two_ranges(fetched, id, b)?;
        check_block(id, b, block_len, header, data, from, to)
    }

    /// Makes slice `id`'s blocks durable (a local store writes without syncing; a remote
    /// store's objects are durable when their put returns).
    pub async fn sync(&self, id: u64, size: u32) -> Result<(), DataError> {
        let Some(root) = &self.local else {
            return Ok(());
        };
        let files: Vec<PathBuf> = blocks(size)
            .map(|(b, _)| root.join(self.path(id, b).as_ref()))
            .collect();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut dirs = std::collections::BTreeSet::new();
            for file in &files {
                std::fs::File::open(file)?.sync_data()?;
                if let Some(dir) = file.parent() {
                    dirs.insert(dir.to_path_buf());
                }
            }
            for dir in dirs {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| DataError::Unavailable(e.to_string()))?
        .map_err(|e| match e.kind() {
            // Deleted meanwhile (its file went): nothing left to make durable.
            std::io::ErrorKind::NotFound => DataError::Missing(format!("slice {id}: {e}")),
            _ => DataError::Unavailable(format!("syncing slice {id}: {e}")),
        })
    }

    /// Deletes every block of slice `id` (`size` bytes); blocks already gone are no error.
    pub async fn delete(&self, id: u64, size: u32) -> Result<(), DataError> {
        // A slice is at least one block (an empty object still has a header).
        let count = blocks(size).count().max(1) as u32;
        for b in 0..count {
            self.delete_block(id, b).await?;
        }
        Ok(())
    }

    /// Deletes one block object (gone already is no error).
    pub async fn delete_block(&self, id: u64, block: u32) -> Result<(), DataError> {
        self.check_owner().await?;
        let started = Instant::now();
        let deleted = match self.store.delete(&self.path(id, block)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.meter
            .request(Kind::Delete, started, 0, deleted.is_ok());
        deleted
    }

    /// Writes of a local store that died before their rename (staging files), which no
    /// listing shows; none for a remote store (a put there is whole or absent).
    pub async fn unfinished(&self) -> Result<Vec<crate::local::Unfinished>, DataError> {
        let Some(root) = &self.local else {
            return Ok(Vec::new());
        };
        let chunks = root.join(self.prefix.as_ref());
        tokio::task::spawn_blocking(move || {
            crate::local::unfinished(&chunks).map_err(|e| local_error(&chunks, e))
        })
        .await
        .map_err(|e| DataError::Unavailable(e.to_string()))?
    }

    /// Removes an unfinished write (gone already is no error).
    pub async fn delete_unfinished(
        &self,
        unfinished: &crate::local::Unfinished,
    ) -> Result<(), DataError> {
        self.check_owner().await?;
        match std::fs::remove_file(&unfinished.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(local_error(&unfinished.path, e)),
        }
    }

    /// Every object in the store, as `(id, block, length, modified)`.
    pub async fn list(&self) -> Result<Vec<Listed>, DataError> {
        let started = Instant::now();
        let listed = self.list_unmetered().await;
        self.meter.request(Kind::List, started, 0, listed.is_ok());
        listed
    }

    async fn list_unmetered(&self) -> Result<Vec<Listed>, DataError> {
        let mut stream = self.store.list(Some(&self.prefix));
        let mut out = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = meta?;
            if let Some((id, block)) = Self::parse_name(&meta.location) {
                out.push(Listed {
                    id,
                    block,
                    len: meta.size,
                    modified_ms: meta.last_modified.timestamp_millis(),
                });
            }
        }
        out.sort_unstable_by_key(|l| (l.id, l.block));
        Ok(out)
    }

    /// Copies every block of slice `id` (`size` bytes) into `to` as it is here, durable when
    /// this returns. One block in memory at a time.
    pub async fn copy_slice(&self, to: &Objects, id: u64, size: u32) -> Result<(), DataError> {
        for (b, _) in blocks(size) {
            let got = self.store.get(&self.path(id, b)).await?.bytes().await?;
            match &to.local {
                Some(root) => {
                    let path = to.local_path(root, id, b);
                    tokio::task::spawn_blocking(move || {
                        crate::local::put(&path, &[&got]).map_err(|e| local_error(&path, e))
                    })
                    .await
                    .map_err(|e| DataError::Unavailable(e.to_string()))??;
                }
                None => {
                    to.store.put(&to.path(id, b), PutPayload::from(got)).await?;
                }
            }
        }
        to.sync(id, size).await
    }

    /// The expected object length of block `block` of a slice of `size` bytes.
    pub fn block_object_len(size: u32, block: u32) -> Option<u64> {
        blocks(size)
            .find(|(b, _)| *b == block)
            .map(|(_, len)| block::header_len(len) + u64::from(len))
    }
}

fn header_cache() -> Arc<std::sync::Mutex<BlockCache>> {
    Arc::new(std::sync::Mutex::new(BlockCache {
        bytes_max: crate::memory::HEADER_CACHE_BYTES,
        entry_bytes: crate::memory::HEADER_ENTRY_BYTES,
        ..BlockCache::default()
    }))
}

/// `ranges` of the local object of block `b` of slice `id`: a missing object is
/// [`DataError::Missing`], one shorter than the ranges [`DataError::Corrupt`].
fn read_local(
    file: &std::path::Path,
    id: u64,
    b: u32,
    block_len: u32,
    ranges: &[std::ops::Range<u64>],
) -> Result<Vec<Bytes>, DataError> {
    match crate::local::read_ranges(file, ranges) {
        Ok(fetched) => Ok(fetched),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            let expected = block::header_len(block_len) + u64::from(block_len);
            Err(DataError::Corrupt(format!(
                "block {b} of slice {id} is {} bytes long, not {expected}",
                crate::local::len(file).unwrap_or(0)
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(DataError::Missing(format!("block {b} of slice {id}")))
        }
        Err(e) => Err(local_error(file, e)),
    }
}

/// A remote store's error for block `b` of slice `id`: a missing object is
/// [`DataError::Missing`].
fn remote_error(error: object_store::Error, id: u64, b: u32) -> DataError {
    match error {
        object_store::Error::NotFound { .. } => {
            DataError::Missing(format!("block {b} of slice {id}"))
        }
        other => other.into(),
    }
}

/// The two ranges asked for (a block's header, then its data): a store that answered with
/// another number of ranges is an error, not a panic.
fn two_ranges(fetched: Vec<Bytes>, id: u64, b: u32) -> Result<(Bytes, Bytes), DataError> {
    let count = fetched.len();
    match <[Bytes; 2]>::try_from(fetched) {
        Ok([header, data]) => Ok((header, data)),
        Err(_) => Err(DataError::Unavailable(format!(
            "block {b} of slice {id}: the object store answered {count} ranges for 2"
        ))),
    }
}

/// The header and the checked data bytes `[from, to)` of block `b` of slice `id`.
fn check_block(
    id: u64,
    b: u32,
    block_len: u32,
    header: Bytes,
    data: Bytes,
    from: u32,
    to: u32,
) -> Result<(Bytes, Bytes), DataError> {
    let data = block::verify(block_len, &header, data, from, to).map_err(|e| match e {
        DataError::Corrupt(why) => DataError::Corrupt(format!("block {b} of slice {id}: {why}")),
        other => other,
    })?;
    Ok((header, data))
}

/// A local store's file error, full disk told apart.
fn local_error(path: &std::path::Path, error: std::io::Error) -> DataError {
    let text = format!("{}: {error}", path.display());
    match error.raw_os_error() {
        Some(28) | Some(122) => DataError::NoSpace(text),
        _ => DataError::Unavailable(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocks_round_trip_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::open(&ObjectsUrl::file(dir.path())).unwrap();
        let size = (BLOCK_BYTES + 70_000) as u32;
        let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        objects
            .put_block(7, 0, Bytes::copy_from_slice(&data[..BLOCK_BYTES as usize]))
            .await
            .unwrap();
        objects
            .put_block(7, 1, Bytes::copy_from_slice(&data[BLOCK_BYTES as usize..]))
            .await
            .unwrap();
        let off = BLOCK_BYTES as u32 - 100;
        let got = objects.read(7, size, off, 300).await.unwrap();
        assert_eq!(&got[..], &data[off as usize..off as usize + 300]);
        objects.sync(7, size).await.unwrap();
        let listed = objects.list().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[1].len,
            Objects::block_object_len(size, 1).unwrap(),
            "listed lengths are object lengths"
        );

        // Truncate the second block on disk: detected, not returned.
        let file = dir.path().join("chunks/07/0000000000000007-0001");
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.set_len(1000).unwrap();
        let err = objects.read(7, size, off, 300).await.unwrap_err();
        assert!(matches!(err, DataError::Corrupt(_)), "{err:?}");
        assert_eq!(err.errno(), 5);

        objects.delete(7, size).await.unwrap();
        objects.delete(7, size).await.unwrap();
        assert!(matches!(
            objects.read(7, size, 0, 10).await.unwrap_err(),
            DataError::Missing(_)
        ));
        assert!(objects.list().await.unwrap().is_empty());
    }
}
