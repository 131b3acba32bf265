//! Model-based test: the real manager and a per-byte model run side by side on random
//! sequences of set, unlock, test and release, with several owners and overlapping ranges.
//! The model keeps, for each owner, the lock type of every byte of a small file; POSIX's lock
//! list is then just the maximal runs of equal type, which is what the real manager must hold
//! after every step. Every answer is compared too.

use calm_locks::{Lock, LockKind, Range, RangeLocks};
use proptest::prelude::*;

const SIZE: usize = 48;
const OWNERS: u64 = 4;

#[derive(Debug, Clone)]
enum Op {
    Set(u64, u64, u64, LockKind),
    Unlock(u64, u64, u64),
    Test(u64, u64, u64, LockKind),
    Release(u64),
}

fn kind() -> impl Strategy<Value = LockKind> {
    prop_oneof![Just(LockKind::Read), Just(LockKind::Write)]
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SIZE as u64, 0..12u64).prop_map(|(a, len)| (a, (a + len).min(SIZE as u64 - 1)))
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 1..=OWNERS;
    prop_oneof![
        6 => (owner.clone(), range(), kind()).prop_map(|(o, (a, b), k)| Op::Set(o, a, b, k)),
        2 => (owner.clone(), range()).prop_map(|(o, (a, b))| Op::Unlock(o, a, b)),
        2 => (owner.clone(), range(), kind()).prop_map(|(o, (a, b), k)| Op::Test(o, a, b, k)),
        1 => owner.prop_map(Op::Release),
    ]
}

/// `bytes[owner][offset]`: the type `owner` holds on that byte.
struct Model {
    bytes: Vec<[Option<LockKind>; SIZE]>,
}

impl Model {
    fn new() -> Self {
        Model {
            bytes: vec![[None; SIZE]; OWNERS as usize + 1],
        }
    }

    fn conflicts(&self, owner: u64, a: u64, b: u64, kind: LockKind) -> bool {
        (1..=OWNERS).filter(|o| *o != owner).any(|o| {
            (a..=b).any(|x| match self.bytes[o as usize][x as usize] {
                None => false,
                Some(held) => held == LockKind::Write || kind == LockKind::Write,
            })
        })
    }

    fn set_bytes(&mut self, owner: u64, a: u64, b: u64, value: Option<LockKind>) {
        for x in a..=b {
            self.bytes[owner as usize][x as usize] = value;
        }
    }

    /// The lock list: maximal runs of one type per owner, ordered by owner then start.
    fn locks(&self) -> Vec<Lock> {
        let mut out = Vec::new();
        for owner in 1..=OWNERS {
            let row = &self.bytes[owner as usize];
            let mut x = 0;
            while x < SIZE {
                match row[x] {
                    None => x += 1,
                    Some(kind) => {
                        let start = x;
                        while x < SIZE && row[x] == Some(kind) {
                            x += 1;
                        }
                        out.push(Lock {
                            owner,
                            range: Range {
                                start: start as u64,
                                end: x as u64 - 1,
                            },
                            kind,
                        });
                    }
                }
            }
        }
        out
    }

    /// Whether `lock` is a real conflict for the request: held now, by another owner,
    /// overlapping, of a conflicting type.
    fn is_conflict(&self, lock: &Lock, owner: u64, a: u64, b: u64, kind: LockKind) -> bool {
        lock.owner != owner
            && self.locks().contains(lock)
            && lock.range.start <= b
            && a <= lock.range.end
            && (lock.kind == LockKind::Write || kind == LockKind::Write)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn manager_matches_the_byte_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut real = RangeLocks::new();
        let mut model = Model::new();
        for op in &ops {
            match *op {
                Op::Set(owner, a, b, kind) => {
                    let answer = real.set(owner, Range { start: a, end: b }, kind);
                    if model.conflicts(owner, a, b, kind) {
                        let conflict = answer.expect_err("the model saw a conflict");
                        prop_assert!(model.is_conflict(&conflict, owner, a, b, kind), "{:?} is not a conflict for {:?}", conflict, op);
                    } else {
                        prop_assert!(answer.is_ok(), "{:?} refused: {:?}", op, answer);
                        model.set_bytes(owner, a, b, Some(kind));
                    }
                }
                Op::Unlock(owner, a, b) => {
                    real.unlock(owner, Range { start: a, end: b });
                    model.set_bytes(owner, a, b, None);
                }
                Op::Test(owner, a, b, kind) => {
                    let answer = real.test(owner, Range { start: a, end: b }, kind);
                    match answer {
                        Some(conflict) => prop_assert!(model.is_conflict(&conflict, owner, a, b, kind), "{:?}: {:?}", op, conflict),
                        None => prop_assert!(!model.conflicts(owner, a, b, kind), "{:?} missed a conflict", op),
                    }
                }
                Op::Release(owner) => {
                    let held = model.locks().iter().filter(|l| l.owner == owner).count();
                    prop_assert_eq!(real.release_owner(owner).len(), held);
                    model.set_bytes(owner, 0, SIZE as u64 - 1, None);
                }
            }
            prop_assert_eq!(real.locks(), model.locks(), "after {:?}", op);
            if let Err(e) = real.check_consistency() {
                prop_assert!(false, "inconsistent after {:?}: {}", op, e);
            }
        }
    }
}
