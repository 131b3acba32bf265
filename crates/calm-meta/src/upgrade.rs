//! Upgrading a store: its names to format 8 (one key per name, by the hash of the name), and
//! its users', groups' and trees' usage to format 9 and again to 13 ([`usage`]).
//!
//! Up to format 7 a name had two keys: `D parent n name` (child, cookie, kind) and its readdir
//! index entry `D parent c cookie` (child, kind, name). Format 8 keeps one, `D parent h hash
//! name` (child, kind). The upgrade runs when a server opens an older store, before it serves
//! anything: it chooses the namespace's name hash key, then rewrites the names in transactions
//! of [`NAMES_PER_TXN_SHARED`] (a shared store, under etcd's 128 operations per transaction)
//! or [`NAMES_PER_TXN_LOCAL`] names. Each transaction is whole, and the old keys it removes are
//! exactly the ones whose new key it writes, so a server killed in the middle leaves a store
//! the next opening finishes (old and new keys never describe one name twice: an old name key
//! is removed in the transaction that writes its new key). The format field says 8 only once
//! every name is rewritten (the opening transaction, after this). Every server of the
//! namespace must run this build before one opens it (docs/design/store-layout.md).

use std::ops::ControlFlow;

use calm_store::{ReadTxn, Store, StoreError, WriteTxn};

use crate::error::{MetaError, Result};
use crate::layout::*;

/// Names rewritten per transaction on a shared store: three operations each (two deletes and a
/// put), under etcd's default 128 per transaction.
pub const NAMES_PER_TXN_SHARED: usize = 40;
/// Names rewritten per transaction on a local store.
pub const NAMES_PER_TXN_LOCAL: usize = 8192;

/// Brings the names of a store of format 1 to 7 to format 8; does nothing on a new or current
/// store. Returns how many names it rewrote.
pub fn names<S: Store>(store: &S) -> Result<u64> {
    let per_txn = if store.shared() {
        NAMES_PER_TXN_SHARED
    } else {
        NAMES_PER_TXN_LOCAL
    };
    names_in_steps(store, per_txn)
}

/// [`names`], `per_txn` names per transaction.
pub fn names_in_steps<S: Store>(store: &S, per_txn: usize) -> Result<u64> {
    let snap = store.snapshot()?;
    let Some(format) = snap.get(KEY_FORMAT)? else {
        return Ok(0);
    };
    if check_format(&format)? >= 8 {
        return Ok(0);
    }
    drop(snap);
    let names = retry(store, |txn| {
        if let Some(key) = txn.get(KEY_NAME_HASH)? {
            return NameHash::from_value(&key);
        }
        let key = crate::open::random_id();
        txn.put(KEY_NAME_HASH, &key)?;
        NameHash::from_value(&key)
    })?;
    let mut from = vec![TAG_DENTRY];
    let mut rewritten = 0;
    loop {
        let (next, done) = retry(store, |txn| step(txn, &names, &from, per_txn))?;
        rewritten += done;
        match next {
            Some(next) => from = next,
            None => break,
        }
    }
    if rewritten > 0 {
        tracing::info!(rewritten, "names upgraded to one key each (format 8)");
    }
    Ok(rewritten)
}

/// Rewrites up to `per_txn` old names from key `from` on; returns where to go on (`None`: every
/// name is done) and how many it rewrote.
fn step<T: WriteTxn>(
    txn: &mut T,
    names: &NameHash,
    from: &[u8],
    per_txn: usize,
) -> Result<(Option<Vec<u8>>, u64)> {
    let mut old: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut next = None;
    txn.visit(from, &[TAG_DENTRY + 1], &mut |key, value| {
        if key.len() < 10 || key[9] == SUB_ENTRY {
            return ControlFlow::Continue(());
        }
        if old.len() == per_txn {
            next = Some(key.to_vec());
            return ControlFlow::Break(());
        }
        old.push((key.to_vec(), value.to_vec()));
        ControlFlow::Continue(())
    })?;
    let mut rewritten = 0;
    for (key, value) in &old {
        let parent = key_handle(key).expect("10 bytes or more");
        match key[9] {
            SUB_INDEX_V7 => {
                txn.delete(key)?;
            }
            SUB_NAME_V7 => {
                let dentry = Dentry::decode_v7(value)?;
                txn.put(&names.entry_key(parent, &key[10..]), &dentry.encode())?;
                txn.delete(key)?;
                rewritten += 1;
            }
            other => {
                return Err(MetaError::Corrupt(format!(
                    "directory {parent}: key with unknown second tag {other:#04x}"
                )));
            }
        }
    }
    Ok((next, rewritten))
}

/// Runs `work` in a write transaction and commits it, again on a conflict with another server.
fn retry<S: Store, T>(store: &S, mut work: impl FnMut(&mut S::Txn<'_>) -> Result<T>) -> Result<T> {
    for _ in 0..crate::commit::CONFLICT_RETRIES_MAX {
        let mut txn = store.begin()?;
        let value = work(&mut txn)?;
        match txn.commit() {
            Ok(()) => return Ok(value),
            Err(StoreError::Conflict) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(MetaError::Busy(
        "upgrading the names: the store kept conflicting with other servers".into(),
    ))
}

/// Usage records written per transaction on a shared store (one operation each).
pub const USAGE_PER_TXN_SHARED: usize = 100;

/// Counts every user's, group's and limited tree's usage in a store of format 13 or older and
/// writes it (format 9 keeps it with every change, format 13 with the xattrs' bytes in it,
/// format 14 with the trash in its owners' and open files with no name in their trees'), after
/// saying in the records of orphans whose directory was removed that they count in no tree;
/// does nothing on a new or current store. Returns how many
/// usage records it wrote. Like the names' upgrade it runs before the server serves anything:
/// the count is one snapshot's, and a server killed in the middle leaves a store of the old
/// format, counted again whole by the next opening.
pub fn usage<S: Store>(store: &S) -> Result<u64> {
    let snap = store.snapshot()?;
    let Some(format) = snap.get(KEY_FORMAT)? else {
        return Ok(0);
    };
    if check_format(&format)? >= 14 {
        return Ok(0);
    }
    drop(snap);
    retry(store, |txn| orphans_of_removed_dirs(txn))?;
    let snap = store.snapshot()?;
    let counted: Vec<_> = crate::quota::count::everything(&snap)
        .map_err(MetaError::from)?
        .into_iter()
        .collect();
    drop(snap);
    let per_txn = if store.shared() {
        USAGE_PER_TXN_SHARED
    } else {
        NAMES_PER_TXN_LOCAL
    };
    for batch in counted.chunks(per_txn) {
        retry(store, |txn| {
            for (target, usage) in batch {
                txn.put(
                    &crate::quota::usage_key(*target),
                    &crate::quota::encode_usage(usage),
                )?;
            }
            Ok(())
        })?;
    }
    if !counted.is_empty() {
        tracing::info!(
            records = counted.len(),
            "users', groups' and trees' usage counted (format 14)"
        );
    }
    Ok(counted.len() as u64)
}

/// Orphan records whose directory is no longer in the namespace name directory 0 (format 14):
/// they count in no tree, and a restore of that directory does not make them count again.
fn orphans_of_removed_dirs<T: WriteTxn>(txn: &mut T) -> Result<()> {
    let mut records = Vec::new();
    txn.visit(
        &[crate::layout::TAG_ORPHAN],
        crate::layout::ORPHAN_END,
        &mut |key, value| {
            records.push((key.to_vec(), value.to_vec()));
            std::ops::ControlFlow::Continue(())
        },
    )?;
    for (key, value) in records {
        let Some(handle) = crate::layout::key_handle(&key) else {
            continue; // fsck says so
        };
        let Ok(mut record) = crate::layout::OrphanRecord::decode(&value) else {
            continue;
        };
        if record.tree_dir() == 0 || crate::ctx::orphan_tree_dir(txn, handle)? != 0 {
            continue;
        }
        if let Some(place) = &mut record.place {
            place.0 = 0;
        }
        txn.put(&key, &record.encode())?;
    }
    Ok(())
}
