//! The fan-out against a model that tests every watcher against every change (what the index
//! exists to avoid), on random watchers (directories, subtrees, handles; live or catching up
//! from an old index), changes and takes: every watcher must receive exactly the model's events.

use std::collections::BTreeMap;
use std::sync::Arc;

use calm_watch::{Change, Event, Fanout, Limits, Target};
use proptest::prelude::*;

/// A fixed tree: directory → parent (the root, 1, is its own parent).
const TREE: [(u64, u64); 6] = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 4), (6, 3)];

fn parent(dir: u64) -> u64 {
    TREE.iter()
        .find(|(d, _)| *d == dir)
        .map(|(_, p)| *p)
        .expect("a directory of the tree")
}

/// Every directory above `dirs` (not `dirs` themselves), up to the root.
fn ancestors(change: &Change) -> Vec<u64> {
    let mut out = Vec::new();
    for mut dir in change.dirs() {
        while dir != 1 {
            dir = parent(dir);
            if !out.contains(&dir) {
                out.push(dir);
            }
        }
    }
    out
}

fn wants(target: &Target, change: &Change) -> bool {
    match target {
        Target::Handles(handles) => handles.contains(&change.object),
        Target::Dir { handle, recursive } => {
            change.dirs().any(|d| d == *handle)
                || (*recursive && ancestors(change).contains(handle))
        }
        Target::All => true,
    }
}

/// One watcher in the model: a plain list with the queue's rules.
struct ModelWatcher {
    target: Target,
    list: Vec<Arc<Change>>,
    resync: Option<u64>,
}

const QUEUE_MAX: usize = 6;

impl ModelWatcher {
    fn push(&mut self, change: Arc<Change>) {
        // A watcher of everything gets every change (it never coalesces).
        if self.target != Target::All
            && let Some(at) = self.list.iter().position(|c| c.object == change.object)
        {
            self.list.remove(at);
        }
        self.list.push(change.clone());
        if self.list.len() > QUEUE_MAX {
            self.list = vec![change.clone()];
            self.resync = Some(change.index);
        }
    }

    fn take(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        if let Some(from) = self.resync.take() {
            out.push(Event::Resync { from });
        }
        out.extend(self.list.drain(..).map(Event::Change));
        out
    }
}

#[derive(Debug, Clone)]
enum Op {
    Watch {
        target: Target,
        back: Option<u64>,
    },
    Unwatch(usize),
    Publish {
        object: u64,
        dir: u64,
        other_dir: u64,
        more_dirs: Vec<u64>,
    },
    Take(usize),
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        (1u64..=6, any::<bool>()).prop_map(|(handle, recursive)| Target::Dir { handle, recursive }),
        prop::collection::vec(10u64..16, 1..4).prop_map(Target::Handles),
        Just(Target::All),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (target(), prop::option::of(0u64..20)).prop_map(|(target, back)| Op::Watch { target, back }),
        1 => (0usize..8).prop_map(Op::Unwatch),
        6 => (10u64..16, 1u64..=6, prop_oneof![Just(0u64), 1u64..=6])
            .prop_flat_map(|(object, dir, other_dir)| {
                prop::collection::vec(1u64..=6, 0..3)
                    .prop_map(move |more_dirs| Op::Publish { object, dir, other_dir, more_dirs })
            }),
        3 => (0usize..8).prop_map(Op::Take),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_watcher_gets_exactly_the_model_events(ops in prop::collection::vec(op(), 0..200)) {
        let limits = Limits { queue_max: QUEUE_MAX, ..Limits::default() };
        let mut fanout = Fanout::new(limits, 0);
        let mut model: BTreeMap<u64, ModelWatcher> = BTreeMap::new();
        let mut history: Vec<Change> = Vec::new();
        for op in ops {
            match op {
                Op::Watch { target, back } => {
                    let last = fanout.last();
                    let from = match back {
                        None => last + 1,
                        Some(back) => (last + 1).saturating_sub(back).max(1),
                    };
                    let (id, live) = fanout.watch(target.clone(), from).unwrap();
                    let mut watcher = ModelWatcher { target, list: Vec::new(), resync: None };
                    if !live {
                        let replay: Vec<(Change, Vec<u64>)> = history
                            .iter()
                            .filter(|c| c.index >= from)
                            .map(|c| (c.clone(), ancestors(c)))
                            .collect();
                        for (c, _) in &replay {
                            if wants(&watcher.target, c) {
                                watcher.push(Arc::new(c.clone()));
                            }
                        }
                        prop_assert!(fanout.catch_up(id, replay, last, false).unwrap());
                    }
                    model.insert(id, watcher);
                }
                Op::Unwatch(k) => {
                    if let Some(id) = model.keys().nth(k).copied() {
                        fanout.unwatch(id).unwrap();
                        model.remove(&id);
                    }
                }
                Op::Publish { object, dir, other_dir, more_dirs } => {
                    let change = Change {
                        index: fanout.last() + 1,
                        object,
                        dir,
                        other_dir,
                        more_dirs,
                        encoded: Arc::from(&b"x"[..]),
                    };
                    let mut woken = fanout.publish(change.clone(), &ancestors(&change)).to_vec();
                    woken.sort_unstable();
                    let mut expected = Vec::new();
                    for (id, watcher) in &mut model {
                        if wants(&watcher.target, &change) {
                            watcher.push(Arc::new(change.clone()));
                            expected.push(*id);
                        }
                    }
                    prop_assert_eq!(woken, expected, "woken watchers of {:?}", change);
                    history.push(change);
                }
                Op::Take(k) => {
                    if let Some(id) = model.keys().nth(k).copied() {
                        let got = fanout.take(id, usize::MAX, false).unwrap();
                        let want = model.get_mut(&id).unwrap().take();
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}

fn change(index: u64, object: u64, dir: u64) -> Change {
    Change {
        index,
        object,
        dir,
        other_dir: 0,
        more_dirs: Vec::new(),
        encoded: Arc::from(&b"x"[..]),
    }
}

#[test]
fn progress_tells_an_idle_watcher_how_far_the_stream_is() {
    let mut fanout = Fanout::new(Limits::default(), 0);
    let (quiet, _) = fanout
        .watch(
            Target::Dir {
                handle: 6,
                recursive: false,
            },
            1,
        )
        .unwrap();
    for i in 1..=5 {
        let c = change(i, 10 + i, 2);
        let ancestors = ancestors(&c);
        fanout.publish(c, &ancestors);
    }
    assert!(
        !fanout.ready(quiet, false),
        "nothing matched and nothing was asked"
    );
    assert_eq!(fanout.take(quiet, 10, false).unwrap(), []);
    // The caller's own operation committed at index 4: ask to be told when the stream passed it.
    fanout.want_progress(quiet, 4).unwrap();
    assert!(fanout.ready(quiet, false));
    assert_eq!(
        fanout.take(quiet, 10, false).unwrap(),
        [Event::Progress { index: 5 }]
    );
    // The periodic tick says nothing new when nothing moved.
    assert_eq!(fanout.take(quiet, 10, true).unwrap(), []);
    let c = change(6, 20, 2);
    fanout.publish(c, &[1]);
    assert_eq!(
        fanout.take(quiet, 10, true).unwrap(),
        [Event::Progress { index: 6 }]
    );
}

#[test]
fn a_watcher_whose_history_is_purged_resyncs_from_the_live_stream() {
    let mut fanout = Fanout::new(Limits::default(), 100);
    let (id, live) = fanout
        .watch(
            Target::Dir {
                handle: 1,
                recursive: true,
            },
            10,
        )
        .unwrap();
    assert!(!live);
    assert!(fanout.catch_up(id, Vec::new(), 100, true).unwrap());
    let c = change(101, 10, 5);
    fanout.publish(c.clone(), &ancestors(&c));
    let events = fanout.take(id, 10, false).unwrap();
    assert_eq!(events[0], Event::Resync { from: 101 });
    assert!(matches!(&events[1], Event::Change(got) if got.index == 101));
}

/// A watcher that resumes on a server whose feed is behind the changelog (another server
/// committed more, or the feed has not read the last commits yet) replays only what the feed
/// has published; the rest comes from the feed, once, in order.
#[test]
fn a_catch_up_that_reads_past_the_feed_leaves_the_rest_to_the_feed() {
    let mut fanout = Fanout::new(Limits::default(), 100);
    let target = Target::Dir {
        handle: 1,
        recursive: true,
    };
    let (id, live) = fanout.watch(target, 99).unwrap();
    assert!(!live);
    // The changelog has 99..=103; the feed has published up to 100.
    let replay: Vec<(Change, Vec<u64>)> = (99..=103)
        .map(|i| {
            let c = change(i, 10 + i, 5);
            let a = ancestors(&c);
            (c, a)
        })
        .collect();
    assert!(fanout.catch_up(id, replay, 103, false).unwrap());
    for i in 101..=103 {
        let c = change(i, 10 + i, 5);
        fanout.publish(c.clone(), &ancestors(&c));
    }
    let indices: Vec<u64> = fanout
        .take(id, 100, false)
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Change(c) => Some(c.index),
            _ => None,
        })
        .collect();
    assert_eq!(indices, [99, 100, 101, 102, 103]);
}

#[test]
fn limits_are_named() {
    let limits = Limits {
        watchers_max: 1,
        handles_per_watcher_max: 2,
        ..Limits::default()
    };
    let mut fanout = Fanout::new(limits, 0);
    assert_eq!(
        fanout
            .watch(Target::Handles(vec![1, 2, 3]), 1)
            .unwrap_err()
            .to_string(),
        "too many handles in one watch (limit 2)"
    );
    assert_eq!(
        fanout
            .watch(Target::Handles(vec![]), 1)
            .unwrap_err()
            .to_string(),
        "a watch of handles needs at least one"
    );
    fanout.watch(Target::Handles(vec![1]), 1).unwrap();
    assert_eq!(
        fanout
            .watch(Target::Handles(vec![2]), 1)
            .unwrap_err()
            .to_string(),
        "too many watchers (limit 1)"
    );
}

#[test]
fn the_changes_queued_for_watchers_are_counted_until_taken() {
    let mut fanout = Fanout::new(Limits::default(), 0);
    let dir = |handle| Target::Dir {
        handle,
        recursive: false,
    };
    let (busy, _) = fanout.watch(dir(2), 1).unwrap();
    let (other, _) = fanout.watch(dir(3), 1).unwrap();
    for i in 1..=4 {
        let c = change(i, 10 + i, 2);
        let ancestors = ancestors(&c);
        fanout.publish(c, &ancestors);
    }
    let c = change(5, 30, 3);
    let ancestors_of = ancestors(&c);
    fanout.publish(c, &ancestors_of);
    let stats = fanout.stats();
    assert_eq!((stats.queued, stats.queued_max), (5, 4));
    assert_eq!(fanout.take(busy, 10, false).unwrap().len(), 4);
    let stats = fanout.stats();
    assert_eq!((stats.queued, stats.queued_max), (1, 1));
    fanout.take(other, 10, false).unwrap();
    assert_eq!(fanout.stats().queued, 0);
}
