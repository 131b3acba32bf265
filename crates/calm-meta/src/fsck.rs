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
//! Memory is about 24 bytes per name. Nothing here
//! does I/O of its own: the caller passes a snapshot and a progress callback.

use std::ops::ControlFlow;

use calm_store::{ReadTxn, decode_counter};

use crate::error::Result;
use crate::layout::*;
use crate::types::{Handle, Kind, ROOT};

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
    /// The first [`PROBLEMS_LISTED_MAX`] problems, each a sentence.
    pub problems: Vec<String>,
    /// All problems found, listed or not.
    pub problem_count: u64,
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
    /// The `L` keys the names of multi-link files call for, `(handle, directory, count)` in
    /// key order, and the merge cursor into them.
    links_expected: Vec<(Handle, Handle, u32)>,
    links_at: usize,
    /// The highest named non-directory with no parent recorded, and `Sparents_from`.
    unparented_max: Option<Handle>,
    parents_from: u64,
    /// Inline slices the chunks name, with their length, until their bytes (`K`) are seen.
    inline_named: std::collections::HashMap<u64, u32>,
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
                    self.place = Some(value.to_vec());
                } else if key == KEY_PARENTS_FROM {
                    match decode_counter(key, value) {
                        Ok(n) => self.parents_from = n,
                        Err(e) => self.report.problem(format!("parents-from mark: {e}")),
                    }
                } else if key != KEY_EPOCH
                    && key != KEY_OBJECTS
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
                self.xattr(key);
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
            TAG_GC => {
                if gc_key_parts(key).is_none() || value.len() != 4 {
                    self.report
                        .problem(format!("deletion queue entry {key:?} does not decode"));
                }
            }
            // Before the inodes, so that an orphan's inode (no name) is known to be one.
            TAG_ORPHAN => match key_handle(key).filter(|_| key.len() == 9 && value.len() == 8) {
                Some(handle) => {
                    self.orphans.insert(handle, false);
                }
                None => self
                    .report
                    .problem(format!("orphan record {key:?} does not decode")),
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
            other => self
                .report
                .problem(format!("key with unknown family byte {other:#04x}")),
        }
    }

    fn dentry(&mut self, key: &[u8], value: &[u8]) {
        let Some(parent) = key_handle(key).filter(|_| key.len() >= 10) else {
            return self.report.problem("name key shorter than 10 bytes".into());
        };
        if key[9] != SUB_ENTRY {
            return self.report.problem(format!(
                "directory {parent}: key with unknown second tag {:#04x}",
                key[9]
            ));
        }
        let Some((_, hash, name)) = entry_key_parts(key) else {
            return self.report.problem(format!(
                "directory {parent}: name key of {} bytes",
                key.len()
            ));
        };
        if let Some(names) = &self.names
            && names.hash(name) != hash
        {
            self.report.problem(format!(
                "name {parent}/{:?} is kept under hash {hash:#x}, not its own",
                String::from_utf8_lossy(name)
            ));
        }
        self.name_entry(parent, value);
    }

    fn name_entry(&mut self, parent: Handle, value: &[u8]) {
        let dentry = match Dentry::decode(value) {
            Ok(d) => d,
            Err(e) => return self.report.problem(format!("dentry in {parent}: {e}")),
        };
        self.report.dentries += 1;
        self.rows.push(Row {
            parent,
            child: dentry.child,
            kind: dentry.kind,
        });
        if self.counts.last().is_none_or(|c| c.parent != parent) {
            self.counts.push(DirCount {
                parent,
                entries: 0,
                subdirs: 0,
            });
        }
        let count = self.counts.last_mut().expect("pushed");
        count.entries += 1;
        count.subdirs += u64::from(dentry.kind == Kind::Dir);
    }

    fn inode(&mut self, key: &[u8], value: &[u8]) {
        let Some(handle) = key_handle(key).filter(|_| key.len() == 9) else {
            return self.report.problem("inode key not 9 bytes".into());
        };
        if handle != ROOT {
            self.handle_clusters
                .insert(crate::place::cluster_of(handle));
        }
        // Dentries pointing to handles below this one that are not inodes.
        while let Some(row) = self.rows.get(self.row_at)
            && row.child < handle
        {
            let row = *row;
            self.report.problem(format!(
                "dentry in directory {} points to handle {}, which is not a live inode",
                row.parent, row.child
            ));
            self.row_at += 1;
        }
        let links_from = self.row_at;
        while self
            .rows
            .get(self.row_at)
            .is_some_and(|r| r.child == handle)
        {
            self.row_at += 1;
        }
        let links = &self.rows[links_from..self.row_at];
        while let Some(count) = self.counts.get(self.count_at)
            && count.parent < handle
        {
            let count = *count;
            self.report.problem(format!(
                "handle {} holds {} entries but is not a live inode",
                count.parent, count.entries
            ));
            self.count_at += 1;
        }
        let count = match self.counts.get(self.count_at) {
            Some(c) if c.parent == handle => {
                self.count_at += 1;
                *c
            }
            _ => DirCount {
                parent: handle,
                entries: 0,
                subdirs: 0,
            },
        };

        let inode = match Inode::decode(handle, value) {
            Ok(i) => i,
            Err(e) => return self.report.problem(e.to_string()),
        };
        self.report.inodes += 1;
        self.live.push(handle);
        self.max_handle = self.max_handle.max(handle);
        if handle == ROOT {
            self.root_seen = true;
        }
        for link in links {
            if link.kind != inode.kind {
                self.report.problem(format!(
                    "dentry in directory {} says handle {handle} is {:?}, the inode is {:?}",
                    link.parent, link.kind, inode.kind
                ));
            }
        }
        if inode.kind == Kind::Dir {
            self.report.directories += 1;
            let expected_links = if handle == ROOT { 0 } else { 1 };
            if links.len() != expected_links {
                self.report.problem(format!(
                    "directory {handle} has {} names (expected {expected_links})",
                    links.len()
                ));
            }
            let expected_parent = if handle == ROOT {
                ROOT
            } else {
                links.first().map_or(inode.parent, |l| l.parent)
            };
            if inode.parent != expected_parent {
                self.report.problem(format!(
                    "directory {handle} records parent {} but is named in {expected_parent}",
                    inode.parent
                ));
            }
            if inode.entries != count.entries {
                self.report.problem(format!(
                    "directory {handle} records {} entries, holds {}",
                    inode.entries, count.entries
                ));
            }
            if u64::from(inode.nlink) != 2 + count.subdirs {
                self.report.problem(format!(
                    "directory {handle} has nlink {}, expected {} (2 + {} subdirectories)",
                    inode.nlink,
                    2 + count.subdirs,
                    count.subdirs
                ));
            }
        } else {
            if count.entries > 0 {
                self.report.problem(format!(
                    "non-directory {handle} holds {} entries",
                    count.entries
                ));
            }
            let kept = self.orphans.get_mut(&handle);
            let is_kept = kept.is_some();
            if let Some(seen) = kept {
                *seen = true;
            }
            if is_kept && (inode.kind != Kind::File || inode.nlink != 0 || !links.is_empty()) {
                self.report.problem(format!(
                    "inode {handle} has an orphan record but is not an unnamed file with nlink 0"
                ));
            } else if is_kept {
                self.report.orphans += 1;
            } else if links.is_empty() {
                self.report
                    .problem(format!("inode {handle} is an orphan: no name points to it"));
            } else if inode.nlink as usize != links.len() {
                self.report.problem(format!(
                    "inode {handle} has nlink {}, but {} names point to it",
                    inode.nlink,
                    links.len()
                ));
            }
            if inode.kind == Kind::File {
                self.file_bytes += inode.size;
            }
            let Checker {
                rows,
                report,
                links_expected,
                unparented_max,
                ..
            } = self;
            parents_of(
                &inode,
                &rows[links_from..self.row_at],
                report,
                links_expected,
                unparented_max,
            );
        }
    }

    /// One `L` key, merged with what the names called for.
    fn links_key(&mut self, key: &[u8], value: &[u8]) {
        let (Some(handle), Some(parent)) = (key_handle(key), links_key_parent(key)) else {
            return self
                .report
                .problem(format!("links key {key:?} does not decode"));
        };
        let count = match <[u8; 4]>::try_from(value) {
            Ok(bytes) => u32::from_le_bytes(bytes),
            Err(_) => {
                return self
                    .report
                    .problem(format!("links of {handle} in {parent}: not a u32"));
            }
        };
        while let Some(&(h, p, n)) = self.links_expected.get(self.links_at)
            && (h, p) < (handle, parent)
        {
            self.report.problem(format!(
                "inode {h} has {n} names in directory {p} but no links key there"
            ));
            self.links_at += 1;
        }
        match self.links_expected.get(self.links_at) {
            Some(&(h, p, n)) if (h, p) == (handle, parent) => {
                self.links_at += 1;
                if n != count {
                    self.report.problem(format!(
                        "links key of {handle} in {parent} says {count} names, there are {n}"
                    ));
                }
            }
            _ => self.report.problem(format!(
                "links key of {handle} in {parent}, which holds none of its names (or it has \
                 one name)"
            )),
        }
    }

    /// A chunk of a live file, whose records fit it and name objects handed out.
    fn chunk(&mut self, key: &[u8], value: &[u8]) {
        let (Some(handle), Some(chunk)) = (key_handle(key), key_chunk(key)) else {
            return self
                .report
                .problem(format!("chunk key {key:?} does not decode"));
        };
        self.report.chunks += 1;
        if self.live.binary_search(&handle).is_err() {
            self.report.problem(format!(
                "chunk {chunk} of handle {handle}, which is not a live inode"
            ));
        }
        match crate::slices::decode_chunk(value) {
            Ok(slices) => {
                self.report.slice_records += slices.len() as u64;
                self.report.slice_records_per_chunk_max = self
                    .report
                    .slice_records_per_chunk_max
                    .max(slices.len() as u64);
                for slice in slices {
                    if let Err(error) = slice.check() {
                        self.report
                            .problem(format!("chunk {chunk} of handle {handle}: {error}"));
                    }
                    if crate::slices::is_inline(slice.id)
                        && self.inline_named.insert(slice.id, slice.size).is_some()
                    {
                        self.report.problem(format!(
                            "inline slice {:#x} is named twice (chunk {chunk} of handle {handle})",
                            slice.id
                        ));
                    }
                }
            }
            Err(error) => self
                .report
                .problem(format!("chunk {chunk} of handle {handle}: {error}")),
        }
    }

    /// The bytes of an inline slice: named by one record, of its length.
    fn inline(&mut self, key: &[u8], value: &[u8]) {
        let Some(id) = key_handle(key).filter(|_| key.len() == 9) else {
            return self
                .report
                .problem(format!("inline bytes key {key:?} does not decode"));
        };
        self.report.inline_slices += 1;
        match self.inline_named.remove(&id) {
            None => self.report.problem(format!(
                "inline bytes of slice {id:#x}, which no record names"
            )),
            Some(size) if size as usize != value.len() => self.report.problem(format!(
                "inline slice {id:#x} holds {} bytes, its record says {size}",
                value.len()
            )),
            Some(_) => {}
        }
    }

    fn xattr(&mut self, key: &[u8]) {
        let Some(handle) = key_handle(key) else {
            return self.report.problem("xattr key shorter than 9 bytes".into());
        };
        self.report.xattrs += 1;
        while self.live.get(self.live_at).is_some_and(|h| *h < handle) {
            self.live_at += 1;
        }
        if self.live.get(self.live_at) != Some(&handle) {
            self.report.problem(format!(
                "xattr of handle {handle}, which is not a live inode"
            ));
        }
    }

    fn changelog_record(&mut self, index: u64, value: &[u8]) {
        self.enter(Phase::After);
        self.report.bytes_read += value.len() as u64;
        self.report.changelog_records += 1;
        if let Err(error) = calm_changelog::Record::decode(index, value) {
            self.report
                .problem(format!("changelog record {index}: {error}"));
        }
        match self.cl_range {
            None => self.cl_range = Some((index, index)),
            Some((first, last)) => {
                if index != last + 1 {
                    self.report.problem(format!(
                        "changelog records {last} and {index} are stored with a gap between"
                    ));
                }
                self.cl_range = Some((first, index));
            }
        }
    }

    /// Records end at `Ncl_last`; every reader's uncleared records are stored; reader ids
    /// are below `Ncl_user_next`.
    fn check_changelog(&mut self) {
        let counter = |key: &[u8]| {
            self.counters
                .iter()
                .find(|(k, _)| k == key)
                .map_or(0, |(_, n)| *n)
        };
        let (counted, user_next) = (counter(KEY_CL_LAST), counter(KEY_CL_USER_NEXT));
        self.report.changelog_readers = self.cl_users.len() as u64;
        // The counter is written by purges only: it may lag the records, never lead them.
        let last = match self.cl_range {
            Some((_, stored_last)) if stored_last < counted => {
                self.report.problem(format!(
                    "the last changelog record stored is {stored_last}, below the counter's {counted}"
                ));
                counted
            }
            Some((_, stored_last)) => stored_last,
            None => counted,
        };
        let mut problems = Vec::new();
        for user in &self.cl_users {
            if u64::from(user.id) >= user_next {
                problems.push(format!(
                    "changelog reader cl{} at or above the next id {user_next}",
                    user.id
                ));
            }
            if user.cleared > last {
                problems.push(format!(
                    "changelog reader cl{} cleared {} past the last record {last}",
                    user.id, user.cleared
                ));
            } else if user.cleared < last {
                let needed = user.cleared + 1;
                if self.cl_range.is_none_or(|(first, _)| first > needed) {
                    problems.push(format!(
                        "changelog reader cl{} needs record {needed}, which is not stored",
                        user.id
                    ));
                }
            }
        }
        for problem in problems {
            self.report.problem(problem);
        }
    }

    fn finish(mut self) -> FsckReport {
        self.enter(Phase::After);
        self.check_changelog();
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
        ];
        for (key, counted) in expected {
            let stored = self
                .counters
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, n)| *n);
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

/// A non-directory's `parent` against its names, and the `L` keys they call for.
fn parents_of(
    inode: &Inode,
    links: &[Row],
    report: &mut FsckReport,
    links_expected: &mut Vec<(Handle, Handle, u32)>,
    unparented_max: &mut Option<Handle>,
) {
    let handle = inode.handle;
    if links.is_empty() {
        if inode.parent != 0 {
            report.problem(format!(
                "inode {handle} has no name but records parent {}",
                inode.parent
            ));
        }
        return;
    }
    if inode.parent == 0 {
        // Made before format 4 (checked against `Sparents_from` at the end): no `L` keys.
        *unparented_max = Some(handle);
        return;
    }
    if !links.iter().any(|l| l.parent == inode.parent) {
        report.problem(format!(
            "inode {handle} records parent {}, which holds none of its names",
            inode.parent
        ));
    }
    if links.len() > 1 {
        let mut dirs: Vec<Handle> = links.iter().map(|l| l.parent).collect();
        dirs.sort_unstable();
        for group in dirs.chunk_by(|a, b| a == b) {
            links_expected.push((handle, group[0], group.len() as u32));
        }
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
    Ok(checker.finish())
}
