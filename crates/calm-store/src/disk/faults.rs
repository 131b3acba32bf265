//! Fault plans for the files under a directory: the Nth write or sync fails, tears, or ends
//! the process (test builds only).
//!
//! A plan counts the writes and syncs of every [`DiskFile`](super::DiskFile) opened under its
//! directory while it is armed, and acts at the operation numbered `at` (from 1). Operations
//! of a plan run one at a time (a lock held across each), so that a crash is one instant: an
//! operation is wholly before it or wholly after it.
//!
//! For a power loss the plan keeps, per file (device and inode: every descriptor of it),
//! what each write since the file's last successful sync overwrote; the crash writes it back
//! in reverse order and cuts the file to its length before those writes.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use calm_types::sync::Locked;

/// What happens at the planned operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The operation fails with `errno`; a write first puts its first `written` bytes (a
    /// short write). Later operations go on.
    Fail { errno: i32, written: usize },
    /// The process ends: a write puts its first `torn` bytes, a sync does nothing; no later
    /// operation reaches a file; with `power_loss`, every write not synced is undone first.
    Crash { torn: usize, power_loss: bool },
}

/// An armed plan; dropping it disarms it (files opened later are not tracked).
pub(crate) struct Armed(Arc<Plan>);

impl Armed {
    /// Whether the planned operation was reached.
    pub(crate) fn fired(&self) -> bool {
        self.0.state.locked().fired
    }

    /// Whether the process "died".
    pub(crate) fn crashed(&self) -> bool {
        self.0.state.locked().crashed
    }

    /// Writes and syncs counted so far.
    pub(crate) fn ops(&self) -> u64 {
        self.0.state.locked().ops
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        PLANS.locked().retain(|plan| !Arc::ptr_eq(plan, &self.0));
    }
}

/// Arms `fault` at the `at`th write or sync (from 1) of the files under `dir`.
pub(crate) fn arm(dir: &Path, at: u64, fault: Fault) -> Armed {
    let plan = Arc::new(Plan {
        dir: dir.to_path_buf(),
        at,
        fault,
        state: Mutex::new(State::default()),
    });
    PLANS.locked().push(plan.clone());
    Armed(plan)
}

static PLANS: Mutex<Vec<Arc<Plan>>> = Mutex::new(Vec::new());

#[derive(Debug)]
struct Plan {
    dir: PathBuf,
    at: u64,
    fault: Fault,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    ops: u64,
    fired: bool,
    crashed: bool,
    /// Per file, a descriptor of it and the writes not synced since.
    unsynced: HashMap<(u64, u64), (File, Vec<Undo>)>,
}

/// What one write overwrote: the bytes that were at `offset` and the file's length before.
#[derive(Debug)]
struct Undo {
    offset: u64,
    old: Vec<u8>,
    len_before: u64,
}

/// A file under an armed plan's directory.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    plan: Arc<Plan>,
    id: (u64, u64),
}

/// The plan `path` falls under, if any.
pub(crate) fn track(path: &Path, file: &File) -> io::Result<Option<Tracked>> {
    let Some(plan) = PLANS
        .locked()
        .iter()
        .find(|plan| path.starts_with(&plan.dir))
        .cloned()
    else {
        return Ok(None);
    };
    let meta = file.metadata()?;
    Ok(Some(Tracked {
        plan,
        id: (meta.dev(), meta.ino()),
    }))
}

/// What the counted operation does.
enum Step {
    Go,
    Fail { errno: i32, written: usize },
    Crash { torn: usize },
}

fn dead() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Tracked {
    /// Counts an operation: what it is to do. Called with the plan's state locked.
    fn step(&self, state: &mut State) -> Option<Step> {
        if state.crashed {
            return None;
        }
        state.ops += 1;
        if state.ops != self.plan.at {
            return Some(Step::Go);
        }
        state.fired = true;
        Some(match self.plan.fault {
            Fault::Fail { errno, written } => Step::Fail { errno, written },
            Fault::Crash { torn, .. } => Step::Crash { torn },
        })
    }

    /// Ends the process: undoes the unsynced writes for a power loss.
    fn crash(&self, state: &mut State) -> io::Result<()> {
        state.crashed = true;
        let Fault::Crash { power_loss, .. } = self.plan.fault else {
            return Ok(());
        };
        for (file, undos) in std::mem::take(&mut state.unsynced).into_values() {
            if !power_loss {
                continue;
            }
            for undo in undos.iter().rev() {
                file.write_all_at(&undo.old, undo.offset)?;
                file.set_len(undo.len_before)?;
            }
        }
        Ok(())
    }

    /// Notes what writing `len` bytes at `offset` of `file` overwrites.
    fn remember(&self, state: &mut State, file: &File, offset: u64, len: usize) -> io::Result<()> {
        let len_before = file.metadata()?.len();
        let mut old = vec![0u8; len.min(len_before.saturating_sub(offset) as usize)];
        file.read_exact_at(&mut old, offset)?;
        let (_, undos) = match state.unsynced.entry(self.id) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert((file.try_clone()?, Vec::new()))
            }
        };
        undos.push(Undo {
            offset,
            old,
            len_before,
        });
        Ok(())
    }

    pub(crate) fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.plan.state.locked();
        let step = self.step(&mut state).ok_or_else(dead)?;
        match step {
            Step::Go => {
                self.remember(&mut state, file, offset, buf.len())?;
                file.write_all_at(buf, offset)
            }
            Step::Fail { errno, written } => {
                self.remember(&mut state, file, offset, buf.len())?;
                file.write_all_at(&buf[..written.min(buf.len())], offset)?;
                Err(io::Error::from_raw_os_error(errno))
            }
            Step::Crash { torn } => {
                self.crash(&mut state)?;
                file.write_all_at(&buf[..torn.min(buf.len())], offset)?;
                Err(dead())
            }
        }
    }

    pub(crate) fn sync(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut state = self.plan.state.locked();
        let step = self.step(&mut state).ok_or_else(dead)?;
        match step {
            Step::Go => {
                sync()?;
                state.unsynced.remove(&self.id);
                Ok(())
            }
            Step::Fail { errno, .. } => Err(io::Error::from_raw_os_error(errno)),
            Step::Crash { .. } => {
                self.crash(&mut state)?;
                Err(dead())
            }
        }
    }
}
