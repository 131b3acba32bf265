//! The namespace's reads: each on one snapshot of the store, on the calling thread (or a
//! blocking thread of the runtime), with the caller's permissions checked as Linux checks
//! them (`*_as`).

use super::*;

impl<S: Store> Meta<S> {
    pub fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(ops::load(&snap, handle)?.attr())
        })
    }

    /// What a permission decision on `handle` looks at (its owner, mode and access ACL), on a
    /// snapshot that may miss another server's change of the last moments when `recent`: for
    /// the lock service's checks.
    pub fn owner(&self, handle: Handle, recent: bool) -> Result<crate::perm::Owner> {
        self.blocking(|| {
            let snap = if recent {
                self.store.snapshot_recent()?
            } else {
                self.store.snapshot()?
            };
            Ok(ops::load(&snap, handle)?.owner())
        })
    }

    /// The directories holding names of `handle`, sorted (none for the root, an unlinked
    /// file kept open, or a file made before format 4 that was not renamed since).
    pub fn parents(&self, handle: Handle) -> Result<Vec<Handle>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            let mut parents = links::parents(&snap, &inode)?;
            parents.sort_unstable();
            Ok(parents)
        })
    }

    /// The entry `name` of directory `parent`; "." is the directory, ".." its parent.
    pub fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.lookup_as(&Caller::default(), parent, name)
    }

    /// [`Meta::lookup`] for `caller`, who needs search permission on `parent`.
    pub fn lookup_as(&self, caller: &Caller, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let dir = ops::load_dir(&snap, parent)?;
            perm::may_lookup(caller, &dir.owner())?;
            let child = match name {
                b"." => parent,
                b".." => dir.parent,
                _ => {
                    ops::check_name(name)?;
                    ops::get_dentry(&snap, &self.names, parent, name)?
                        .ok_or(MetaError::NotFound)?
                        .child
                }
            };
            Ok(ops::load(&snap, child)?.attr())
        })
    }

    pub fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            if inode.kind != Kind::Symlink {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(inode.target)
        })
    }

    /// Up to `limit` entries of directory `dir` (at most [`READDIR_ENTRIES_MAX`]) after
    /// `after_cookie` (0 = from the start). Resuming with the last entry's cookie continues
    /// exactly where the listing stopped, whatever was created or removed in between.
    pub fn readdir(&self, dir: Handle, after_cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.readdir_as(&Caller::default(), dir, after_cookie, limit)
    }

    /// [`Meta::readdir`] for `caller`, who needs read permission on `dir`.
    pub fn readdir_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load_dir(&snap, dir)?;
            perm::permission(caller, &inode.owner(), perm::MAY_READ)?;
            readdir_entries(&snap, dir, after_cookie, limit)
        })
    }

    /// [`Meta::readdir_as`] with each entry's attributes, read on the same snapshot (what a
    /// lookup of each name would answer; READDIRPLUS). A caller who may read `dir` but not
    /// search it gets the entries without attributes, as its lookups would be refused.
    pub fn readdir_plus_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load_dir(&snap, dir)?;
            perm::permission(caller, &inode.owner(), perm::MAY_READ)?;
            let entries = readdir_entries(&snap, dir, after_cookie, limit)?;
            let searchable = perm::may_lookup(caller, &inode.owner()).is_ok();
            entries
                .into_iter()
                .map(|entry| {
                    let attr = match searchable {
                        true => Some(ops::load(&snap, entry.handle)?.attr()),
                        false => None,
                    };
                    Ok((entry, attr))
                })
                .collect()
        })
    }

    pub fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.getxattr_as(&Caller::default(), handle, name)
    }

    /// [`Meta::getxattr`] for `caller` (the namespace's rules: `crate::perm::may_get_xattr`).
    pub fn getxattr_as(&self, caller: &Caller, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            perm::may_get_xattr(caller, &inode.owner(), name)?;
            if name == crate::acl::ACCESS_XATTR {
                // Kept in the inode's record.
                return inode
                    .access_acl
                    .map(|acl| acl.encode())
                    .ok_or(MetaError::NoData);
            }
            match snap.get(&xattr_key(handle, name))? {
                Some(value) => Ok(value.into_owned()),
                None => Err(MetaError::NoData),
            }
        })
    }

    pub fn listxattr(&self, handle: Handle) -> Result<Vec<Vec<u8>>> {
        self.listxattr_as(&Caller::default(), handle)
    }

    /// [`Meta::listxattr`] for `caller`: `trusted.*` names only for the superuser.
    pub fn listxattr_as(&self, caller: &Caller, handle: Handle) -> Result<Vec<Vec<u8>>> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let inode = ops::load(&snap, handle)?;
            let mut names = crate::ctx::inode_xattr_names(&snap, &inode)?;
            names.retain(|name| perm::lists_xattr(caller, name));
            Ok(names)
        })
    }

    pub fn statfs(&self) -> Result<StatFs> {
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            Ok(StatFs {
                inodes: counter(&snap, KEY_INODES)?,
                file_bytes: counter(&snap, KEY_FILE_BYTES)?,
                store_bytes: self.store.size_bytes()?,
                name_len_max: NAME_LEN_MAX as u32,
                root_quota: {
                    let root = quota::QuotaTarget::tree(ROOT);
                    match snap.get(&quota::limits_key(root))? {
                        Some(_) => Some(quota::report(&snap, root)?),
                        None => None,
                    }
                },
            })
        })
    }
}

/// Up to `limit` (at most [`READDIR_ENTRIES_MAX`]) entries of directory `dir` after cookie
/// `after_cookie`, on `snap`: in hash order, each with its cookie (see [`layout::NameHash`]).
pub(crate) fn readdir_entries<R: ReadTxn>(
    snap: &R,
    dir: Handle,
    after_cookie: u64,
    limit: usize,
) -> Result<Vec<DirEntry>> {
    let limit = limit.min(READDIR_ENTRIES_MAX);
    let mut entries: Vec<DirEntry> = Vec::with_capacity(limit.min(256));
    if limit == 0 {
        return Ok(entries);
    }
    let (from_hash, skip) = layout::cookie_position(after_cookie);
    let (_, end) = layout::entries_range(dir);
    let start = layout::entries_from(dir, from_hash);
    // The hash of the last name visited and its rank among the names sharing that hash.
    let mut group: Option<(u64, u64)> = None;
    let mut corrupt = None;
    snap.visit(&start, &end, &mut |key, value| {
        let Some((_, hash, name)) = layout::entry_key_parts(key) else {
            corrupt = Some(MetaError::Corrupt(format!(
                "directory {dir}: name key of {} bytes",
                key.len()
            )));
            return ControlFlow::Break(());
        };
        let rank = match group {
            Some((last, rank)) if last == hash => rank + 1,
            _ => 0,
        };
        group = Some((hash, rank));
        if hash == from_hash && rank < skip {
            return ControlFlow::Continue(());
        }
        // A page never ends among names that share the last cookie of their hash (256 names
        // with one hash: never by chance), or resuming would return them again and again.
        let shares_cookie = rank >= layout::COOKIE_GROUP_NAMES;
        if entries.len() >= limit && !shares_cookie {
            return ControlFlow::Break(());
        }
        match Dentry::decode(value) {
            Ok(dentry) => entries.push(DirEntry {
                name: name.to_vec(),
                handle: dentry.child,
                kind: dentry.kind,
                cookie: layout::cookie_of(hash, rank),
            }),
            Err(error) => {
                corrupt = Some(error);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    match corrupt {
        Some(error) => Err(error),
        None => Ok(entries),
    }
}
