//! Nothing lost with the metadata: a server's dump while it serves, a new store loaded from it,
//! and the automatic backups in the object store bringing back every file after the metadata
//! directory is gone, on a local object store and on S3; a cut dump and a stopped load refused.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Backend, Mount, Server, calm_json_env, python_in};

const PROGRAM_SECONDS_MAX: u32 = 600;

fn tree(mount: &Mount, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = python_in(mount, PROGRAM_SECONDS_MAX, "tree.py", &args);
    assert!(
        out.status.success(),
        "tree.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn mnt(mount: &Mount) -> &str {
    mount.mnt.to_str().expect("utf-8")
}

fn socket(data: &Path) -> String {
    format!("unix:{}", data.join("calm.sock").display())
}

fn calm_env(args: &[&str], env: &[(String, String)]) -> std::process::Output {
    std::process::Command::new(common::CALM)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run calm")
}

/// Where the test keeps the file contents: outside the metadata directory, which it loses.
fn objects_url(backend: &Backend, tmp: &tempfile::TempDir) -> String {
    match backend {
        Backend::File => format!("file://{}", tmp.path().join("objects").display()),
        Backend::S3(s3, prefix) => s3.url(prefix),
    }
}

fn backups(url: &str, env: &[(String, String)]) -> Vec<String> {
    let listed = calm_json_env(&["backups", url, "--json"], env);
    listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|b| b["name"].as_str().expect("a name").to_string())
        .collect()
}

/// A populated namespace whose server writes a backup every 1.8 s (keeping three); the
/// metadata directory is lost with the server (kill -9); `calm load --from-backups` makes a
/// new one from the newest backup, and a mount of it holds every file, byte for byte, with its
/// attributes; fsck with the objects is clean, and the namespace goes on.
fn a_lost_metadata_directory_comes_back_from_the_newest_backup(backend: Backend) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let env = backend.env();
    let url = objects_url(&backend, &tmp);
    let data = tmp.path().join("metadata");
    // What a server killed during a backup leaves: removed by the next start's backups.
    std::fs::create_dir_all(&data).unwrap();
    let stale = data.join(".metadata-2020-01-01T00-00-00Z.calmdump.partial");
    std::fs::write(&stale, b"half a dump").unwrap();
    let server = Server::start_with_env(
        &data,
        &[
            "--objects",
            &url,
            "--backup-every-hours",
            "0.0005",
            "--backup-keep",
            "3",
        ],
        &env,
    );
    let mount = Mount::remote_env(&server.addr, &[], &env);
    assert_eq!(
        tree(&mount, &["make", mnt(&mount), "7", "300"]).trim(),
        "made 348"
    );
    let described = tree(&mount, &["describe", mnt(&mount)]);
    assert_eq!(described.lines().count(), 348);
    // A backup begun after the tree was made (names are their UTC start time, to the second).
    let made = std::time::SystemTime::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    let newest = loop {
        let names = backups(&url, &env);
        assert!(names.len() <= 3, "at most three kept: {names:?}");
        if let Some(name) = names.last()
            && calm_upkeep::backup::backup_name(
                made.duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as i64
                    + 1_000_000_000,
            ) <= *name
        {
            break name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no backup after the tree: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let status = calm_json_env(&["status", "--server", &socket(&data), "--json"], &env);
    assert!(status["backups_made"].as_u64().unwrap() >= 1, "{status}");
    assert_eq!(status["backups_failed"], 0, "{status}");
    assert_eq!(status["backup_every_s"], 1, "{status}");
    assert!(!stale.exists(), "a killed backup's staging file stays");
    drop(mount);
    server.kill9();
    std::fs::remove_dir_all(&data).expect("lose the metadata");

    let restored = tmp.path().join("restored");
    let restored_s = restored.to_str().expect("utf-8");
    let loaded = calm_json_env(
        &[
            "load",
            "--from-backups",
            &url,
            "--take-over-objects",
            "--data",
            restored_s,
            "--json",
        ],
        &env,
    );
    // The root, 6 directories, 300 files and 24 symlinks (the hard links are names).
    assert_eq!(loaded["inodes"], 331, "{loaded} from {newest}");
    let server = Server::start_with_env(&restored, &[], &env);
    let mount = Mount::remote_env(&server.addr, &[], &env);
    assert_eq!(tree(&mount, &["describe", mnt(&mount)]), described);
    // The namespace goes on: new files beside the old ones.
    mount.sh_ok("echo after > after && cat d0/../after");
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let fsck = calm_json_env(&["fsck", restored_s, "--objects", "--json"], &env);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

on_each_store!(
    a_lost_metadata_directory_comes_back_from_the_newest_backup():
    a_lost_metadata_directory_comes_back_from_the_newest_backup_on_a_local_directory,
    a_lost_metadata_directory_comes_back_from_the_newest_backup_on_s3,
    "backups"
);

/// A dump taken while files are being made is of one moment: it loads into a store that
/// fsck calls clean and that holds every file the dump counts. A cut copy of it is refused and
/// leaves the new store empty, so the whole one then loads there.
#[test]
fn a_dump_taken_while_files_are_made_is_of_one_moment() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let writer = std::thread::scope(|scope| {
        let writer = scope.spawn(|| tree(&mount, &["make", mnt(&mount), "3", "1500"]));
        let mut dumps = Vec::new();
        for i in 0..5 {
            std::thread::sleep(Duration::from_millis(400));
            let file = tmp.path().join(format!("during-{i}.calmdump"));
            let dumped = common::calm_json(&[
                "dump",
                file.to_str().unwrap(),
                "--server",
                &socket(&data),
                "--json",
            ]);
            dumps.push((file, dumped));
        }
        (writer.join().expect("writer"), dumps)
    });
    let (made, dumps) = writer;
    assert!(made.starts_with("made"));
    let mut inodes = Vec::new();
    for (i, (file, dumped)) in dumps.iter().enumerate() {
        let into = tmp.path().join(format!("loaded-{i}"));
        let objects = format!(
            "file://{}",
            tmp.path().join(format!("objects-{i}")).display()
        );
        let into = into.to_str().unwrap();
        let loaded = common::calm_json(&[
            "load",
            file.to_str().unwrap(),
            "--objects",
            &objects,
            "--data",
            into,
            "--json",
        ]);
        assert_eq!(loaded["inodes"], dumped["inodes"]);
        let fsck = common::calm_json(&["fsck", into, "--json"]);
        assert_eq!(fsck["clean"], true, "dump {i}: {fsck}");
        assert_eq!(fsck["inodes"], dumped["inodes"], "dump {i}");
        inodes.push(dumped["inodes"].as_u64().unwrap());
    }
    assert!(
        inodes.windows(2).any(|w| w[0] < w[1]),
        "the dumps saw files being made: {inodes:?}"
    );

    // A copy cut short (a dump stopped half-way) is refused, and the store stays empty.
    let (whole, _) = &dumps[4];
    let bytes = std::fs::read(whole).unwrap();
    let into = tmp.path().join("after-cut");
    let into_s = into.to_str().unwrap();
    let objects = format!("file://{}", tmp.path().join("after-cut-objects").display());
    for cut in [10, bytes.len() / 3, bytes.len() - 5] {
        let file = tmp.path().join("cut.calmdump");
        std::fs::write(&file, &bytes[..cut]).unwrap();
        let out = common::calm(&[
            "load",
            file.to_str().unwrap(),
            "--objects",
            &objects,
            "--data",
            into_s,
        ]);
        assert!(!out.status.success(), "a cut dump loaded");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("incomplete") || said.contains("not a calm dump"),
            "{said}"
        );
    }
    let loaded = common::calm_json(&[
        "load",
        whole.to_str().unwrap(),
        "--objects",
        &objects,
        "--data",
        into_s,
        "--json",
    ]);
    assert!(loaded["inodes"].as_u64().unwrap() > 0);
    // And a second load into it is refused: load never writes over a store.
    let again_objects = format!("file://{}", tmp.path().join("again-objects").display());
    let again = common::calm(&[
        "load",
        whole.to_str().unwrap(),
        "--objects",
        &again_objects,
        "--data",
        into_s,
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
}

/// `calm load` killed at moments through its work: each store is then either whole (fsck
/// clean, a server serves it) or refused by a server and by another load, never a namespace
/// that looks whole and is not.
#[test]
fn a_load_killed_leaves_a_whole_store_or_one_that_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    tree(&mount, &["make", mnt(&mount), "5", "3000"]);
    let file = tmp.path().join("full.calmdump");
    common::calm_json(&[
        "dump",
        file.to_str().unwrap(),
        "--server",
        &socket(&data),
        "--json",
    ]);
    drop(mount);
    server.terminate();
    let (mut whole, mut empty, mut refused) = (0, 0, 0);
    for (i, delay_ms) in [5u64, 20, 40, 80, 160, 320, 2000].into_iter().enumerate() {
        let into = tmp.path().join(format!("killed-{i}"));
        let into_s = into.to_str().unwrap();
        let objects = format!("file://{}-objects", into.display());
        let mut child = std::process::Command::new(common::CALM)
            .args(["load", file.to_str().unwrap(), "--objects", &objects])
            .args(["--data", into_s])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("calm load");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if !into.join("data.mdb").exists() {
            continue; // killed before it made the store
        }
        let fsck = calm_env(&["fsck", into_s, "--json"], &[]);
        if fsck.status.success() {
            whole += 1;
            let (status, rest) = Server::start(&into).terminate();
            assert!(status.success(), "{rest}");
            continue;
        }
        assert!(
            !status.success(),
            "a load that ended well left a damaged store"
        );
        // Killed before it wrote anything: the store is empty, and a load makes it whole.
        let again_objects = format!("file://{}-again-objects", into.display());
        let again = calm_env(
            &[
                "load",
                file.to_str().unwrap(),
                "--objects",
                &again_objects,
                "--data",
                into_s,
            ],
            &[],
        );
        if again.status.success() {
            empty += 1;
            let fsck = calm_json_env(&["fsck", into_s, "--json"], &[]);
            assert_eq!(fsck["clean"], true, "{fsck}");
            continue;
        }
        refused += 1;
        let said = String::from_utf8_lossy(&again.stderr);
        assert!(said.contains("not empty"), "{said}");
        let serve = calm_env(&["fsck", into_s], &[]);
        let said = String::from_utf8_lossy(&serve.stdout).to_string()
            + &String::from_utf8_lossy(&serve.stderr);
        assert!(
            !serve.status.success(),
            "fsck called a half-loaded store clean"
        );
        // A server refuses it too (bounded: one that opened it would serve for ever).
        let serve = std::process::Command::new("timeout")
            .args(["20", common::CALM, "serve", "--data", into_s])
            .output()
            .expect("calm serve");
        assert!(
            !serve.status.success(),
            "a server opened a half-loaded store: {said}"
        );
        let said = String::from_utf8_lossy(&serve.stderr);
        assert!(said.contains("no calm superblock"), "{said}");
    }
    assert!(whole > 0, "the longest wait lets a load finish");
    eprintln!("{whole} whole, {empty} empty, {refused} refused");
}

/// A namespace served from a local directory, dumped while it runs and loaded onto etcd:
/// servers of the etcd store serve every file byte for byte, fsck of both the etcd store and
/// its objects is clean, and a dump of the etcd store (read at one revision while its server
/// runs) loads back into a directory that holds the same tree.
#[test]
fn a_namespace_moves_onto_etcd_and_back_by_dump_and_load() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let objects = format!("file://{}", tmp.path().join("objects").display());
    let server = Server::start_with(&data, &["--objects", &objects]);
    let mount = Mount::remote(&server.addr, &[]);
    tree(&mount, &["make", mnt(&mount), "11", "400"]);
    let described = tree(&mount, &["describe", mnt(&mount)]);
    let file = tmp.path().join("local.calmdump");
    let file_s = file.to_str().unwrap();
    common::calm_json(&["dump", file_s, "--server", &socket(&data), "--json"]);
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");

    let mut private = None;
    let url = common::etcd_url("protect-move", &mut private);
    // A move: the namespace dumped is not served again, its object store goes with it.
    let loaded = common::calm_json(&[
        "load",
        file_s,
        "--take-over-objects",
        "--store",
        &url,
        "--json",
    ]);
    // The root, 8 directories, 400 files and 31 symlinks.
    assert_eq!(loaded["inodes"], 440, "{loaded}");
    let server = Server::start_with(&tmp.path().join("etcd-server"), &["--store", &url]);
    let mount = Mount::remote(&server.addr, &[]);
    assert_eq!(tree(&mount, &["describe", mnt(&mount)]), described);
    let fsck = common::calm_json(&["fsck", "--store", &url, "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");

    // Back into a directory, dumped from etcd while its server runs.
    let back = tmp.path().join("back.calmdump");
    common::calm_json(&["dump", back.to_str().unwrap(), "--store", &url, "--json"]);
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let again = tmp.path().join("again");
    common::calm_json(&[
        "load",
        back.to_str().unwrap(),
        "--take-over-objects",
        "--data",
        again.to_str().unwrap(),
        "--json",
    ]);
    let server = Server::start(&again);
    let mount = Mount::remote(&server.addr, &[]);
    assert_eq!(tree(&mount, &["describe", mnt(&mount)]), described);
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let fsck = common::calm_json(&["fsck", again.to_str().unwrap(), "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// `calm gc --server` while a writer uploads and names objects, with no grace at all (every
/// upload not yet named is a candidate): planted objects no file names are deleted, and no
/// object a file names ever is — a write whose upload was marked collected before its commit is
/// refused (ESTALE) instead, and every write that succeeded reads back whole from another mount;
/// fsck --objects is clean at the end.
#[test]
fn gc_while_serving_never_deletes_what_a_commit_names() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let writer_mount = Mount::remote(&server.addr, &[]);
    // Objects no file names: copies of a real object under ids nothing names.
    writer_mount.sh_ok("head -c 300000 /dev/urandom > seed && sync");
    let chunks = data.join("objects").join("chunks");
    let real = common::walk(&chunks)
        .into_iter()
        .next()
        .expect("the seed's object");
    let planted: Vec<_> = (0..20u64)
        .map(|i| {
            let id = (1u64 << 40) + i;
            let dir = chunks.join(format!("{:02x}", id & 0xff));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{id:016x}-0000"));
            std::fs::copy(&real, &path).unwrap();
            path
        })
        .collect();

    let (written, collections) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let args: Vec<String> = [mnt(&writer_mount), "300", "150000"]
                .iter()
                .map(|a| a.to_string())
                .collect();
            let out = python_in(&writer_mount, PROGRAM_SECONDS_MAX, "gc_writer.py", &args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        });
        let mut collections = Vec::new();
        while !writer.is_finished() {
            collections.push(common::calm_json(&[
                "gc",
                "--server",
                &socket(&data),
                "--grace-s",
                "0",
                "--delete",
                "--json",
            ]));
        }
        (writer.join().unwrap(), collections)
    });
    assert!(collections.len() >= 2, "gc ran while the writer wrote");
    assert!(
        planted.iter().all(|p| !p.exists()),
        "the planted objects are deleted"
    );
    let deleted: u64 = collections
        .iter()
        .map(|c| c["deleted"].as_u64().unwrap())
        .sum();
    assert!(deleted >= 20, "{collections:?}");

    // Every write that succeeded reads back whole through another mount.
    let reader = Mount::remote(&server.addr, &[]);
    let (mut ok, mut refused) = (0, 0);
    for line in written.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[..] {
            ["ok", name, sha] => {
                let got = reader.sh_ok(&format!("sha256sum {name} | cut -d' ' -f1"));
                assert_eq!(got.trim(), sha, "{name}");
                ok += 1;
            }
            ["err", _, errno] => {
                assert_eq!(errno, "116", "{line}: only ESTALE, a collected upload");
                refused += 1;
            }
            _ => panic!("{line}"),
        }
    }
    assert_eq!(ok + refused, 300);
    assert!(ok > 0);
    eprintln!("{ok} writes kept, {refused} refused, {deleted} objects deleted");
    drop(reader);
    drop(writer_mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let data_s = data.to_str().unwrap();
    let fsck = common::calm_json(&["fsck", data_s, "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// An upload collected by an online gc before the fsync that would commit it: the fsync
/// answers ESTALE (the bytes are gone), as every refusal of a collected upload does, never EIO,
/// and the file keeps what it had.
#[test]
fn an_upload_collected_before_its_fsync_is_estale() {
    use std::io::Write;
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    // Open, 8 MiB written (whole blocks, uploaded while the file is open, named by no commit
    // yet), then at a word on its standard input an fsync, whose errno it prints.
    let program = r#"
import os, sys
fd = os.open(os.path.join(os.environ["MNT"], "big"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, os.urandom(8 << 20))
print("written", flush=True)
sys.stdin.readline()
try:
    os.fsync(fd)
    print("fsync 0", flush=True)
except OSError as e:
    print(f"fsync {e.errno}", flush=True)
try:
    os.close(fd)
except OSError:
    pass
"#;
    let (mut child, mut lines) = common::spawn_in(&mount, program);
    assert_eq!(lines.next().unwrap().unwrap(), "written");
    // Its blocks reach the object store while it stays open.
    // (The directory itself comes with the first upload.)
    let chunks = data.join("objects").join("chunks");
    let uploads = || match chunks.is_dir() {
        true => common::walk(&chunks).len(),
        false => 0,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while uploads() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let uploaded = uploads();
    assert!(uploaded >= 2, "{uploaded} objects uploaded");
    let collected = common::calm_json(&[
        "gc",
        "--server",
        &socket(&data),
        "--grace-s",
        "0",
        "--delete",
        "--json",
    ]);
    assert!(collected["deleted"].as_u64().unwrap() >= 2, "{collected}");
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "fsync 116",
        "ESTALE, not EIO"
    );
    drop(child.stdin.take());
    child.wait().unwrap();
    assert_eq!(mount.sh_ok("stat -c %s big").trim(), "0");
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let fsck = common::calm_json(&["fsck", data.to_str().unwrap(), "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// A user who is not an administrator can neither dump the namespace (every user's names) nor
/// collect objects through the server's socket: both refused as such, nothing deleted.
#[test]
fn only_an_administrator_dumps_or_collects() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok("echo secret > private && chmod 600 private && sync");
    // An object nothing names (gc goes by names and ages, not contents).
    let chunks = data.join("objects").join("chunks");
    let planted = chunks
        .join("ff")
        .join(format!("{:016x}-0000", (1u64 << 40) + 0xff));
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::fs::write(&planted, b"unnamed").unwrap();
    let out_dir = tmp.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    std::process::Command::new("chmod")
        .args(["777", out_dir.to_str().unwrap()])
        .status()
        .unwrap();
    let dump = out_dir.join("theirs.calmdump");
    let as_user = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                common::CALM,
            ])
            .args(args)
            .output()
            .expect("setpriv")
    };
    let socket = socket(&data);
    let refused = as_user(&["dump", dump.to_str().unwrap(), "--server", &socket]);
    assert!(!refused.status.success(), "a user dumped the namespace");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("needs an administrator"), "{said}");
    assert!(!dump.exists(), "a refused dump left its file");
    let refused = as_user(&["gc", "--server", &socket, "--grace-s", "0", "--delete"]);
    assert!(!refused.status.success(), "a user collected objects");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("needs an administrator"), "{said}");
    assert!(planted.exists(), "a refused gc deleted an object");
    // The administrator (root on the socket) may.
    let gc = common::calm_json(&[
        "gc",
        "--server",
        &socket,
        "--grace-s",
        "0",
        "--delete",
        "--json",
    ]);
    assert_eq!(gc["deleted"], 1, "{gc}");
    assert!(!planted.exists());
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
}

/// Runs `program` with `args` as the unprivileged user.
fn as_user(program: &str, args: &[&str]) -> std::process::Output {
    let id = common::UNPRIVILEGED_UID.to_string();
    std::process::Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", program])
        .args(args)
        .output()
        .expect("setpriv")
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A directory every user may write in (sticky, as /tmp), under `tmp` (made passable).
fn shared_dir(tmp: &Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o711)).unwrap();
    let dir = tmp.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// The files calm writes for an administrator (a dump, a CA, certificates and their keys) in
/// a directory every user can write: a user who planted links and files at every name calm
/// writes there (the file's, `FILE.partial`) gets nothing written through them, cannot read
/// what calm wrote, and a dump that fails leaves nothing.
#[test]
fn files_for_the_administrator_are_private_and_never_written_through_a_planted_name() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok("echo the-secret-of-a-0600-file > private && chmod 600 private && sync");
    let out = shared_dir(tmp.path(), "out");
    // Root's own file, which a link planted by the user points at.
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"root's own").unwrap();
    let at = |name: &str| out.join(name).to_str().unwrap().to_string();
    let victim_path = victim.to_str().unwrap();
    // (A planted `ca-key.pem` makes `calm certs init` refuse: "already holds a CA".)
    for link in [
        "dump.partial",
        "dump.calmdump.partial",
        "ca.pem",
        "admin.pem",
        "admin-key.pem",
    ] {
        let planted = as_user("ln", &["-s", victim_path, &at(link)]);
        assert!(planted.status.success(), "{planted:?}");
    }
    let planted = as_user(
        "sh",
        &[
            "-c",
            &format!("echo planted > {0}; chmod 666 {0}", at("dump")),
        ],
    );
    assert!(planted.status.success(), "{planted:?}");
    let planted_names = names_in(&out);

    let socket = socket(&data);
    let dumped = calm_env(&["dump", &at("dump"), "--server", &socket], &[]);
    assert!(dumped.status.success(), "{dumped:?}");
    let made = std::fs::symlink_metadata(out.join("dump")).unwrap();
    assert!(made.is_file(), "the dump is a file of its own");
    assert_eq!((made.uid(), made.mode() & 0o7777), (0, 0o600));
    let bytes = std::fs::read(out.join("dump")).unwrap();
    assert!(
        bytes
            .windows(b"the-secret".len())
            .any(|w| w == b"the-secret"),
        "the dump holds the inline contents (which is why it is private)"
    );
    let read = as_user("cat", &[&at("dump")]);
    assert!(!read.status.success(), "the user read the dump");
    assert!(!String::from_utf8_lossy(&read.stdout).contains("the-secret"));

    // A dump that fails (no server there) leaves nothing.
    let failed = calm_env(
        &[
            "dump",
            &at("failed"),
            "--server",
            "unix:/nonexistent/calm.sock",
        ],
        &[],
    );
    assert!(!failed.status.success());
    // A CA and an administrator's certificate in the same directory.
    let dir = out.to_str().unwrap();
    let ca = calm_env(&["certs", "init", "--dir", dir], &[]);
    assert!(ca.status.success(), "{ca:?}");
    let issued = calm_env(&["certs", "issue", "admin", "--dir", dir], &[]);
    assert!(issued.status.success(), "{issued:?}");
    for (name, mode) in [
        ("ca-key.pem", 0o600),
        ("admin-key.pem", 0o600),
        ("ca.pem", 0o644),
        ("admin.pem", 0o644),
    ] {
        let made = std::fs::symlink_metadata(out.join(name)).unwrap();
        assert!(made.is_file(), "{name} is a file of its own");
        assert_eq!((made.uid(), made.mode() & 0o777), (0, mode), "{name}");
    }
    let read = as_user("cat", &[&at("admin-key.pem")]);
    assert!(!read.status.success(), "the user read a key");

    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"root's own",
        "written through a link"
    );
    let mut expected: Vec<String> = planted_names
        .into_iter()
        .filter(|n| !n.ends_with(".pem"))
        .chain(["ca-key.pem", "admin-key.pem", "ca.pem", "admin.pem"].map(String::from))
        .collect();
    expected.sort();
    assert_eq!(names_in(&out), expected, "nothing else left behind");
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
}

/// `calm load` of a dump that is missing, cut or not a dump, and `calm backups` or
/// `calm load --from-backups` of a local object store that is not there, fail with what is
/// wrong and make nothing: no empty store, no directory.
#[test]
fn a_load_or_a_listing_of_nothing_is_an_error_and_makes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let new = tmp.path().join("new");
    let garbage = tmp.path().join("garbage.calmdump");
    std::fs::write(&garbage, b"CALMDUMP but not one").unwrap();
    let missing = tmp.path().join("missing.calmdump");
    for dump in [&missing, &garbage] {
        let out = calm_env(
            &[
                "load",
                dump.to_str().unwrap(),
                "--take-over-objects",
                "--data",
                new.to_str().unwrap(),
            ],
            &[],
        );
        assert!(!out.status.success(), "{out:?}");
        assert!(
            !new.exists(),
            "a failed load of {} made a store",
            dump.display()
        );
    }
    let nowhere = tmp.path().join("nowhere");
    let url = format!("file://{}", nowhere.display());
    let listed = calm_env(&["backups", &url], &[]);
    assert!(!listed.status.success(), "{listed:?}");
    assert!(
        String::from_utf8_lossy(&listed.stderr).contains("is not a directory"),
        "{listed:?}"
    );
    let loaded = calm_env(
        &[
            "load",
            "--from-backups",
            &url,
            "--take-over-objects",
            "--data",
            new.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!loaded.status.success(), "{loaded:?}");
    assert!(
        !nowhere.exists() && !new.exists(),
        "made by a failed command"
    );
}

/// The object files under a local object store's `chunks/`.
fn objects_in(dir: &Path) -> usize {
    fn count(dir: &Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => count(&e.path()),
                    _ => 1,
                })
                .sum()
        })
    }
    count(&dir.join("chunks"))
}

/// A dump loaded beside the live namespace it was taken from never deletes what the original
/// reads: `calm load` wants a choice (and makes nothing without one), refuses the original's
/// object store as the copy's own, copies the objects into a store of its own; every file
/// removed through the copy's server (trash off, deletions at once) is deleted from the copy's
/// store only, and the original reads every file whole. A take-over for a lost original then
/// leaves the original's servers unable to delete, or to start again.
#[test]
fn a_loaded_copy_never_deletes_what_the_original_reads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let quick = ["--trash-hours", "0", "--delete-delay-s", "0"];
    let server = Server::start_with(&data, &quick);
    let mount = Mount::remote(&server.addr, &[]);
    let sums = tmp.path().join("sums");
    // Files larger than what is kept inline: their bytes are objects.
    mount.sh_ok(&format!(
        "mkdir d && for i in $(seq 1 40); do head -c $((70000 + i * 3001)) /dev/urandom > d/f$i; \
         done && echo small > d/small && sha256sum d/* > {}",
        sums.display()
    ));
    let original_objects = data.join("objects");
    let held = objects_in(&original_objects);
    assert!(held >= 40, "{held} objects");
    let file = tmp.path().join("live.calmdump");
    let file_s = file.to_str().unwrap();
    common::calm_json(&["dump", file_s, "--server", &socket(&data), "--json"]);

    let copy = tmp.path().join("copy");
    let copy_s = copy.to_str().unwrap();
    let unsaid = calm_env(&["load", file_s, "--data", copy_s], &[]);
    assert!(!unsaid.status.success(), "{unsaid:?}");
    let said = String::from_utf8_lossy(&unsaid.stderr);
    assert!(
        said.contains("--objects") && said.contains("--take-over-objects"),
        "{said}"
    );
    let theirs = format!("file://{}", original_objects.display());
    let shared = calm_env(
        &["load", file_s, "--objects", &theirs, "--data", copy_s],
        &[],
    );
    assert!(!shared.status.success(), "{shared:?}");
    let said = String::from_utf8_lossy(&shared.stderr);
    assert!(said.contains("another namespace's files"), "{said}");
    assert!(!copy.exists(), "a refused load made a store");

    let copy_objects = tmp.path().join("copy-objects");
    let own = format!("file://{}", copy_objects.display());
    common::calm_json(&[
        "load",
        file_s,
        "--objects",
        &own,
        "--data",
        copy_s,
        "--json",
    ]);
    assert_eq!(objects_in(&copy_objects), held, "every object copied");
    let copied = Server::start_with(&copy, &quick);
    let copy_mount = Mount::remote(&copied.addr, &[]);
    copy_mount.sh_ok(&format!("sha256sum -c --quiet {}", sums.display()));
    copy_mount.sh_ok("rm -rf d && test -z \"$(ls)\"");
    let deadline = Instant::now() + Duration::from_secs(60);
    while objects_in(&copy_objects) > 0 {
        assert!(Instant::now() < deadline, "the copy's deletions never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(copy_mount);
    let (status, rest) = copied.terminate();
    assert!(status.success(), "{rest}");
    assert_eq!(objects_in(&original_objects), held);
    let fresh = Mount::remote(&server.addr, &[]);
    fresh.sh_ok(&format!("sha256sum -c --quiet {}", sums.display()));
    drop(fresh);

    // The original lost for good (here, still running): a take-over fences it.
    let restored = tmp.path().join("restored");
    let restored_s = restored.to_str().unwrap();
    common::calm_json(&[
        "load",
        file_s,
        "--take-over-objects",
        "--data",
        restored_s,
        "--json",
    ]);
    mount.sh_ok("rm d/f1 d/f2");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        objects_in(&original_objects),
        held,
        "a fenced server deleted"
    );
    drop(mount);
    let (status, rest) = server.terminate();
    assert!(status.success(), "{rest}");
    let again = std::process::Command::new("timeout")
        .args([
            "20",
            common::CALM,
            "serve",
            "--data",
            data.to_str().unwrap(),
        ])
        .output()
        .expect("calm serve");
    assert!(
        !again.status.success(),
        "the original started on a store taken over"
    );
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("belongs to another namespace"), "{said}");
    let served = Server::start(&restored);
    let mount = Mount::remote(&served.addr, &[]);
    mount.sh_ok(&format!("sha256sum -c --quiet {}", sums.display()));
    drop(mount);
    let (status, rest) = served.terminate();
    assert!(status.success(), "{rest}");
    let fsck = calm_json_env(&["fsck", restored_s, "--objects", "--json"], &[]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}
