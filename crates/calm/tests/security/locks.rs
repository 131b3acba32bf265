//! Locks an unprivileged user takes through mounts: each user's count against one limit,
//! over every mount and session they lock through, and one user's locks cost another nothing.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::Mount;

/// Users of the test (not in /etc/passwd: setpriv takes numbers).
const ALICE: u32 = 40011;
const BOB: u32 = 40012;

/// Takes up to N one-byte write locks on PATH (bytes 0, 2, 4, …: none merges with another),
/// prints how many it got and the errno that stopped it (0: none), and holds them until its
/// standard input closes.
const LOCK_MANY: &str = r#"
import fcntl, os, sys
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
got, err = 0, 0
for i in range(n):
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)
    except OSError as e:
        err = e.errno
        break
    got += 1
print(f"locked {got} errno {err}", flush=True)
sys.stdin.read()
"#;

/// A process of `uid` (0: root) in `mount`'s namespace locking `n` bytes of `path`; its first
/// line says how many it got.
struct Locker {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Locker {
    fn start(mount: &Mount, uid: u32, path: &str, n: u32) -> Locker {
        let id = uid.to_string();
        let mut child = Command::new("nsenter")
            .args(["-t", &mount.pid().to_string(), "-m", "--"])
            .args(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"])
            .args(["/usr/bin/python3", "-c", LOCK_MANY])
            .arg(mount.mnt.join(path))
            .arg(n.to_string())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        Locker { child, lines }
    }

    fn said(&mut self) -> String {
        self.lines
            .next()
            .expect("a line")
            .expect("the locker's answer")
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        // Its standard input closes: it ends, and its locks go.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn a_users_locks_through_every_mount_count_against_one_limit() {
    let first = Mount::embedded(&["--allow-other", "--locks-per-user", "1000"]);
    let server = first.addr.clone().expect("the embedded server's address");
    let second = Mount::remote(&server, &["--allow-other"]);
    for mount in [&first, &second] {
        let top = mount.mnt.parent().expect("the mount's directory");
        std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    first.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 shared");

    let mut held = Locker::start(&first, ALICE, "shared/a", 600);
    assert_eq!(held.said(), "locked 600 errno 0");
    // Through another mount, her locks count with those she holds: a set needs room for two
    // (it may split a lock in three), so 399 more, then ENOLCK.
    let mut more = Locker::start(&second, ALICE, "shared/b", 600);
    assert_eq!(more.said(), format!("locked 399 errno {}", libc::ENOLCK));
    drop(more);
    // Another user is not held back by hers, nor is root by anyone's.
    let mut bob = Locker::start(&second, BOB, "shared/c", 900);
    assert_eq!(bob.said(), "locked 900 errno 0");
    let mut root = Locker::start(&first, 0, "shared/d", 3000);
    assert_eq!(root.said(), "locked 3000 errno 0");
    drop((bob, root));
    // Her locks go with her process, and she has the whole limit again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = Locker::start(&second, ALICE, "shared/e", 999);
        let said = again.said();
        if said == "locked 999 errno 0" || Instant::now() > deadline {
            assert_eq!(said, "locked 999 errno 0");
            break;
        }
        drop(again);
        std::thread::sleep(Duration::from_millis(100));
    }
}
