//! The dependency rules of ARCHITECTURE.md, enforced: the store seam knows no async runtime
//! and no wire; the namespace knows no wire, no server, no CLI; the wire, the client and the
//! server link no store backend (only the binary and the benchmarks choose LMDB).

use std::process::Command;

fn dependencies_of(krate: &str) -> String {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            krate,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn assert_absent(krate: &str, forbidden: &[&str]) {
    let tree = dependencies_of(krate);
    for name in forbidden {
        let found = tree
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name));
        assert!(!found, "{krate} must not depend on {name}:\n{tree}");
    }
}

/// A pure core: no dependency at all.
fn assert_dependency_free(krate: &str) {
    let tree = dependencies_of(krate);
    let lines: Vec<&str> = tree.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{krate} must stay dependency-free:\n{tree}");
}

#[test]
fn the_lock_manager_depends_on_nothing() {
    assert_dependency_free("calm-locks");
}

#[test]
fn the_changelog_core_depends_on_nothing() {
    assert_dependency_free("calm-changelog");
}

#[test]
fn the_watch_fan_out_depends_on_nothing() {
    assert_dependency_free("calm-watch");
}

#[test]
fn pure_crates_keep_their_dependencies_out() {
    assert_absent("calm-store", &["tokio", "tonic", "prost", "calm-meta"]);
    assert_absent(
        "calm-meta",
        &["tonic", "prost", "hyper", "h2", "clap", "indicatif"],
    );
    assert_absent("calm-proto", &["heed", "calm-server", "calm-client"]);
    assert_absent("calm-client", &["heed", "calm-server"]);
    assert_absent("calm-server", &["heed", "clap", "indicatif"]);
    // The data plane knows no FUSE, no wire and no metadata store; the namespace knows no
    // object store.
    assert_absent(
        "calm-data",
        &[
            "fuser",
            "tonic",
            "prost",
            "heed",
            "calm-store-etcd",
            "calm-proto",
        ],
    );
    assert_absent("calm-meta", &["object_store", "calm-data", "reqwest"]);
}
