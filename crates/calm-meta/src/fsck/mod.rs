//! Offline verification of a namespace store, in one sequential pass over the whole keyspace.
//!
//! The families arrive in key order `D`, `I`, `N`, `S`, `X`, and each check is a merge of the
//! current family against what earlier ones left behind, sorted the way it needs:
//! - `D` (by directory, its names by hash): each name's key carries the hash of its name;
//!   compact rows (parent, child, kind) and per-directory counts are kept for later;
//! - `I` (inodes, by handle): merged with the rows sorted by child and with the per-directory
//!   counts: every name points to a live inode of its kind, link counts match, every
//!   directory has one name and the right parent, no inode is an orphan;
//! - `N`, `S`: counters and superblock, checked against what was counted; every handle is below
//!   the high-water mark;
//! - `X` (xattrs, by handle): each belongs to a live inode;
//! - `L` (where the names of multi-link files are, by handle and directory): exactly the
//!   directories and counts the names gave, and a non-directory's `parent` is one of its
//!   names' directories (0 only for one made before format 4: below `Sparents_from`).
//!
//! - quotas (`A` usage, `B` limits): after the pass, every usage kept is the usage counted from
//!   the inodes (users, groups) and the names (trees with a limit).
//!
//! Memory is about 24 bytes per name. Nothing here
//! does I/O of its own: the caller passes a snapshot and a progress callback.

use std::ops::ControlFlow;

use calm_store::{ReadTxn, decode_counter};

use crate::error::Result;
use crate::layout::*;
use crate::types::{Handle, Kind, ROOT};

mod changelog;
mod clusters;
mod contents;
mod inodes;
mod names;
mod quota;

pub use clusters::{Membership, RootOwner, check_clusters};

/// Problems listed in full in a report; beyond it only counted.
pub const PROBLEMS_LISTED_MAX: usize = 1000;

/// What fsck found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    pub keys: u64,
    /// Bytes of keys and values read.
    pub bytes_read: u64,
    pub inodes: u64,
    pub directories: u64,
    pub dentries: u64,
    pub xattrs: u64,
    /// File chunks, and the slice records they hold.
    pub chunks: u64,
    pub slice_records: u64,
    /// The most records one chunk holds.
    pub slice_records_per_chunk_max: u64,
    /// Inline slices' bytes (`K`).
    pub inline_slices: u64,
    pub changelog_records: u64,
    pub changelog_readers: u64,
    pub handle_high_water: u64,
    /// Files kept open on a mount after their last name went.
    pub orphans: u64,
    /// Entries of the trash, and the bytes of its files.
    pub trash_entries: u64,
    pub trash_bytes: u64,
    /// The first [`PROBLEMS_LISTED_MAX`] problems, each a sentence.
    pub problems: Vec<String>,
    /// All problems found, listed or not.
    pub problem_count: u64,
    /// What the store says of its namespace, for the check over several clusters.
    pub membership: Membership,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problem_count == 0
    }

    /// Adds a problem found by a check outside the store (the object store's).
    pub fn add_problem(&mut self, text: String) {
        self.problem(text);
    }

    fn problem(&mut self, text: String) {
        self.problem_count += 1;
        if self.problems.len() < PROBLEMS_LISTED_MAX {
            self.problems.push(text);
        }
    }
}

/// One name, compactly.
#[derive(Debug, Clone, Copy)]
struct Row {
    parent: Handle,
    child: Handle,
    kind: Kind,
}

/// Entries and subdirectories counted under one parent.
#[derive(Debug, Clone, Copy)]
struct DirCount {
    parent: Handle,
    entries: u64,
    subdirs: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Phase {
    Dentries,
    Inodes,
    After,
}

struct Checker {
    report: FsckReport,
    /// First and last changelog index seen.
    cl_range: Option<(u64, u64)>,
    cl_users: Vec<calm_changelog::User>,
    phase: Phase,
    rows: Vec<Row>,
    counts: Vec<DirCount>,
    /// The namespace's name hash (`None`: its key is missing or corrupt, reported once).
    names: Option<NameHash>,
    /// Merge cursors into `rows` and `counts`.
    row_at: usize,
    count_at: usize,
    /// Live inodes, in handle order (for the xattr merge).
    live: Vec<Handle>,
    live_at: usize,
    max_handle: Handle,
    file_bytes: u64,
    counters: Vec<(Vec<u8>, u64)>,
    format: Option<Vec<u8>>,
    root_seen: bool,
    /// `Splace`, and the clusters whose handle ranges the inodes (but the root) came from: a
    /// store's inodes are all of its own cluster's range (`crate::place`).
    place: Option<Vec<u8>>,
    handle_clusters: std::collections::BTreeSet<usize>,
    /// Orphan records (`H`), and whether their inode was seen.
    orphans: std::collections::BTreeMap<Handle, bool>,
    /// Entries of the trash (`E`): each one's size then, and whether its inode was seen.
    trashed: std::collections::BTreeMap<Handle, (u64, bool)>,
    /// The `L` keys the names of multi-link files call for, `(handle, directory, count)` in
    /// key order, and the merge cursor into them.
    links_expected: Vec<(Handle, Handle, u32)>,
    links_at: usize,
    /// The highest named non-directory with no parent recorded, and `Sparents_from`.
    unparented_max: Option<Handle>,
    parents_from: u64,
    /// Inline slices the chunks name, with their length, until their bytes (`K`) are seen.
    inline_named: std::collections::HashMap<u64, u32>,
    /// Objects of the deletion queue (`G`, before the chunks): none may be named by a record.
    queued: std::collections::HashSet<u64>,
    /// Objects an online gc collected (`C`): no record may name one.
    collected: std::collections::HashSet<u64>,
    /// Directories marked with a default ACL, and whether its `X` key was seen.
    default_acls: std::collections::BTreeMap<Handle, bool>,
}

impl Checker {
    fn enter(&mut self, phase: Phase) {
        while self.phase < phase {
            match self.phase {
                Phase::Dentries => {
                    self.rows.sort_unstable_by_key(|r| (r.child, r.parent));
                    self.row_at = 0;
                    self.count_at = 0;
                    self.phase = Phase::Inodes;
                }
                Phase::Inodes => {
                    for row in &self.rows[self.row_at..] {
                        self.report.problem(format!(
                            "dentry in directory {} points to handle {}, which is not a live inode",
                            row.parent, row.child
                        ));
                    }
                    for count in &self.counts[self.count_at..] {
                        self.report.problem(format!(
                            "handle {} holds {} entries but is not a live inode",
                            count.parent, count.entries
                        ));
                    }
                    self.phase = Phase::After;
                }
                Phase::After => unreachable!(),
            }
        }
    }

    fn pair(&mut self, key: &[u8], value: &[u8]) {
        self.report.keys += 1;
        self.report.bytes_read += (key.len() + value.len()) as u64;
        match key[0] {
            TAG_DENTRY => self.dentry(key, value),
            TAG_INODE => {
                self.enter(Phase::Inodes);
                self.inode(key, value);
            }
            TAG_COUNTER => {
                self.enter(Phase::After);
                match decode_counter(key, value) {
                    Ok(n) => self.counters.push((key.to_vec(), n)),
                    Err(e) => self.report.problem(format!("counter: {e}")),
                }
            }
            TAG_SUPER => {
                self.enter(Phase::After);
                if key == KEY_FORMAT {
                    self.format = Some(value.to_vec());
                } else if key == KEY_HWM {
                    match decode_counter(key, value) {
                        Ok(n) => self.report.handle_high_water = n,
                        Err(e) => self.report.problem(format!("high-water mark: {e}")),
                    }
                } else if key == KEY_PLACE {
                    // Read before the scan (`check`): the names of the root need it.
                } else if key == KEY_PARENTS_FROM {
                    match decode_counter(key, value) {
                        Ok(n) => self.parents_from = n,
                        Err(e) => self.report.problem(format!("parents-from mark: {e}")),
                    }
                } else if key != KEY_EPOCH
                    && key != KEY_OBJECTS
                    && key != KEY_OBJECTS_OWNER
                    && key != KEY_NAMESPACE_ID
                    && key != KEY_NAME_HASH
                    && key != KEY_PLACE
                {
                    self.report.problem(format!(
                        "unknown superblock field {:?}",
                        String::from_utf8_lossy(key)
                    ));
                }
            }
            TAG_XATTR => {
                self.enter(Phase::After);
                self.xattr(key, value);
            }
            TAG_CHUNK => {
                self.enter(Phase::After);
                self.chunk(key, value);
            }
            TAG_INLINE => {
                self.enter(Phase::After);
                self.inline(key, value);
            }
            TAG_LINKS => {
                self.enter(Phase::After);
                self.links_key(key, value);
            }
            // The deletion queue and the shared-object counts name objects, not inodes: they
            // may sit between the names and the inodes, so they leave the phase as it is.
            TAG_GC => match gc_key_parts(key).filter(|_| value.len() == 4) {
                Some((_, id)) => {
                    self.queued.insert(id);
                }
                None => self
                    .report
                    .problem(format!("deletion queue entry {key:?} does not decode")),
            },
            TAG_COLLECTED => match key_handle(key).filter(|_| key.len() == 9 && value.len() == 8) {
                Some(id) if crate::slices::is_object(id) => {
                    self.collected.insert(id);
                }
                _ => self
                    .report
                    .problem(format!("collected object mark {key:?} does not decode")),
            },
            // Before the inodes, so that an orphan's inode (no name) is known to be one.
            TAG_ORPHAN => match key_handle(key)
                .filter(|_| key.len() == 9 && (value.len() == 8 || value.len() > 16))
            {
                Some(handle) => {
                    self.orphans.insert(handle, false);
                }
                None => self
                    .report
                    .problem(format!("orphan record {key:?} does not decode")),
            },
            // Before the inodes too: an entry's inode has no name.
            TAG_TRASH => match (
                key_handle(key).filter(|_| key.len() == 9),
                TrashEntry::decode(value),
            ) {
                (Some(handle), Ok(entry)) => {
                    self.report.trash_entries += 1;
                    self.report.trash_bytes += entry.size;
                    self.trashed.insert(handle, (entry.size, false));
                }
                _ => self
                    .report
                    .problem(format!("trash entry {key:?} does not decode")),
            },
            TAG_REQUEST => {
                if key.len() != 17 || crate::requests::decode(value).is_none() {
                    self.report
                        .problem(format!("request record {key:?} does not decode"));
                }
            }
            TAG_REF => {
                if key.len() != 9 || decode_counter(key, value).map_or(true, |n| n < 2) {
                    self.report
                        .problem(format!("shared object count {key:?} does not decode"));
                }
            }
            TAG_CL_USER => {
                self.enter(Phase::After);
                match cl_user_id(key).and_then(|id| calm_changelog::User::decode(id, value)) {
                    Some(user) => self.cl_users.push(user),
                    None => self
                        .report
                        .problem(format!("changelog reader key {key:?} does not decode")),
                }
            }
            crate::ops::grants::TAG_GRANT => {
                let record = crate::ops::grants::GrantRecord::decode(value);
                match record.filter(|_| key.len() == 17) {
                    Some(grant) if grant.end <= self.report.handle_high_water => {}
                    Some(grant) => self.report.problem(format!(
                        "handles granted up to {} above the high-water mark {}",
                        grant.end, self.report.handle_high_water
                    )),
                    None => self
                        .report
                        .problem(format!("grant of handles {key:?} does not decode")),
                }
            }
            // Quotas: checked against the namespace after this pass (`quota`).
            crate::quota::TAG_USAGE | crate::quota::TAG_LIMITS => {}
            other => self
                .report
                .problem(format!("key with unknown family byte {other:#04x}")),
        }
    }

    fn finish(mut self) -> FsckReport {
        self.enter(Phase::After);
        self.check_changelog();
        self.report.membership.place = self.place.clone();
        let own = match self.place.as_deref() {
            None => Some(0),
            Some([index, count]) if index < count => Some(usize::from(*index)),
            Some(other) => {
                self.report.problem(format!(
                    "the store's place in its namespace is unreadable: {other:?}"
                ));
                None
            }
        };
        if let Some(own) = own {
            for cluster in &self.handle_clusters {
                if *cluster != own {
                    self.report.problem(format!(
                        "inodes with handles of cluster {cluster} in the store of cluster {own}"
                    ));
                }
            }
        }
        match &self.format {
            None => self.report.problem("no superblock format field".into()),
            Some(format) => {
                if let Err(e) = check_format(format) {
                    self.report.problem(e.to_string());
                }
            }
        }
        for (handle, seen) in std::mem::take(&mut self.default_acls) {
            if !seen {
                self.report.problem(format!(
                    "directory {handle} is marked with a default ACL it does not have"
                ));
            }
        }
        let mut missing: Vec<u64> = self.inline_named.keys().copied().collect();
        missing.sort_unstable();
        for id in missing {
            self.report
                .problem(format!("inline slice {id:#x} is named but has no bytes"));
        }
        for (handle, seen) in &self.orphans {
            if !seen {
                self.report.problem(format!(
                    "orphan record of handle {handle}, which is not an inode"
                ));
            }
        }
        for (handle, (_, seen)) in &self.trashed {
            if !seen {
                self.report.problem(format!(
                    "trash entry of handle {handle}, which is not an inode"
                ));
            }
        }
        for &(h, p, n) in &self.links_expected[self.links_at..] {
            self.report.problem(format!(
                "inode {h} has {n} names in directory {p} but no links key there"
            ));
        }
        if let Some(handle) = self.unparented_max
            && handle >= self.parents_from
        {
            self.report.problem(format!(
                "inode {handle} records no parent, but was made in format 4 or later \
                 (Sparents_from {})",
                self.parents_from
            ));
        }
        if !self.root_seen {
            self.report
                .problem("the root directory (handle 1) is missing".into());
        }
        let mark = self.report.handle_high_water;
        if self.max_handle >= mark {
            self.report.problem(format!(
                "handle {} is at or above the high-water mark {mark}",
                self.max_handle
            ));
        }
        let expected = [
            (KEY_INODES, self.report.inodes),
            (KEY_FILE_BYTES, self.file_bytes),
            (KEY_TRASH_ENTRIES, self.report.trash_entries),
            (KEY_TRASH_BYTES, self.report.trash_bytes),
        ];
        for (key, counted) in expected {
            let stored = self
                .counters
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, n)| *n)
                // A store that never had a trash has no trash counters.
                .or((key.starts_with(b"Ntrash") && counted == 0).then_some(0));
            if stored != Some(counted) {
                self.report.problem(format!(
                    "counter {} is {stored:?}, counted {counted}",
                    String::from_utf8_lossy(key)
                ));
            }
        }
        self.report
    }
}

/// Reads the whole of `view` once, in key order (the keyspace, then the changelog's records in
/// the store's record log), and reports every inconsistency found. `progress` is called now
/// and then with the bytes read so far.
pub fn check<R: ReadTxn>(view: &R, progress: &mut dyn FnMut(u64)) -> Result<FsckReport> {
    let mut checker = Checker {
        report: FsckReport::default(),
        cl_range: None,
        cl_users: Vec::new(),
        phase: Phase::Dentries,
        rows: Vec::new(),
        counts: Vec::new(),
        names: None,
        row_at: 0,
        count_at: 0,
        live: Vec::new(),
        live_at: 0,
        orphans: Default::default(),
        trashed: Default::default(),
        max_handle: 0,
        file_bytes: 0,
        counters: Vec::new(),
        format: None,
        root_seen: false,
        place: None,
        handle_clusters: Default::default(),
        links_expected: Vec::new(),
        links_at: 0,
        unparented_max: None,
        parents_from: 0,
        inline_named: Default::default(),
        queued: Default::default(),
        collected: Default::default(),
        default_acls: Default::default(),
    };
    // A store of an older format is upgraded by the first server that opens it: its names
    // are not laid out as this build checks them.
    if let Some(format) = view.get(KEY_FORMAT)?
        && let Ok(version) = check_format(&format)
        && version < FORMAT_VERSION
    {
        checker.report.problem(format!(
            "the store is of format {version}, older than this build's {FORMAT_VERSION}: \
             start calm serve on it once (it upgrades the store), then check it"
        ));
        return Ok(checker.report);
    }
    // The store's place, for the names of its root (a cluster's are those its hash places
    // there); `Splace` comes after the names in key order.
    checker.place = view.get(KEY_PLACE)?.map(|v| v.to_vec());
    checker.report.membership.keys = crate::place::namespace_keys(view).ok();
    match view.get(KEY_NAME_HASH)?.map(|v| NameHash::from_value(&v)) {
        Some(Ok(names)) => checker.names = Some(names),
        Some(Err(e)) => checker.report.problem(e.to_string()),
        None => checker
            .report
            .problem("no name hash key (Snamehash)".into()),
    }
    let mut next_progress = 0u64;
    // Calls `progress` every 4 MiB read.
    let mut tick = |read: u64| {
        if read >= next_progress {
            progress(read);
            next_progress = read + (4 << 20);
        }
    };
    view.visit(b"", &[TAG_CHANGELOG], &mut |key, value| {
        checker.pair(key, value);
        tick(checker.report.bytes_read);
        ControlFlow::Continue(())
    })?;
    view.log_visit(0, &mut |index, value| {
        checker.changelog_record(index, value);
        tick(checker.report.bytes_read);
        ControlFlow::Continue(())
    })?;
    progress(checker.report.bytes_read);
    let mut report = checker.finish();
    for problem in quota::check(view)? {
        report.add_problem(problem);
    }
    Ok(report)
}
