//! kill -9 under a storm of changes from three mounts of one server, with a changelog follower:
//! a crash keeps a prefix of each mount's order. Each mount's program makes file after file in
//! a directory of its own (create, write its number, close; every third renamed), and says
//! each number once the calls for it returned. First one mount is killed: the other two go on,
//! and what the killed one made is a prefix of its order, holding every number it said, each
//! file whole. Then the server is killed, three times over, with the server's default durability (a change
//! answered once in its log, flushed within 10 ms): the two mounts wait for it, and go on
//! once it is back on the same address; nothing they were answered is lost, no gap opens, and
//! every file the follower saw made before the kill is there.

use crate::common;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const MOUNTS: usize = 3;
/// Times the server is killed under the storm.
const SERVER_KILLS: usize = 3;

/// Files of a directory `m{K}` (`f{i}`, or `g{i}` for every third), made one after the
/// other; prints each `i` once its calls returned, or `error ERRNO` and stops.
const STORM: &str = r#"
import os
d = os.path.join(os.environ['MNT'], 'mK')
os.makedirs(d, exist_ok=True)
i = 0
while True:
    try:
        p = os.path.join(d, f'f{i}')
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, str(i).encode())
        os.close(fd)
        if i % 3 == 0:
            os.rename(p, os.path.join(d, f'g{i}'))
    except OSError as e:
        print('error', e.errno, flush=True)
        break
    print(i, flush=True)
    i += 1
"#;

/// Every file of directories DIRS as `directory → (number → (name, contents))`. A program
/// killed may leave a call behind it that still lands (a rename): listed again then.
const LIST: &str = r#"
import json, os, time
for attempt in range(50):
    try:
        out = {}
        for k in DIRS:
            d = os.path.join(os.environ['MNT'], k)
            files = {}
            for name in os.listdir(d):
                with open(os.path.join(d, name)) as f:
                    files[int(name[1:])] = [name, f.read()]
            out[k] = files
        break
    except FileNotFoundError as e:
        vanished = e
        time.sleep(0.1)
else:
    raise vanished
print(json.dumps(out))
"#;

/// A storm running in a mount: its program, and the last number it said.
struct Storm {
    child: std::process::Child,
    said: Arc<Mutex<Option<u64>>>,
    ended: Arc<Mutex<Option<String>>>,
}

impl Storm {
    fn start(mount: &Mount, k: usize) -> Storm {
        let (child, lines) = spawn_in(mount, &STORM.replace("mK", &format!("m{k}")));
        Storm::follow(child, lines)
    }

    /// The storm `child` runs, saying its numbers on `lines`.
    fn follow(
        child: std::process::Child,
        lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    ) -> Storm {
        let (said, ended) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
        let (s, e) = (said.clone(), ended.clone());
        std::thread::spawn(move || {
            for line in lines {
                let Ok(line) = line else { break };
                match line.parse::<u64>() {
                    Ok(i) => *s.lock().unwrap() = Some(i),
                    Err(_) => {
                        *e.lock().unwrap() = Some(line);
                        return;
                    }
                }
            }
            e.lock().unwrap().get_or_insert_with(|| "ended".into());
        });
        Storm { child, said, ended }
    }

    fn said(&self) -> Option<u64> {
        *self.said.lock().unwrap()
    }

    /// Waits until it said `at_least` numbers more than `from`, failing the test after a
    /// minute or when it stopped.
    fn wait_past(&self, what: &str, from: Option<u64>, more: u64) {
        let target = from.map_or(more, |f| f + more);
        let started = Instant::now();
        while self.said().is_none_or(|s| s < target) {
            assert!(
                self.ended.lock().unwrap().is_none(),
                "{what}: the storm stopped: {:?} at {:?}",
                self.ended.lock().unwrap(),
                self.said()
            );
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what}: the storm is at {:?}, not {target}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(mut self) -> Option<u64> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.said()
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks that directory `dir` of `listing` holds a prefix of its storm's order: every number
/// up to `said` whole (its name, its contents), at most one more (the one in flight: made,
/// perhaps not yet written or renamed), and nothing else.
fn a_prefix(listing: &serde_json::Value, dir: &str, said: u64) {
    let files: BTreeMap<u64, (String, String)> = listing[dir]
        .as_object()
        .unwrap_or_else(|| panic!("no {dir} in {listing}"))
        .iter()
        .map(|(i, v)| {
            let pair = (v[0].as_str().unwrap().into(), v[1].as_str().unwrap().into());
            (i.parse().unwrap(), pair)
        })
        .collect();
    for i in 0..=said {
        let name = if i % 3 == 0 { 'g' } else { 'f' };
        assert_eq!(
            files.get(&i),
            Some(&(format!("{name}{i}"), i.to_string())),
            "{dir}: number {i} of {said} said"
        );
    }
    let beyond: Vec<_> = files.keys().filter(|i| **i > said).collect();
    assert!(
        beyond.is_empty() || beyond == [&(said + 1)],
        "{dir}: files past the number said ({said}): {beyond:?}"
    );
}

/// The files of `dirs` (whose storms have stopped) through `mount`.
fn listing(mount: &Mount, dirs: &[&str]) -> serde_json::Value {
    let out = mount.sh_ok(&format!(
        "python3 -c \"{}\"",
        LIST.replace("DIRS", &format!("{dirs:?}").replace('"', "'"))
    ));
    serde_json::from_str(out.trim()).expect("the listing's JSON")
}

#[test]
fn kill9_of_a_mount_and_of_the_server_keeps_each_mounts_order() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["--listen", listen.as_str()];
    let server = Server::start_with(&data, &args);
    let mounts: Vec<Mount> = (0..MOUNTS)
        .map(|_| Mount::remote(&server.addr, &[]))
        .collect();
    // A follower of every change, from the first.
    let mut follower = std::process::Command::new(CALM)
        .args(["changelog", "read", "--server", &server.addr, "--follow"])
        .args(["--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // (directory, name) of every create it saw.
    let followed: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let lines = std::io::BufReader::new(follower.stdout.take().unwrap()).lines();
    let seen = followed.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let record: serde_json::Value = serde_json::from_str(&line).unwrap();
            if record["type"] == "CREAT" {
                let name = record["name"].as_str().unwrap_or_default().to_string();
                let parent = record["parent"].as_u64().unwrap_or_default();
                seen.lock().unwrap().push((parent, name));
            }
        }
    });
    let storms: Vec<Storm> = mounts
        .iter()
        .enumerate()
        .map(|(k, m)| Storm::start(m, k))
        .collect();
    for (k, storm) in storms.iter().enumerate() {
        storm.wait_past(&format!("mount {k}"), None, 200);
    }

    // kill -9 of one mount: the others go on; what it made is a prefix of its order.
    let mut storms = storms.into_iter();
    let (s0, s1, s2) = (
        storms.next().unwrap(),
        storms.next().unwrap(),
        storms.next().unwrap(),
    );
    let mut mounts = mounts.into_iter();
    let (m0, m1, m2) = (
        mounts.next().unwrap(),
        mounts.next().unwrap(),
        mounts.next().unwrap(),
    );
    drop(m2); // SIGKILL
    let said2 = s2.stop().expect("mount 2 said numbers");
    let (at0, at1) = (s0.said(), s1.said());
    s0.wait_past("mount 0 after mount 2's kill", at0, 100);
    s1.wait_past("mount 1 after mount 2's kill", at1, 100);
    a_prefix(&listing(&m0, &["m2"]), "m2", said2);

    // kill -9 of the server: the mounts wait for it, and go on once it is back.
    let created_before = followed.lock().unwrap().len();
    assert!(created_before > 600, "the follower saw {created_before}");
    let _ = follower.kill();
    let _ = follower.wait();
    let followed = followed.lock().unwrap().clone();
    let mut server = server;
    for round in 0..SERVER_KILLS {
        server.kill9();
        let (at0, at1) = (s0.said(), s1.said());
        std::thread::sleep(Duration::from_millis(300));
        server = Server::start_with(&data, &args);
        s0.wait_past(&format!("mount 0 after restart {round}"), at0, 100);
        s1.wait_past(&format!("mount 1 after restart {round}"), at1, 100);
    }
    let (said0, said1) = (s0.stop().unwrap(), s1.stop().unwrap());
    let after = listing(&m1, &["m0", "m1", "m2"]);
    a_prefix(&after, "m0", said0);
    a_prefix(&after, "m1", said1);
    a_prefix(&after, "m2", said2);
    // Every file the follower saw made before the kill is there (under its name or the one
    // it was renamed to).
    let dirs: BTreeMap<u64, String> = m1
        .sh_ok("stat -c '%i %n' m0 m1 m2")
        .lines()
        .map(|line| {
            let (ino, name) = line.split_once(' ').unwrap();
            (ino.parse().unwrap(), name.to_string())
        })
        .collect();
    let mut checked = 0;
    for (parent, name) in &followed {
        let (Some(dir), Some(i)) = (dirs.get(parent), name.strip_prefix('f')) else {
            continue;
        };
        assert!(
            after[dir.as_str()].get(i).is_some(),
            "{dir}/{name}, which the follower saw made, is gone"
        );
        checked += 1;
    }
    assert!(
        checked > 600,
        "{checked} creates the follower saw were checked"
    );
    eprintln!(
        "numbers said: mount 0 {said0}, mount 1 {said1}, mount 2 (killed) {said2}; \
         creates the follower saw, checked: {checked}"
    );
    drop((m0, m1));
    let (status, _) = server.terminate();
    assert!(status.success());
}

/// Files in directories the mount makes as it goes (`mK/s{i / 50}/f{i}`), each created,
/// written with its number and closed, then said: directories a mount made and holds, whose
/// creates and mkdirs it answers itself and sends after.
const HELD_STORM: &str = r#"
import os
d = os.path.join(os.environ['MNT'], 'mK')
os.makedirs(d, exist_ok=True)
i = 0
while True:
    try:
        sub = os.path.join(d, f's{i // 50}')
        if i % 50 == 0:
            os.mkdir(sub)
        fd = os.open(os.path.join(sub, f'f{i}'), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, str(i).encode())
        os.close(fd)
    except OSError as e:
        print('error', e.errno, flush=True)
        break
    print(i, flush=True)
    i += 1
"#;

/// Every file below directories DIRS as `directory → (number → contents)`.
const HELD_LIST: &str = r#"
import json, os
out = {}
for k in DIRS:
    files = {}
    for root, _, names in os.walk(os.path.join(os.environ['MNT'], k)):
        for name in names:
            with open(os.path.join(root, name)) as f:
                files[int(name[1:])] = f.read()
    out[k] = files
print(json.dumps(out))
"#;

/// Checks that `dir` of a [`HELD_LIST`] listing holds every number up to `said` with its
/// contents, at most one more (made, perhaps not yet written), and nothing else: a prefix.
fn a_held_prefix(listing: &serde_json::Value, dir: &str, said: u64) {
    let files: BTreeMap<u64, String> = listing[dir]
        .as_object()
        .unwrap_or_else(|| panic!("no {dir} in {listing}"))
        .iter()
        .map(|(i, v)| (i.parse().unwrap(), v.as_str().unwrap().to_string()))
        .collect();
    for i in 0..=said {
        assert_eq!(
            files.get(&i),
            Some(&i.to_string()),
            "{dir}: number {i} of {said} said"
        );
    }
    let beyond: Vec<_> = files.keys().filter(|i| **i > said).collect();
    assert!(
        beyond.is_empty() || beyond == [&(said + 1)],
        "{dir}: files past the number said ({said}): {beyond:?}"
    );
}

/// kill -9 of a mount, then of the server, under storms of creates and mkdirs that the mounts
/// answer themselves in directories they made: each mount's files stay a prefix of its order
/// (a mount killed loses at most what it had not sent, never an earlier change without a
/// later one), and a server killed loses nothing a mount was answered.
#[test]
fn kill9_under_changes_answered_by_the_mounts_keeps_each_mounts_order() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["--listen", listen.as_str()];
    let server = Server::start_with(&data, &args);
    let mounts: Vec<Mount> = (0..MOUNTS)
        .map(|_| Mount::remote(&server.addr, &[]))
        .collect();
    // The stream of recalls open: what a mount makes from now on it holds.
    std::thread::sleep(Duration::from_millis(500));
    let start = |k: usize, m: &Mount| {
        let (child, lines) = spawn_in(m, &HELD_STORM.replace("mK", &format!("m{k}")));
        let storm = Storm::follow(child, lines);
        storm.wait_past(&format!("mount {k}"), None, 300);
        storm
    };
    let storms: Vec<Storm> = mounts
        .iter()
        .enumerate()
        .map(|(k, m)| start(k, m))
        .collect();
    for (k, mount) in mounts.iter().enumerate() {
        let here = answered_here(mount);
        // With every change durable when it returns, the mounts answer none themselves.
        match common::sync_mode() {
            false => assert!(here >= 300, "mount {k} answered {here} changes itself"),
            true => assert_eq!(here, 0, "mount {k} answered changes itself"),
        }
    }
    let mut storms = storms.into_iter();
    let (s0, s1, s2) = (
        storms.next().unwrap(),
        storms.next().unwrap(),
        storms.next().unwrap(),
    );
    let mut mounts = mounts.into_iter();
    let (m0, m1, m2) = (
        mounts.next().unwrap(),
        mounts.next().unwrap(),
        mounts.next().unwrap(),
    );
    drop(m2); // SIGKILL
    let said2 = s2.stop().expect("mount 2 said numbers");
    let list = |mount: &Mount, dirs: &[&str]| -> serde_json::Value {
        let program = HELD_LIST.replace("DIRS", &format!("{dirs:?}").replace('"', "'"));
        let out = mount.sh_ok(&format!("python3 -c \"{program}\""));
        serde_json::from_str(out.trim()).expect("the listing's JSON")
    };
    a_held_prefix(&list(&m0, &["m2"]), "m2", said2);

    let mut server = server;
    for round in 0..SERVER_KILLS {
        let (at0, at1) = (s0.said(), s1.said());
        s0.wait_past(&format!("mount 0 before kill {round}"), at0, 100);
        s1.wait_past(&format!("mount 1 before kill {round}"), at1, 100);
        server.kill9();
        let (at0, at1) = (s0.said(), s1.said());
        std::thread::sleep(Duration::from_millis(300));
        server = Server::start_with(&data, &args);
        s0.wait_past(&format!("mount 0 after restart {round}"), at0, 100);
        s1.wait_past(&format!("mount 1 after restart {round}"), at1, 100);
    }
    let (said0, said1) = (s0.stop().unwrap(), s1.stop().unwrap());
    let after = list(&m1, &["m0", "m1", "m2"]);
    a_held_prefix(&after, "m0", said0);
    a_held_prefix(&after, "m1", said1);
    a_held_prefix(&after, "m2", said2);
    eprintln!("numbers said: mount 0 {said0}, mount 1 {said1}, mount 2 (killed) {said2}");
    drop((m0, m1));
    let (status, _) = server.terminate();
    assert!(status.success());
}

/// In directory `e`, which has `old{i}` for i < 2 000: removes `old{i}` and makes `n{i}` (its
/// number in it), one after the other, saying each `i` once its calls returned.
const NAMED_STORM: &str = r#"
import os
d = os.path.join(os.environ['MNT'], 'e')
for i in range(2000):
    try:
        os.unlink(os.path.join(d, f'old{i}'))
        fd = os.open(os.path.join(d, f'n{i}'), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, str(i).encode())
        os.close(fd)
    except OSError as e:
        print('error', e.errno, flush=True)
        break
    print(i, flush=True)
print('done', flush=True)
"#;

/// kill -9 of the only mount of a server while it answers the removals and makes in a
/// directory that had names before it came (`Meta.HoldDir`): what stays is a prefix of its
/// order — every removal and make up to the last number it said, at most the next one
/// partly, and nothing later.
#[test]
fn kill9_of_the_only_mount_in_a_directory_with_names_keeps_its_order() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&data_dir(&tmp));
    let before = Mount::remote(&server.addr, &[]);
    before.sh_ok("mkdir e && cd e && for i in $(seq 0 1999); do : > old$i; done && sync .");
    drop(before);
    let mount = Mount::remote(&server.addr, &[]);
    std::thread::sleep(Duration::from_millis(500));
    let start = answered_here(&mount);
    let (child, lines) = spawn_in(&mount, NAMED_STORM);
    let storm = Storm::follow(child, lines);
    storm.wait_past("the storm", None, 300);
    let here = answered_here(&mount) - start;
    match common::sync_mode() {
        false => assert!(here >= 300, "the mount answered {here} changes itself"),
        true => assert_eq!(here, 0, "the mount answered changes itself"),
    }
    drop(mount); // SIGKILL
    let said = storm.stop().expect("the storm said numbers");
    let after = Mount::remote(&server.addr, &[]);
    let names = after.sh_ok("ls e");
    let names: std::collections::BTreeSet<&str> = names.lines().collect();
    let next = said + 1;
    for i in 0..2000u64 {
        let (old, new) = (format!("old{i}"), format!("n{i}"));
        let (has_old, has_new) = (names.contains(old.as_str()), names.contains(new.as_str()));
        match i {
            i if i <= said => {
                assert!(
                    !has_old && has_new,
                    "{i} of {said} said: old {has_old}, new {has_new}"
                );
                assert_eq!(after.sh_ok(&format!("cat e/{new}")), i.to_string());
            }
            i if i == next => assert!(!(has_old && has_new), "the one in flight: not both"),
            _ => assert!(
                has_old && !has_new,
                "{i} past {said} said: old {has_old}, new {has_new}"
            ),
        }
    }
    eprintln!("numbers said: {said}");
}
