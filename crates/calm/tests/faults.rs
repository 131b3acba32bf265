//! What a program was told holds through every fault: an error of a commit reaches every open
//! file that had bytes in it; a write acknowledged durable survives kills and outages of the
//! server of any length; no call waits past its bound, and a caller killed while it waits is
//! let go at once.

use crate::common;

use std::time::Duration;

use common::{Mount, calm};

fn lines(text: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(text)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Under a tree limit of 2 MiB, one open file writes 100 bytes inside a file of 512 KiB and
/// another writes past the limit: the refused commit held both, and each of them is told,
/// once (at its fsync, its close or its next write); bytes written after the refusal stay,
/// as another mount reads them.
#[test]
fn a_refused_commit_is_told_to_every_open_file_that_wrote_in_it() {
    let mount = Mount::embedded(&["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    mount.sh_ok("mkdir -m 777 proj");
    let out = calm(&[
        "quota", "--server", &socket, "set", "/proj", "--bytes", "2M",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = mount.mnt.join("proj").display().to_string();
    let out = common::python_unprivileged_in(&mount, 120, "refused_commit.py", &[dir]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        lines(&out.stdout),
        [
            // One descriptor over the limit, another with 100 bytes inside the file, a reader.
            "fsync-over EDQUOT",
            "fsync-other EDQUOT",
            "fsync-other-again 0",
            "fsync-reader 0",
            "close-other 0",
            "close-over 0",
            // Told at close.
            "close-over EDQUOT",
            "close-other EDQUOT",
            // Told by the next write, which writes nothing.
            "fsync-over EDQUOT",
            "write-other EDQUOT",
            "write-other-again 0",
            "fsync-other 0",
        ]
    );
    let other = Mount::remote(&socket, &[]);
    let dir = other.mnt.join("proj").display().to_string();
    let out = common::python_in(&other, 60, "refused_commit.py", &[dir, "--read".into()]);
    assert_eq!(
        lines(&out.stdout),
        [
            // size, then bytes of A (dropped), C (after the refusal), D (the write that was
            // told), E (the write after it).
            "by-fsync 524288 0 100 0 0",
            "by-close 524288 0 0 0 0",
            "by-write 524288 0 0 0 100",
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let check = calm(&["quota", "--server", &socket, "check"]);
    assert!(String::from_utf8_lossy(&check.stdout).contains("every usage kept"));
}

/// A writer of `acked_writes.py` on a mount, as an unprivileged user: its lines collected as
/// they come.
struct Writer {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Writer {
    fn start(mount: &Mount, file: &str, index: usize, stop: &str) -> Writer {
        let source = std::fs::File::open(format!("{}/acked_writes.py", common::PROGRAMS))
            .expect("the writer's program");
        let id = common::UNPRIVILEGED_UID.to_string();
        let mut child = std::process::Command::new("nsenter")
            .args(["-t", &mount.pid().to_string(), "-m", "--"])
            .args(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"])
            .args(["/usr/bin/python3", "-", file, &index.to_string(), stop])
            .stdin(source)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn a writer");
        let stdout = child.stdout.take().expect("piped");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                collected.lock().expect("lines").push(line);
            }
        });
        Writer { child, lines }
    }

    /// What it was told so far.
    fn told(&self) -> (i64, std::collections::BTreeMap<String, usize>) {
        told(&self.lines.lock().expect("lines"))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one writer was told: its last acknowledged record, and its failures by errno.
fn told(lines: &[String]) -> (i64, std::collections::BTreeMap<String, usize>) {
    let mut last = -1;
    let mut failures = std::collections::BTreeMap::new();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ack", i] => last = last.max(i.parse().expect("a record number")),
            ["fail" | "wfail", _, errno] => *failures.entry(errno.to_string()).or_insert(0) += 1,
            _ => panic!("unexpected line from a writer: {line}"),
        }
    }
    (last, failures)
}

/// A TCP proxy between mounts and their server that can drop the server's answers: a
/// request still reaches the server (and is applied), its answer never comes back, as when a
/// server dies after its commit and before its reply. Connections live as long as both sides.
struct Proxy {
    port: u16,
    answers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let answers = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (pass, done) = (answers.clone(), stop.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let always = Arc::new(AtomicBool::new(true));
                pump(
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                    always,
                );
                pump(server, client, pass.clone());
            }
        });
        Proxy {
            port,
            answers,
            stop,
        }
    }

    /// Whether the server's answers reach the mounts (else they are read and dropped).
    fn answers(&self, pass: bool) {
        self.answers
            .store(pass, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Copies `from` to `to` on a thread of its own while `pass` (else drops what it reads), until
/// either side closes; then closes both.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    pass: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if pass.load(std::sync::atomic::Ordering::Relaxed) && to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
}

/// Four unprivileged writers on two mounts fsync 100-byte records into their own regions of
/// one file while the server is killed -9 three times, down 1 s, 65 s (past the mounts' 60 s
/// bound on a call) and 125 s (past it twice). Before each kill the server's answers are dropped for a
/// second (a proxy between the mounts and the server), so that the commits in flight are
/// applied and never answered: each is sent again after the outage. Every record a writer was
/// told is durable reads back exactly afterwards, nothing else is ever in its place, and no
/// fsync answers anything but EIO (never EINVAL for a commit the server had already).
#[test]
fn acknowledged_writes_survive_kills_and_outages_of_any_length() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let start = || common::Server::start_with(&data, &["--listen", &listen]);
    let mut server = Some(start());
    let proxy = Proxy::start(port);
    let through = format!("127.0.0.1:{}", proxy.port);
    let mounts = [
        Mount::remote(&through, &["--allow-other"]),
        Mount::remote(&through, &["--allow-other"]),
    ];
    for mount in &mounts {
        let top = mount.mnt.parent().expect("the mount's directory");
        std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    mounts[0].sh_ok("touch shared && chmod 666 shared");
    let stop = tmp.path().join("stop");
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let stop = stop.display().to_string();
    let writers: Vec<Writer> = (0..4)
        .map(|i| {
            let mount = &mounts[i / 2];
            let file = mount.mnt.join("shared").display().to_string();
            Writer::start(mount, &file, i, &stop)
        })
        .collect();
    // Each kill: how long the server stays down, and what the writers were told by then.
    let mut matrix = String::from("kill  outage_s  acknowledged  failures\n");
    for (kill, outage_s) in [1, 65, 125].into_iter().enumerate() {
        std::thread::sleep(Duration::from_secs(8));
        proxy.answers(false);
        std::thread::sleep(Duration::from_secs(1));
        server.take().expect("running").kill9();
        std::thread::sleep(Duration::from_secs(outage_s));
        server = Some(start());
        proxy.answers(true);
        let told: Vec<_> = writers.iter().map(Writer::told).collect();
        let acknowledged: i64 = told.iter().map(|(last, _)| last + 1).sum();
        let failures: usize = told.iter().flat_map(|(_, f)| f.values()).sum();
        matrix.push_str(&format!(
            "{}  {outage_s}  {acknowledged}  {failures}\n",
            kill + 1
        ));
    }
    std::thread::sleep(Duration::from_secs(8));
    std::fs::write(&stop, b"").expect("the stop file");
    let (mut acked, mut told) = (Vec::new(), Vec::new());
    for (i, mut writer) in writers.into_iter().enumerate() {
        let status = writer.child.wait().expect("a writer");
        assert!(status.success(), "writer {i}: {status}");
        // Its last lines are read once its output closed.
        std::thread::sleep(Duration::from_millis(200));
        let (last, failures) = writer.told();
        matrix.push_str(&format!(
            "writer {i}: {} acknowledged, told {failures:?}\n",
            last + 1
        ));
        told.push(failures);
        acked.push(last);
    }
    eprintln!("{matrix}");
    let mut args = vec![mounts[1].mnt.join("shared").display().to_string()];
    args.push("--check".into());
    args.extend(acked.iter().map(i64::to_string));
    let out = common::python_in(&mounts[1], 300, "acked_writes.py", &args);
    let checked = lines(&out.stdout);
    eprintln!("{}", checked.join("\n"));
    for (i, failures) in told.iter().enumerate() {
        assert!(
            failures.keys().all(|errno| errno == "EIO"),
            "writer {i} was told something else than EIO: {failures:?}"
        );
    }
    assert_eq!(checked.len(), 4, "{}", String::from_utf8_lossy(&out.stderr));
    for (i, line) in checked.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[1], "ok", "writer {i}: {line}");
        let present: i64 = words[2].parse().expect("a count");
        assert!(present > acked[i], "writer {i}: {line}");
    }
    drop(mounts);
    server.take().expect("running").terminate();
    let fsck = calm(&["fsck", data.to_str().expect("utf-8"), "--objects"]);
    assert!(
        fsck.status.success(),
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

/// A python program on `mount` that opens `$MNT/NAME` for writing, writes to it, says
/// `ready`, waits for the file `go`, fsyncs, and prints the fsync's result and how long it
/// took.
fn fsync_when_told(
    mount: &Mount,
    name: &str,
    go: &str,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    common::spawn_in(
        mount,
        &format!(
            "import errno, os, time\n\
             fd = os.open(os.environ['MNT'] + '/{name}', os.O_WRONLY)\n\
             os.pwrite(fd, b'written while the server was stopped', 0)\n\
             print('ready', flush=True)\n\
             while not os.path.exists('{go}'): time.sleep(0.05)\n\
             start = time.monotonic()\n\
             try:\n    os.fsync(fd); result = '0'\n\
             except OSError as e: result = errno.errorcode[e.errno]\n\
             print(result, round(time.monotonic() - start), flush=True)\n"
        ),
    )
}

/// Kills `child` with SIGKILL and waits for it to be gone, at most 5 s (else panics with
/// `still_there`); how long it took, in ms.
fn killed_and_gone(child: &mut std::process::Child, still_there: &str) -> u128 {
    child.kill().expect("SIGKILL");
    let asked = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        assert!(asked.elapsed() < Duration::from_secs(5), "{still_there}");
        std::thread::sleep(Duration::from_millis(20));
    }
    asked.elapsed().as_millis()
}

/// A server stopped with SIGSTOP holds its connections without answering: a call through a
/// mount answers EIO within its bound (60 s) instead of hanging, a caller killed with SIGKILL
/// while it waits goes at once (as does one killed while it sleeps, whose exit closes a file
/// with writes pending), and when the server continues the mount goes on (the commit
/// that waited is recognized when sent again) and a lock held through the stop is still held
/// (leases count the time the server ran).
#[test]
fn a_stopped_server_bounds_every_call_and_a_killed_caller_goes_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = common::Server::start(&data);
    let socket = format!("unix:{}", data.join("calm.sock").display());
    let a = Mount::remote(&socket, &[]);
    let b = Mount::remote(&socket, &[]);
    a.sh_ok("echo held > held && : > killed && : > bounded && : > exiting");
    let (mut holder, mut held) = common::spawn_in(
        &a,
        "import fcntl, os, time\nf = open(os.environ['MNT'] + '/held', 'r+')\n\
         fcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(3600)\n",
    );
    assert_eq!(held.next().and_then(Result::ok).as_deref(), Some("held"));
    // A waiter for that lock on the other mount, which a signal will interrupt.
    let (mut waiter, mut waiting) = common::spawn_in(
        &b,
        "import fcntl, os, signal\n\
         def stop(*_): raise InterruptedError('interrupted')\n\
         signal.signal(signal.SIGUSR1, stop)\n\
         f = open(os.environ['MNT'] + '/held', 'r+')\nprint('waiting', flush=True)\n\
         try:\n    fcntl.lockf(f, fcntl.LOCK_EX); print('granted', flush=True)\n\
         except InterruptedError: print('interrupted', flush=True)\n",
    );
    assert_eq!(
        waiting.next().and_then(Result::ok).as_deref(),
        Some("waiting")
    );
    let go = tmp.path().join("go").display().to_string();
    let (mut killed, mut killed_out) = fsync_when_told(&b, "killed", &go);
    let (mut bounded, mut bounded_out) = fsync_when_told(&b, "bounded", &go);
    assert_eq!(
        killed_out.next().and_then(Result::ok).as_deref(),
        Some("ready")
    );
    assert_eq!(
        bounded_out.next().and_then(Result::ok).as_deref(),
        Some("ready")
    );
    // A process with writes pending that is killed while it sleeps: its exit's close waits.
    let (mut exiting, mut exiting_out) = common::spawn_in(
        &b,
        "import os, time\nfd = os.open(os.environ['MNT'] + '/exiting', os.O_WRONLY)\n\
         os.pwrite(fd, b'pending when killed', 0)\nprint('ready', flush=True)\ntime.sleep(3600)\n",
    );
    assert_eq!(
        exiting_out.next().and_then(Result::ok).as_deref(),
        Some("ready")
    );
    server.signal(libc::SIGSTOP);
    std::fs::write(&go, b"").expect("go");
    // Both wait on the stopped server now.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        killed.try_wait().expect("wait").is_none(),
        "the fsync waits"
    );
    let gone_ms = killed_and_gone(
        &mut killed,
        "a process killed while its fsync waits on a stopped server is still there",
    );
    let exited_ms = killed_and_gone(
        &mut exiting,
        "a process killed while its exit closes a file with writes pending is still there",
    );
    // A lock waiter interrupted by a signal gets EINTR though the server cannot confirm it.
    // SAFETY: kill(2) on the pid of a child of this test.
    unsafe { libc::kill(waiter.id() as i32, libc::SIGUSR1) };
    assert_eq!(
        waiting.next().and_then(Result::ok).as_deref(),
        Some("interrupted")
    );
    waiter.wait().expect("the waiter");
    // The other one is answered when the bound runs out.
    let answer = bounded_out
        .next()
        .and_then(Result::ok)
        .expect("the fsync's answer");
    let (result, took_s) = answer.split_once(' ').expect("result and time");
    let took_s: u64 = took_s.parse().expect("seconds");
    assert_eq!(result, "EIO", "{answer}");
    assert!((55..=80).contains(&took_s), "answered after {took_s} s");
    eprintln!(
        "killed caller gone {gone_ms} ms after SIGKILL, killed sleeper {exited_ms} ms; \
         the other answered EIO after {took_s} s"
    );
    server.signal(libc::SIGCONT);
    let continued = std::time::Instant::now();
    // (Its close commits what the answer left pending: once the server runs again.)
    bounded.wait().expect("wait");
    // The lock taken before the stop is still held: another mount is refused it.
    let out = b.sh(
        "python3 -c \"import fcntl, os\nf = open(os.environ['MNT'] + '/held', 'r+')\n\
         fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\"",
    );
    assert!(!out.status.success(), "the lock was taken from its holder");
    eprintln!("lock refused {:?} after SIGCONT", continued.elapsed());
    // The mount goes on: what waited is committed by the next fsync, and read elsewhere.
    b.sh_ok("python3 -c \"import os\nfd = os.open(os.environ['MNT'] + '/bounded', os.O_WRONLY)\nos.fsync(fd)\"");
    eprintln!("fsync {:?} after SIGCONT", continued.elapsed());
    assert_eq!(
        a.sh_ok("cat bounded"),
        "written while the server was stopped"
    );
    eprintln!("read {:?} after SIGCONT", continued.elapsed());
    b.sh_ok("echo after > after && sync after");
    assert_eq!(a.sh_ok("cat after"), "after\n");
    eprintln!("the end {:?} after SIGCONT", continued.elapsed());
    let _ = holder.kill();
    let _ = holder.wait();
}

/// One write(2) with O_APPEND of the documented size lands whole at the file's end whatever
/// the alignment of its buffer (a page-aligned one, one byte in, half a page in, the last
/// byte of a page), with two processes on each of two mounts appending at once.
#[test]
fn an_append_of_the_documented_limit_lands_whole_at_any_alignment() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let _server = common::Server::start(&data);
    let socket = format!("unix:{}", data.join("calm.sock").display());
    let mounts = [Mount::remote(&socket, &[]), Mount::remote(&socket, &[])];
    let size = calm_fuse::fs::APPEND_WHOLE_BYTES_MAX.to_string();
    for offset in ["0", "1", "2048", "4095"] {
        let name = format!("log-{offset}");
        mounts[0].sh_ok(&format!("touch {name}"));
        let results = common::all_at_once((0..4).collect(), |i: usize| {
            let mount = &mounts[i % 2];
            let file = mount.mnt.join(&name).display().to_string();
            let tag = format!("w{i}");
            common::python_in(
                mount,
                300,
                "append_edge.py",
                &[file, tag, size.clone(), offset.into(), "10".into()],
            )
        });
        for out in results {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "appended 10\n",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let file = mounts[1].mnt.join(&name).display().to_string();
        let out = common::python_in(
            &mounts[1],
            300,
            "append_edge.py",
            &[file, "--check".into(), size.clone()],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "whole 40\n",
            "buffers {offset} bytes into a page"
        );
    }
}
