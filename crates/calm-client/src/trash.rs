//! `calm trash`: the whole trash listed page by page, what a restore or a purge of an entry
//! takes with it (a directory comes back before what was in it, and with it), done a level at a
//! time with many requests in flight, and the listing as a table or JSON lines.

use std::collections::{BTreeMap, HashMap};

use calm_proto::pb;

use crate::{Client, MetaError, Result};

/// Entries asked for per page.
const PAGE: u32 = 10_000;
/// Restores or purges in flight at once.
const IN_FLIGHT: usize = 64;

/// Every entry of the trash the caller may see, in handle order.
pub async fn list_all(client: &Client) -> Result<Vec<pb::TrashEntry>> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = client.trash_list(after, PAGE).await?;
        all.extend(page.entries);
        if page.next == 0 {
            return Ok(all);
        }
        after = page.next;
    }
}

/// What restoring entry `id` takes, level by level (each level after the one before it): the
/// directories above it that are in the trash too (from the top), the entry, then what was
/// removed from below it, a directory's level before its entries'.
pub fn restore_plan(entries: &[pb::TrashEntry], id: u64) -> Result<Vec<Vec<u64>>> {
    let by_handle: HashMap<u64, &pb::TrashEntry> = entries.iter().map(|e| (e.handle, e)).collect();
    let Some(entry) = by_handle.get(&id) else {
        return Err(MetaError::NotFound);
    };
    let mut above = Vec::new();
    let mut at = entry.parent;
    while let Some(dir) = by_handle.get(&at) {
        if above.contains(&dir.handle) || above.len() > entries.len() {
            break;
        }
        above.push(dir.handle);
        at = dir.parent;
    }
    let mut levels: Vec<Vec<u64>> = above.into_iter().rev().map(|h| vec![h]).collect();
    levels.extend(subtree_levels(entries, id));
    Ok(levels)
}

/// Entry `id` and, level by level, what was in the trash below it.
fn subtree_levels(entries: &[pb::TrashEntry], id: u64) -> Vec<Vec<u64>> {
    let mut children: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in entries {
        children.entry(e.parent).or_default().push(e.handle);
    }
    let mut levels = vec![vec![id]];
    let mut seen = std::collections::HashSet::from([id]);
    loop {
        let next: Vec<u64> = levels
            .last()
            .expect("one level at least")
            .iter()
            .flat_map(|h| children.get(h).into_iter().flatten().copied())
            .filter(|h| seen.insert(*h))
            .collect();
        if next.is_empty() {
            return levels;
        }
        levels.push(next);
    }
}

/// What purging entry `id` takes: it and what was in the trash below it.
pub fn purge_plan(entries: &[pb::TrashEntry], id: u64) -> Result<Vec<u64>> {
    if !entries.iter().any(|e| e.handle == id) {
        return Err(MetaError::NotFound);
    }
    Ok(subtree_levels(entries, id).into_iter().flatten().collect())
}

/// Runs `each` on every handle of a level at once (at most [`IN_FLIGHT`] in flight), level
/// after level; stops at the first level with a failure, returning the answers so far and it.
pub async fn run_levels<T, F, Fut>(
    client: &Client,
    levels: Vec<Vec<u64>>,
    each: F,
) -> (Vec<(u64, T)>, Option<(u64, MetaError)>)
where
    T: Send + 'static,
    F: Fn(Client, u64) -> Fut,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let mut done = Vec::new();
    for level in levels {
        let mut failed = None;
        for batch in level.chunks(IN_FLIGHT) {
            let mut tasks = tokio::task::JoinSet::new();
            for &handle in batch {
                let call = each(client.clone(), handle);
                tasks.spawn(async move { (handle, call.await) });
            }
            while let Some(joined) = tasks.join_next().await {
                match joined {
                    Ok((handle, Ok(answer))) => done.push((handle, answer)),
                    Ok((handle, Err(error))) => failed = failed.or(Some((handle, error))),
                    Err(error) => {
                        failed =
                            failed.or(Some((0, MetaError::Io(format!("a call failed: {error}")))))
                    }
                }
            }
        }
        if failed.is_some() {
            return (done, failed);
        }
    }
    (done, None)
}

fn kind_name(kind: u32) -> &'static str {
    match u8::try_from(kind).ok().and_then(calm_types::Kind::from_u8) {
        Some(calm_types::Kind::Dir) => "dir",
        Some(calm_types::Kind::File) => "file",
        Some(calm_types::Kind::Symlink) => "symlink",
        _ => "other",
    }
}

/// When it was removed, as `YYYY-MM-DD HH:MM:SS` UTC.
fn removed_at(time_ns: i64) -> String {
    let (date, time) = calm_changelog::text::utc(time_ns);
    format!("{} {}", date.replace('.', "-"), &time[..8])
}

/// The listing as a table: id, when removed (UTC), owner, kind, size, path.
pub fn lines(entries: &[pb::TrashEntry]) -> Vec<String> {
    let mut out = vec![format!(
        "{:>12}  {:<19}  {:>6}  {:<7}  {:>12}  PATH",
        "ID", "REMOVED (UTC)", "UID", "KIND", "BYTES"
    )];
    for e in entries {
        out.push(format!(
            "{:>12}  {:<19}  {:>6}  {:<7}  {:>12}  {}",
            e.handle,
            removed_at(e.deleted_ns),
            e.uid,
            kind_name(e.kind),
            e.size,
            String::from_utf8_lossy(&e.path)
        ));
    }
    out
}

/// One entry as a JSON line.
pub fn json(e: &pb::TrashEntry) -> String {
    serde_json::json!({
        "id": e.handle,
        "removed_ns": e.deleted_ns,
        "uid": e.uid,
        "gid": e.gid,
        "kind": kind_name(e.kind),
        "bytes": e.size,
        "parent": e.parent,
        "name": String::from_utf8_lossy(&e.name),
        "path": String::from_utf8_lossy(&e.path),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(handle: u64, parent: u64) -> pb::TrashEntry {
        pb::TrashEntry {
            handle,
            parent,
            ..pb::TrashEntry::default()
        }
    }

    #[test]
    fn a_restore_brings_the_directories_above_first_and_the_tree_below_after() {
        // 10 (in root) > 11 > {12 > 14, 13}; 20 alone.
        let entries = [
            entry(10, 1),
            entry(11, 10),
            entry(12, 11),
            entry(13, 11),
            entry(14, 12),
            entry(20, 1),
        ];
        assert_eq!(
            restore_plan(&entries, 12).unwrap(),
            vec![vec![10], vec![11], vec![12], vec![14]]
        );
        assert_eq!(
            restore_plan(&entries, 10).unwrap(),
            vec![vec![10], vec![11], vec![12, 13], vec![14]]
        );
        assert_eq!(restore_plan(&entries, 20).unwrap(), vec![vec![20]]);
        assert!(restore_plan(&entries, 99).is_err());
        let mut purged = purge_plan(&entries, 11).unwrap();
        purged.sort();
        assert_eq!(purged, vec![11, 12, 13, 14]);
    }
}
