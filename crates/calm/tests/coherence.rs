//! Caches kept exact between mounts: two mounts of one server, whose kernels cache names and
//! attributes for a minute (the default TTL); every change made through one is seen through the
//! other long before that, because the mount follows the server's changes and invalidates the
//! kernel's entries. A mount whose change stream fell behind drops its whole cache.

use crate::common;

use common::{Mount, Server, calm};

fn status(server: &str) -> serde_json::Value {
    let out = calm(&["status", "--server", server, "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The requests `server` answered while `work` ran (one of them the first status call itself).
fn requests_during(server: &str, work: impl FnOnce()) -> u64 {
    let requests = || status(server)["requests"].as_u64().expect("requests");
    let before = requests();
    work();
    requests() - before
}

/// The requests the server answered while `mount` created and unlinked `pairs` files in its
/// directory `d`, one after the other (open with O_CREAT and O_EXCL, close, unlink).
fn pairs_asked(server: &str, mount: &Mount, pairs: usize) -> u64 {
    requests_during(server, || {
        mount.sh_ok(&format!(
            "python3 -c \"import os
for i in range({pairs}):
    os.close(os.open('d/f%d' % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    os.unlink('d/f%d' % i)\""
        ));
    })
}

/// Waits until `condition` (a shell test run in `mount`) holds, for at most 10 s: with a TTL
/// of 60 s only an invalidation makes it hold in time.
fn until(mount: &Mount, condition: &str, what: &str) {
    let out = mount.sh(&format!(
        "for _ in $(seq 1000); do if {condition}; then exit 0; fi; sleep 0.01; done; exit 1"
    ));
    assert!(
        out.status.success(),
        "{what}: not seen through the other mount within 10 s ({condition})"
    );
}

#[test]
fn every_change_through_one_mount_is_seen_through_another_despite_a_minute_of_ttl() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir -p d/sub && echo one > d/f && echo x > d/p && echo y > d/q");
    // B caches all of it.
    let cached = "stat -c '%n %a %u %Y %s %h' d d/f d/p d/q d/sub > /dev/null; \
                  cat d/f d/p d/q > /dev/null; ls d > /dev/null";
    b.sh_ok(cached);

    // Cached for real: past the old 1 s TTL, stats through B reach the server not at all.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let made = requests_during(&server.addr, || {
        b.sh_ok("for _ in $(seq 200); do stat d/f d/q > /dev/null; done");
    });
    assert!(
        made <= 10,
        "400 stats of cached files through B made {made} requests"
    );

    let steps = [
        ("chmod", "chmod 600 d/f", "[ $(stat -c %a d/f) = 600 ]"),
        (
            "chown",
            "chown 1234:1234 d/f",
            "[ $(stat -c %u d/f) = 1234 ]",
        ),
        (
            "utimes",
            "touch -m -d @1000000000 d/f",
            "[ $(stat -c %Y d/f) = 1000000000 ]",
        ),
        (
            "write+close",
            "echo 'a longer line' > d/f",
            "[ \"$(cat d/f)\" = 'a longer line' ] && [ $(stat -c %s d/f) = 14 ]",
        ),
        (
            "hard link",
            "ln d/f d/link",
            "[ $(stat -c %h d/f) = 2 ] && [ -e d/link ]",
        ),
        (
            "rename",
            "mv d/f d/sub/g",
            "[ ! -e d/f ] && [ -e d/sub/g ] && [ $(ls d/sub) = g ]",
        ),
        (
            "unlink",
            "rm d/sub/g",
            "[ ! -e d/sub/g ] && [ $(stat -c %h d/link) = 1 ]",
        ),
        ("rmdir", "rmdir d/sub", "[ ! -e d/sub ]"),
        (
            "rename over a file",
            "mv d/p d/q",
            "[ ! -e d/p ] && [ \"$(cat d/q)\" = x ]",
        ),
        ("truncate", "truncate -s 1 d/q", "[ $(stat -c %s d/q) = 1 ]"),
        (
            "mkdir",
            "mkdir d/new",
            "[ -d d/new ] && ls d | grep -qx new",
        ),
        (
            "create seen in a listing",
            "touch d/listed",
            "ls d | grep -qx listed",
        ),
        (
            "unlink seen in a listing",
            "rm d/listed",
            "! ls d | grep -qx listed",
        ),
    ];
    for (what, change, seen) in steps {
        // B has it cached (again) right before A changes it.
        b.sh_ok("stat d d/* > /dev/null 2>&1; ls d > /dev/null; cat d/* > /dev/null 2>&1 || true");
        a.sh_ok(change);
        until(&b, seen, what);
    }
    // And the other way round.
    a.sh_ok("stat -c %a d/q > /dev/null");
    b.sh_ok("chmod 640 d/q");
    until(&a, "[ $(stat -c %a d/q) = 640 ]", "chmod through B");
}

/// A lookup that finds nothing is kept by the kernel as the name's absence (a database asks
/// for its `-wal`, a compiler for headers along its include path); a name made through another
/// mount, in any way, is seen at once all the same.
#[test]
fn absent_names_are_cached_and_names_made_through_another_mount_are_seen() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d && echo x > d/file");
    b.sh_ok("stat d/missing 2> /dev/null || true");
    let made = requests_during(&server.addr, || {
        b.sh_ok("for _ in $(seq 200); do stat d/missing 2> /dev/null && exit 1; done; true");
    });
    assert!(
        made <= 10,
        "200 stats of an absent name through B made {made} requests"
    );
    let steps = [
        ("create", "echo new > d/created", "created"),
        ("mkdir", "mkdir d/dir", "dir"),
        ("symlink", "ln -s file d/symlink", "symlink"),
        ("mknod", "mkfifo d/fifo", "fifo"),
        ("hard link", "ln d/file d/hardlink", "hardlink"),
        (
            "rename to it",
            "echo r > d/tmp && mv d/tmp d/renamed",
            "renamed",
        ),
    ];
    for (what, change, name) in steps {
        // B holds the name's absence right before A makes it.
        b.sh_ok(&format!(
            "for _ in 1 2 3; do stat d/{name} 2> /dev/null && exit 1; done; true"
        ));
        a.sh_ok(change);
        until(&b, &format!("[ -e d/{name} ] || [ -L d/{name} ]"), what);
    }
    // A name removed and made again through A, while B holds each state in turn.
    for round in 0..20 {
        a.sh_ok("rm d/created");
        until(&b, "[ ! -e d/created ]", "unlink");
        a.sh_ok(&format!("echo {round} > d/created"));
        until(
            &b,
            &format!("[ \"$(cat d/created)\" = {round} ]"),
            "create again",
        );
    }
}

#[test]
fn a_mount_whose_change_stream_fell_behind_drops_its_whole_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A queue of one change: any two changes published together overflow every watcher.
    let server = Server::start_with(&common::data_dir(&tmp), &["--watch-queue-max", "1"]);
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d && for i in $(seq 100); do echo $i > d/f$i; done");
    b.sh_ok("for i in $(seq 100); do stat -c %a d/f$i > /dev/null; done");
    // Changes in groups: sixteen threads chmod the files and make new ones, so that commits
    // carry several records and B's queue overflows.
    a.sh_ok(
        "python3 - <<'EOF'
import os, threading
def work(t):
    for i in range(t, 100, 16):
        os.chmod(f'd/f{i + 1}', 0o600)
        for j in range(4):
            open(f'd/n{t}-{i}-{j}', 'w').close()
threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
for t in threads: t.start()
for t in threads: t.join()
EOF",
    );
    let resyncs = status(&server.addr)["watch_resyncs"]
        .as_u64()
        .expect("watch_resyncs");
    assert!(resyncs > 0, "no watcher fell behind: the test did not test");
    until(
        &b,
        "[ $(stat -c %a d/f* | sort -u) = 600 ] && [ $(ls d | wc -l) = 500 ]",
        "every chmod and create after a resync",
    );
}

/// The kernel asks whether a file has capabilities before a write whenever it fetched the file's
/// attributes since the last (and a write makes it fetch them for the next fstat, as a database
/// does); a mount answers from what the server last said while nothing changed the file. Capabilities set through one
/// mount are seen through another that had found none, and their removal likewise.
#[test]
fn capabilities_set_through_one_mount_are_seen_through_another_that_found_none() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("head -c 4096 /dev/zero > f");
    let has_caps = "python3 -c \"import os, sys; \
                    sys.exit(0 if os.getxattr('f', 'security.capability') else 1)\" 2>/dev/null";

    // 500 writes, each followed by fstat, through B: the fstats reach the server (a write
    // leaves the kernel's attributes stale), the kernel's question before each write about once.
    let before = status(&server.addr)["requests"].as_u64().expect("requests");
    b.sh_ok(
        "python3 -c \"import os
fd = os.open('f', os.O_WRONLY)
for i in range(500):
    os.pwrite(fd, b'w', i)
    os.fstat(fd)
os.close(fd)\"",
    );
    let after = status(&server.addr)["requests"].as_u64().expect("requests");
    assert!(
        after - before < 550,
        "500 writes and fstats through B made {} requests",
        after - before
    );
    assert!(!b.sh(has_caps).status.success(), "no capabilities yet");

    // Set through A (cap_net_bind_service, permitted): seen through B, which knew of none.
    a.sh_ok(
        "python3 -c \"import os, struct; \
         os.setxattr('f', 'security.capability', struct.pack('<5I', 0x02000000, 1 << 10, 0, 0, 0))\"",
    );
    until(&b, has_caps, "capabilities set through A");
    // Removed through B: gone through A too, and through B at once.
    a.sh_ok(has_caps);
    b.sh_ok("python3 -c \"import os; os.removexattr('f', 'security.capability')\"");
    assert!(!b.sh(has_caps).status.success(), "removed through B");
    until(
        &a,
        &format!("! {has_caps}"),
        "capabilities removed through B",
    );
    // Set through B itself: seen at once.
    b.sh_ok(
        "python3 -c \"import os, struct; \
         os.setxattr('f', 'security.capability', struct.pack('<5I', 0x02000000, 1 << 10, 0, 0, 0))\"",
    );
    b.sh_ok(has_caps);
}

/// After its own change of a directory's names, the mount answers the kernel's question for
/// the directory's attributes with those the server's answer to the change brought: a create
/// and an unlink through one mount cost at most three requests, not five (two since the mount
/// also answers the lookup before the create, the next test). And every change of the
/// directory, through this mount or another, is seen in its attributes all the same.
#[test]
fn a_directory_changed_through_a_mount_is_seen_exactly_with_fewer_requests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    let made = pairs_asked(&server.addr, &a, 200);
    assert!(
        made <= 3 * 200 + 10,
        "200 creates and unlinks through A made {made} requests"
    );

    // This mount's own changes, seen at once.
    let own = [
        "mkdir d/s1 && [ $(stat -c %h d) = 3 ]",
        "rmdir d/s1 && [ $(stat -c %h d) = 2 ]",
        ": > d/x && chmod 700 d && [ $(stat -c %a d) = 700 ]",
        "mkdir d/s2 && mv d/s2 d/s3 && [ $(stat -c %h d) = 3 ] && [ -d d/s3 ]",
        "mkdir e && : > e/y && mv d/s3 e/s3 && [ $(stat -c %h d) = 2 ] && [ $(stat -c %h e) = 3 ]",
        "ln d/x d/x2 && [ $(stat -c %h d/x) = 2 ] && rm d/x2 && [ $(stat -c %h d/x) = 1 ]",
        "touch -m -d @1000000000 d && [ $(stat -c %Y d) = 1000000000 ] && : > d/z && \
         [ $(stat -c %Y d) != 1000000000 ]",
        // A directory removed while a process is in it: its attributes are not the kept ones.
        "mkdir d/t && : > d/t/f && rm d/t/f && cd d/t && rmdir ../t && \
         { ! stat . > /dev/null 2>&1 || [ $(stat -c %h .) = 0 ]; }",
        // A directory moved: its change time moves, whatever was kept of it.
        "mkdir d/m && : > d/m/f && rm d/m/f && c=$(stat -c %Z d/m) && sleep 1.1 && \
         mv d/m d/m2 && [ $(stat -c %Z d/m2) != $c ] && rmdir d/m2 && [ $(stat -c %h d) = 2 ]",
    ];
    for step in own {
        a.sh_ok(step);
    }
    // Another mount's changes of a directory whose attributes A keeps from its own change.
    for round in 0..50 {
        a.sh_ok(&format!(": > d/a{round} && stat d > /dev/null"));
        b.sh_ok(&format!("mkdir d/b{round}"));
        until(
            &a,
            &format!("[ $(stat -c %h d) = {} ]", 3 + round),
            "mkdir through B",
        );
        a.sh_ok(&format!("rm d/a{round} && stat d > /dev/null"));
        b.sh_ok(&format!(
            "chmod {} d",
            if round % 2 == 0 { 750 } else { 755 }
        ));
        until(
            &a,
            &format!(
                "[ $(stat -c %a d) = {} ]",
                if round % 2 == 0 { 750 } else { 755 }
            ),
            "chmod through B",
        );
    }
}

/// A user who owns neither the directories on a path nor the file makes the kernel check each
/// one's ACL, whenever their attributes were refreshed: the mount answers that there is none
/// itself (the server said so and nothing changed them since), where each walk used to ask the
/// server once per directory; an ACL set through another mount is seen all the same.
#[test]
fn an_unprivileged_users_path_walks_ask_the_server_nothing_of_acls_nobody_set() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir -p d/e && echo x > d/e/f && chmod 600 d/e/f");
    let as_user = "setpriv --reuid 40003 --regid 40003 --clear-groups";
    // Each walk's stat refreshes the attributes (a change through the other mount drops them:
    // after a write, the kernel asks again as a database's fstat makes it).
    let walk = format!("for i in $(seq 200); do {as_user} stat -c %s d/e/f > /dev/null; done");
    a.sh_ok(&walk);
    let asked = requests_during(&server.addr, || {
        a.sh_ok(&walk);
    });
    assert!(
        asked < 20,
        "200 walks asked the server {asked} times (one is the count itself)"
    );
    let read = format!("{as_user} cat d/e/f");
    assert!(
        !a.sh(&read).status.success(),
        "the mode alone lets the user in"
    );
    b.sh_ok("setfacl -m u:40003:r d/e/f");
    until(&a, &read, "an ACL set through the other mount");
}

/// A directory this mount made has no names but those this mount gave it, until another
/// client changes it: the kernel's lookup before each create is answered by the mount (a
/// create and an unlink cost two requests, not three), and a name made there through another
/// mount, in any way, is seen all the same; this mount's own renames, exchanges and removals
/// are seen at once.
#[test]
fn lookups_in_a_directory_this_mount_made_are_answered_here_and_other_mounts_names_are_seen() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d");
    let made = pairs_asked(&server.addr, &a, 200);
    assert!(
        made <= 2 * 200 + 10,
        "200 creates and unlinks through A made {made} requests"
    );

    // This mount's own changes, seen at once (renames within and across directories it made,
    // an exchange, a removal, a directory made in one).
    let own = [
        "mkdir k k2 && : > k/x && mv k/x k/y && [ ! -e k/x ] && [ -e k/y ]",
        "mv k/y k2/y && [ ! -e k/y ] && [ -e k2/y ] && : > k/z",
        "python3 -c \"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, b'k/z', -100, b'k2/y', 2) != 0:
    raise OSError(ctypes.get_errno(), 'renameat2')\" && [ -e k/z ] && [ -e k2/y ]",
        "rm k/z && [ ! -e k/z ] && ln k2/y k/l && [ -e k/l ] && rm k/l k2/y",
        "mkdir k/s && [ -d k/s ] && : > k/s/f && [ -e k/s/f ] && rm k/s/f && rmdir k/s && \
         [ ! -e k/s ]",
        "ln -s y k/sym && [ -L k/sym ] && mkfifo k/p && [ -p k/p ] && rm k/sym k/p",
        // A name that is there is found, a refused make changes nothing.
        ": > k/e && ! mkdir k/e 2> /dev/null && [ -f k/e ] && rm k/e && [ ! -e k/e ]",
    ];
    for step in own {
        a.sh_ok(step);
    }

    // Another mount's names in a directory A made, each kind in a fresh one, A having looked
    // the name up (and been told it is not there) right before.
    let steps = [
        ("create", "echo new > D/n"),
        ("mkdir", "mkdir D/n"),
        ("symlink", "ln -s elsewhere D/n"),
        ("mknod", "mkfifo D/n"),
        ("hard link", "echo x > D/../h-D && ln D/../h-D D/n"),
        ("rename into it", "echo r > D/../r-D && mv D/../r-D D/n"),
    ];
    for round in 0..5 {
        for (at, (what, change)) in steps.iter().enumerate() {
            let dir = format!("m{round}-{at}");
            a.sh_ok(&format!(
                "mkdir {dir} && for _ in 1 2 3; do [ -e {dir}/n ] || [ -L {dir}/n ] && exit 1; \
                 done; true"
            ));
            b.sh_ok(&change.replace('D', &dir));
            until(&a, &format!("[ -e {dir}/n ] || [ -L {dir}/n ]"), what);
        }
    }
    // A name removed through the other mount and made again through A's.
    a.sh_ok("mkdir g && : > g/x");
    b.sh_ok("rm g/x");
    until(&a, "[ ! -e g/x ]", "unlink through B");
    a.sh_ok(": > g/x && [ -e g/x ]");

    // A name longer than any directory holds is too long, also where the mount knows every
    // name (each call that names it, as the POSIX conformance suite tries them).
    a.sh_ok("mkdir t && : > t/x");
    let long = "x".repeat(256);
    for call in [
        "stat",
        "chmod 644",
        "chown 0",
        "truncate -s 0",
        "rm",
        "rmdir",
        "ln t/x",
        "mv t/x",
    ] {
        let out = a.sh(&format!("{call} t/{long}"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("File name too long"),
            "{call} of a 256-byte name in a directory this mount made: {said}"
        );
    }
    a.sh_ok(&format!(": > t/{} && [ -e t/x ]", "y".repeat(255)));
}

/// A lookup the mount answers itself is still refused to a user who may not search the
/// directory: the name's absence is not told to them.
#[test]
fn a_lookup_answered_by_the_mount_is_refused_to_a_user_who_may_not_search_the_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    a.sh_ok("chmod 755 \"$MNT\" && mkdir p && chmod 700 p && : > p/there");
    let as_user = "setpriv --reuid 40004 --regid 40004 --clear-groups";
    for _ in 0..20 {
        let out = a.sh(&format!("{as_user} stat p/missing"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("Permission denied"),
            "an unprivileged user was told: {said}"
        );
        a.sh_ok("! stat p/missing 2> /dev/null && [ -e p/there ]");
    }
}

/// A process killed while its rename waits for the server is answered at once (it may go),
/// and the rename still lands: the kernel, which dropped that answer, must not keep the names
/// from before it. (It kept the old listing for its whole TTL: the mount skips the records of
/// its own changes, which its kernel knows from their answers.)
#[test]
fn a_rename_whose_caller_was_killed_while_it_waited_is_seen_where_it_was_made() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let other = Mount::remote(&server.addr, &[]);
    // The kernel holds the directory's listing and the file's name.
    assert_eq!(
        mount.sh_ok("mkdir d; echo x > d/a; ls d; stat -c %s d/a"),
        "a\n2\n"
    );
    server.signal(libc::SIGSTOP);
    let (mut renamer, mut said) = common::spawn_in(
        &mount,
        "import os; d = os.environ['MNT'] + '/d'; print('renaming', flush=True); \
         os.rename(d + '/a', d + '/b')",
    );
    // The rename waits for the stopped server; its caller is killed meanwhile, and answered.
    // (Once it said it is about to call rename: a python slow to start on a busy machine is
    // not killed before it asked.)
    assert_eq!(said.next().expect("a line").expect("read"), "renaming");
    std::thread::sleep(std::time::Duration::from_millis(300));
    renamer.kill().expect("kill");
    renamer.wait().expect("wait");
    server.signal(libc::SIGCONT);
    // Once the rename has landed (another mount sees it), the mount that made it sees it
    // within moments, not after its kernel's entries expire.
    other.sh_ok("for i in $(seq 400); do [ -e d/b ] && exit 0; sleep 0.05; done; exit 1");
    // (A listing would mend the names, so they are asked for first.)
    let out = mount.sh_ok(
        "seen=missing
         for i in $(seq 20); do [ -e d/b ] && seen=seen && break; sleep 0.05; done
         echo b-$seen; [ ! -e d/a ] && echo a-gone; ls d; cat d/b",
    );
    assert_eq!(out, "b-seen\na-gone\nb\nx\n");
}

/// A file made with O_EXCL has no capabilities, and the mount that made it says so to the
/// kernel's question before its first write without asking the server; capabilities set on it
/// afterwards through the same mount are seen at once, and a write drops them as on a local
/// file system.
#[test]
fn a_file_made_here_answers_for_its_capabilities_until_they_are_set() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let mount = Mount::remote(&server.addr, &[]);
    let capability = "python3 -c \"import os, sys; \
                      print(os.getxattr(sys.argv[1], 'security.capability').hex())\" ";
    let out = mount.sh_ok(&format!(
        "python3 -c \"import os, struct
fd = os.open('f', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o755)
os.write(fd, b'x')
os.close(fd)
os.setxattr('f', 'security.capability', struct.pack('<5I', 0x02000000, 1 << 10, 0, 0, 0))\"
         {capability} f
         echo y >> f
         ({capability} f 2>&1 || true) | tail -1"
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0], "0000000200040000000000000000000000000000",
        "{out}"
    );
    assert!(
        lines[1].contains("No data available"),
        "a write drops them: {out}"
    );
}
