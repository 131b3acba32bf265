//! POSIX ACLs decided by the namespace, without a kernel in front: random ACLs set by a file's
//! owner, then random callers' reads of the file's map (what every read and open for writing
//! asks) and makes in a directory, each decision compared with a plain reading of acl(5)'s
//! algorithm; and step by step the rules around them: who may set one, what the mode becomes,
//! chmod keeping the ACL in step, inheritance with and without the umask, removal. fsck checks
//! the store after each.

use std::sync::Arc;

use calm_meta::acl::{ACCESS_XATTR, DEFAULT_XATTR};
use calm_meta::ops::Op;
use calm_meta::*;
use calm_store::mem::MemStore;
use calm_testkit::fsck_clean;
use proptest::prelude::*;

const OWNER: u32 = 1000;
const GROUP: u32 = 50;
const EPERM: i32 = 1;
const EACCES: i32 = 13;
const ENODATA: i32 = 61;
const EOPNOTSUPP: i32 = 95;

fn caller(uid: u32, gid: u32, groups: &[u32]) -> Caller {
    Caller {
        session: 0,
        uid,
        gid,
        groups: Groups::new(groups.to_vec()),
    }
}

/// An ACL entry as the xattr has it: tag, permissions, id.
type Raw = (u16, u16, u32);
const UNDEFINED: u32 = u32::MAX;

fn encode(entries: &[Raw]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// acl(5), "Access check algorithm", read plainly: may `who` have all of `want`?
fn model_allows(entries: &[Raw], who: &Caller, owner: (u32, u32), want: u16) -> bool {
    if who.uid == 0 {
        return true;
    }
    let find = |tag: u16, id: u32| {
        entries
            .iter()
            .find(|e| e.0 == tag && (tag & 0x0A == 0 || e.2 == id))
    };
    let mask = find(0x10, 0).map_or(7, |e| e.1);
    if who.uid == owner.0 {
        return find(0x01, 0).unwrap().1 & want == want;
    }
    if let Some(e) = find(0x02, who.uid) {
        return e.1 & mask & want == want;
    }
    let groups: Vec<&Raw> = entries
        .iter()
        .filter(|e| (e.0 == 0x04 && who.in_group(owner.1)) || (e.0 == 0x08 && who.in_group(e.2)))
        .collect();
    if !groups.is_empty() {
        return groups.iter().any(|e| e.1 & mask & want == want);
    }
    find(0x20, 0).unwrap().1 & want == want
}

fn acl_strategy() -> impl Strategy<Value = Vec<Raw>> {
    (
        0..8u16,
        0..8u16,
        0..8u16,
        proptest::collection::btree_map(1001..1004u32, 0..8u16, 0..3),
        proptest::collection::btree_map(50..53u32, 0..8u16, 0..3),
        0..8u16,
    )
        .prop_map(|(user, group, other, users, groups, mask)| {
            let mut e = vec![(0x01, user, UNDEFINED), (0x04, group, UNDEFINED)];
            e.extend(users.iter().map(|(id, p)| (0x02, *p, *id)));
            e.extend(groups.iter().map(|(id, p)| (0x08, *p, *id)));
            if !users.is_empty() || !groups.is_empty() {
                e.push((0x10, mask, UNDEFINED));
            }
            e.push((0x20, other, UNDEFINED));
            e
        })
}

fn who_strategy() -> impl Strategy<Value = Caller> {
    (
        prop_oneof![Just(0u32), 1000..1005u32],
        49..53u32,
        proptest::collection::vec(50..53u32, 0..2),
    )
        .prop_map(|(uid, gid, groups)| caller(uid, gid, &groups))
}

fn errno<T>(r: Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.errno())
}

async fn world() -> (Meta<Arc<MemStore>>, Arc<MemStore>) {
    let store = Arc::new(MemStore::new());
    let meta = Meta::open(store.clone(), MetaOptions::default()).unwrap();
    meta.setattr(
        ROOT,
        SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    (meta, store)
}

async fn set(
    meta: &Meta<Arc<MemStore>>,
    who: &Caller,
    handle: Handle,
    name: &[u8],
    value: Vec<u8>,
) -> Result<(), i32> {
    errno(
        meta.apply_as(
            who.clone(),
            Op::SetXattr {
                handle,
                name: name.to_vec(),
                value,
                flags: 0,
            },
        )
        .await,
    )
}

async fn make(
    meta: &Meta<Arc<MemStore>>,
    who: &Caller,
    parent: Handle,
    name: &str,
    node: NewNode,
) -> Result<Attr> {
    match meta
        .apply_as(
            who.clone(),
            Op::Make {
                parent,
                name: name.as_bytes().to_vec(),
                node,
                exclusive: true,
            },
        )
        .await?
    {
        ops::Done::Attr(attr) => Ok(attr),
        other => panic!("make answered {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_decision_is_acl5s(file_acl in acl_strategy(), dir_acl in acl_strategy(), callers in proptest::collection::vec(who_strategy(), 1..12)) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let (meta, store) = world().await;
            let owner = caller(OWNER, GROUP, &[]);
            let file = make(&meta, &owner, ROOT, "f", NewNode::file(0o600, 0, 0)).await.unwrap().handle;
            let dir = make(&meta, &owner, ROOT, "d", NewNode::dir(0o700, 0, 0)).await.unwrap().handle;
            let chgrp = SetAttr { gid: Some(GROUP), ..SetAttr::default() };
            meta.apply_as(owner.clone(), Op::SetAttr { handle: file, attr: chgrp.clone() }).await.unwrap();
            meta.apply_as(owner.clone(), Op::SetAttr { handle: dir, attr: chgrp }).await.unwrap();
            prop_assert_eq!(set(&meta, &owner, file, ACCESS_XATTR, encode(&file_acl)).await, Ok(()));
            prop_assert_eq!(set(&meta, &owner, dir, ACCESS_XATTR, encode(&dir_acl)).await, Ok(()));
            for (i, who) in callers.iter().enumerate() {
                // A read of the map: read or write permission.
                let may = model_allows(&file_acl, who, (OWNER, GROUP), 4)
                    || model_allows(&file_acl, who, (OWNER, GROUP), 2)
                    || who.uid == OWNER;
                let got = errno(meta.read_map_as(who, file, 0, 16));
                prop_assert_eq!(got.is_ok(), may, "map read by {:?} under {:?}: {:?}", who, file_acl, got);
                if !may {
                    prop_assert_eq!(got, Err(EACCES));
                }
                // A make in the directory: write and search.
                let may = model_allows(&dir_acl, who, (OWNER, GROUP), 3);
                let got = make(&meta, who, dir, &format!("n{i}"), NewNode::file(0o644, 0, 0)).await;
                prop_assert_eq!(got.is_ok(), may, "make by {:?} under {:?}: {:?}", who, dir_acl, got);
            }
            fsck_clean(&store);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn who_sets_an_acl_and_what_the_mode_becomes() {
    let (meta, store) = world().await;
    let alice = caller(OWNER, 1000, &[]);
    let bob = caller(1001, 1001, &[]);
    let file = make(&meta, &alice, ROOT, "f", NewNode::file(0o2664, 0, 0))
        .await
        .unwrap();
    let chgrp = SetAttr {
        gid: Some(GROUP),
        ..SetAttr::default()
    };
    let root = Caller::default();
    meta.apply_as(
        root.clone(),
        Op::SetAttr {
            handle: file.handle,
            attr: chgrp,
        },
    )
    .await
    .unwrap();
    meta.apply_as(
        root.clone(),
        Op::SetAttr {
            handle: file.handle,
            attr: SetAttr {
                mode: Some(0o2664),
                ..SetAttr::default()
            },
        },
    )
    .await
    .unwrap();
    let shared = encode(&[
        (0x01, 6, UNDEFINED),
        (0x02, 6, 1001),
        (0x04, 4, UNDEFINED),
        (0x10, 6, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]);
    // Someone else may not; its owner may, and the mode's bits follow (setgid goes: alice
    // is not in the file's group).
    assert_eq!(
        set(&meta, &bob, file.handle, ACCESS_XATTR, shared.clone()).await,
        Err(EPERM)
    );
    assert_eq!(
        set(&meta, &alice, file.handle, ACCESS_XATTR, shared.clone()).await,
        Ok(())
    );
    assert_eq!(meta.getattr(file.handle).unwrap().mode, 0o660);
    assert_eq!(
        meta.getxattr_as(&bob, file.handle, ACCESS_XATTR).unwrap(),
        shared
    );
    assert!(meta.read_map_as(&bob, file.handle, 0, 16).is_ok());
    // chmod keeps the ACL in step: the mask takes the group bits.
    meta.apply_as(
        alice.clone(),
        Op::SetAttr {
            handle: file.handle,
            attr: SetAttr {
                mode: Some(0o604),
                ..SetAttr::default()
            },
        },
    )
    .await
    .unwrap();
    let acl =
        calm_meta::acl::Acl::decode(&meta.getxattr(file.handle, ACCESS_XATTR).unwrap()).unwrap();
    assert_eq!(acl.mode(), 0o604);
    assert_eq!(
        errno(meta.read_map_as(&bob, file.handle, 0, 16)),
        Err(EACCES),
        "the mask is empty"
    );
    fsck_clean(&store);
    // An ACL the mode says all of is not kept; removing one leaves the mode.
    let plain = encode(&[
        (0x01, 6, UNDEFINED),
        (0x04, 0, UNDEFINED),
        (0x20, 4, UNDEFINED),
    ]);
    assert_eq!(
        set(&meta, &alice, file.handle, ACCESS_XATTR, plain).await,
        Ok(())
    );
    assert_eq!(meta.getattr(file.handle).unwrap().mode, 0o604);
    assert_eq!(
        errno(meta.getxattr(file.handle, ACCESS_XATTR)),
        Err(ENODATA)
    );
    assert_eq!(
        set(&meta, &alice, file.handle, ACCESS_XATTR, shared.clone()).await,
        Ok(())
    );
    let remove = Op::RemoveXattr {
        handle: file.handle,
        name: ACCESS_XATTR.to_vec(),
    };
    assert_eq!(errno(meta.apply_as(alice.clone(), remove).await), Ok(()));
    assert_eq!(
        errno(meta.getxattr(file.handle, ACCESS_XATTR)),
        Err(ENODATA)
    );
    assert_eq!(meta.getattr(file.handle).unwrap().mode, 0o660);
    assert_eq!(
        errno(meta.read_map_as(&bob, file.handle, 0, 16)),
        Err(EACCES)
    );
    // No default ACL on a file; none at all on a symlink; no malformed one.
    assert_eq!(
        set(&meta, &alice, file.handle, DEFAULT_XATTR, shared.clone()).await,
        Err(EACCES)
    );
    let link = make(&meta, &alice, ROOT, "l", NewNode::symlink(b"f", 0, 0))
        .await
        .unwrap();
    assert_eq!(
        set(&meta, &alice, link.handle, ACCESS_XATTR, shared.clone()).await,
        Err(EOPNOTSUPP)
    );
    let unmasked = encode(&[
        (0x01, 6, UNDEFINED),
        (0x02, 6, 1001),
        (0x04, 4, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]);
    assert_eq!(
        set(&meta, &alice, file.handle, ACCESS_XATTR, unmasked).await,
        Err(22)
    );
    fsck_clean(&store);
}

#[tokio::test]
async fn new_nodes_take_the_default_acl_and_the_umask_where_there_is_none() {
    let (meta, store) = world().await;
    let alice = caller(OWNER, 1000, &[]);
    let project = make(&meta, &alice, ROOT, "p", NewNode::dir(0o777, 0, 0))
        .await
        .unwrap()
        .handle;
    let default = encode(&[
        (0x01, 7, UNDEFINED),
        (0x02, 6, 1001),
        (0x04, 5, UNDEFINED),
        (0x10, 7, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]);
    assert_eq!(
        set(&meta, &alice, project, DEFAULT_XATTR, default.clone()).await,
        Ok(())
    );
    // The umask does not apply under a default ACL; the mode asked for does.
    let file = make(
        &meta,
        &alice,
        project,
        "f",
        NewNode::file(0o666, 0, 0).with_umask(0o077),
    )
    .await
    .unwrap();
    assert_eq!(file.mode, 0o660);
    let access =
        calm_meta::acl::Acl::decode(&meta.getxattr(file.handle, ACCESS_XATTR).unwrap()).unwrap();
    assert_eq!(access.mode(), 0o660);
    assert_eq!(
        errno(meta.getxattr(file.handle, DEFAULT_XATTR)),
        Err(ENODATA)
    );
    let sub = make(
        &meta,
        &alice,
        project,
        "s",
        NewNode::dir(0o755, 0, 0).with_umask(0o077),
    )
    .await
    .unwrap();
    assert_eq!(sub.mode, 0o750);
    assert_eq!(
        meta.getxattr(sub.handle, DEFAULT_XATTR).unwrap(),
        default,
        "a directory passes it on"
    );
    let deeper = make(&meta, &alice, sub.handle, "g", NewNode::file(0o644, 0, 0))
        .await
        .unwrap();
    assert_eq!(deeper.mode, 0o640);
    let bob = caller(1001, 1001, &[]);
    assert!(
        meta.read_map_as(&bob, deeper.handle, 0, 16).is_ok(),
        "bob's named entry came along"
    );
    let link = make(
        &meta,
        &alice,
        project,
        "l",
        NewNode::symlink(b"f", 0, 0).with_umask(0o077),
    )
    .await
    .unwrap();
    assert_eq!(link.mode, 0o777);
    // A client that sends the mode with its umask applied and nothing more (a mount of an
    // earlier build): the default ACL works with that mode.
    let masked = make(&meta, &alice, project, "masked", NewNode::file(0o644, 0, 0))
        .await
        .unwrap();
    assert_eq!(masked.mode, 0o640);
    // Without a default ACL the mode less the umask.
    let plain = make(
        &meta,
        &alice,
        ROOT,
        "plain",
        NewNode::file(0o666, 0, 0).with_umask(0o027),
    )
    .await
    .unwrap();
    assert_eq!(plain.mode, 0o640);
    assert_eq!(
        errno(meta.getxattr(plain.handle, ACCESS_XATTR)),
        Err(ENODATA)
    );
    // A default ACL removed is no longer given; removing it from a file is no error.
    let remove = Op::RemoveXattr {
        handle: project,
        name: DEFAULT_XATTR.to_vec(),
    };
    assert_eq!(errno(meta.apply_as(alice.clone(), remove).await), Ok(()));
    let after = make(
        &meta,
        &alice,
        project,
        "after",
        NewNode::file(0o666, 0, 0).with_umask(0o022),
    )
    .await
    .unwrap();
    assert_eq!(after.mode, 0o644);
    let remove = Op::RemoveXattr {
        handle: plain.handle,
        name: DEFAULT_XATTR.to_vec(),
    };
    assert_eq!(errno(meta.apply_as(alice.clone(), remove).await), Ok(()));
    // Unlinking a file with ACLs takes them along.
    let unlink = Op::Unlink {
        parent: project,
        name: b"f".to_vec(),
        keep: Vec::new(),
    };
    assert_eq!(errno(meta.apply_as(alice.clone(), unlink).await), Ok(()));
    fsck_clean(&store);
}

/// The 100 000th create, chmod, read and unlink under a default ACL, by a user the ACLs
/// alone let in, from 16 tasks at once (commit groups hold many, and read the directory's
/// default ACL once each): every one is decided as the first was, each file takes the ACL,
/// and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_nodes_under_a_default_acl_are_decided_as_the_first() {
    let (meta, store) = world().await;
    let meta = Arc::new(meta);
    let owner = caller(OWNER, OWNER, &[]);
    let project = make(&meta, &owner, ROOT, "p", NewNode::dir(0o700, 0, 0))
        .await
        .unwrap()
        .handle;
    let acl = encode(&[
        (0x01, 7, UNDEFINED),
        (0x02, 7, 1001),
        (0x04, 0, UNDEFINED),
        (0x10, 7, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]);
    for name in [ACCESS_XATTR, DEFAULT_XATTR] {
        assert_eq!(set(&meta, &owner, project, name, acl.clone()).await, Ok(()));
    }
    const ROUNDS: u64 = 100_000 / 16;
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let meta = meta.clone();
            tokio::spawn(async move {
                let bob = caller(1001, 1001, &[]);
                let carol = caller(1002, 1002, &[]);
                for i in 0..ROUNDS {
                    let name = format!("t{t}.{}", i % 4);
                    let node = NewNode::file(0o666, 0, 0).with_umask(0o077);
                    let made = make(&meta, &bob, project, &name, node).await.unwrap();
                    assert_eq!(made.mode, 0o660, "round {i}");
                    let chmod = Op::SetAttr {
                        handle: made.handle,
                        attr: SetAttr {
                            mode: Some(0o640),
                            ..SetAttr::default()
                        },
                    };
                    meta.apply_as(bob.clone(), chmod).await.unwrap();
                    assert!(meta.read_map_as(&bob, made.handle, 0, 1).is_ok());
                    assert_eq!(
                        errno(meta.read_map_as(&carol, made.handle, 0, 1)),
                        Err(EACCES)
                    );
                    let unlink = Op::Unlink {
                        parent: project,
                        name: name.into_bytes(),
                        keep: Vec::new(),
                    };
                    meta.apply_as(bob.clone(), unlink).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(meta.readdir(project, 0, 16).unwrap().len(), 0);
    fsck_clean(&store);
}
