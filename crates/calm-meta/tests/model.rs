//! Model-based test of the namespace: random operations run on the real `Meta` (over the
//! in-memory store) and on a small, obviously correct tree side by side. Every answer (the
//! attributes or the errno) must agree; an operation that fails must leave the store byte for
//! byte unchanged; at the end both trees must be equal and fsck must find nothing.

use std::collections::BTreeMap;

use calm_meta::fsck;
use calm_meta::*;
use calm_store::Store;
use calm_store::mem::MemStore;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct MNode {
    kind: Kind,
    nlink: u32,
    size: u64,
    parent: Handle,
    children: BTreeMap<Vec<u8>, Handle>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The model: a map of handles to nodes, with the rules written as plainly as possible.
#[derive(Debug, Clone)]
struct Model {
    nodes: BTreeMap<Handle, MNode>,
}

type Answer = Result<(), i32>;

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;
const ENODATA: i32 = 61;
const EPERM: i32 = 1;

impl Model {
    fn new() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, MNode::new(Kind::Dir, ROOT));
        Model { nodes }
    }

    fn dir(&self, h: Handle) -> Result<&MNode, i32> {
        match self.nodes.get(&h) {
            None => Err(ENOENT),
            Some(n) if n.kind != Kind::Dir => Err(ENOTDIR),
            Some(n) => Ok(n),
        }
    }

    fn child(&self, dir: Handle, name: &[u8]) -> Result<Handle, i32> {
        self.dir(dir)?.children.get(name).copied().ok_or(ENOENT)
    }

    fn is_under(&self, dir: Handle, maybe_ancestor: Handle) -> bool {
        let mut at = dir;
        loop {
            if at == maybe_ancestor {
                return true;
            }
            if at == ROOT {
                return false;
            }
            at = self.nodes[&at].parent;
        }
    }

    fn make(&mut self, parent: Handle, name: &[u8]) -> Result<(), i32> {
        let dir = self.dir(parent)?;
        if dir.children.contains_key(name) {
            return Err(EEXIST);
        }
        Ok(())
    }

    fn add(&mut self, parent: Handle, name: &[u8], handle: Handle, kind: Kind) {
        self.nodes.insert(
            handle,
            MNode::new(kind, if kind == Kind::Dir { parent } else { 0 }),
        );
        let dir = self.nodes.get_mut(&parent).unwrap();
        dir.children.insert(name.to_vec(), handle);
        if kind == Kind::Dir {
            dir.nlink += 1;
        }
    }

    fn drop_name(&mut self, parent: Handle, name: &[u8]) {
        let h = self
            .nodes
            .get_mut(&parent)
            .unwrap()
            .children
            .remove(name)
            .unwrap();
        let node = self.nodes.get_mut(&h).unwrap();
        if node.kind == Kind::Dir {
            self.nodes.remove(&h);
            self.nodes.get_mut(&parent).unwrap().nlink -= 1;
        } else {
            node.nlink -= 1;
            if node.nlink == 0 {
                self.nodes.remove(&h);
            }
        }
    }

    fn unlink(&mut self, parent: Handle, name: &[u8]) -> Answer {
        let h = self.child(parent, name)?;
        if self.nodes[&h].kind == Kind::Dir {
            return Err(EISDIR);
        }
        self.drop_name(parent, name);
        Ok(())
    }

    fn rmdir(&mut self, parent: Handle, name: &[u8]) -> Answer {
        let h = self.child(parent, name)?;
        if self.nodes[&h].kind != Kind::Dir {
            return Err(ENOTDIR);
        }
        if !self.nodes[&h].children.is_empty() {
            return Err(ENOTEMPTY);
        }
        self.drop_name(parent, name);
        Ok(())
    }

    fn link(&mut self, h: Handle, parent: Handle, name: &[u8]) -> Answer {
        let node = self.nodes.get(&h).ok_or(ENOENT)?;
        if node.kind == Kind::Dir {
            return Err(EPERM);
        }
        if self.dir(parent)?.children.contains_key(name) {
            return Err(EEXIST);
        }
        self.nodes
            .get_mut(&parent)
            .unwrap()
            .children
            .insert(name.to_vec(), h);
        self.nodes.get_mut(&h).unwrap().nlink += 1;
        Ok(())
    }

    fn rename(&mut self, sp: Handle, sname: &[u8], dp: Handle, dname: &[u8], flags: u32) -> Answer {
        self.dir(sp)?;
        self.dir(dp)?;
        let s = self.child(sp, sname)?;
        let d = self.nodes[&dp].children.get(dname).copied();
        let exchange = flags == RENAME_EXCHANGE;
        if exchange && d.is_none() {
            return Err(ENOENT);
        }
        if sp == dp && sname == dname {
            return Ok(());
        }
        if d == Some(s) {
            return Ok(());
        }
        if flags == RENAME_NOREPLACE && d.is_some() {
            return Err(EEXIST);
        }
        let s_dir = self.nodes[&s].kind == Kind::Dir;
        let d_dir = d.is_some_and(|d| self.nodes[&d].kind == Kind::Dir);
        if let (Some(d), false) = (d, exchange) {
            if s_dir && !d_dir {
                return Err(ENOTDIR);
            }
            if !s_dir && d_dir {
                return Err(EISDIR);
            }
            if d_dir && !self.nodes[&d].children.is_empty() {
                return Err(ENOTEMPTY);
            }
        }
        if s_dir && self.is_under(dp, s) {
            return Err(EINVAL);
        }
        if exchange && d_dir && self.is_under(sp, d.unwrap()) {
            return Err(EINVAL);
        }
        if exchange {
            let d = d.unwrap();
            self.nodes
                .get_mut(&sp)
                .unwrap()
                .children
                .insert(sname.to_vec(), d);
            self.nodes
                .get_mut(&dp)
                .unwrap()
                .children
                .insert(dname.to_vec(), s);
            if s_dir {
                self.nodes.get_mut(&s).unwrap().parent = dp;
                self.nodes.get_mut(&sp).unwrap().nlink -= 1;
                self.nodes.get_mut(&dp).unwrap().nlink += 1;
            }
            if d_dir {
                self.nodes.get_mut(&d).unwrap().parent = sp;
                self.nodes.get_mut(&dp).unwrap().nlink -= 1;
                self.nodes.get_mut(&sp).unwrap().nlink += 1;
            }
            return Ok(());
        }
        if d.is_some() {
            self.drop_name(dp, dname);
        }
        self.nodes.get_mut(&sp).unwrap().children.remove(sname);
        self.nodes
            .get_mut(&dp)
            .unwrap()
            .children
            .insert(dname.to_vec(), s);
        if s_dir {
            self.nodes.get_mut(&s).unwrap().parent = dp;
            self.nodes.get_mut(&sp).unwrap().nlink -= 1;
            self.nodes.get_mut(&dp).unwrap().nlink += 1;
        }
        Ok(())
    }

    fn truncate(&mut self, h: Handle, size: u64) -> Answer {
        let node = self.nodes.get_mut(&h).ok_or(ENOENT)?;
        match node.kind {
            Kind::Dir => Err(EISDIR),
            Kind::File => {
                node.size = size;
                Ok(())
            }
            _ => Err(EINVAL),
        }
    }

    fn setxattr(&mut self, h: Handle, name: &[u8], value: &[u8], flags: u32) -> Answer {
        let node = self.nodes.get_mut(&h).ok_or(ENOENT)?;
        let exists = node.xattrs.contains_key(name);
        if flags == XATTR_CREATE && exists {
            return Err(EEXIST);
        }
        if flags == XATTR_REPLACE && !exists {
            return Err(ENODATA);
        }
        node.xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn removexattr(&mut self, h: Handle, name: &[u8]) -> Answer {
        let node = self.nodes.get_mut(&h).ok_or(ENOENT)?;
        node.xattrs.remove(name).map(|_| ()).ok_or(ENODATA)
    }
}

impl MNode {
    fn new(kind: Kind, parent: Handle) -> Self {
        MNode {
            kind,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            parent,
            children: BTreeMap::new(),
            xattrs: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Make(usize, u8, Kind, bool),
    Unlink(usize, u8),
    Rmdir(usize, u8),
    Link(usize, usize, u8),
    Rename(usize, u8, usize, u8, u32),
    Truncate(usize, u64),
    SetXattr(usize, u8, u8, u32),
    RemoveXattr(usize, u8),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::File),
        Just(Kind::Dir),
        Just(Kind::Symlink),
        Just(Kind::Fifo)
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let pick = 0usize..64;
    let name = 0u8..4;
    prop_oneof![
        4 => (pick.clone(), name.clone(), kind(), any::<bool>()).prop_map(|(p, n, k, x)| Step::Make(p, n, k, x)),
        2 => (pick.clone(), name.clone()).prop_map(|(p, n)| Step::Unlink(p, n)),
        2 => (pick.clone(), name.clone()).prop_map(|(p, n)| Step::Rmdir(p, n)),
        1 => (pick.clone(), pick.clone(), name.clone()).prop_map(|(h, p, n)| Step::Link(h, p, n)),
        3 => (pick.clone(), name.clone(), pick.clone(), name.clone(), prop::sample::select(vec![0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
            .prop_map(|(a, b, c, d, f)| Step::Rename(a, b, c, d, f)),
        1 => (pick.clone(), 0u64..100).prop_map(|(h, s)| Step::Truncate(h, s)),
        1 => (pick.clone(), 0u8..2, any::<u8>(), prop::sample::select(vec![0, XATTR_CREATE, XATTR_REPLACE]))
            .prop_map(|(h, n, v, f)| Step::SetXattr(h, n, v, f)),
        1 => (pick, 0u8..2).prop_map(|(h, n)| Step::RemoveXattr(h, n)),
    ]
}

fn name(n: u8) -> Vec<u8> {
    vec![b'a' + n]
}

fn answer<T>(r: Result<T>) -> Answer {
    r.map(|_| ()).map_err(|e| e.errno())
}

/// Each node's kind, nlink, size, sorted children and xattr names.
type Tree = BTreeMap<Handle, (Kind, u32, u64, Vec<(Vec<u8>, Handle)>, Vec<Vec<u8>>)>;

/// Lists the real tree as the model's shape, to compare the two.
fn real_tree(meta: &Meta<MemStore>, dir: Handle, out: &mut Tree) {
    let attr = meta.getattr(dir).unwrap();
    let mut children = Vec::new();
    let mut cookie = 0;
    loop {
        let page = meta.readdir(dir, cookie, 2).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        children.extend(page.iter().map(|e| (e.name.clone(), e.handle)));
    }
    children.sort();
    out.insert(
        dir,
        (
            attr.kind,
            attr.nlink,
            attr.size,
            children.clone(),
            meta.listxattr(dir).unwrap(),
        ),
    );
    for (_, child) in children {
        let a = meta.getattr(child).unwrap();
        if a.kind == Kind::Dir {
            real_tree(meta, child, out);
        } else {
            out.insert(
                child,
                (
                    a.kind,
                    a.nlink,
                    a.size,
                    Vec::new(),
                    meta.listxattr(child).unwrap(),
                ),
            );
        }
    }
}

fn model_tree(model: &Model) -> Tree {
    model
        .nodes
        .iter()
        .map(|(h, n)| {
            let size = if n.kind == Kind::Symlink { 1 } else { n.size };
            (
                *h,
                (
                    n.kind,
                    n.nlink,
                    size,
                    n.children.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                    n.xattrs.keys().cloned().collect(),
                ),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn namespace_matches_the_model(steps in prop::collection::vec(step(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let meta = Meta::open(MemStore::new(), MetaOptions { handle_chunk: 5, ..MetaOptions::default() }).unwrap();
        let mut model = Model::new();
        for step in steps {
            // Handles the step may pick from: every live one, directories first.
            let handles: Vec<Handle> = model.nodes.keys().copied().collect();
            let dirs: Vec<Handle> = model.nodes.iter().filter(|(_, n)| n.kind == Kind::Dir).map(|(h, _)| *h).collect();
            let any = |i: usize| handles[i % handles.len()];
            // Mostly directories as parents, sometimes any handle (ENOTDIR), sometimes a dead one.
            let parent = |i: usize| if i % 16 == 15 { 999_999 } else if i % 8 == 7 { any(i) } else { dirs[i % dirs.len()] };
            let before = meta.store().dump();
            let (expected, got) = match step.clone() {
                Step::Make(p, n, k, exclusive) => {
                    let (p, n) = (parent(p), name(n));
                    let node = match k {
                        Kind::Symlink => NewNode::symlink(b"x", 0, 0),
                        k => NewNode::node(k, 0o644, 0, 0, 0),
                    };
                    let mut expected = model.make(p, &n);
                    let exists_as_file = expected == Err(EEXIST) && !exclusive && k == Kind::File;
                    if exists_as_file {
                        let existing = model.nodes[&model.child(p, &n).unwrap()].kind;
                        expected = if existing == Kind::Dir { Err(EISDIR) } else { Ok(()) };
                    }
                    let got = rt.block_on(meta.make(p, &n, node, exclusive));
                    if let (Ok(()), Ok(attr), false) = (&expected, &got, exists_as_file) {
                        model.add(p, &n, attr.handle, k);
                    }
                    (expected, answer(got))
                }
                Step::Unlink(p, n) => {
                    let (p, n) = (parent(p), name(n));
                    (model.unlink(p, &n), answer(rt.block_on(meta.unlink(p, &n))))
                }
                Step::Rmdir(p, n) => {
                    let (p, n) = (parent(p), name(n));
                    (model.rmdir(p, &n), answer(rt.block_on(meta.rmdir(p, &n))))
                }
                Step::Link(h, p, n) => {
                    let (h, p, n) = (any(h), parent(p), name(n));
                    (model.link(h, p, &n), answer(rt.block_on(meta.link(h, p, &n))))
                }
                Step::Rename(a, b, c, d, f) => {
                    let (sp, sn, dp, dn) = (parent(a), name(b), parent(c), name(d));
                    (model.rename(sp, &sn, dp, &dn, f), answer(rt.block_on(meta.rename(sp, &sn, dp, &dn, f))))
                }
                Step::Truncate(h, size) => {
                    let h = any(h);
                    let attr = SetAttr { size: Some(size), ..SetAttr::default() };
                    (model.truncate(h, size), answer(rt.block_on(meta.setattr(h, attr))))
                }
                Step::SetXattr(h, n, v, f) => {
                    let (h, n) = (any(h), format!("user.{n}").into_bytes());
                    (model.setxattr(h, &n, &[v], f), answer(rt.block_on(meta.setxattr(h, &n, &[v], f))))
                }
                Step::RemoveXattr(h, n) => {
                    let (h, n) = (any(h), format!("user.{n}").into_bytes());
                    (model.removexattr(h, &n), answer(rt.block_on(meta.removexattr(h, &n))))
                }
            };
            prop_assert_eq!(got, expected, "step {:?}", step);
            if got.is_err() {
                prop_assert!(meta.store().dump() == before, "failed step {:?} changed the store", step);
            }
        }
        let mut real = BTreeMap::new();
        real_tree(&meta, ROOT, &mut real);
        prop_assert_eq!(real, model_tree(&model));
        let report = fsck::check(&meta.store().snapshot().unwrap(), &mut |_| {}).unwrap();
        prop_assert!(report.is_clean(), "fsck: {:?}", report.problems);
        prop_assert_eq!(report.inodes as usize, model.nodes.len());
    }
}
