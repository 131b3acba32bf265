//! The supplementary groups of the processes calling the mount: FUSE gives each request's
//! uid, gid and pid, not the groups, which the kernel shows in `/proc/PID/status`. The server
//! decides permissions with them, so they travel with every request. Kept a short while per
//! pid: a process's groups rarely change, and reading them costs a few microseconds.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use calm_types::Groups;

/// How long a pid's groups are reused before they are read again.
pub const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Pids whose groups are kept; past it the table starts over.
pub const GROUPS_PIDS_MAX: usize = 4096;

/// The groups of recent callers.
#[derive(Debug, Default)]
pub struct CallerGroups {
    known: Mutex<HashMap<u32, (Instant, Groups)>>,
}

impl CallerGroups {
    /// The supplementary groups of process (or thread) `pid`; none when it is gone or its
    /// status cannot be read.
    pub fn of(&self, pid: u32) -> Groups {
        let now = Instant::now();
        if let Some((at, groups)) = self.known.locked().get(&pid)
            && now.duration_since(*at) < GROUPS_TTL
        {
            return groups.clone();
        }
        let groups = read_groups(pid).unwrap_or_default();
        let mut known = self.known.locked();
        if known.len() >= GROUPS_PIDS_MAX {
            known.clear();
        }
        known.insert(pid, (now, groups.clone()));
        groups
    }
}

fn read_groups(pid: u32) -> Option<Groups> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Groups::from_proc_status(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_line_is_read() {
        let status = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t27 4 1000 \nNgid:\t0\n";
        let groups = Groups::from_proc_status(status).unwrap();
        assert_eq!(groups.as_slice(), &[4, 27, 1000]);
        assert_eq!(
            Groups::from_proc_status("Groups:\t\n").unwrap().as_slice(),
            &[] as &[u32]
        );
        assert!(Groups::from_proc_status("Name:\tx\n").is_none());
        let ours = CallerGroups::default().of(std::process::id());
        assert_eq!(ours, read_groups(std::process::id()).unwrap());
    }
}
