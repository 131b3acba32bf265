//! What a fault does to file contents: an object corrupted on disk, a mount or the server
//! killed with -9 in the middle of writes, uploads, commits and compactions, an object store
//! that cannot be reached or is full. What fsync covered is always there, the metadata names
//! only whole objects, and what a kill leaves behind is objects no file names, which `calm gc`
//! finds and removes.

use crate::common;

use common::{Mount, Server, calm_json, spawn_in, walk};

/// Mount arguments that keep every write in objects (no inline bytes): for the tests of what
/// happens to objects.
const OBJECTS_ONLY: [&str; 2] = ["--inline-bytes-max", "0"];

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn a_corrupted_object_is_an_error_not_contents_and_other_files_still_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &OBJECTS_ONLY);
    mount.sh_ok("echo 'first file' > one && echo 'second file' > two");
    // Flip a byte of one's only object on disk.
    let objects: Vec<_> = walk(&data.join("objects").join("chunks"));
    assert_eq!(objects.len(), 2, "{objects:?}");
    let victim = objects
        .iter()
        .find(|p| std::fs::read(p).unwrap().ends_with(b"first file\n"))
        .expect("one's object");
    let mut bytes = std::fs::read(victim).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x20;
    std::fs::write(victim, bytes).unwrap();
    let out = mount.sh("cat one");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Input/output error"),
        "{out:?}"
    );
    assert_eq!(mount.sh_ok("cat two"), "second file\n");
}

/// After kill -9 of a mount in the middle of writes and uploads: what fsync covered is there,
/// every object the metadata names is whole, and the only leftovers are objects no file names,
/// which `calm gc` finds and removes.
#[test]
fn a_mount_killed_mid_upload_keeps_what_was_synced_and_leaks_only_what_gc_removes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    let (mut writer, mut lines) = spawn_in(
        &mount,
        "import os, hashlib
os.chdir(os.environ['MNT'])
data = bytes(range(256)) * 12288
fd = os.open('synced', os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, data)
os.fsync(fd)
os.close(fd)
print(hashlib.sha256(data).hexdigest(), flush=True)
fd = os.open('unsynced', os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(400):
    os.write(fd, os.urandom(1 << 20))
    print('wrote', i, flush=True)
",
    );
    let sum = lines.next().expect("a line").expect("read");
    // 24 MiB written past the fsync: blocks uploaded, nothing committed.
    for line in lines.by_ref() {
        if line.expect("read") == "wrote 24" {
            break;
        }
    }
    let mut mount = mount;
    mount.child.kill().expect("kill -9 the mount");
    mount.child.wait().expect("wait");
    let _ = writer.kill();
    let _ = writer.wait();
    let (status, _) = server.terminate();
    assert!(status.success());

    let data_arg = data.to_str().expect("utf-8");
    // A write killed between its staging file and its rename leaves the staging file (made
    // here: the kill above rarely lands in that instant).
    let staging = data.join("objects/chunks/ab/00000000000000ab-0000#9");
    std::fs::create_dir_all(staging.parent().unwrap()).expect("mkdir");
    std::fs::write(&staging, b"half an object").expect("staging file");
    let fsck = calm_json(&["fsck", data_arg, "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
    let gc = calm_json(&["gc", data_arg, "--grace-s", "0", "--json"]);
    assert!(
        gc["leaked"].as_u64().unwrap() >= 4,
        "uploads of the killed write: {gc}"
    );
    assert!(gc["unfinished"].as_u64().unwrap() >= 1, "{gc}");
    assert_eq!(gc["missing"], 0, "{gc}");
    let young = calm_json(&["gc", data_arg, "--json"]);
    assert_eq!(young["unfinished"], 0, "within the grace period: {young}");
    let gc = calm_json(&["gc", data_arg, "--grace-s", "0", "--delete", "--json"]);
    assert_eq!(gc["deleted"], gc["leaked"], "{gc}");
    assert_eq!(gc["unfinished_deleted"], gc["unfinished"], "{gc}");
    assert!(!staging.exists(), "the unfinished write is gone");
    let gc = calm_json(&["gc", data_arg, "--grace-s", "0", "--json"]);
    assert_eq!(gc["leaked"], 0, "{gc}");
    let fsck = calm_json(&["fsck", data_arg, "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "gc removed a named object: {fsck}");

    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    assert_eq!(
        mount.sh_ok("sha256sum synced | cut -d' ' -f1; stat -c %s synced"),
        format!("{sum}\n3145728\n")
    );
}

/// After kill -9 of the server in the middle of commits: every file whose fsync returned is
/// there with its bytes, and the metadata names only whole objects.
#[test]
fn a_server_killed_mid_commit_keeps_every_synced_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.local_addr().expect("addr").port()
    };
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start_with(&data, &["--listen", &listen]);
    let mount = Mount::remote(&server.addr, &[]);
    let (mut writer, lines) = spawn_in(
        &mount,
        "import os
os.chdir(os.environ['MNT'])
for i in range(100000):
    name = 'f%05d' % i
    fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, (name * 2000).encode())
    os.fsync(fd)
    os.close(fd)
    print(name, flush=True)
",
    );
    let mut synced = Vec::new();
    for line in lines {
        synced.push(line.expect("read"));
        if synced.len() == 60 {
            break;
        }
    }
    server.kill9();
    let _ = writer.kill();
    let _ = writer.wait();
    drop(mount);

    let data_arg = data.to_str().expect("utf-8");
    let fsck = calm_json(&["fsck", data_arg, "--objects", "--json"]);
    assert_eq!(fsck["clean"], true, "{fsck}");
    let server = Server::start_with(&data, &["--listen", &listen]);
    let mount = Mount::remote(&server.addr, &[]);
    let check = format!(
        "python3 -c \"
import sys
for name in '{}'.split():
    got = open(name).read()
    if got != name * 2000:
        print('wrong', name, len(got))
print('checked')
\"",
        synced.join(" ")
    );
    assert_eq!(mount.sh_ok(&check), "checked\n");
}

/// An object store that cannot be reached, or that is full: close and fsync answer EIO or
/// ENOSPC, no metadata names an object that was not written whole, and the mount keeps
/// serving everything else.
#[test]
fn an_unreachable_or_full_object_store_is_an_error_at_close_and_loses_nothing_else() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let write_and_close = "python3 -c \"
import os
fd = os.open('f', os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b'x' * 3000000)
try:
    os.fsync(fd)
    print('fsync ok')
except OSError as e:
    print('fsync', e.errno)
try:
    os.close(fd)
    print('close ok')
except OSError as e:
    print('close', e.errno)
print(os.stat('f').st_size)
\"";

    // Nothing listens on port 1.
    let server = Server::start_with(
        &tmp.path().join("unreachable"),
        &["--objects", "s3://bkt?endpoint=http://127.0.0.1:1&region=x"],
    );
    let mount = Mount::remote_env(
        &server.addr,
        &[],
        &[
            ("AWS_ACCESS_KEY_ID".into(), "k".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "s".into()),
        ],
    );
    let out = mount.sh_ok(&format!("{write_and_close}; mkdir d && ls"));
    assert_eq!(lines(&out), ["fsync 5", "close ok", "0", "d", "f"], "{out}");

    // A full local store.
    let objects = tmp.path().join("small");
    let url = format!("file://{}", objects.display());
    let server = Server::start_with(&tmp.path().join("full"), &["--objects", &url]);
    let mount = Mount::remote(&server.addr, &[]);
    let out = mount.sh_ok(&format!(
        "mkdir -p {dir} && mount -t tmpfs -o size=1m calm-test-full {dir}
         {write_and_close}
         mkdir e && ls -d e",
        dir = objects.display()
    ));
    assert_eq!(lines(&out), ["fsync 28", "close ok", "0", "e"], "{out}");
    let data_arg = tmp.path().join("full");
    drop(mount);
    let (status, _) = server.terminate();
    assert!(status.success());
    let fsck = calm_json(&[
        "fsck",
        data_arg.to_str().expect("utf-8"),
        "--objects",
        "--json",
    ]);
    assert_eq!(fsck["clean"], true, "{fsck}");
}

/// The writes of the compaction test: `count` small writes at random places of a 4 MiB file,
/// from `seed` (Python, shared by the writer and the checker).
const SCATTERED_WRITES: &str = "
import os, random
SIZE = 4 << 20
def writes(seed, count):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randrange(1, 200)
        yield rng.randrange(SIZE - n), rng.randbytes(n)
";

/// kill -9 of the server while its compactor writes: a small fsync'd write every few
/// milliseconds into a 4 MiB file makes the compactor merge the file's records into a new
/// object every thousand writes or so, and the server is killed the moment a new object
/// appears in the store (the compaction's, written before its commit). Three times over: fsck
/// is clean after each kill, the file reads as every acknowledged write made it (and perhaps
/// the one in flight), and what the kill left is objects no file names, which `calm gc`
/// removes without touching a named one.
#[test]
fn a_server_killed_mid_compaction_keeps_every_synced_write_and_leaks_only_what_gc_removes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let data_arg = data.to_str().expect("utf-8").to_string();
    let listen = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("127.0.0.1:{}", socket.local_addr().expect("addr").port())
    };
    // (seed, writes the file holds) of every round so far.
    let mut rounds: Vec<(u64, usize)> = Vec::new();
    let mut left_total = 0;
    for round in 0..3u64 {
        let server = Server::start_with(&data, &["--listen", &listen]);
        let mount = Mount::remote(&server.addr, &[]);
        if round == 0 {
            // Sparse: the file's only objects are the compactor's.
            mount.sh_ok("truncate -s 4194304 db");
        }
        let objects_before = object_files(&data);
        let seed = 1000 + round;
        let (mut writer, lines) = spawn_in(
            &mount,
            &format!(
                "{SCATTERED_WRITES}
os.chdir(os.environ['MNT'])
fd = os.open('db', os.O_WRONLY)
for i, (at, piece) in enumerate(writes({seed}, 1000000)):
    os.pwrite(fd, piece, at)
    os.fsync(fd)
    print(i + 1, flush=True)
"
            ),
        );
        let synced = Arc::new(AtomicUsize::new(0));
        let reader = {
            let synced = synced.clone();
            std::thread::spawn(move || {
                for line in lines {
                    let Ok(n) = line.expect("read").parse() else {
                        break;
                    };
                    synced.store(n, Ordering::SeqCst);
                }
            })
        };
        // Looked for without a pause: the compaction's object is written, synced and committed
        // within milliseconds.
        let started = std::time::Instant::now();
        while object_files(&data)
            .iter()
            .all(|path| objects_before.contains(path))
        {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(120),
                "no compaction in 120 s, {} writes",
                synced.load(Ordering::SeqCst)
            );
        }
        server.kill9();
        let _ = writer.kill();
        // The writer's fsync waits for the server; gone with its mount.
        drop(mount);
        let _ = writer.wait();
        reader.join().expect("reader");
        let acknowledged = synced.load(Ordering::SeqCst);

        let fsck = calm_json(&["fsck", &data_arg, "--objects", "--json"]);
        assert_eq!(fsck["clean"], true, "round {round}: {fsck}");
        let gc = calm_json(&["gc", &data_arg, "--grace-s", "0", "--delete", "--json"]);
        assert_eq!(gc["missing"], 0, "round {round}: {gc}");
        assert_eq!(gc["deleted"], gc["leaked"], "round {round}: {gc}");
        assert_eq!(
            gc["unfinished_deleted"], gc["unfinished"],
            "round {round}: {gc}"
        );
        let left = |what: &str| gc[what].as_u64().expect("a count");
        left_total += left("leaked") + left("unfinished");
        let fsck = calm_json(&["fsck", &data_arg, "--objects", "--json"]);
        assert_eq!(fsck["clean"], true, "gc removed a named object: {fsck}");

        // The file holds every acknowledged write of every round, and perhaps the one whose
        // fsync the kill interrupted.
        let server = Server::start_with(&data, &["--listen", &listen]);
        let mount = Mount::remote(&server.addr, &[]);
        let earlier: Vec<String> = rounds.iter().map(|(s, n)| format!("({s}, {n})")).collect();
        let check = format!(
            "python3 -c \"{SCATTERED_WRITES}
def model(rounds):
    m = bytearray(SIZE)
    for seed, count in rounds:
        for at, piece in writes(seed, count):
            m[at:at + len(piece)] = piece
    return m
got = open('db', 'rb').read()
earlier = [{}]
for n in ({acknowledged}, {acknowledged} + 1):
    if got == model(earlier + [({seed}, n)]):
        print('holds', n)
        break
else:
    print('differs from writes', {acknowledged}, 'and', {acknowledged} + 1)
\"",
            earlier.join(", ")
        );
        let out = mount.sh_ok(&check);
        let held: usize = out
            .strip_prefix("holds ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("round {round}: {out}"));
        rounds.push((seed, held));
        eprintln!(
            "round {round}: killed after {acknowledged} acknowledged writes, the file holds \
             {held}; gc removed {} whole objects and {} unfinished ones the kill left",
            gc["leaked"], gc["unfinished"]
        );
    }
    // Each kill lands within a millisecond or two of a compaction's first byte; that all three
    // came after its commit would mean the test no longer kills what it says it does.
    assert!(
        left_total > 0,
        "no kill landed before a compaction's commit"
    );
}

/// Files in the object store of data directory `data` (objects, and writes not yet renamed
/// into place; not its owner's name).
fn object_files(data: &std::path::Path) -> std::collections::HashSet<std::path::PathBuf> {
    let objects = data.join("objects").join("chunks");
    if objects.exists() {
        walk(&objects).into_iter().collect()
    } else {
        Default::default()
    }
}
