//! The dependency rules of ARCHITECTURE.md, enforced: the store seam knows no async runtime
//! and no wire; the namespace knows no wire, no server, no CLI; the wire, the client and the
//! server link no store backend (only the binary and the benchmarks choose LMDB); the
//! vocabulary links no calm crate, and the edges (data plane, mount, client, wire) link no
//! namespace engine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `cargo tree ARGS…` of the workspace, offline: its output.
fn cargo_tree(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked"])
        .args(args)
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

fn dependencies_of(krate: &str) -> String {
    cargo_tree(&["-e", "normal", "--prefix", "none", "-p", krate])
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

/// The calm crates a `cargo tree` names (the root's own included), in order.
fn calm_crates_in(tree: &str) -> Vec<&str> {
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with("calm-"))
        .collect();
    names.into_iter().collect()
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

/// The lock-free parts need no calm crate (of the rest, only tokio's one-shot channel).
#[test]
fn the_lock_free_parts_need_no_calm_crate() {
    let tree = dependencies_of("calm-lockfree");
    assert_eq!(calm_crates_in(&tree), ["calm-lockfree"], "{tree}");
    assert_absent(
        "calm-lockfree",
        &["libc", "heed", "prost", "tonic", "hyper"],
    );
}

/// The permission rules and ACLs need the vocabulary and nothing else.
#[test]
fn the_permission_rules_need_only_the_vocabulary() {
    let tree = dependencies_of("calm-perm");
    assert_eq!(calm_crates_in(&tree), ["calm-perm", "calm-types"], "{tree}");
    assert_absent("calm-perm", &["tokio", "libc", "heed", "prost", "tonic"]);
}

/// The vocabulary every crate speaks links no other calm crate: only its error derive.
#[test]
fn the_vocabulary_depends_on_no_calm_crate() {
    let tree = dependencies_of("calm-types");
    let calm = calm_crates_in(&tree);
    assert_eq!(
        calm,
        ["calm-types"],
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
    // The upkeep knows no wire and no identity: the server decides who may ask for it.
    assert_absent(
        "calm-upkeep",
        &[
            "heed",
            "tonic",
            "prost",
            "calm-proto",
            "calm-server",
            "clap",
        ],
    );
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

/// What a site runs links no benchmark and no test harness, and cannot turn a check off: the
/// `calm` binary depends neither on the benchmarks nor on the test kit, nor on the build of the
/// permission rules that a benchmark can turn off (with the features cargo resolves for the
/// binary alone).
#[test]
fn the_product_links_no_benchmark_and_no_switch_that_turns_checks_off() {
    assert_absent("calm", &["calm-bench", "plotters", "calm-testkit"]);
    // No library a site runs carries the test kit (its harnesses are for tests).
    for krate in [
        "calm-store",
        "calm-store-etcd",
        "calm-meta",
        "calm-server",
        "calm-upkeep",
        "calm-client",
        "calm-fuse",
        "calm-data",
        "calm-node",
        "calm-proto",
    ] {
        assert_absent(krate, &["calm-testkit"]);
    }
    // The features of the permission rules as each build resolves them: the benchmark's build
    // with the switch has the feature (so the check below can see it), the binary has not.
    let features_of_rules =
        |args: &[&str]| cargo_tree(&[&["-e", "features", "-i", "calm-perm"], args].concat());
    const SWITCH: &str = "calm-perm feature \"checks-off-for-benchmark\"";
    let bench = features_of_rules(&["-p", "calm-bench", "--features", "check-cost"]);
    assert!(bench.contains(SWITCH), "{bench}");
    let calm = features_of_rules(&["-p", "calm"]);
    assert!(
        !calm.contains(SWITCH),
        "the calm binary must not be built with the switch that turns checks off:\n{calm}"
    );
}

/// The source files of every crate of the workspace: (crate directory name, path under its
/// `src/`, text).
fn workspace_sources() -> Vec<(String, PathBuf, String)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for krate in std::fs::read_dir(&crates).expect("read crates/") {
        let krate = krate.expect("crate entry").path();
        let src = krate.join("src");
        if !src.is_dir() {
            continue;
        }
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src/") {
                let path = entry.expect("src entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("read source");
                    out.push((
                        name.clone(),
                        path.strip_prefix(&src).unwrap().to_path_buf(),
                        text,
                    ));
                }
            }
        }
    }
    out.sort();
    out
}

/// A file's code without its unit tests (the `#[cfg(test)]` module at its end) and without
/// comment lines (a doc link is not a dependency).
fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[..code_of_lines(text)]
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of a source file (`ops/rename.rs` → `ops::rename`, `ops/mod.rs` → `ops`);
/// empty for the crate root.
fn module_of(path: &Path) -> Vec<String> {
    let mut parts: Vec<String> = path
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// Every `prefix::a::b…` path in `code`, as its segments after the prefix.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let ident: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if ident.is_empty() {
                break;
            }
            tail = &tail[ident.len()..];
            segments.push(ident);
            match tail.strip_prefix("::") {
                Some(t) => tail = t,
                None => break,
            }
        }
        // `crate::{a, b::c}`: each member of a group.
        if segments.is_empty() && tail.starts_with('{') {
            let group: String = tail[1..].chars().take_while(|c| *c != '}').collect();
            for member in group.split(',') {
                let first: String = member
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !first.is_empty() {
                    out.push(vec![first]);
                }
            }
        } else if !segments.is_empty() {
            out.push(segments);
        }
    }
    out
}

/// The module-use graph of one crate: an edge from each module to every other module whose
/// items its code names (`crate::…`, `super::…`, `self::…`, or a child module by name). The
/// crate root is left out: it declares the modules and re-exports their items.
fn module_graph(files: &[(PathBuf, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(p, _)| module_of(p)).collect();
    // The longest module that is a prefix of `path`.
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains(p))
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in files {
        let from = module_of(path);
        if from.is_empty() {
            continue;
        }
        let code = code_of(text);
        let mut targets = Vec::new();
        for p in paths_after(&code, "crate::") {
            targets.extend(resolve(&p));
        }
        let parent = &from[..from.len() - 1];
        for p in paths_after(&code, "super::") {
            let mut full = parent.to_vec();
            full.extend(p);
            targets.extend(resolve(&full).or(Some(parent.to_vec())));
        }
        for p in paths_after(&code, "self::") {
            let mut full = from.clone();
            full.extend(p);
            targets.extend(resolve(&full));
        }
        for child in modules.iter().filter(|m| m.len() == from.len() + 1) {
            if child[..from.len()] == from[..]
                && !paths_after(&code, &format!("{}::", child[from.len()])).is_empty()
            {
                targets.push(child.clone());
            }
        }
        let node = graph.entry(from.join("::")).or_default();
        for target in targets {
            if !target.is_empty() && target != from {
                node.insert(target.join("::"));
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// Every module cycle of the workspace, as `crate: a, b, c`.
fn workspace_cycles() -> Vec<String> {
    let mut by_crate: BTreeMap<String, Vec<(PathBuf, String)>> = BTreeMap::new();
    for (krate, path, text) in workspace_sources() {
        by_crate.entry(krate).or_default().push((path, text));
    }
    let mut out = Vec::new();
    for (krate, files) in &by_crate {
        for cycle in cycles(&module_graph(files)) {
            out.push(format!("{krate}: {}", cycle.join(", ")));
        }
    }
    out
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_passes_a_tree() {
    let tree = [
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a.rs", "use crate::b::X;\nuse crate::c::Y;"),
        ("b.rs", "use crate::c::{Y, Z};\n// crate::a::W in a comment"),
        (
            "c.rs",
            "pub struct Y;\n#[cfg(test)]\nmod tests {\n use crate::a::X;\n}",
        ),
    ];
    let files = |set: &[(&str, &str)]| -> Vec<(PathBuf, String)> {
        set.iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    };
    assert_eq!(
        cycles(&module_graph(&files(&tree))),
        Vec::<Vec<String>>::new()
    );
    let circle = [
        ("lib.rs", "mod ops;"),
        ("ops/mod.rs", "mod rename;\npub fn f() { rename::g() }"),
        ("ops/rename.rs", "use super::Ctx;"),
        ("layout.rs", "fn h(_: crate::ops::Ctx) {}"),
        ("perm.rs", "use crate::{layout, ops::rename};"),
    ];
    assert_eq!(
        cycles(&module_graph(&files(&circle))),
        vec![vec!["ops".to_string(), "ops::rename".to_string()]]
    );
}

/// Modules inside every crate form a tree: shared types at the bottom, what uses them above,
/// never a circle (a module that names another's items, by `crate::`, `super::` or a child's
/// name, in its code outside its unit tests).
#[test]
fn no_module_cycle_in_any_crate() {
    let cycles = workspace_cycles();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// Most lines of a source file's code (its unit tests aside): a longer file holds more than one
/// concern and is split by concern.
const SOURCE_LINES_MAX: usize = 800;

#[test]
fn no_source_file_grows_past_800_lines() {
    let long: Vec<String> = workspace_sources()
        .into_iter()
        .filter_map(|(krate, path, text)| {
            let lines = code_of_lines(&text);
            (lines > SOURCE_LINES_MAX).then(|| {
                format!(
                    "{krate}/src/{}: {lines} lines, more than {SOURCE_LINES_MAX}: split it by concern",
                    path.display()
                )
            })
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// Lines of a file before its unit-test module.
fn code_of_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len())
}

/// Most lines of a function outside tests, from `fn` to its closing brace: a longer one does
/// several things, and is split into functions that each do one.
const FUNCTION_LINES_MAX: usize = 80;

/// The functions longer than [`FUNCTION_LINES_MAX`] when the rule came, with their length
/// then: each may only shrink, and leaves the list once it is within the rule.
const LONG_FUNCTIONS: &str = include_str!("long_functions.txt");

/// A function of the workspace's sources: where it is, its name (`Type::name` in an impl or
/// a trait), its length in lines.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Function {
    place: String,
    name: String,
    lines: usize,
}

/// Collects the functions of one file that are not tests, with their lengths.
struct Functions<'a> {
    place: &'a str,
    owner: Vec<String>,
    found: Vec<Function>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        path.is_ident("test")
            || (path.is_ident("cfg")
                && a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident("test")))
    })
}

impl Functions<'_> {
    fn add(&mut self, name: &syn::Ident, from: proc_macro2::Span, to: proc_macro2::Span) {
        let lines = to.end().line + 1 - from.start().line;
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{name}"),
            None => name.to_string(),
        };
        self.found.push(Function {
            place: self.place.to_string(),
            name,
            lines,
        });
    }
}

impl<'ast> syn::visit::Visit<'ast> for Functions<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            use syn::spanned::Spanned;
            self.add(&item.sig.ident, item.sig.span(), item.block.span());
            syn::visit::visit_item_fn(self, item);
        }
    }
    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if is_test(&item.attrs) {
            return;
        }
        let owner = match &*item.self_ty {
            syn::Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        self.owner.push(owner.unwrap_or_else(|| "impl".to_string()));
        syn::visit::visit_item_impl(self, item);
        self.owner.pop();
    }
    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            use syn::spanned::Spanned;
            self.add(&item.sig.ident, item.sig.span(), item.block.span());
            syn::visit::visit_impl_item_fn(self, item);
        }
    }
    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        self.owner.push(item.ident.to_string());
        syn::visit::visit_item_trait(self, item);
        self.owner.pop();
    }
    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            use syn::spanned::Spanned;
            self.add(&item.sig.ident, item.sig.span(), block.span());
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

/// Every function of the workspace's sources outside tests.
fn workspace_functions() -> Vec<Function> {
    let mut all = Vec::new();
    for (krate, path, text) in workspace_sources() {
        let place = format!("{krate}/src/{}", path.display());
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{place}: {e}"));
        let mut functions = Functions {
            place: &place,
            owner: Vec::new(),
            found: Vec::new(),
        };
        syn::visit::Visit::visit_file(&mut functions, &file);
        all.extend(functions.found);
    }
    all
}

/// The allow-list: (place, name) → lines.
fn long_functions_allowed() -> BTreeMap<(String, String), usize> {
    LONG_FUNCTIONS
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace();
            let lines = words.next().and_then(|w| w.parse().ok());
            let place = words.next();
            let name = words.next();
            match (lines, place, name) {
                (Some(lines), Some(place), Some(name)) => {
                    ((place.to_string(), name.to_string()), lines)
                }
                _ => panic!("long_functions.txt: `{l}` is not `LINES PLACE NAME`"),
            }
        })
        .collect()
}

/// What breaks the rule: a function over the limit that is not on the list, or longer than
/// the list says; a listed one that is gone or within the limit (take it off the list).
fn function_rule_breaks(
    functions: &[Function],
    allowed: &BTreeMap<(String, String), usize>,
) -> Vec<String> {
    let mut breaks = Vec::new();
    let mut seen = BTreeSet::new();
    for f in functions.iter().filter(|f| f.lines > FUNCTION_LINES_MAX) {
        let key = (f.place.clone(), f.name.clone());
        match allowed.get(&key) {
            None => breaks.push(format!(
                "{} {}: {} lines, more than {FUNCTION_LINES_MAX}: split it",
                f.place, f.name, f.lines
            )),
            Some(&was) if f.lines > was => breaks.push(format!(
                "{} {}: {} lines, listed at {was}: a long function may only shrink",
                f.place, f.name, f.lines
            )),
            Some(_) => {}
        }
        seen.insert(key);
    }
    for (place, name) in allowed.keys() {
        if !seen.contains(&(place.clone(), name.clone())) {
            breaks.push(format!(
                "{place} {name}: listed in long_functions.txt but gone or within \
                 {FUNCTION_LINES_MAX} lines: take it off the list"
            ));
        }
    }
    breaks
}

#[test]
fn the_length_rule_finds_a_long_function_and_passes_short_ones() {
    let mut body = String::from("fn short() {}\nimpl Thing {\n    fn long(&self) {\n");
    for i in 0..FUNCTION_LINES_MAX {
        body.push_str(&format!("        let _x{i} = {i};\n"));
    }
    body.push_str("    }\n}\n#[cfg(test)]\nmod tests {\n    fn also_long() {\n");
    body.push_str(&"        let _ = 1;\n".repeat(FUNCTION_LINES_MAX));
    body.push_str("    }\n}\n");
    let file = syn::parse_file(&body).unwrap();
    let mut functions = Functions {
        place: "x/src/lib.rs",
        owner: Vec::new(),
        found: Vec::new(),
    };
    syn::visit::Visit::visit_file(&mut functions, &file);
    let found = functions.found;
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[1].name, "Thing::long");
    assert_eq!(found[1].lines, FUNCTION_LINES_MAX + 2);
    let none = BTreeMap::new();
    assert_eq!(function_rule_breaks(&found, &none).len(), 1);
    let listed = BTreeMap::from([(
        ("x/src/lib.rs".to_string(), "Thing::long".to_string()),
        FUNCTION_LINES_MAX + 2,
    )]);
    assert!(function_rule_breaks(&found, &listed).is_empty());
    let shrunk = BTreeMap::from([(
        ("x/src/lib.rs".to_string(), "Thing::long".to_string()),
        FUNCTION_LINES_MAX + 1,
    )]);
    assert_eq!(function_rule_breaks(&found, &shrunk).len(), 1);
    let stale = BTreeMap::from([(("x/src/lib.rs".to_string(), "short".to_string()), 90)]);
    assert_eq!(function_rule_breaks(&found, &stale).len(), 2);
}

#[test]
fn no_function_grows_past_80_lines() {
    let breaks = function_rule_breaks(&workspace_functions(), &long_functions_allowed());
    assert!(breaks.is_empty(), "{}", breaks.join("\n"));
}
