//! Who asks for an operation: the identity every permission decision and every changelog
//! record names.

/// Supplementary groups a caller may name; more is refused (the server would otherwise
/// decide on a truncated list, and a group can deny what "other" allows).
pub const GROUPS_MAX: usize = 1024;

/// Who asks for an operation: its session, uid and gid are recorded in its changelog record,
/// and uid, gid and supplementary groups decide what it may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client session (0: none).
    pub session: u64,
    pub uid: u32,
    pub gid: u32,
    pub groups: Groups,
}

impl Caller {
    /// The superuser: uid 0 (a squashed root arrives here as another uid).
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(gid)
    }
}

/// A caller's supplementary groups: sorted, without repeats; cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups(std::sync::Arc<[u32]>);

impl Groups {
    pub fn new(mut groups: Vec<u32>) -> Groups {
        groups.sort_unstable();
        groups.dedup();
        Groups(groups.into())
    }

    pub fn contains(&self, gid: u32) -> bool {
        self.0.binary_search(&gid).is_ok()
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    /// The groups of the `Groups:` line of a `/proc/PID/status` text, as the kernel writes it
    /// (None when there is no such line or it does not parse). Reading the file is the
    /// caller's.
    pub fn from_proc_status(status: &str) -> Option<Groups> {
        let line = status.lines().find(|l| l.starts_with("Groups:"))?;
        let groups: Option<Vec<u32>> = line["Groups:".len()..]
            .split_whitespace()
            .map(|g| g.parse().ok())
            .collect();
        Some(Groups::new(groups?))
    }
}
