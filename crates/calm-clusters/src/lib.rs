//! `calm-clusters`: one namespace over several metadata stores, one per metadata cluster
//! (docs/design/etcd-clusters.md).
//!
//! Each cluster's store holds an ordinary calm namespace (a [`Meta`]) with a root of its own.
//! The namespace's root is all of those roots at once: a name in the root lives on the cluster
//! its hash picks ([`Clusters::cluster_of_name`]), and everything below that name (directories,
//! files, the records of their contents) on that same cluster. So every name and the inode it
//! names are on one cluster, every mutation commits on one cluster, and the clusters commit at
//! the same time without ever conflicting: creates add up with the clusters. Handles carry
//! their cluster's number in their top byte ([`calm_meta::place`]), so a request naming a
//! handle goes to its cluster without a lookup.
//!
//! What spans clusters is read-only or refused: the root's attributes and listing are read
//! from every cluster and merged; a rename or a link between names on two clusters is refused
//! with EXDEV (as between two file systems: `mv` copies and removes); the root's own
//! attributes stay as the namespace was made with.
//!
//! What it deliberately does not know: which store each cluster is on (any [`Store`]), the
//! wire, and how servers share the work.

use calm_meta::layout::NameHash;
use calm_meta::ops::{Done, Op};
use calm_meta::place::{CLUSTERS_MAX, Place, cluster_of, cluster_of_slice, root_cluster};
use calm_meta::requests::RequestId;
use calm_meta::{
    Attr, Caller, DirEntry, Handle, Meta, MetaError, MetaOptions, READDIR_ENTRIES_MAX, ROOT,
    Result, StatFs,
};
use calm_store::Store;

/// A namespace over one or more clusters' stores.
pub struct Clusters<S: Store> {
    /// Cluster `i` is `metas[i]`.
    metas: Vec<Meta<S>>,
    /// The namespace's name hash (every cluster has cluster 0's key): orders the root's
    /// merged listing and picks each root name's cluster.
    names: NameHash,
}

impl<S: Store> std::fmt::Debug for Clusters<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clusters")
            .field("count", &self.metas.len())
            .finish()
    }
}

impl<S: Store> Clusters<S> {
    /// Opens the namespace over `stores`, cluster 0 first, in the order the namespace was made
    /// with (an empty store is formatted as the cluster of its position; a store at another
    /// position, or of another namespace, is refused). One store: an ordinary namespace.
    pub fn open(stores: Vec<S>, options: MetaOptions) -> Result<Self> {
        let count = stores.len();
        if count == 0 || count > CLUSTERS_MAX {
            return Err(MetaError::Invalid(format!(
                "{count} metadata clusters: a namespace has 1 to {CLUSTERS_MAX}"
            )));
        }
        let mut metas = Vec::with_capacity(count);
        let mut keys = None;
        for (index, store) in stores.into_iter().enumerate() {
            let place = match count {
                1 => None,
                _ => Some(Place::new(index, count, keys)?),
            };
            let meta = Meta::open(
                store,
                MetaOptions {
                    place,
                    ..options.clone()
                },
            )?;
            if index == 0 {
                keys = Some(meta.namespace_keys()?);
            }
            metas.push(meta);
        }
        let keys = keys.expect("cluster 0 was opened");
        Ok(Clusters {
            metas,
            names: NameHash::from_value(&keys.name_key)?,
        })
    }

    /// How many clusters the namespace has.
    pub fn count(&self) -> usize {
        self.metas.len()
    }

    /// Cluster `cluster`'s own namespace: its changelog, status, housekeeping.
    pub fn meta(&self, cluster: usize) -> &Meta<S> {
        &self.metas[cluster]
    }

    /// Every cluster's namespace, cluster 0 first.
    pub fn metas(&self) -> &[Meta<S>] {
        &self.metas
    }

    /// The cluster holding `handle` (the root's attributes: cluster 0's).
    pub fn cluster_of(&self, handle: Handle) -> Result<usize> {
        let cluster = cluster_of(handle);
        if cluster < self.metas.len() {
            Ok(cluster)
        } else {
            Err(MetaError::Stale)
        }
    }

    /// The cluster holding the name `name` of directory `parent`: the one its hash picks in
    /// the root, else the directory's.
    pub fn cluster_of_name(&self, parent: Handle, name: &[u8]) -> Result<usize> {
        if parent == ROOT && self.metas.len() > 1 {
            Ok(self.root_cluster(name))
        } else {
            self.cluster_of(parent)
        }
    }

    /// The cluster of a name in the root. The hash is the namespace's name hash, so the
    /// choice never changes while the namespace lives (its clusters are fixed when it is made).
    fn root_cluster(&self, name: &[u8]) -> usize {
        root_cluster(self.names.hash(name), self.metas.len())
    }

    /// Applies a mutation on the one cluster it touches.
    pub async fn apply_as(&self, caller: Caller, op: Op) -> Result<Done> {
        self.apply_request(caller, op, None).await
    }

    /// [`Clusters::apply_as`] for a request with an id (applied at most once: the cluster
    /// the operation goes to keeps its record, and the same operation always goes there).
    pub async fn apply_request(
        &self,
        caller: Caller,
        op: Op,
        id: Option<RequestId>,
    ) -> Result<Done> {
        let cluster = self.route(&op)?;
        let done = self.metas[cluster].apply_request(caller, op, id).await?;
        Ok(match done {
            Done::Attr(attr) => Done::Attr(self.whole(attr)?),
            other => other,
        })
    }

    /// The cluster `op` commits on; EXDEV for a rename or link between two clusters.
    fn route(&self, op: &Op) -> Result<usize> {
        let several = self.metas.len() > 1;
        match op {
            Op::Make { parent, name, .. }
            | Op::Unlink { parent, name, .. }
            | Op::Rmdir { parent, name } => self.cluster_of_name(*parent, name),
            Op::Link {
                handle,
                parent,
                name,
            } => {
                let to = self.cluster_of_name(*parent, name)?;
                if *handle == ROOT && several || self.cluster_of(*handle)? != to {
                    return Err(cross_device("a hard link"));
                }
                Ok(to)
            }
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => {
                let from = self.cluster_of_name(*parent, name)?;
                if self.cluster_of_name(*new_parent, new_name)? != from {
                    return Err(cross_device("a rename"));
                }
                Ok(from)
            }
            Op::SetAttr { handle, .. } if *handle == ROOT && several => {
                Err(MetaError::NotPermitted(
                    "the root of a namespace over several metadata clusters keeps the \
                     attributes it was made with"
                        .into(),
                ))
            }
            Op::SetAttr { handle, .. }
            | Op::SetXattr { handle, .. }
            | Op::RemoveXattr { handle, .. }
            | Op::Write { handle, .. }
            | Op::Append { handle, .. }
            | Op::Compact { handle, .. }
            | Op::ReleaseOrphan { handle, .. }
            | Op::TrashRestore { handle }
            | Op::Clone { src: handle, .. }
            | Op::CloneEntries { src: handle, .. }
            | Op::TrashPurge { handle, .. } => self.cluster_of(*handle),
            // A tree's quota on the cluster of its directory; a user's or a group's counts
            // on each cluster apart (set it on each).
            Op::SetQuota { target, .. } if target.kind == calm_meta::quota::QuotaKind::Tree => {
                if target.id == ROOT && several {
                    return Err(MetaError::NotSupported(
                        "a quota on the root of a namespace over several metadata clusters".into(),
                    ));
                }
                self.cluster_of(target.id)
            }
            Op::ClaimOrphans { handles } => {
                self.one_cluster(handles.iter().map(|h| cluster_of(*h)), "orphans")
            }
            Op::GcDone { entries } => self.one_cluster(
                entries.iter().map(|(_, id)| cluster_of_slice(*id)),
                "deleted objects",
            ),
            Op::Collected { ids, .. } => self.one_cluster(
                ids.iter().map(|id| cluster_of_slice(*id)),
                "collected objects",
            ),
            Op::AllocSlices { .. }
            | Op::Grant { .. }
            | Op::ClRegister { .. }
            | Op::ClDeregister { .. }
            | Op::ClClear { .. }
            | Op::ClMask { .. }
            | Op::ClGc
            | Op::SetQuota { .. }
            | Op::ForgetRequests { .. }
            | Op::ForgetGrants { .. } => match several {
                false => Ok(0),
                true => Err(MetaError::Invalid(
                    "this operation names no file: send it to one cluster's namespace".into(),
                )),
            },
        }
    }

    /// The one cluster of `clusters` (all the same), for an operation on several handles.
    fn one_cluster(&self, clusters: impl Iterator<Item = usize>, what: &str) -> Result<usize> {
        let mut one = None;
        for cluster in clusters {
            match one {
                None => one = Some(cluster),
                Some(seen) if seen != cluster => {
                    return Err(MetaError::Invalid(format!(
                        "{what} of several metadata clusters in one request"
                    )));
                }
                Some(_) => {}
            }
        }
        match one {
            Some(cluster) if cluster < self.metas.len() => Ok(cluster),
            Some(_) => Err(MetaError::Stale),
            None => Ok(0),
        }
    }

    /// `attr` as the namespace answers it: the root's merged over every cluster.
    fn whole(&self, attr: Attr) -> Result<Attr> {
        if attr.handle == ROOT && self.metas.len() > 1 {
            self.root_attr()
        } else {
            Ok(attr)
        }
    }

    /// The root's attributes: cluster 0's owner and mode (every cluster's root has the same:
    /// they cannot be changed), its links and size summed over the clusters' roots, its
    /// times the latest of theirs.
    fn root_attr(&self) -> Result<Attr> {
        let mut whole = self.metas[0].getattr(ROOT)?;
        for meta in &self.metas[1..] {
            let part = meta.getattr(ROOT)?;
            whole.nlink += part.nlink.saturating_sub(2);
            whole.size += part.size;
            whole.atime_ns = whole.atime_ns.max(part.atime_ns);
            whole.mtime_ns = whole.mtime_ns.max(part.mtime_ns);
            whole.ctime_ns = whole.ctime_ns.max(part.ctime_ns);
        }
        Ok(whole)
    }

    pub fn getattr(&self, handle: Handle) -> Result<Attr> {
        let attr = self.metas[self.cluster_of(handle)?].getattr(handle)?;
        self.whole(attr)
    }

    /// The entry `name` of `parent` for `caller` ("." and ".." of the root: the root).
    pub fn lookup_as(&self, caller: &Caller, parent: Handle, name: &[u8]) -> Result<Attr> {
        let cluster = match name {
            b"." | b".." => self.cluster_of(parent)?,
            _ => self.cluster_of_name(parent, name)?,
        };
        let attr = self.metas[cluster].lookup_as(caller, parent, name)?;
        self.whole(attr)
    }

    /// Up to `limit` entries of `dir` after `after_cookie`, for `caller`. The root's listing
    /// is every cluster's root listing merged in one order (the namespace's name hash, which
    /// every cluster shares), so a cookie resumes it as it resumes any other.
    pub fn readdir_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        if dir != ROOT || self.metas.len() == 1 {
            return self.metas[self.cluster_of(dir)?].readdir_as(caller, dir, after_cookie, limit);
        }
        let limit = limit.min(READDIR_ENTRIES_MAX);
        let mut merged = Vec::new();
        for meta in &self.metas {
            merged.extend(meta.readdir_as(caller, ROOT, after_cookie, limit)?);
        }
        Ok(first_by_cookie(merged, limit, |entry| entry.cookie))
    }

    /// [`Clusters::readdir_as`] with each entry's attributes (READDIRPLUS).
    pub fn readdir_plus_as(
        &self,
        caller: &Caller,
        dir: Handle,
        after_cookie: u64,
        limit: usize,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        if dir != ROOT || self.metas.len() == 1 {
            return self.metas[self.cluster_of(dir)?].readdir_plus_as(
                caller,
                dir,
                after_cookie,
                limit,
            );
        }
        let limit = limit.min(READDIR_ENTRIES_MAX);
        let mut merged = Vec::new();
        for meta in &self.metas {
            merged.extend(meta.readdir_plus_as(caller, ROOT, after_cookie, limit)?);
        }
        Ok(first_by_cookie(merged, limit, |(entry, _)| entry.cookie))
    }

    pub fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.metas[self.cluster_of(handle)?].readlink(handle)
    }

    pub fn getxattr_as(&self, caller: &Caller, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.metas[self.cluster_of(handle)?].getxattr_as(caller, handle, name)
    }

    pub fn listxattr_as(&self, caller: &Caller, handle: Handle) -> Result<Vec<Vec<u8>>> {
        self.metas[self.cluster_of(handle)?].listxattr_as(caller, handle)
    }

    /// The namespace's figures: every cluster's summed (one root, not one per cluster).
    pub fn statfs(&self) -> Result<StatFs> {
        let mut whole = self.metas[0].statfs()?;
        for meta in &self.metas[1..] {
            let part = meta.statfs()?;
            whole.inodes += part.inodes.saturating_sub(1);
            whole.file_bytes += part.file_bytes;
            whole.store_bytes += part.store_bytes;
        }
        Ok(whole)
    }
}

fn cross_device(what: &str) -> MetaError {
    MetaError::CrossDevice(format!(
        "{what} between names on two metadata clusters (copy, then remove)"
    ))
}

/// The `limit` first of `entries` by cookie. Every cluster's page holds its first `limit`
/// names after the cookie, so the first `limit` of them all are the namespace's.
fn first_by_cookie<T>(mut entries: Vec<T>, limit: usize, cookie: impl Fn(&T) -> u64) -> Vec<T> {
    entries.sort_by_key(|entry| cookie(entry));
    entries.truncate(limit);
    entries
}
