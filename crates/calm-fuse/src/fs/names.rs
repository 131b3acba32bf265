//! Names: lookup, the making of nodes, links, unlink, rmdir, rename and readdir (an unlink or
//! rename names the files this mount has open, so that the server keeps the one that loses its
//! last name).

use super::*;
use crate::listings::Outcome;

impl CalmFs {
    pub(super) fn handle_lookup(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEntry,
    ) {
        // A name no directory can hold is too long before it is absent (as the server says).
        if name.len() > calm_types::NAME_LEN_MAX {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let ticket = self.shared.cache.ticket();
        // A name not in a directory whose every name this mount knows: no question to ask.
        if let Some(ttl) = self
            .shared
            .cache
            .known_absent(ticket, parent.0, name.as_bytes())
        {
            return reply.entry(&ttl, &plain_attr(0, Kind::File), Generation(0));
        }
        let client = self.shared.caller(req);
        let name = name.as_bytes().to_vec();
        let shared = self.shared.clone();
        let task = async move {
            match client.lookup(parent.0, &name).await {
                Ok(attr) => {
                    if attr.kind == Kind::File {
                        shared.shm.named(attr.handle, &name);
                    }
                    Ok(Some(attr))
                }
                Err(e) if e.errno() == libc::ENOENT => Ok(None),
                Err(e) => Err(errno(&e)),
            }
        };
        let shared = self.shared.clone();
        self.answer(req, reply, task, move |reply, found| match found {
            Some(attr) => super::send_entry(&shared, ticket, reply, attr),
            // The name's absence, kept by the kernel as long as nothing names it (a create
            // elsewhere invalidates it, as a removal does a name).
            None => match shared.cache.absence_ttl(ticket, parent.0) {
                ttl if ttl.is_zero() => reply.error(Errno::ENOENT),
                ttl => reply.entry(&ttl, &plain_attr(0, Kind::File), Generation(0)),
            },
        });
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = Kind::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let node = NewNode::node(kind, mode & 0o7777, req.uid(), req.gid(), u64::from(rdev))
            .with_umask(umask);
        self.make_entry(req, parent, name, node, reply);
    }

    pub(super) fn handle_mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let node = NewNode::dir(mode & 0o7777, req.uid(), req.gid()).with_umask(umask);
        self.make_entry(req, parent, name, node, reply);
    }

    pub(super) fn handle_symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let node = NewNode::symlink(target.as_os_str().as_bytes(), req.uid(), req.gid());
        self.make_entry(req, parent, link_name, node, reply);
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let node = NewNode::file(mode & 0o7777, req.uid(), req.gid()).with_umask(umask);
        let name = name.as_bytes().to_vec();
        let exclusive = flags & libc::O_EXCL != 0;
        // A file made with O_EXCL is new: nobody else knows it, so this mount may hold it.
        let hold = exclusive && shared.hold_files && shared.holding.may_ask();
        let maker = crate::holding::Asker {
            uid: req.uid(),
            gid: req.gid(),
        };
        shared.cache.changed_here(parent.0);
        let ticket = shared.cache.ticket();
        self.spawn(req, reply.interrupter(), async move {
            // In a directory this mount holds, answered here (and held: the mount knows the
            // name was not there, so the file is new with or without O_EXCL); else by the
            // server, the directory given back first (its names change elsewhere than here).
            shared.room_to_answer(&client, parent.0).await;
            let here = shared.make_here(&client, parent.0, &name, &node);
            let made = match here {
                Some((attr, dir)) => Ok((attr, Some(dir), calm_client::Held::default())),
                None => {
                    let busy = shared.through_server(parent.0).await;
                    let made = client
                        .make_held(parent.0, &name, &node, exclusive, hold)
                        .await;
                    drop(busy);
                    if made.is_ok() {
                        shared.ask_to_hold(&client, parent.0);
                    }
                    made
                }
            };
            shared
                .cache
                .name_added_here(parent.0, &name, Outcome::of_make(&made));
            let attr = match made {
                Ok((attr, dir, held)) => {
                    if let Some(dir) = dir {
                        shared.cache.dir_changed(ticket, dir);
                    }
                    if held.bits != 0 {
                        shared
                            .holding
                            .granted(attr.handle, parent.0, maker, &client, held.bits);
                    }
                    attr
                }
                Err(e) => return reply.error(errno(&e)),
            };
            if exclusive && attr.kind == Kind::File {
                // A file this create made has no capabilities (only a setxattr gives them):
                // the kernel's question before its first write is answered here.
                let capability = crate::cache::kernel_xattr(crate::cache::CAPABILITY_XATTR);
                if let Some(xattr) = capability {
                    shared.cache.absent(ticket, attr.handle, xattr);
                }
            }
            if attr.kind == Kind::File {
                shared.contents.created(&attr).await;
                shared.shm.named(attr.handle, &name);
                if shared
                    .shm
                    .used_elsewhere(&shared.locks, attr.handle, WHOLE)
                    .await
                {
                    // Not opened after all: the open `created` counted ends here.
                    for forgotten in shared.contents.closed(attr.handle).await {
                        shared.drop_copy(forgotten);
                    }
                    let _ = shared.give_back(attr.handle).await;
                    return reply.error(Errno::EBUSY);
                }
            }
            match shared.open_file(&attr, flags, &client) {
                Ok(fh) => reply.created(
                    &shared.cache.entered(ticket, attr.handle),
                    &file_attr(&attr),
                    Generation(attr.generation),
                    FileHandle(fh),
                    super::data::append_direct(&shared, flags),
                ),
                Err(e) => reply.error(e),
            }
        });
    }

    pub(super) fn handle_link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let shared = self.shared.clone();
        self.entry_in_dir(req, newparent, newname, reply, move |client, name| {
            async move {
                // A held file is known to the server by the directory it was made in: given
                // back before it has a name elsewhere.
                let _ = shared.give_back_whole(ino.0).await;
                let _busy = shared.through_server(newparent.0).await;
                client.link_in_dir(ino.0, newparent.0, &name).await
            }
        });
    }

    pub(super) fn handle_unlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let name = name.as_bytes().to_vec();
        shared.cache.changed_here(parent.0);
        let ticket = shared.cache.ticket();
        self.empty_task(req, reply, async move {
            shared.room_to_answer(&client, parent.0).await;
            if let Some(dir) = shared.remove_here(&client, parent.0, &name, false) {
                shared
                    .cache
                    .name_removed_here(parent.0, &name, Outcome::Known);
                shared.cache.dir_changed(ticket, dir);
                return Ok(());
            }
            let busy = shared.through_server(parent.0).await;
            let keep = shared.keep_for(&client, parent.0, &name).await;
            let unlinked = client.unlink_in_dir(parent.0, &name, keep).await;
            drop(busy);
            if unlinked.is_ok() {
                shared.ask_to_hold(&client, parent.0);
            }
            shared
                .cache
                .name_removed_here(parent.0, &name, Outcome::of_removal(&unlinked));
            let (orphan, dir) = unlinked.map_err(|e| errno(&e))?;
            if let Some(dir) = dir {
                shared.cache.dir_changed(ticket, dir);
            }
            shared.kept(&client, orphan).await;
            Ok(())
        });
    }

    pub(super) fn handle_rmdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let name = name.as_bytes().to_vec();
        shared.cache.changed_here(parent.0);
        shared.cache.dirs_changed_here();
        self.empty_task(req, reply, async move {
            shared.room_to_answer(&client, parent.0).await;
            if shared.remove_here(&client, parent.0, &name, true).is_some() {
                shared
                    .cache
                    .name_removed_here(parent.0, &name, Outcome::Known);
                shared.cache.changed_here(parent.0);
                shared.cache.dirs_changed_here();
                return Ok(());
            }
            // A directory held here that had names before has no name kept here: every one
            // held in `parent` goes back (the one removed may be among them).
            let _busy = shared.through_server(parent.0).await;
            shared.give_back_dirs_in(parent.0).await;
            let removed = client.rmdir(parent.0, &name).await;
            if removed.is_ok() {
                shared.dirs.removed(parent.0, &name);
            }
            shared
                .cache
                .name_removed_here(parent.0, &name, Outcome::of_removal(&removed));
            let removed = removed.map_err(|e| errno(&e));
            shared.cache.changed_here(parent.0);
            shared.cache.dirs_changed_here();
            removed
        });
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let name = name.as_bytes().to_vec();
        let newname = newname.as_bytes().to_vec();
        let flags = flags.bits();
        // A directory may move, or be replaced: no directory's attributes are kept from
        // before (the answer brings the one directory's when both names are in it).
        shared.cache.changed_here(parent.0);
        shared.cache.changed_here(newparent.0);
        shared.cache.dirs_changed_here();
        let ticket = shared.cache.ticket();
        self.empty_task(req, reply, async move {
            // Held files are known to the server by the directory they were made in: those
            // that may move are given back first.
            let _ = shared.give_back_in(parent.0).await;
            if flags & libc::RENAME_EXCHANGE != 0 {
                let _ = shared.give_back_in(newparent.0).await;
            }
            // So are the directories held whose names change, and those that may move.
            let _busy = shared.through_server(parent.0).await;
            let _busy_there = shared.through_server(newparent.0).await;
            shared.give_back_dirs_in(parent.0).await;
            shared.give_back_dirs_in(newparent.0).await;
            let keep = shared.keep_for(&client, newparent.0, &newname).await;
            let renamed = client
                .rename_in_dir(parent.0, &name, newparent.0, &newname, flags, keep)
                .await;
            let outcome = match renamed {
                Ok(_) => Outcome::Known,
                Err(_) => Outcome::Unknown,
            };
            shared.cache.renamed_here(
                (parent.0, &name),
                (newparent.0, &newname),
                flags & libc::RENAME_EXCHANGE != 0,
                outcome,
            );
            let (orphan, dir) = match renamed {
                Ok(answer) => answer,
                Err(e) => {
                    shared.cache.dirs_changed_here();
                    return Err(errno(&e));
                }
            };
            match dir {
                Some(dir) => shared.cache.dir_changed(ticket, dir),
                None => {
                    shared.cache.changed_here(parent.0);
                    shared.cache.changed_here(newparent.0);
                    shared.cache.dirs_changed_here();
                }
            }
            shared.kept(&client, orphan).await;
            Ok(())
        });
    }

    pub(super) fn handle_readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let client = self.shared.caller(req);
        self.spawn(req, reply.interrupter(), async move {
            // Offsets are the server's cookies; 1 and 2 are "." and "..".
            if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            if offset <= 1 && reply.add(ino, 2, FileType::Directory, "..") {
                return reply.ok();
            }
            let mut after = offset.max(2);
            loop {
                let entries = match client.readdir(ino.0, after, READDIR_BATCH).await {
                    Ok(entries) => entries,
                    Err(e) => return reply.error(errno(&e)),
                };
                if entries.is_empty() {
                    return reply.ok();
                }
                for entry in &entries {
                    let name = OsStr::from_bytes(&entry.name);
                    if reply.add(
                        INodeNo(entry.handle),
                        entry.cookie,
                        file_type(entry.kind),
                        name,
                    ) {
                        return reply.ok();
                    }
                    after = entry.cookie;
                }
            }
        });
    }

    /// READDIRPLUS: the entries with their attributes, from one server read, so that `ls -l`
    /// or a tree walk needs no lookup per name. Each entry with attributes is a lookup the
    /// kernel holds (see [`crate::cache`]); where the caller may not search the directory,
    /// names go alone, as its lookups would be refused.
    pub(super) fn handle_readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        let ticket = shared.cache.ticket();
        self.spawn(req, reply.interrupter(), async move {
            // Offsets are the server's cookies; 1 and 2 are "." and "..", names alone.
            let dot = plain_attr(ino.0, Kind::Dir);
            if offset == 0 && reply.add(INodeNo(0), 1, ".", &Duration::ZERO, &dot, Generation(0)) {
                return reply.ok();
            }
            if offset <= 1 && reply.add(INodeNo(0), 2, "..", &Duration::ZERO, &dot, Generation(0)) {
                return reply.ok();
            }
            let mut after = offset.max(2);
            loop {
                let entries = match client.readdir_plus(ino.0, after, READDIR_BATCH).await {
                    Ok(entries) => entries,
                    Err(e) => return reply.error(errno(&e)),
                };
                if entries.is_empty() {
                    return reply.ok();
                }
                for (entry, attr) in &entries {
                    let name = OsStr::from_bytes(&entry.name);
                    let full = match attr {
                        Some(attr) => {
                            let attr = shared.local_view(attr.clone());
                            if attr.kind == Kind::File {
                                shared.shm.named(attr.handle, &entry.name);
                            }
                            // Counted before the reply: the kernel holds it once it is sent.
                            let ttl = shared.cache.entered(ticket, attr.handle);
                            let generation = Generation(attr.generation);
                            let full = reply.add(
                                INodeNo(attr.handle),
                                entry.cookie,
                                name,
                                &ttl,
                                &file_attr(&attr),
                                generation,
                            );
                            // No room: the entry is not sent (the next listing call starts
                            // at it), so the kernel will never forget this count.
                            if full
                                && shared.cache.forget(attr.handle, 1)
                                && shared.contents.forgotten(attr.handle)
                            {
                                shared.drop_copy(attr.handle);
                            }
                            full
                        }
                        None => reply.add(
                            INodeNo(0),
                            entry.cookie,
                            name,
                            &Duration::ZERO,
                            &plain_attr(entry.handle, entry.kind),
                            Generation(0),
                        ),
                    };
                    if full {
                        return reply.ok();
                    }
                    after = entry.cookie;
                }
            }
        });
    }
}
