//! The mount over FUSE over io_uring (`calm mount --fuse-channel io-uring`): the same answers
//! as tmpfs, locks, lock waits ended by a signal, large and small files whole, another mount
//! seeing what this one wrote. The kernel's `enable_uring` is set first (it only lets a mount
//! ask for the rings; mounts that do not ask keep the device).

use crate::common;

use common::{Mount, Server};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel can carry FUSE over io_uring (set on when it is off).
fn uring_offered() -> bool {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => {
            eprintln!("{ENABLE_URING} is absent: this kernel has no FUSE over io_uring");
            false
        }
        Ok(value) => {
            if value.trim() != "Y" {
                std::fs::write(ENABLE_URING, "Y").expect("enabling FUSE over io_uring (as root)");
            }
            true
        }
    }
}

/// The mount process's threads serving a ring (they start right after the mount is
/// announced: waited for, at most 10 s).
fn ring_threads(mount: &Mount) -> usize {
    let tasks = format!("/proc/{}/task", mount.pid());
    let count = || {
        std::fs::read_dir(&tasks)
            .expect("the mount's threads")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("fuser-ring-"))
            .count()
    };
    let started = std::time::Instant::now();
    while count() == 0 && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    count()
}

#[test]
fn a_mount_over_io_uring_answers_as_over_the_device() {
    if !uring_offered() {
        return;
    }
    let mount = Mount::embedded(&["--fuse-channel", "io-uring"]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        ring_threads(&mount) >= cpus,
        "a ring per CPU serves the mount ({} threads)",
        ring_threads(&mount)
    );

    let (tmpfs, calm) = mount.beside_tmpfs("conformance.py");
    assert!(tmpfs.lines().count() >= 90, "every step ran:\n{tmpfs}");
    for (t, c) in tmpfs.lines().zip(calm.lines()) {
        assert_eq!(c, t, "calm over io_uring (left) differs from tmpfs (right)");
    }
    assert_eq!(calm.lines().count(), tmpfs.lines().count());

    let out = mount.sh_ok("python3 \"$PROGRAMS/locks.py\" \"$MNT\"");
    for check in [
        "ok counter-lockf 200",
        "ok counter-flock 200",
        "ok getlk",
        "ok interrupted",
        "ok waited",
        "ok deadlock",
        "ok ofd",
        "ok flock-independent",
    ] {
        assert!(
            out.lines().any(|l| l == check),
            "missing {check:?} in:\n{out}"
        );
    }

    // Writes and reads larger than one request, and many small files, whole.
    mount.sh_ok(
        "head -c 64M /dev/urandom > /tmp/calm-uring-$$ && cp /tmp/calm-uring-$$ big && \
         sync big && cmp big /tmp/calm-uring-$$ && rm /tmp/calm-uring-$$ && \
         mkdir -p t && for d in 1 2 3 4 5; do mkdir t/$d; for f in $(seq 200); do \
         head -c $((f * 37)) /dev/urandom > t/$d/$f; done; done && \
         tar -cf /tmp/calm-uring-t-$$.tar t && mkdir u && tar -xf /tmp/calm-uring-t-$$.tar -C u && \
         diff -r t u/t && rm -r u /tmp/calm-uring-t-$$.tar && [ $(find t -type f | wc -l) = 1000 ]",
    );
    assert!(
        ring_threads(&mount) >= cpus,
        "the rings still serve the mount"
    );
}

#[test]
fn two_mounts_over_io_uring_see_each_others_writes_under_locks() {
    if !uring_offered() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--fuse-channel", "io-uring"]);
    let b = Mount::remote(&server.addr, &["--fuse-channel", "io-uring"]);
    assert!(ring_threads(&a) >= 1 && ring_threads(&b) >= 1);
    increments_under_locks(&a, &b);
}

/// Both mounts increment a counter file 200 times each, under `lockf`, at once. A program that
/// reads less than it wrote last says what it read, what the file's size was then, and what it
/// read 50 ms later through the same and a new open file (shown when the count is short).
fn increments_under_locks(a: &Mount, b: &Mount) {
    a.sh_ok("echo 0 > counter");
    // Locked read-modify-write from both mounts at once: every increment lands.
    let increments = 200;
    let script = format!(
        "python3 -c \"
import fcntl, os
last = 0
for _ in range({increments}):
    fd = os.open('counter', os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    raw = os.pread(fd, 64, 0)
    n = int(raw or b'0')
    if n < last:
        import time, sys
        sz = os.fstat(fd).st_size
        time.sleep(0.05)
        again = os.pread(fd, 64, 0)
        fd2 = os.open('counter', os.O_RDONLY)
        fresh = os.pread(fd2, 64, 0)
        os.close(fd2)
        sys.stdout.write('pid %d read %r last %d size %d again %r fresh %r\\n' % (os.getpid(), raw, last, sz, again, fresh))
    last = n + 1
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(n + 1).encode(), 0)
    fcntl.lockf(fd, fcntl.LOCK_UN)
    os.close(fd)
\""
    );
    let (sa, sb) = (script.clone(), script);
    let (seen_a, seen_b) = std::thread::scope(|s| {
        let ta = s.spawn(|| a.sh_ok(&sa));
        let tb = s.spawn(|| b.sh_ok(&sb));
        let seen_a = ta.join().expect("mount A's writer");
        (seen_a, tb.join().expect("mount B's writer"))
    });
    let total = a.sh_ok("cat counter");
    assert_eq!(
        total.trim(),
        (2 * increments).to_string(),
        "every increment landed (reads below a program's own last write: on A {seen_a:?}, \
         on B {seen_b:?})"
    );
}
