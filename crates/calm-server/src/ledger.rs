//! The lock sessions of a server that decides its files' locks alone, written down in its
//! data directory (`lock-sessions`), so that after a restart it knows who may still believe it
//! holds a lock, and waits for them to take their locks again (`calm_locks::recovery`) before
//! it grants any new one.
//!
//! One line per change, appended: `+ SESSION LEASE_MS OWNER` when a session opens (made
//! durable before the session is handed out: before it can hold anything), `- SESSION` when
//! it ends (not synced: a session found open that had ended only makes a restart wait for it,
//! at most its lease). SESSION in hex, OWNER (the identity that opened it) in hex of its bytes.
//! A torn last line (a crash while appending) is skipped. The file is rewritten with only the
//! open sessions when a grace ends and when it holds [`LINES_SLACK`] lines more than twice
//! them, written aside, synced and renamed over: a crash leaves the old file or the new one.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use calm_locks::SessionId;
use calm_locks::recovery::Survivor;
use calm_types::sync::Locked;

/// The ledger's file in a data directory.
pub const LEDGER_FILE: &str = "lock-sessions";
/// Lines past twice the open sessions after which the file is rewritten.
pub const LINES_SLACK: usize = 4096;

/// The ledger of one server.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    file: std::fs::File,
    /// The sessions the file holds as open, with their lines' fields.
    open: BTreeMap<SessionId, (u64, String)>,
    lines: usize,
}

fn encode(owner: &str) -> String {
    owner.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The open sessions a ledger's text names, and how many lines it has.
fn parse(text: &str) -> (BTreeMap<SessionId, (u64, String)>, usize) {
    let mut open = BTreeMap::new();
    let mut lines = 0;
    for line in text.lines() {
        lines += 1;
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["+", session, lease_ms, owner] => {
                let parsed = (
                    u64::from_str_radix(session, 16).ok(),
                    lease_ms.parse::<u64>().ok(),
                    decode(owner),
                );
                if let (Some(session), Some(lease_ms), Some(owner)) = parsed {
                    open.insert(session, (lease_ms, owner));
                }
            }
            ["-", session] => {
                if let Ok(session) = u64::from_str_radix(session, 16) {
                    open.remove(&session);
                }
            }
            // A torn line: skipped.
            _ => {}
        }
    }
    (open, lines)
}

fn line_of(session: SessionId, lease_ms: u64, owner: &str) -> String {
    format!("+ {session:x} {lease_ms} {}\n", encode(owner))
}

impl Ledger {
    /// Opens the ledger at `path` (made when missing): the sessions it holds as open are the
    /// ones a previous life of the server had open when it stopped.
    pub fn open(path: &Path) -> std::io::Result<(Ledger, Vec<Survivor>)> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let (open, lines) = parse(&text);
        let survivors = open
            .iter()
            .map(|(session, (lease_ms, owner))| Survivor {
                session: *session,
                owner: owner.clone(),
                lease_ms: *lease_ms,
            })
            .collect();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let ledger = Ledger {
            path: path.to_path_buf(),
            state: Mutex::new(State { file, open, lines }),
        };
        Ok((ledger, survivors))
    }

    /// Writes down that `session` (opened by `owner`, with `lease_ms`) is open, durably.
    pub fn hold(&self, session: SessionId, owner: &str, lease_ms: u64) -> std::io::Result<()> {
        let mut state = self.state.locked();
        state
            .file
            .write_all(line_of(session, lease_ms, owner).as_bytes())?;
        state.file.sync_data()?;
        state.open.insert(session, (lease_ms, owner.to_string()));
        state.lines += 1;
        Ok(())
    }

    /// Writes down that `session` ended (not synced: see the module).
    pub fn unhold(&self, session: SessionId) -> std::io::Result<()> {
        let mut state = self.state.locked();
        if state.open.remove(&session).is_none() {
            return Ok(());
        }
        state
            .file
            .write_all(format!("- {session:x}\n").as_bytes())?;
        state.lines += 1;
        if state.lines > 2 * state.open.len() + LINES_SLACK {
            self.rewrite(&mut state, None)?;
        }
        Ok(())
    }

    /// Rewrites the file with the sessions open now, and of those the previous lives left
    /// only the ones in `keep` (None: all of them).
    pub fn compact(&self, keep: Option<&[SessionId]>) -> std::io::Result<()> {
        let mut state = self.state.locked();
        self.rewrite(&mut state, keep)
    }

    fn rewrite(&self, state: &mut State, keep: Option<&[SessionId]>) -> std::io::Result<()> {
        if let Some(keep) = keep {
            state.open.retain(|session, _| keep.contains(session));
        }
        let mut text = String::new();
        for (session, (lease_ms, owner)) in &state.open {
            text.push_str(&line_of(*session, *lease_ms, owner));
        }
        let aside = self.path.with_extension("new");
        {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .open(&aside)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
        }
        std::fs::rename(&aside, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        state.file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        state.lines = state.open.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_finds_the_sessions_that_were_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LEDGER_FILE);
        let (ledger, survivors) = Ledger::open(&path).expect("open");
        assert!(survivors.is_empty());
        ledger.hold(1 << 32 | 1, "uid:0", 10_000).expect("hold");
        ledger
            .hold(1 << 32 | 2, "cert:mount:a b", 5_000)
            .expect("hold");
        ledger.hold(1 << 32 | 3, "uid:1000", 100).expect("hold");
        ledger.unhold(1 << 32 | 3).expect("unhold");
        drop(ledger);
        // A torn line at the end, as a crash while appending leaves.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("append");
        file.write_all(b"+ 100000004 100").expect("torn");
        drop(file);
        let (ledger, survivors) = Ledger::open(&path).expect("open again");
        let found: Vec<(u64, &str, u64)> = survivors
            .iter()
            .map(|s| (s.session, s.owner.as_str(), s.lease_ms))
            .collect();
        assert_eq!(
            found,
            [
                (1 << 32 | 1, "uid:0", 10_000),
                (1 << 32 | 2, "cert:mount:a b", 5_000)
            ]
        );
        // The grace is over: only this life's sessions stay.
        ledger.hold(2 << 32 | 1, "uid:0", 10_000).expect("hold");
        ledger.compact(Some(&[2 << 32 | 1])).expect("compact");
        let (_, survivors) = Ledger::open(&path).expect("open after compaction");
        assert_eq!(survivors.len(), 1);
        assert_eq!(survivors[0].session, 2 << 32 | 1);
    }

    #[test]
    fn the_file_stays_bounded_however_many_sessions_come_and_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LEDGER_FILE);
        let (ledger, _) = Ledger::open(&path).expect("open");
        ledger.hold(7, "uid:0", 10_000).expect("hold");
        for session in 100..3_100 {
            ledger.hold(session, "uid:0", 10_000).expect("hold");
            ledger.unhold(session).expect("unhold");
        }
        let lines = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count();
        assert!(lines <= 2 + LINES_SLACK + 2, "{lines} lines");
        let (_, survivors) = Ledger::open(&path).expect("open again");
        assert_eq!(survivors.len(), 1);
        assert_eq!(survivors[0].session, 7);
    }

    #[test]
    fn owners_round_trip_whatever_their_bytes() {
        for owner in ["uid:0", "cert:mount:node 17", "", "ü\n+ -"] {
            assert_eq!(decode(&encode(owner)).as_deref(), Some(owner));
        }
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("abc"), None);
    }
}
