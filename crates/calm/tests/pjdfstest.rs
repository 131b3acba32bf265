//! pjdfstest, the POSIX conformance suite of file systems (chmod, chown, link, mkdir, mkfifo,
//! mknod, open, rename, rmdir, symlink, truncate, unlink, utimensat, posix_fallocate: 8 798
//! cases), through a real mount as root with `--allow-other`, in the default mode (files held,
//! changes sent at close) and with `--sync` (every change durable when it returns). Every case
//! must pass.
//!
//! Its sources are kept in `third_party/pjdfstest` with their license; the test builds them
//! once into cargo's temporary directory (autoconf, automake, a C compiler and make, which
//! `scripts/setup` installs) and runs them with `prove`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::Mount;

/// The suite's sources in the repository.
const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../third_party/pjdfstest");

/// The suite built (its `tests` directory beside the `pjdfstest` program it runs), once per
/// run of this test binary; built again when the sources are newer than the build. Built under
/// a lock on a file beside it, so that the tests of both modes, each a process of its own, do
/// not build it into one directory at once.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lock =
            std::fs::File::create(Path::new(env!("CARGO_TARGET_TMPDIR")).join("pjdfstest.lock"))
                .expect("the build's lock file");
        lock.lock().expect("locking the build");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pjdfstest");
        let stamp = dir.join("built-from");
        let sources = std::fs::canonicalize(SOURCES).expect("third_party/pjdfstest");
        let wanted = newest_change(&sources).to_string();
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str())
            && dir.join("pjdfstest").exists()
        {
            return dir;
        }
        let _ = std::fs::remove_dir_all(&dir);
        let copied = Command::new("cp")
            .arg("-r")
            .arg(&sources)
            .arg(&dir)
            .status()
            .expect("cp");
        assert!(copied.success(), "copying the pjdfstest sources");
        let out = Command::new("bash")
            .args([
                "-euc",
                "autoreconf -ifs && ./configure --quiet && make --silent pjdfstest",
            ])
            .current_dir(&dir)
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "building pjdfstest (autoconf, automake, cc and make are needed: scripts/setup \
             installs them):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, wanted).expect("stamp");
        dir
    })
}

/// The latest modification time under `dir`, in seconds (what a new copy of the sources
/// changes).
fn newest_change(dir: &Path) -> u64 {
    let mut newest = 0;
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("metadata");
        let time = meta
            .modified()
            .expect("mtime")
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        newest = newest.max(time);
        if meta.is_dir() {
            newest = newest.max(newest_change(&entry.path()));
        }
    }
    newest
}

/// Runs the whole suite in a fresh directory of a mount made with `extra`; asserts that every
/// case passed, and that all of them ran.
fn passes_every_case(extra: &[&str]) {
    let suite = built();
    let mut args = vec!["--allow-other"];
    args.extend_from_slice(extra);
    let mount = Mount::embedded(&args);
    // The suite's cases run as several users: the mount's root is open to them.
    let out = mount.sh(&format!(
        "chmod 755 \"$MNT\"; mkdir suite; cd suite
         prove -r '{}/tests' 2>&1",
        suite.display()
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text
        .rsplit_once("Test Summary Report")
        .map(|(_, summary)| summary)
        .or_else(|| text.rsplit_once("All tests successful.").map(|(_, s)| s))
        .unwrap_or(&text);
    assert!(
        out.status.success() && text.contains("Result: PASS"),
        "pjdfstest failed through `calm mount {}`:\n{}\n(stderr: {})",
        args.join(" "),
        failures(&text),
        String::from_utf8_lossy(&out.stderr)
    );
    let ran: u64 = summary
        .split("Tests=")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of cases in:\n{summary}"));
    assert!(ran >= 8_700, "every case ran: {ran}\n{summary}");
}

/// The lines of prove's output about failed cases (its per-file lines that are not `ok`, and
/// its summary).
fn failures(text: &str) -> String {
    text.lines()
        .filter(|line| !line.ends_with(" ok"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_case_passes_with_files_held() {
    passes_every_case(&[]);
}

#[test]
fn every_case_passes_with_every_change_durable() {
    passes_every_case(&["--sync"]);
}
