//! Who may do what: an unprivileged user against root's files (through the Unix socket,
//! through plain TCP, through an --allow-other mount) and the permission rules beside tmpfs
//! (`users`); TLS clients, mounts and the etcd store with good and bad certificates (`tls`);
//! the data directory's modes, a store whose file system fills up, and the connection limits
//! (`store`); quotas tried by an unprivileged user, and kept exact through kill -9 (`quota`);
//! a user's locks through every mount under one limit (`locks`);
//! POSIX ACLs beside tmpfs and across two mounts (`acl`).

use crate::common;

mod acl;
mod locks;
mod quota;
mod store;
mod tls;
mod users;

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// Runs the cases of `program` on tmpfs and on `mount` (`Mount::beside_tmpfs`) and asserts
/// that they ran (at least `cases` lines, each of `errnos` met) and that calm gave every
/// result tmpfs gave; returns tmpfs's results.
fn same_as_tmpfs(mount: &common::Mount, program: &str, cases: usize, errnos: &[&str]) -> String {
    let (tmpfs, calm) = mount.beside_tmpfs(program);
    assert!(lines(&tmpfs).len() >= cases, "every case ran:\n{tmpfs}");
    for errno in errnos {
        assert!(
            tmpfs.contains(errno),
            "{errno} cases are exercised:\n{tmpfs}"
        );
    }
    let mut differ = Vec::new();
    for (t, c) in lines(&tmpfs).iter().zip(lines(&calm)) {
        if c != *t {
            differ.push(format!("tmpfs {t}\ncalm  {c}"));
        }
    }
    assert!(
        differ.is_empty(),
        "calm differs from tmpfs:\n{}",
        differ.join("\n")
    );
    assert_eq!(lines(&calm).len(), lines(&tmpfs).len());
    tmpfs
}
