//! Offline verification of a namespace store, in one sequential pass over the whole keyspace.
//!
//! The families arrive in key order `D`, `E`, `I`, `N`, `S`, `X`, and each check is a merge of
//! the current family against what earlier ones left behind, sorted the way it needs:
//! - `D` (dentries, grouped by parent): kept as compact rows; per-parent entry and
//!   subdirectory counts are taken on the fly;
//! - `E` (readdir index, by parent then cookie): merged with the rows sorted by (parent,
//!   cookie); every dentry has exactly its index entry and no index entry is left over;
//! - `I` (inodes, by handle): merged with the rows sorted by child and with the per-parent
//!   counts: every dentry points to a live inode of its kind, link counts match, every
//!   directory has one name and the right parent, no inode is an orphan;
//! - `N`, `S`: counters and superblock, checked against what was counted; every handle is below
//!   the high-water mark;
//! - `X` (xattrs, by handle): each belongs to a live inode.
//!
//! Memory is about 40 bytes per dentry (names are kept as 64-bit hashes). Nothing here does
//! I/O of its own: the caller passes a snapshot and a progress callback.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
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
    pub handle_high_water: u64,
    /// The first [`PROBLEMS_LISTED_MAX`] problems, each a sentence.
    pub problems: Vec<String>,
    /// All problems found, listed or not.
    pub problem_count: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problem_count == 0
    }

    fn problem(&mut self, text: String) {
        self.problem_count += 1;
        if self.problems.len() < PROBLEMS_LISTED_MAX {
            self.problems.push(text);
        }
    }
}

/// One dentry, compactly.
#[derive(Debug, Clone, Copy)]
struct Row {
    parent: Handle,
    cookie: u64,
    child: Handle,
    kind: Kind,
    name_hash: u64,
}

/// Entries and subdirectories counted under one parent.
#[derive(Debug, Clone, Copy)]
struct DirCount {
    parent: Handle,
    entries: u64,
    subdirs: u64,
}

fn name_hash(name: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Phase {
    Dentries,
    Readdir,
    Inodes,
    After,
}

struct Checker {
    report: FsckReport,
    phase: Phase,
    rows: Vec<Row>,
    counts: Vec<DirCount>,
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
}

impl Checker {
    fn enter(&mut self, phase: Phase) {
        while self.phase < phase {
            match self.phase {
                Phase::Dentries => {
                    self.rows.sort_unstable_by_key(|r| (r.parent, r.cookie));
                    self.row_at = 0;
                    self.phase = Phase::Readdir;
                }
                Phase::Readdir => {
                    for row in &self.rows[self.row_at..] {
                        self.report.problem(format!(
                            "dentry {}/{} has no readdir index entry (cookie {})",
                            row.parent, row.child, row.cookie
                        ));
                    }
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
            TAG_READDIR => {
                self.enter(Phase::Readdir);
                self.readdir(key, value);
            }
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
                } else if key != KEY_EPOCH {
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
            other => self
                .report
                .problem(format!("key with unknown family byte {other:#04x}")),
        }
    }

    fn dentry(&mut self, key: &[u8], value: &[u8]) {
        let Some(parent) = key_handle(key) else {
            return self
                .report
                .problem("dentry key shorter than 9 bytes".into());
        };
        let name = &key[9..];
        let dentry = match Dentry::decode(value) {
            Ok(d) => d,
            Err(e) => return self.report.problem(format!("dentry in {parent}: {e}")),
        };
        self.report.dentries += 1;
        self.rows.push(Row {
            parent,
            cookie: dentry.cookie,
            child: dentry.child,
            kind: dentry.kind,
            name_hash: name_hash(name),
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

    fn readdir(&mut self, key: &[u8], value: &[u8]) {
        if key.len() != 17 {
            return self.report.problem("readdir key not 17 bytes".into());
        }
        let parent = key_handle(key).expect("17 bytes");
        let cookie = u64::from_be_bytes(key[9..17].try_into().expect("8 bytes"));
        let (child, kind, name) = match decode_readdir_value(value) {
            Ok(v) => v,
            Err(e) => {
                return self
                    .report
                    .problem(format!("readdir entry {parent}/{cookie}: {e}"));
            }
        };
        while let Some(row) = self.rows.get(self.row_at)
            && (row.parent, row.cookie) < (parent, cookie)
        {
            let row = *row;
            self.report.problem(format!(
                "dentry {}/{} has no readdir index entry (cookie {})",
                row.parent, row.child, row.cookie
            ));
            self.row_at += 1;
        }
        match self.rows.get(self.row_at) {
            Some(row) if (row.parent, row.cookie) == (parent, cookie) => {
                if row.child != child || row.kind != kind || row.name_hash != name_hash(name) {
                    self.report.problem(format!(
                        "readdir entry {parent}/{cookie} disagrees with its dentry"
                    ));
                }
                self.row_at += 1;
            }
            _ => self.report.problem(format!(
                "readdir entry {parent}/{cookie} ({:?}) has no dentry",
                String::from_utf8_lossy(name)
            )),
        }
    }

    fn inode(&mut self, key: &[u8], value: &[u8]) {
        let Some(handle) = key_handle(key).filter(|_| key.len() == 9) else {
            return self.report.problem("inode key not 9 bytes".into());
        };
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
            if links.is_empty() {
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

    fn finish(mut self) -> FsckReport {
        self.enter(Phase::After);
        match &self.format {
            None => self.report.problem("no superblock format field".into()),
            Some(format) => {
                if let Err(e) = check_format(format) {
                    self.report.problem(e.to_string());
                }
            }
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

/// Reads the whole of `view` once, in key order, and reports every inconsistency found.
/// `progress` is called now and then with the bytes read so far.
pub fn check<R: ReadTxn>(view: &R, progress: &mut dyn FnMut(u64)) -> Result<FsckReport> {
    let mut checker = Checker {
        report: FsckReport::default(),
        phase: Phase::Dentries,
        rows: Vec::new(),
        counts: Vec::new(),
        row_at: 0,
        count_at: 0,
        live: Vec::new(),
        live_at: 0,
        max_handle: 0,
        file_bytes: 0,
        counters: Vec::new(),
        format: None,
        root_seen: false,
    };
    let mut next_progress = 0u64;
    view.visit(b"", b"", &mut |key, value| {
        checker.pair(key, value);
        if checker.report.bytes_read >= next_progress {
            progress(checker.report.bytes_read);
            next_progress = checker.report.bytes_read + (4 << 20);
        }
        ControlFlow::Continue(())
    })?;
    progress(checker.report.bytes_read);
    Ok(checker.finish())
}
