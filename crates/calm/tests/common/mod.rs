//! Starting the real `calm` binary in tests: each server gets a temporary data directory and a
//! port the kernel picks (`--listen 127.0.0.1:0`, read back from the ready line), and is killed
//! when its guard is dropped, so a failing test never leaves a server behind.

#![allow(dead_code)] // each test file uses a part of this

mod metrics;
#[allow(unused_imports)]
pub use metrics::{free_port, http_get, http_get_when_ready, promtool_check_metrics, sample};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

/// The programs the mount tests run (conformance and lock scripts).
pub const PROGRAMS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs");

pub const CALM: &str = env!("CARGO_BIN_EXE_calm");

pub struct Server {
    pub child: Child,
    pub addr: String,
    pub ready_line: String,
    pub stdout: BufReader<ChildStdout>,
}

/// The mode the suite runs its servers and mounts in: `CALM_TEST_MODE=sync` gives each
/// `--sync` (every change durable when it returns, none answered by a mount itself), which
/// `scripts/test` runs the mount tests in a second time; by default, nothing.
fn mode_args(args: &[&str]) -> Vec<&'static str> {
    match sync_mode() && !args.contains(&"--sync") {
        true => vec!["--sync"],
        false => Vec::new(),
    }
}

/// Whether the suite runs in the mode where every change is durable when it returns
/// (`CALM_TEST_MODE=sync`).
pub fn sync_mode() -> bool {
    std::env::var("CALM_TEST_MODE").is_ok_and(|m| m == "sync")
}

impl Server {
    /// Starts `calm serve` on `data` and waits for its ready line.
    pub fn start(data: &Path) -> Server {
        Server::start_with(data, &[])
    }

    /// Starts `calm serve` on `data` with extra arguments.
    pub fn start_with(data: &Path, args: &[&str]) -> Server {
        Server::start_with_env(data, args, &[])
    }

    /// Starts `calm serve` on `data` with extra arguments and environment variables.
    pub fn start_with_env(data: &Path, args: &[&str], env: &[(String, String)]) -> Server {
        let mut child = Command::new(CALM)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("serve")
            .arg("--data")
            .arg(data)
            // A port the kernel picks, unless the test names one.
            .args(if args.contains(&"--listen") {
                &[][..]
            } else {
                &["--listen", "127.0.0.1:0"][..]
            })
            .args(args)
            .args(mode_args(args))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn calm serve");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the ready line");
        let Some((_, addr)) = calm_server::parse_ready_line(&line) else {
            let _ = child.kill();
            panic!("unexpected first line from calm serve: {line:?}");
        };
        Server {
            child,
            addr,
            ready_line: line,
            stdout,
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of our own child; no memory is shared.
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0, "kill({signal})");
    }

    /// kill -9, and wait until the process is gone.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }

    /// SIGTERM; returns the exit status and what the server printed after the ready line.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let status = self.child.wait().expect("wait");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        (status, rest)
    }
}

impl Server {
    /// SIGTERM with a mount of it open, a process on that mount holding a lock and another
    /// waiting for it (a watch stream, a lock session and a lock wait: what never ends by
    /// itself): the server must exit, cleanly, within `bound`. How long it took.
    pub fn stops_on_sigterm_with_a_mount(
        mut self,
        bound: std::time::Duration,
    ) -> std::time::Duration {
        let mount = Mount::remote(&self.addr, &[]);
        mount.sh_ok("echo x > held");
        let (mut holder, mut lines) = spawn_in(
            &mount,
            "import fcntl, os, time\nf = open(os.environ['MNT'] + '/held', 'r+')\n\
             fcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(3600)\n",
        );
        assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("held"));
        // And a process waiting for that lock.
        let (mut waiter, mut waiting) = spawn_in(
            &mount,
            "import fcntl, os\nf = open(os.environ['MNT'] + '/held', 'r+')\n\
             print('waiting', flush=True)\nfcntl.lockf(f, fcntl.LOCK_EX)\n",
        );
        assert_eq!(
            waiting.next().and_then(Result::ok).as_deref(),
            Some("waiting")
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        let asked = std::time::Instant::now();
        self.signal(libc::SIGTERM);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                asked.elapsed() < bound,
                "the server still runs {bound:?} after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let took = asked.elapsed();
        // The mount first: the holder's exit releases its lock through the mount, which
        // would wait for a server that is gone.
        drop(mount);
        for process in [&mut holder, &mut waiter] {
            let _ = process.kill();
            let _ = process.wait();
        }
        assert!(status.success(), "{status}");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        assert!(rest.contains("stopped"), "{rest}");
        took
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `calm ARGS…` to completion.
pub fn calm(args: &[&str]) -> Output {
    Command::new(CALM).args(args).output().expect("run calm")
}

/// Runs `calm ARGS…` (with `env` added to its environment), which must succeed, and reads
/// its standard output as JSON.
pub fn calm_json_env(args: &[&str], env: &[(String, String)]) -> serde_json::Value {
    let out = Command::new(CALM)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run calm");
    assert!(
        out.status.success(),
        "calm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// [`calm_json_env`] with the test's own environment.
pub fn calm_json(args: &[&str]) -> serde_json::Value {
    calm_json_env(args, &[])
}

/// Every file under `dir`, sorted.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// A python program run in `mount`'s namespace, with its mount point in `$MNT`, its output
/// read line by line and its standard input a pipe the test may write to.
pub fn spawn_in(mount: &Mount, program: &str) -> (Child, std::io::Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new("nsenter")
        .args([
            "-t",
            &mount.pid().to_string(),
            "-m",
            "--",
            "python3",
            "-c",
            program,
        ])
        .current_dir("/")
        .env("MNT", &mount.mnt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn python3");
    let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    (child, lines)
}

pub fn data_dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("data")
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A `calm mount` process in its own mount namespace.
pub struct Mount {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
    /// The mount point (mounted only inside the namespace).
    pub mnt: PathBuf,
    /// The in-process server's address, with --embedded (the last it serves on).
    pub addr: Option<String>,
    /// Its Unix socket, with --embedded.
    pub socket: Option<String>,
    /// Its FUSE connection (the name of its directory in /sys/fs/fuse/connections).
    connection: Option<u64>,
    _dir: tempfile::TempDir,
}

impl Mount {
    /// `calm mount --embedded` on a fresh store.
    pub fn embedded(extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let args = [
            "--embedded",
            data.to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
        ];
        Mount::start(dir, &args, extra)
    }

    /// `calm mount --server ADDR`.
    pub fn remote(server: &str, extra: &[&str]) -> Mount {
        Mount::remote_env(server, extra, &[])
    }

    /// `calm mount --server ADDR` with environment variables (an S3 store's credentials).
    pub fn remote_env(server: &str, extra: &[&str], env: &[(String, String)]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        Mount::start_env(dir, &["--server", server], extra, env)
    }

    pub fn start(dir: tempfile::TempDir, args: &[&str], extra: &[&str]) -> Mount {
        Mount::start_env(dir, args, extra, &[])
    }

    pub fn start_env(
        dir: tempfile::TempDir,
        args: &[&str],
        extra: &[&str],
        env: &[(String, String)],
    ) -> Mount {
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let mut child = Command::new("unshare")
            // A block cache, when the store is remote, stays in the test's directory.
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["--mount", "--propagation", "private", "--"])
            .arg(CALM)
            .arg("mount")
            .arg(&mnt)
            .args(args)
            .args(extra)
            .args(mode_args(&[args, extra].concat()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn unshare calm mount");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the mounted line");
        if !line.starts_with("mounted at ") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("unexpected first line from calm mount: {line:?}");
        }
        // "serving on unix:… and 127.0.0.1:PORT": the last one (the test's --listen, when
        // it gave one).
        let addr = line
            .split("serving on ")
            .nth(1)
            .and_then(|a| a.split_whitespace().last())
            .map(str::to_string);
        let socket = line
            .split_whitespace()
            .find(|word| word.starts_with("unix:"))
            .map(str::to_string);
        let connection = fuse_connection(child.id(), &mnt);
        Mount {
            child,
            stdout,
            mnt,
            addr,
            socket,
            connection,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `script` with bash inside the mount's namespace, in the mount point, with `$MNT`
    /// set to it.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.pid().to_string(),
                "-m",
                "--",
                "bash",
                "-euo",
                "pipefail",
                "-c",
            ])
            // nsenter starts in the namespace's root directory.
            .arg(format!("cd \"$MNT\"\n{script}"))
            .env("MNT", &self.mnt)
            .env("PROGRAMS", PROGRAMS)
            .output()
            .expect("nsenter")
    }

    /// Like [`Mount::sh`], and asserts success; returns stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "script failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// Runs `python3 PROGRAMS/PROGRAM DIR` on a fresh tmpfs and then on this mount (inside
    /// its namespace); returns what it printed on each: (tmpfs, calm).
    pub fn beside_tmpfs(&self, program: &str) -> (String, String) {
        let out = self.sh_ok(&format!(
            "tmp=$(mktemp -d); mount -t tmpfs calm-test-tmpfs \"$tmp\"
             python3 \"$PROGRAMS/{program}\" \"$tmp\" > \"$tmp.tmpfs\"
             python3 \"$PROGRAMS/{program}\" \"$MNT\" > \"$tmp.calm\"
             umount \"$tmp\"; rmdir \"$tmp\"
             echo ===tmpfs; cat \"$tmp.tmpfs\"; echo ===calm; cat \"$tmp.calm\"
             rm \"$tmp.tmpfs\" \"$tmp.calm\""
        ));
        let (tmpfs, calm) = out.split_once("===calm\n").expect("both outputs");
        let tmpfs = tmpfs.strip_prefix("===tmpfs\n").expect("tmpfs output");
        (tmpfs.to_string(), calm.to_string())
    }

    /// SIGTERM; returns the exit status and what the process printed after the mounted line.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        (status, rest)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // A mount killed while one of its threads waits in the kernel for a page that a
        // request to the mount holds locked (an invalidation racing a read the killed mount
        // will never answer) cannot exit: its FUSE connection is aborted then, as an
        // administrator would (`echo 1 > /sys/fs/fuse/connections/N/abort`), so that a failed
        // or killed test leaves nothing hung behind.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None))
            && let Some(connection) = self.connection
        {
            eprintln!(
                "mount {} did not exit when killed: aborting its FUSE connection",
                self.child.id()
            );
            abort_fuse_connection(connection);
        }
        let _ = self.child.wait();
    }
}

/// The FUSE connection of the file system mounted at `mnt` in the mount namespace of `pid`:
/// the minor number of its device (`stat`'s st_dev, major 0).
fn fuse_connection(pid: u32, mnt: &Path) -> Option<u64> {
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "--", "stat", "-c", "%d"])
        .arg(mnt)
        .output()
        .ok()?;
    let dev: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    // Linux's encoding of a device number: minor's low 8 bits, major, minor's high bits.
    Some((dev & 0xff) | ((dev >> 12) & !0xff))
}

/// Aborts FUSE connection `connection` (mounting the fuse control file system first when the
/// machine has not).
fn abort_fuse_connection(connection: u64) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(connection.to_string()).exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(dir)
            .status();
    }
    let _ = std::fs::write(dir.join(connection.to_string()).join("abort"), b"1");
}

/// The S3 store of a test: scripts/test's Garage (`CALM_TEST_S3` and the AWS variables in the
/// environment), or, when a test runs alone, a Garage of its own (`scripts/s3-server`), stopped
/// when this goes. Each test names a prefix of its own inside the bucket.
pub struct S3 {
    /// `s3://BUCKET?endpoint=…` as scripts/s3-server prints it.
    base: String,
    /// Credentials to hand to the processes (empty when they are in the environment).
    pub env: Vec<(String, String)>,
    private: Option<tempfile::TempDir>,
}

const S3_SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/s3-server");

impl S3 {
    pub fn get() -> S3 {
        if let Ok(base) = std::env::var("CALM_TEST_S3") {
            return S3 {
                base,
                env: Vec::new(),
                private: None,
            };
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(S3_SERVER)
            .arg("start")
            .arg(dir.path().join("s3"))
            .output()
            .expect("run scripts/s3-server");
        assert!(
            out.status.success(),
            "starting Garage (scripts/setup --with-s3 installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut base = String::new();
        let mut env = Vec::new();
        for line in String::from_utf8(out.stdout).expect("utf-8").lines() {
            let (key, value) = line.split_once('=').expect("KEY='value'");
            let value = value.trim_matches('\'').to_string();
            if key == "CALM_TEST_S3" {
                base = value;
            } else {
                env.push((key.to_string(), value));
            }
        }
        S3 {
            base,
            env,
            private: Some(dir),
        }
    }

    /// The store's URL with `prefix` inside the bucket.
    pub fn url(&self, prefix: &str) -> String {
        let (location, query) = self.base.split_once('?').unwrap_or((&self.base, ""));
        format!("{}/{prefix}?{query}", location.trim_end_matches('/'))
    }
}

impl S3 {
    /// Deletes object `key` (below `prefix`) from the bucket behind the mounts' backs, with
    /// curl's own AWS signature (no S3 client of calm's).
    pub fn delete_object(&self, prefix: &str, key: &str) {
        let (location, query) = self.base.split_once('?').expect("s3://BUCKET?QUERY");
        let bucket = location.trim_start_matches("s3://").trim_end_matches('/');
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("{name} in {query}"))
                .to_string()
        };
        let credential = |name: &str| {
            self.env
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(name).ok())
                .unwrap_or_else(|| panic!("{name} for the S3 server"))
        };
        let out = Command::new("curl")
            .args(["-sS", "--fail-with-body", "-X", "DELETE"])
            .args([
                "-H",
                "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                "--aws-sigv4",
            ])
            .arg(format!("aws:amz:{}:s3", param("region")))
            .arg("--user")
            .arg(format!(
                "{}:{}",
                credential("AWS_ACCESS_KEY_ID"),
                credential("AWS_SECRET_ACCESS_KEY")
            ))
            .arg(format!("{}/{bucket}/{prefix}/{key}", param("endpoint")))
            .output()
            .expect("run curl");
        assert!(
            out.status.success(),
            "deleting {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        if let Some(dir) = &self.private {
            let _ = Command::new(S3_SERVER)
                .arg("stop")
                .arg(dir.path().join("s3"))
                .output();
        }
    }
}

/// A prefix no other test of this run uses.
pub fn unique_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// `run` on each of `items`, each on a thread of its own, all at once; the results in order.
pub fn all_at_once<T: Send, R: Send>(items: Vec<T>, run: impl Fn(T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|scope| {
        let run = &run;
        let workers: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || run(item)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    })
}

/// Runs `program` of the test programs with python3 in `mount`'s namespace, ended after
/// `timeout_s` seconds (a hang fails the test instead of the suite).
pub fn python_in(
    mount: &Mount,
    timeout_s: u32,
    program: &str,
    args: &[String],
) -> std::process::Output {
    std::process::Command::new("timeout")
        .arg(timeout_s.to_string())
        .args(["nsenter", "-t", &mount.pid().to_string(), "-m", "--"])
        .arg("python3")
        .arg(format!("{}/{program}", PROGRAMS))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// The user an unprivileged program runs as (`nobody` on Debian).
pub const UNPRIVILEGED_UID: u32 = 65534;

/// Runs `program` of the test programs as [`UNPRIVILEGED_UID`], with no supplementary groups,
/// in `mount`'s namespace (which needs `--allow-other`, and a path to it others may go
/// through), ended after `timeout_s` seconds. The program is read from its standard input (the
/// checkout may be closed to other users) by the system's python3 (a python of root's own may
/// be too).
pub fn python_unprivileged_in(
    mount: &Mount,
    timeout_s: u32,
    program: &str,
    args: &[String],
) -> std::process::Output {
    let source = std::fs::File::open(format!("{PROGRAMS}/{program}"))
        .unwrap_or_else(|e| panic!("open {program}: {e}"));
    let id = UNPRIVILEGED_UID.to_string();
    std::process::Command::new("timeout")
        .arg(timeout_s.to_string())
        .args(["nsenter", "-t", &mount.pid().to_string(), "-m", "--"])
        .args(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"])
        .args(["/usr/bin/python3", "-"])
        .args(args)
        .stdin(source)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// The URL of a fresh prefix on scripts/test's etcd cluster, or on a private one (kept in
/// `private` until the test ends) when the test runs alone.
pub fn etcd_url(name: &str, private: &mut Option<calm_testkit::etcd::LocalCluster>) -> String {
    let prefix = calm_testkit::etcd::unique_prefix(name);
    calm_testkit::etcd::shared_url(&prefix).unwrap_or_else(|| {
        private
            .insert(calm_testkit::etcd::LocalCluster::start(3).expect("starting etcd"))
            .url(&prefix)
    })
}

/// Two tests of one body, one on each store the data plane has: `$local` with the objects in
/// a local directory, `$s3` on the test S3 server (under `$prefix`); each calls
/// `$body(backend, $args…)`.
#[macro_export]
macro_rules! on_each_store {
    ($body:ident($($arg:expr),*): $local:ident, $s3:ident, $prefix:literal) => {
        #[test]
        fn $local() {
            $body(common::Backend::File $(, $arg)*);
        }

        #[test]
        fn $s3() {
            $body(common::Backend::s3($prefix) $(, $arg)*);
        }
    };
}

/// Where a test's namespace keeps its file contents.
pub enum Backend {
    /// The default: a local directory beside the store.
    File,
    /// The run's S3 server, under a prefix of the test's own.
    S3(S3, String),
}

impl Backend {
    pub fn s3(test: &str) -> Backend {
        Backend::S3(S3::get(), unique_prefix(test))
    }

    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            Backend::File => Vec::new(),
            Backend::S3(s3, _) => s3.env.clone(),
        }
    }

    /// A server on a fresh store in `tmp`, and two mounts of it.
    pub fn two_mounts(&self, tmp: &tempfile::TempDir) -> (Server, Mount, Mount) {
        self.two_mounts_with(tmp, &[])
    }

    /// [`Backend::two_mounts`], each mount with `extra` arguments.
    pub fn two_mounts_with(
        &self,
        tmp: &tempfile::TempDir,
        extra: &[&str],
    ) -> (Server, Mount, Mount) {
        let data = data_dir(tmp);
        let server = match self {
            Backend::File => Server::start(&data),
            Backend::S3(s3, prefix) => {
                Server::start_with_env(&data, &["--objects", &s3.url(prefix)], &s3.env)
            }
        };
        let a = Mount::remote_env(&server.addr, extra, &self.env());
        let b = Mount::remote_env(&server.addr, extra, &self.env());
        (server, a, b)
    }
}

/// The makes and removals a mount answered itself, in directories it made, from its counters.
pub fn answered_here(mount: &Mount) -> u64 {
    mount_counter(mount, "calm_mount_answered_here_total ")
}

/// Waits (at most 30 s) until `mount` may hold files and directories: it follows the server's
/// changes and its stream of recalls is open (what it makes from then on it may hold).
pub fn until_it_may_hold(mount: &Mount) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while mount_counter(mount, "calm_mount_may_hold ") != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the mount may not hold files 30 s after it started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The truncates of files it holds a mount answered itself, from its counters.
pub fn cuts_answered_here(mount: &Mount) -> u64 {
    mount_counter(mount, "calm_mount_kept_changes_total{kind=\"size\"} ")
}

/// The value of the sample `series` (its name, labels and a space) of a mount's counters.
fn mount_counter(mount: &Mount, series: &str) -> u64 {
    let out =
        mount.sh_ok("python3 -c \"import os; print(os.getxattr('.', 'calm.metrics').decode())\"");
    out.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
