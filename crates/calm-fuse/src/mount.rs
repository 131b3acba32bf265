//! Mounting and unmounting: the lock session, the FUSE session on its own thread, and an
//! orderly end (unmount, then the lock session closed so that the server releases the mount's
//! locks at once instead of at lease expiry).

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use calm_client::Client;
use tokio::sync::oneshot;

use crate::fs::{CalmFs, MountOptions, mount_config};
use crate::locks::LockForwarder;

/// A live mount.
#[derive(Debug)]
pub struct Mounted {
    unmounter: fuser::SessionUnmounter,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    ended: Option<oneshot::Receiver<()>>,
    locks: Arc<LockForwarder>,
    keep_alive: tokio::task::JoinHandle<()>,
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
    let fs = CalmFs::new(client, locks.clone(), objects, options, runtime)?;
    let shared = fs.shared();
    let mountpoint = mountpoint.to_path_buf();
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
    let _ = shared.notifier.set(session.notifier());
    let unmounter = session.unmount_callable();
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
        thread: Some(thread),
        ended: Some(ended),
        locks,
        keep_alive,
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
    let (dir, namespace, bytes) = (dir.clone(), info.namespace_id.clone(), options.cache_bytes);
    let opened = tokio::task::spawn_blocking(move || {
        calm_data::DiskCache::open(&dir, &namespace, bytes)
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
                options.cache_dir.as_ref().expect("checked").display()
            );
            objects
        }
    })
}

impl Mounted {
    /// Completes when the mount goes away from outside (`fusermount3 -u`, `umount`).
    pub async fn ended(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
    }

    /// Unmounts (if still mounted), waits for the FUSE thread, and closes the lock session.
    pub async fn unmount(mut self) -> std::io::Result<()> {
        let unmounted = self.unmounter.unmount();
        let thread = self.thread.take();
        let joined = tokio::task::spawn_blocking(move || match thread {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the FUSE thread panicked"))),
            None => Ok(()),
        })
        .await
        .map_err(std::io::Error::other)?;
        self.keep_alive.abort();
        self.locks.close().await;
        unmounted.and(joined)
    }
}
