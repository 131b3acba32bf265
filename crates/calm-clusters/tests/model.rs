//! A namespace over three clusters against the same namespace on one store, on random
//! operations by path: every answer must be the one-store answer, except a rename or link
//! between two clusters, which must be refused with EXDEV (and only such a one); at the end
//! both trees must be equal name by name, every inode must sit on the cluster of its root name,
//! and every cluster's store must pass fsck.

use std::sync::Arc;

use calm_clusters::Clusters;
use calm_meta::ops::{Done, Op};
use calm_meta::place::cluster_of;
use calm_meta::{Caller, Handle, Kind, MetaError, MetaOptions, NewNode, ROOT, SetAttr, fsck};
use calm_store::mem::MemStore;
use calm_store::{ReadTxn, Store};
use proptest::prelude::*;

const EXDEV: i32 = 18;
/// Names in the root: enough that three clusters each get some.
const ROOT_NAMES: &[&str] = &["a", "b", "c", "d", "e", "f"];
const NAMES: &[&str] = &["x", "y", "z"];

#[derive(Debug, Clone)]
enum Action {
    Mkdir(Vec<String>),
    Create(Vec<String>),
    Symlink(Vec<String>),
    Unlink(Vec<String>),
    Rmdir(Vec<String>),
    Rename(Vec<String>, Vec<String>),
    Link(Vec<String>, Vec<String>),
    Truncate(Vec<String>, u64),
}

fn path() -> impl Strategy<Value = Vec<String>> {
    (
        prop::sample::select(ROOT_NAMES),
        prop::collection::vec(prop::sample::select(NAMES), 0..2),
    )
        .prop_map(|(first, rest)| {
            std::iter::once(first)
                .chain(rest)
                .map(str::to_string)
                .collect()
        })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => path().prop_map(Action::Mkdir),
        4 => path().prop_map(Action::Create),
        1 => path().prop_map(Action::Symlink),
        2 => path().prop_map(Action::Unlink),
        2 => path().prop_map(Action::Rmdir),
        3 => (path(), path()).prop_map(|(a, b)| Action::Rename(a, b)),
        1 => (path(), path()).prop_map(|(a, b)| Action::Link(a, b)),
        1 => (path(), 0..10_000u64).prop_map(|(a, size)| Action::Truncate(a, size)),
    ]
}

type Ns = Clusters<Arc<MemStore>>;

fn errno(error: MetaError) -> i32 {
    error.errno()
}

/// The parent directory's handle and the last name of `path`.
fn parent_of(ns: &Ns, path: &[String]) -> Result<(Handle, Vec<u8>), i32> {
    let mut dir = ROOT;
    for name in &path[..path.len() - 1] {
        dir = ns
            .lookup_as(&Caller::default(), dir, name.as_bytes())
            .map_err(errno)?
            .handle;
    }
    Ok((dir, path[path.len() - 1].as_bytes().to_vec()))
}

fn handle_of(ns: &Ns, path: &[String]) -> Result<Handle, i32> {
    let (dir, name) = parent_of(ns, path)?;
    Ok(ns
        .lookup_as(&Caller::default(), dir, &name)
        .map_err(errno)?
        .handle)
}

/// The operation of `action` on `ns`, or the errno of resolving its paths.
fn op_of(ns: &Ns, action: &Action) -> Result<Op, i32> {
    Ok(match action {
        Action::Mkdir(p) | Action::Create(p) | Action::Symlink(p) => {
            let (parent, name) = parent_of(ns, p)?;
            let node = match action {
                Action::Mkdir(_) => NewNode::dir(0o755, 0, 0),
                Action::Create(_) => NewNode::file(0o644, 0, 0),
                _ => NewNode::symlink(b"target", 0, 0),
            };
            Op::Make {
                parent,
                name,
                node,
                exclusive: true,
            }
        }
        Action::Unlink(p) => {
            let (parent, name) = parent_of(ns, p)?;
            Op::Unlink {
                parent,
                name,
                keep: Vec::new(),
            }
        }
        Action::Rmdir(p) => {
            let (parent, name) = parent_of(ns, p)?;
            Op::Rmdir { parent, name }
        }
        Action::Rename(from, to) => {
            let (parent, name) = parent_of(ns, from)?;
            let (new_parent, new_name) = parent_of(ns, to)?;
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags: 0,
                keep: Vec::new(),
            }
        }
        Action::Link(from, to) => {
            let handle = handle_of(ns, from)?;
            let (parent, name) = parent_of(ns, to)?;
            Op::Link {
                handle,
                parent,
                name,
            }
        }
        Action::Truncate(p, size) => Op::SetAttr {
            handle: handle_of(ns, p)?,
            attr: SetAttr {
                size: Some(*size),
                ..SetAttr::default()
            },
        },
    })
}

/// What `action` answers on `ns`: success, or an errno.
async fn run(ns: &Ns, action: &Action) -> Result<(), i32> {
    let op = op_of(ns, action)?;
    match ns.apply_as(Caller::default(), op).await {
        Ok(Done::Attr(_) | Done::Nothing) => Ok(()),
        Ok(other) => panic!("unexpected answer {other:?}"),
        Err(error) => Err(errno(error)),
    }
}

/// Whether `action` joins names on two clusters of `ns` (its paths resolved there).
fn crosses(ns: &Ns, action: &Action) -> bool {
    let (a, b) = match action {
        Action::Rename(a, b) | Action::Link(a, b) => (a, b),
        _ => return false,
    };
    let cluster = |p: &[String]| {
        let (parent, name) = parent_of(ns, p).expect("resolved");
        ns.cluster_of_name(parent, &name).expect("cluster")
    };
    cluster(a) != cluster(b)
}

/// Every name under `dir`, as (path, kind, size for files, nlink, symlink target), sorted; and
/// checks that every handle is on `cluster` when given (below a root name).
fn tree(ns: &Ns, dir: Handle, prefix: &str, cluster: Option<usize>, out: &mut Vec<String>) {
    let mut cookie = 0;
    loop {
        let page = ns
            .readdir_plus_as(&Caller::default(), dir, cookie, 3)
            .expect("readdir");
        let Some(last) = page.last() else { break };
        cookie = last.0.cookie;
        for (entry, attr) in page {
            let attr = attr.expect("root may search");
            let name = String::from_utf8(entry.name.clone()).unwrap();
            let path = format!("{prefix}/{name}");
            let on = cluster.unwrap_or_else(|| cluster_of(attr.handle));
            assert_eq!(
                cluster_of(attr.handle),
                on,
                "{path} is not on its root name's cluster"
            );
            let size = if attr.kind == Kind::File {
                attr.size
            } else {
                0
            };
            let target = match attr.kind {
                Kind::Symlink => String::from_utf8(ns.readlink(attr.handle).unwrap()).unwrap(),
                _ => String::new(),
            };
            out.push(format!(
                "{path} {:?} size={size} nlink={} {target}",
                attr.kind, attr.nlink
            ));
            if attr.kind == Kind::Dir {
                tree(ns, attr.handle, &path, Some(on), out);
            }
        }
    }
}

fn namespace(count: usize) -> (Ns, Vec<Arc<MemStore>>) {
    let stores: Vec<_> = (0..count).map(|_| Arc::new(MemStore::new())).collect();
    let ns = Clusters::open(stores.clone(), MetaOptions::default()).expect("open");
    (ns, stores)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn three_clusters_answer_as_one_store(actions in prop::collection::vec(action(), 1..120)) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (many, stores) = namespace(3);
            let (one, _) = namespace(1);
            for action in &actions {
                let crossing = op_of(&many, action).is_ok() && crosses(&many, action);
                let answer = run(&many, action).await;
                if answer == Err(EXDEV) {
                    prop_assert!(crossing, "EXDEV for {action:?}, which stays on one cluster");
                    continue;
                }
                prop_assert!(!crossing, "{:?} crosses clusters and answered {:?}", action, answer);
                let expected = run(&one, action).await;
                prop_assert_eq!(answer, expected, "{:?}", action);
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            tree(&many, ROOT, "", None, &mut a);
            tree(&one, ROOT, "", None, &mut b);
            a.sort();
            b.sort();
            prop_assert_eq!(a, b);
            let (root_many, root_one) = (many.getattr(ROOT).unwrap(), one.getattr(ROOT).unwrap());
            prop_assert_eq!(root_many.nlink, root_one.nlink);
            prop_assert_eq!(many.statfs().unwrap().inodes, one.statfs().unwrap().inodes);
            drop(many);
            for store in &stores {
                let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
                prop_assert!(report.is_clean(), "fsck: {:?}", report.problems);
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn root_names_spread_over_every_cluster_and_list_as_one_directory() {
    let (ns, _stores) = namespace(3);
    let mut on = [0usize; 3];
    for i in 0..300 {
        let name = format!("dir{i}");
        let attr = ns
            .apply_as(
                Caller::default(),
                Op::Make {
                    parent: ROOT,
                    name: name.clone().into_bytes(),
                    node: NewNode::dir(0o755, 0, 0),
                    exclusive: true,
                },
            )
            .await
            .unwrap();
        let Done::Attr(attr) = attr else {
            panic!("a make answers attributes")
        };
        assert_eq!(
            cluster_of(attr.handle),
            ns.cluster_of_name(ROOT, name.as_bytes()).unwrap()
        );
        on[cluster_of(attr.handle)] += 1;
    }
    assert!(on.iter().all(|n| *n >= 60), "300 names spread as {on:?}");
    // Listed in pages of 7: each name once.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let page = ns.readdir_as(&Caller::default(), ROOT, cookie, 7).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        seen.extend(page.into_iter().map(|e| e.name));
    }
    seen.sort();
    let mut expected: Vec<Vec<u8>> = (0..300).map(|i| format!("dir{i}").into_bytes()).collect();
    expected.sort();
    assert_eq!(seen, expected);
    let root = ns.getattr(ROOT).unwrap();
    assert_eq!(root.nlink, 302);
    assert_eq!(ns.statfs().unwrap().inodes, 301);
    // The root's attributes stay.
    let chmod = ns
        .apply_as(
            Caller::default(),
            Op::SetAttr {
                handle: ROOT,
                attr: SetAttr {
                    mode: Some(0o700),
                    ..SetAttr::default()
                },
            },
        )
        .await;
    assert_eq!(chmod.unwrap_err().errno(), 1);
}

#[test]
fn clusters_are_opened_in_their_order_or_not_at_all() {
    let stores: Vec<_> = (0..3).map(|_| Arc::new(MemStore::new())).collect();
    drop(Clusters::open(stores.clone(), MetaOptions::default()).unwrap());
    // Again, in order: fine.
    drop(Clusters::open(stores.clone(), MetaOptions::default()).unwrap());
    // Swapped, alone, with fewer, or with another namespace's cluster: refused.
    let swapped = vec![stores[1].clone(), stores[0].clone(), stores[2].clone()];
    let error = Clusters::open(swapped, MetaOptions::default()).unwrap_err();
    assert!(error.to_string().contains("cluster 1 of 3"), "{error}");
    let alone = Clusters::open(vec![stores[0].clone()], MetaOptions::default()).unwrap_err();
    assert!(
        alone.to_string().contains("open it with the others"),
        "{alone}"
    );
    let fewer = Clusters::open(stores[..2].to_vec(), MetaOptions::default()).unwrap_err();
    assert!(fewer.to_string().contains("cluster 0 of 3"), "{fewer}");
    let other: Vec<_> = (0..3).map(|_| Arc::new(MemStore::new())).collect();
    drop(Clusters::open(other.clone(), MetaOptions::default()).unwrap());
    let mixed = vec![stores[0].clone(), other[1].clone(), stores[2].clone()];
    let error = Clusters::open(mixed, MetaOptions::default()).unwrap_err();
    assert!(error.to_string().contains("another namespace"), "{error}");
    // A namespace made on one store does not become a cluster of several.
    let single = Arc::new(MemStore::new());
    drop(Clusters::open(vec![single.clone()], MetaOptions::default()).unwrap());
    let grown = vec![single, Arc::new(MemStore::new())];
    let error = Clusters::open(grown, MetaOptions::default()).unwrap_err();
    assert!(
        error.to_string().contains("cannot become cluster 0 of 2"),
        "{error}"
    );
}

#[tokio::test]
async fn fsck_finds_an_inode_out_of_its_clusters_range() {
    use calm_store::WriteTxn;
    let (ns, stores) = namespace(2);
    let name = (0..)
        .map(|i| format!("dir{i}").into_bytes())
        .find(|name| ns.cluster_of_name(ROOT, name).unwrap() == 1)
        .unwrap();
    let op = Op::Make {
        parent: ROOT,
        name,
        node: NewNode::dir(0o755, 0, 0),
        exclusive: true,
    };
    let Done::Attr(attr) = ns.apply_as(Caller::default(), op).await.unwrap() else {
        panic!("a make answers attributes")
    };
    drop(ns);
    for store in &stores {
        let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
        assert!(report.is_clean(), "fsck: {:?}", report.problems);
    }
    // Cluster 1's inode, copied into cluster 0's store.
    let key = [&[b'I'][..], &attr.handle.to_be_bytes()].concat();
    let value = stores[1]
        .snapshot()
        .unwrap()
        .get(&key)
        .unwrap()
        .unwrap()
        .into_owned();
    let mut txn = stores[0].begin().unwrap();
    txn.put(&key, &value).unwrap();
    txn.commit().unwrap();
    let report = fsck::check(&stores[0].snapshot().unwrap(), &mut |_| {}).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("handles of cluster 1 in the store of cluster 0")),
        "fsck: {:?}",
        report.problems
    );
}
