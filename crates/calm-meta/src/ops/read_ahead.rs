//! What a group will read, planned before it is applied: on a shared store (etcd) the
//! committer reads a group's first keys, then what its entries name, in two requests instead
//! of one round trip per key.

use calm_store::ReadTxn;

use super::op::Op;
use crate::ctx::get_dentry;
use crate::layout::{NameHash, chunk_key, chunk_range, inode_key, xattr_range};
use crate::types::*;

/// The keys `op` reads before it can know of any other: its directories and their entries, or
/// the inode it changes. A group's committer fetches them for all its operations at once.
pub(crate) fn keys_read_first(op: &Op, names: &NameHash, keys: &mut Vec<Vec<u8>>) {
    let mut entry = |parent: Handle, name: &[u8]| {
        keys.push(inode_key(parent).to_vec());
        keys.push(names.entry_key(parent, name));
    };
    match op {
        Op::Make { parent, name, .. }
        | Op::Unlink { parent, name, .. }
        | Op::Rmdir { parent, name } => entry(*parent, name),
        Op::Link {
            handle,
            parent,
            name,
        } => {
            entry(*parent, name);
            keys.push(inode_key(*handle).to_vec());
        }
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => {
            entry(*parent, name);
            entry(*new_parent, new_name);
        }
        Op::SetAttr { handle, .. }
        | Op::SetXattr { handle, .. }
        | Op::RemoveXattr { handle, .. }
        | Op::Write { handle, .. }
        | Op::Append { handle, .. } => keys.push(inode_key(*handle).to_vec()),
        _ => {}
    }
}

/// What `op` reads once its entries are known (read ahead by [`keys_read_first`]): the inode
/// of a name it removes or moves, and the xattrs and chunks of one it may destroy. A group's
/// committer reads them for all its operations at once, as a second step.
pub(crate) fn reads_after_entries<R: ReadTxn>(
    view: &R,
    names: &NameHash,
    op: &Op,
    keys: &mut Vec<Vec<u8>>,
    ranges: &mut Vec<(Vec<u8>, Vec<u8>)>,
) {
    let mut named = |parent: Handle, name: &[u8], destroyed: bool| {
        // A name that is not there, or does not decode, is the operation's own error.
        let Ok(Some(dentry)) = get_dentry(view, names, parent, name) else {
            return;
        };
        keys.push(inode_key(dentry.child).to_vec());
        if destroyed {
            let (start, end) = xattr_range(dentry.child);
            ranges.push((start.to_vec(), end.to_vec()));
            if dentry.kind == Kind::File {
                let (_, end) = chunk_range(dentry.child);
                ranges.push((chunk_key(dentry.child, 0).to_vec(), end.to_vec()));
            }
        }
    };
    match op {
        Op::Unlink { parent, name, .. } | Op::Rmdir { parent, name } => named(*parent, name, true),
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => {
            named(*parent, name, false);
            named(*new_parent, new_name, true);
        }
        _ => {}
    }
}
