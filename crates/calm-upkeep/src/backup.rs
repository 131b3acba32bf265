//! Backups: the namespace's metadata dumped at one snapshot into a file, written into the
//! object store every few hours by a serving server (`--backup-every-hours`), beside the
//! objects under `backups/`, the oldest removed past `--backup-keep`; and a new store loaded
//! from a dump (`calm load`). The file format is `calm_meta::dump`'s; a dump streamed to an
//! administrator is the server's protection service's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use calm_data::Objects;
use calm_meta::Meta;
use calm_meta::dump::{self, DumpError, DumpResult, DumpSummary};
use calm_store::Store;

/// The directory of the object store that holds the metadata backups.
pub const BACKUP_DIR: &str = "backups";
/// What a backup's name begins and ends with: `metadata-YYYY-MM-DDTHH-MM-SSZ.calmdump`
/// (UTC), so that names sort by time.
pub const BACKUP_PREFIX: &str = "metadata-";
pub const BACKUP_SUFFIX: &str = ".calmdump";

/// When and how many backups a server makes and keeps.
#[derive(Debug, Clone)]
pub struct BackupPolicy {
    /// Time between two backups (the first one this long after the start).
    pub every: Duration,
    /// Backups kept in the object store; older ones are removed after each new one.
    pub keep: usize,
    /// A local directory for the dump while it is written, before it is uploaded.
    pub staging: PathBuf,
}

/// What the backups did, for status.
#[derive(Debug, Default)]
pub struct BackupStats {
    pub made: AtomicU64,
    pub failed: AtomicU64,
    /// When the last one was made (ms since the epoch; 0: none yet).
    pub last_ms: AtomicU64,
    pub last_bytes: AtomicU64,
}

/// Now, in nanoseconds since the epoch (a backup's name and a dump's stamp).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(i64::MAX as u128) as i64)
}

/// Writes the dump of the namespace in `store` as it is now (one snapshot, held readable for
/// as long as the dump takes) to `out`: a server's, a stopped server's, or etcd's.
pub fn dump_store<S: Store>(store: &S, out: &mut dyn Write) -> DumpResult<DumpSummary> {
    let _hold = store.hold_reads()?;
    let snapshot = store.snapshot()?;
    dump::dump(&snapshot, out, now_ns(), &mut |_| {})
}

/// [`dump_store`] of the store `meta` serves.
pub fn dump_namespace<S: Store>(meta: &Meta<S>, out: &mut dyn Write) -> DumpResult<DumpSummary> {
    dump_store(meta.store(), out)
}

/// The name of a backup made at `ns` since the epoch.
pub fn backup_name(ns: i64) -> String {
    // ("YYYY.MM.DD", "HH:MM:SS.nnnnnnnnn") in UTC.
    let (date, time) = calm_changelog::text::utc(ns);
    format!(
        "{BACKUP_PREFIX}{}T{}Z{BACKUP_SUFFIX}",
        date.replace('.', "-"),
        time[..8].replace(':', "-")
    )
}

/// Whether `name` is a backup's (what the removal of old ones may touch).
pub fn is_backup(name: &str) -> bool {
    name.starts_with(BACKUP_PREFIX) && name.ends_with(BACKUP_SUFFIX)
}

/// Makes one backup: the dump into a staging file, uploaded as a new backup, then the backups
/// beyond `policy.keep` removed, oldest first. Returns the new backup's name and what it holds.
pub async fn backup_once<S: Store>(
    meta: &Arc<Meta<S>>,
    objects: &Objects,
    policy: &BackupPolicy,
) -> Result<(String, DumpSummary, u64), String> {
    let name = backup_name(now_ns());
    let staging = policy.staging.join(format!(".{name}.partial"));
    let result = backup_through(meta, objects, policy, &name, &staging).await;
    let _ = std::fs::remove_file(&staging);
    result
}

async fn backup_through<S: Store>(
    meta: &Arc<Meta<S>>,
    objects: &Objects,
    policy: &BackupPolicy,
    name: &str,
    staging: &Path,
) -> Result<(String, DumpSummary, u64), String> {
    let summary = {
        let meta = meta.clone();
        let staging = staging.to_path_buf();
        tokio::task::spawn_blocking(move || write_dump_file(&meta, &staging))
            .await
            .map_err(|e| format!("the dump stopped: {e}"))?
            .map_err(|e| e.to_string())?
    };
    let bytes = objects
        .put_file(BACKUP_DIR, name, staging)
        .await
        .map_err(|e| format!("uploading {name}: {e}"))?;
    let backups = list_backups(objects).await?;
    let surplus = backups.len().saturating_sub(policy.keep.max(1));
    for old in &backups[..surplus] {
        objects
            .delete_file(BACKUP_DIR, &old.name)
            .await
            .map_err(|e| format!("removing the old backup {}: {e}", old.name))?;
    }
    Ok((name.to_string(), summary, bytes))
}

/// Writes the namespace's dump into the file `path`, on the medium when it returns.
pub fn write_dump_file<S: Store>(meta: &Meta<S>, path: &Path) -> DumpResult<DumpSummary> {
    let io = |what| move |error| DumpError::Io { what, error };
    // Created new and private: never through a link or into a file someone planted.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io("creating the dump's file"))?
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let summary = dump_namespace(meta, &mut out)?;
    let file = out.into_inner().map_err(|e| DumpError::Io {
        what: "writing the dump's file",
        error: e.into_error(),
    })?;
    file.sync_all().map_err(io("writing the dump's file"))?;
    Ok(summary)
}

/// A load checked before any store is made: the dump whole, the object stores reachable and
/// the copy's own one free.
#[allow(missing_debug_implementations)] // holds object stores
pub struct PreparedLoad {
    path: PathBuf,
    checked: DumpSummary,
    /// The dump's object store.
    from: Option<Objects>,
    /// The copy's own object store, when it has one.
    to: Option<Objects>,
    runtime: tokio::runtime::Runtime,
}

fn refused(what: &str, e: calm_data::DataError) -> DumpError {
    DumpError::Refused(format!("{what}: {e}"))
}

/// Checks the dump file `path` whole (a cut or damaged file changes nothing) and where its
/// contents are to be kept (`objects`), making no store.
pub fn prepare_load(path: &Path, objects: &LoadObjects) -> DumpResult<PreparedLoad> {
    let opened = std::fs::File::open(path).map_err(|error| DumpError::Io {
        what: "opening the dump",
        error,
    })?;
    let checked = dump::verify(std::io::BufReader::with_capacity(1 << 20, opened))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| DumpError::Io {
            what: "starting a runtime",
            error,
        })?;
    let dumped = || {
        let url = checked.objects_url.clone().ok_or_else(|| {
            DumpError::Refused("the dump names no object store for its files".into())
        })?;
        Objects::open_existing(&url).map_err(|e| refused(&url, e))
    };
    let (from, to) = match objects {
        LoadObjects::Own(url) => {
            // Checked before it is made: a refused load makes no directory.
            calm_data::ObjectsUrl::parse(url).map_err(|e| refused(url, e))?;
            let from = match checked.objects_url {
                Some(_) => Some(dumped()?),
                None => None,
            };
            let to = Objects::open(url).map_err(|e| refused(url, e))?;
            runtime
                .block_on(own_store_is_free(&to))
                .map_err(DumpError::Refused)?;
            (from, Some(to))
        }
        LoadObjects::TakeOver => (Some(dumped()?), None),
    };
    Ok(PreparedLoad {
        path: path.to_path_buf(),
        checked,
        from,
        to,
        runtime,
    })
}

/// Makes a new namespace in the empty `store` from a prepared load. The copy gets a claim on
/// its object store of its own; with a store of its own, the objects its files name are
/// copied there (and it is another namespace), else it takes the dump's over. Both happen
/// before the one transaction that makes the store whole. `progress` gets the entries
/// written so far.
pub fn load_dump_file<S: Store>(
    store: &S,
    load: PreparedLoad,
    progress: &mut dyn FnMut(u64),
) -> DumpResult<DumpSummary> {
    let PreparedLoad {
        path,
        checked,
        from,
        to,
        runtime,
    } = load;
    let mut open = || {
        std::fs::File::open(&path)
            .map(|file| std::io::BufReader::with_capacity(1 << 20, file))
            .map_err(|error| DumpError::Io {
                what: "opening the dump",
                error,
            })
    };
    let claim = calm_meta::random_id().to_vec();
    let mut replace = vec![(calm_meta::layout::KEY_OBJECTS_OWNER.to_vec(), claim.clone())];
    if let Some(to) = &to {
        replace.push((
            calm_meta::layout::KEY_OBJECTS.to_vec(),
            to.url().as_bytes().to_vec(),
        ));
        // Another namespace: a mount's caches of the original are not the copy's.
        replace.push((
            calm_meta::layout::KEY_NAMESPACE_ID.to_vec(),
            calm_meta::random_id().to_vec(),
        ));
    }
    let mut before_format = || -> DumpResult<()> {
        match (&from, &to) {
            (from, Some(to)) => {
                let named = calm_meta::data::referenced_objects(&store.snapshot()?)?.named;
                runtime.block_on(async {
                    if let Some(from) = from {
                        for &(id, size) in &named {
                            from.copy_slice(to, id, size)
                                .await
                                .map_err(|e| refused("copying the objects", e))?;
                        }
                    }
                    to.claim(&claim)
                        .await
                        .map_err(|e| refused("claiming the object store", e))
                })
            }
            (Some(from), None) => runtime
                .block_on(from.take_over(&claim))
                .map_err(|e| refused("taking over the object store", e)),
            (None, None) => Ok(()),
        }
    };
    let mut plan = dump::LoadPlan {
        txn: dump::load_txn(store),
        replace,
        progress,
        before_format: &mut before_format,
    };
    let loaded = dump::load_with(store, &mut open, &mut plan)?;
    debug_assert_eq!(loaded.pairs, checked.pairs);
    Ok(loaded)
}

/// Where a loaded store keeps its files' contents: never in an object store another live
/// namespace deletes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadObjects {
    /// An object store of its own, new or empty: the objects the dump's files name are copied
    /// there before the store is whole.
    Own(String),
    /// The dump's own object store, taken over: the namespace dumped (lost for good) deletes
    /// nothing more from it.
    TakeOver,
}

/// An object store a copy may take as its own: no objects, no owner.
async fn own_store_is_free(to: &Objects) -> Result<(), String> {
    let owner = to.owner().await.map_err(|e| format!("{}: {e}", to.url()))?;
    let listed = to.list().await.map_err(|e| format!("{}: {e}", to.url()))?;
    if owner.is_some() || !listed.is_empty() {
        return Err(format!(
            "{} holds another namespace's files ({} objects{}): a loaded copy's object store \
             must be new or empty",
            to.url(),
            listed.len(),
            if owner.is_some() { ", an owner" } else { "" }
        ));
    }
    Ok(())
}

/// The backups in the object store `objects_url`, oldest first.
pub async fn list_backups(objects: &Objects) -> Result<Vec<calm_data::named::NamedFile>, String> {
    let listed = objects
        .list_files(BACKUP_DIR)
        .await
        .map_err(|e| format!("listing the backups in {}: {e}", objects.url()))?;
    Ok(listed.into_iter().filter(|f| is_backup(&f.name)).collect())
}

/// Downloads the backup `name` (the newest when `None`) of `objects` into `to`, a new empty
/// file (`what` names it in errors); returns the backup's name.
pub async fn fetch_backup(
    objects: &Objects,
    name: Option<&str>,
    to: &mut tokio::fs::File,
    what: &Path,
) -> Result<String, String> {
    let name = match name {
        Some(name) => name.to_string(),
        None => list_backups(objects)
            .await?
            .pop()
            .map(|f| f.name)
            .ok_or_else(|| format!("{} holds no metadata backup", objects.url()))?,
    };
    objects
        .get_file(BACKUP_DIR, &name, to, what)
        .await
        .map_err(|e| format!("downloading the backup {name} from {}: {e}", objects.url()))?;
    Ok(name)
}

/// Removes the staging files of backups a killed server left in `dir`.
fn remove_stale_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix('.')
            && let Some(backup) = rest.strip_suffix(".partial")
            && is_backup(backup)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Makes a backup every `policy.every`, for as long as the task runs.
pub async fn run_backups<S: Store>(
    meta: Arc<Meta<S>>,
    objects: Objects,
    policy: BackupPolicy,
    stats: Arc<BackupStats>,
) {
    remove_stale_staging(&policy.staging);
    loop {
        tokio::time::sleep(policy.every).await;
        match backup_once(&meta, &objects, &policy).await {
            Ok((name, summary, bytes)) => {
                stats.made.fetch_add(1, Ordering::Relaxed);
                stats.last_bytes.store(bytes, Ordering::Relaxed);
                stats
                    .last_ms
                    .store((now_ns() / 1_000_000) as u64, Ordering::Relaxed);
                tracing::info!(
                    backup = %name,
                    inodes = summary.inodes,
                    bytes,
                    "metadata backup written to the object store"
                );
            }
            Err(error) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "the metadata backup failed; the next one is tried as planned");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_names_sort_by_time_and_read_as_dates() {
        assert_eq!(backup_name(0), "metadata-1970-01-01T00-00-00Z.calmdump");
        // 2026-11-29 19:01:02 UTC.
        assert_eq!(
            backup_name(1_795_978_862 * 1_000_000_000),
            "metadata-2026-11-29T19-01-02Z.calmdump"
        );
        assert_eq!(
            backup_name(951_782_400 * 1_000_000_000),
            "metadata-2000-02-29T00-00-00Z.calmdump"
        );
        let a = backup_name(1_795_978_862 * 1_000_000_000);
        let b = backup_name(1_795_978_863 * 1_000_000_000);
        assert!(a < b && is_backup(&a) && !is_backup("metadata-x.partial"));
    }
}
