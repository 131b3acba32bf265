//! The inode pass: every inode merged with the names that point to it and the counts of its
//! directory, so link counts, kinds, parents and orphans are checked in one sweep.

use super::names::parents_of;
use super::*;

impl Checker {
    pub(super) fn inode(&mut self, key: &[u8], value: &[u8]) {
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
        if let Some(acl) = &inode.access_acl
            && acl.mode() != inode.mode & 0o777
        {
            self.report.problem(format!(
                "the access ACL of inode {handle} gives mode {:o}, the inode has {:o}",
                acl.mode(),
                inode.mode & 0o777
            ));
        }
        if inode.acls & crate::acl::ACL_DEFAULT != 0 {
            if inode.kind != Kind::Dir {
                self.report.problem(format!(
                    "inode {handle} is not a directory and is marked with a default ACL"
                ));
            }
            self.default_acls.insert(handle, false);
        }
        self.max_handle = self.max_handle.max(handle);
        if handle == ROOT {
            self.root_seen = true;
            self.report.membership.root = Some(RootOwner {
                uid: inode.uid,
                gid: inode.gid,
                mode: inode.mode,
            });
        }
        for link in links {
            if link.kind != inode.kind {
                self.report.problem(format!(
                    "dentry in directory {} says handle {handle} is {:?}, the inode is {:?}",
                    link.parent, link.kind, inode.kind
                ));
            }
        }
        let trashed = match self.trashed.get_mut(&handle) {
            Some((size, seen)) => {
                *seen = true;
                Some(*size)
            }
            None => None,
        };
        if let Some(size) = trashed {
            if inode.nlink != 0 || !links.is_empty() || count.entries != 0 {
                self.report.problem(format!(
                    "inode {handle} is in the trash but has nlink {}, {} names, {} entries",
                    inode.nlink,
                    links.len(),
                    count.entries
                ));
            }
            if inode.kind == Kind::File && size != inode.size {
                self.report.problem(format!(
                    "file {handle} is in the trash with size {size}, its inode says {}",
                    inode.size
                ));
            }
            if self.orphans.contains_key(&handle) {
                self.report
                    .problem(format!("inode {handle} is both in the trash and an orphan"));
            }
            if inode.kind == Kind::File {
                self.file_bytes += inode.size;
            }
            if inode.kind == Kind::Dir {
                self.report.directories += 1;
            }
            return;
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
}
