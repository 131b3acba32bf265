//! POSIX ACLs through real mounts: the ACL cases beside tmpfs (which keeps and checks ACLs as
//! ext4 does), case by case for root and two users; and an ACL changed on one mount holding on
//! another, granted (as soon as the change reaches it) and revoked (at once) again and again.

use super::lines;
use crate::common::Mount;

#[test]
fn acl_cases_give_the_same_results_as_tmpfs_for_root_and_two_users() {
    let mount = Mount::embedded(&["--allow-other"]);
    mount.sh_ok("chmod 755 \"$MNT\"");
    let tmpfs = super::same_as_tmpfs(
        &mount,
        "acls.py",
        3 * 40,
        &["EACCES", "EPERM", "ENOTSUP", "EINVAL"],
    );
    // What only an ACL grants is granted (the cases test ACLs, not the mode bits).
    for granted in [
        r#"{"actor": "b", "case": "read a-shares-b", "ok": "data"}"#,
        r#"{"actor": "b", "case": "read r-group-rw", "ok": "data"}"#,
        r#"{"actor": "a", "case": "list r-dir-a", "ok": ["f"]}"#,
    ] {
        assert!(lines(&tmpfs).contains(&granted), "{granted}:\n{tmpfs}");
    }
}

/// User B of the cases (not in /etc/passwd: setpriv takes numbers).
const B: u32 = 40002;

#[test]
fn an_acl_changed_on_one_mount_holds_on_another_and_its_revocation_at_once() {
    let a = Mount::embedded(&["--allow-other"]);
    let server = a.addr.clone().expect("the embedded server's address");
    let b = Mount::remote(&server, &["--allow-other"]);
    a.sh_ok("chmod 755 \"$MNT\" && echo secret > f && chmod 600 f && mkdir p && chmod 777 p");
    let read_as_b = |mount: &Mount, path: &str| {
        mount
            .sh(&format!(
                "setpriv --reuid {B} --regid {B} --clear-groups cat {path}"
            ))
            .status
            .success()
    };
    assert!(!read_as_b(&b, "f"), "the mode alone lets B in");
    // A grant reaches the other mount as any change of attributes does, with the change
    // stream (B's mount answers the kernel that f has no ACL while nothing changed it).
    let granted_within = |mount: &Mount, path: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !read_as_b(mount, path) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    };
    for round in 0..50 {
        a.sh_ok(&format!("setfacl -m u:{B}:r f"));
        assert!(
            granted_within(&b, "f"),
            "round {round}: the grant is not seen within 10 s"
        );
        assert_eq!(
            b.sh_ok("getfacl -n --omit-header f"),
            format!("user::rw-\nuser:{B}:r--\ngroup::---\nmask::r--\nother::---\n\n"),
            "round {round}"
        );
        a.sh_ok(&format!("setfacl -x u:{B} f"));
        assert!(
            !read_as_b(&b, "f"),
            "round {round}: the revocation is not seen"
        );
    }
    // A default ACL set on one mount is what a file made through the other takes.
    a.sh_ok(&format!("setfacl -d -m u:{B}:rw p"));
    b.sh_ok("umask 077 && touch p/new");
    let seen = |mount: &Mount| mount.sh_ok("stat -c %a p/new && getfacl -n --omit-header p/new");
    assert_eq!(seen(&a), seen(&b));
    assert!(
        seen(&b).starts_with(&format!("666\nuser::rw-\nuser:{B}:rw-\n")),
        "the default ACL, not the umask 077: {}",
        seen(&b)
    );
    assert!(read_as_b(&a, "p/new"));
}
