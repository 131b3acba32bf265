//! The data plane through real mounts: one set of bytes for every mount of a namespace.
//! Mounts of one server share the object store the namespace names; what one writes and
//! closes, another reads at its next open, and fcntl locks protect read-modify-write across
//! mounts exactly. Each mount lives in a private mount namespace (see `common::Mount`).

mod common;

use common::{Mount, S3, Server};

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// Where a test's namespace keeps its file contents.
enum Backend {
    /// The default: a local directory beside the store.
    File,
    /// The run's S3 server, under a prefix of the test's own.
    S3(S3, String),
}

impl Backend {
    fn s3(test: &str) -> Backend {
        Backend::S3(S3::get(), common::unique_prefix(test))
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            Backend::File => Vec::new(),
            Backend::S3(s3, _) => s3.env.clone(),
        }
    }

    /// A server on a fresh store in `tmp`, and two mounts of it.
    fn two_mounts(&self, tmp: &tempfile::TempDir) -> (Server, Mount, Mount) {
        let data = common::data_dir(tmp);
        let server = match self {
            Backend::File => Server::start(&data),
            Backend::S3(s3, prefix) => {
                Server::start_with_env(&data, &["--objects", &s3.url(prefix)], &s3.env)
            }
        };
        let a = Mount::remote_env(&server.addr, &[], &self.env());
        let b = Mount::remote_env(&server.addr, &[], &self.env());
        (server, a, b)
    }
}

#[test]
fn a_second_mount_reads_what_the_first_wrote_on_a_local_directory() {
    a_second_mount_reads_what_the_first_wrote(Backend::File);
}

#[test]
fn a_second_mount_reads_what_the_first_wrote_on_s3() {
    a_second_mount_reads_what_the_first_wrote(Backend::s3("share"));
}

fn a_second_mount_reads_what_the_first_wrote(backend: Backend) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, a, b) = backend.two_mounts(&tmp);
    a.sh_ok(
        "echo 'hello from A' > f && head -c 9000000 /dev/urandom > big && sha256sum big > ../sum",
    );
    // B opens, reads and keeps its pages of the old contents...
    let sum = a.sh_ok("cat ../sum | cut -d' ' -f1");
    assert_eq!(
        b.sh_ok("cat f; sha256sum big | cut -d' ' -f1"),
        format!("hello from A\n{sum}")
    );
    // ...A overwrites the middle of big and rewrites f; B's next open reads the new bytes.
    a.sh_ok(
        "printf 'XYZ' | dd of=big bs=1 seek=4500000 conv=notrunc status=none
         echo 'second' > f",
    );
    let out = b.sh_ok("cat f; dd if=big bs=1 skip=4500000 count=3 status=none; echo");
    assert_eq!(lines(&out), ["second", "XYZ"], "{out}");
    // Holes, truncate down and up, fallocate, as on a local file system.
    let out = a.sh_ok(
        "truncate -s 100 big && truncate -s 300 big
         printf 'end' | dd of=holes bs=1 seek=70000000 status=none
         fallocate -l 1M fa && fallocate -o 0 -l 4096 -n fa
         printf 'abcdefgh' > p && fallocate -p -o 2 -l 3 p
         sync",
    );
    assert!(out.is_empty(), "{out}");
    // Sizes as an open sees them (close-to-open: stat alone may answer from the kernel's
    // attribute cache for its timeout).
    let out = b.sh_ok(
        "python3 -c \"
import os
for name in ['big', 'holes', 'fa', 'p']:
    fd = os.open(name, os.O_RDONLY)
    print(os.fstat(fd).st_size)
    os.close(fd)
\"
         tail -c 200 big | tr -d '\\0' | wc -c
         dd if=holes bs=1 skip=69999998 count=5 status=none | od -An -c
         od -An -c p",
    );
    let got = lines(&out);
    assert_eq!(&got[..4], ["300", "70000003", "1048576", "8"], "{out}");
    assert_eq!(got[4], "0", "the truncated tail reads as zeros: {out}");
    assert_eq!(
        got[5].split_whitespace().collect::<Vec<_>>(),
        ["\\0", "\\0", "e", "n", "d"],
        "{out}"
    );
    assert_eq!(
        got[6].split_whitespace().collect::<Vec<_>>(),
        ["a", "b", "\\0", "\\0", "\\0", "f", "g", "h"],
        "{out}"
    );
}

#[test]
fn locks_protect_read_modify_write_across_mounts_on_a_local_directory() {
    locks_protect_read_modify_write_across_mounts(Backend::File);
}

#[test]
fn locks_protect_read_modify_write_across_mounts_on_s3() {
    locks_protect_read_modify_write_across_mounts(Backend::s3("locks"));
}

fn locks_protect_read_modify_write_across_mounts(backend: Backend) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, a, b) = backend.two_mounts(&tmp);
    const RECORDS: u32 = 8;
    const ITERATIONS: u32 = 300;
    a.sh_ok(&format!("head -c {} /dev/zero > counters", RECORDS * 8));
    let run = |mount: &Mount, seed: u32| {
        // Bounded: a lost wake-up fails the test instead of hanging the suite.
        std::process::Command::new("timeout")
            .args([
                "120",
                "nsenter",
                "-t",
                &mount.pid().to_string(),
                "-m",
                "--",
                "python3",
            ])
            .arg(format!("{}/increment.py", common::PROGRAMS))
            .arg(mount.mnt.join("counters"))
            .args([
                ITERATIONS.to_string(),
                RECORDS.to_string(),
                seed.to_string(),
            ])
            .output()
            .expect("run increment.py")
    };
    let outputs = std::thread::scope(|scope| {
        let workers: Vec<_> = [(&a, 1), (&a, 2), (&b, 3), (&b, 4)]
            .into_iter()
            .map(|(mount, seed)| scope.spawn(move || run(mount, seed)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect::<Vec<_>>()
    });
    for out in &outputs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sum = "python3 -c \"
import struct
data = open('counters', 'rb').read()
print(sum(struct.unpack('<8Q', data)))
\"";
    let expected = (4 * ITERATIONS).to_string();
    assert_eq!(
        a.sh_ok(sum).trim(),
        expected,
        "an increment was lost (read on A)"
    );
    assert_eq!(
        b.sh_ok(sum).trim(),
        expected,
        "an increment was lost (read on B)"
    );
}

#[test]
fn appends_from_two_mounts_are_all_kept_on_a_local_directory() {
    appends_from_two_mounts_are_all_kept(Backend::File);
}

#[test]
fn appends_from_two_mounts_are_all_kept_on_s3() {
    appends_from_two_mounts_are_all_kept(Backend::s3("append"));
}

fn appends_from_two_mounts_are_all_kept(backend: Backend) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, a, b) = backend.two_mounts(&tmp);
    a.sh_ok("touch log");
    let append = |mount: &Mount, tag: &str| {
        let script = format!(
            "python3 -c \"
import os
fd = os.open('log', os.O_WRONLY | os.O_APPEND)
for i in range(200):
    os.write(fd, b'{tag} %03d\\n' % i)
os.close(fd)
\""
        );
        mount.sh_ok(&script);
    };
    std::thread::scope(|scope| {
        scope.spawn(|| append(&a, "a"));
        scope.spawn(|| append(&b, "b"));
    });
    let out = a.sh_ok("wc -l < log; grep -c '^a ' log; grep -c '^b ' log; stat -c %s log");
    assert_eq!(lines(&out), ["400", "200", "200", "2400"], "{out}");
}

#[test]
fn an_unlinked_file_stays_readable_through_its_open_descriptor() {
    let mount = Mount::embedded(&[]);
    let out = mount.sh_ok(
        "python3 -c \"
import os
fd = os.open('gone', os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b'still here')
os.unlink('gone')
os.pwrite(fd, b'HERE', 6)
print(os.pread(fd, 100, 0).decode(), os.fstat(fd).st_nlink, os.path.exists('gone'))
\"",
    );
    assert_eq!(out, "still HERE 0 False\n");
}

#[test]
fn a_corrupted_object_is_an_error_not_contents_and_other_files_still_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = common::data_dir(&tmp);
    let server = Server::start(&data);
    let mount = Mount::remote(&server.addr, &[]);
    mount.sh_ok("echo 'first file' > one && echo 'second file' > two");
    // Flip a byte of one's only object on disk.
    let objects: Vec<_> = walk(&data.join("objects"));
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

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}
