//! The checks of names: each directory entry (its key's hash, its row kept for the inode
//! pass), and where the names of multi-link files are (`L`), against what the entries said.

use super::*;

impl Checker {
    pub(super) fn dentry(&mut self, key: &[u8], value: &[u8]) {
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
        if parent == ROOT
            && let Some(&[index, count]) = self.place.as_deref()
            && index < count
        {
            // A cluster holds the root's names its hash places there; a lookup of a name
            // kept on another cluster asks the cluster its hash picks, and never finds it.
            let placed = crate::place::root_cluster(hash, usize::from(count));
            if placed != usize::from(index) {
                self.report.problem(format!(
                    "name /{} is on cluster {index}, but its hash places it on cluster {placed}",
                    String::from_utf8_lossy(name)
                ));
            }
        }
        self.name_entry(parent, value);
    }

    pub(super) fn name_entry(&mut self, parent: Handle, value: &[u8]) {
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

    /// One `L` key, merged with what the names called for.
    pub(super) fn links_key(&mut self, key: &[u8], value: &[u8]) {
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
}

/// A non-directory's `parent` against its names, and the `L` keys they call for.
pub(super) fn parents_of(
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
