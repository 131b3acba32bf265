//! `calm mount` with real programs on a real FUSE mount. Each mount lives in a private mount
//! namespace of its own (`unshare -m`): when the test ends, however it ends, the process is
//! killed, the namespace and its mounts vanish with it, and the temporary directories are
//! removed. Commands run inside the namespace with `nsenter`.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Server};

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn file_operations_give_the_same_results_and_errno_as_tmpfs() {
    let mount = Mount::embedded(&[]);
    let (tmpfs, calm) = mount.beside_tmpfs("conformance.py");
    let (tmpfs, calm) = (tmpfs.as_str(), calm.as_str());
    assert!(
        lines(tmpfs).len() >= 90,
        "the script ran every step:\n{tmpfs}"
    );
    assert!(
        tmpfs.contains("\"errno\": \"ENOTEMPTY\""),
        "error cases are exercised"
    );
    for (t, c) in lines(tmpfs).iter().zip(lines(calm)) {
        assert_eq!(c, *t, "calm (left) differs from tmpfs (right)");
    }
    assert_eq!(lines(calm).len(), lines(tmpfs).len());
}

#[test]
fn fcntl_and_flock_locks_between_processes() {
    let mount = Mount::embedded(&[]);
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
        assert!(lines(&out).contains(&check), "missing {check:?} in:\n{out}");
    }
}

#[test]
fn flock_command_between_processes() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(
        "touch f
         flock -x f -c 'sleep 1.5' & holder=$!
         sleep 0.5
         if flock -n f -c true; then echo granted-while-held; else echo refused; fi
         start=$(date +%s%N)
         flock -x f -c true
         echo waited-ms $(( ($(date +%s%N) - start) / 1000000 ))
         wait $holder",
    );
    assert!(out.contains("refused\n"), "{out}");
    let waited: u64 = out
        .split("waited-ms ")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .expect("waited-ms");
    assert!(
        waited >= 300,
        "the blocking flock returned after {waited} ms, before the holder let go"
    );
}

#[test]
fn sqlite_with_concurrent_writers() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(
        "sqlite3 db 'create table t(writer int, i int)'
         for w in 1 2 3 4; do
           ( for i in $(seq 40); do
               sqlite3 -cmd '.timeout 20000' db \"insert into t values($w, $i)\"
             done ) &
         done
         wait
         sqlite3 db 'select count(*), count(distinct writer) from t; pragma integrity_check;'",
    );
    assert_eq!(lines(&out), ["160|4", "ok"], "{out}");
}

#[test]
fn git_init_add_commit_and_fsck() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(&format!(
        "git init -q repo && cd repo
         git config user.email calm@example.org && git config user.name calm
         cp -r {src} src
         git add -A && git commit -qm first
         echo change >> src/lib.rs && git commit -qam second
         git log --format=%s | tr '\\n' ' '; echo
         git status --porcelain | wc -l
         git fsck --strict 2>&1 | grep -c error || true
         git diff HEAD~1 --stat | tail -1",
        src = concat!(env!("CARGO_MANIFEST_DIR"), "/../calm-locks/src")
    ));
    let got = lines(&out);
    assert_eq!(got[0], "second first ", "{out}");
    assert_eq!(got[1], "0", "clean work tree: {out}");
    assert_eq!(got[2], "0", "git fsck found errors: {out}");
    assert!(got[3].contains("1 file changed"), "{out}");
}

#[test]
fn tar_extract_matches_its_source() {
    let mount = Mount::embedded(&[]);
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = mount.sh_ok(&format!(
        "tar -C {src} -cf \"$MNT/../src.tar\" calm-meta calm-locks calm-changelog
         mkdir x && tar -C x -xf ../src.tar
         diff -r {src}/calm-meta x/calm-meta && diff -r {src}/calm-locks x/calm-locks \
           && diff -r {src}/calm-changelog x/calm-changelog && echo same
         find x | wc -l"
    ));
    let got = lines(&out);
    assert_eq!(got[0], "same", "{out}");
    assert!(got[1].parse::<u32>().expect("count") > 40, "{out}");
}

#[test]
fn rename_hardlink_and_symlink_round_trips() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(
        "mkdir -p a/b c
         printf 'payload' > a/b/f
         mv a/b/f c/g && mv c/g a/b/f && cat a/b/f; echo
         mv a/b c/b && ls c/b && mv c/b a/b
         ln a/b/f hard && stat -c %h a/b/f && rm hard && stat -c %h a/b/f
         ln -s ../a/b/f c/s && readlink c/s && cat c/s; echo
         mv c/s c/t && cat c/t; echo
         rm a/b/f && { cat c/t 2>/dev/null || echo dangling; }",
    );
    assert_eq!(
        lines(&out),
        [
            "payload", "f", "2", "1", "../a/b/f", "payload", "payload", "dangling"
        ],
        "{out}"
    );
}

#[test]
fn readdir_of_a_large_directory() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(
        "python3 -c '
import os
os.mkdir(\"big\")
for i in range(10000):
    os.close(os.open(\"big/file-%05d\" % i, os.O_CREAT | os.O_WRONLY))
names = os.listdir(\"big\")
assert len(names) == len(set(names)) == 10000, len(names)
assert sorted(names) == [\"file-%05d\" % i for i in range(10000)]
print(\"listed\", len(names))
'
         ls big | wc -l
         ls -a big > ../listing && sed -n 1,2p ../listing",
    );
    assert_eq!(lines(&out), ["listed 10000", "10000", ".", ".."], "{out}");
}

#[test]
fn mutations_through_the_mount_are_in_the_changelog() {
    let mount = Mount::embedded(&[]);
    let addr = mount.addr.clone().expect("embedded server address");
    let registered = common::calm(&["changelog", "register", "--server", &addr]);
    assert!(registered.status.success(), "{registered:?}");
    mount.sh_ok(
        "mkdir d && echo x > d/f && mv d/f d/g && ln d/g d/h && ln -s g d/s
         chmod 600 d/g && truncate -s 0 d/g && rm d/h d/g d/s && rmdir d",
    );
    let read = common::calm(&["changelog", "read", "--json", "--server", &addr]);
    assert!(read.status.success(), "{read:?}");
    let records: Vec<serde_json::Value> = String::from_utf8(read.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let summary: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["type"].as_str().expect("type"),
                r["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    for expected in [
        "MKDIR d", "CREAT f", "RENME g", "HLINK h", "SLINK s", "UNLNK h", "UNLNK g", "UNLNK s",
        "RMDIR d",
    ] {
        assert!(
            summary.iter().any(|s| s == expected),
            "no {expected:?} record in {summary:?}"
        );
    }
    assert!(
        summary
            .iter()
            .any(|s| s.starts_with("SATTR") || s.starts_with("TRUNC")),
        "chmod and truncate left no record: {summary:?}"
    );
    // Every record names the uid of the process that made the change.
    assert!(records.iter().all(|r| r["uid"] == 0), "{records:?}");
}

#[test]
fn a_killed_mount_loses_its_locks_through_its_lease() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let lease = ["--lock-lease-ms", "1000"];
    let holder = Mount::remote(&server.addr, &lease);
    let other = Mount::remote(&server.addr, &lease);
    holder.sh_ok("touch f");
    // A process on the first mount takes a write lock and keeps it.
    let mut keeper = Command::new("nsenter")
        .args(["-t", &holder.pid().to_string(), "-m", "--", "python3", "-c"])
        .arg(format!(
            "import fcntl, time\nf = open('{}/f', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
            holder.mnt.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the lock keeper");
    let mut line = String::new();
    BufReader::new(keeper.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("keeper output");
    assert_eq!(line, "held\n");
    let try_lock = "python3 -c \"
import fcntl, sys
f = open('f', 'r+')
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print('granted')
except OSError as e:
    print('refused', e.errno)
\"";
    assert_eq!(
        other.sh_ok(try_lock),
        "refused 11\n",
        "held on the other mount"
    );

    // The first mount dies without a word: its lease runs out and its lock goes.
    let killed = Instant::now();
    drop(holder);
    let _ = keeper.kill();
    let _ = keeper.wait();
    let mut outcome = String::new();
    while killed.elapsed() < Duration::from_secs(20) {
        outcome = other.sh_ok(try_lock);
        if outcome == "granted\n" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        outcome, "granted\n",
        "the dead mount's lock outlived its lease"
    );
    assert!(
        killed.elapsed() >= Duration::from_millis(500),
        "released before the lease could run out: {:?}",
        killed.elapsed()
    );
}

#[test]
fn unmount_by_fusermount_and_by_sigterm() {
    let mount = Mount::embedded(&[]);
    mount.sh_ok("echo data > f");
    mount.sh_ok("fusermount3 -u \"$MNT\"");
    let mut mount = mount;
    let status = mount.child.wait().expect("wait");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut mount.stdout, &mut rest);
    assert!(status.success(), "{status}");
    assert_eq!(rest, "unmounted\n");

    let mount = Mount::embedded(&[]);
    mount.sh_ok("echo data > f && grep -q \"^calm $MNT fuse\" /proc/self/mounts");
    let (status, rest) = mount.terminate();
    assert!(status.success(), "{status}");
    assert_eq!(rest, "unmounted\n");
}

#[test]
fn data_and_names_survive_a_remount() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let embedded = [
        "--embedded",
        data.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
    ];
    let first = Mount::start(tempfile::tempdir().expect("tempdir"), &embedded, &[]);
    first
        .sh_ok("mkdir d && head -c 300000 /dev/urandom > d/blob && sha256sum d/blob > sum && sync");
    let sum = first.sh_ok("cat sum");
    let (status, _) = first.terminate();
    assert!(status.success());
    let second = Mount::start(tempfile::tempdir().expect("tempdir"), &embedded, &[]);
    assert_eq!(second.sh_ok("cat sum"), sum);
    second.sh_ok("sha256sum -c sum >/dev/null && stat -c %s d/blob | grep -qx 300000");

    // What fsync returned for survives kill -9 of the mount (and of its in-process server).
    second.sh_ok(
        "python3 -c '
import os
fd = os.open(\"synced\", os.O_CREAT | os.O_WRONLY, 0o600)
os.write(fd, b\"x\" * 70000)
os.fsync(fd)
os.truncate(\"d/blob\", 1000)
'",
    );
    drop(second); // SIGKILL: no unmount, no flush, no clean close of the store
    let third = Mount::start(tempfile::tempdir().expect("tempdir"), &embedded, &[]);
    assert_eq!(
        third.sh_ok("stat -c '%s %a' synced d/blob; head -c 1000 d/blob | wc -c"),
        "70000 600\n1000 644\n1000\n"
    );
}

#[test]
fn bad_invocations_are_refused_clearly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = common::calm(&["mount", tmp.path().to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server ADDR or --embedded DIR"));
    let out = common::calm(&[
        "mount",
        tmp.path().to_str().expect("utf-8"),
        "--server",
        "127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to 127.0.0.1:1"));
    let missing = tmp.path().join("nope");
    let out = common::calm(&[
        "mount",
        missing.to_str().expect("utf-8"),
        "--embedded",
        tmp.path().join("d").to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
}

#[test]
fn other_users_come_in_with_allow_other_and_permission_bits_still_apply() {
    let as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups";
    let private = Mount::embedded(&[]);
    private.sh_ok("mkdir open && chmod 777 open");
    let out = private.sh(&format!("{as_nobody} ls \"$MNT/open\""));
    assert!(
        !out.status.success(),
        "another user read a mount without --allow-other"
    );

    let shared = Mount::embedded(&["--allow-other"]);
    let out = shared.sh_ok(&format!(
        "mkdir open closed && chmod 777 open && chmod 700 closed
         {as_nobody} touch open/mine && stat -c %u open/mine
         {as_nobody} touch closed/theirs 2>/dev/null && echo BAD || echo refused"
    ));
    assert_eq!(lines(&out), ["65534", "refused"], "{out}");
}

#[test]
fn sigterm_ends_the_mount_while_another_namespace_still_holds_it() {
    let mut mount = Mount::embedded(&[]);
    mount.sh_ok("echo data > f");
    // A process in a mount namespace made now holds a copy of the mount: unmounting in the
    // mount's own namespace then leaves the FUSE connection alive.
    let pid_file = mount.mnt.with_file_name("holder.pid");
    mount.sh_ok(&format!(
        "nohup unshare --mount --propagation private sleep 600 > /dev/null 2>&1 &
         echo $! > {}",
        pid_file.display()
    ));
    let holder: i32 = std::fs::read_to_string(&pid_file)
        .expect("the holder's pid")
        .trim()
        .parse()
        .expect("a pid");
    struct Holder(i32);
    impl Drop for Holder {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the pid of a process this test started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _holder = Holder(holder);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(mount.child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = mount.child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let status = status.expect("the mount process was still running 20 s after SIGTERM");
    assert!(status.success(), "{status}");
    // The copy the other namespace holds is cut off, not served by nobody.
    let out = Command::new("nsenter")
        .args(["-t", &holder.to_string(), "-m", "--", "cat"])
        .arg(mount.mnt.join("f"))
        .output()
        .expect("nsenter");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not connected"),
        "{out:?}"
    );
}
