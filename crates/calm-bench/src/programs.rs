//! Real programs on a file system, for `calm-bench mount --programs`: several sqlite writers
//! inserting into one database file (rollback journal, and write-ahead log), each insert its
//! own transaction, so every one takes and gives back sqlite's fcntl locks and syncs; and tar
//! extracting a tarball of small files. Each run is checked: every row is in the database and
//! every file was extracted, or the run is an error.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::syscalls::MountResult;

/// What the programs do.
#[derive(Debug, Clone, Copy)]
pub struct ProgramOptions {
    /// Concurrent sqlite writer processes.
    pub writers: usize,
    /// Rows each writer inserts, one transaction each.
    pub rows: usize,
    /// Files in the tarball (in directories of 100).
    pub tar_files: usize,
}

impl Default for ProgramOptions {
    fn default() -> Self {
        ProgramOptions {
            writers: 4,
            rows: 500,
            tar_files: 2000,
        }
    }
}

const WRITER: &str = r#"
import sqlite3, sys
path, writer, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
db = sqlite3.connect(path, timeout=600, isolation_level=None)
for i in range(rows):
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (?, ?, ?)", (writer, i, "x" * 100))
    db.execute("COMMIT")
db.close()
"#;

fn python(args: &[&str]) -> Command {
    let mut command = Command::new("python3");
    command.arg("-c").args(args);
    command
}

fn run(mut command: Command, what: &str) -> Result<String, String> {
    let out = command
        .output()
        .map_err(|e| format!("{what}: starting it: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `writers` processes inserting `rows` rows each into one database in `dir` (journal mode
/// `mode`: "delete" or "wal"); the seconds they took, after checking every row is there.
fn sqlite(dir: &Path, mode: &str, options: &ProgramOptions) -> Result<f64, String> {
    let db = dir.join(format!("writers-{mode}.db"));
    let path = db.to_str().ok_or("a database path that is not UTF-8")?;
    run(
        python(&[
            &format!(
                "import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1])\n\
                 db.execute('PRAGMA journal_mode={mode}')\n\
                 db.execute('CREATE TABLE t (writer INTEGER, i INTEGER, v TEXT)')\n\
                 db.commit()"
            ),
            path,
        ]),
        "sqlite: making the database",
    )?;
    let started = Instant::now();
    let children: Vec<_> = (0..options.writers)
        .map(|w| {
            python(&[WRITER, path, &w.to_string(), &options.rows.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("sqlite: starting writer {w}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    for (w, child) in children.into_iter().enumerate() {
        let out = child
            .wait_with_output()
            .map_err(|e| format!("sqlite: writer {w}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "sqlite: writer {w}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let count = run(
        python(&[
            "import sqlite3, sys\nprint(sqlite3.connect(sys.argv[1]).execute(\
             'SELECT count(*) FROM t').fetchone()[0])",
            path,
        ]),
        "sqlite: counting the rows",
    )?;
    let expected = options.writers * options.rows;
    if count.trim() != expected.to_string() {
        return Err(format!(
            "sqlite ({mode}): {} rows, expected {expected}",
            count.trim()
        ));
    }
    Ok(seconds)
}

/// Makes the tarball of `files` small files (100 to 8 000 bytes) in `scratch`.
pub fn make_tarball(scratch: &Path, files: usize) -> Result<std::path::PathBuf, String> {
    let tree = scratch.join("tree");
    for i in 0..files {
        let dir = tree.join(format!("d{:03}", i / 100));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let bytes = vec![b'a' + (i % 26) as u8; 100 + (i * 997) % 7900];
        std::fs::write(dir.join(format!("f{i:05}")), bytes).map_err(|e| e.to_string())?;
    }
    let ball = scratch.join("tree.tar");
    let mut tar = Command::new("tar");
    tar.arg("-cf").arg(&ball).arg("-C").arg(scratch).arg("tree");
    run(tar, "tar: making the tarball")?;
    std::fs::remove_dir_all(&tree).map_err(|e| e.to_string())?;
    Ok(ball)
}

/// Extracts `ball` into `dir`: the seconds it took, after checking every file is there.
fn extract(dir: &Path, ball: &Path, files: usize) -> Result<f64, String> {
    let started = Instant::now();
    let mut tar = Command::new("tar");
    tar.arg("-xf").arg(ball).arg("-C").arg(dir);
    run(tar, "tar: extracting")?;
    let seconds = started.elapsed().as_secs_f64();
    let mut found = 0;
    for entry in walk(&dir.join("tree"))? {
        if entry.is_file() {
            found += 1;
        }
    }
    if found != files {
        return Err(format!("tar: {found} files extracted, expected {files}"));
    }
    Ok(seconds)
}

fn walk(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            out.extend(walk(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

/// Runs every program in a fresh directory under `root` of file system `fs`; `ball` is the
/// tarball. The results count rows or files per second.
pub fn run_all(
    fs: &str,
    root: &Path,
    ball: &Path,
    options: &ProgramOptions,
) -> Result<Vec<MountResult>, String> {
    let dir = tempfile::Builder::new()
        .prefix("calm-bench-programs-")
        .tempdir_in(root)
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let rows = (options.writers * options.rows) as u64;
    let files = options.tar_files as u64;
    let mut results = Vec::new();
    for (op, mode) in [("sqlite-writers", "delete"), ("sqlite-writers-wal", "wal")] {
        let seconds = sqlite(dir.path(), mode, options)?;
        results.push(crate::syscalls::result(
            fs,
            op,
            options.writers,
            rows,
            rows,
            seconds,
        ));
    }
    let seconds = extract(dir.path(), ball, options.tar_files)?;
    results.push(crate::syscalls::result(
        fs,
        "tar-extract",
        1,
        files,
        files,
        seconds,
    ));
    Ok(results)
}
