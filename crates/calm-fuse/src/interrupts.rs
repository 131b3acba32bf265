//! Requests that wait (on the server, the object store, a lock), and the interrupts that end
//! them early.
//!
//! Once the kernel has handed a request to the mount it waits for the mount's answer, even
//! when its caller is killed: a process killed while its write waits for a server that stopped
//! answering would stay in D state until the server answers. So every request that waits is
//! noted with its caller's thread while it runs ([`Waiting`]), and the kernel's interrupt of
//! one (sent at the first signal its caller gets) starts a watch of the caller: the moment the
//! caller has SIGKILL pending, the request is answered EINTR, and the process goes. A request
//! whose caller only caught a signal is left to finish (a write or an fsync answered EINTR for
//! an ordinary signal would break programs that never expect it of a file); lock waits are the
//! exception, cancelled by any signal as POSIX says (`crate::locks`), and answered EINTR here
//! when the server does not confirm the cancel within a second.
//!
//! A process killed with SIGKILL closes its files as it exits, and the kernel sends no
//! interrupt for those flushes: so a flush that waits is watched from the start
//! ([`watch_flush`]), and let go the same way when its caller is exiting by SIGKILL. (A
//! process that exits on its own waits for its flushes: what it wrote is committed before its
//! parent learns it has ended.)
//!
//! The work of a request answered early goes on to its end (a commit, a lock grant) and its
//! own answer is dropped by the kernel; a lock granted to a request answered early is given
//! back (`fs::locks`), and the kernel's cache, which never learnt of the change, is dropped
//! whole when the work ends (`cache::Coherence::kernel_missed_a_change`).

use calm_types::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the caller of an interrupted request that still waits is looked at.
pub const KILLED_POLL_MS: u64 = 100;

/// SIGKILL in the masks of `/proc/PID/status`.
const SIGKILL_MASK: u64 = 1 << (libc::SIGKILL - 1);

/// The requests that wait: FUSE request id → the caller's thread id. At most the requests the
/// kernel has outstanding on the mount.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    /// FUSE request id → the caller's thread, and a way to answer the request early.
    calls: Mutex<HashMap<u64, (u32, Option<fuser::ReplyInterrupted>)>>,
    /// Requests answered EINTR early, until their task ends.
    early: Mutex<HashSet<u64>>,
}

impl Waiting {
    pub(crate) fn begin(&self, unique: u64, pid: u32, interrupter: fuser::ReplyInterrupted) {
        self.calls.locked().insert(unique, (pid, Some(interrupter)));
    }

    pub(crate) fn end(&self, unique: u64) {
        self.calls.locked().remove(&unique);
        let mut early = self.early.locked();
        if !early.is_empty() {
            early.remove(&unique);
        }
    }

    fn pid(&self, unique: u64) -> Option<u32> {
        self.calls.locked().get(&unique).map(|(pid, _)| *pid)
    }

    /// Answers request `unique` EINTR now, if it still waits.
    pub(crate) fn answer_early(&self, unique: u64) -> bool {
        let interrupter = self
            .calls
            .locked()
            .get_mut(&unique)
            .and_then(|(_, interrupter)| interrupter.take());
        let Some(interrupter) = interrupter else {
            return false;
        };
        self.early.locked().insert(unique);
        interrupter.eintr();
        true
    }

    /// Whether request `unique` was answered EINTR early (its work must not leave anything
    /// its caller would have to undo, such as a lock).
    pub(crate) fn answered_early(&self, unique: u64) -> bool {
        let early = self.early.locked();
        !early.is_empty() && early.contains(&unique)
    }
}

/// The flag of `/proc/PID/stat` that says the process is exiting.
const PF_EXITING: u64 = 0x4;

/// Whether thread `pid` is being killed: it has SIGKILL pending, or it is exiting because of
/// SIGKILL (the signal was taken already; its files are being closed).
pub fn being_killed(pid: u32) -> bool {
    let pending = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| sigkill_pending(&status));
    // Gone already (neither file): nothing waits for the answer.
    pending
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| exiting_by_sigkill(&stat))
}

/// Whether a `/proc/PID/stat` text shows a process that exits because of SIGKILL: the
/// exiting flag is set and its exit code is the signal.
fn exiting_by_sigkill(stat: &str) -> bool {
    // The command name, in parentheses, may hold anything: fields are counted after it.
    let Some((_, fields)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<&str> = fields.split_whitespace().collect();
    // Field 9 (flags) is the 7th after the name; field 52 (exit_code) the last.
    let flags = fields.get(6).and_then(|f| f.parse::<u64>().ok());
    let exit_code = fields.last().and_then(|f| f.parse::<i64>().ok());
    matches!((flags, exit_code), (Some(flags), Some(code))
        if flags & PF_EXITING != 0 && code & 0x7f == i64::from(libc::SIGKILL))
}

/// Whether a `/proc/PID/status` text shows SIGKILL pending, for the thread or its process.
fn sigkill_pending(status: &str) -> bool {
    status.lines().any(|line| {
        let pending = line
            .strip_prefix("SigPnd:")
            .or_else(|| line.strip_prefix("ShdPnd:"));
        pending
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGKILL_MASK != 0)
    })
}

/// Watches the caller of a flush that waits (request `unique`), from its first
/// [`KILLED_POLL_MS`], and answers it EINTR the moment the caller is being killed.
pub(crate) fn watch_flush(waiting: &Arc<Waiting>, runtime: &tokio::runtime::Handle, unique: u64) {
    if waiting.pid(unique).is_none() {
        // Answered already.
        return;
    }
    let waiting = waiting.clone();
    runtime.spawn(async move {
        tokio::time::sleep(Duration::from_millis(KILLED_POLL_MS)).await;
        let_go_when_killed(waiting, unique).await
    });
}

/// Watches the caller of interrupted request `unique` while the request waits, and answers it
/// EINTR the moment the caller is being killed.
pub(crate) async fn let_go_when_killed(waiting: Arc<Waiting>, unique: u64) {
    tracing::debug!(unique, pid = ?waiting.pid(unique), "a request's caller is watched");
    loop {
        let Some(pid) = waiting.pid(unique) else {
            return;
        };
        if being_killed(pid) {
            if !waiting.answer_early(unique) {
                return;
            }
            tracing::info!(
                unique,
                pid,
                "a request whose caller was killed was answered at once"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(KILLED_POLL_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigkill_pending_is_read_from_either_mask() {
        let status = |sig: &str, shd: &str| {
            format!("Name:\tpython3\nState:\tD (disk sleep)\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n")
        };
        assert!(!sigkill_pending(&status(
            "0000000000000000",
            "0000000000000000"
        )));
        // SIGINT (2) and SIGTERM (15) pending: not killed.
        assert!(!sigkill_pending(&status(
            "0000000000004002",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000100",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000000",
            "0000000000004100"
        )));
        assert!(!sigkill_pending("garbage"));
    }

    #[test]
    fn exiting_by_sigkill_is_read_from_flags_and_exit_code() {
        // Fields 3.. of a python3 closing its files after SIGKILL (flags 0x40050c, code 9).
        let tail = |flags: u64, code: i64| {
            format!(
                "D 30950 30944 28082 0 -1 {flags} 2943 6702 3 3 3 1 2 1 20 0 1 0 1465395 0 0 \
                 18446744073709551615 0 0 0 0 0 0 0 16781312 2 1 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 \
                 {code}\n"
            )
        };
        assert!(exiting_by_sigkill(&format!(
            "31065 (python3) {}",
            tail(0x40050c, 9)
        )));
        // A name with spaces and parentheses of its own.
        assert!(exiting_by_sigkill(&format!(
            "31065 (a) b (c) {}",
            tail(0x40050c, 9)
        )));
        // Exiting on its own (exit(1): code 256), or killed by another signal.
        assert!(!exiting_by_sigkill(&format!(
            "31065 (python3) {}",
            tail(0x40050c, 256)
        )));
        assert!(!exiting_by_sigkill(&format!(
            "31065 (python3) {}",
            tail(0x40050c, 15)
        )));
        // Not exiting (a live process's code is 0).
        assert!(!exiting_by_sigkill(&format!(
            "31065 (python3) {}",
            tail(0x400100, 9)
        )));
        assert!(!exiting_by_sigkill("garbage"));
    }

    #[test]
    fn a_live_process_and_a_gone_one_are_not_being_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        assert!(!being_killed(pid));
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        assert!(!being_killed(pid), "gone");
    }

    #[test]
    fn requests_are_noted_while_they_wait() {
        let waiting = Waiting::default();
        waiting.calls.locked().insert(7, (100, None));
        assert_eq!(waiting.pid(7), Some(100));
        assert!(!waiting.answer_early(7), "no way to answer it");
        waiting.early.locked().insert(7);
        assert!(waiting.answered_early(7));
        waiting.end(7);
        assert_eq!(waiting.pid(7), None);
        assert!(!waiting.answered_early(7));
    }
}
