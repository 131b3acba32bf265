//! Mounting and unmounting: the lock session, the FUSE session on its own thread, and an
//! orderly end (unmount, then the lock session closed so that the server releases the mount's
//! locks at once instead of at lease expiry).
//!
//! When another mount namespace still holds a copy of the mount, unmounting it here leaves the
//! kernel's FUSE connection alive and the session's threads in their reads of /dev/fuse: the
//! end then aborts the connection (`/sys/fs/fuse/connections/N/abort`, mounting fusectl there
//! if needed) after [`ABORT_AFTER`], so that SIGTERM always ends the process. The other
//! namespace's copy then answers ENOTCONN.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use calm_client::Client;
use tokio::sync::oneshot;

use crate::fs::{CalmFs, MountOptions, mount_config};
use crate::locks::LockForwarder;

/// How long an unmount waits for the FUSE session to end before it aborts the connection.
pub const ABORT_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the kernel lists its FUSE connections (the fusectl file system).
const FUSE_CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// A live mount.
#[derive(Debug)]
pub struct Mounted {
    unmounter: fuser::SessionUnmounter,
    /// The kernel's number of the FUSE connection (its directory under [`FUSE_CONNECTIONS`]),
    /// when it was found in the mount table.
    connection: Option<u64>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    ended: Option<oneshot::Receiver<()>>,
    locks: Arc<LockForwarder>,
    keep_alive: tokio::task::JoinHandle<()>,
    cache: Arc<crate::cache::Coherence>,
    /// The task following the server's changes for the cache.
    follower: Option<tokio::task::JoinHandle<()>>,
}

/// Mounts calm at `mountpoint` over `client`, answering requests on `runtime`. Returns once
/// the kernel has sent FUSE_INIT: the mount is usable.
pub async fn mount(
    client: Client,
    mountpoint: &Path,
    options: &MountOptions,
    runtime: tokio::runtime::Handle,
) -> std::io::Result<Mounted> {
    let locks = LockForwarder::open(client.clone(), options.lease_ms)
        .await
        .map_err(|e| std::io::Error::other(format!("opening the lock session: {e}")))?;
    let keep_alive = runtime.spawn(locks.clone().keep_alive());
    let objects = match open_objects(&client, options).await {
        Ok(objects) => objects,
        Err(e) => {
            keep_alive.abort();
            locks.close().await;
            return Err(e);
        }
    };
    let fs = CalmFs::new(client.clone(), locks.clone(), objects, options, runtime)?;
    let shared = fs.shared();
    let mountpoint = mountpoint.to_path_buf();
    // Resolved before mounting: afterwards a stat of the mount point is a FUSE request, and
    // nobody answers them yet.
    let table_mountpoint = mountpoint_of(&mountpoint);
    let config = mount_config(options);
    let session =
        tokio::task::spawn_blocking(move || fuser::Session::new(fs, &mountpoint, &config))
            .await
            .map_err(std::io::Error::other)?;
    let mut session = match session {
        Ok(session) => session,
        Err(e) => {
            keep_alive.abort();
            locks.close().await;
            return Err(e);
        }
    };
    session.set_reply_observer(shared.metrics.clone());
    // The changes are followed from before the kernel's first request: nothing it caches can
    // miss its invalidation. Without epochs (Linux < 6.16) the cache could not be dropped as
    // a whole after the mount fell behind, so it is not made long-lived at all.
    let cache = shared.cache.clone();
    let follower = match cache.start(session.notifier()) {
        true => {
            let locks = locks.clone();
            let files = Arc::downgrade(&shared);
            crate::cache::follow(
                cache.clone(),
                client,
                move || locks.session(),
                move |handle| {
                    if let Some(shared) = files.upgrade() {
                        shared.contents.changed_elsewhere(handle);
                    }
                },
            )
            .await
        }
        false => None,
    };
    let unmounter = session.unmount_callable();
    let connection = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|table| connection_of(&table, &table_mountpoint));
    let (done, ended) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("calm-fuse".into())
        .spawn(move || {
            let result = session.run();
            let _ = done.send(());
            result
        })?;
    Ok(Mounted {
        unmounter,
        connection,
        thread: Some(thread),
        ended: Some(ended),
        locks,
        keep_alive,
        cache,
        follower,
    })
}

/// The namespace's object store (the namespace says where its file contents live: every
/// mount uses the same store), with the disk cache `options` ask for when it is remote.
async fn open_objects(
    client: &Client,
    options: &MountOptions,
) -> std::io::Result<calm_data::Objects> {
    let info = client.data_info().await.map_err(|e| {
        std::io::Error::other(format!("asking the server for its object store: {e}"))
    })?;
    let url = &info.objects_url;
    let objects = calm_data::Objects::open(url)
        .map_err(|e| std::io::Error::other(format!("opening the object store {url}: {e}")))?;
    let Some(dir) = options
        .cache_dir
        .as_ref()
        .filter(|_| options.cache_bytes > 0)
    else {
        return Ok(objects);
    };
    if objects.is_local() {
        return Ok(objects);
    }
    let (namespace, bytes) = (info.namespace_id.clone(), options.cache_bytes);
    let under = dir.clone();
    let opened = tokio::task::spawn_blocking(move || {
        calm_data::DiskCache::open(&under, &namespace, bytes)
            .map_err(|e| std::io::Error::other(format!("opening the block cache: {e}")))
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(match opened {
        Some(cache) => {
            tracing::info!(
                dir = %cache.dir().display(),
                bytes = cache.bytes(),
                bytes_max = options.cache_bytes,
                "block cache"
            );
            objects.with_disk_cache(cache)
        }
        None => {
            tracing::warn!(
                "every block cache slot under {} is held by another mount: no disk cache",
                dir.display()
            );
            objects
        }
    })
}

impl Mounted {
    /// What the mount's cache coherence has done so far.
    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.cache.stats()
    }

    /// Completes when the mount goes away from outside (`fusermount3 -u`, `umount`).
    pub async fn ended(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
    }

    /// Unmounts (if still mounted), waits for the FUSE thread (aborting the connection when
    /// another namespace keeps it alive), and closes the lock session.
    pub async fn unmount(mut self) -> std::io::Result<()> {
        let unmounted = self.unmounter.unmount();
        let thread = self.thread.take();
        let connection = self.connection;
        let joined = tokio::task::spawn_blocking(move || match thread {
            Some(thread) => {
                let waited = std::time::Instant::now();
                while !thread.is_finished() && waited.elapsed() < ABORT_AFTER {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                if !thread.is_finished() {
                    abort(connection);
                }
                thread
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the FUSE thread panicked")))
            }
            None => Ok(()),
        })
        .await
        .map_err(std::io::Error::other)?;
        self.keep_alive.abort();
        self.cache.stop();
        if let Some(follower) = self.follower.take() {
            follower.abort();
        }
        self.locks.close().await;
        unmounted.and(joined)
    }
}

/// The mount point as the mount table names it (absolute, symlinks resolved).
fn mountpoint_of(path: &Path) -> std::path::PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The FUSE connection number of calm's mount at `mountpoint` in a `/proc/self/mountinfo`
/// text: its device number (`MAJOR:MINOR`, as the kernel encodes it: `MAJOR << 20 | MINOR`);
/// the last such mount when several are stacked there.
fn connection_of(mountinfo: &str, mountpoint: &Path) -> Option<u64> {
    let wanted = mountpoint.to_str()?;
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let separator = fields.iter().position(|f| *f == "-")?;
        let fstype = fields.get(separator + 1)?;
        let point = fields.get(4)?.replace("\\040", " ");
        if point != wanted || !fstype.starts_with("fuse") {
            return None;
        }
        let (major, minor) = fields.get(2)?.split_once(':')?;
        Some((major.parse::<u64>().ok()? << 20) | minor.parse::<u64>().ok()?)
    })
}

/// Aborts FUSE connection `connection`: the kernel fails its requests and ends the reads of
/// /dev/fuse, so the session's threads return. Mounts fusectl at [`FUSE_CONNECTIONS`] when it
/// is not there (root only; in the caller's mount namespace).
fn abort(connection: Option<u64>) {
    let Some(connection) = connection else {
        tracing::error!("the FUSE session did not end and its connection is unknown");
        return;
    };
    let dir = Path::new(FUSE_CONNECTIONS).join(connection.to_string());
    if !dir.exists() {
        let mounted = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", FUSE_CONNECTIONS])
            .output();
        if let Err(error) = mounted {
            tracing::warn!(%error, "mounting fusectl");
        }
    }
    match std::fs::write(dir.join("abort"), "1") {
        Ok(()) => tracing::warn!(
            connection,
            "the FUSE connection outlived the unmount (another mount namespace holds it): \
             aborted"
        ),
        Err(error) => tracing::error!(connection, %error, "aborting the FUSE connection"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_is_the_device_number_of_the_last_fuse_mount_there() {
        let table = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:45 / /tmp/m rw,nosuid,nodev shared:20 - fuse.calm calm rw,user_id=0
41 40 0:52 / /tmp/m rw,nosuid,nodev shared:21 - fuse.calm calm rw,user_id=0
42 22 0:53 / /tmp/other rw - fuse.calm calm rw
43 22 259:3 / /tmp/disk rw - ext4 /dev/nvme0n1 rw
";
        assert_eq!(connection_of(table, Path::new("/tmp/m")), Some(52));
        assert_eq!(connection_of(table, Path::new("/tmp/other")), Some(53));
        assert_eq!(connection_of(table, Path::new("/tmp/disk")), None);
        assert_eq!(connection_of(table, Path::new("/nowhere")), None);
        assert_eq!(
            connection_of("42 22 1:2 / /tmp/x rw - fuse x rw", Path::new("/tmp/x")),
            Some((1 << 20) | 2)
        );
    }
}
