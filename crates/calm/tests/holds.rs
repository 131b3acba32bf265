//! Files a mount holds: a file a mount made with O_EXCL has its chmod, chown and times
//! answered by that mount, and sent at its close. Another mount never sees less than what the
//! holder answered: its request has the server ask the holder first. A mount killed while it
//! holds a file loses only what it kept and never fsync'd, and the file goes on working.

use crate::common;

use std::io::Write;

use common::{Mount, Server, answered_here, spawn_in, until_it_may_hold};

/// The requests `server` answered while `work` ran (one of them the status call itself).
fn requests_during(server: &str, work: impl FnOnce()) -> u64 {
    let requests = || {
        common::calm_json(&["status", "--server", server, "--json"])["requests"]
            .as_u64()
            .expect("requests")
    };
    let before = requests();
    work();
    requests() - before
}

/// A process in `mount` that makes `path` as tar does (O_EXCL, a write, then fchown, fchmod
/// and futimens through the open file), says `made`, and keeps the file open until told a
/// line: then `fsync` fsyncs, `chmod MODE` changes its mode again and says `done`, and
/// anything else closes it and says `closed`.
const HOLDER: &str = r#"
import os, sys
path = os.path.join(os.environ["MNT"], sys.argv[1] if len(sys.argv) > 1 else "d/f")
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
os.write(fd, b"held bytes\n")
os.fchown(fd, 1234, 1234)
os.fchmod(fd, 0o600)
os.utime(fd, ns=(1_000_000_000 * 10**9, 1_000_000_000 * 10**9))
print("made", flush=True)
for line in sys.stdin:
    word = line.split()
    if word[0] == "fsync":
        os.fsync(fd)
        print("done", flush=True)
    elif word[0] == "chmod":
        os.fchmod(fd, int(word[1], 8))
        print("done", flush=True)
    else:
        os.close(fd)
        print("closed", flush=True)
        break
"#;

fn said(lines: &mut std::io::Lines<std::io::BufReader<std::process::ChildStdout>>, want: &str) {
    let line = lines.next().expect("a line").expect("utf-8");
    assert_eq!(line, want, "the holding process said something else");
}

fn tell(child: &mut std::process::Child, line: &str) {
    let stdin = child.stdin.as_mut().expect("piped");
    writeln!(stdin, "{line}").expect("tell the holder");
}

const STAT: &str = "stat -c '%a %u %g %Y %s' d/f";

#[test]
fn changes_a_mount_answered_itself_are_what_another_mount_sees_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    b.sh_ok("ls d");

    // The chown, chmod and utimes of a file A made reach the server not at all...
    let (mut holder, mut lines) = spawn_in(&a, HOLDER);
    said(&mut lines, "made");
    let made = requests_during(&server.addr, || {
        let (mut more, mut more_lines) = spawn_in(&a, &HOLDER.replace("\"d/f\"", "\"d/g\""));
        said(&mut more_lines, "made");
        tell(&mut more, "close");
        said(&mut more_lines, "closed");
        let _ = more.wait();
    });
    // Make, the write with the changes, the hold given back (with other closes' within
    // 2 ms), the status call: 4 (a mount that sends each change makes 6).
    assert!(
        made <= 4,
        "a file made, written, chowned, chmodded, touched and closed took {made} requests"
    );
    // ...and A answers them itself.
    assert_eq!(a.sh_ok(STAT).trim(), "600 1234 1234 1000000000 11");

    // B sees what A answered (its stat has the server ask A first), the size of A's
    // pending write too.
    // (B's `ls d` above asked A for the directory it made and held: recalled once already.)
    let status = || common::calm_json(&["status", "--server", &server.addr, "--json"]);
    let before = status();
    assert_eq!(before["holds"], 1);
    let recalled = before["holds_recalled"].as_u64().unwrap();
    assert_eq!(b.sh_ok(STAT).trim(), "600 1234 1234 1000000000 11");
    let after = status();
    assert_eq!(
        (&after["holds"], after["holds_recalled"].as_u64().unwrap()),
        (&0.into(), recalled + 1)
    );
    assert_eq!(b.sh_ok("cat d/f"), "held bytes\n");

    // The hold is given back: A's next change goes to the server, and B sees it too.
    tell(&mut holder, "chmod 640");
    said(&mut lines, "done");
    let until =
        "for _ in $(seq 500); do [ $(stat -c %a d/f) = 640 ] && exit 0; sleep 0.01; done; exit 1";
    b.sh_ok(until);
    tell(&mut holder, "close");
    said(&mut lines, "closed");
    let _ = holder.wait();

    // A file closed is on the server whole, as made through A.
    assert_eq!(
        b.sh_ok(&STAT.replace("d/f", "d/g")).trim(),
        "600 1234 1234 1000000000 11"
    );
    assert_eq!(b.sh_ok("cat d/g"), "held bytes\n");
}

#[test]
fn a_listing_or_a_lookup_in_the_directory_has_every_file_held_there_given_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    let (mut holder, mut lines) = spawn_in(&a, HOLDER);
    said(&mut lines, "made");
    // A listing with attributes (ls -l reads them all) from B.
    let listed = b.sh_ok("ls -ln --time-style=+%s d | tail -n +2");
    let fields: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(
        (fields[0], fields[2], fields[3], fields[4], fields[5]),
        ("-rw-------", "1234", "1234", "11", "1000000000"),
        "{listed}"
    );
    tell(&mut holder, "close");
    said(&mut lines, "closed");
    let _ = holder.wait();
}

#[test]
fn a_mount_killed_holding_a_file_loses_only_what_it_never_fsynced() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    let (mut holder, mut lines) = spawn_in(&a, HOLDER);
    said(&mut lines, "made");
    // What fsync asked for is made durable: the write, the owner, the mode, the times.
    tell(&mut holder, "fsync");
    said(&mut lines, "done");
    // Kept and never asked to be durable.
    tell(&mut holder, "chmod 604");
    said(&mut lines, "done");
    assert_eq!(a.sh_ok("stat -c %a d/f").trim(), "604");
    drop(a); // SIGKILL of the mount process
    let _ = holder.kill();
    let _ = holder.wait();

    // B is answered at once (the hold ended with the mount's connection), with what was
    // fsync'd.
    let started = std::time::Instant::now();
    assert_eq!(b.sh_ok(STAT).trim(), "600 1234 1234 1000000000 11");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the stat waited {:?} for a dead mount",
        started.elapsed()
    );
    assert_eq!(b.sh_ok("cat d/f"), "held bytes\n");
    // And the file goes on working.
    b.sh_ok("chmod 644 d/f && echo more >> d/f");
    assert_eq!(b.sh_ok("stat -c '%a %s' d/f").trim(), "644 16");
}

#[test]
fn a_mount_told_not_to_hold_sends_every_change() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--no-hold"]);
    a.sh_ok("mkdir d");
    let made = requests_during(&server.addr, || {
        let (mut holder, mut lines) = spawn_in(&a, HOLDER);
        said(&mut lines, "made");
        tell(&mut holder, "close");
        said(&mut lines, "closed");
        let _ = holder.wait();
    });
    assert!(made >= 6, "{made} requests");
    assert_eq!(a.sh_ok(STAT).trim(), "600 1234 1234 1000000000 11");
}

#[test]
fn many_files_held_at_once_by_several_processes_all_reach_the_server() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let server = Server::start_with(&common::data_dir(&tmp), &["--metrics", &metrics]);
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    // Four processes, 500 files each, made as tar makes them; B checks every one.
    a.sh_ok(
        "mkdir d; for p in 0 1 2 3; do python3 -c \"
import os
for i in range(500):
    path = 'd/p$p-%d' % i
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b'x' * (i + 1))
    os.fchown(fd, 1000 + i % 7, 2000 + i % 5)
    os.fchmod(fd, 0o600 + i % 8)
    os.utime(fd, ns=(i * 10**9, (i + 1) * 10**9))
    os.close(fd)
\" & done; wait",
    );
    // Each close sent its bytes and its changes in one request; the holds went back in
    // batches.
    let text = common::http_get(&metrics, "/metrics");
    let requests = |method: &str| {
        let series = format!("calm_server_requests_seconds_count{{op=\"calm.v1.Meta/{method}\"}}");
        common::sample(&text, &series).unwrap_or(0.0)
    };
    assert_eq!(requests("SetAttr"), 0.0, "{text}");
    assert!(requests("Write") >= 2000.0, "{text}");
    assert!(requests("ReturnHolds") < 2000.0, "{text}");
    let out = b.sh_ok("cd d && stat -c '%n %a %u %g %Y %s' *");
    let mut seen = 0;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let i: u32 = f[0].split('-').nth(1).expect("number").parse().expect("i");
        let want = format!(
            "{:o} {} {} {} {}",
            0o600 + i % 8,
            1000 + i % 7,
            2000 + i % 5,
            i + 1,
            i + 1
        );
        assert_eq!(f[1..].join(" "), want, "{line}");
        seen += 1;
    }
    assert_eq!(seen, 2000);
}

#[test]
fn a_held_file_renamed_linked_or_removed_by_its_maker_keeps_working() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d e");
    // Renamed and linked into another directory while held and changed: another mount finds
    // it there with what its maker answered. Removed while held: its changes and its close
    // succeed all the same.
    let program = r#"
import os, sys
def made(path):
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"abc")
    os.fchmod(fd, 0o600)
    return fd
fd = made("d/moved")
os.rename("d/moved", "e/moved")
os.fchmod(fd, 0o640)
fd2 = made("d/linked")
os.link("d/linked", "e/linked")
os.fchmod(fd2, 0o604)
print("moved", flush=True)
sys.stdin.readline()
os.close(fd)
os.close(fd2)
fd = made("d/removed")
os.unlink("d/removed")
os.fchmod(fd, 0o400)
os.fsync(fd)
os.close(fd)
print("closed", flush=True)
"#;
    let (mut child, mut lines) = spawn_in(
        &a,
        &format!("import os; os.chdir(os.environ['MNT'])\n{program}"),
    );
    said(&mut lines, "moved");
    assert_eq!(
        b.sh_ok("stat -c '%n %a %s %h' e/moved e/linked d/linked"),
        "e/moved 640 3 1\ne/linked 604 3 2\nd/linked 604 3 2\n"
    );
    tell(&mut child, "go");
    said(&mut lines, "closed");
    assert!(child.wait().expect("wait").success());
    assert_eq!(
        b.sh_ok("ls d e | tr '\\n' ' '"),
        "d: linked  e: linked moved "
    );
}

#[test]
fn an_unprivileged_user_holds_what_they_make_and_no_other_user_gets_past_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 d");
    // User 40010 makes a file and narrows its mode while holding it; a chown to root is
    // refused at once (the mount holds no owner change of a user's).
    let program = r#"
import os, sys
os.setgroups([]); os.setgid(40010); os.setuid(40010)
os.chdir(os.environ["MNT"])
fd = os.open("d/u", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
os.write(fd, b"mine\n")
os.fchmod(fd, 0o600)
os.utime(fd, ns=(10**18, 10**18))
try:
    os.fchown(fd, 0, 0)
    print("chown to root allowed", flush=True)
except PermissionError:
    print("held", flush=True)
sys.stdin.readline()
os.close(fd)
print("closed", flush=True)
"#;
    let (mut child, mut lines) = spawn_in(&a, program);
    said(&mut lines, "held");
    // Another user on the same mount: the narrowed mode keeps them out, and they may not
    // change it.
    let other = "setpriv --reuid 40011 --regid 40011 --clear-groups";
    assert!(!a.sh(&format!("{other} cat d/u")).status.success(), "read");
    assert!(
        !a.sh(&format!("{other} chmod 666 d/u")).status.success(),
        "chmod"
    );
    assert!(
        !a.sh(&format!("{other} touch -d @5 d/u")).status.success(),
        "utimes"
    );
    // Another mount sees what the holder answered.
    assert_eq!(
        b.sh_ok("stat -c '%a %u %g %Y' d/u").trim(),
        "600 40010 40010 1000000000"
    );
    assert!(!b.sh(&format!("{other} cat d/u")).status.success());
    tell(&mut child, "close");
    said(&mut lines, "closed");
    assert!(child.wait().expect("wait").success());
}

#[test]
fn a_users_quota_refuses_at_its_limit_while_the_mount_holds_their_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 d");
    let set = common::calm(&[
        "quota",
        "set",
        "--server",
        &server.addr,
        "--user",
        "40020",
        "--inodes",
        "2",
    ]);
    assert!(set.status.success(), "{set:?}");
    // The user's files, made and changed as tar does (held), count at once: the third is
    // refused at its create.
    let out = a.sh_ok(
        "setpriv --reuid 40020 --regid 40020 --clear-groups /usr/bin/python3 -c \"
import errno, os
for name in ('d/one', 'd/two', 'd/three'):
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError as e:
        print(name, errno.errorcode[e.errno])
        continue
    os.write(fd, b'x' * 100)
    os.fchmod(fd, 0o600)
    os.utime(fd, ns=(10**18, 10**18))
    os.close(fd)
    print(name, 'made')
\"",
    );
    assert_eq!(out, "d/one made\nd/two made\nd/three EDQUOT\n");
    let quota = common::calm_json(&[
        "quota",
        "get",
        "--server",
        &server.addr,
        "--user",
        "40020",
        "--json",
    ]);
    assert_eq!(quota["inodes"], 2, "{quota}");
    assert_eq!(quota["bytes"], 200, "{quota}");
    assert_eq!(
        a.sh_ok("stat -c '%n %a %Y' d/one d/two"),
        "d/one 600 1000000000\nd/two 600 1000000000\n"
    );
}

#[test]
fn a_stat_before_the_close_shows_the_times_the_file_keeps() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    // As git checks a file out: made, written, stat'd through its descriptor, closed. The
    // times the stat showed are the file's for good (git compares them at every status).
    let out = a.sh_ok(
        "python3 -c \"
import os
for i in range(300):
    path = 'd/f%d' % i
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b'x' * (i + 1))
    seen = os.fstat(fd)
    os.close(fd)
    after = os.stat(path)
    print(path, seen.st_mtime_ns, seen.st_ctime_ns, seen.st_size,
          after.st_mtime_ns, after.st_ctime_ns, after.st_size)
\"",
    );
    let mut checked = 0;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[1..4], f[4..7], "{line}: the times changed at the close");
        // Another mount reads the same.
        let other = b.sh_ok(&format!("stat -c '%Y %s' {}", f[0]));
        let seconds = f[1].parse::<i64>().expect("ns") / 1_000_000_000;
        assert_eq!(other.trim(), format!("{seconds} {}", f[3]), "{line}");
        checked += 1;
    }
    assert_eq!(checked, 300);
}

/// A tree a mount makes in directories it made (mkdirs, creates, writes, unlinks, rmdirs it
/// answers itself and sends after) is what another mount sees the moment after, round after
/// round: every name, every byte, nothing removed; and a rename, a chmod and a listing through
/// the other mount in between leave both agreeing.
#[test]
fn a_tree_a_mount_made_and_answered_itself_is_what_another_mount_sees_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    // The stream of recalls open: what A makes from now on it holds.
    until_it_may_hold(&a);
    until_it_may_hold(&b);
    let make = |r: usize| {
        format!(
            "mkdir -p r{r}/a/b && for i in $(seq 20); do echo r{r}.$i > r{r}/a/b/f$i; done \
             && mkdir r{r}/a/gone && rmdir r{r}/a/gone && rm r{r}/a/b/f1 r{r}/a/b/f2"
        )
    };
    let before = answered_here(&a);
    for r in 0..40 {
        a.sh_ok(&make(r));
        let seen = b.sh_ok(&format!(
            "ls r{r}/a/b | sort -V | tr '\\n' ' '; cat r{r}/a/b/f20"
        ));
        let names: Vec<String> = (3..=20).map(|i| format!("f{i}")).collect();
        assert_eq!(
            seen,
            format!("{} r{r}.20\n", names.join(" ")),
            "round {r}: what B sees of A's tree"
        );
        assert!(!b.sh(&format!("[ -e r{r}/a/gone ]")).status.success());
        // B changes what A made; A sees it, and goes on making there through the server.
        b.sh_ok(&format!("mv r{r}/a/b/f3 r{r}/a/b/g3 && chmod 700 r{r}/a"));
        a.sh_ok(&format!(
            "[ -e r{r}/a/b/g3 ] && [ $(stat -c %a r{r}/a) = 700 ] && echo x > r{r}/a/b/f21"
        ));
        assert_eq!(b.sh_ok(&format!("cat r{r}/a/b/f21")), "x\n");
    }
    let here = answered_here(&a) - before;
    assert!(here >= 40 * 20, "A answered {here} changes itself");
}

/// A directory that had names before the mount came: the only mount of its server holds it
/// after its first make or removal there, and answers the later ones itself (with the names
/// the server gave it: an O_EXCL make of an old name is refused here). A second mount sees
/// every name the first answered, at once; while it follows the server's changes the first
/// holds no such directory again (its changes go to the server), and once it is gone the
/// first holds it again.
#[test]
fn a_directory_with_names_is_held_by_the_only_mount_and_seen_whole_by_the_next() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let before_mount = Mount::remote(&server.addr, &[]);
    before_mount.sh_ok("mkdir -p d/sub && for i in $(seq 100); do echo $i > d/old$i; done");
    drop(before_mount);
    let a = Mount::remote(&server.addr, &[]);
    until_it_may_hold(&a);
    let start = answered_here(&a);
    a.sh_ok(
        "touch d/new0 && for i in $(seq 200); do echo $i > d/new$i; done \
         && for i in $(seq 50); do rm d/old$i; done && mkdir d/m && echo x > d/m/x",
    );
    let here = answered_here(&a) - start;
    assert!(here >= 250, "A answered {here} of 254 changes itself");
    // An old name is known here: refused without the server.
    let refused = answered_here(&a);
    assert!(!a.sh("set -C; echo again > d/old60").status.success());
    assert_eq!(a.sh_ok("cat d/old60"), "60\n");
    let listing = "ls d | sort | tr '\\n' ' '";
    let seen_by_a = a.sh_ok(listing);
    assert_eq!(
        seen_by_a.split(' ').filter(|n| !n.is_empty()).count(),
        50 + 201 + 2
    );
    assert_eq!(
        answered_here(&a),
        refused,
        "nothing more answered by the refusal"
    );
    let b = Mount::remote(&server.addr, &[]);
    assert_eq!(b.sh_ok(listing), seen_by_a, "B sees every name A answered");
    assert_eq!(b.sh_ok("cat d/new200 d/m/x"), "200\nx\n");
    b.sh_ok("echo b > d/from_b && rm d/old51");
    assert_eq!(
        a.sh_ok("cat d/from_b; [ ! -e d/old51 ] && echo gone"),
        "b\ngone\n"
    );
    // B follows the changes: A's makes there go to the server, and B sees each.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let with_b = answered_here(&a);
    a.sh_ok("for i in $(seq 20); do echo $i > d/later$i; done && rm d/old52");
    assert_eq!(
        answered_here(&a),
        with_b,
        "nothing answered by A while B follows"
    );
    assert_eq!(
        b.sh_ok("cat d/later20; [ ! -e d/old52 ] && echo gone"),
        "20\ngone\n"
    );
    drop(b);
    // Alone again (B's watch gone, A's last refusal old): A holds the directory again.
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let alone = answered_here(&a);
    a.sh_ok("for i in $(seq 20); do echo $i > d/alone$i; done");
    assert!(
        answered_here(&a) - alone >= 18,
        "A answers again once alone"
    );
    a.sh_ok("sync");
    let c = Mount::remote(&server.addr, &[]);
    assert_eq!(c.sh_ok("cat d/alone20 && ls d | wc -l"), "20\n292\n");
}

/// A directory that had names, owned by an unprivileged user, held by the only mount: the
/// owner's makes and removals there are answered by the mount; another user's are the
/// server's to decide and refused (mode 755), and none gets through; the next mount sees the
/// owner's names alone.
#[test]
fn another_user_gets_nothing_past_a_directory_with_names_its_owner_holds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let before_mount = Mount::remote(&server.addr, &[]);
    before_mount.sh_ok(
        "chmod 755 \"$MNT\" && mkdir -m 755 d && echo 1 > d/f1 && echo 2 > d/f2 \
         && chown -R 40010:40010 d",
    );
    drop(before_mount);
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    until_it_may_hold(&a);
    let owner = "setpriv --reuid 40010 --regid 40010 --clear-groups";
    let other = "setpriv --reuid 40011 --regid 40011 --clear-groups";
    let before = answered_here(&a);
    a.sh_ok(&format!(
        "{owner} sh -c 'echo 3 > d/f3 && for i in 4 5 6 7; do echo $i > d/f$i; done && rm d/f1'"
    ));
    assert!(
        answered_here(&a) - before >= 4,
        "the owner's changes answered by A"
    );
    for refused in ["touch d/x", "mkdir d/y", "rm -f d/f2", "mv d/f3 d/z"] {
        assert!(
            !a.sh(&format!("{other} {refused}")).status.success(),
            "another user: {refused}"
        );
    }
    let listing = "ls d | tr '\\n' ' '";
    assert_eq!(a.sh_ok(listing), "f2 f3 f4 f5 f6 f7 ");
    let b = Mount::remote(&server.addr, &[]);
    assert_eq!(b.sh_ok(listing), "f2 f3 f4 f5 f6 f7 ");
    assert_eq!(b.sh_ok("stat -c '%u' d/f7"), "40010\n");
}

/// A directory an unprivileged user made and their mount holds: their creates and removals
/// there are answered by the mount, another user's on the same mount are the server's to
/// decide and refused (mode 755), and neither a make nor a removal of theirs gets through;
/// another mount sees the owner's names and none of the other user's.
#[test]
fn another_user_gets_nothing_past_a_directory_a_user_holds() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 top");
    until_it_may_hold(&a);
    until_it_may_hold(&b);
    let owner = "setpriv --reuid 40010 --regid 40010 --clear-groups";
    let other = "setpriv --reuid 40011 --regid 40011 --clear-groups";
    let before = answered_here(&a);
    a.sh_ok(&format!(
        "{owner} sh -c 'mkdir -m 755 top/d && for i in 1 2 3; do echo $i > top/d/f$i; done \
         && rm top/d/f1 && mkdir top/d/s'"
    ));
    assert!(
        answered_here(&a) - before >= 5,
        "the owner's changes answered by A"
    );
    for refused in [
        "touch top/d/x",
        "mkdir top/d/y",
        "rm -f top/d/f2",
        "rmdir top/d/s",
        "mv top/d/f3 top/d/z",
    ] {
        assert!(
            !a.sh(&format!("{other} {refused}")).status.success(),
            "another user: {refused}"
        );
    }
    assert_eq!(
        b.sh_ok("ls top/d | tr '\\n' ' '; stat -c '%u %a' top/d/f2"),
        "f2 f3 s 40010 644\n"
    );
    assert_eq!(a.sh_ok("ls top/d | tr '\\n' ' '"), "f2 f3 s ");
}

/// A user's quota while two mounts each hold a directory of theirs and answer the makes in it
/// themselves, at once: each mount fills the room the server set aside for it, then asks the
/// server, which refuses exactly at the limit. Every make answered reaches the server (no
/// fsync fails), the usage is the limit exactly, and the room comes back when files go.
#[test]
fn a_users_quota_is_exact_while_two_mounts_answer_their_makes_themselves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &["--allow-other"]);
    // A directory of its own for each mount: a make in a directory asks back what other
    // mounts hold in it.
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 d d/a d/b");
    let quota = |inodes: &str| {
        let args = ["--server", &server.addr, "--user", "40030"];
        let set = common::calm(&[&["quota", "set"][..], &args, &["--inodes", inodes]].concat());
        assert!(set.status.success(), "{set:?}");
    };
    quota("300");
    // The streams of recalls open: what the mounts make from now on they hold.
    until_it_may_hold(&a);
    until_it_may_hold(&b);
    let fill = |dir: &str| {
        format!(
            "setpriv --reuid 40030 --regid 40030 --clear-groups /usr/bin/python3 -c \"
import errno, os
os.mkdir('d/{dir}/x')
made, refused = 0, 0
for i in range(400):
    try:
        os.close(os.open('d/{dir}/x/f%d' % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        made += 1
    except OSError as e:
        assert e.errno == errno.EDQUOT, e
        refused += 1
fd = os.open('d/{dir}/x', os.O_RDONLY)
os.fsync(fd)
print(made, refused)
\""
        )
    };
    let (before_a, before_b) = (answered_here(&a), answered_here(&b));
    let (out_a, out_b) = std::thread::scope(|s| {
        let one = s.spawn(|| a.sh_ok(&fill("a")));
        let two = s.spawn(|| b.sh_ok(&fill("b")));
        (one.join().expect("a"), two.join().expect("b"))
    });
    let counts = |out: &str| -> (u64, u64) {
        let mut it = out.split_whitespace().map(|n| n.parse::<u64>().expect(out));
        (it.next().expect(out), it.next().expect(out))
    };
    let ((made_a, refused_a), (made_b, refused_b)) = (counts(&out_a), counts(&out_b));
    assert_eq!(made_a + refused_a, 400);
    assert_eq!(made_b + refused_b, 400);
    // The two directories and every file made: the limit exactly.
    assert_eq!(made_a + made_b + 2, 300, "A made {made_a}, B {made_b}");
    let (here_a, here_b) = (answered_here(&a) - before_a, answered_here(&b) - before_b);
    assert!(
        here_a >= 50 && here_b >= 50,
        "answered by the mounts themselves: A {here_a}, B {here_b}"
    );
    let usage = common::calm_json(&[
        "quota",
        "get",
        "--server",
        &server.addr,
        "--user",
        "40030",
        "--json",
    ]);
    assert_eq!(usage["inodes"], 300, "{usage}");
    let listed = |m: &Mount| m.sh_ok("ls d/a/x d/b/x | grep -c '^f'").trim().to_string();
    assert_eq!(listed(&b), (made_a + made_b).to_string());
    assert_eq!(listed(&a), (made_a + made_b).to_string());
    // Ten files gone: ten more fit, and no eleventh.
    let out = a.sh_ok(
        "setpriv --reuid 40030 --regid 40030 --clear-groups sh -c \
         'for i in $(seq 0 9); do rm d/a/x/f$i 2>/dev/null || rm d/b/x/f$i; done; \
          for i in $(seq 0 10); do touch d/a/x/g$i 2>&1 | grep -c quota; done' | paste -sd ' '",
    );
    assert_eq!(out.trim(), "0 0 0 0 0 0 0 0 0 0 1", "{out}");
    let usage = common::calm_json(&[
        "quota",
        "get",
        "--server",
        &server.addr,
        "--user",
        "40030",
        "--json",
    ]);
    assert_eq!(usage["inodes"], 300, "{usage}");
}

/// A file written and kept open there, not held by the mount (another mount made it).
const WRITER: &str = r#"
import os
fd = os.open(os.path.join(os.environ["MNT"], "d/g"), os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"new bytes\n")
print("written", flush=True)
input()
"#;

/// What a mount answered reaches the server within the bound while the files stay open: the
/// bytes written and the owner, mode and times kept of a file it holds, and the bytes written
/// to a file it does not hold, are all there for another mount after a kill -9 of the first
/// that came more than the bound later, though no close or fsync asked for them.
#[test]
fn a_mount_killed_loses_nothing_it_answered_longer_ago_than_the_bound() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    b.sh_ok("mkdir d && echo old bytes > d/g");
    // The stream of recalls open: the file A makes, it holds.
    until_it_may_hold(&a);
    until_it_may_hold(&b);
    let (mut holder, mut lines) = spawn_in(&a, HOLDER);
    said(&mut lines, "made");
    let (mut writer, mut written) = spawn_in(&a, WRITER);
    said(&mut written, "written");
    // The bound (5 s) and time for the commits.
    std::thread::sleep(std::time::Duration::from_millis(5000 + 2500));
    drop(a); // SIGKILL of the mount process
    for child in [&mut holder, &mut writer] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(b.sh_ok(STAT).trim(), "600 1234 1234 1000000000 11");
    assert_eq!(b.sh_ok("cat d/f d/g"), "held bytes\nnew bytes\n");
}

/// `--sync` keeps every change durable when it returns: the mount answers none itself (no
/// make in a directory it made, no chmod of a file it made), where the same work on a mount
/// without it is answered there.
#[test]
fn a_mount_with_every_change_durable_answers_no_change_itself() {
    let work = "mkdir d && for i in $(seq 20); do echo $i > d/f$i; chmod 600 d/f$i; done \
                && mkdir d/e && rm d/f1";
    for (extra, answers) in [(&[][..], true), (&["--sync"][..], false)] {
        let mount = Mount::embedded(extra);
        // The stream of recalls open: what the mount makes from now on it may hold.
        if answers {
            until_it_may_hold(&mount);
        } else {
            // A mount with every change durable holds nothing: given the same time to.
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let before = answered_here(&mount);
        mount.sh_ok(work);
        let here = answered_here(&mount) - before;
        assert_eq!(
            here > 0,
            answers,
            "{extra:?}: {here} changes answered by the mount"
        );
        assert_eq!(
            mount.sh_ok("ls d | wc -l; stat -c %a d/f20").trim(),
            "20\n600"
        );
    }
}

/// Quotas stay exact through a kill -9 of a mount holding a user's files and directories: the
/// usage the server keeps is what it has (`calm quota check` finds no difference, and the
/// usage is what another mount lists), and the limit still refuses at its edge.
#[test]
fn a_quota_is_exact_after_a_mount_holding_a_users_files_is_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &["--allow-other"]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -m 777 d");
    let user = ["--server", &server.addr, "--user", "40040"];
    let set = common::calm(&[&["quota", "set"][..], &user, &["--inodes", "60"]].concat());
    assert!(set.status.success(), "{set:?}");
    // The stream of recalls open: what A makes from now on it holds.
    until_it_may_hold(&a);
    until_it_may_hold(&b);
    let before = answered_here(&a);
    let (mut child, mut lines) = spawn_in(
        &a,
        r#"
import os
os.setgroups([]); os.setgid(40040); os.setuid(40040)
d = os.path.join(os.environ["MNT"], "d/u")
os.mkdir(d)
os.mkdir(os.path.join(d, "sub"))
kept = []
for i in range(40):
    fd = os.open(os.path.join(d, "sub" if i % 4 == 0 else "", "f%d" % i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * (100 * i))
    os.fchmod(fd, 0o600)
    if i % 3 == 0:
        os.fsync(fd)
    if i % 2 == 0:
        os.close(fd)
    else:
        kept.append(fd)
for i in (2, 6, 10):
    os.unlink(os.path.join(d, "f%d" % i))
print("done", flush=True)
input()
"#,
    );
    said(&mut lines, "done");
    assert!(
        answered_here(&a) - before > 10,
        "A answered the user's makes itself"
    );
    drop(a); // SIGKILL of the mount process
    let _ = child.kill();
    let _ = child.wait();
    // Every usage kept equals the usage counted (a difference is a line, and a failure).
    let check = common::calm(&["quota", "check", "--server", &server.addr, "--json"]);
    assert!(check.status.success(), "{check:?}");
    assert!(check.stdout.is_empty(), "{check:?}");
    let usage = common::calm_json(&[&["quota", "get"][..], &user, &["--json"]].concat());
    let listed: u64 = b.sh_ok("find d/u | wc -l").trim().parse().expect("a count");
    assert_eq!(usage["inodes"], listed, "{usage}");
    let bytes: u64 = b
        .sh_ok("find d/u -type f -printf '%s\\n' | awk '{s += $1} END {print s + 0}'")
        .trim()
        .parse()
        .expect("a sum");
    assert_eq!(usage["bytes"], bytes, "{usage}");
    // The limit refuses at its edge: the user makes files until refused, 60 inodes in all.
    let made = b.sh_ok(
        "setpriv --reuid 40040 --regid 40040 --clear-groups sh -c \
         'n=0; while touch d/u/g$n 2>/dev/null; do n=$((n+1)); done; echo $n'",
    );
    let made: u64 = made.trim().parse().expect("a count");
    assert_eq!(listed + made, 60, "{listed} kept, {made} made after");
}

/// The outbox for long: 100 000 files made and removed in a directory a mount holds, in rounds
/// of 1 000, all answered by the mount itself. The last round works as the first did (every
/// name there, then none; another mount agrees), and the mount's memory stays flat (its
/// resident size after the last round within 32 MiB of the tenth's). The long tier: run with
/// `cargo test --release -p calm --test holds -- --ignored`.
/// A process in `mount` that makes `d/t` (O_EXCL, read and write) and then does what it is
/// told, a line at a time, saying `ok` (or what it read) after each: `write OFF TEXT`,
/// `trunc N`, `size`, `read` (the whole file, past the kernel's pages), `tail` (how many bytes
/// of the first page past the end are not zero, as a mapping of it shows them), `fsync`,
/// `close`.
const CUTTER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(os.path.join(os.environ["MNT"], "d/t"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
print("made", flush=True)
for line in sys.stdin:
    word = line.split()
    if word[0] == "write":
        os.pwrite(fd, word[2].encode(), int(word[1]))
    elif word[0] == "trunc":
        os.ftruncate(fd, int(word[1]))
    elif word[0] == "size":
        print(os.fstat(fd).st_size, flush=True)
        continue
    elif word[0] == "read":
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        print(os.pread(fd, 1 << 20, 0).decode().replace("\0", "."), flush=True)
        continue
    elif word[0] == "tail":
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(fd).st_size
        at = libc.mmap(None, 4096, 1, 1, fd, 0)
        page = ctypes.string_at(at, 4096)
        print(sum(1 for b in page[size:] if b), flush=True)
        continue
    elif word[0] == "fsync":
        os.fsync(fd)
    else:
        os.close(fd)
    print("ok", flush=True)
"#;

#[test]
fn a_file_a_mount_holds_is_cut_short_by_that_mount_and_seen_so_by_another() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    let (mut cutter, mut lines) = spawn_in(&a, CUTTER);
    said(&mut lines, "made");
    let mut ask = |line: &str| {
        tell(&mut cutter, line);
        lines.next().expect("a line").expect("utf-8")
    };
    assert_eq!(ask(&format!("write 0 {}", "x".repeat(4000))), "ok");
    assert_eq!(ask("fsync"), "ok");
    // The truncate and the size: answered by A, the server asked nothing but the status
    // call (a mount that sends the truncate asks twice); a read of what is left asks at most
    // for the file's map.
    let asked = requests_during(&server.addr, || {
        assert_eq!(ask("trunc 10"), "ok");
        assert_eq!(ask("size"), "10");
    });
    let read = requests_during(&server.addr, || {
        assert_eq!(ask("read"), "x".repeat(10));
    });
    assert_eq!(ask("tail"), "0", "bytes cut off seen in a mapping");
    assert_eq!(asked, 1, "a truncate of a file held asked the server");
    assert_eq!(common::cuts_answered_here(&a), 1);
    assert!(
        read <= 2,
        "a read of a file held and cut asked the server {read} times"
    );
    // B sees the file as A answered it (its stat has the server ask A first).
    assert_eq!(b.sh_ok("stat -c %s d/t").trim(), "10");
    assert_eq!(b.sh_ok("cat d/t"), "x".repeat(10));

    // In a file made next, a write after a truncate goes after it: the bytes between read
    // as zeros.
    tell(&mut cutter, "close");
    said(&mut lines, "ok");
    let _ = cutter.wait();
    a.sh_ok("rm d/t");
    let (mut cutter, mut lines) = spawn_in(&a, CUTTER);
    said(&mut lines, "made");
    let mut ask = |line: &str| {
        tell(&mut cutter, line);
        lines.next().expect("a line").expect("utf-8")
    };
    assert_eq!(ask("write 0 abcdefghij"), "ok");
    assert_eq!(ask("fsync"), "ok");
    assert_eq!(ask("trunc 4"), "ok");
    assert_eq!(ask("write 8 yz"), "ok");
    assert_eq!(ask("read"), "abcd....yz");
    // A second cut goes to the server after the first (never folded into one).
    assert_eq!(ask("fsync"), "ok");
    assert_eq!(ask("trunc 2"), "ok");
    assert_eq!(ask("trunc 1"), "ok");
    assert_eq!(ask("size"), "1");
    assert_eq!(ask("close"), "ok");
    let _ = cutter.wait();
    assert_eq!(b.sh_ok("cat d/t"), "a");
    assert_eq!(a.sh_ok("cat d/t"), "a");
}

#[test]
#[ignore = "long: 100 000 makes and removals (about a minute in release)"]
fn a_hundred_thousand_makes_and_removals_answered_by_a_mount_keep_working() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    until_it_may_hold(&a);
    let rss = |mount: &Mount| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", mount.pid()))
            .expect("the mount's status");
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .expect("VmRSS");
        line.split_whitespace()
            .nth(1)
            .expect("kB")
            .parse()
            .expect("kB")
    };
    let before = answered_here(&a);
    let (mut child, mut lines) = spawn_in(
        &a,
        r#"
import os, sys
d = os.path.join(os.environ["MNT"], "d")
os.mkdir(d)
for r in range(100):
    for i in range(1000):
        os.close(os.open(os.path.join(d, "f%d" % i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    assert len(os.listdir(d)) == 1000, r
    for i in range(1000):
        os.unlink(os.path.join(d, "f%d" % i))
    assert os.listdir(d) == [], r
    print("round", r, flush=True)
    sys.stdin.readline()
"#,
    );
    let mut tenth = 0;
    for r in 0..100 {
        said(&mut lines, &format!("round {r}"));
        if r == 9 {
            tenth = rss(&a);
        }
        tell(&mut child, "go");
    }
    assert!(child.wait().expect("wait").success());
    let last = rss(&a);
    assert!(
        last <= tenth + 32 * 1024,
        "the mount's resident size grew from {tenth} kB (round 10) to {last} kB (round 100)"
    );
    let here = answered_here(&a) - before;
    assert!(
        here >= 190_000,
        "A answered {here} of 200 000 changes itself"
    );
    // Another mount sees the directory as A answered it (its listing asks A for the directory
    // back: A's next changes go through the server, and work as the first did).
    let b = Mount::remote(&server.addr, &[]);
    assert_eq!(b.sh_ok("ls -A d | wc -l").trim(), "0");
    a.sh_ok("touch d/last && rm d/last && mkdir d/e && rmdir d/e && touch d/end");
    assert_eq!(b.sh_ok("ls -A d").trim(), "end");
}
