//! Pool assembly: out-of-order arrival, duplicates, removal and re-arrival, a generation
//! change, conflicting labels; and, on random arrival orders with duplicates and departures,
//! every pool activates exactly once, exactly when its last member is present.

use std::collections::{HashMap, HashSet};

use calm_node::label::{Label, Uuid};
use calm_node::pools::{Action, Assembly, PoolState, Refused};
use proptest::prelude::*;

fn uuid(n: u64) -> Uuid {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&n.to_le_bytes());
    u
}

fn label(pool: u64, index: u32, count: u32, generation: u64) -> Label {
    Label {
        target: uuid(1000 + pool * 100 + u64::from(index)),
        pool: uuid(pool),
        pool_name: format!("pool{pool}"),
        index,
        count,
        generation,
    }
}

#[test]
fn a_pool_activates_once_when_its_last_member_arrives_in_any_order() {
    let mut a = Assembly::new();
    assert_eq!(a.arrive(3, &label(1, 3, 4, 1), 0), Ok(None));
    assert_eq!(a.arrive(1, &label(1, 1, 4, 1), 0), Ok(None));
    assert_eq!(a.arrive(0, &label(1, 0, 4, 1), 0), Ok(None));
    assert_eq!(a.pool(&uuid(1)).unwrap().missing, 1);
    assert_eq!(
        a.arrive(2, &label(1, 2, 4, 1), 7),
        Ok(Some(Action::Activate {
            pool: uuid(1),
            degraded: false
        }))
    );
    let pool = a.pool(&uuid(1)).unwrap();
    assert_eq!(
        (pool.state, pool.activated_at),
        (PoolState::Active, Some(7))
    );
}

#[test]
fn duplicates_change_nothing() {
    let mut a = Assembly::new();
    a.arrive(1, &label(1, 0, 2, 1), 0).unwrap();
    assert_eq!(a.arrive(1, &label(1, 0, 2, 1), 0), Err(Refused::Duplicate));
    assert_eq!(a.pool(&uuid(1)).unwrap().missing, 1);
}

#[test]
fn removal_degrades_and_return_restores_without_a_second_activation() {
    let mut a = Assembly::new();
    a.arrive(1, &label(1, 0, 2, 1), 0).unwrap();
    assert!(matches!(
        a.arrive(2, &label(1, 1, 2, 1), 0),
        Ok(Some(Action::Activate { .. }))
    ));
    assert_eq!(a.depart(2), Some(Action::Degraded { pool: uuid(1) }));
    assert_eq!(a.pool(&uuid(1)).unwrap().state, PoolState::Degraded);
    assert_eq!(a.depart(2), None, "already gone");
    assert_eq!(
        a.arrive(2, &label(1, 1, 2, 1), 0),
        Ok(Some(Action::Restored { pool: uuid(1) }))
    );
}

#[test]
fn a_newer_generation_restarts_assembly_and_older_labels_are_stale() {
    let mut a = Assembly::new();
    a.arrive(1, &label(1, 0, 2, 1), 0).unwrap();
    a.arrive(2, &label(1, 1, 2, 1), 0).unwrap();
    // The pool is re-created with three members: generation 2.
    assert_eq!(a.arrive(3, &label(1, 0, 3, 2), 0), Ok(None));
    let pool = a.pool(&uuid(1)).unwrap();
    assert_eq!(
        (pool.count, pool.missing, pool.state),
        (3, 2, PoolState::Assembling)
    );
    assert_eq!(
        a.arrive(4, &label(1, 1, 2, 1), 0),
        Err(Refused::Stale {
            generation: 1,
            pool_generation: 2
        })
    );
    a.arrive(5, &label(1, 1, 3, 2), 0).unwrap();
    assert!(matches!(
        a.arrive(6, &label(1, 2, 3, 2), 0),
        Ok(Some(Action::Activate {
            degraded: false,
            ..
        }))
    ));
}

#[test]
fn conflicting_labels_are_refused_and_change_nothing() {
    let mut a = Assembly::new();
    a.arrive(1, &label(1, 0, 2, 1), 0).unwrap();
    let Err(Refused::Conflict(why)) = a.arrive(2, &label(1, 0, 2, 1), 0) else {
        panic!("two devices claimed member 0");
    };
    assert!(why.contains("already device 1"), "{why}");
    let other_count = label(1, 1, 3, 1);
    assert!(matches!(
        a.arrive(3, &other_count, 0),
        Err(Refused::Conflict(_))
    ));
    let pool = a.pool(&uuid(1)).unwrap();
    assert_eq!((pool.missing, a.members()), (1, 1));
}

#[test]
fn a_pool_can_activate_degraded_after_a_timeout() {
    let mut a = Assembly::new();
    assert_eq!(a.activate_degraded(&uuid(1), 0), None, "unknown pool");
    a.arrive(1, &label(1, 0, 3, 1), 0).unwrap();
    assert_eq!(
        a.activate_degraded(&uuid(1), 9),
        Some(Action::Activate {
            pool: uuid(1),
            degraded: true
        })
    );
    a.arrive(2, &label(1, 1, 3, 1), 0).unwrap();
    assert_eq!(
        a.arrive(3, &label(1, 2, 3, 1), 0),
        Ok(Some(Action::Restored { pool: uuid(1) })),
        "complete later: restored, not activated twice"
    );
}

#[derive(Debug, Clone)]
enum Step {
    Arrive(usize),
    Depart(usize),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_pool_activates_exactly_once_when_complete(
        pools in 1u64..6,
        steps in prop::collection::vec(
            prop_oneof![4 => (0usize..24).prop_map(Step::Arrive), 1 => (0usize..24).prop_map(Step::Depart)],
            0..200,
        ),
    ) {
        // Devices 0..4*pools: device d is member d % 4 of pool d / 4.
        let devices = (pools * 4) as usize;
        let mut a = Assembly::new();
        let mut present: HashSet<usize> = HashSet::new();
        let mut activations: HashMap<u64, u32> = HashMap::new();
        for step in steps {
            match step {
                Step::Arrive(d) if d < devices => {
                    let l = label(d as u64 / 4, (d % 4) as u32, 4, 1);
                    match a.arrive(d as u64, &l, 0) {
                        Ok(Some(Action::Activate { pool, degraded })) => {
                            prop_assert!(!degraded);
                            *activations.entry(u64::from_le_bytes(pool[..8].try_into().unwrap())).or_default() += 1;
                        }
                        Ok(_) => {}
                        Err(Refused::Duplicate) => prop_assert!(present.contains(&d)),
                        Err(other) => prop_assert!(false, "unexpected {other:?}"),
                    }
                    present.insert(d);
                }
                Step::Depart(d) if d < devices => {
                    a.depart(d as u64);
                    present.remove(&d);
                }
                _ => {}
            }
            // The bookkeeping is the brute-force count, for every pool.
            for p in 0..pools {
                let here = (0..4).filter(|i| present.contains(&((p * 4 + i) as usize))).count() as u32;
                let complete_once = activations.get(&p).copied().unwrap_or(0);
                match a.pool(&uuid(p)) {
                    Some(pool) => {
                        prop_assert_eq!(pool.missing, 4 - here);
                        prop_assert!(complete_once <= 1, "pool {} activated {} times", p, complete_once);
                        prop_assert_eq!(pool.state == PoolState::Active, here == 4);
                        prop_assert_eq!(complete_once == 1, pool.state != PoolState::Assembling);
                    }
                    None => prop_assert_eq!(here, 0),
                }
            }
        }
    }
}
