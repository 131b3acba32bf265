//! Work on a namespace's store outside a server: the verifier with the object check (`calm
//! fsck`), and the collection of objects no file names any more (`calm gc`). The caller opens
//! the store (a stopped server's data directory read-only, or one revision of etcd) and prints
//! the reports; the checks, the deletions and the reports' text are here.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use calm_data::Objects;
use calm_data::audit::{Audit, audit, delete_leaked, stale_unfinished};
use calm_data::local::Unfinished;
use calm_meta::MetaError;
use calm_meta::fsck::{self, FsckReport};
use calm_store::{Store, StoreError};

/// Why an offline check or collection could not run.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("reading the store: {0}")]
    Store(#[from] StoreError),
    #[error("reading the namespace: {0}")]
    Namespace(#[from] MetaError),
    #[error("this namespace names no object store")]
    NoObjectStore,
    #[error("object store {url}: {reason}")]
    Objects { url: String, reason: String },
}

fn objects_error(url: &str, reason: impl std::fmt::Display) -> OfflineError {
    OfflineError::Objects {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn runtime() -> Result<tokio::runtime::Runtime, OfflineError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| OfflineError::Store(StoreError::Io(e.to_string())))
}

/// The audit of the store's objects against its metadata: objects modified more than
/// `grace_ms` ago that no slice names are leaks.
pub fn audit_objects<S: Store>(store: &S, grace_ms: i64) -> Result<(Objects, Audit), OfflineError> {
    let snapshot = store.snapshot()?;
    let url = calm_meta::data::objects_url(&snapshot)?.ok_or(OfflineError::NoObjectStore)?;
    let referenced = calm_meta::data::referenced_objects(&snapshot)?;
    let owner = calm_meta::data::objects_owner(&snapshot)?;
    drop(snapshot);
    let referenced = merged(&referenced);
    let objects = Objects::open(&url).map_err(|e| objects_error(&url, e))?;
    // Deletes only from an object store that is still this namespace's.
    let objects = match owner {
        Some(claim) => objects.fenced(claim),
        None => objects,
    };
    let listed = runtime()?
        .block_on(objects.list())
        .map_err(|e| objects_error(&url, format!("listing: {e}")))?;
    Ok((objects, audit(&referenced, &listed, now_ms(), grace_ms)))
}

/// The named and the queued objects as one list, sorted by id.
pub(crate) fn merged(
    referenced: &calm_meta::data::Referenced,
) -> Vec<calm_data::audit::Referenced> {
    let entry = |queued_only| {
        move |&(id, size): &(u64, u32)| calm_data::audit::Referenced {
            id,
            size,
            queued_only,
        }
    };
    let mut all: Vec<_> = (referenced.named.iter().map(entry(false)))
        .chain(referenced.queued.iter().map(entry(true)))
        .collect();
    all.sort_unstable();
    all
}

/// The object check's problems, each a sentence: blocks named but missing or of another length.
pub fn object_problems(report: &Audit) -> Vec<String> {
    let mut out = Vec::new();
    for (id, block) in &report.missing {
        out.push(format!("block {block} of slice {id} is named but missing"));
    }
    for (id, block, len, want) in &report.wrong_length {
        out.push(format!(
            "block {block} of slice {id} is {len} bytes long, not {want}"
        ));
    }
    out
}

/// What `calm gc` found, and deleted when asked.
#[derive(Debug)]
pub struct GcReport {
    pub url: String,
    pub audit: Audit,
    /// Staging files of writes that died before their rename, older than the grace period.
    pub unfinished: Vec<Unfinished>,
    pub grace_s: u64,
    /// Whether deleting was asked for, and what was deleted.
    pub delete: bool,
    pub deleted: u64,
    pub unfinished_deleted: u64,
}

impl GcReport {
    pub fn unfinished_bytes(&self) -> u64 {
        self.unfinished.iter().map(|u| u.len).sum()
    }

    /// The report as text for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let (report, grace_s) = (&self.audit, self.grace_s);
        let mut out = vec![
            format!(
                "{} objects ({:.1} MB) in {}; {} slices named by the metadata, {} of them \
                 only queued for deletion ({} of their objects gone already)",
                report.objects,
                report.bytes as f64 / 1e6,
                self.url,
                report.referenced,
                report.queued,
                report.queued_gone
            ),
            format!(
                "{} leaked objects ({:.1} MB) older than {grace_s} s; {} younger left alone",
                report.leaked.len(),
                report.leaked_bytes() as f64 / 1e6,
                report.young
            ),
        ];
        for object in report.leaked.iter().take(20) {
            out.push(format!(
                "  slice {} block {} ({} bytes)",
                object.id, object.block, object.len
            ));
        }
        out.push(format!(
            "{} unfinished writes ({:.1} MB) older than {grace_s} s (staging files of writes \
             that died before their rename)",
            self.unfinished.len(),
            self.unfinished_bytes() as f64 / 1e6
        ));
        if self.delete {
            out.push(format!(
                "deleted {} objects and {} unfinished writes",
                self.deleted, self.unfinished_deleted
            ));
        } else if !report.leaked.is_empty() || !self.unfinished.is_empty() {
            out.push("(calm gc --delete removes them)".to_string());
        }
        for problem in object_problems(report) {
            out.push(format!(
                "PROBLEM: {problem} (calm fsck --objects reports it)"
            ));
        }
        out
    }
}

/// Finds the objects no file names, older than `grace_s`, and the stale staging files of
/// writes that died; with `delete`, deletes both.
pub fn collect_garbage<S: Store>(
    store: &S,
    grace_s: u64,
    delete: bool,
) -> Result<GcReport, OfflineError> {
    let grace_ms = (grace_s.min(i64::MAX as u64 / 1000) * 1000) as i64;
    let (objects, audit) = audit_objects(store, grace_ms)?;
    let url = objects.url().to_string();
    let runtime = runtime()?;
    let unfinished = stale_unfinished(
        runtime
            .block_on(objects.unfinished())
            .map_err(|e| objects_error(&url, format!("listing unfinished writes: {e}")))?,
        now_ms(),
        grace_ms,
    );
    let (mut deleted, mut unfinished_deleted) = (0, 0);
    if delete {
        deleted = runtime
            .block_on(delete_leaked(&objects, &audit))
            .map_err(|e| objects_error(&url, format!("deleting leaked objects: {e}")))?;
        for u in &unfinished {
            runtime
                .block_on(objects.delete_unfinished(u))
                .map_err(|e| objects_error(&url, format!("deleting an unfinished write: {e}")))?;
            unfinished_deleted += 1;
        }
    }
    Ok(GcReport {
        url,
        audit,
        unfinished,
        grace_s,
        delete,
        deleted,
        unfinished_deleted,
    })
}

/// What `calm fsck` found.
#[derive(Debug)]
pub struct CheckReport {
    pub fsck: FsckReport,
    /// The object check, when asked for.
    pub audit: Option<Audit>,
    /// The store's size, and how long the check took.
    pub store_bytes: u64,
    pub seconds: f64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.fsck.is_clean()
    }

    pub fn mb_per_s(&self) -> f64 {
        self.store_bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }

    /// The report as text for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = self.findings();
        if let Some((index, count)) = self.fsck.membership.cluster() {
            out.push(format!(
                "this store is cluster {index} of {count} of its namespace, checked alone: give \
                 every cluster's store, cluster 0 first, to check them as one namespace"
            ));
        }
        out.extend(self.verdict());
        out
    }

    /// What was read and counted.
    fn findings(&self) -> Vec<String> {
        let report = &self.fsck;
        let mut out = vec![
            format!(
                "read {} keys ({:.1} MB of keys and values, store file {:.1} MB) in {:.3} s: {:.0} MB/s",
                report.keys,
                report.bytes_read as f64 / 1e6,
                self.store_bytes as f64 / 1e6,
                self.seconds,
                self.mb_per_s()
            ),
            format!(
                "{} inodes ({} directories), {} names, {} xattrs, handle high-water mark {}",
                report.inodes,
                report.directories,
                report.dentries,
                report.xattrs,
                report.handle_high_water
            ),
            format!(
                "changelog: {} records stored, {} readers",
                report.changelog_records, report.changelog_readers
            ),
            format!(
                "file contents: {} chunks, {} slice records (at most {} in a chunk), {} inline slices",
                report.chunks,
                report.slice_records,
                report.slice_records_per_chunk_max,
                report.inline_slices
            ),
        ];
        if let Some(audit) = &self.audit {
            out.push(format!(
                "object store: {} objects ({:.1} MB), {} slices named, every one checked",
                audit.objects,
                audit.bytes as f64 / 1e6,
                audit.referenced
            ));
        }
        out
    }

    /// "clean", or the problems.
    fn verdict(&self) -> Vec<String> {
        let report = &self.fsck;
        let mut out = Vec::new();
        if report.is_clean() {
            out.push("clean".to_string());
        } else {
            out.push(format!("DAMAGED: {} problems", report.problem_count));
            for problem in &report.problems {
                out.push(format!("  - {problem}"));
            }
            if report.problem_count > report.problems.len() as u64 {
                out.push(format!(
                    "  … and {} more",
                    report.problem_count - report.problems.len() as u64
                ));
            }
        }
        out
    }
}

/// Reads one snapshot of `store` once in key order and checks it (`progress` gets the bytes
/// read so far); with `objects`, also every object the metadata names, whole.
pub fn check<S: Store>(
    store: &S,
    objects: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<CheckReport, OfflineError> {
    let store_bytes = store.size_bytes()?;
    let started = Instant::now();
    let snapshot = store.snapshot()?;
    let mut report = fsck::check(&snapshot, progress)?;
    drop(snapshot);
    let audit = if objects {
        // Every object named must be there, whole; unnamed ones are gc's business.
        let (_, audit) = audit_objects(store, i64::MAX)?;
        for problem in object_problems(&audit) {
            report.add_problem(problem);
        }
        Some(audit)
    } else {
        None
    };
    Ok(CheckReport {
        fsck: report,
        audit,
        store_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What `calm fsck` found in a namespace over several clusters' stores: each cluster's report,
/// and the problems of the clusters as one namespace (`calm_meta::fsck::check_clusters`).
#[derive(Debug)]
pub struct ClustersReport {
    pub clusters: Vec<CheckReport>,
    pub problems: Vec<String>,
}

impl ClustersReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.clusters.iter().all(CheckReport::is_clean)
    }

    /// The namespace's inodes and names: every cluster's, the root once.
    pub fn inodes_and_names(&self) -> (u64, u64) {
        let reports = self.clusters.iter().map(|c| &c.fsck);
        let inodes: u64 = reports.clone().map(|r| r.inodes).sum();
        let names = reports.map(|r| r.dentries).sum();
        let roots = self.clusters.len().saturating_sub(1) as u64;
        (inodes.saturating_sub(roots), names)
    }

    /// The report as text for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (index, cluster) in self.clusters.iter().enumerate() {
            out.push(format!("cluster {index}:"));
            let lines = cluster.findings().into_iter().chain(cluster.verdict());
            out.extend(lines.map(|line| format!("  {line}")));
        }
        let (inodes, names) = self.inodes_and_names();
        out.push(format!(
            "namespace over {} clusters: {inodes} inodes, {names} names",
            self.clusters.len()
        ));
        if self.is_clean() {
            out.push("clean".to_string());
        } else {
            let damaged = self.clusters.iter().filter(|c| !c.is_clean()).count();
            out.push(format!(
                "DAMAGED: {damaged} of {} clusters, and {} problems of the clusters as one \
                 namespace",
                self.clusters.len(),
                self.problems.len()
            ));
            out.extend(self.problems.iter().map(|p| format!("  - {p}")));
        }
        out
    }
}

/// Checks each of `stores`, the clusters of one namespace given cluster 0 first, as [`check`]
/// does one store (`progress` gets the cluster and the bytes read of it so far), then the
/// clusters as one namespace. Each cluster is read at a moment of its own: nothing refers from
/// one cluster to another, and what is compared between them never changes.
pub fn check_clusters<S: Store>(
    stores: &[S],
    objects: bool,
    progress: &mut dyn FnMut(usize, u64),
) -> Result<ClustersReport, OfflineError> {
    let mut clusters = Vec::with_capacity(stores.len());
    for (index, store) in stores.iter().enumerate() {
        clusters.push(check(store, objects, &mut |read| progress(index, read))?);
    }
    let members: Vec<_> = clusters.iter().map(|c| c.fsck.membership.clone()).collect();
    Ok(ClustersReport {
        problems: fsck::check_clusters(&members),
        clusters,
    })
}
