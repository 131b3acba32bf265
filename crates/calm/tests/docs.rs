//! The docs name files that exist: every path a page of `README.md`, `ARCHITECTURE.md`,
//! `docs/design/`, `docs/operations/` or the benchmark index names in backquotes
//! (`crates/…`, `docs/…`, `scripts/…`, a source file by the tail of its path such as
//! `holds/gate.rs`) is a file or a directory of the repository, and every relative link of
//! theirs leads to one. A file moved without its docs fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file and directory of the repository (its build output and git's aside), as paths
/// relative to its root.
fn repository_paths(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if ["target", ".git", "calm-data", "calm-mnt"].contains(&relative.as_str()) {
                continue;
            }
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.insert(relative);
        }
    }
    out
}

/// The pages whose paths are checked.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("docs/benchmarks/README.md"),
    ];
    for dir in ["docs/design", "docs/operations"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("a docs directory") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The extensions of the files a page may name by the tail of their path.
const FILE_ENDINGS: [&str; 8] = [
    ".rs", ".md", ".proto", ".toml", ".yml", ".sh", ".py", ".txt",
];

/// The directories a path named from the repository's root starts with.
const ROOTS: [&str; 5] = ["crates/", "docs/", "scripts/", "third_party/", ".config/"];

/// The paths a page names in backquotes: a word that starts at one of [`ROOTS`], or that
/// has a `/` and ends in one of [`FILE_ENDINGS`] (what follows a `:` or a space, such as a
/// line or a function, is not part of it; URLs, globs and placeholders are not paths).
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, quoted) in text.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        for word in quoted.split_whitespace() {
            let word = word.split(':').next().unwrap_or("");
            let word = word.trim_end_matches([',', '.', ')', ';']);
            let rooted = ROOTS.iter().any(|r| word.starts_with(r));
            let file = word.contains('/') && FILE_ENDINGS.iter().any(|e| word.ends_with(e));
            let placeholder = word.contains(['*', '<', '>', '{', '}', '…', '$', '?', '='])
                || word.contains("://")
                || word.contains("..");
            if (rooted || file) && !placeholder {
                out.push(word.trim_end_matches('/').to_string());
            }
        }
    }
    out
}

/// The relative targets of a page's markdown links (`[text](target)`), without their anchors.
fn linked_paths(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap_or("").to_string())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

/// Whether `named` is a path of the repository: from its root, or the tail of one.
fn exists(named: &str, paths: &BTreeSet<String>) -> bool {
    paths.contains(named) || paths.iter().any(|p| p.ends_with(&format!("/{named}")))
}

#[test]
fn the_path_finder_finds_paths_and_skips_the_rest() {
    let text = "see `crates/calm-meta/src/commit.rs` and `holds/gate.rs: Gate`, \
                `calm serve --data DIR`, `s3://bucket/x.md`, `docs/*.md` and `a/b`";
    assert_eq!(
        named_paths(text),
        ["crates/calm-meta/src/commit.rs", "holds/gate.rs"]
    );
    let paths = BTreeSet::from(["crates/calm-server/src/holds/gate.rs".to_string()]);
    assert!(exists("holds/gate.rs", &paths));
    assert!(!exists("holds/gone.rs", &paths));
    assert_eq!(
        linked_paths("[a](2026-12-07/x/README.md#y), [b](https://e.org/z)"),
        ["2026-12-07/x/README.md"]
    );
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = repository();
    let paths = repository_paths(&root);
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in pages(&root) {
        let text = std::fs::read_to_string(&page).expect("read a page");
        let shown = page.strip_prefix(&root).unwrap().display().to_string();
        for named in named_paths(&text) {
            checked += 1;
            if !exists(&named, &paths) {
                missing.push(format!("{shown}: `{named}`"));
            }
        }
        for target in linked_paths(&text) {
            checked += 1;
            if !page.parent().unwrap().join(&target).exists() {
                missing.push(format!("{shown}: a link to {target}"));
            }
        }
    }
    // The pages do name files (a finder that found nothing would pass anything).
    assert!(checked > 200, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "paths the docs name that are not in the repository:\n{}",
        missing.join("\n")
    );
}
