//! File contents: open, read, write, flush, release, fsync and fallocate (through
//! [`crate::contents::Contents`]; see the module above for when writes reach the server).

use super::*;
use calm_types::sync::Locked;

/// How the kernel handles an open file's writes: one opened with O_APPEND bypasses the page
/// cache (direct I/O), so that each write(2), up to [`WRITE_BYTES_MAX`], reaches the mount as
/// one request and lands whole at the file's end. Through the page cache the kernel cuts a
/// write at every page it has not read (a record crossing a page would become two appends,
/// and another mount's append could land between them).
pub(super) fn append_direct(shared: &Shared, open_flags: i32) -> FopenFlags {
    if open_flags & libc::O_APPEND != 0 && !shared.append_through_cache {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

/// The contents side of an open of `handle` with `flags`: its attributes, and whether the
/// kernel keeps its pages. A read-only open is answered from this mount's copy when it has one
/// (no request to the server), else asks for a copy with the map; an open for writing (or
/// while one is open here) ends the copy and reads the map.
async fn open_contents(
    shared: &Shared,
    client: &Client,
    handle: calm_types::Handle,
    flags: i32,
) -> Result<(Attr, bool), MetaError> {
    let reads_only = flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0;
    if !reads_only {
        shared.drop_copy(handle);
    }
    let copies = shared.keep_copies
        && reads_only
        && shared.cache.notifier().is_some()
        && !shared.has_writers(handle);
    if copies
        && shared.copies.has(handle)
        && let Some(attr) = shared.contents.open_kept(handle).await
    {
        shared.copies.answered();
        return Ok((attr, true));
    }
    let seen = shared.copies.seen(handle);
    let (attr, keep, granted) = shared.contents.open(client, handle, copies).await?;
    if granted && !shared.copies.keep(handle, seen) {
        shared.return_copy_soon(handle);
    }
    Ok((attr, keep))
}

impl CalmFs {
    pub(super) fn handle_open(
        &self,
        req: &Request,
        ino: INodeNo,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
        let open_flags = flags.0;
        let shared = self.shared.clone();
        let client = shared.caller(req);
        self.spawn(req, reply.interrupter(), async move {
            if shared.shm.used_elsewhere(&shared.locks, ino.0, WHOLE).await {
                return reply.error(Errno::EBUSY);
            }
            // The server decides the open by the file's mode and owner: those kept here first.
            if let Err(e) = shared.send_kept(ino.0).await {
                return reply.error(e);
            }
            // A regular file's map comes with its attributes, on one snapshot: what this open
            // reads is the file as committed now (close-to-open), or the mount's copy of it,
            // which the server asks back before it answers any other client's change.
            let (attr, keep) = match open_contents(&shared, &client, ino.0, open_flags).await {
                Ok(opened) => opened,
                Err(MetaError::IsDir | MetaError::Invalid(_)) => {
                    match client.getattr(ino.0).await {
                        Ok(attr) => (attr, false),
                        Err(e) => return reply.error(node_errno(&e)),
                    }
                }
                Err(e) => return reply.error(node_errno(&e)),
            };
            if attr.kind == Kind::File && !keep {
                // Another writer changed it since this mount last saw it: the kernel's pages
                // and size are stale.
                shared.drop_kernel_cache(attr.handle).await;
            }
            let mut flags = append_direct(&shared, open_flags);
            if keep {
                flags |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            match shared.open_file(&attr, open_flags, &client) {
                Ok(fh) => reply.opened(FileHandle(fh), flags),
                Err(e) => reply.error(e),
            }
        });
    }

    pub(super) fn handle_read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) {
        let file = match self.shared.file(fh) {
            Ok(file) => file,
            Err(e) => return reply.error(e),
        };
        if !file.is_file {
            return reply.error(Errno::EISDIR);
        }
        if self.shared.lock_lost(ino.0, fh.0) {
            return reply.error(Errno::EIO);
        }
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let data = async move { shared.contents.read(&client, ino.0, offset, size).await };
        self.answer(req, reply, data, |reply, data| reply.data(&data));
    }

    /// The kernel asks that a write drop the file's setuid and setgid (its writer lacks the
    /// superuser's privilege): the mode stat answers drops them at once, while the server
    /// drops them when the write is committed. (An append is committed at once, and answered
    /// with the server's mode.)
    pub(super) fn drop_privileges(&self, req: &Request, ino: INodeNo, fh: FileHandle) {
        if let Ok(file) = self.shared.file(fh)
            && file.is_file
            && !file.append
        {
            self.shared.drop_privileges(req, ino.0);
        }
    }

    pub(super) fn handle_write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        let file = match self.shared.file(fh) {
            Ok(file) => file,
            Err(e) => return reply.error(e),
        };
        if !file.is_file {
            return reply.error(Errno::EISDIR);
        }
        if offset.saturating_add(data.len() as u64) > calm_types::FILE_SIZE_MAX {
            return reply.error(Errno::EFBIG);
        }
        if self.shared.lock_lost(ino.0, fh.0) {
            return reply.error(Errno::EIO);
        }
        // A refused commit dropped bytes written through this open file: told now, once.
        if let Some(owed) = self.shared.contents.take_error(fh.0) {
            return reply.error(Errno::from_i32(owed));
        }
        // A write after changes kept of a file held goes after them (its mtime is later).
        let after_kept = self.shared.holding.has_kept(ino.0);
        if !file.append && !after_kept {
            // Most writes are buffered here at once, without a copy of their own.
            let _runtime = self.runtime.enter();
            if self
                .shared
                .contents
                .try_write_now(ino.0, offset, data, fh.0)
            {
                return reply.written(data.len() as u32);
            }
        }
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let data = data.to_vec();
        let size = data.len() as u32;
        let written = async move {
            if after_kept {
                // The writes pending came before the changes kept.
                shared
                    .push(&client, ino.0, Some(fh.0))
                    .await
                    .map_err(i32::from)?;
                shared.send_kept(ino.0).await.map_err(i32::from)?;
            }
            if file.append {
                shared.contents.append(&client, ino.0, &data, fh.0).await
            } else {
                shared
                    .contents
                    .write(&client, ino.0, offset, &data, fh.0)
                    .await
            }
        };
        self.answer(req, reply, written, move |reply, ()| reply.written(size));
    }

    pub(super) fn handle_flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        self.empty_task(req, reply, async move {
            shared.file(fh)?;
            // A file held is given back at its close, with the changes kept of it.
            shared
                .push_and_give_back(&client, ino.0, Some(fh.0))
                .await?;
            // A close releases the closing process's POSIX locks on the file.
            let held = shared
                .state()
                .inodes
                .get_mut(&ino.0)
                .is_some_and(|inode| inode.lock_owners.remove(&lock_owner.0));
            if held {
                let everything = Scope::Range(Range {
                    start: 0,
                    end: calm_locks::OFFSET_MAX,
                });
                shared
                    .locks
                    .unlock(ino.0, lock_owner.0, everything)
                    .await
                    .map_err(Errno::from_i32)?;
            }
            Ok(())
        });
        // The flushes of a killed process's exit come with no interrupt.
        crate::interrupts::watch_flush(&self.shared.waiting, &self.runtime, req.unique().0);
    }

    pub(super) fn handle_release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        // Taken here, in the kernel's order, so that a lock request read after this release
        // waits for it (see `State::releasing`).
        let (file, owners) = {
            let mut state = shared.state();
            let Some(file) = state.files.remove(&fh.0) else {
                return reply.error(Errno::EBADF);
            };
            let locked_through: Vec<u64> = file.owners.locked().drain().collect();
            // A lost lock is told until the file it was taken through is closed.
            if let Some(lost) = state.lost.get_mut(&ino.0) {
                lost.retain(|owner| !locked_through.contains(owner));
                if lost.is_empty() {
                    state.lost.remove(&ino.0);
                }
            }
            let owners = state.owners_ending_with(ino.0, &file, locked_through);
            if !owners.is_empty() {
                *state.releasing.entry(ino.0).or_default() += 1;
            }
            (file, owners)
        };
        self.empty_task(req, reply, async move {
            let pushed = shared.push_and_give_back(&client, ino.0, Some(fh.0)).await;
            // OFD and flock locks belong to the open file: they end with it.
            let released = if owners.is_empty() {
                Ok(())
            } else {
                let released = shared
                    .locks
                    .release(ino.0, &owners)
                    .await
                    .map_err(Errno::from_i32);
                let mut state = shared.state();
                if let Some(count) = state.releasing.get_mut(&ino.0) {
                    *count -= 1;
                    if *count == 0 {
                        state.releasing.remove(&ino.0);
                    }
                }
                drop(state);
                shared.released.notify_waiters();
                released
            };
            let orphan_closed = {
                let mut state = shared.state();
                let inode = state.inodes.entry(ino.0).or_default();
                inode.files.retain(|f| !Arc::ptr_eq(f, &file));
                if inode.files.is_empty() {
                    state.inodes.remove(&ino.0);
                    state.orphans.remove(&ino.0)
                } else {
                    false
                }
            };
            if file.writable {
                // What it wrote may have bypassed the kernel's pages (O_APPEND, O_DIRECT).
                shared.drop_copy(ino.0);
            }
            if file.is_file {
                for forgotten in shared.contents.released(ino.0, fh.0).await {
                    shared.drop_copy(forgotten);
                }
            }
            if orphan_closed {
                shared.release_orphan(&client, ino.0).await;
            }
            pushed.and(released)
        });
    }

    pub(super) fn handle_fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        self.empty_task(req, reply, async move {
            shared.file(fh)?;
            // The objects are made durable before the records that name them are committed;
            // then every change the server answered, this file's and the others' before it
            // (a server may answer a change before it is on its disk).
            shared.push_as(&client, ino.0, Some(fh.0), true).await?;
            shared.send_kept(ino.0).await?;
            shared.sync_all(&client).await
        });
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        self.empty_task(req, reply, async move {
            let file = shared.file(fh)?;
            if !file.is_file {
                return Err(Errno::ENODEV);
            }
            let end = offset
                .checked_add(length)
                .filter(|e| *e <= calm_types::FILE_SIZE_MAX)
                .ok_or(Errno::EFBIG)?;
            if length == 0 {
                return Err(Errno::EINVAL);
            }
            shared.push(&client, ino.0, Some(fh.0)).await?;
            shared.send_kept(ino.0).await?;
            let attr = match mode {
                // Space is not reserved ahead in an object store; the size grows.
                0 => client.write(ino.0, &[], end, Vec::new()).await,
                libc::FALLOC_FL_KEEP_SIZE => return Ok(()),
                m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                    let size = client.getattr(ino.0).await.map_err(|e| errno(&e))?.size;
                    let holes: Vec<_> =
                        calm_types::slices::split(offset, end.min(size).saturating_sub(offset))
                            .into_iter()
                            .map(|(chunk, pos, len)| {
                                (chunk, calm_types::slices::Slice::hole(pos, len))
                            })
                            .collect();
                    client.write(ino.0, &holes, 0, Vec::new()).await
                }
                _ => return Err(Errno::EOPNOTSUPP),
            }
            .map_err(|e| errno(&e))?;
            shared.contents.changed(&attr).await;
            shared.drop_kernel_cache(ino.0).await;
            Ok(())
        });
    }
}
