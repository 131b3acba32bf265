//! Where a non-directory's names are, so that a change of its attributes can name the
//! directories it is in (watchers of those directories and of the subtrees above them get it).
//!
//! A file with one name keeps that name's directory in its inode's `parent` (a directory's
//! `parent` was always kept): nothing more is written than before. While a file has more than
//! one name, `L handle parent → count` keys list every directory holding names of it, with
//! how many (Lustre's link EA, as keys), and `parent` is one of them. Files made before
//! format 4 have `parent` 0 ("not known") until a rename gives a one-name file its directory;
//! the store's `Sparents_from` tells fsck which handles may be so.

use calm_store::{ReadTxn, WriteTxn};

use crate::layout::{Inode, links_key, links_key_parent, links_range};
use crate::outcome::Outcome;
use crate::types::{Handle, Kind};

fn count<R: ReadTxn + ?Sized>(view: &R, handle: Handle, parent: Handle) -> Outcome<u32> {
    Ok(match view.get(&links_key(handle, parent))? {
        Some(value) if value.len() == 4 => {
            u32::from_le_bytes(value.as_ref().try_into().expect("4 bytes"))
        }
        Some(value) => {
            return Err(crate::MetaError::Corrupt(format!(
                "links of {handle} in {parent}: {} bytes",
                value.len()
            ))
            .into());
        }
        None => 0,
    })
}

fn set<T: WriteTxn>(txn: &mut T, handle: Handle, parent: Handle, count: u32) -> Outcome<()> {
    let key = links_key(handle, parent);
    if count == 0 {
        txn.delete(&key)?;
    } else {
        txn.put(&key, &count.to_le_bytes())?;
    }
    Ok(())
}

fn add<T: WriteTxn>(txn: &mut T, handle: Handle, parent: Handle, delta: i64) -> Outcome<u32> {
    let now = (count(txn, handle, parent)? as i64 + delta).max(0) as u32;
    set(txn, handle, parent, now)?;
    Ok(now)
}

/// The directories holding the `L` keys of `handle`.
fn listed<R: ReadTxn + ?Sized>(view: &R, handle: Handle) -> Outcome<Vec<Handle>> {
    let (start, end) = links_range(handle);
    let mut parents = Vec::new();
    view.visit(&start, &end, &mut |key, _| {
        if let Some(parent) = links_key_parent(key) {
            parents.push(parent);
        }
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(parents)
}

fn clear<T: WriteTxn>(txn: &mut T, handle: Handle) -> Outcome<()> {
    for parent in listed(txn, handle)? {
        set(txn, handle, parent, 0)?;
    }
    Ok(())
}

/// `inode` (a non-directory; `nlink` already counts it) got a name in `dir`.
pub(crate) fn added<T: WriteTxn>(txn: &mut T, inode: &mut Inode, dir: Handle) -> Outcome<()> {
    debug_assert!(inode.kind != Kind::Dir);
    if inode.parent == 0 {
        return Ok(()); // made before format 4: where its other names are is not known
    }
    if inode.nlink == 2 {
        // Its first second name: the one it had is listed too.
        set(txn, inode.handle, inode.parent, 1)?;
    }
    add(txn, inode.handle, dir, 1)?;
    Ok(())
}

/// `inode` (a non-directory; `nlink` already without it) lost a name in `dir`.
pub(crate) fn removed<T: WriteTxn>(txn: &mut T, inode: &mut Inode, dir: Handle) -> Outcome<()> {
    debug_assert!(inode.kind != Kind::Dir);
    if inode.parent == 0 {
        return Ok(());
    }
    match inode.nlink {
        // It had one name, so no `L` keys.
        0 => inode.parent = 0,
        1 => {
            // Back to one name: its directory is the one still listed.
            add(txn, inode.handle, dir, -1)?;
            let left = listed(txn, inode.handle)?;
            clear(txn, inode.handle)?;
            inode.parent = left.first().copied().unwrap_or(0);
        }
        _ => {
            let now = add(txn, inode.handle, dir, -1)?;
            if inode.parent == dir && now == 0 {
                inode.parent = listed(txn, inode.handle)?.first().copied().unwrap_or(0);
            }
        }
    }
    Ok(())
}

/// A name of `inode` (a non-directory) moved from directory `from` to `to`.
pub(crate) fn moved<T: WriteTxn>(
    txn: &mut T,
    inode: &mut Inode,
    from: Handle,
    to: Handle,
) -> Outcome<()> {
    debug_assert!(inode.kind != Kind::Dir);
    if inode.nlink <= 1 {
        // One name: wherever it goes is where it is (a file made before format 4 learns
        // its directory here).
        inode.parent = to;
        return Ok(());
    }
    if inode.parent == 0 || from == to {
        return Ok(());
    }
    let left = add(txn, inode.handle, from, -1)?;
    add(txn, inode.handle, to, 1)?;
    if inode.parent == from && left == 0 {
        inode.parent = to;
    }
    Ok(())
}

/// The directories holding names of `inode`, each once, in no order (a directory: the one
/// holding it; none for the root, an orphan, or a file made before format 4 whose directory
/// is not known yet).
pub fn parents<R: ReadTxn + ?Sized>(view: &R, inode: &Inode) -> Outcome<Vec<Handle>> {
    if inode.parent == 0 || inode.handle == crate::ROOT {
        return Ok(Vec::new());
    }
    if inode.kind == Kind::Dir || inode.nlink <= 1 {
        return Ok(vec![inode.parent]);
    }
    listed(view, inode.handle)
}
