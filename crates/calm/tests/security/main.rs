//! Who may do what: an unprivileged user against root's files (through the Unix socket,
//! through plain TCP, through an --allow-other mount) and the permission rules beside tmpfs
//! (`users`); TLS clients, mounts and the etcd store with good and bad certificates (`tls`);
//! the data directory's modes, a store whose file system fills up, and the connection limits
//! (`store`); quotas tried by an unprivileged user, and kept exact through kill -9 (`quota`).

#[path = "../common/mod.rs"]
mod common;

mod quota;
mod store;
mod tls;
mod users;

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}
