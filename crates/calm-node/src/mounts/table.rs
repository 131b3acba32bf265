//! The mount table as a pure state machine: mounts by id, attach and detach changes, a full
//! reload (resync) that turns into the changes it implies, and the waiters for one's own mount.
//! No I/O: the watcher feeds it what the kernel said.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// One mount, as `statmount(2)` or /proc/self/mountinfo describe it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mount {
    /// The id mountinfo shows (`mnt_id_old` in statmount).
    pub id: u32,
    pub parent: u32,
    /// Where it is mounted, relative to the process's root.
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// A change of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountChange {
    Attached(Mount),
    Detached(Mount),
}

/// Mounts of one namespace by their (mountinfo) id.
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    mounts: BTreeMap<u32, Mount>,
    /// Unique (64-bit) id → mountinfo id, for detach events, which name the unique id.
    unique: HashMap<u64, u32>,
    /// Mount points someone waits to see mounted, with how many wait for each.
    awaited: HashMap<PathBuf, usize>,
}

impl MountTable {
    pub fn new() -> MountTable {
        MountTable::default()
    }

    pub fn len(&self) -> usize {
        self.mounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }

    /// Every mount, by id.
    pub fn mounts(&self) -> Vec<Mount> {
        self.mounts.values().cloned().collect()
    }

    /// The mount at `mount_point`, the topmost one when several are stacked there.
    pub fn at(&self, mount_point: &std::path::Path) -> Option<&Mount> {
        // Stacked mounts: the one mounted on top has the other as its parent.
        let here: Vec<&Mount> = self
            .mounts
            .values()
            .filter(|m| m.mount_point == mount_point)
            .collect();
        here.iter()
            .find(|m| !here.iter().any(|other| other.parent == m.id))
            .copied()
    }

    /// A mount appeared (`unique`: its 64-bit id). Returns the change, or None when the table
    /// already had it (the event raced a resync that saw it).
    pub fn attach(&mut self, unique: u64, mount: Mount) -> Option<MountChange> {
        self.unique.insert(unique, mount.id);
        if self.mounts.get(&mount.id) == Some(&mount) {
            return None;
        }
        self.mounts.insert(mount.id, mount.clone());
        Some(MountChange::Attached(mount))
    }

    /// The mount with 64-bit id `unique` went away.
    pub fn detach(&mut self, unique: u64) -> Option<MountChange> {
        let id = self.unique.remove(&unique)?;
        self.mounts.remove(&id).map(MountChange::Detached)
    }

    /// Replaces the whole table with `now` (a resync after lost events): returns the changes
    /// that turn the old table into the new one.
    pub fn reload(&mut self, now: Vec<(u64, Mount)>) -> Vec<MountChange> {
        let mut changes = Vec::new();
        let new: BTreeMap<u32, Mount> = now.iter().map(|(_, m)| (m.id, m.clone())).collect();
        for (id, old) in &self.mounts {
            if new.get(id) != Some(old) {
                changes.push(MountChange::Detached(old.clone()));
            }
        }
        for (id, mount) in &new {
            if self.mounts.get(id) != Some(mount) {
                changes.push(MountChange::Attached(mount.clone()));
            }
        }
        self.unique = now.iter().map(|(u, m)| (*u, m.id)).collect();
        self.mounts = new;
        changes
    }

    /// Someone is about to mount at `mount_point` and will wait to see it: while any such wait
    /// is pending, the watcher processes changes immediately (no budget delay).
    pub fn expect(&mut self, mount_point: PathBuf) {
        *self.awaited.entry(mount_point).or_default() += 1;
    }

    /// The wait for `mount_point` ended (seen, or given up).
    pub fn unexpect(&mut self, mount_point: &std::path::Path) {
        if let Some(n) = self.awaited.get_mut(mount_point) {
            *n -= 1;
            if *n == 0 {
                self.awaited.remove(mount_point);
            }
        }
    }

    /// Whether some own mount is still awaited.
    pub fn awaiting(&self) -> bool {
        !self.awaited.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u32, parent: u32, at: &str) -> Mount {
        Mount {
            id,
            parent,
            mount_point: at.into(),
            fs_type: "tmpfs".into(),
            source: "none".into(),
        }
    }

    #[test]
    fn attach_detach_and_stacked_mounts() {
        let mut t = MountTable::new();
        assert!(t.attach(100, m(1, 1, "/")).is_some());
        assert!(t.attach(101, m(2, 1, "/a")).is_some());
        assert!(
            t.attach(101, m(2, 1, "/a")).is_none(),
            "seen twice: one change"
        );
        assert!(t.attach(102, m(3, 2, "/a")).is_some());
        assert_eq!(t.at("/a".as_ref()).unwrap().id, 3, "the one on top");
        assert_eq!(t.detach(102), Some(MountChange::Detached(m(3, 2, "/a"))));
        assert_eq!(t.detach(102), None);
        assert_eq!(t.at("/a".as_ref()).unwrap().id, 2);
    }

    #[test]
    fn a_reload_yields_exactly_the_difference() {
        let mut t = MountTable::new();
        t.attach(100, m(1, 1, "/"));
        t.attach(101, m(2, 1, "/a"));
        t.attach(102, m(3, 1, "/b"));
        let changes = t.reload(vec![
            (100, m(1, 1, "/")),
            (102, m(3, 1, "/b")),
            (104, m(5, 1, "/c")),
        ]);
        assert_eq!(
            changes,
            [
                MountChange::Detached(m(2, 1, "/a")),
                MountChange::Attached(m(5, 1, "/c"))
            ]
        );
        assert_eq!(t.len(), 3);
        assert_eq!(t.detach(104), Some(MountChange::Detached(m(5, 1, "/c"))));
    }
}
