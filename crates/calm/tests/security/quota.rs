//! Quotas as a user meets them through a mount: a create or a write past a limit answers
//! EDQUOT and leaves nothing half done, df shows the limit of the tree mounted, only the
//! superuser sets limits; neither the trash nor a file unlinked while open is a way around a
//! limit; and usage (and the ACLs every file of it takes) stays exact through kill -9 of a
//! storm in two trees.

use std::time::Duration;

use super::users::LocalUser;
use crate::common::{self, Mount, calm};

fn quota(socket: &str, args: &[&str]) -> String {
    let mut all = vec!["quota", "--server", socket];
    all.extend_from_slice(args);
    let out = calm(&all);
    assert!(
        out.status.success(),
        "calm {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn a_user_past_a_limit_gets_edquot_and_nothing_half_done() {
    let user = LocalUser::create("q");
    let mount = Mount::embedded(&["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    mount.sh_ok("mkdir -m 777 proj other");
    quota(
        &socket,
        &["set", "/proj", "--bytes", "1M", "--inodes", "10"],
    );
    quota(
        &socket,
        &["set", "--user", &user.uid.to_string(), "--inodes", "5"],
    );
    let as_user = |script: &str| {
        mount.sh(&format!(
            "setpriv --reuid={} --regid={} --clear-groups bash -c '{script}' 2>&1",
            user.uid, user.gid
        ))
    };
    // Five inodes for the user: the sixth create is refused.
    let out = as_user("for i in 1 2 3 4 5 6; do touch proj/f$i || echo refused $i; done");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Disk quota exceeded") && text.contains("refused 6"),
        "{text}"
    );
    assert!(!text.contains("refused 5"), "{text}");
    // 2 MB into a tree of 1 MiB: the write fails with EDQUOT, the file keeps its 0 bytes.
    let out = as_user("head -c 2000000 /dev/zero > proj/f1; echo rc=$?");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Disk quota exceeded"), "{text}");
    assert_eq!(mount.sh_ok("stat -c %s proj/f1").trim(), "0");
    // Up to the limit is fine; the usage is what was written.
    as_user("head -c 1000000 /dev/zero > proj/f1");
    assert_eq!(mount.sh_ok("stat -c %s proj/f1").trim(), "1000000");
    let got = common::calm_json(&["quota", "--server", &socket, "get", "/proj", "--json"]);
    assert_eq!(got["bytes"], 1_000_000, "{got}");
    assert_eq!(got["inodes"], 5, "{got}");
    // A user sets no limit, not even on themself.
    let out = as_user(&format!(
        "{} quota --server {socket} set --user {} --inodes 0",
        common::CALM,
        user.uid
    ));
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Moving a file out of the tree moves its bytes; a directory between trees answers
    // EXDEV, which mv meets by copying.
    mount.sh_ok("mkdir proj/d && mv proj/f1 other/f1 && mv proj/d other/d");
    let got = common::calm_json(&["quota", "--server", &socket, "get", "/proj", "--json"]);
    assert_eq!(
        (got["bytes"].as_i64(), got["inodes"].as_i64()),
        (Some(0), Some(4)),
        "{got}"
    );
    // df shows the quota of the tree mounted.
    quota(&socket, &["set", "/", "--bytes", "3M", "--inodes", "1000"]);
    let df = mount.sh_ok("df -B1 --output=size,used . | tail -1; df --output=itotal . | tail -1");
    let figures: Vec<u64> = df
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect();
    assert_eq!(figures[0], 3 << 20, "{df}");
    assert_eq!(figures[1], 1_000_000_u64.div_ceil(4096) * 4096, "{df}");
    assert_eq!(figures[2], 1000, "{df}");
    assert!(quota(&socket, &["check"]).contains("every usage kept"));
    // calm status shows the quotas nearest their limits: the user's 5 inodes of 5 first.
    let status = common::calm_json(&["status", "--server", &socket, "--json"]);
    let first = &status["nearest"][0];
    assert_eq!(
        (
            first["who"].as_str(),
            first["what"].as_str(),
            first["used"].as_u64()
        ),
        (
            Some(format!("user {}", user.uid).as_str()),
            Some("inodes"),
            Some(5)
        ),
        "{status}"
    );
    let summary = common::calm_json(&["summary", "--server", &socket, "/other", "--json"]);
    assert_eq!(
        (summary["files"].as_i64(), summary["from"].as_str()),
        (Some(1), Some("walk"))
    );
}

#[test]
fn usage_stays_exact_through_kill_9_of_a_storm_in_two_trees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8").to_string();
    for round in 0..3 {
        let mount = Mount::start(
            tempfile::tempdir().expect("tempdir"),
            &["--embedded", &data_arg],
            &[],
        );
        let socket = mount.socket.clone().expect("socket");
        if round == 0 {
            mount.sh_ok("mkdir -p a/x b/y");
            // Default ACLs: every file and directory of the storm takes one, and its chmods
            // rewrite it (fsck checks both against the modes).
            mount.sh_ok("setfacl -d -m u:40002:rw a b && setfacl -m u:40002:rwx a/x");
            quota(
                &socket,
                &["set", "/a", "--bytes", "1G", "--inodes", "100000"],
            );
            quota(&socket, &["set", "/a/x", "--bytes", "1G"]);
            quota(&socket, &["set", "/b", "--inodes", "100000"]);
        }
        // Two writers per tree create, write, append, truncate and remove until killed.
        let pids = dir.path().join("storm.pids");
        let pids = pids.to_str().expect("utf-8");
        let storm = |tree: &str, n: u32| {
            format!(
                "( i=0; while :; do i=$((i+1)); f={tree}/s{n}-$((i % 50));
                   head -c $((i * 97 % 20000)) /dev/zero > $f; echo more >> $f;
                   [ $((i % 3)) = 0 ] && rm -f {tree}/s{n}-$(((i + 7) % 50));
                   [ $((i % 5)) = 0 ] && truncate -s $((i % 7000)) $f;
                   [ $((i % 7)) = 0 ] && chmod $((600 + i % 2 * 40)) $f;
                   [ $((i % 11)) = 0 ] && mkdir -p {tree}/d$n-$((i % 9)) && rmdir {tree}/d$n-$((i % 9));
                 done ) >/dev/null 2>&1 & echo $! >> {pids};"
            )
        };
        mount.sh_ok(&format!(
            "{} {} {} {} sleep 0.1",
            storm("a/x", round),
            storm("a", round + 10),
            storm("b/y", round),
            storm("b", round + 10)
        ));
        std::thread::sleep(Duration::from_millis(2500));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(mount.pid() as i32, libc::SIGKILL) };
        drop(mount);
        // The writers outlive their mount: they go too.
        for pid in std::fs::read_to_string(pids).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) on a process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_file(pids);
        let out = calm(&["fsck", &data_arg]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "round {round}: fsck after kill -9:\n{text}"
        );
    }
    // And the server agrees, online.
    let mount = Mount::start(
        tempfile::tempdir().expect("tempdir"),
        &["--embedded", &data_arg],
        &[],
    );
    let socket = mount.socket.clone().expect("socket");
    assert!(quota(&socket, &["check"]).contains("every usage kept"));
    let a = common::calm_json(&["quota", "--server", &socket, "get", "/a", "--json"]);
    assert!(
        a["inodes"].as_i64().unwrap_or(0) > 10,
        "the storm made files: {a}"
    );
    let acls = mount.sh_ok("getfacl -n --omit-header -R a b | grep -c '^user:40002:' || true");
    assert!(
        acls.trim().parse::<u32>().unwrap_or(0) > 10,
        "the storm's files took the default ACLs: {acls}"
    );
}

/// Extended attributes count in their owner's bytes and under a limit per file: a user with a
/// 512 KiB limit who writes 64 KiB values is refused (EDQUOT) once the names and values pass it,
/// the usage shown is those bytes, a removal gives them back, a file holds at most 1 MiB of
/// them whoever asks (ENOSPC, even under no quota), and `calm quota check` finds the usage
/// kept equal to the usage counted.
#[test]
fn extended_attributes_count_in_the_quota_and_under_a_limit_per_file() {
    let user = LocalUser::create("x");
    let mount = Mount::embedded(&["--allow-other"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    mount.sh_ok("mkdir -m 777 home");
    let uid = user.uid.to_string();
    quota(&socket, &["set", "--user", &uid, "--bytes", "512K"]);
    let as_user = |script: &str| {
        mount.sh(&format!(
            "setpriv --reuid={} --regid={} --clear-groups /usr/bin/python3 -c \"{script}\" 2>&1",
            user.uid, user.gid
        ))
    };
    // 64 KiB values with 9-byte names: 7 fit in 512 KiB (with the file's 0 bytes), the 8th not.
    let out = as_user(
        "
import errno, os
open('home/f', 'w').close()
for i in range(40):
    try:
        os.setxattr('home/f', 'user.v%03d' % i, b'v' * 65536)
    except OSError as e:
        print('refused', i, errno.errorcode[e.errno])
        break
",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("refused 7 EDQUOT"), "{text}");
    let per_value = "user.v000".len() + 65536;
    let got = common::calm_json(&[
        "quota", "--server", &socket, "get", "--user", &uid, "--json",
    ]);
    assert_eq!(got["bytes"], 7 * per_value, "{got}");
    as_user("import os; os.removexattr('home/f', 'user.v000')");
    let got = common::calm_json(&[
        "quota", "--server", &socket, "get", "--user", &uid, "--json",
    ]);
    assert_eq!(got["bytes"], 6 * per_value, "{got}");

    // The superuser is held to no user quota, but a file's own limit holds for everyone.
    let out = mount.sh_ok(
        "python3 -c \"
import errno, os
open('big', 'w').close()
for i in range(40):
    try:
        os.setxattr('big', 'user.v%03d' % i, b'v' * 65536)
    except OSError as e:
        print('refused', i, errno.errorcode[e.errno])
        break
\"",
    );
    assert!(out.contains("refused 15 ENOSPC"), "{out}");
    let check = quota(&socket, &["check"]);
    assert!(!check.contains("differ"), "{check}");
    // Removing the file gives its xattrs' bytes back.
    mount.sh_ok("rm home/f");
    let got = common::calm_json(&[
        "quota", "--server", &socket, "get", "--user", &uid, "--json",
    ]);
    assert_eq!(got["bytes"], 0, "{got}");
}

#[test]
fn neither_the_trash_nor_an_unlinked_open_file_is_a_way_around_a_limit() {
    let user = LocalUser::create("qt");
    let mount = Mount::embedded(&["--allow-other", "--trash-min-age-s", "0"]);
    let top = mount.mnt.parent().expect("the mount's directory");
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let socket = mount.socket.clone().expect("the embedded server's socket");
    mount.sh_ok("mkdir -m 777 proj other");
    quota(&socket, &["set", "/proj", "--bytes", "10M"]);
    quota(
        &socket,
        &["set", "--user", &user.uid.to_string(), "--bytes", "50M"],
    );
    let as_user = |script: &str| {
        let out = mount.sh(&format!(
            "setpriv --reuid={} --regid={} --clear-groups bash -c '{script}' 2>&1",
            user.uid, user.gid
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bytes = |target: &str| -> i64 {
        let mut args = vec!["quota", "--server", &socket, "get"];
        args.extend(target.split(' '));
        args.push("--json");
        common::calm_json(&args)["bytes"].as_i64().expect("a usage")
    };

    // A log opened, unlinked and written to: 30 MiB asked for under a 10 MiB tree limit.
    let out = mount.sh(&format!(
        "setpriv --reuid={} --regid={} --clear-groups /usr/bin/python3 - proj/log 30 \
         < {}/unlinked_writer.py",
        user.uid,
        user.gid,
        common::PROGRAMS
    ));
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(report["errno"], 122, "EDQUOT past the tree's limit: {out}");
    let durable = report["durable"].as_i64().expect("bytes");
    assert!(
        (8 << 20..=10 << 20).contains(&durable),
        "the tree's room and no more: {out}"
    );
    // Closed, it went to the trash (the kernel says so a moment after the close): out of the
    // tree, still the user's.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bytes("/proj") != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(bytes("/proj"), 0);
    assert_eq!(bytes(&format!("--user {}", user.uid)), durable);
    as_user(&format!(
        "{} trash purge --server {socket} --all",
        common::CALM
    ));
    assert_eq!(bytes(&format!("--user {}", user.uid)), 0);

    // 40 MiB removed into the trash still count: another 40 MiB under a 50 MiB limit fail,
    // until the user purges their trash.
    let write40 = |name: &str| {
        as_user(&format!(
            "head -c 41943040 /dev/zero > other/{name} && sync other/{name} && echo wrote"
        ))
    };
    assert!(write40("a").contains("wrote"));
    as_user("rm other/a");
    let listed = as_user(&format!("{} trash list --server {socket}", common::CALM));
    assert!(listed.contains("/other/a"), "{listed}");
    assert_eq!(bytes(&format!("--user {}", user.uid)), 40 << 20);
    let out = write40("b");
    assert!(out.contains("Disk quota exceeded"), "{out}");
    as_user("rm -f other/b");
    as_user(&format!(
        "{} trash purge --server {socket} --all",
        common::CALM
    ));
    assert!(write40("b").contains("wrote"));
    assert_eq!(bytes(&format!("--user {}", user.uid)), 40 << 20);
    assert!(quota(&socket, &["check"]).contains("every usage kept"));
}
