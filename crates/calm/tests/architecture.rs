//! The dependency rules of ARCHITECTURE.md, enforced: the store seam knows no async runtime
//! and no wire; the namespace knows no wire, no server, no CLI; the wire, the client and the
//! server link no store backend (only the binary and the benchmarks choose LMDB); the
//! vocabulary links no calm crate, and the edges (data plane, mount, client, wire) link no
//! namespace engine.

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

/// The vocabulary every crate speaks links no other calm crate: only its error derive.
#[test]
fn the_vocabulary_depends_on_no_calm_crate() {
    let tree = dependencies_of("calm-types");
    let calm: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with("calm-") && *name != "calm-types")
        .collect();
    assert!(
        calm.is_empty(),
        "calm-types must not depend on {calm:?}:\n{tree}"
    );
    assert_absent("calm-types", &["tokio", "libc", "heed", "prost", "tonic"]);
}

/// The data plane, the mount, the client and the wire speak the vocabulary, not the engine:
/// none links the namespace, a metadata store or the group committer.
#[test]
fn the_edges_link_no_namespace_engine_and_no_store() {
    for krate in ["calm-data", "calm-fuse", "calm-client", "calm-proto"] {
        assert_absent(
            krate,
            &["calm-meta", "calm-store", "calm-store-etcd", "heed"],
        );
    }
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
