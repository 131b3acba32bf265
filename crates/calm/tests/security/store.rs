//! The data directory's modes, a full file system, and the connection limits.

use std::path::Path;
use std::process::Command;

use super::lines;
use crate::common::{self, CALM, Mount, PROGRAMS, calm};

#[test]
fn the_store_and_its_objects_are_closed_to_other_users() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mount = Mount::start(
        tempfile::tempdir().expect("tempdir"),
        &["--embedded", data.to_str().expect("utf-8")],
        &[],
    );
    // Two objects (a small file would be inline, in the store).
    mount.sh_ok("mkdir d && head -c 300000 /dev/urandom > d/f && head -c 100000 /dev/urandom > g");
    let (status, _) = mount.terminate();
    assert!(status.success());
    let check = |data: &Path| {
        let out = Command::new("find")
            .arg(data)
            .args(["-printf", "%m %y %p\\n"])
            .output()
            .expect("find");
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut objects = 0;
        for line in listing.lines() {
            let mut fields = line.splitn(3, ' ');
            let (mode, kind, path) = (
                u32::from_str_radix(fields.next().expect("mode"), 8).expect("octal"),
                fields.next().expect("kind"),
                fields.next().expect("path"),
            );
            if path.contains("/objects/") && kind == "f" {
                objects += 1;
            }
            match (Path::new(path) == data, kind) {
                (true, _) => assert_eq!(mode, 0o711, "{line}"),
                (false, "s") => {}
                _ => assert_eq!(mode & 0o077, 0, "open to others: {line}"),
            }
        }
        assert!(objects >= 2, "the objects were checked:\n{listing}");
    };
    check(&data);
    // A store whose files were opened (by hand, or by an older calm) is closed at start.
    for path in [data.clone(), data.join("wal.0"), data.join("objects")] {
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let server = common::Server::start(&data);
    drop(server);
    check(&data);
}

/// A data directory another user owns (or with an entry another user owns) is refused: its
/// owner could put their own socket in the server's place. Nothing is created in it. So is one
/// whose parent another user owns, or everyone may write without its sticky bit.
#[test]
fn a_data_directory_another_user_owns_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().expect("tempdir");
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::chown(&theirs, Some(40_001), Some(40_001)).expect("chown");
    let refused = |data: &Path| -> String {
        // A server that starts anyway is stopped after a while, and the test fails.
        let mut child = Command::new(CALM)
            .args(["serve", "--data"])
            .arg(data)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("calm serve");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("calm serve served on {}", data.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused(&theirs);
    assert!(
        stderr.contains("belongs to uid 40001, not to this server's user"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&theirs).expect("list").count(),
        0,
        "something was created in it"
    );
    assert_eq!(
        std::fs::metadata(&theirs).expect("stat").mode() & 0o7777,
        0o700
    );
    // The server's own directory with an entry someone else put in it (while it was open).
    let ours = tmp.path().join("ours");
    let server = common::Server::start(&ours);
    drop(server);
    let planted = ours.join("planted");
    std::fs::write(&planted, b"x").expect("write");
    std::os::unix::fs::chown(&planted, Some(40_001), Some(40_001)).expect("chown");
    let stderr = refused(&ours);
    assert!(stderr.contains("planted belongs to uid 40001"), "{stderr}");
    std::fs::remove_file(&planted).expect("rm");
    let server = common::Server::start(&ours);
    drop(server);
    // A directory of the server's own inside another user's, or inside one that everyone may
    // write and that is not sticky: its owner, or anyone, could move it away while it is
    // served. Refused, and nothing made; in a sticky one (as /tmp) it is served.
    let inside = theirs.join("data");
    std::fs::create_dir(&inside).expect("mkdir");
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let stderr = refused(&inside);
    assert!(
        stderr.contains("which belongs to uid 40001: its owner could move"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(&inside).expect("list").count(), 0);
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let stderr = refused(&open.join("data"));
    assert!(
        stderr.contains("which others may write (mode 777)"),
        "{stderr}"
    );
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let server = common::Server::start(&open.join("data"));
    drop(server);
}

#[test]
fn a_full_store_answers_enospc_keeps_reading_takes_writes_when_room_is_back_and_survives_kill_9() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "bash"])
        .arg(Path::new(PROGRAMS).join("full_store.sh"))
        .arg(CALM)
        .arg(tmp.path())
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "full_store.sh failed:\n{stdout}\n{}\nmount's log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(tmp.path().join("mount.err")).unwrap_or_default()
    );
    assert_eq!(
        lines(&stdout),
        [
            "filling files: ENOSPC",
            "filling names: ENOSPC",
            "reads: ok",
            "after room is back: ok",
            "after kill -9: ok",
            "clean",
        ],
        "{stdout}"
    );
}

#[test]
fn connections_beyond_the_limits_and_silent_ones_are_closed() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = common::Server::start(&data);
    let socket = data.join("calm.sock");
    // Whether the server closed `conn` within `wait` (bytes it sent first are read past).
    let closed_within = |conn: &mut UnixStream, wait: Duration| {
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match conn.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return true,
            }
        }
        false
    };
    // One peer (this process's uid) may hold 256 connections; the next ones are closed at once.
    let limit = calm_server::listen::CONNECTIONS_PER_PEER_MAX;
    let mut held: Vec<UnixStream> = (0..limit)
        .map(|_| UnixStream::connect(&socket).expect("connect"))
        .collect();
    // The accept loop has taken all of them once a later connection is answered by a close.
    let mut over = UnixStream::connect(&socket).expect("connect");
    assert!(
        closed_within(&mut over, Duration::from_secs(5)),
        "connection {} of one peer was kept",
        limit + 1
    );
    // A connection that never says anything is closed after the handshake timeout (10 s),
    // and so is one that trickles its HTTP/2 preface a byte at a time without ever finishing
    // it (the bytes do not move the deadline).
    drop(held.drain(..limit - 2));
    let started = Instant::now();
    let mut trickler = held.pop().expect("a connection");
    let trickle = std::thread::spawn(move || {
        use std::io::Write;
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        for byte in &preface[..preface.len() - 1] {
            if trickler.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(600));
        }
        trickler
    });
    let silent = held.last_mut().expect("a connection");
    assert!(
        closed_within(
            silent,
            calm_server::listen::HANDSHAKE_TIMEOUT + Duration::from_secs(5)
        ),
        "a silent connection stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "closed too early"
    );
    let mut trickler = trickle.join().expect("the trickler");
    assert!(
        closed_within(&mut trickler, Duration::from_secs(2)),
        "a connection trickling its preface stayed open {:?} after it was taken",
        started.elapsed()
    );
    drop(held);
    // The server still serves.
    let out = calm(&["status", "--server", &format!("unix:{}", socket.display())]);
    assert!(out.status.success(), "{out:?}");
    drop(server);
}
