//! Model-based test of the namespace: random operations run on the real `Meta` (over the
//! in-memory store) and on a small, obviously correct tree side by side. Every answer (the
//! attributes or the errno) must agree; an operation that fails must leave the store byte for
//! byte unchanged; at the end both trees must be equal and fsck must find nothing. Half the
//! cases keep a trash: what loses its last name waits in it, unchangeable, for a restore or a
//! purge.

use std::collections::BTreeMap;

use std::sync::Arc;

use calm_changelog::ChangelogConfig;
use calm_meta::alloc::HandleAllocator;
use calm_meta::changelog::ClState;
use calm_meta::fsck;
use calm_meta::ops::{self, Ctx, Done, Failure, Op};
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_store::{Store, WriteTxn};
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
    /// With a trash: what lost its last name, with the directory and name it had.
    trash: Option<BTreeMap<Handle, Trashed>>,
}

/// A node in the model's trash, with the directory and name it had.
type Trashed = (MNode, Handle, Vec<u8>);

type Answer = Result<(), i32>;

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;
const ENODATA: i32 = 61;
const EPERM: i32 = 1;
const ESTALE: i32 = 116;

impl Model {
    fn new(trash: bool) -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, MNode::new(Kind::Dir, ROOT));
        Model {
            nodes,
            trash: trash.then(BTreeMap::new),
        }
    }

    fn trashed(&self, h: Handle) -> Option<&MNode> {
        self.trash.as_ref()?.get(&h).map(|(node, _, _)| node)
    }

    /// A node that lost its last name: to the trash, or gone.
    fn gone(&mut self, h: Handle, parent: Handle, name: &[u8]) {
        let mut node = self.nodes.remove(&h).unwrap();
        if let Some(trash) = &mut self.trash {
            node.nlink = 0;
            trash.insert(h, (node, parent, name.to_vec()));
        }
    }

    fn restore(&mut self, h: Handle) -> Answer {
        let Some((_, parent, name)) = self.trash.as_ref().and_then(|t| t.get(&h)).cloned() else {
            return Err(ENOENT);
        };
        let dir = match self.nodes.get(&parent) {
            Some(n) if n.kind == Kind::Dir => parent,
            _ if self.trashed(parent).is_some_and(|n| n.kind == Kind::Dir) => return Err(EINVAL),
            _ => ROOT,
        };
        let mut name = name;
        if self.nodes[&dir].children.contains_key(&name) {
            name = calm_meta::ops::trash::restored_name(&name, h);
            if self.nodes[&dir].children.contains_key(&name) {
                return Err(EEXIST);
            }
        }
        let (mut node, _, _) = self.trash.as_mut().unwrap().remove(&h).unwrap();
        let is_dir = node.kind == Kind::Dir;
        node.nlink = if is_dir { 2 } else { 1 };
        node.parent = if is_dir { dir } else { 0 };
        self.nodes.insert(h, node);
        let d = self.nodes.get_mut(&dir).unwrap();
        d.children.insert(name, h);
        if is_dir {
            d.nlink += 1;
        }
        Ok(())
    }

    fn purge(&mut self, h: Handle) -> Answer {
        match self.trash.as_mut().and_then(|t| t.remove(&h)) {
            Some(_) => Ok(()),
            None => Err(ENOENT),
        }
    }

    fn dir(&self, h: Handle) -> Result<&MNode, i32> {
        match self.nodes.get(&h) {
            // In the trash: still what it was, but no directory to make names in.
            None if self.trashed(h).is_some_and(|n| n.kind != Kind::Dir) => Err(ENOTDIR),
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
            self.gone(h, parent, name);
            self.nodes.get_mut(&parent).unwrap().nlink -= 1;
        } else {
            node.nlink -= 1;
            if node.nlink == 0 {
                self.gone(h, parent, name);
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
        if let Some(node) = self.trashed(h) {
            return Err(if node.kind == Kind::Dir {
                EPERM
            } else {
                ENOENT
            });
        }
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
        if self.trashed(h).is_some() {
            return Err(ESTALE);
        }
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
        if self.trashed(h).is_some() {
            return Err(ESTALE);
        }
        let node = self.nodes.get_mut(&h).ok_or(ENOENT)?;
        // user.* xattrs belong to regular files and directories (the model's names are all
        // user.*).
        if !matches!(node.kind, Kind::File | Kind::Dir) {
            return Err(EPERM);
        }
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
        if self.trashed(h).is_some() {
            return Err(ESTALE);
        }
        let node = self.nodes.get_mut(&h).ok_or(ENOENT)?;
        if !matches!(node.kind, Kind::File | Kind::Dir) {
            return Err(EPERM);
        }
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
    Restore(usize),
    Purge(usize),
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
        1 => (pick.clone(), 0u8..2).prop_map(|(h, n)| Step::RemoveXattr(h, n)),
        2 => pick.clone().prop_map(Step::Restore),
        1 => pick.prop_map(Step::Purge),
    ]
}

fn name(n: u8) -> Vec<u8> {
    vec![b'a' + n]
}

/// Each node's kind, nlink, size, sorted children and xattr names.
type Tree = BTreeMap<Handle, (Kind, u32, u64, Vec<(Vec<u8>, Handle)>, Vec<Vec<u8>>)>;

/// Lists the real tree as the model's shape, to compare the two.
fn real_tree(meta: &Meta<Arc<MemStore>>, dir: Handle, out: &mut Tree) {
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

/// The directories holding names of each node, sorted, each once (none for the root).
fn model_parents(model: &Model) -> BTreeMap<Handle, Vec<Handle>> {
    let mut parents: BTreeMap<Handle, Vec<Handle>> =
        model.nodes.keys().map(|h| (*h, Vec::new())).collect();
    for (dir, node) in &model.nodes {
        for child in node.children.values() {
            let list = parents.get_mut(child).expect("a child is a node");
            if !list.contains(dir) {
                list.push(*dir);
            }
        }
    }
    for list in parents.values_mut() {
        list.sort_unstable();
    }
    parents
}

/// A step with its handles picked: what both the model and the namespace run.
#[derive(Debug, Clone)]
enum Call {
    Make(Handle, Vec<u8>, Kind, bool),
    Unlink(Handle, Vec<u8>),
    Rmdir(Handle, Vec<u8>),
    Link(Handle, Handle, Vec<u8>),
    Rename(Handle, Vec<u8>, Handle, Vec<u8>, u32),
    Truncate(Handle, u64),
    SetXattr(Handle, Vec<u8>, u8, u32),
    RemoveXattr(Handle, Vec<u8>),
    Restore(Handle),
    Purge(Handle),
}

fn resolve(model: &Model, step: &Step) -> Call {
    // Live nodes, and those in the trash (which nothing changes).
    let handles: Vec<Handle> = model
        .nodes
        .keys()
        .chain(model.trash.iter().flat_map(|t| t.keys()))
        .copied()
        .collect();
    let trashed: Vec<Handle> = model.trash.iter().flat_map(|t| t.keys()).copied().collect();
    let in_trash = |i: usize| match trashed.len() {
        // Sometimes a live node, sometimes one long gone.
        _ if i % 8 == 7 => any_live(model, i),
        0 => 999_998,
        n => trashed[i % n],
    };
    let dirs: Vec<Handle> = model
        .nodes
        .iter()
        .filter(|(_, n)| n.kind == Kind::Dir)
        .map(|(h, _)| *h)
        .collect();
    let any = |i: usize| handles[i % handles.len()];
    // Mostly directories as parents, sometimes any handle (ENOTDIR), sometimes a dead one.
    let parent = |i: usize| {
        if i % 16 == 15 {
            999_999
        } else if i % 8 == 7 {
            any(i)
        } else {
            dirs[i % dirs.len()]
        }
    };
    let xname = |n: u8| format!("user.{n}").into_bytes();
    match *step {
        Step::Make(p, n, k, x) => Call::Make(parent(p), name(n), k, x),
        Step::Unlink(p, n) => Call::Unlink(parent(p), name(n)),
        Step::Rmdir(p, n) => Call::Rmdir(parent(p), name(n)),
        Step::Link(h, p, n) => Call::Link(any(h), parent(p), name(n)),
        Step::Rename(a, b, c, d, f) => Call::Rename(parent(a), name(b), parent(c), name(d), f),
        Step::Truncate(h, size) => Call::Truncate(any(h), size),
        Step::SetXattr(h, n, v, f) => Call::SetXattr(any(h), xname(n), v, f),
        Step::RemoveXattr(h, n) => Call::RemoveXattr(any(h), xname(n)),
        Step::Restore(h) => Call::Restore(in_trash(h)),
        Step::Purge(h) => Call::Purge(in_trash(h)),
    }
}

fn any_live(model: &Model, i: usize) -> Handle {
    let live: Vec<Handle> = model.nodes.keys().copied().collect();
    live[i % live.len()]
}

/// The operation a call stands for, for [`ops::apply`].
fn to_op(call: &Call) -> Op {
    match call.clone() {
        Call::Make(parent, name, k, exclusive) => {
            let node = match k {
                Kind::Symlink => NewNode::symlink(b"x", 0, 0),
                k => NewNode::node(k, 0o644, 0, 0, 0),
            };
            Op::Make {
                parent,
                name,
                node,
                exclusive,
            }
        }
        Call::Unlink(parent, name) => Op::Unlink {
            parent,
            name,
            keep: Vec::new(),
        },
        Call::Rmdir(parent, name) => Op::Rmdir { parent, name },
        Call::Link(handle, parent, name) => Op::Link {
            handle,
            parent,
            name,
        },
        Call::Rename(parent, name, new_parent, new_name, flags) => Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
            keep: Vec::new(),
        },
        Call::Truncate(handle, size) => Op::SetAttr {
            handle,
            attr: SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        },
        Call::SetXattr(handle, name, v, flags) => Op::SetXattr {
            handle,
            name,
            value: vec![v],
            flags,
        },
        Call::RemoveXattr(handle, name) => Op::RemoveXattr { handle, name },
        Call::Restore(handle) => Op::TrashRestore { handle },
        Call::Purge(handle) => Op::TrashPurge {
            handle,
            removed_at: None,
        },
    }
}

/// Applies `calls` in one transaction through one [`Ctx`], as one group commit does.
fn run_group(
    store: &MemStore,
    alloc: &mut HandleAllocator,
    calls: &[Call],
    trash: bool,
) -> Vec<Result<Option<Handle>, i32>> {
    let mut txn = store.begin().unwrap();
    let mut cl = ClState::load(&txn, ChangelogConfig::default(), false).unwrap();
    let names = calm_store::ReadTxn::get(&txn, calm_meta::layout::KEY_NAME_HASH)
        .unwrap()
        .expect("the namespace's name hash key");
    let names = calm_meta::layout::NameHash::from_value(&names).unwrap();
    let mut ctx = Ctx::new(&mut txn, alloc, &mut cl, 1_000, 1, names);
    ctx.trash = trash;
    let answers = calls
        .iter()
        .map(|call| match ops::apply(&mut ctx, &to_op(call)) {
            Ok(Done::Attr(attr)) => Ok(Some(attr.handle)),
            Ok(
                Done::Nothing | Done::User(_) | Done::Ids(_) | Done::Orphaned(_) | Done::Quota(_),
            ) => Ok(None),
            Ok(Done::Restored { attr, .. }) => Ok(Some(attr.handle)),
            Ok(Done::Cloned { .. }) => Ok(None),
            Err(Failure::Meta(error)) => Err(error.errno()),
            Err(Failure::Store(error)) => panic!("store failed: {error}"),
        })
        .collect();
    ctx.flush().unwrap();
    txn.commit().unwrap();
    alloc.committed();
    answers
}

/// Runs `call` on the namespace; a created handle comes back with the answer.
async fn run_real(meta: &Meta<Arc<MemStore>>, call: Call) -> Result<Option<Handle>, i32> {
    let unit = |r: Result<()>| r.map(|()| None).map_err(|e| e.errno());
    let attr = |r: Result<Attr>| r.map(|a| Some(a.handle)).map_err(|e| e.errno());
    match call {
        Call::Make(p, n, k, x) => {
            let node = match k {
                Kind::Symlink => NewNode::symlink(b"x", 0, 0),
                k => NewNode::node(k, 0o644, 0, 0, 0),
            };
            attr(meta.make(p, &n, node, x).await)
        }
        Call::Unlink(p, n) => unit(meta.unlink(p, &n).await),
        Call::Rmdir(p, n) => unit(meta.rmdir(p, &n).await),
        Call::Link(h, p, n) => attr(meta.link(h, p, &n).await),
        Call::Rename(sp, sn, dp, dn, f) => unit(meta.rename(sp, &sn, dp, &dn, f).await),
        Call::Truncate(h, size) => {
            let set = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            attr(meta.setattr(h, set).await)
        }
        Call::SetXattr(h, n, v, f) => unit(meta.setxattr(h, &n, &[v], f).await),
        Call::RemoveXattr(h, n) => unit(meta.removexattr(h, &n).await),
        Call::Restore(h) => attr(
            meta.trash_restore(Caller::default(), h)
                .await
                .map(|r| r.attr),
        ),
        Call::Purge(h) => unit(meta.trash_purge(Caller::default(), h).await),
    }
}

/// Applies `call` to the model, given the namespace's answer (for the handle of a new node).
fn run_model(model: &mut Model, call: &Call, real: Result<Option<Handle>, i32>) -> Answer {
    match call {
        Call::Make(p, n, k, exclusive) => {
            let mut expected = model.make(*p, n);
            let existing_file = expected == Err(EEXIST) && !exclusive && *k == Kind::File;
            if existing_file {
                let existing = model.nodes[&model.child(*p, n).unwrap()].kind;
                expected = if existing == Kind::Dir {
                    Err(EISDIR)
                } else {
                    Ok(())
                };
            }
            if let (Ok(()), Ok(Some(handle)), false) = (&expected, &real, existing_file) {
                model.add(*p, n, *handle, *k);
            }
            expected
        }
        Call::Unlink(p, n) => model.unlink(*p, n),
        Call::Rmdir(p, n) => model.rmdir(*p, n),
        Call::Link(h, p, n) => model.link(*h, *p, n),
        Call::Rename(sp, sn, dp, dn, f) => model.rename(*sp, sn, *dp, dn, *f),
        Call::Truncate(h, size) => model.truncate(*h, *size),
        Call::SetXattr(h, n, v, f) => model.setxattr(*h, n, &[*v], *f),
        Call::RemoveXattr(h, n) => model.removexattr(*h, n),
        Call::Restore(h) => model.restore(*h),
        Call::Purge(h) => model.purge(*h),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Steps go in groups. A group of one goes through `Meta` and its committer; a larger
    /// group is applied in one transaction through one `Ctx` (one inode overlay, one flush),
    /// exactly what the committer does with the calls it finds queued together.
    #[test]
    fn namespace_matches_the_model(groups in prop::collection::vec(prop::collection::vec(step(), 1..6), 1..30), trash in any::<bool>()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let store = Arc::new(MemStore::new());
        let trash_kept = if trash { std::time::Duration::from_secs(3600) } else { std::time::Duration::ZERO };
        let meta = Meta::open(store.clone(), MetaOptions { handle_chunk: 5, trash_kept, trash_min_age: std::time::Duration::ZERO, ..MetaOptions::default() }).unwrap();
        let mut alloc = HandleAllocator::new(3);
        let mut model = Model::new(trash);
        for group in groups {
            let before = store.dump();
            let calls: Vec<Call> = group.iter().map(|s| resolve(&model, s)).collect();
            let answers = if calls.len() == 1 {
                vec![rt.block_on(run_real(&meta, calls[0].clone()))]
            } else {
                run_group(&store, &mut alloc, &calls, trash)
            };
            for (call, real) in calls.iter().zip(&answers) {
                let expected = run_model(&mut model, call, *real);
                prop_assert_eq!(real.map(|_| ()), expected, "call {:?} in group {:?}", call, calls);
            }
            if answers.iter().all(|a| a.is_err()) {
                prop_assert!(store.dump() == before, "failed calls {:?} changed the store", calls);
            }
            // Every node knows the directories holding its names (what watchers of those
            // directories match its attribute changes by).
            for (handle, dirs) in model_parents(&model) {
                prop_assert_eq!(meta.parents(handle).unwrap(), dirs, "parents of {} after {:?}", handle, calls);
            }
        }
        let mut real = BTreeMap::new();
        real_tree(&meta, ROOT, &mut real);
        prop_assert_eq!(real, model_tree(&model));
        let report = fsck::check(&store.snapshot().unwrap(), &mut |_| {}).unwrap();
        prop_assert!(report.is_clean(), "fsck: {:?}", report.problems);
        let in_trash = model.trash.as_ref().map_or(0, |t| t.len());
        prop_assert_eq!(report.inodes as usize, model.nodes.len() + in_trash);
        let listed: Vec<(Handle, u64)> = meta.trash_list(&Caller::default(), 0, 10_000).unwrap().entries.iter().map(|l| (l.listed.handle, l.listed.entry.size)).collect();
        let expected: Vec<(Handle, u64)> = model.trash.iter().flatten().map(|(h, (n, _, _))| (*h, if n.kind == Kind::File { n.size } else { 0 })).collect();
        prop_assert_eq!(listed, expected);
    }
}
