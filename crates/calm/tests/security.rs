//! Who may do what: an unprivileged user against root's files (through the Unix socket,
//! through plain TCP, through an --allow-other mount), TLS clients with good and bad
//! certificates, the data directory's modes, and a store whose file system fills up.

mod common;

use std::path::Path;
use std::process::Command;

use common::{CALM, Mount, PROGRAMS, calm};

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// A local user made for one test (`useradd`), removed when dropped. Users left by a test
/// that was killed (their name carries the test's pid) are removed by the next one.
struct LocalUser {
    name: String,
    uid: u32,
    gid: u32,
}

const USER_PREFIX: &str = "calmt";

impl LocalUser {
    fn create(tag: &str) -> LocalUser {
        let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
        for name in passwd.lines().filter_map(|l| l.split(':').next()) {
            let Some(pid) = name
                .strip_prefix(USER_PREFIX)
                .and_then(|rest| rest.split('x').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("userdel").arg(name).output();
            }
        }
        let name = format!("{USER_PREFIX}{}x{tag}", std::process::id());
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/usr/sbin/nologin", &name])
            .output()
            .expect("useradd");
        assert!(
            out.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().expect("id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("a number")
        };
        let (uid, gid) = (id("-u"), id("-g"));
        LocalUser { name, uid, gid }
    }
}

impl Drop for LocalUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// Everything a user could see of the tree through the mount, as root: names, modes, owners,
/// sizes, times, contents and extended attributes.
fn tree_state(mount: &Mount) -> String {
    mount.sh_ok(
        r#"find . -printf '%p %m %u %g %s %T@ %C@\n' | sort
        find . -type f -print0 | sort -z | xargs -0 sha256sum
        python3 -c 'import os
for top, dirs, files in sorted(os.walk(".")):
    for n in sorted(dirs + files):
        p = os.path.join(top, n)
        print(p, sorted((k, os.getxattr(p, k)) for k in os.listxattr(p)))'"#,
    )
}

/// An attempt's outcome as [`attempts_of_an_unprivileged_client`] prints it.
fn outcome<T: std::fmt::Debug>(
    result: Result<T, impl std::fmt::Display>,
) -> Result<String, String> {
    result
        .map(|done| format!("{done:?}"))
        .map_err(|e| e.to_string())
}

/// The attempts of an unprivileged user, run by the test below as that user: one line per
/// attempt, `NAME ok` or `NAME refused (WHY)`.
#[test]
#[ignore = "run as another user by an_unprivileged_user_is_refused_everywhere"]
fn attempts_of_an_unprivileged_client() {
    let Ok(server) = std::env::var("CALM_ATTEMPT_SERVER") else {
        return;
    };
    let session: u64 = std::env::var("CALM_ATTEMPT_SESSION")
        .expect("session")
        .parse()
        .expect("a number");
    // The holder's owner: `pid:N` (a process's record locks) or `file:N` (an open file's).
    let holder = std::env::var("CALM_ATTEMPT_HOLDER").expect("holder");
    let holder = match holder.split_once(':') {
        Some(("pid", pid)) => calm_locks::Owner::Process {
            pid: pid.parse().expect("a pid"),
        },
        Some(("file", file)) => calm_locks::Owner::File {
            file: file.parse().expect("a file"),
        },
        _ => panic!("holder {holder:?}"),
    };
    let reader: u32 = std::env::var("CALM_ATTEMPT_READER")
        .expect("reader")
        .parse()
        .expect("a number");
    use calm_meta::{Caller, Groups, ROOT, SetAttr, SetTime};
    use calm_proto::locks::LockCall;
    let runtime = common::runtime();
    runtime.block_on(async {
        let client = match calm_client::Client::connect(&server).await {
            Ok(client) => client,
            Err(e) => {
                println!("attempt connect refused ({e})");
                return;
            }
        };
        let say = |name: &str, result: Result<String, String>| match result {
            Ok(what) => println!("attempt {name} ok {what}"),
            Err(why) => println!("attempt {name} refused ({why})"),
        };
        let root_txt = match client.lookup(ROOT, b"root.txt").await {
            Ok(attr) => attr.handle,
            Err(e) => {
                // Over a refused connection even a lookup fails: that is the answer.
                println!("attempt lookup refused ({e})");
                return;
            }
        };
        let secret = client.lookup(ROOT, b"secret").await.expect("secret").handle;
        let sticky = client.lookup(ROOT, b"sticky").await.expect("sticky").handle;
        say(
            "lookup-in-0700-dir",
            outcome(client.lookup(secret, b"file").await),
        );
        say(
            "readdir-0700-dir",
            outcome(client.readdir(secret, 0, 100).await),
        );
        say(
            "read-map-of-0600-file",
            outcome(client.read_map(root_txt).await),
        );
        say(
            "append-to-0600-file",
            outcome(client.append(root_txt, 77, 4).await),
        );
        let changes = [
            (
                "truncate",
                SetAttr {
                    size: Some(0),
                    ..Default::default()
                },
            ),
            (
                "chmod",
                SetAttr {
                    mode: Some(0o777),
                    ..Default::default()
                },
            ),
            (
                "chown",
                SetAttr {
                    uid: Some(std::process::id()),
                    ..Default::default()
                },
            ),
            (
                "set-times",
                SetAttr {
                    mtime: Some(SetTime::At(0)),
                    atime: Some(SetTime::At(0)),
                    ..Default::default()
                },
            ),
            (
                "touch-now",
                SetAttr {
                    mtime: Some(SetTime::Now),
                    ..Default::default()
                },
            ),
        ];
        for (name, change) in changes {
            say(name, outcome(client.setattr(root_txt, &change).await));
        }
        say(
            "setxattr",
            outcome(client.setxattr(root_txt, b"user.k", b"mine", 0).await),
        );
        say(
            "getxattr",
            outcome(client.getxattr(root_txt, b"user.k").await),
        );
        say(
            "removexattr",
            outcome(client.removexattr(root_txt, b"user.k").await),
        );
        say("unlink", outcome(client.unlink(ROOT, b"root.txt").await));
        let rename = client.rename(ROOT, b"root.txt", sticky, b"taken", 0).await;
        say("rename", outcome(rename));
        say(
            "create-in-0700-dir",
            outcome(client.create(secret, b"mine", 0o644).await),
        );
        let sticky_unlink = client.unlink(sticky, b"other").await;
        say(
            "unlink-other-users-file-in-sticky-dir",
            outcome(sticky_unlink),
        );
        // Claiming to be root changes nothing.
        let as_root = client.with_caller(Caller {
            uid: 0,
            gid: 0,
            groups: Groups::default(),
            session: 0,
        });
        say(
            "unlink-claiming-uid-0",
            outcome(as_root.unlink(ROOT, b"root.txt").await),
        );
        say(
            "changelog-register",
            outcome(client.changelog_register("intruder", "").await),
        );
        say(
            "changelog-deregister",
            outcome(client.changelog_deregister(reader).await),
        );
        say(
            "changelog-clear",
            outcome(client.changelog_clear(reader, u64::MAX).await),
        );
        let release = [LockCall::Release(holder, None)];
        say(
            "release-other-clients-locks",
            outcome(client.lock_batch(session, &release).await),
        );
        say(
            "close-other-clients-session",
            outcome(client.close_lock_session(session).await),
        );
    });
}

/// Runs [`attempts_of_an_unprivileged_client`] as `user` against `server`.
fn attempts_as(user: &LocalUser, server: &str, session: u64, holder: &str, reader: u32) -> String {
    use std::os::unix::process::CommandExt;
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "attempts_of_an_unprivileged_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CALM_ATTEMPT_SERVER", server)
        .env("CALM_ATTEMPT_SESSION", session.to_string())
        .env("CALM_ATTEMPT_HOLDER", holder)
        .env("CALM_ATTEMPT_READER", reader.to_string())
        // std drops the supplementary groups when it changes the uid as root.
        .uid(user.uid)
        .gid(user.gid)
        .output()
        .expect("run the attempts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "attempts failed to run:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.find("attempt ").map(|at| &l[at + "attempt ".len()..]))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn an_unprivileged_user_is_refused_everywhere() {
    let user = LocalUser::create("a");
    let other = 40_001;
    let mount = Mount::embedded(&["--allow-other"]);
    // The user must reach the socket and the mount point (the test's directory is 0700).
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    let tcp = mount.addr.clone().expect("its loopback listener");
    assert!(!tcp.starts_with("unix:"), "{tcp}");
    mount.sh_ok(&format!(
        "chmod 755 .
         mkdir secret && chmod 700 secret && echo root-data > secret/file && chmod 600 secret/file
         echo root-data > root.txt && chmod 600 root.txt
         python3 -c 'import os; os.setxattr(\"root.txt\", \"user.k\", b\"v\")'
         mkdir sticky && chmod 1777 sticky
         setpriv --reuid={other} --regid={other} --clear-groups sh -c 'echo other > sticky/other'
         # A lock held by a process of the mount's session, until the test ends.
         nohup python3 -c 'import fcntl, time
f = open(\"root.txt\", \"rb\"); fcntl.lockf(f, fcntl.LOCK_SH); open(\"locked\", \"w\").close()
time.sleep(600)' > /dev/null 2>&1 &
         for _ in $(seq 100); do [ -e locked ] && break; sleep 0.1; done; rm locked"
    ));
    let reader = calm(&[
        "changelog",
        "--server",
        &socket,
        "register",
        "--name",
        "audit",
    ]);
    assert!(reader.status.success(), "{reader:?}");
    let reader_id: u32 = String::from_utf8_lossy(&reader.stdout)
        .trim()
        .trim_start_matches("cl")
        .parse()
        .expect("a reader id");
    let locks = |who: &str| -> serde_json::Value {
        let out = calm(&["locks", "/root.txt", "--server", &socket, "--json"]);
        assert!(out.status.success(), "{who}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let held = locks("before");
    let holder = &held["locks"][0];
    let session = holder["session"].as_u64().expect("a session");
    let holder = match holder["type"].as_str() {
        Some("OFD") | Some("flock") => format!("file:{}", holder["file"]),
        _ => format!("pid:{}", holder["pid"]),
    };
    let before = tree_state(&mount);
    let users_before = calm(&["changelog", "--server", &socket, "users"]).stdout;

    // Through the mount.
    let as_user = format!(
        "setpriv --reuid={} --regid={} --clear-groups",
        user.uid, user.gid
    );
    let attempts = [
        ("read", "cat root.txt"),
        ("write", "echo x >> root.txt"),
        ("truncate", "truncate -s 0 root.txt"),
        ("unlink", "rm -f root.txt"),
        ("rename", "mv root.txt sticky/taken"),
        ("chmod", "chmod 777 root.txt"),
        ("chown", "chown $(id -u) root.txt"),
        ("set-times", "touch -d 2000-01-01 root.txt"),
        (
            "setxattr",
            "python3 -c \"import os; os.setxattr('root.txt', 'user.k', b'x')\"",
        ),
        (
            "getxattr",
            "python3 -c \"import os; os.getxattr('root.txt', 'user.k')\"",
        ),
        ("list-0700-dir", "ls secret"),
        ("read-in-0700-dir", "cat secret/file"),
        ("create-in-0700-dir", "touch secret/mine"),
        ("sticky-unlink", "rm -f sticky/other"),
        ("sticky-rename", "mv sticky/other sticky/mine"),
    ];
    let mut script = String::new();
    for (name, command) in attempts {
        script.push_str(&format!(
            "if {as_user} sh -c '{command}' > /dev/null 2>&1; then echo '{name} ok'; \
             else echo '{name} refused'; fi\n"
        ));
    }
    let through_mount = mount.sh_ok(&script);
    assert_eq!(lines(&through_mount).len(), attempts.len());
    for line in lines(&through_mount) {
        assert!(line.ends_with(" refused"), "through the mount: {line}");
    }

    // Straight to the server: the Unix socket (the user's own uid, whatever it claims), and
    // plain TCP on loopback (root's only).
    let through_socket = attempts_as(&user, &socket, session, &holder, reader_id);
    assert!(lines(&through_socket).len() >= 20, "{through_socket}");
    for line in lines(&through_socket) {
        assert!(line.contains(" refused ("), "through the socket: {line}");
    }
    let through_tcp = attempts_as(&user, &tcp, session, &holder, reader_id);
    assert_eq!(
        lines(&through_tcp),
        [
            "lookup refused (operation not permitted: plain TCP is taken from the superuser only \
          (this connection is uid {}'s): connect to the server's Unix socket, which tells the \
          server who you are)"
                .replace("{}", &user.uid.to_string())
                .as_str()
        ],
        "through TCP"
    );
    // Changelog readers' administration needs an administrator: said as such.
    assert!(
        through_socket.contains("changelog-register refused (operation not permitted"),
        "{through_socket}"
    );

    // Nothing changed, and the server still serves.
    assert_eq!(
        tree_state(&mount),
        before,
        "a refused attempt changed the tree"
    );
    assert_eq!(
        calm(&["changelog", "--server", &socket, "users"]).stdout,
        users_before
    );
    let after = locks("after");
    assert_eq!(after["locks"], held["locks"], "the lock was released");
    mount.sh_ok("echo still-serving > new && cat new && pkill -f 'time.sleep(600)' || true");
}

/// Certificates made with `calm certs` (and an expired one, and one of another CA).
fn certificates(dir: &Path) {
    let dir_s = dir.to_str().expect("utf-8");
    for args in [
        vec!["certs", "init", "--dir", dir_s],
        vec![
            "certs",
            "issue",
            "server",
            "--dir",
            dir_s,
            "--host",
            "127.0.0.1",
        ],
        vec!["certs", "issue", "admin", "--dir", dir_s],
        vec!["certs", "issue", "user:4242", "--dir", dir_s],
    ] {
        let out = calm(&args);
        assert!(out.status.success(), "calm {args:?}: {out:?}");
    }
    let expired = dir.join("expired");
    std::fs::create_dir(&expired).expect("mkdir");
    for name in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(dir.join(name), expired.join(name)).expect("copy");
    }
    calm_server::tls::issue(&expired, "admin", &[], -1).expect("an expired certificate");
    let other = dir.join("other-ca");
    calm_server::tls::make_ca(&other).expect("another CA");
    calm_server::tls::issue(&other, "admin", &[], 30).expect("a certificate of another CA");
}

#[test]
fn tls_clients_need_a_certificate_of_the_client_ca() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let server = common::Server::start_with(
        &tmp.path().join("data"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &c("server.pem"),
            "--tls-key",
            &c("server-key.pem"),
            "--tls-client-ca",
            &c("ca.pem"),
        ],
    );
    let status = |cert: Option<(&str, &str)>, args: &[&str]| {
        let mut command = Command::new(CALM);
        command.args(args).args(["--server", &server.addr]);
        if let Some((cert, key)) = cert {
            command
                .env("CALM_TLS_CA", c("ca.pem"))
                .env("CALM_TLS_CERT", cert)
                .env("CALM_TLS_KEY", key);
        }
        command.output().expect("calm")
    };
    let admin = (c("admin.pem"), c("admin-key.pem"));
    let ok = status(Some((&admin.0, &admin.1)), &["status"]);
    assert!(ok.status.success(), "an admin certificate: {ok:?}");
    let user = (c("user-4242.pem"), c("user-4242-key.pem"));
    let out = status(Some((&user.0, &user.1)), &["status"]);
    assert!(out.status.success(), "a user certificate: {out:?}");
    let out = status(
        Some((&user.0, &user.1)),
        &["changelog", "register", "--name", "x"],
    );
    assert!(
        !out.status.success(),
        "a user registered a changelog reader"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs an administrator"),
        "{out:?}"
    );
    let refused = [
        ("no certificate", None),
        (
            "an expired certificate",
            Some((c("expired/admin.pem"), c("expired/admin-key.pem"))),
        ),
        (
            "a certificate of another CA",
            Some((c("other-ca/admin.pem"), c("other-ca/admin-key.pem"))),
        ),
    ];
    for (what, cert) in refused {
        let out = match &cert {
            Some((cert, key)) => status(Some((cert, key)), &["status"]),
            None => status(None, &["status"]),
        };
        assert!(!out.status.success(), "{what} was let in: {out:?}");
    }
    // The server still serves.
    assert!(
        status(Some((&admin.0, &admin.1)), &["status"])
            .status
            .success()
    );

    // Without TLS, a listener beyond loopback is refused with the reason.
    let out = Command::new(CALM)
        .args(["serve", "--data"])
        .arg(tmp.path().join("data2"))
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .expect("calm serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs TLS"),
        "{out:?}"
    );
}

#[test]
fn the_store_and_its_objects_are_closed_to_other_users() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mount = Mount::start(
        tempfile::tempdir().expect("tempdir"),
        &["--embedded", data.to_str().expect("utf-8")],
        &[],
    );
    mount.sh_ok("mkdir d && head -c 300000 /dev/urandom > d/f && echo small > g");
    let (status, _) = mount.terminate();
    assert!(status.success());
    let check = |data: &Path| {
        let out = Command::new("find")
            .arg(data)
            .args(["-printf", "%m %y %p\\n"])
            .output()
            .expect("find");
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut objects = 0;
        for line in listing.lines() {
            let mut fields = line.splitn(3, ' ');
            let (mode, kind, path) = (
                u32::from_str_radix(fields.next().expect("mode"), 8).expect("octal"),
                fields.next().expect("kind"),
                fields.next().expect("path"),
            );
            if path.contains("/objects/") && kind == "f" {
                objects += 1;
            }
            match (Path::new(path) == data, kind) {
                (true, _) => assert_eq!(mode, 0o711, "{line}"),
                (false, "s") => {}
                _ => assert_eq!(mode & 0o077, 0, "open to others: {line}"),
            }
        }
        assert!(objects >= 2, "the objects were checked:\n{listing}");
    };
    check(&data);
    // A store whose files were opened (by hand, or by an older calm) is closed at start.
    for path in [data.clone(), data.join("wal.0"), data.join("objects")] {
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let server = common::Server::start(&data);
    drop(server);
    check(&data);
}

#[test]
fn a_full_store_answers_enospc_keeps_reading_and_takes_writes_when_room_is_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "bash"])
        .arg(Path::new(PROGRAMS).join("full_store.sh"))
        .arg(CALM)
        .arg(tmp.path())
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "full_store.sh failed:\n{stdout}\n{}\nmount's log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(tmp.path().join("mount.err")).unwrap_or_default()
    );
    assert_eq!(
        lines(&stdout),
        [
            "filling files: ENOSPC",
            "filling names: ENOSPC",
            "reads: ok",
            "after room is back: ok",
            "clean",
        ],
        "{stdout}"
    );
}

#[test]
fn permission_cases_give_the_same_results_as_tmpfs_for_root_and_two_users() {
    let mount = Mount::embedded(&["--allow-other"]);
    mount.sh_ok("chmod 755 \"$MNT\"");
    let (tmpfs, calm) = mount.beside_tmpfs("permissions.py");
    let (tmpfs, calm) = (tmpfs.as_str(), calm.as_str());
    assert!(lines(tmpfs).len() >= 3 * 45, "every case ran:\n{tmpfs}");
    for errno in ["EACCES", "EPERM"] {
        assert!(tmpfs.contains(errno), "{errno} cases are exercised");
    }
    let mut differ = Vec::new();
    for (t, c) in lines(tmpfs).iter().zip(lines(calm)) {
        if c != *t {
            differ.push(format!("tmpfs {t}\ncalm  {c}"));
        }
    }
    assert!(
        differ.is_empty(),
        "calm differs from tmpfs:\n{}",
        differ.join("\n")
    );
    assert_eq!(lines(calm).len(), lines(tmpfs).len());

    // POSIX ACLs are refused clearly (tmpfs has them; calm does not check them, so it does
    // not pretend to keep them).
    let acl = mount.sh_ok(
        r#"touch acl && python3 -c 'import errno, os, struct
acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, 0xFFFFFFFF)
      for t, p in ((1, 6), (4, 4), (0x20, 4)))
for name in ("system.posix_acl_access", "system.posix_acl_default"):
    try:
        os.setxattr("acl" if name.endswith("access") else ".", name, acl)
        print(name, "kept")
    except OSError as e:
        print(name, errno.errorcode[e.errno])'"#,
    );
    assert_eq!(
        lines(&acl),
        [
            "system.posix_acl_access ENOTSUP",
            "system.posix_acl_default ENOTSUP"
        ]
    );
}

/// One etcd member speaking TLS only, with client certificates required; killed when dropped.
struct TlsEtcd {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_etcd_store_speaks_tls_with_a_client_certificate_and_etcd_users() {
    use calm_store::{ReadTxn, Store, WriteTxn};
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(tmp.path().join("etcd.log")).expect("log");
    let etcd = TlsEtcd {
        child: Command::new("etcd")
            .args(["--name", "m0", "--data-dir"])
            .arg(tmp.path().join("etcd"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("m0={peer_url}")])
            .args([
                "--cert-file",
                &c("server.pem"),
                "--key-file",
                &c("server-key.pem"),
            ])
            .args(["--client-cert-auth", "--trusted-ca-file", &c("ca.pem")])
            .args(["--log-level", "warn"])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd"),
        endpoint,
    };
    let etcdctl = |args: &[&str]| {
        let mut last = None;
        // The member may still be starting.
        for _ in 0..100 {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &etcd.endpoint, "--cacert", &c("ca.pem")])
                .args(["--cert", &c("admin.pem"), "--key", &c("admin-key.pem")])
                .args(["--user", "root:rootpw"])
                .args(args)
                .output()
                .expect("etcdctl");
            if out.status.success() {
                return;
            }
            last = Some(out);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("etcdctl {args:?}: {last:?}");
    };
    // Users: root (to administer), and calm, which may read and write under its prefix only.
    etcdctl(&["user", "add", "root:rootpw"]);
    etcdctl(&["user", "grant-role", "root", "root"]);
    etcdctl(&["user", "add", "calm:calmpw"]);
    etcdctl(&["role", "add", "calm"]);
    etcdctl(&[
        "role",
        "grant-permission",
        "calm",
        "--prefix=true",
        "readwrite",
        "sec",
    ]);
    etcdctl(&["user", "grant-role", "calm", "calm"]);
    etcdctl(&["auth", "enable"]);
    std::fs::write(tmp.path().join("pw"), "calmpw\n").expect("password file");
    std::fs::write(tmp.path().join("bad"), "nope\n").expect("password file");
    let hosts = etcd.endpoint.trim_start_matches("https://");
    let url = |prefix: &str, query: &str| {
        format!(
            "etcd+https://{hosts}/{prefix}?retry-ms-max=2000&tls-ca={}{query}",
            c("ca.pem")
        )
    };
    let with_cert = format!(
        "&tls-cert={}&tls-key={}",
        c("user-4242.pem"),
        c("user-4242-key.pem")
    );
    let password = |file: &str| {
        format!(
            "&user=calm&password-file={}",
            tmp.path().join(file).display()
        )
    };
    let connect = |url: &str| {
        let options = calm_store_etcd::EtcdOptions::from_url(url).expect("a good URL");
        calm_store_etcd::EtcdStore::connect(options)
    };

    // TLS, a client certificate, the right password: the store works.
    let store = connect(&url("sec", &format!("{with_cert}{}", password("pw"))))
        .expect("connecting with TLS and a password");
    let mut txn = store.begin().expect("begin");
    txn.put(b"k", b"v").expect("put");
    txn.commit().expect("commit over TLS");
    assert_eq!(
        store
            .snapshot()
            .expect("snapshot")
            .get(b"k")
            .expect("get")
            .as_deref(),
        Some(&b"v"[..])
    );
    drop(store);

    // A wrong password, no password, no client certificate, a prefix the user may not
    // write, or plain HTTP: refused.
    let attempts = [
        (
            "a wrong password",
            url("sec", &format!("{with_cert}{}", password("bad"))),
        ),
        ("no password", url("sec", &with_cert)),
        ("no client certificate", url("sec", &password("pw"))),
        (
            "another prefix",
            url("other", &format!("{with_cert}{}", password("pw"))),
        ),
    ];
    for (what, url) in attempts {
        let refused = connect(&url).and_then(|store| {
            let mut txn = store.begin()?;
            txn.put(b"k", b"intruder")?;
            txn.commit()
        });
        eprintln!("{what}: {refused:?}");
        assert!(refused.is_err(), "{what} was let in");
    }
    let plain = format!("etcd://{hosts}/sec?retry-ms-max=2000");
    assert!(connect(&plain).is_err(), "plain HTTP was let in");
    // Passwords stay out of URLs and of debug output.
    let options = calm_store_etcd::EtcdOptions::from_url(&url("sec", &password("pw"))).unwrap();
    assert!(!format!("{options:?}").contains("calmpw"));
    let error = calm_store_etcd::EtcdOptions::from_url(&format!(
        "etcd://{hosts}/sec?tls-ca={}",
        c("ca.pem")
    ))
    .unwrap_err();
    assert!(error.contains("etcd+https://"), "{error}");
}

#[test]
fn a_mount_over_tls_acts_for_its_callers_with_root_squashed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let out = calm(&[
        "certs",
        "issue",
        "mount:node1",
        "--dir",
        certs.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let data = tmp.path().join("data");
    let server = common::Server::start_with(
        &data,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &c("server.pem"),
            "--tls-key",
            &c("server-key.pem"),
            "--tls-client-ca",
            &c("ca.pem"),
            "--root-squash",
        ],
    );
    let socket = format!("unix:{}", data.join("calm.sock").display());
    // Root's mount over the Unix socket is an administrator: root stays root.
    let local = Mount::remote(&socket, &[]);
    local.sh_ok("echo secret > root600 && chmod 600 root600 && mkdir open && chmod 777 open");
    // The mount with a mount:NAME certificate: its root acts as nobody.
    let remote = Mount::remote(
        &server.addr,
        &[
            "--tls-ca",
            &c("ca.pem"),
            "--tls-client-cert",
            &c("mount-node1.pem"),
            "--tls-client-key",
            &c("mount-node1-key.pem"),
        ],
    );
    let out = remote.sh_ok(
        "cat root600 2>/dev/null && echo read || echo refused
         echo mine > open/new && stat -c '%u %g' open/new
         chmod 777 root600 2>/dev/null && echo chmodded || echo refused",
    );
    assert_eq!(lines(&out), ["refused", "65534 65534", "refused"], "{out}");
    assert_eq!(
        local.sh_ok("cat root600; stat -c %a root600"),
        "secret\n600\n"
    );
}

#[test]
fn connections_beyond_the_limits_and_silent_ones_are_closed() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let server = common::Server::start(&data);
    let socket = data.join("calm.sock");
    // Whether the server closed `conn` within `wait` (bytes it sent first are read past).
    let closed_within = |conn: &mut UnixStream, wait: Duration| {
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match conn.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return true,
            }
        }
        false
    };
    // One peer (this process's uid) may hold 256 connections; the next ones are closed at once.
    let limit = calm_server::listen::CONNECTIONS_PER_PEER_MAX;
    let mut held: Vec<UnixStream> = (0..limit)
        .map(|_| UnixStream::connect(&socket).expect("connect"))
        .collect();
    // The accept loop has taken all of them once a later connection is answered by a close.
    let mut over = UnixStream::connect(&socket).expect("connect");
    assert!(
        closed_within(&mut over, Duration::from_secs(5)),
        "connection {} of one peer was kept",
        limit + 1
    );
    // A connection that never says anything is closed after the handshake timeout (10 s).
    let started = Instant::now();
    let silent = held.last_mut().expect("a connection");
    assert!(
        closed_within(
            silent,
            calm_server::listen::HANDSHAKE_TIMEOUT + Duration::from_secs(5)
        ),
        "a silent connection stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "closed too early"
    );
    drop(held);
    // The server still serves.
    let out = calm(&["status", "--server", &format!("unix:{}", socket.display())]);
    assert!(out.status.success(), "{out:?}");
    drop(server);
}
