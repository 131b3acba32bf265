//! calm's own processes for the benchmarks that run them as a site does: a `calm serve` and
//! `calm mount`s of it, started from the `calm` executable, each stopped (SIGTERM, then
//! waited for) when its guard goes, whatever happens to the benchmark. Mounts are made in the
//! caller's mount namespace: a benchmark enters a private one first (`crate::
//! enter_private_namespace`), so that they vanish with it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A calm process this crate started: its memory and CPU while it runs; stopped with SIGTERM
/// and waited for by [`Running::stop`], or when dropped.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// What it is, for errors ("calm serve").
    what: &'static str,
}

impl Running {
    /// Starts `command` with its output piped and waits for its first line, which `ready`
    /// accepts (or the process is stopped and the line named in the error).
    fn start<T>(
        mut command: Command,
        what: &'static str,
        ready: impl FnOnce(&str) -> Option<T>,
    ) -> Result<(Running, T), String> {
        let child = command
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {what}: {e}"))?;
        let mut running = Running { child, what };
        let line = first_line(&mut running.child)?;
        let ready =
            ready(&line).ok_or_else(|| format!("unexpected first line of {what}: {line:?}"))?;
        Ok((running, ready))
    }

    /// Resident memory, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.child.id())
    }

    /// The part of [`Running::rss_bytes`] no file backs (heap, stacks).
    pub fn anon_bytes(&self) -> u64 {
        anon_bytes(self.child.id())
    }

    /// CPU time (user + system) it has used, in microseconds.
    pub fn cpu_us(&self) -> u64 {
        cpu_us(self.child.id())
    }

    /// SIGTERM (a server closes its store, a mount unmounts), and waits for it.
    pub fn stop(mut self) -> Result<(), String> {
        terminate(&mut self.child, self.what)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = terminate(&mut self.child, self.what);
    }
}

/// A `calm serve` process on a data directory, serving on a loopback port.
#[derive(Debug)]
pub struct ServerProcess {
    pub process: Running,
    pub addr: String,
    pub data: PathBuf,
}

impl ServerProcess {
    /// Starts `calm serve --data DATA --listen 127.0.0.1:0 ARGS…` and waits for its ready line.
    pub fn start(calm: &Path, data: &Path, args: &[&str]) -> Result<ServerProcess, String> {
        let mut command = Command::new(calm);
        command
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(args);
        let (process, addr) = Running::start(command, "calm serve", |line| {
            calm_server::parse_ready_line(line).map(|(_, addr)| addr)
        })?;
        Ok(ServerProcess {
            process,
            addr,
            data: data.to_path_buf(),
        })
    }
}

/// A `calm mount` process.
#[derive(Debug)]
pub struct MountProcess {
    pub process: Running,
    pub mountpoint: PathBuf,
}

impl MountProcess {
    /// Starts `calm mount MOUNTPOINT --server ADDR ARGS…` (the directory is made) and waits
    /// until it is mounted.
    pub fn start(
        calm: &Path,
        mountpoint: &Path,
        server: &str,
        args: &[&str],
    ) -> Result<MountProcess, String> {
        std::fs::create_dir_all(mountpoint)
            .map_err(|e| format!("making {}: {e}", mountpoint.display()))?;
        let mut command = Command::new(calm);
        command
            .arg("mount")
            .arg(mountpoint)
            .args(["--server", server])
            .args(args);
        let (process, ()) = Running::start(command, "calm mount", |line| {
            line.starts_with("mounted at ").then_some(())
        })?;
        Ok(MountProcess {
            process,
            mountpoint: mountpoint.to_path_buf(),
        })
    }
}

/// The first line the process prints; the rest is read (and dropped) by a thread, so that
/// what it prints when it stops finds a reader.
fn first_line(child: &mut Child) -> Result<String, String> {
    let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .map_err(|e| format!("reading the first line: {e}"))?;
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Ok(line)
}

/// How long a process has to end after SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(30);

fn terminate(child: &mut Child, what: &str) -> Result<(), String> {
    if child.try_wait().ok().flatten().is_some() {
        return Ok(());
    }
    // SAFETY: kill(2) on the pid of our own child; no memory is shared.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("{what} ended with {status}")),
            Ok(None) if started.elapsed() < STOP_WAIT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what} did not stop within {STOP_WAIT:?}; killed"));
            }
        }
    }
}

/// utime + stime of `pid`, in microseconds (0 when it cannot be read).
pub fn cpu_us(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command may hold spaces: the fields count from the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Fields 14 and 15 of stat(5), here at 11 and 12 (state is field 3, index 0).
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    (ticks(11) + ticks(12)) * 1_000_000 / hz
}

/// Processor time (user + system) of this process so far, all its threads.
pub fn own_cpu() -> Duration {
    rusage_cpu(libc::RUSAGE_SELF)
}

/// Processor time (user + system) of this process's waited-for children so far.
pub fn children_cpu() -> Duration {
    rusage_cpu(libc::RUSAGE_CHILDREN)
}

fn rusage_cpu(who: libc::c_int) -> Duration {
    // SAFETY: rusage is plain data; getrusage(2) fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) into a valid rusage.
    unsafe { libc::getrusage(who, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// VmRSS of process `pid`, in bytes (0 when it cannot be read).
pub fn rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// RssAnon of process `pid` (its heap and other memory no file backs), in bytes.
pub fn anon_bytes(pid: u32) -> u64 {
    status_bytes(pid, "RssAnon:")
}

/// A figure in kB of `/proc/PID/status`, in bytes (0 when it cannot be read).
fn status_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix(field)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        })
        .map_or(0, |kib| kib * 1024)
}

/// Runs `calm ARGS…` to its end and parses what it printed as JSON.
pub fn calm_json(calm: &Path, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(calm)
        .args(args)
        .output()
        .map_err(|e| format!("running calm {args:?}: {e}"))?;
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "calm {args:?} ({}): {e}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
