//! What protects from a mistake, as calls: the trash (`crate::ops::trash`: listing it with the
//! path each entry had, restoring an entry, purging one) and clones (`crate::ops::clone`).

use std::collections::HashMap;

use super::*;
use crate::layout::{Dentry, TrashEntry, entries_range, trash_key};
use crate::ops::trash::Listed;

/// An entry of the trash with the path it had, as far as it is still known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrashListing {
    pub listed: Listed,
    /// From the root, `/` separated; a directory no longer known shows as `?`.
    pub path: Vec<u8>,
}

/// A page of the trash, and the handle the next one lists after (`None`: the end).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrashPage {
    pub entries: Vec<TrashListing>,
    pub next: Option<Handle>,
}

/// Bytes of names and paths a page of the trash holds (past it the page ends): well under
/// the 4 MiB a gRPC message may hold, whatever the names.
pub const TRASH_PAGE_BYTES_MAX: usize = 1 << 20;
/// What an entry's fixed fields count in a page.
const TRASH_ENTRY_BYTES: usize = 64;

/// Directories a path is followed up through at most.
const PATH_DEPTH_MAX: usize = 4096;

/// What an entry restored became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub attr: Attr,
    pub parent: Handle,
    pub name: Vec<u8>,
}

impl<S: Store> Meta<S> {
    /// Up to `max` (at most [`crate::ops::trash::LIST_ENTRIES_MAX`]) entries of the trash with
    /// a handle above `after`: every one for the superuser, the caller's own for anyone else.
    /// A page holds at most [`TRASH_PAGE_BYTES_MAX`] of names and paths, and reads at most
    /// [`crate::ops::trash::LIST_SCAN_MAX`] entries; `next` says where the following one
    /// begins.
    pub fn trash_list(&self, caller: &Caller, after: Handle, max: usize) -> Result<TrashPage> {
        let max = max.clamp(1, crate::ops::trash::LIST_ENTRIES_MAX);
        self.blocking(|| {
            let snap = self.store.snapshot()?;
            let uid = (!caller.is_root()).then_some(caller.uid);
            let (listed, mut next) = crate::ops::trash::list(&snap, after, max, uid)?;
            let mut names = HashMap::new();
            let mut entries = Vec::with_capacity(listed.len());
            let mut bytes = 0;
            for listed in listed {
                if bytes >= TRASH_PAGE_BYTES_MAX {
                    next = entries.last().map(|e: &TrashListing| e.listed.handle);
                    break;
                }
                let path = path_of(&snap, &listed.entry, &mut names)?;
                bytes += TRASH_ENTRY_BYTES + listed.entry.name.len() + path.len();
                entries.push(TrashListing { listed, path });
            }
            Ok(TrashPage { entries, next })
        })
    }

    /// Names entry `handle` of the trash again (the module `crate::ops::trash` says where).
    pub async fn trash_restore(&self, caller: Caller, handle: Handle) -> Result<Restored> {
        match self.apply_as(caller, Op::TrashRestore { handle }).await? {
            Done::Restored { attr, parent, name } => Ok(Restored { attr, parent, name }),
            other => unreachable!("a restore answers with what it named, not {other:?}"),
        }
    }

    /// Destroys entry `handle` of the trash, its objects queued for deletion.
    pub async fn trash_purge(&self, caller: Caller, handle: Handle) -> Result<()> {
        let op = Op::TrashPurge {
            handle,
            removed_at: None,
        };
        self.apply_as(caller, op).await.map(|_| ())
    }
}

/// The path `entry` had: the names of the directories above it, live or in the trash.
fn path_of<R: ReadTxn>(
    snap: &R,
    entry: &TrashEntry,
    names: &mut HashMap<Handle, Option<(Handle, Vec<u8>)>>,
) -> Result<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = vec![entry.name.clone()];
    let mut at = entry.parent;
    for _ in 0..PATH_DEPTH_MAX {
        if at == ROOT {
            break;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = names.entry(at) {
            slot.insert(name_of(snap, at)?);
        }
        match &names[&at] {
            Some((parent, name)) => {
                parts.push(name.clone());
                at = *parent;
            }
            None => {
                parts.push(b"?".to_vec());
                break;
            }
        }
    }
    let mut path = Vec::new();
    for part in parts.iter().rev() {
        path.push(b'/');
        path.extend_from_slice(part);
    }
    Ok(path)
}

/// The directory above directory `dir` and `dir`'s name in it; `None` when `dir` is gone.
fn name_of<R: ReadTxn>(snap: &R, dir: Handle) -> Result<Option<(Handle, Vec<u8>)>> {
    if let Some(value) = snap.get(&trash_key(dir))? {
        let entry = TrashEntry::decode(&value)?;
        return Ok(Some((entry.parent, entry.name)));
    }
    let inode = match crate::ctx::load(snap, dir) {
        Ok(inode) if inode.kind == Kind::Dir => inode,
        Ok(_) | Err(crate::outcome::Failure::Meta(MetaError::NotFound)) => return Ok(None),
        Err(other) => return Err(other.into()),
    };
    let (start, end) = entries_range(inode.parent);
    let mut found = None;
    let mut failed = None;
    snap.visit(
        &start,
        &end,
        &mut |key, value| match Dentry::decode(value) {
            Ok(dentry) if dentry.child == dir => {
                found = crate::layout::entry_key_parts(key).map(|(_, _, name)| name.to_vec());
                ControlFlow::Break(())
            }
            Ok(_) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        },
    )?;
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(found.map(|name| (inode.parent, name)))
}

/// What one request of a tree's clone did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClonedEntries {
    /// Subdirectories made, each with its source: to be cloned in turn.
    pub dirs: Vec<(Handle, Handle)>,
    /// Where the next request goes on in the source directory (`None`: it is done).
    pub next: Option<Vec<u8>>,
    pub entries: u64,
}

impl<S: Store> Meta<S> {
    /// Clones node `src` as `name` in `parent` (a directory empty: [`Meta::clone_entries`]
    /// fills it), sharing its objects (`crate::ops::clone` says who may and who owns it).
    pub async fn clone_node(
        &self,
        caller: Caller,
        src: Handle,
        parent: Handle,
        name: &[u8],
    ) -> Result<Attr> {
        let op = Op::Clone {
            src,
            parent,
            name: name.to_vec(),
        };
        match self.apply_as(caller, op).await? {
            Done::Attr(attr) => Ok(attr),
            other => unreachable!("a clone answers with the copy's attributes, not {other:?}"),
        }
    }

    /// Clones up to `max` entries of directory `src` (after its name key `after`) into `dst`;
    /// fewer on a shared store, whose transactions are small.
    pub async fn clone_entries(
        &self,
        caller: Caller,
        src: Handle,
        dst: Handle,
        after: Vec<u8>,
        max: usize,
    ) -> Result<ClonedEntries> {
        let limit = match self.shared {
            true => crate::ops::clone::CLONE_ENTRIES_SHARED_MAX,
            false => crate::ops::clone::CLONE_ENTRIES_MAX,
        };
        let op = Op::CloneEntries {
            src,
            dst,
            after,
            max: max.clamp(1, limit) as u32,
        };
        match self.apply_as(caller, op).await? {
            Done::Cloned {
                dirs,
                next,
                entries,
            } => Ok(ClonedEntries {
                dirs,
                next,
                entries,
            }),
            other => unreachable!("a clone of entries answers what it made, not {other:?}"),
        }
    }
}
