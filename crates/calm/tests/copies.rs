//! Copies: a mount answers an open of a file it read and nobody changed since itself, keeping
//! the kernel's pages, and the server asks for the copy back before it answers another
//! client's change of the file. So an open on one mount right after a close on another always
//! reads the new bytes (close-to-open), and reading a file again costs the server nothing.

use crate::common;

use std::io::Write;
use std::time::{Duration, Instant};

use calm_client::Client;
use calm_meta::{Caller, ROOT, SetAttr};
use common::{Mount, Server, spawn_in};

fn requests(server: &str) -> u64 {
    common::calm_json(&["status", "--server", server, "--json"])["requests"]
        .as_u64()
        .expect("requests")
}

/// Reads `d/f` whole (open, read, close) at each line it is told; says what it read, as one
/// line, with its mode and size as the kernel answers them after the open.
const READER: &str = r#"
import os, sys
path = os.path.join(os.environ["MNT"], "d/f")
for line in sys.stdin:
    times = int(line)
    for _ in range(times):
        with open(path, "rb") as f:
            data = f.read()
            st = os.fstat(f.fileno())
    print("%s %o %d" % (data.decode(), st.st_mode & 0o7777, st.st_size), flush=True)
"#;

/// At each line `WORD MODE`, writes WORD over `d/f` (truncating it) through a new open, closes
/// it, then sets MODE; says `done` once all returned.
const WRITER: &str = r#"
import os, sys
path = os.path.join(os.environ["MNT"], "d/f")
for line in sys.stdin:
    word, mode = line.split()
    with open(path, "wb") as f:
        f.write(word.encode())
    os.chmod(path, int(mode, 8))
    print("done", flush=True)
"#;

fn ask(
    child: &mut std::process::Child,
    lines: &mut std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    line: &str,
) -> String {
    writeln!(child.stdin.as_mut().expect("piped"), "{line}").expect("tell");
    lines.next().expect("an answer").expect("utf-8")
}

#[test]
fn an_open_right_after_another_mounts_close_reads_the_new_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d && printf first > d/f && chmod 644 d/f");
    let (mut reader, mut read) = spawn_in(&b, READER);
    let (mut writer, mut wrote) = spawn_in(&a, WRITER);
    assert_eq!(ask(&mut reader, &mut read, "1"), "first 644 5");

    // Reading it again is answered by B itself: the server is asked (almost) nothing.
    let before = requests(&server.addr);
    assert_eq!(ask(&mut reader, &mut read, "1000"), "first 644 5");
    let asked = requests(&server.addr) - before;
    assert!(
        asked <= 3,
        "1 000 opens of a file unchanged took {asked} requests to the server"
    );

    // Each change A makes is what B's very next open reads: the bytes, the size and the mode
    // (the change is answered only after B dropped its copy and the kernel's pages).
    for round in 0..300u32 {
        let word = format!("w{}", "x".repeat((round % 17) as usize));
        let mode = if round % 2 == 0 { "600" } else { "644" };
        assert_eq!(
            ask(&mut writer, &mut wrote, &format!("{word} {mode}")),
            "done"
        );
        assert_eq!(
            ask(&mut reader, &mut read, "1"),
            format!("{word} {mode} {}", word.len()),
            "round {round}: B opened A's file right after A's close and chmod returned"
        );
        // And after the first open, B answers again from its new copy.
        assert_eq!(
            ask(&mut reader, &mut read, "3"),
            format!("{word} {mode} {}", word.len())
        );
    }
    // Every round's change asked B's copy back (B took a new one at its next open).
    let status = common::calm_json(&["status", "--server", &server.addr, "--json"]);
    let recalled = status["copies_recalled"].as_u64().expect("recalls");
    assert!(
        recalled >= 300,
        "B's copies were asked back {recalled} times"
    );
    drop(writer.stdin.take());
    drop(reader.stdin.take());
    let _ = (writer.wait(), reader.wait());
}

#[test]
fn a_change_waits_for_no_copy_of_a_mount_that_died() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &[]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d && printf first > d/f");
    let files: String = (0..200).map(|i| format!(" d/g{i}")).collect();
    a.sh_ok(&format!("for f in{files}; do echo $f > $f; done"));
    // B reads every file twice: it keeps a copy of each.
    b.sh_ok(&format!(
        "cat d/f{files} > /dev/null; cat d/f{files} > /dev/null"
    ));

    // B dies holding 201 copies: A's changes of those files go on at once (the copies ended
    // with B's stream of recalls).
    let pid = b.pid();
    // SAFETY: kill(2) on the test's own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    drop(b);
    let started = Instant::now();
    a.sh_ok(&format!(
        "printf second > d/f; for f in{files}; do echo x >> $f; done"
    ));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "201 changes took {took:?} after the mount with copies of them died"
    );

    // A new mount reads them as changed, and keeps copies of its own.
    let c = Mount::remote(&server.addr, &[]);
    assert_eq!(c.sh_ok("cat d/f"), "second");
    assert_eq!(c.sh_ok("cat d/g7"), "d/g7\nx\n");
    let before = requests(&server.addr);
    let out = c.sh_ok("for i in $(seq 100); do cat d/f; done");
    assert_eq!(out, "second".repeat(100));
    let asked = requests(&server.addr) - before;
    assert!(
        asked <= 3,
        "100 opens of a file unchanged took {asked} requests"
    );
}

#[test]
fn the_server_answers_a_change_only_after_other_sessions_gave_their_copies_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    common::runtime().block_on(async {
        let root = Client::connect(&server.addr).await.expect("connect");
        let file = root.create(ROOT, b"f", 0o644).await.expect("create").handle;
        let session = |session| {
            root.with_caller(Caller {
                session,
                ..Caller::default()
            })
        };
        let (reader, changer) = (session(7), session(8));
        let chmod = |mode| SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };

        // No copy without the stream of recalls open.
        assert!(!reader.read_map_keeping(file).await.expect("read").1);
        let mut recalls = reader.holds().await.expect("stream");
        assert!(reader.read_map_keeping(file).await.expect("read").1);

        // Another session's change is asked back and waits for it.
        let change = {
            let changer = changer.clone();
            tokio::spawn(async move { changer.setattr(file, &chmod(0o600)).await })
        };
        let asked = tokio::time::timeout(Duration::from_secs(2), recalls.next()).await;
        assert_eq!(
            asked.expect("the copy asked back").expect("recall"),
            Some(vec![file])
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !change.is_finished(),
            "the change was answered while another session kept a copy"
        );
        reader
            .return_holds(Vec::new(), vec![file])
            .await
            .expect("give the copy back");
        let changed = tokio::time::timeout(Duration::from_secs(2), change)
            .await
            .expect("answered once the copy came back")
            .expect("task")
            .expect("chmod");
        assert_eq!(changed.mode & 0o7777, 0o600);

        // Reads by others ask nothing back, nor do the holder's own changes.
        assert!(reader.read_map_keeping(file).await.expect("read").1);
        changer.read_map(file).await.expect("read");
        reader
            .setattr(file, &chmod(0o640))
            .await
            .expect("own chmod");
        let quiet = tokio::time::timeout(Duration::from_millis(200), recalls.next()).await;
        assert!(quiet.is_err(), "nothing asked back: {quiet:?}");

        // A session that does not give its copy back holds the change 5 s at most, and is
        // granted no copy after.
        let started = Instant::now();
        changer.setattr(file, &chmod(0o644)).await.expect("chmod");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(4_500) && waited < Duration::from_secs(8),
            "a copy not given back held a change {waited:?}"
        );
        assert!(!reader.read_map_keeping(file).await.expect("read").1);
    });
    let status = common::calm_json(&["status", "--server", &server.addr, "--json"]);
    assert_eq!(
        (&status["copies_recalled"], &status["copies_taken"]),
        (&2.into(), &1.into()),
        "one copy given back, one taken away"
    );
}

#[test]
fn a_mount_whose_lock_session_was_replaced_keeps_nobody_waiting() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--lock-lease-ms", "1000"]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("mkdir d && printf first > d/f && cat d/f > /dev/null && cat d/f > /dev/null");
    let copies =
        || common::calm_json(&["status", "--server", &server.addr, "--json"])["copies"].clone();
    assert_eq!(copies(), 1, "A keeps a copy");

    // A stops past its lease: the server ends its lock session, and A, let go on, opens a new
    // one. The copy of the old session must not hold B's change until it is taken away.
    let pid = a.pid() as i32;
    // SAFETY: kill(2) on the test's own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(3_000));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    std::thread::sleep(Duration::from_millis(2_000));
    let started = Instant::now();
    b.sh_ok("printf second > d/f");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2_500),
        "B's change of a file A had a copy of under its replaced session took {took:?}"
    );
    assert_eq!(a.sh_ok("cat d/f"), "second");

    // A, under its new session, keeps copies again.
    a.sh_ok("cat d/f > /dev/null");
    let before = requests(&server.addr);
    assert_eq!(
        a.sh_ok("for i in $(seq 50); do cat d/f; done"),
        "second".repeat(50)
    );
    let asked = requests(&server.addr) - before;
    assert!(
        asked <= 3,
        "50 opens of a file unchanged took {asked} requests"
    );
    let status = common::calm_json(&["status", "--server", &server.addr, "--json"]);
    assert_eq!(status["copies_taken"], 0, "no copy had to be taken away");
}

#[test]
fn a_copy_lets_no_other_user_in_and_a_chmod_elsewhere_holds_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&common::data_dir(&tmp));
    let a = Mount::remote(&server.addr, &["--allow-other"]);
    let b = Mount::remote(&server.addr, &[]);
    a.sh_ok("chmod 755 \"$MNT\"; printf private > f && chmod 600 f");
    // Root reads it through A: A keeps a copy, and answers the next opens itself.
    assert_eq!(a.sh_ok("cat f"), "private");
    let before = requests(&server.addr);
    assert_eq!(
        a.sh_ok("for i in $(seq 20); do cat f; done"),
        "private".repeat(20)
    );
    let asked = requests(&server.addr) - before;
    assert!(asked <= 3, "20 opens from a copy took {asked} requests");
    let nobody = |mount: &Mount| {
        mount.sh_ok(
            "setpriv --reuid 65534 --regid 65534 --clear-groups cat f 2>/dev/null \
             || echo refused",
        )
    };
    assert_eq!(
        nobody(&a),
        "refused\n",
        "another user opened root's 0600 file"
    );
    // Opened to others through B: the very next open by the other user through A reads it.
    for round in 0..50 {
        b.sh_ok("chmod 644 f");
        assert_eq!(nobody(&a), "private", "round {round}: chmod 644 on B");
        b.sh_ok("chmod 600 f");
        assert_eq!(nobody(&a), "refused\n", "round {round}: chmod 600 on B");
    }
}
