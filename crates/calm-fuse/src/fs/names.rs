//! Names: lookup, the making of nodes, links, unlink, rmdir, rename and readdir (an unlink or
//! rename names the files this mount has open, so that the server keeps the one that loses its
//! last name).

use super::*;

impl CalmFs {
    pub(super) fn handle_lookup(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEntry,
    ) {
        let client = self.shared.caller(req);
        let name = name.as_bytes().to_vec();
        self.entry_task(reply, async move {
            client.lookup(parent.0, &name).await.map_err(|e| errno(&e))
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
        let node = NewNode::node(
            kind,
            mode & !umask & 0o7777,
            req.uid(),
            req.gid(),
            u64::from(rdev),
        );
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
        let node = NewNode::dir(mode & !umask & 0o7777, req.uid(), req.gid());
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
        let node = NewNode::file(mode & !umask & 0o7777, req.uid(), req.gid());
        let name = name.as_bytes().to_vec();
        let exclusive = flags & libc::O_EXCL != 0;
        let ticket = shared.cache.ticket();
        self.spawn(async move {
            let attr = match client.make(parent.0, &name, &node, exclusive).await {
                Ok(attr) => attr,
                Err(e) => return reply.error(errno(&e)),
            };
            if attr.kind == Kind::File {
                shared.contents.created(&attr).await;
            }
            match shared.open_file(&attr, flags) {
                Ok(fh) => reply.created(
                    &shared.cache.entered(ticket, attr.handle),
                    &file_attr(&attr),
                    Generation(attr.generation),
                    FileHandle(fh),
                    FopenFlags::empty(),
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
        let client = self.shared.caller(req);
        let name = newname.as_bytes().to_vec();
        self.entry_task(reply, async move {
            client
                .link(ino.0, newparent.0, &name)
                .await
                .map_err(|e| errno(&e))
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
        self.empty_task(reply, async move {
            let keep = shared.keep_for(&client, parent.0, &name).await;
            let orphan = client
                .unlink_keeping(parent.0, &name, keep)
                .await
                .map_err(|e| errno(&e))?;
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
        let client = self.shared.caller(req);
        let name = name.as_bytes().to_vec();
        self.empty_task(reply, async move {
            client.rmdir(parent.0, &name).await.map_err(|e| errno(&e))
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
        self.empty_task(reply, async move {
            let keep = shared.keep_for(&client, newparent.0, &newname).await;
            let orphan = client
                .rename_keeping(parent.0, &name, newparent.0, &newname, flags, keep)
                .await
                .map_err(|e| errno(&e))?;
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
        self.spawn(async move {
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
}
