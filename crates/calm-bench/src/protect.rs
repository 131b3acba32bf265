//! `calm-bench protect`: what the metadata's protection costs at N files. For each N a store
//! is populated through the real create path (empty files, `files_per_dir` per directory),
//! then, each as its own process of the `calm` binary as a user runs it: `calm dump --data`
//! into a file and `calm load` of that file into a new directory, timed, with each process's
//! peak resident memory (its maximum RSS, from wait4). The baseline of the same run: a plain
//! copy of the store's directory (`cp -a`, what an operator without a dump would back up with)
//! for the dump, and the rate the namespace was created at for the load. The loaded store is
//! checked with fsck (clean, and as many inodes as the dump counted).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

use crate::startup::{StartupOptions, populate};

#[derive(Debug, Clone)]
pub struct ProtectOptions {
    pub files: Vec<u64>,
    pub dir: PathBuf,
    pub calm_exe: PathBuf,
    pub files_per_dir: u64,
    pub populate_tasks: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProtectResult {
    pub files: u64,
    pub store_bytes: u64,
    pub dump_bytes: u64,
    /// The namespace's creation through the create path (the load's baseline).
    pub create_per_s: f64,
    /// `cp -a` of the store's directory (the dump's baseline).
    pub copy_s: f64,
    pub dump_s: f64,
    pub dump_files_per_s: f64,
    /// Peak anonymous memory (heap) of `calm dump`, sampled every 2 ms.
    pub dump_peak_mib: f64,
    /// Its maximum RSS, the store's mapped pages included.
    pub dump_rss_mib: f64,
    pub load_s: f64,
    pub load_files_per_s: f64,
    pub load_peak_mib: f64,
    pub load_rss_mib: f64,
    /// fsck of the loaded store: clean, with the inodes the dump counted.
    pub loaded_clean: bool,
    pub inodes: u64,
}

/// Runs `command` to its end; returns its wall time, peak RSS and peak anonymous memory
/// (MiB), and its output; or what it said when it failed.
fn timed(command: &mut Command) -> Result<(f64, f64, f64, Vec<u8>), String> {
    let started = Instant::now();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {command:?}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    // Read the output on threads: a child whose pipe fills would never end.
    let mut child = child;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    // The peak of the process's anonymous memory (its heap: the store's pages it maps are
    // file pages, which the maximum RSS counts too), sampled every 2 ms while it runs.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak_kib = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(kib) = rss_anon_kib(pid) {
                    peak_kib = peak_kib.max(kib);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak_kib
        })
    };
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid we hold and nobody else reaps.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = started.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let anon_mib = sampler.join().unwrap_or(0) as f64 / 1024.0;
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if reaped != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&stderr)
        ));
    }
    drop(child); // reaped above
    Ok((seconds, usage.ru_maxrss as f64 / 1024.0, anon_mib, stdout))
}

fn rss_anon_kib(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub fn run(options: &ProtectOptions) -> Result<Vec<ProtectResult>, String> {
    let mut results = Vec::new();
    for &files in &options.files {
        let work = tempfile::tempdir_in(&options.dir).map_err(|e| e.to_string())?;
        let data = work.path().join("data");
        let populate_options = StartupOptions {
            files: vec![files],
            dir: options.dir.clone(),
            calm_exe: options.calm_exe.clone(),
            files_per_dir: options.files_per_dir,
            populate_tasks: options.populate_tasks,
            repeat: 1,
            wal: true,
        };
        let seconds = populate(&data, files, &populate_options)?;
        let create_per_s = files as f64 / seconds.max(1e-9);
        let store_bytes = dir_bytes(&data);

        let copy = work.path().join("copy");
        let (copy_s, _, _, _) = timed(Command::new("cp").arg("-a").arg(&data).arg(&copy))?;
        let _ = std::fs::remove_dir_all(&copy);

        let file = work.path().join("n.calmdump");
        let exe = &options.calm_exe;
        let (dump_s, dump_rss_mib, dump_peak_mib, _) = timed(
            Command::new(exe)
                .args(["dump", "--json", "--data"])
                .arg(&data)
                .arg(&file),
        )?;
        let dump_bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
        let loaded = work.path().join("loaded");
        // A copy beside the original: its own object store (empty files: nothing to copy).
        let loaded_objects = calm_data::ObjectsUrl::file(&work.path().join("loaded-objects"));
        let (load_s, load_rss_mib, load_peak_mib, said) = timed(
            Command::new(exe)
                .args(["load", "--json", "--objects", &loaded_objects, "--data"])
                .arg(&loaded)
                .arg(&file),
        )?;
        let said: serde_json::Value =
            serde_json::from_slice(&said).map_err(|e| format!("calm load said: {e}"))?;
        let inodes = said["inodes"].as_u64().unwrap_or(0);
        let fsck = Command::new(exe)
            .args(["fsck", "--json"])
            .arg(&loaded)
            .output()
            .map_err(|e| e.to_string())?;
        let fsck: serde_json::Value =
            serde_json::from_slice(&fsck.stdout).map_err(|e| format!("fsck said: {e}"))?;
        let loaded_clean = fsck["clean"] == true && fsck["inodes"].as_u64() == Some(inodes);
        results.push(ProtectResult {
            files,
            store_bytes,
            dump_bytes,
            create_per_s,
            copy_s,
            dump_s,
            dump_files_per_s: files as f64 / dump_s.max(1e-9),
            dump_peak_mib,
            dump_rss_mib,
            load_s,
            load_files_per_s: files as f64 / load_s.max(1e-9),
            load_peak_mib,
            load_rss_mib,
            loaded_clean,
            inodes,
        });
    }
    Ok(results)
}

pub fn table(results: &[ProtectResult]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>9} {:>9} {:>8} {:>8} {:>8} {:>11} {:>9} {:>8} {:>11} {:>9} {:>10} {:>7}",
        "files",
        "store MB",
        "dump MB",
        "cp -a s",
        "dump s",
        "dump f/s",
        "dump heap",
        "load s",
        "load f/s",
        "load heap",
        "create/s",
        "fsck"
    )];
    for r in results {
        lines.push(format!(
            "{:>9} {:>9.1} {:>8.1} {:>8.2} {:>8.2} {:>11.0} {:>9.1} {:>8.2} {:>11.0} {:>9.1} {:>10.0} {:>7}",
            r.files,
            r.store_bytes as f64 / 1e6,
            r.dump_bytes as f64 / 1e6,
            r.copy_s,
            r.dump_s,
            r.dump_files_per_s,
            r.dump_peak_mib,
            r.load_s,
            r.load_files_per_s,
            r.load_peak_mib,
            r.create_per_s,
            if r.loaded_clean { "clean" } else { "WRONG" }
        ));
    }
    lines.push(
        "(dump and load: `calm dump --data` and `calm load` as processes, wall time and peak \
         anonymous memory in MiB, sampled every 2 ms; baselines: cp -a of the store \
         directory, creates through the namespace)"
            .to_string(),
    );
    lines
}

/// Seconds to protect the namespace (a dump, a plain copy of the store) and to rebuild it (a
/// load, the creation it stands in for), by files.
pub fn plot(
    results: &[ProtectResult],
    clones: &[crate::mistakes::CloneResult],
    path: &Path,
) -> Result<(), String> {
    let cell = |panel: &str, series: &str, r: &ProtectResult, y: f64| {
        crate::multiples::Cell::at(panel, ("files", r.files as f64), ("seconds", y), series).log()
    };
    let cells = results.iter().flat_map(|r| {
        [
            cell("keeping the metadata", "calm dump", r, r.dump_s),
            cell("keeping the metadata", "cp -a of the store", r, r.copy_s),
            cell("bringing it back", "calm load", r, r.load_s),
            cell(
                "bringing it back",
                "creating the files again",
                r,
                r.files as f64 / r.create_per_s.max(1e-9),
            ),
        ]
    });
    let copies = clones.iter().flat_map(|c| {
        let at = |series: &str, y: f64| {
            let panel = "copying a tree through the mount";
            crate::multiples::Cell::at(panel, ("files", c.files as f64), ("seconds", y), series)
                .log()
        };
        [at("calm clone", c.clone_s), at("cp -r", c.cp_s)]
    });
    crate::multiples::small_multiples_svg(
        path,
        "calm-bench protect: dump and load of the metadata, clones",
        &crate::multiples::facets_of(cells.chain(copies)),
    )
}
