//! Attributes: getattr (a dirty file's size counts its pending writes), setattr, readlink,
//! statfs and extended attributes.

use super::*;

impl CalmFs {
    pub(super) fn handle_getattr(&self, req: &Request, ino: INodeNo, reply: ReplyAttr) {
        let shared = self.shared.clone();
        let ticket = shared.cache.ticket();
        // A directory this mount just changed: the server's answer to that change said what
        // its attributes are now (`crate::cache`, `Coherence::dir_attr`).
        if let Some(attr) = shared.cache.dir_attr(ino.0) {
            return reply.attr(&shared.cache.reply_ttl(ticket, ino.0), &file_attr(&attr));
        }
        // With the mount's session: a file this mount holds is not asked back from it.
        let client = shared.caller(req);
        self.spawn(req, reply.interrupter(), async move {
            // A file this mount made and holds has its pending writes committed first: the
            // server sets the file's mtime and ctime when they land, and a stat answered before
            // that would show times that change at the close without a write (git, which stats
            // what it checks out before closing it, would then read every file again at each
            // status). Other files are not: a database's write-and-fstat would commit at every
            // fstat, and their times stay the server's until their writes land, as before.
            // Committed as the process that made the file wrote it, whoever asks.
            if shared.contents.dirty_size(ino.0).is_some()
                && let Some(maker) = shared.holding.maker_client(ino.0)
                && let Err(errno) = shared.push(&maker, ino.0, None).await
            {
                return reply.error(errno);
            }
            match client.getattr(ino.0).await {
                Ok(attr) => {
                    let attr = shared.local_view(attr);
                    reply.attr(
                        &shared.cache.reply_ttl(ticket, attr.handle),
                        &file_attr(&attr),
                    );
                }
                Err(MetaError::NotFound) => {
                    // Unlinked while open here: what this mount last saw, with no links.
                    let kept = {
                        let state = shared.state();
                        state
                            .inodes
                            .get(&ino.0)
                            .filter(|i| !i.files.is_empty())
                            .and_then(|i| i.attr.clone())
                    };
                    match kept {
                        Some(mut attr) => {
                            attr.nlink = 0;
                            let attr = shared.local_view(attr);
                            reply.attr(
                                &shared.cache.reply_ttl(ticket, attr.handle),
                                &file_attr(&attr),
                            );
                        }
                        None => reply.error(Errno::ESTALE),
                    }
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    // The kernel's request, field for field (as `fuser::Filesystem` passes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        reply: ReplyAttr,
    ) {
        let shared = self.shared.clone();
        let client = shared.caller(req);
        shared.cache.forget_dir_attr(ino.0);
        // The attributes an open answered from a copy would give are this change's to say.
        shared.drop_copy(ino.0);
        let ticket = shared.cache.ticket();
        let change = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            // The server sets the change time to the time of the change (the kernel names
            // one only when it keeps times itself, which a calm mount does not).
            ctime: None,
        };
        let asker = crate::holding::Asker {
            uid: req.uid(),
            gid: req.gid(),
        };
        // A file this mount holds: answered here, sent when it is closed or asked for.
        if let Some(attr) = shared.keep(ino.0, &change, asker) {
            return reply.attr(&shared.cache.reply_ttl(ticket, ino.0), &file_attr(&attr));
        }
        self.spawn(req, reply.interrupter(), async move {
            let handle = ino.0;
            // Pending writes go first: a truncate cuts them too, and every other change
            // follows them (and changes kept of a file held follow those).
            if let Err(e) = shared.push(&client, handle, None).await {
                return reply.error(e);
            }
            if let Err(e) = shared.send_kept(handle).await {
                return reply.error(e);
            }
            // A directory held: its mode and owner decide what is answered in it.
            let busy = shared.through_server(handle).await;
            let changed = client.setattr(handle, &change).await;
            drop(busy);
            shared.cache.forget_dir_attr(handle);
            match changed {
                Ok(attr) => {
                    if size.is_some() {
                        shared.contents.changed(&attr).await;
                    }
                    let attr = shared.local_view(attr);
                    reply.attr(
                        &shared.cache.reply_ttl(ticket, attr.handle),
                        &file_attr(&attr),
                    );
                }
                Err(e) => reply.error(node_errno(&e)),
            }
        });
    }

    pub(super) fn handle_readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let client = self.shared.client.clone();
        let target = async move { client.readlink(ino.0).await };
        self.answer(req, reply, target, |reply, target| reply.data(&target));
    }

    pub(super) fn handle_statfs(&self, req: &Request, reply: ReplyStatfs) {
        let shared = self.shared.clone();
        self.spawn(req, reply.interrupter(), async move {
            let figures = match shared.client.statfs().await {
                Ok(figures) => figures,
                Err(e) => return reply.error(errno(&e)),
            };
            // Space is the local object store's file system's; a remote store's is not known
            // (reported as large and free).
            let (mut blocks, mut bfree, mut bavail, bsize) = shared
                .contents
                .objects()
                .local_root()
                .and_then(statvfs)
                .unwrap_or((1 << 40, 1 << 40, 1 << 40, 4096));
            let (mut files, mut ffree) = (figures.inodes.saturating_add(1 << 32), 1 << 32);
            // A quota on the tree mounted is what df shows, as on a file system of that size.
            if let Some(quota) = figures.root_quota {
                let used = quota.usage.bytes.max(0) as u64;
                let limit = [quota.limits.bytes, quota.limits.soft_bytes]
                    .into_iter()
                    .filter(|l| *l > 0)
                    .min();
                if let Some(limit) = limit {
                    blocks = limit.div_ceil(bsize.into());
                    bfree = limit.saturating_sub(used) / u64::from(bsize);
                    bavail = bfree.min(bavail);
                }
                let inodes = [quota.limits.inodes, quota.limits.soft_inodes]
                    .into_iter()
                    .filter(|l| *l > 0)
                    .min();
                if let Some(limit) = inodes {
                    files = limit;
                    ffree = limit.saturating_sub(quota.usage.inodes.max(0) as u64);
                }
            }
            reply.statfs(
                blocks,
                bfree,
                bavail,
                files,
                ffree,
                bsize,
                figures.name_len_max,
                bsize,
            );
        });
    }

    pub(super) fn handle_setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        let client = self.shared.caller(req);
        let name = name.as_bytes().to_vec();
        let value = value.to_vec();
        let shared = self.shared.clone();
        let cache = self.shared.cache.clone();
        cache.changed_here(ino.0);
        shared.drop_copy(ino.0);
        self.empty_task(req, reply, async move {
            // An extended attribute (an ACL, capabilities) ends a hold: the changes kept go
            // first, and the server decides every later one.
            shared.give_back_whole(ino.0).await?;
            let _busy = shared.through_server(ino.0).await;
            let result = client.setxattr(ino.0, &name, &value, flags as u32).await;
            cache.changed_here(ino.0);
            result.map_err(|e| errno(&e))
        });
    }

    pub(super) fn handle_getxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let name = name.as_bytes().to_vec();
        if ino.0 == calm_types::ROOT && name == crate::metrics::METRICS_XATTR.as_bytes() {
            let figures = self.shared.metrics.samples();
            return xattr_reply(reply, size, figures.as_bytes());
        }
        let cache = self.shared.cache.clone();
        let kept = crate::cache::kernel_xattr(&name);
        if let Some(xattr) = kept
            && cache.lacks(ino.0, xattr)
        {
            return reply.error(Errno::ENODATA);
        }
        let client = self.shared.caller(req);
        let ticket = cache.ticket();
        let value = async move {
            let value = client.getxattr(ino.0, &name).await;
            if let Some(xattr) = kept
                && matches!(value, Err(MetaError::NoData))
            {
                cache.absent(ticket, ino.0, xattr);
            }
            value
        };
        self.answer(req, reply, value, move |reply, value| {
            xattr_reply(reply, size, &value)
        });
    }

    pub(super) fn handle_listxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        size: u32,
        reply: ReplyXattr,
    ) {
        let client = self.shared.caller(req);
        let names = async move { client.listxattr(ino.0).await };
        self.answer(req, reply, names, move |reply, names| {
            let mut list = Vec::new();
            for name in names {
                list.extend_from_slice(&name);
                list.push(0);
            }
            xattr_reply(reply, size, &list)
        });
    }

    pub(super) fn handle_removexattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        let client = self.shared.caller(req);
        let name = name.as_bytes().to_vec();
        let shared = self.shared.clone();
        let cache = self.shared.cache.clone();
        cache.changed_here(ino.0);
        shared.drop_copy(ino.0);
        self.empty_task(req, reply, async move {
            shared.give_back_whole(ino.0).await?;
            let _busy = shared.through_server(ino.0).await;
            let result = client.removexattr(ino.0, &name).await;
            cache.changed_here(ino.0);
            result.map_err(|e| errno(&e))
        });
    }
}
