//! Deciders, takeovers, and a simulated group of servers checked for double deciders.

use super::*;
use proptest::prelude::*;

const CONFIG: PeersConfig = PeersConfig {
    lease_ms: 1_000,
    grace_ms_max: 5_000,
};

#[test]
fn every_file_has_one_owner_and_a_leaving_server_moves_only_its_own_files() {
    let three = [11, 22, 33];
    let two = [11, 33];
    let mut counts = BTreeMap::new();
    for resource in 0..30_000u64 {
        let owner = owner_of(resource, &three).unwrap();
        *counts.entry(owner).or_insert(0u32) += 1;
        // The order of the members does not matter.
        assert_eq!(owner_of(resource, &[33, 11, 22]), Some(owner));
        let after = owner_of(resource, &two).unwrap();
        if owner != 22 {
            assert_eq!(
                after, owner,
                "file {resource} moved without its owner leaving"
            );
        }
    }
    // Spread: each of three servers decides about a third of the files.
    for (server, count) in counts {
        assert!((8_000..12_000).contains(&count), "{server}: {count}");
    }
    assert_eq!(owner_of(5, &[]), None);
    assert_eq!(server_of_session((7 << 32) | 3), 7);
}

/// A member of `view` whose own joining takeover is over.
fn confirmed(me: ServerId, view: &[ServerId], now: u64) -> Peers {
    let mut peers = Peers::new(me, CONFIG);
    peers.set_view(view.to_vec(), now);
    peers.confirmed(view, now);
    let others: Vec<ServerId> = view.iter().copied().filter(|s| *s != me).collect();
    for other in &others {
        peers.ack(*other, view.to_vec(), now);
    }
    peers.holders(&others, &[], now);
    assert_eq!(peers.takeovers_active(now), 0);
    peers
}

fn file_moving(from: ServerId, to: ServerId, before: &[ServerId], after: &[ServerId]) -> u64 {
    (0..)
        .find(|r| owner_of(*r, before) == Some(from) && owner_of(*r, after) == Some(to))
        .unwrap()
}

#[test]
fn a_dead_servers_files_are_in_grace_until_its_sessions_reclaimed() {
    let mut c = confirmed(1, &[1, 2, 3], 0);
    let kept = (0..).find(|r| owner_of(*r, &[1, 2, 3]) == Some(1)).unwrap();
    let moving = file_moving(2, 1, &[1, 2, 3], &[1, 3]);
    assert_eq!(c.route(moving, 10, None), Route::Elsewhere(2));
    // 2 left (its lease ran out): its files come to 1 and 3 only from it, so nobody living
    // has to acknowledge anything; the sessions it opened must reclaim.
    let effects = c.set_view(vec![3, 1], 100);
    assert_eq!(
        effects,
        vec![
            Effect::DropMoved,
            Effect::Ack(vec![1, 3]),
            Effect::ReadHolders(vec![2])
        ]
    );
    c.confirmed(&[1, 3], 100);
    assert_eq!(c.route(moving, 200, None), Route::Grace);
    let s2a = (2 << 32) | 1;
    let s2b = (2 << 32) | 2;
    // Before the sessions are read, nobody is known to have held anything there: reclaims
    // wait and reports are refused.
    assert_eq!(c.route(moving, 200, Some("ann")), Route::Grace);
    assert!(!c.reclaim_done(&[s2a], &[1, 3], "ann", 200));
    assert_eq!(c.route(kept, 200, None), Route::Mine, "own files stay free");
    // Sessions of other servers are not waited for.
    let holders = [
        (s2a, "ann".to_string()),
        (s2b, "bob".to_string()),
        ((3 << 32) | 1, "eve".to_string()),
    ];
    c.holders(&[2], &holders, 300);
    assert_eq!(c.route(moving, 400, None), Route::Grace);
    assert_eq!(c.route(moving, 400, Some("ann")), Route::Mine);
    assert_eq!(
        c.route(moving, 400, Some("eve")),
        Route::Grace,
        "eve had no session on 2: nothing to reclaim here"
    );
    // A report under another view does not count.
    assert!(!c.reclaim_done(&[s2a, s2b], &[1, 2, 3], "ann", 400));
    // Eve cannot end the grace by naming others' sessions.
    assert!(c.reclaim_done(&[s2a, s2b], &[1, 3], "eve", 400));
    assert_eq!(c.route(moving, 400, None), Route::Grace);
    assert!(c.reclaim_done(&[s2a, s2b], &[1, 3], "ann", 400));
    assert_eq!(
        c.route(moving, 400, None),
        Route::Grace,
        "bob has not reported"
    );
    assert!(c.reclaim_done(&[s2b, 77], &[3, 1], "bob", 500));
    assert_eq!(c.route(moving, 500, None), Route::Mine);
    assert_eq!(c.takeovers_active(500), 0);
    assert_eq!(
        c.counts(),
        // Its joining takeover (over at once) and 2's files (400 ms of grace).
        PeersCounts {
            views_changed: 1,
            takeovers: 2,
            ended_reclaimed: 2,
            grace_ms: 400,
            ..PeersCounts::default()
        }
    );
}

#[test]
fn a_grace_ends_at_its_limits_without_acknowledgements_or_reports() {
    // 4 joins 1 and 2, which never acknowledge: a lease later they cannot be deciding any
    // more; then the sessions that never report are waited for grace_ms_max.
    let mut c = Peers::new(4, CONFIG);
    c.set_view(vec![1, 2, 4], 100);
    c.confirmed(&[1, 2, 4], 900);
    let moving = file_moving(1, 4, &[1, 2], &[1, 2, 4]);
    assert_eq!(c.next_deadline(), Some(1_100));
    assert!(c.tick(1_099).is_empty());
    assert_eq!(c.tick(1_100), vec![Effect::ReadHolders(vec![1, 2])]);
    c.holders(&[1, 2], &[((2 << 32) | 5, "ann".into())], 1_100);
    c.confirmed(&[1, 2, 4], 5_500);
    assert_eq!(c.route(moving, 6_099, None), Route::Grace);
    assert_eq!(c.next_deadline(), Some(6_100));
    assert_eq!(c.route(moving, 6_100, None), Route::Mine);
    assert!(c.tick(6_100).is_empty());
    assert_eq!(
        c.counts(),
        PeersCounts {
            takeovers: 1,
            ended_deadline: 1,
            grace_ms: 6_000,
            ..PeersCounts::default()
        }
    );
}

#[test]
fn a_server_decides_only_within_a_confirmed_lease() {
    let mut c = Peers::new(1, CONFIG);
    assert_eq!(c.route(1, 0, None), Route::Lapsed, "nothing before a view");
    c.set_view(vec![1], 0);
    assert_eq!(c.route(1, 0, None), Route::Lapsed, "nothing before a round");
    // A round with another view than the applied one confirms nothing.
    c.confirmed(&[1, 2], 10);
    assert_eq!(c.route(1, 10, None), Route::Lapsed);
    c.confirmed(&[1], 10);
    assert_eq!(c.route(1, 1_009, None), Route::Mine);
    assert_eq!(c.route(1, 1_010, None), Route::Lapsed);
    // Dropped from the view (its lease ran out in the registry): nothing, also later.
    assert_eq!(c.set_view(vec![2], 1_020), vec![Effect::DropMoved]);
    c.confirmed(&[2], 1_020);
    assert_eq!(c.route(1, 1_030, None), Route::Lapsed);
}

#[test]
fn a_joining_server_waits_for_the_others_to_stop_deciding() {
    // 4 joins 1 and 2: the files that come to it are in grace until both acknowledge.
    let mut c = Peers::new(4, CONFIG);
    let effects = c.set_view(vec![1, 2, 4], 0);
    assert_eq!(effects, vec![Effect::DropMoved, Effect::Ack(vec![1, 2, 4])]);
    c.confirmed(&[1, 2, 4], 0);
    let moving = file_moving(1, 4, &[1, 2], &[1, 2, 4]);
    assert_eq!(c.route(moving, 10, None), Route::Grace);
    assert!(c.ack(1, vec![1, 2, 4], 10).is_empty());
    // An acknowledgement of an older view is not one.
    assert!(c.ack(2, vec![1, 2], 20).is_empty());
    assert_eq!(
        c.ack(2, vec![1, 2, 4], 30),
        vec![Effect::ReadHolders(vec![1, 2])]
    );
    c.holders(&[1, 2], &[], 30);
    assert_eq!(c.route(moving, 40, None), Route::Mine);
    // The first server of a group of peers takes over nobody's files.
    let mut first = Peers::new(9, CONFIG);
    first.set_view(vec![9], 0);
    first.confirmed(&[9], 0);
    assert_eq!(first.route(3, 1, None), Route::Mine);
}

/// One step of the simulated servers.
#[derive(Debug, Clone)]
enum Step {
    /// Time passes.
    Advance(u64),
    /// Server i renews its lease and reads the view (if it can reach the registry).
    Round(usize),
    /// Server i's watch delivers the registry's members and acknowledgements.
    Deliver(usize),
    /// Server i can (not) reach the registry.
    Cut(usize, bool),
    /// Server i dies; a new server takes its place in the slot (a restart, with a new id).
    Restart(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..400).prop_map(Step::Advance),
        (0usize..3).prop_map(Step::Round),
        (0usize..3).prop_map(Step::Deliver),
        (0usize..3, any::<bool>()).prop_map(|(i, cut)| Step::Cut(i, cut)),
        (0usize..3).prop_map(Step::Restart),
    ]
}

struct Node {
    peers: Peers,
    cut: bool,
}

/// The registry: members with the time their lease runs out, and acknowledgements.
#[derive(Default)]
struct Registry {
    expiry: BTreeMap<ServerId, u64>,
    acks: BTreeMap<ServerId, Vec<ServerId>>,
}

impl Registry {
    fn expire(&mut self, now: u64) {
        self.expiry.retain(|_, until| *until > now);
        let expiry = &self.expiry;
        self.acks.retain(|s, _| expiry.contains_key(s));
    }

    fn view(&self) -> Vec<ServerId> {
        self.expiry.keys().copied().collect()
    }
}

fn carry_out(node: &mut Node, registry: &mut Registry, effects: Vec<Effect>, now: u64) {
    for effect in effects {
        match effect {
            Effect::DropMoved => {}
            Effect::Ack(view) => {
                if !node.cut && registry.expiry.contains_key(&node.peers.me()) {
                    registry.acks.insert(node.peers.me(), view);
                }
            }
            Effect::ReadHolders(servers) => node.peers.holders(&servers, &[], now),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the order of renewals, watch deliveries, cuts and restarts, no file ever has
    /// two servers that would grant a new lock on it at the same time.
    #[test]
    fn no_file_is_ever_decided_by_two_servers(steps in prop::collection::vec(step(), 1..200)) {
        let lease = CONFIG.lease_ms;
        let mut now = 0u64;
        let mut next_id = 4;
        let mut registry = Registry::default();
        let mut nodes: Vec<Node> = (1..=3)
            .map(|id| Node { peers: Peers::new(id, CONFIG), cut: false })
            .collect();
        for node in &nodes {
            registry.expiry.insert(node.peers.me(), lease);
        }
        for step in steps {
            match step {
                Step::Advance(ms) => now += ms,
                Step::Cut(i, cut) => nodes[i].cut = cut,
                Step::Restart(i) => {
                    nodes[i] = Node { peers: Peers::new(next_id, CONFIG), cut: false };
                    registry.expiry.insert(next_id, now + lease);
                    next_id += 1;
                }
                Step::Round(i) => {
                    registry.expire(now);
                    let node = &mut nodes[i];
                    let me = node.peers.me();
                    if !node.cut && registry.expiry.contains_key(&me) {
                        // etcd receives the renewal after it was sent: the lease runs from then.
                        registry.expiry.insert(me, now + lease);
                        let view = registry.view();
                        let effects = node.peers.set_view(view.clone(), now);
                        carry_out(node, &mut registry, effects, now);
                        node.peers.confirmed(&view, now);
                    }
                }
                Step::Deliver(i) => {
                    registry.expire(now);
                    let node = &mut nodes[i];
                    if !node.cut {
                        let effects = node.peers.set_view(registry.view(), now);
                        carry_out(node, &mut registry, effects, now);
                        for (server, view) in registry.acks.clone() {
                            let effects = node.peers.ack(server, view, now);
                            carry_out(node, &mut registry, effects, now);
                        }
                    }
                }
            }
            for node in &mut nodes {
                let effects = node.peers.tick(now);
                carry_out(node, &mut registry, effects, now);
            }
            for resource in 0..48u64 {
                let deciders: Vec<ServerId> = nodes
                    .iter()
                    .filter(|n| n.peers.route(resource, now, None) == Route::Mine)
                    .map(|n| n.peers.me())
                    .collect();
                prop_assert!(deciders.len() <= 1, "file {} at {}: {:?}", resource, now, deciders);
            }
        }
    }
}
