//! An unprivileged user against root's files, and the permission rules beside tmpfs.

use std::path::Path;
use std::process::Command;

use super::lines;
use crate::common::{self, Mount, calm};

/// A local user made for one test (`useradd`), removed when dropped. Users left by a test
/// that was killed (their name carries the test's pid) are removed by the next one.
pub(crate) struct LocalUser {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

const USER_PREFIX: &str = "calmt";

impl LocalUser {
    pub(crate) fn create(tag: &str) -> LocalUser {
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
            outcome(client.append(root_txt, 77, 4, None).await),
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
            // A file's change time is the time of its last change, for everyone.
            (
                "set-ctime",
                SetAttr {
                    ctime: Some(0),
                    ..Default::default()
                },
            ),
        ];
        for (name, change) in changes {
            say(name, outcome(client.setattr(root_txt, &change).await));
        }
        // A change of nothing is answered (as utimensat with both times omitted) and changes
        // nothing: no new change time (the test compares the tree, ctimes included).
        client
            .setattr(root_txt, &SetAttr::default())
            .await
            .expect("a change of nothing");
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
        // Devices are the superuser's to make (CAP_MKNOD), even where the user may create.
        let device =
            calm_meta::NewNode::node(calm_meta::Kind::CharDevice, 0o666, 0, 0, (1 << 8) | 1);
        say(
            "mknod-char-device-in-sticky-dir",
            outcome(client.make_in_dir(sticky, b"mem", &device, true).await),
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
        // A create the user may make (in the sticky directory), naming another client's
        // lock session: its record would carry that session (and its orphans be theirs).
        let in_their_session = client.with_caller(Caller {
            uid: 0,
            gid: 0,
            groups: Groups::default(),
            session,
        });
        say(
            "create-naming-other-clients-session",
            outcome(in_their_session.create(sticky, b"mine", 0o644).await),
        );
        // Every change of the namespace (what a mount follows) names entries of directories
        // the user may not search.
        say(
            "watch-every-change",
            outcome(
                client
                    .watch(calm_client::WatchWhat::All, 0)
                    .await
                    .map(|w| w.id()),
            ),
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

/// Runs the ignored test `test` of this binary as `user`, with `env`, and gives what it
/// printed after `tag` on each line that has it (it must succeed).
fn run_as(user: &LocalUser, test: &str, env: &[(&str, String)], tag: &str) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().map(|(k, v)| (k, v)))
        // std drops the supplementary groups when it changes the uid as root.
        .uid(user.uid)
        .gid(user.gid)
        .output()
        .expect("run the test as the user");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{test} failed to run:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.find(tag).map(|at| l[at + tag.len()..].to_string()))
        .collect()
}

/// Runs [`attempts_of_an_unprivileged_client`] as `user` against `server`.
fn attempts_as(user: &LocalUser, server: &str, session: u64, holder: &str, reader: u32) -> String {
    let env = [
        ("CALM_ATTEMPT_SERVER", server.to_string()),
        ("CALM_ATTEMPT_SESSION", session.to_string()),
        ("CALM_ATTEMPT_HOLDER", holder.to_string()),
        ("CALM_ATTEMPT_READER", reader.to_string()),
    ];
    run_as(
        user,
        "security::users::attempts_of_an_unprivileged_client",
        &env,
        "attempt ",
    )
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
    // lockf through a mount: a record lock named by its owner's file id (a mount cannot tell
    // POSIX from OFD), with no made-up pid.
    assert_eq!(holder["type"], "RECORD", "{held}");
    assert!(
        holder["file"].is_u64() && holder.get("pid").is_none(),
        "{held}"
    );
    let session = holder["session"].as_u64().expect("a session");
    let holder = match holder["type"].as_str() {
        Some("RECORD") | Some("FLOCK") => format!("file:{}", holder["file"]),
        _ => format!("pid:{}", holder["pid"]),
    };
    let before = tree_state(&mount);
    // The changelog readers as listed, but for how long each has been idle (which the test's
    // own duration changes).
    let readers = || {
        let out = calm(&["changelog", "--server", &socket, "users"]).stdout;
        String::from_utf8_lossy(&out)
            .lines()
            .map(|line| {
                line.split_whitespace()
                    .filter(|field| !(field.starts_with('(') && field.ends_with(')')))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
    };
    let users_before = readers();

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
    assert!(
        through_socket.contains(&format!(
            "create-naming-other-clients-session refused (operation not permitted: lock \
             session {session} belongs to another client"
        )),
        "{through_socket}"
    );
    assert!(
        through_socket.contains("watch-every-change refused (operation not permitted"),
        "{through_socket}"
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
    assert_eq!(readers(), users_before);
    let after = locks("after");
    assert_eq!(after["locks"], held["locks"], "the lock was released");
    mount.sh_ok("echo still-serving > new && cat new && pkill -f 'time.sleep(600)' || true");
}

#[test]
fn permission_cases_give_the_same_results_as_tmpfs_for_root_and_two_users() {
    let mount = Mount::embedded(&["--allow-other"]);
    mount.sh_ok("chmod 755 \"$MNT\"");
    super::same_as_tmpfs(&mount, "permissions.py", 3 * 45, &["EACCES", "EPERM"]);
}

/// A client of `server`, and the sticky directory the tests below work in.
async fn connect_beside_sticky(server: &str) -> (calm_client::Client, calm_meta::Handle) {
    let client = calm_client::Client::connect(server).await.expect("connect");
    let sticky = client
        .lookup(calm_meta::ROOT, b"sticky")
        .await
        .expect("sticky")
        .handle;
    (client, sticky)
}

/// Lock sessions and locks of an unprivileged client, run as that user by the test below:
/// sessions opened until one is refused, then locks taken in one session until one is.
#[test]
#[ignore = "run as another user by an_unprivileged_user_cannot_take_the_lock_managers_memory"]
fn lock_limits_of_an_unprivileged_client() {
    let Ok(server) = std::env::var("CALM_ATTEMPT_SERVER") else {
        return;
    };
    use calm_locks::{LockKind, Owner, Range, Request, Scope};
    use calm_proto::locks::{LOCK_BATCH_OPS_MAX, LockCall, LockCode};
    let runtime = common::runtime();
    runtime.block_on(async {
        let (client, sticky) = connect_beside_sticky(&server).await;
        let file = client
            .create(sticky, b"mine-to-lock", 0o644)
            .await
            .expect("a file of mine")
            .handle;
        let mut sessions = Vec::new();
        let refused = loop {
            match client.open_lock_session(60_000).await {
                Ok(session) if sessions.len() < 1000 => sessions.push(session),
                Ok(_) => break "never".to_string(),
                Err(e) => break e.to_string(),
            }
        };
        println!("limit sessions {} then refused ({refused})", sessions.len());
        let session = sessions[0];
        let (mut held, mut at) = (0u64, 0u64);
        let refused = 'taking: loop {
            let calls: Vec<LockCall> = (0..LOCK_BATCH_OPS_MAX as u64 / 4)
                .map(|i| {
                    LockCall::Set(Request {
                        resource: file,
                        owner: Owner::File { file: 1 },
                        scope: Scope::Range(Range {
                            start: 2 * (at + i),
                            end: 2 * (at + i),
                        }),
                        kind: LockKind::Read,
                    })
                })
                .collect();
            at += calls.len() as u64;
            let answers = client.lock_batch(session, &calls).await.expect("a batch");
            for answer in answers {
                if answer.code != LockCode::Ok {
                    break 'taking format!("{:?}", answer.code);
                }
                held += 1;
            }
            if held > 1 << 22 {
                break "never".to_string();
            }
        };
        println!("limit locks {held} then refused ({refused})");
    });
}

/// Files kept by one session of an unprivileged client after their last name went (orphans),
/// until one is refused; run as that user by the test below, before its memory is measured
/// (the files' records touch the store's pages, which are not the lock manager's).
#[test]
#[ignore = "run as another user by an_unprivileged_user_cannot_take_the_lock_managers_memory"]
fn orphan_limit_of_an_unprivileged_client() {
    let Ok(server) = std::env::var("CALM_ATTEMPT_SERVER") else {
        return;
    };
    let runtime = common::runtime();
    runtime.block_on(async {
        let (client, sticky) = connect_beside_sticky(&server).await;
        let session = client.open_lock_session(60_000).await.expect("a session");
        // SAFETY: getuid(2) and getgid(2) cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let me = client.with_caller(calm_meta::Caller {
            session,
            uid,
            gid,
            groups: Default::default(),
        });
        let mut kept = 0;
        let refused = loop {
            let name = format!("orphan-{kept}");
            let file = me
                .create(sticky, name.as_bytes(), 0o644)
                .await
                .expect("a file to keep")
                .handle;
            match me.unlink_keeping(sticky, name.as_bytes(), vec![file]).await {
                Ok(Some(_)) => kept += 1,
                Ok(None) => break "not kept".to_string(),
                Err(e) => break e.to_string(),
            }
            if kept > 4 * calm_server::auth::ORPHANS_PER_USER_SESSION_MAX {
                break "never".to_string();
            }
        };
        println!("limit orphans {kept} then refused ({refused})");
        client
            .close_lock_session(session)
            .await
            .expect("closing the session");
    });
}

#[test]
fn an_unprivileged_user_cannot_take_the_lock_managers_memory() {
    let user = LocalUser::create("l");
    let mount = Mount::embedded(&["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    mount.sh_ok("mkdir sticky && chmod 1777 sticky");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    let rss_mib = || -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", mount.pid()))
            .expect("the server's status");
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kib / 1024.0
    };
    let kept = run_as(
        &user,
        "security::users::orphan_limit_of_an_unprivileged_client",
        &[("CALM_ATTEMPT_SERVER", socket.clone())],
        "limit ",
    );
    let orphans = calm_server::auth::ORPHANS_PER_USER_SESSION_MAX;
    assert!(
        kept[0].starts_with(&format!("orphans {orphans} then refused (")),
        "{kept:?}"
    );
    assert!(kept[0].contains("orphans per user session"), "{kept:?}");
    let before = rss_mib();
    let said = run_as(
        &user,
        "security::users::lock_limits_of_an_unprivileged_client",
        &[("CALM_ATTEMPT_SERVER", socket.clone())],
        "limit ",
    );
    let after = rss_mib();
    println!("{said:?}; the server's memory {before:.1} MiB before, {after:.1} MiB after");
    let sessions = calm_server::auth::SESSIONS_PER_USER_MAX;
    assert!(
        said[0].starts_with(&format!("sessions {sessions} then refused (")),
        "{said:?}"
    );
    assert!(said[0].contains("sessions per user"), "{said:?}");
    // A set needs room for two more locks (it may split one in three).
    let locks = calm_server::auth::LOCKS_PER_USER_SESSION_MAX - 1;
    assert_eq!(
        said[1],
        format!("locks {locks} then refused (TooManyLocks)"),
        "{said:?}"
    );
    // A user's sessions and locks cost the server a few MiB, not the 46 MiB half a million
    // locks took before there was a limit.
    assert!(
        after - before < 32.0,
        "the server grew from {before:.1} to {after:.1} MiB"
    );
    // calm status names the user nearest to both limits (its sessions live on their lease).
    let status = common::calm_json(&["status", "--server", &socket, "--json"]);
    let nearest = status["nearest"].as_array().expect("the nearest figures");
    let theirs = |what: &dyn Fn(&str) -> bool, used: u64| {
        nearest.iter().any(|n| {
            n["who"]
                .as_str()
                .is_some_and(|w| w.contains(&user.uid.to_string()))
                && n["what"].as_str().is_some_and(what)
                && n["used"] == used
        })
    };
    assert!(
        theirs(&|w| w == "lock sessions", sessions as u64),
        "{status}"
    );
    assert!(
        theirs(&|w| w.starts_with("locks of session"), locks),
        "{status}"
    );
    // Root and mounts are not held to a user's limits: the mount still locks.
    mount.sh_ok("python3 -c 'import fcntl; f = open(\"sticky/root-lock\", \"w\"); fcntl.lockf(f, fcntl.LOCK_EX)'");
}
