//! Quota shares under random work, against a model of the quotas as plain counts: two users
//! make directories that set a share aside (a mount holding them), make files drawing from
//! those shares and plain files beside them, remove files, and give shares back, under a
//! user limit and a tree limit. After every step: each make was refused exactly where the
//! model refuses it, and a make drawing from a share with room left never; no quota's usage
//! plus the room set aside in it passes its limit; the room set aside is the model's; and the
//! usage kept is the usage counted (fsck's quota pass).

use std::collections::HashMap;
use std::sync::Arc;

use calm_meta::ops::{Done, Op};
use calm_meta::quota::{QuotaLimits, QuotaTarget, SHARE_INODES_MAX};
use calm_meta::*;
use calm_store::mem::MemStore;
use proptest::prelude::*;

const EDQUOT: i32 = 122;
const ALICE: u32 = 1000;
const BOB: u32 = 1001;

fn user(uid: u32) -> Caller {
    Caller {
        session: 7,
        uid,
        gid: 100,
        groups: Default::default(),
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A user makes a directory asking for a share.
    Ask(bool),
    /// The maker of share `i` makes a file in its directory, drawing from it.
    Draw(usize),
    /// A user makes a plain file in the limited tree.
    Plain(bool),
    /// Removes file `i`.
    Unlink(usize),
    /// Share `i` is given back.
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => any::<bool>().prop_map(Step::Ask),
        5 => (0..8usize).prop_map(Step::Draw),
        3 => any::<bool>().prop_map(Step::Plain),
        3 => (0..32usize).prop_map(Step::Unlink),
        1 => (0..8usize).prop_map(Step::Release),
    ]
}

/// The quotas as plain counts: usage and limit per quota, each share's quotas and room.
#[derive(Debug, Default)]
struct Model {
    usage: HashMap<QuotaTarget, u64>,
    limit: HashMap<QuotaTarget, u64>,
    /// Per share: its directory, its maker, its quotas, the room left (`None`: released).
    shares: Vec<(Handle, u32, Vec<QuotaTarget>, Option<u64>)>,
}

impl Model {
    /// The limited quotas a make by `uid` in the tree counts in.
    fn targets(&self, uid: u32) -> Vec<QuotaTarget> {
        [QuotaTarget::user(uid), QuotaTarget::tree(0)]
            .into_iter()
            .filter(|t| self.limit.contains_key(t))
            .collect()
    }

    fn aside(&self, target: QuotaTarget) -> u64 {
        let live = self.shares.iter().filter(|s| s.2.contains(&target));
        live.filter_map(|s| s.3).sum()
    }

    /// Whether a plain make by `uid` fits: each quota's usage, room set aside and the make
    /// within its limit.
    fn fits(&self, uid: u32) -> bool {
        self.targets(uid)
            .iter()
            .all(|t| self.usage.get(t).copied().unwrap_or(0) + self.aside(*t) < self.limit[t])
    }

    fn made(&mut self, uid: u32) {
        for t in [QuotaTarget::user(uid), QuotaTarget::tree(0)] {
            *self.usage.entry(t).or_default() += 1;
        }
    }

    fn room(&self, uid: u32) -> u64 {
        let room = self
            .targets(uid)
            .into_iter()
            .map(|t| self.limit[&t] - self.usage.get(&t).copied().unwrap_or(0) - self.aside(t));
        room.min().unwrap_or(0).div_ceil(2).min(SHARE_INODES_MAX)
    }
}

fn limit(inodes: u64) -> QuotaLimits {
    QuotaLimits {
        inodes,
        ..QuotaLimits::default()
    }
}

fn make(parent: Handle, name: &str, dir: bool, share: Share) -> Op {
    let node = match dir {
        true => NewNode::dir(0o755, 0, 0),
        false => NewNode::file(0o644, 0, 0),
    };
    Op::Make {
        parent,
        name: name.as_bytes().to_vec(),
        node: NewNode { share, ..node },
        exclusive: true,
    }
}

async fn run(steps: Vec<Step>, user_limit: u64, tree_limit: u64) -> Result<(), TestCaseError> {
    let meta = Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap();
    let tree = meta.mkdir(ROOT, b"t", 0o777).await.unwrap().handle;
    let mut model = Model::default();
    // The model names the tree 0.
    let tree_target = |t: QuotaTarget| match t == QuotaTarget::tree(0) {
        true => QuotaTarget::tree(tree),
        false => t,
    };
    for (target, inodes) in [
        (QuotaTarget::user(ALICE), user_limit),
        (QuotaTarget::tree(0), tree_limit),
    ] {
        meta.set_quota(Caller::default(), tree_target(target), limit(inodes))
            .await
            .unwrap();
        model.limit.insert(target, inodes);
    }
    let mut files: Vec<(Handle, String, u32)> = Vec::new();
    for (n, step) in steps.into_iter().enumerate() {
        let name = format!("n{n}");
        match step {
            Step::Ask(alice) => {
                let uid = if alice { ALICE } else { BOB };
                let fits = model.fits(uid);
                let made = meta
                    .apply_as(user(uid), make(tree, &name, true, Share::Ask))
                    .await;
                prop_assert_eq!(made.is_ok(), fits, "a directory asking for a share");
                let Ok(Done::Attr(attr)) = made else {
                    prop_assert_eq!(made.map(|_| ()).map_err(|e| e.errno()), Err(EDQUOT));
                    continue;
                };
                model.made(uid);
                let room = model.room(uid);
                prop_assert_eq!(meta.shares().left(attr.handle), Some(room));
                let targets = model.targets(uid);
                model.shares.push((attr.handle, uid, targets, Some(room)));
            }
            Step::Draw(i) => {
                let Some(share) = model.shares.get(i % model.shares.len().max(1)).cloned() else {
                    continue;
                };
                let (dir, uid, _, left) = share;
                let pool = Share::Draw(dir);
                let drawn = left.is_some_and(|l| l > 0);
                let fits = drawn || model.fits(uid);
                let made = meta
                    .apply_as(user(uid), make(dir, &name, false, pool))
                    .await;
                prop_assert_eq!(made.is_ok(), fits, "a make drawing from {:?}", left);
                if made.is_ok() {
                    model.made(uid);
                    files.push((dir, name, uid));
                    if drawn {
                        let share = model.shares.iter_mut().find(|s| s.0 == dir).unwrap();
                        share.3 = share.3.map(|l| l - 1);
                    }
                }
            }
            Step::Plain(alice) => {
                let uid = if alice { ALICE } else { BOB };
                let fits = model.fits(uid);
                let made = meta
                    .apply_as(user(uid), make(tree, &name, false, Share::None))
                    .await;
                prop_assert_eq!(made.is_ok(), fits, "a plain make");
                if made.is_ok() {
                    model.made(uid);
                    files.push((tree, name, uid));
                }
            }
            Step::Unlink(i) => {
                if files.is_empty() {
                    continue;
                }
                let (dir, name, uid) = files.remove(i % files.len());
                let op = Op::Unlink {
                    parent: dir,
                    name: name.into_bytes(),
                    keep: Vec::new(),
                };
                meta.apply_as(user(uid), op).await.unwrap();
                for t in [QuotaTarget::user(uid), QuotaTarget::tree(0)] {
                    *model.usage.get_mut(&t).unwrap() -= 1;
                }
            }
            Step::Release(i) => {
                if let Some(share) = model.shares.get_mut(i % 8) {
                    meta.shares().release(share.0);
                    share.3 = None;
                }
            }
        }
        for (target, limit) in &model.limit {
            let kept = meta
                .quota(&Caller::default(), tree_target(*target))
                .unwrap();
            let usage = model.usage.get(target).copied().unwrap_or(0);
            prop_assert_eq!(kept.usage.inodes as u64, usage, "{}", target);
            prop_assert!(usage + model.aside(*target) <= *limit, "{} passed", target);
        }
        let aside: u64 = model
            .shares
            .iter()
            .filter_map(|s| s.3.map(|l| l * s.2.len() as u64))
            .sum();
        prop_assert_eq!(meta.shares().total_set_aside(), aside);
    }
    let mismatches = meta.quota_check(&Caller::default()).unwrap();
    prop_assert!(mismatches.is_empty(), "{mismatches:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn a_share_is_room_nobody_else_takes(
        steps in prop::collection::vec(step(), 1..60),
        user_limit in 1..40u64,
        tree_limit in 1..60u64,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(steps, user_limit, tree_limit))?;
    }
}

#[tokio::test]
async fn a_share_is_half_the_room_left_and_its_maker_fills_it_past_others() {
    let meta = Meta::open(Arc::new(MemStore::new()), MetaOptions::default()).unwrap();
    let tree = meta.mkdir(ROOT, b"t", 0o777).await.unwrap().handle;
    meta.set_quota(Caller::default(), QuotaTarget::user(ALICE), limit(11))
        .await
        .unwrap();
    let alice = user(ALICE);
    let made = meta
        .apply_as(alice.clone(), make(tree, "held", true, Share::Ask))
        .await
        .unwrap();
    let Done::Attr(held) = made else {
        panic!("{made:?}")
    };
    // 11 - 1 left: half set aside.
    assert_eq!(meta.shares().left(held.handle), Some(5));
    // Alice's plain makes take the other five, then are refused.
    for i in 0..5 {
        let op = make(tree, &format!("p{i}"), false, Share::None);
        meta.apply_as(alice.clone(), op).await.unwrap();
    }
    let refused = meta
        .apply_as(alice.clone(), make(tree, "p5", false, Share::None))
        .await;
    assert_eq!(refused.map(|_| ()).map_err(|e| e.errno()), Err(EDQUOT));
    // The share's five pass, then the sixth is refused, at the limit exactly.
    for i in 0..5 {
        let op = make(
            held.handle,
            &format!("d{i}"),
            false,
            Share::Draw(held.handle),
        );
        meta.apply_as(alice.clone(), op).await.unwrap();
    }
    assert_eq!(meta.shares().left(held.handle), Some(0));
    let op = make(held.handle, "d5", false, Share::Draw(held.handle));
    let refused = meta.apply_as(alice.clone(), op).await;
    assert_eq!(refused.map(|_| ()).map_err(|e| e.errno()), Err(EDQUOT));
    let report = meta.quota(&alice, QuotaTarget::user(ALICE)).unwrap();
    assert_eq!(report.usage.inodes, 11);
    // A make drawing from a share it is not counted in is judged as any other.
    let bob = user(BOB);
    let op = make(tree, "bob", false, Share::Draw(held.handle));
    meta.apply_as(bob, op).await.unwrap();
    // Where no quota limits the makes, no share is set aside.
    let op = make(tree, "free", true, Share::Ask);
    let Done::Attr(free) = meta.apply_as(user(BOB), op).await.unwrap() else {
        panic!()
    };
    assert_eq!(meta.shares().left(free.handle), None);
    meta.shares().release(held.handle);
    assert_eq!(meta.shares().count(), 0);
}
