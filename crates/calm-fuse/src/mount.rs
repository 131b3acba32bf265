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
    // The namespace says where its file contents live: every mount uses the same store.
    let url = match client.objects_url().await {
        Ok(url) => url,
        Err(e) => {
            keep_alive.abort();
            locks.close().await;
            return Err(std::io::Error::other(format!(
                "asking the server for its object store: {e}"
            )));
        }
    };
    let objects = match calm_data::Objects::open(&url) {
        Ok(objects) => objects,
        Err(e) => {
            keep_alive.abort();
            locks.close().await;
            return Err(std::io::Error::other(format!(
                "opening the object store {url}: {e}"
            )));
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
