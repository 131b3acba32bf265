//! Nothing lost to a mistake: an `rm -rf` brought back from the trash byte for byte, also
//! when the server is killed in the middle of the restore; a tree cloned through the command
//! on a mount equal to its source and independent of it, by the superuser and by a user, and a
//! clone cut by a kill -9 leaving only whole copies. fsck is clean after every kill.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Mount, Server};

fn socket(data: &Path) -> String {
    format!("unix:{}", data.join("calm.sock").display())
}

fn fsck_clean(data: &Path) {
    let fsck = common::calm_json(&["fsck", data.to_str().unwrap(), "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// One line per node below `dir` (path, kind, mode, owner, size, sha256 or target), sorted.
fn described(mount: &Mount, dir: &str) -> String {
    mount.sh_ok(&format!(
        "cd {dir} && find . -mindepth 1 -printf '%P %y %m %U %G %s %l\\n' | sort && \
         find . -type f -print0 | sort -z | xargs -0 -r sha256sum"
    ))
}

/// `calm trash VERB` of the trash entry `entry`, which must succeed.
fn trash(data: &Path, verb: &str, entry: &serde_json::Value) {
    let id = entry["id"].to_string();
    let out = common::calm(&["trash", verb, &id, "--server", &socket(data)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn trash_entries(data: &Path) -> Vec<serde_json::Value> {
    let out = common::calm(&["trash", "list", "--json", "--server", &socket(data)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The server's option that keeps every removal in the trash, however young (the tests below
/// remove trees they just made; `young_files_skip_the_trash` tests the default).
const EVERY_REMOVAL: [&str; 2] = ["--trash-min-age-s", "0"];

const TREE: &str = "for d in 0 1 2 3; do mkdir -p proj/d$d/sub; \
    for f in $(seq 60); do head -c $((f * 997)) /dev/urandom > proj/d$d/f$f; done; \
    echo small > proj/d$d/sub/s; ln -s f1 proj/d$d/link; done; \
    python3 -c \"import os; os.setxattr('proj/d0/f1', 'user.tag', b'kept')\"; \
    chmod 640 proj/d1/f2";

/// A file removed in a directory a mount holds (the mount answered the removal) goes to the
/// trash; its restore puts the name back in that directory, and has the mount give the
/// directory back first: the mount's next O_EXCL make of that name is refused, an rmdir of the
/// directory too, nothing the mount answered is refused later, and the file reads as it was.
#[test]
fn a_restore_into_a_directory_a_mount_holds_reaches_that_mount() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start_with(&data, &EVERY_REMOVAL);
    let mount = Mount::remote(&server.addr, &[]);
    // The stream of recalls open: what the mount makes from now on it holds.
    std::thread::sleep(Duration::from_millis(500));
    let start = common::answered_here(&mount);
    mount.sh_ok("mkdir d && echo kept > d/f && sync -f d/f && rm d/f && echo x > d/g");
    if !common::sync_mode() {
        let here = common::answered_here(&mount) - start;
        assert!(here >= 2, "the mount answered {here} changes in d itself");
    }
    let entry = trash_entries(&data)
        .into_iter()
        .find(|e| e["path"] == "/d/f")
        .expect("/d/f in the trash");
    trash(&data, "restore", &entry);
    assert!(
        !mount.sh("set -C; echo again > d/f").status.success(),
        "the restored name is there for the mount"
    );
    assert_eq!(mount.sh_ok("cat d/f; ls d | tr '\\n' ' '"), "kept\nf g ");
    // The directory is not empty for the mount either.
    assert!(
        !mount.sh("rm d/g && rmdir d").status.success(),
        "an rmdir of a directory the restore filled"
    );
    assert_eq!(mount.sh_ok("ls d"), "f\n");
    // Every change the mount answered reached the server: none refused (a refusal fails this).
    mount.sh_ok("sync -f d");
}

/// `rm -rf` of a tree goes to the trash; the server is killed (-9) while the tree is being
/// restored; after it comes back fsck is clean (each entry is back whole or still in the
/// trash), and restoring what is left brings back every file byte for byte.
#[test]
fn an_rm_rf_comes_back_from_the_trash_even_through_a_kill() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    // Every removal into the trash, also of a tree made a moment ago.
    let server = Server::start_with(&data, &EVERY_REMOVAL);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok(TREE);
    let before = described(&mount, "proj");
    mount.sh_ok("rm -rf proj && ! test -e proj");
    let status = common::calm_json(&["status", "--json", "--server", &socket(&data)]);
    assert_eq!(status["trash_kept_s"], 86_400, "a day by default: {status}");
    // proj, 4 directories and their subdirectories, 240 files, 4 links, 4 small files.
    assert_eq!(status["trash_entries"], 1 + 8 + 240 + 8, "{status}");
    let bytes: u64 = (1..=60u64).map(|f| f * 997).sum::<u64>() * 4 + 6 * 4;
    assert_eq!(status["trash_bytes"], bytes, "{status}");
    let top = trash_entries(&data)
        .into_iter()
        .find(|e| e["path"] == "/proj")
        .expect("/proj in the trash");

    // A restore with the server killed under it.
    let mut restore = std::process::Command::new(common::CALM)
        .args(["trash", "restore", &top["id"].to_string(), "--server"])
        .arg(socket(&data))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("calm trash restore");
    std::thread::sleep(Duration::from_millis(60));
    drop(mount);
    server.kill9();
    let _ = restore.wait();
    fsck_clean(&data);

    let server = Server::start_with(&data, &EVERY_REMOVAL);
    let mount = Mount::remote(&server.addr, &[]);
    // What is still in the trash comes back, the directories above first.
    loop {
        let left: Vec<_> = trash_entries(&data)
            .into_iter()
            .filter(|e| e["path"].as_str().unwrap().starts_with("/proj"))
            .collect();
        let Some(first) = left.first() else { break };
        trash(&data, "restore", first);
    }
    assert_eq!(described(&mount, "proj"), before);
    let status = common::calm_json(&["status", "--json", "--server", &socket(&data)]);
    assert_eq!(
        (
            status["trash_entries"].clone(),
            status["trash_bytes"].clone()
        ),
        (0.into(), 0.into()),
        "{status}"
    );

    // Purged: gone for good.
    mount.sh_ok("rm -rf proj/d3");
    let d3 = trash_entries(&data)
        .into_iter()
        .find(|e| e["path"] == "/proj/d3")
        .expect("/proj/d3 in the trash");
    trash(&data, "purge", &d3);
    assert!(trash_entries(&data).is_empty());
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    fsck_clean(&data);
}

/// `calm clone` of a tree on a mount: the copy reads as the source (bytes, modes, owners,
/// xattrs, symlinks), a write to either leaves the other alone, a user's clone is theirs and
/// refuses what they may not read, and a clone cut by a kill -9 of the server leaves only
/// whole copies of files (fsck clean).
#[test]
fn a_clone_is_a_copy_that_shares_its_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let calm = common::CALM;
    let sock = socket(&data);
    mount.sh_ok(TREE);
    // File capabilities (CAP_NET_BIND_SERVICE, permitted and effective): the superuser's copy
    // keeps them (as cp -a), a user's does not (as the first write would take them).
    let capability = "python3 -c \"import os, sys; print(os.getxattr(sys.argv[1],                       'security.capability').hex())\" ";
    mount.sh_ok(
        "python3 -c \"import os; os.setxattr('proj/d0/f1', 'security.capability',          bytes.fromhex('0100000200040000000000000000000000000000'))\"",
    );
    let source = described(&mount, "proj");
    let out = mount.sh_ok(&format!("{calm} clone proj copy --server {sock}"));
    assert!(out.starts_with("cloned proj as copy: 256 entries"), "{out}");
    assert_eq!(described(&mount, "copy"), source);
    assert_eq!(
        mount.sh_ok(
            "python3 -c \"import os; print(os.getxattr('copy/d0/f1', 'user.tag').decode())\""
        ),
        "kept\n"
    );
    mount.sh_ok("echo more >> copy/d0/f5 && : > proj/d0/f6");
    assert_eq!(
        mount.sh_ok("stat -c %s proj/d0/f5 copy/d0/f5 proj/d0/f6 copy/d0/f6"),
        format!("{}\n{}\n0\n{}\n", 5 * 997, 5 * 997 + 5, 6 * 997),
        "a write to one never changes the other"
    );

    // A user: owns the copy, is refused what they may not read.
    mount.sh_ok("mkdir home && chown 1000:1000 home && chmod 600 proj/d2/f3");
    let as_user = format!("setpriv --reuid 1000 --regid 1000 --clear-groups {calm}");
    mount.sh_ok(&format!("{as_user} clone proj/d0 home/d0 --server {sock}"));
    assert_eq!(
        mount.sh_ok("stat -c '%u %g' home/d0 home/d0/f1"),
        "1000 1000\n1000 1000\n"
    );
    assert_eq!(
        mount.sh_ok(&format!("{capability} copy/d0/f1")),
        "0100000200040000000000000000000000000000\n"
    );
    let dropped = mount.sh(&format!("{capability} home/d0/f1"));
    assert!(
        String::from_utf8_lossy(&dropped.stderr).contains("No data available"),
        "a user's clone kept file capabilities: {dropped:?}"
    );
    let refused = mount.sh(&format!("{as_user} clone proj/d2 home/d2 --server {sock}"));
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("ermission"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // A clone cut by a kill -9: what is there is whole.
    let source = described(&mount, "proj");
    let mut cloning = std::process::Command::new("nsenter")
        .args(["-t", &mount.pid().to_string(), "-m", "--", calm, "clone"])
        .arg(mount.mnt.join("proj"))
        .arg(mount.mnt.join("cut"))
        .args(["--server", &sock])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("calm clone");
    std::thread::sleep(Duration::from_millis(15));
    server.kill9();
    let _ = cloning.wait();
    drop(mount);
    fsck_clean(&data);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let cut = mount.sh_ok(
        "test -d cut || exit 0; cd cut && find . -type f -print0 | sort -z | xargs -0 -r sha256sum",
    );
    for line in cut.lines() {
        assert!(source.contains(line), "{line} is not a whole copy");
    }
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    fsck_clean(&data);
}

/// A directory cloned into itself (or below itself) is refused at once, as `cp -r` refuses
/// it, and nothing is made; cloning a sibling still works.
#[test]
fn a_clone_into_itself_is_refused_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let calm = common::CALM;
    let sock = socket(&data);
    mount.sh_ok("mkdir -p a/b/c && echo x > a/b/f");
    let before = described(&mount, "a");
    for into in ["a/copy", "a/b/copy", "a/b/c/copy"] {
        let started = Instant::now();
        let refused = mount.sh(&format!("timeout 20 {calm} clone a {into} --server {sock}"));
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "cloned a into {into}");
        assert!(said.contains("cannot be cloned into itself"), "{said}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{into}: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(described(&mount, "a"), before, "nothing made in the source");
    let out = mount.sh_ok(&format!("{calm} clone a/b a/b2 --server {sock}"));
    assert!(out.starts_with("cloned a/b as a/b2"), "{out}");
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    fsck_clean(&data);
}

/// On etcd: an `rm -rf` restored through a kill -9 of the server, a clone (a few entries per
/// request, etcd's transactions being small), and the expiry purging what is older than the
/// trash keeps; fsck of the cluster clean.
#[test]
fn the_trash_and_clones_on_etcd() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut private = None;
    let url = common::etcd_url("trash-clone", &mut private);
    let data = tmp.path().join("server");
    let args = ["--store", url.as_str(), EVERY_REMOVAL[0], EVERY_REMOVAL[1]];
    let server = Server::start_with(&data, &args);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok(TREE);
    let before = described(&mount, "proj");
    mount.sh_ok("rm -rf proj");
    let top = trash_entries(&data)
        .into_iter()
        .find(|e| e["path"] == "/proj")
        .expect("/proj in the trash");
    let mut restore = std::process::Command::new(common::CALM)
        .args(["trash", "restore", &top["id"].to_string(), "--server"])
        .arg(socket(&data))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("calm trash restore");
    std::thread::sleep(Duration::from_millis(300));
    drop(mount);
    server.kill9();
    let _ = restore.wait();
    let fsck = common::calm_json(&["fsck", "--store", &url, "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");

    let server = Server::start_with(&data, &args);
    let mount = Mount::remote(&server.addr, &[]);
    loop {
        let left = trash_entries(&data);
        let Some(first) = left.first() else { break };
        trash(&data, "restore", first);
    }
    assert_eq!(described(&mount, "proj"), before);
    let calm = common::CALM;
    let out = mount.sh_ok(&format!(
        "{calm} clone proj copy --server {}",
        socket(&data)
    ));
    assert!(out.starts_with("cloned proj as copy: 256 entries"), "{out}");
    assert_eq!(described(&mount, "copy"), before);
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());

    // A trash kept about a second: what is removed is purged by the server itself.
    let server = Server::start_with(&data, &["--store", url.as_str(), "--trash-hours", "0.0003"]);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok("rm -rf copy/d1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = common::calm_json(&["status", "--json", "--server", &socket(&data)]);
        if status["trash_entries"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not expired: {status}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        described(&mount, "proj"),
        before,
        "the source kept every byte"
    );
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    let fsck = common::calm_json(&["fsck", "--store", &url, "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// A program's scratch files skip the trash: 1 000 sqlite transactions in DELETE mode (each
/// makes and removes its journal) by an unprivileged user leave nothing in it, while a file
/// older than the minimum age, removed by mistake, is there to be restored.
#[test]
fn young_files_skip_the_trash() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start_with(&data, &["--trash-min-age-s", "2"]);
    let mount = Mount::remote(&socket(&data), &["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    mount.sh_ok("mkdir -m 777 db && echo keep > db/notes");
    std::thread::sleep(Duration::from_secs(3));
    let uid = common::UNPRIVILEGED_UID.to_string();
    let out = mount.sh_ok(&format!(
        "setpriv --reuid {uid} --regid {uid} --clear-groups /usr/bin/python3 -c \"
import sqlite3
db = sqlite3.connect('db/test.db', isolation_level=None)
db.execute('PRAGMA journal_mode=DELETE')
db.execute('CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)')
for i in range(1000):
    db.execute('BEGIN')
    db.execute('INSERT OR REPLACE INTO t VALUES (?, randomblob(100))', (i % 100,))
    db.execute('COMMIT')
print(db.execute('SELECT count(*) FROM t').fetchone()[0])
\" && rm db/notes"
    ));
    assert_eq!(out, "100\n");
    let entries = trash_entries(&data);
    let paths: Vec<&str> = entries.iter().filter_map(|e| e["path"].as_str()).collect();
    assert_eq!(paths, ["/db/notes"], "only the file removed by mistake");
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    fsck_clean(&data);
}

/// Anonymous memory of process `pid` (its heap, not the store's mapped pages), in KiB.
fn anon_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon")
}

/// The server's heap may grow by at most this much while the trash is listed by a storm of
/// requests (eight listings at once, each of a bounded page: a few MiB each).
const LISTING_STORM_HEAP_MIB_MAX: u64 = 160;

/// One user's trash of 300 000 long-named entries (the superuser's here) costs another user's
/// listing nothing: a user who owns none of them runs 64 × 2 listings at once (those past two at once are
/// refused, the others page through the trash a bounded page at a time), the server's heap
/// stays within a named bound, a third user lists their own entry meanwhile, and the
/// superuser lists all 300 001 (pages end at 1 MiB of names, under the 4 MiB a message may
/// hold) and purges one.
#[test]
fn one_users_huge_trash_costs_another_users_listing_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start_with(&data, &["--trash-min-age-s", "0"]);
    let mount = Mount::remote(&socket(&data), &["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (calm, sock) = (common::CALM, socket(&data));
    let as_user = |uid: u32| format!("setpriv --reuid {uid} --regid {uid} --clear-groups");
    const FILES: usize = 300_000;
    mount.sh_ok("mkdir -m 777 pile");
    // Made and removed through the server's API, 64 calls at once: through a mount, one file
    // at a time, 300 000 take minutes.
    let started = Instant::now();
    common::runtime().block_on(async {
        let client = calm_client::Client::connect(&socket(&data))
            .await
            .expect("connect");
        let pile = client.lookup(1, b"pile").await.expect("pile").handle;
        let many = client
            .mkdir(pile, b"many", 0o755)
            .await
            .expect("mkdir")
            .handle;
        let mut workers = tokio::task::JoinSet::new();
        for w in 0..64 {
            let client = client.clone();
            workers.spawn(async move {
                let pad = "x".repeat(240);
                for i in (w..FILES).step_by(64) {
                    let name = format!("{pad}{i:09}");
                    client
                        .create(many, name.as_bytes(), 0o644)
                        .await
                        .expect("create");
                    client.unlink(many, name.as_bytes()).await.expect("unlink");
                }
            });
        }
        while let Some(done) = workers.join_next().await {
            done.expect("a worker");
        }
        client.rmdir(pile, b"many").await.expect("rmdir");
    });
    eprintln!("{FILES} files made and removed in {:?}", started.elapsed());
    mount.sh_ok(&format!(
        "{0} touch pile/mine && {0} rm pile/mine",
        as_user(40012)
    ));

    let pid = server.child.id();
    let before = anon_kib(pid);
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let (peak, storm, third) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(anon_kib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        let storm = scope.spawn(|| {
            mount.sh(&format!(
                "for i in $(seq 128); do {} {calm} trash list --json --server {sock} \
                 > /dev/null 2>> /tmp/storm-$$ & done; wait; n=$(grep -c 'at once' /tmp/storm-$$ \
                 || true); rm -f /tmp/storm-$$; echo $n",
                as_user(40011)
            ))
        });
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        let third = mount.sh_ok(&format!(
            "{} {calm} trash list --json --server {sock}",
            as_user(40012)
        ));
        eprintln!("the third user's listing took {:?}", asked.elapsed());
        let storm = storm.join().expect("storm");
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        (sampler.join().expect("sampler"), storm, third)
    });
    let refused: u32 = String::from_utf8_lossy(&storm.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    eprintln!(
        "heap before {} MiB, peak {} MiB; {refused} of 128 listings refused as past two at once",
        before / 1024,
        peak / 1024
    );
    assert!(
        peak.saturating_sub(before) <= LISTING_STORM_HEAP_MIB_MAX * 1024,
        "the heap grew from {before} KiB to {peak} KiB"
    );
    let third: Vec<serde_json::Value> = third
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(third.len(), 1, "{third:?}");
    assert_eq!(third[0]["path"], "/pile/mine");

    let all = trash_entries(&data);
    assert_eq!(
        all.len(),
        FILES + 2,
        "the files, their directory and the third's"
    );
    let id = third[0]["id"].as_u64().expect("an id");
    let purged = common::calm(&["trash", "purge", &id.to_string(), "--server", &sock]);
    assert!(purged.status.success(), "{purged:?}");
    assert_eq!(trash_entries(&data).len(), FILES + 1);
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
}
