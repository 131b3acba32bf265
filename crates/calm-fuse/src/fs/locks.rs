//! fcntl (POSIX, OFD) and flock requests, forwarded to the server's lock manager through
//! [`crate::locks::LockForwarder`].

use super::*;
use calm_types::sync::Locked;

/// Longest a lock grant waits for the mount's change stream to pass it before dropping the
/// file's caches (see [`crate::cache::Coherence::wait_passed`]): about what fetching them again
/// would cost.
pub const GRANT_STREAM_WAIT: Duration = Duration::from_millis(2);

impl CalmFs {
    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        reply: ReplyLock,
    ) {
        let (kind, range) = match (lock_kind(typ), lock_range(start, end)) {
            (Ok(Some(kind)), Ok(range)) => (kind, range),
            (Ok(None), _) | (Err(_), _) | (_, Err(_)) => return reply.error(Errno::EINVAL),
        };
        let shared = self.shared.clone();
        self.spawn(req, reply.interrupter(), async move {
            shared.after_releases(ino.0).await;
            match shared.locks.test(ino.0, lock_owner.0, range, kind).await {
                Ok(Some(conflict)) => {
                    let typ = match conflict.kind {
                        LockKind::Read => libc::F_RDLCK,
                        LockKind::Write => libc::F_WRLCK,
                    };
                    reply.locked(conflict.range.start, conflict.range.end, typ, conflict.pid)
                }
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let kind = match lock_kind(typ) {
            Ok(kind) => kind,
            Err(e) => return reply.error(e),
        };
        let scope = if flock {
            Scope::WholeFile
        } else {
            match lock_range(start, end) {
                Ok(range) => Scope::Range(range),
                Err(e) => return reply.error(e),
            }
        };
        let file = match self.shared.file(fh) {
            Ok(file) => file,
            Err(e) => return reply.error(e),
        };
        if self.shared.lock_lost(ino.0, fh.0) {
            // Its holder learns that it lost a lock on the file, and takes no new one through
            // it (docs/design/locks.md, "A lost lock").
            return reply.error(Errno::EIO);
        }
        let owner = lock_owner.0;
        if kind.is_some() && sleep {
            // Before the next request is read (this one is dispatched in the kernel's order):
            // an interrupt naming it finds it.
            self.shared.locks.expect_wait(req.unique().0);
        }
        if kind.is_some() {
            file.owners.locked().insert(owner);
            if !flock && let Some(inode) = self.shared.state().inodes.get_mut(&ino.0) {
                inode.lock_owners.insert(owner);
            }
        }
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let wait = sleep.then_some(req.unique().0);
        let unique = req.unique().0;
        let uid = req.uid();
        self.empty_task(req, reply, async move {
            shared.after_releases(ino.0).await;
            let locks = &shared.locks;
            match kind {
                Some(kind) => {
                    if let Scope::Range(range) = scope
                        && shared.shm.used_elsewhere(locks, ino.0, range).await
                    {
                        return Err(Errno::EBUSY);
                    }
                    locks
                        .set(ino.0, owner, pid, uid, scope, kind, wait)
                        .await
                        .map_err(Errno::from_i32)?;
                    if shared.waiting.answered_early(unique) {
                        // Its caller was killed and told EINTR meanwhile: the lock goes back.
                        if let Err(errno) = locks.unlock(ino.0, owner, scope).await {
                            tracing::warn!(errno, "giving back a lock its killed caller got");
                        }
                        return Ok(());
                    }
                    // The previous holder may have written through another mount: what this
                    // mount and its kernel hold of the file may be stale (as NFS does on a
                    // lock). Once the change stream has passed the index the grant answered
                    // with (what the holder committed is below it), every change another
                    // client made has dropped them already; the stream is given a moment to
                    // get there, and when it does not, they are dropped here.
                    let passed = shared
                        .cache
                        .wait_passed(shared.client.reached(), GRANT_STREAM_WAIT)
                        .await;
                    if !passed {
                        shared.contents.invalidate(ino.0).await;
                        shared.drop_kernel_cache(ino.0).await;
                    }
                    Ok(())
                }
                None => {
                    // What the holder wrote reaches the server before anyone else may lock.
                    shared.push(&client, ino.0, Some(fh.0)).await?;
                    shared.send_kept(ino.0).await?;
                    locks
                        .unlock(ino.0, owner, scope)
                        .await
                        .map_err(Errno::from_i32)
                }
            }
        });
    }
}
