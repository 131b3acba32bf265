//! Locks through a kill -9 of their server: a lock held when the server dies is still its
//! holder's when the server is back (its mount takes it again before anyone may take a new
//! one), a waiter waits on, a locked read-modify-write from several mounts ends exact, and a
//! holder whose lock could not be taken back in time is told, by every later call on the
//! file, that it lost it (docs/design/locks.md, "A server's restart").

use crate::common;

use std::io::BufRead;
use std::time::Duration;

use common::{Mount, Server};

fn unix_socket(data: &std::path::Path) -> String {
    format!("unix:{}", data.join("calm.sock").display())
}

/// A python program in `mount`'s namespace that locks `$MNT/held` exclusively, says `held`,
/// and when the file `go` exists writes, fsyncs, unlocks and locks again, saying how each went.
fn holder(mount: &Mount, go: &str) -> (std::process::Child, std::io::Lines<impl BufRead>) {
    common::spawn_in(
        mount,
        &format!(
            "import errno, fcntl, os, time\n\
             f = open(os.environ['MNT'] + '/held', 'r+b')\n\
             fcntl.lockf(f, fcntl.LOCK_EX)\n\
             f.write(b'made under the lock, not synced\\n'); f.flush()\n\
             print('held', flush=True)\n\
             while not os.path.exists('{go}'): time.sleep(0.05)\n\
             def step(name, call):\n\
             \x20   try:\n\
             \x20       call(); print(name, 0, flush=True)\n\
             \x20   except OSError as e:\n\
             \x20       print(name, errno.errorcode[e.errno], flush=True)\n\
             step('pwrite', lambda: os.pwrite(f.fileno(), b'the holder writes\\n', 100))\n\
             step('fsync', lambda: os.fsync(f.fileno()))\n\
             step('unlock', lambda: fcntl.lockf(f, fcntl.LOCK_UN))\n\
             step('lock', lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB))\n\
             time.sleep(3600)\n"
        ),
    )
}

fn next_line(lines: &mut std::io::Lines<impl BufRead>) -> String {
    lines.next().and_then(Result::ok).unwrap_or_default()
}

/// Whether a process on `mount` is refused `$MNT/held` at once (EAGAIN) without waiting.
fn refused_elsewhere(mount: &Mount) -> bool {
    let out = mount.sh(
        "python3 -c \"import fcntl, os\nf = open(os.environ['MNT'] + '/held', 'r+')\n\
         fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\"",
    );
    !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("Resource temporarily unavailable")
}

/// The scenario of a lock lost without its holder knowing: a holder on mount A, the server
/// killed -9 and back 2 s later; 5 s after, a process on mount B is refused the lock (A's mount
/// took it again), and A's holder goes on as if nothing happened: its write, fsync, unlock and
/// a new lock all succeed.
#[test]
fn a_lock_held_through_a_kill_of_its_server_stays_its_holders() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let socket = unix_socket(&data);
    let a = Mount::remote(&socket, &[]);
    let b = Mount::remote(&socket, &[]);
    a.sh_ok("echo start > held");
    let go = tmp.path().join("go").display().to_string();
    let (mut holding, mut said) = holder(&a, &go);
    assert_eq!(next_line(&mut said), "held");
    server.kill9();
    std::thread::sleep(Duration::from_secs(2));
    let server = Server::start(&data);
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        refused_elsewhere(&b),
        "another mount was granted a lock held through the kill"
    );
    std::fs::write(&go, b"").expect("go");
    let told: Vec<String> = (0..4).map(|_| next_line(&mut said)).collect();
    assert_eq!(told, ["pwrite 0", "fsync 0", "unlock 0", "lock 0"]);
    assert!(refused_elsewhere(&b), "the holder's new lock");
    let _ = holding.kill();
    let _ = holding.wait();
    drop(server);
}

/// A holder whose mount cannot take its lock back in time (the mount is stopped across the
/// server's restart and the grace after it): a process on mount B is granted the lock once the
/// grace is over, and from then on every call of the old holder on the file (write, fsync,
/// unlock, a new lock) answers EIO; what it wrote under the lost lock never lands. After it
/// closes the file, the file works for it again.
#[test]
fn a_lock_lost_across_a_restart_is_told_to_its_holder() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let socket = unix_socket(&data);
    let a = Mount::remote(&socket, &[]);
    let b = Mount::remote(&socket, &[]);
    a.sh_ok("echo start > held");
    let go = tmp.path().join("go").display().to_string();
    let (mut holding, mut said) = holder(&a, &go);
    assert_eq!(next_line(&mut said), "held");
    // A's mount misses the restart and the grace after it.
    // SAFETY: kill(2) on the pid of a child of this test.
    unsafe { libc::kill(a.pid() as i32, libc::SIGSTOP) };
    server.kill9();
    let server = Server::start(&data);
    let waited = b.sh_ok(
        "python3 -c \"import fcntl, os\nf = open(os.environ['MNT'] + '/held', 'r+b')\n\
         fcntl.lockf(f, fcntl.LOCK_EX)\nf.write(b'B holds it\\n'); f.flush(); os.fsync(f.fileno())\n\
         print('granted')\"",
    );
    assert_eq!(waited, "granted\n");
    // SAFETY: as above.
    unsafe { libc::kill(a.pid() as i32, libc::SIGCONT) };
    // The mount finds out at its next renewal.
    std::thread::sleep(Duration::from_secs(5));
    std::fs::write(&go, b"").expect("go");
    let told: Vec<String> = (0..4).map(|_| next_line(&mut said)).collect();
    assert_eq!(told, ["pwrite EIO", "fsync EIO", "unlock EIO", "lock EIO"]);
    let _ = holding.kill();
    let _ = holding.wait();
    // Nothing the old holder wrote landed.
    assert_eq!(b.sh_ok("cat held"), "B holds it\n");
    // Opened again, the file works for it.
    a.sh_ok("flock held echo again >> held");
    assert_eq!(b.sh_ok("cat held"), "B holds it\nagain\n");
    drop(server);
}

/// Four processes on two mounts increment a counter under an exclusive lock while the server
/// is killed -9 three times (down 2 s each), with locks held and waited for at every kill:
/// no call fails, and the counter ends at exactly the increments made.
#[test]
fn a_locked_counter_from_several_mounts_ends_exact_through_kills_of_its_server() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let mut server = Some(Server::start(&data));
    let socket = unix_socket(&data);
    let mounts = [Mount::remote(&socket, &[]), Mount::remote(&socket, &[])];
    mounts[0].sh_ok("echo 0 > counter");
    let stop = tmp.path().join("stop").display().to_string();
    let workers: Vec<std::process::Child> = (0..4)
        .map(|i| {
            let mount = &mounts[i % 2];
            std::process::Command::new("nsenter")
                .args(["-t", &mount.pid().to_string(), "-m", "--", "python3"])
                .arg(format!("{}/locked_counter.py", common::PROGRAMS))
                .arg(mount.mnt.join("counter"))
                .arg(&stop)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("a worker")
        })
        .collect();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(5));
        server.take().expect("running").kill9();
        std::thread::sleep(Duration::from_secs(2));
        server = Some(Server::start(&data));
    }
    std::thread::sleep(Duration::from_secs(5));
    std::fs::write(&stop, b"").expect("stop");
    let mut total = 0;
    for worker in workers {
        let out = worker.wait_with_output().expect("a worker's end");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "a worker failed: {said}");
        let done: u64 = said
            .trim()
            .strip_prefix("done ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected: {said}"));
        assert!(done > 0, "every worker made progress");
        total += done;
    }
    let counter = mounts[1].sh_ok("cat counter");
    eprintln!("{total} increments through 3 kills; the counter says {counter}");
    assert_eq!(counter.trim().parse::<u64>().expect("a number"), total);
}
