//! The namespace calls of a [`Client`]: lookups, attributes, creates, links, removals,
//! renames, listings, extended attributes and the file system's figures.

use super::*;

/// What a make that asked to hold its node holds of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// `calm_proto::HOLD_*` bits (0: nothing).
    pub bits: u32,
    /// A directory held where quotas limit its makes: how many nodes the holder may make in
    /// it and in the directories it makes there (0: no quota limits them).
    pub room: u64,
}

/// A directory the server let this client's session hold (`Client::hold_dir`).
#[derive(Debug, Clone)]
pub struct HeldDir {
    pub attr: Attr,
    /// The directory it is in.
    pub parent: Handle,
    /// Every name in it.
    pub names: Vec<DirEntry>,
    /// The generation of the nodes made now.
    pub generation: u64,
}

impl Client {
    pub async fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Attr> {
        let request = pb::LookupRequest {
            parent,
            name: name.to_vec(),
        };
        check(batched_call!(self, lookup, Lookup, request))?.try_into()
    }

    pub async fn getattr(&self, handle: Handle) -> Result<Attr> {
        check(batched_call!(
            self,
            get_attr,
            GetAttr,
            pb::HandleRequest { handle }
        ))?
        .try_into()
    }

    pub async fn setattr(&self, handle: Handle, attr: &SetAttr) -> Result<Attr> {
        self.setattr_releasing(handle, attr, false).await
    }

    /// [`Client::setattr`]; with `release`, the caller's session gives back its hold of the
    /// file once the change is applied.
    pub async fn setattr_releasing(
        &self,
        handle: Handle,
        attr: &SetAttr,
        release: bool,
    ) -> Result<Attr> {
        let mut request = calm_proto::setattr_to_wire(handle, attr);
        request.release_hold = release;
        self.mutated(batched_call!(mutation placed, self, set_attr, SetAttr, request))?
            .try_into()
    }

    pub async fn make(
        &self,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
        exclusive: bool,
    ) -> Result<Attr> {
        Ok(self.make_in_dir(parent, name, node, exclusive).await?.0)
    }

    /// [`Client::make`], with `parent`'s attributes right after it when the server sent them.
    pub async fn make_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
        exclusive: bool,
    ) -> Result<(Attr, Option<Attr>)> {
        let (attr, dir, _) = self.make_held(parent, name, node, exclusive, false).await?;
        Ok((attr, dir))
    }

    /// [`Client::make_in_dir`]; with `hold`, asks that the caller's session hold the new file
    /// (`Meta.Holds`), and answers what it holds too ([`Held`]).
    pub async fn make_held(
        &self,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
        exclusive: bool,
        hold: bool,
    ) -> Result<(Attr, Option<Attr>, Held)> {
        let request = make_request(parent, name, node, exclusive, hold);
        let reply = self.mutated(batched_call!(
            mutation placed,
            self,
            make,
            Make,
            request
        ))?;
        let held = Held {
            bits: reply.held,
            room: reply.held_room,
        };
        let (attr, dir) = calm_proto::entry_from_wire(reply)?;
        Ok((attr, dir, held))
    }

    pub async fn create(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, &NewNode::file(mode, 0, 0), true)
            .await
    }

    pub async fn mkdir(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, &NewNode::dir(mode, 0, 0), true)
            .await
    }

    pub async fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Attr> {
        Ok(self.link_in_dir(handle, parent, name).await?.0)
    }

    /// [`Client::link`], with `parent`'s attributes right after it when the server sent them.
    pub async fn link_in_dir(
        &self,
        handle: Handle,
        parent: Handle,
        name: &[u8],
    ) -> Result<(Attr, Option<Attr>)> {
        let request = pb::LinkRequest {
            handle,
            parent,
            name: name.to_vec(),
        };
        calm_proto::entry_from_wire(self.mutated(batched_call!(
            mutation placed,
            self,
            link,
            Link,
            request
        ))?)
    }

    pub async fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.unlink_keeping(parent, name, Vec::new())
            .await
            .map(|_| ())
    }

    /// Unlink, keeping the file as an orphan of this client's session if it loses its last
    /// name and is one of `keep` (files the caller has open): returns it then.
    pub async fn unlink_keeping(
        &self,
        parent: Handle,
        name: &[u8],
        keep: Vec<Handle>,
    ) -> Result<Option<Handle>> {
        Ok(self.unlink_in_dir(parent, name, keep).await?.0)
    }

    /// [`Client::unlink_keeping`], with `parent`'s attributes right after it when the server
    /// sent them.
    pub async fn unlink_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        keep: Vec<Handle>,
    ) -> Result<(Option<Handle>, Option<Attr>)> {
        // Placed like every mutation: a file kept open becomes an orphan of this client's
        // session whichever server commits it (the session's own server sweeps it).
        let request = pb::RemoveRequest {
            parent,
            name: name.to_vec(),
            keep,
            time_ns: 0,
        };
        removed(self.mutated(batched_call!(mutation placed, self, unlink, Unlink, request))?)
    }

    /// The caller's mount closed orphan `handle`: it is destroyed.
    pub async fn release_orphan(&self, handle: Handle) -> Result<()> {
        let request = pb::HandleRequest { handle };
        check(meta_call!(self, release_orphan, request)).map(|_| ())
    }

    /// The caller's session gives back its holds of `handles` and its copies of `copies`.
    pub async fn return_holds(&self, handles: Vec<Handle>, copies: Vec<Handle>) -> Result<()> {
        let request = pb::ReturnRequest { handles, copies };
        check(meta_call!(self, return_holds, request)).map(|_| ())
    }

    /// Asks to hold directory `dir`, which has names already, for the caller's session
    /// (`Meta.HoldDir`); `watch_id` names this mount's watch of every change. `None`: not
    /// held.
    pub async fn hold_dir(&self, dir: Handle, watch_id: u64) -> Result<Option<HeldDir>> {
        let request = pb::HoldDirRequest { dir, watch_id };
        let reply = check(meta_call!(self, hold_dir, request))?;
        if reply.held & calm_proto::HOLD_NAMES == 0 {
            return Ok(None);
        }
        let attr = reply
            .attr
            .ok_or_else(|| MetaError::Io("a directory held without its attributes".into()))?;
        let names = reply.names.into_iter().map(DirEntry::try_from);
        Ok(Some(HeldDir {
            attr: Attr::try_from(attr)?,
            names: names.collect::<Result<_>>()?,
            parent: reply.parent,
            generation: reply.generation,
        }))
    }

    /// This client's session takes over these orphans of its mount's lost session.
    pub async fn claim_orphans(&self, handles: Vec<Handle>) -> Result<()> {
        let request = pb::OrphansRequest { handles };
        check(meta_call!(self, claim_orphans, request)).map(|_| ())
    }

    pub async fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let request = pb::RemoveRequest {
            parent,
            name: name.to_vec(),
            keep: Vec::new(),
            time_ns: 0,
        };
        self.mutated(batched_call!(mutation placed, self, rmdir, Rmdir, request))
            .map(|_| ())
    }

    pub async fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.rename_keeping(parent, name, new_parent, new_name, flags, Vec::new())
            .await
            .map(|_| ())
    }

    /// Rename, keeping a replaced file as [`Client::unlink_keeping`] does.
    pub async fn rename_keeping(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
        keep: Vec<Handle>,
    ) -> Result<Option<Handle>> {
        Ok(self
            .rename_in_dir(parent, name, new_parent, new_name, flags, keep)
            .await?
            .0)
    }

    /// [`Client::rename_keeping`], with the directory's attributes right after it when both
    /// names are in one directory and the server sent them.
    pub async fn rename_in_dir(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
        keep: Vec<Handle>,
    ) -> Result<(Option<Handle>, Option<Attr>)> {
        let request = pb::RenameRequest {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
            keep,
        };
        removed(self.mutated(batched_call!(mutation placed, self, rename, Rename, request))?)
    }

    pub async fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        Ok(check(meta_call!(self, readlink, pb::HandleRequest { handle }))?.target)
    }

    pub async fn readdir(
        &self,
        dir: Handle,
        after_cookie: u64,
        limit: u32,
    ) -> Result<Vec<DirEntry>> {
        let request = pb::ReadDirRequest {
            handle: dir,
            after_cookie,
            limit,
            plus: false,
        };
        check(meta_call!(self, read_dir, request))?
            .entries
            .into_iter()
            .map(DirEntry::try_from)
            .collect()
    }

    /// [`Client::readdir`] with each entry's attributes (None where the caller may read the
    /// directory but not search it), on one snapshot.
    pub async fn readdir_plus(
        &self,
        dir: Handle,
        after_cookie: u64,
        limit: u32,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let request = pb::ReadDirRequest {
            handle: dir,
            after_cookie,
            limit,
            plus: true,
        };
        check(meta_call!(self, read_dir, request))?
            .entries
            .into_iter()
            .map(|mut e| {
                let attr = e.attr.take().map(Attr::try_from).transpose()?;
                Ok((DirEntry::try_from(e)?, attr))
            })
            .collect()
    }

    pub async fn setxattr(
        &self,
        handle: Handle,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        let request = pb::SetXattrRequest {
            handle,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.mutated(meta_call!(mutation placed, self, set_xattr, request))
            .map(|_| ())
    }

    pub async fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        let request = pb::XattrRequest {
            handle,
            name: name.to_vec(),
        };
        Ok(check(meta_call!(self, get_xattr, request))?.value)
    }

    pub async fn listxattr(&self, handle: Handle) -> Result<Vec<Vec<u8>>> {
        Ok(check(meta_call!(self, list_xattr, pb::HandleRequest { handle }))?.names)
    }

    pub async fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        let request = pb::XattrRequest {
            handle,
            name: name.to_vec(),
        };
        self.mutated(meta_call!(mutation placed, self, remove_xattr, request))
            .map(|_| ())
    }

    /// Makes every change the server answered so far durable.
    pub async fn sync(&self) -> Result<()> {
        check(meta_call!(self, sync, pb::Empty {})).map(|_| ())
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        let s = check(meta_call!(self, stat_fs, pb::Empty {}))?;
        Ok(StatFs {
            inodes: s.inodes,
            file_bytes: s.file_bytes,
            store_bytes: s.store_bytes,
            name_len_max: s.name_len_max,
            root_quota: s
                .root_quota
                .as_ref()
                .map(calm_proto::quota::report_from_wire)
                .transpose()?,
        })
    }
}

/// The request that makes `node` as `name` in `parent` (with the handle granted in advance it
/// names, if any; the server's times).
pub fn make_request(
    parent: Handle,
    name: &[u8],
    node: &NewNode,
    exclusive: bool,
    hold: bool,
) -> pb::MakeRequest {
    pb::MakeRequest {
        parent,
        name: name.to_vec(),
        kind: node.kind as u32,
        mode: node.mode,
        uid: node.uid,
        gid: node.gid,
        rdev: node.rdev,
        target: node.target.clone(),
        exclusive,
        mode_before_umask: node.mode_before_umask,
        hold,
        handle: node.granted.map_or(0, |granted| granted.handle),
        time_ns: 0,
    }
}
