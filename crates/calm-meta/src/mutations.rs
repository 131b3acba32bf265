//! The namespace's mutations as calls: each one queued to the group committer and answered
//! once its group is durable.

use super::*;

impl<S: Store> Meta<S> {
    /// Creates a file, directory, symlink or special file named `name` in `parent`. With
    /// `exclusive` false and a regular file already there, returns it (open with O_CREAT).
    pub async fn make(
        &self,
        parent: Handle,
        name: &[u8],
        node: NewNode,
        exclusive: bool,
    ) -> Result<Attr> {
        self.submit_attr(Op::Make {
            parent,
            name: name.to_vec(),
            node,
            exclusive,
        })
        .await
    }

    pub async fn create(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, NewNode::file(mode, 0, 0), true)
            .await
    }

    pub async fn mkdir(&self, parent: Handle, name: &[u8], mode: u32) -> Result<Attr> {
        self.make(parent, name, NewNode::dir(mode, 0, 0), true)
            .await
    }

    pub async fn symlink(&self, parent: Handle, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.make(parent, name, NewNode::symlink(target, 0, 0), true)
            .await
    }

    /// A new name `name` in `parent` for the inode `handle`.
    pub async fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Attr> {
        self.submit_attr(Op::Link {
            handle,
            parent,
            name: name.to_vec(),
        })
        .await
    }

    pub async fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::Unlink {
            parent,
            name: name.to_vec(),
            keep: Vec::new(),
        })
        .await
    }

    /// Every orphan (a file open on a mount after its last name went) with the session that
    /// keeps it (see [`Meta::orphans`]).
    pub fn orphans(&self) -> Result<Vec<(Handle, u64)>> {
        self.blocking(|| ops::orphans::list(&self.store.snapshot()?))
    }

    /// Destroys orphan `handle` whatever its session (which ended).
    pub async fn release_orphan(&self, handle: Handle) -> Result<()> {
        self.submit_unit(Op::ReleaseOrphan {
            handle,
            any_session: true,
        })
        .await
    }

    pub async fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::Rmdir {
            parent,
            name: name.to_vec(),
        })
        .await
    }

    /// Renames with Linux's `renameat2` semantics; `flags` takes [`RENAME_NOREPLACE`] or
    /// [`RENAME_EXCHANGE`].
    pub async fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.submit_unit(Op::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
            keep: Vec::new(),
        })
        .await
    }

    pub async fn setattr(&self, handle: Handle, attr: SetAttr) -> Result<Attr> {
        self.submit_attr(Op::SetAttr { handle, attr }).await
    }

    /// Sets an xattr; `flags` takes [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub async fn setxattr(
        &self,
        handle: Handle,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.submit_unit(Op::SetXattr {
            handle,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        })
        .await
    }

    pub async fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        self.submit_unit(Op::RemoveXattr {
            handle,
            name: name.to_vec(),
        })
        .await
    }
}
