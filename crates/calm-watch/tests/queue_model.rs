//! The coalescing queue against an obviously correct list model, on random sequences of
//! pushes and takes: every event must be the model's, and a watcher that applies what it is
//! given (re-reading the whole state on a resync) must end with exactly the true state.

use std::collections::HashMap;
use std::sync::Arc;

use calm_watch::{Change, Event, Queue};
use proptest::prelude::*;

/// The model: a plain list, scanned.
struct Model {
    list: Vec<Arc<Change>>,
    resync: Option<u64>,
    max: usize,
    /// An exact queue: nothing coalesced.
    exact: bool,
}

impl Model {
    fn push(&mut self, change: Arc<Change>) {
        if !self.exact
            && let Some(at) = self.list.iter().position(|c| c.object == change.object)
        {
            self.list.remove(at);
        }
        self.list.push(change.clone());
        if self.list.len() > self.max {
            self.list = vec![change.clone()];
            self.resync = Some(change.index);
        }
    }

    fn take(&mut self, max: usize) -> Vec<Event> {
        let mut out = Vec::new();
        if max == 0 {
            return out;
        }
        if let Some(from) = self.resync.take() {
            out.push(Event::Resync { from });
        }
        while out.len() < max && !self.list.is_empty() {
            out.push(Event::Change(self.list.remove(0)));
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Op {
    Push(u64),
    Take(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0u64..10).prop_map(Op::Push),
            1 => (0usize..6).prop_map(Op::Take),
        ],
        0..300,
    )
}

fn change(index: u64, object: u64) -> Arc<Change> {
    Arc::new(Change {
        index,
        object,
        dir: 1,
        other_dir: 0,
        more_dirs: Vec::new(),
        encoded: Arc::from(index.to_le_bytes().as_slice()),
    })
}

/// What a watcher does with its events: keeps the latest index it knows per object.
fn apply(replica: &mut HashMap<u64, u64>, truth: &HashMap<u64, u64>, events: &[Event]) {
    for event in events {
        match event {
            Event::Change(c) => {
                let seen = replica.entry(c.object).or_default();
                *seen = (*seen).max(c.index);
            }
            Event::Resync { .. } => replica.clone_from(truth),
            Event::Progress { .. } => unreachable!("queues make no progress events"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_queue_is_the_list_model_and_loses_nothing(
        max in 1usize..8,
        exact in any::<bool>(),
        ops in ops(),
    ) {
        let mut queue = if exact { Queue::exact(max) } else { Queue::new(max) };
        let mut model = Model { list: Vec::new(), resync: None, max, exact };
        // Exact: every change pushed, and what the watcher got since its last resync (which
        // must be every change from that resync's index on, in order).
        let mut pushed: Vec<u64> = Vec::new();
        let mut since_resync: (u64, Vec<u64>) = (1, Vec::new());
        let mut truth: HashMap<u64, u64> = HashMap::new();
        let mut replica: HashMap<u64, u64> = HashMap::new();
        let mut index = 0;
        for op in ops {
            match op {
                Op::Push(object) => {
                    index += 1;
                    let c = change(index, object);
                    truth.insert(object, index);
                    pushed.push(index);
                    queue.push(c.clone());
                    model.push(c);
                }
                Op::Take(n) => {
                    let mut got = Vec::new();
                    queue.take(n, &mut got);
                    let want = model.take(n);
                    prop_assert_eq!(&got, &want);
                    apply(&mut replica, &truth, &got);
                    for event in &got {
                        match event {
                            Event::Resync { from } => since_resync = (*from, Vec::new()),
                            Event::Change(c) => since_resync.1.push(c.index),
                            Event::Progress { .. } => {}
                        }
                    }
                }
            }
            prop_assert!(queue.len() <= max, "queue of {} past its limit {max}", queue.len());
            prop_assert_eq!(queue.len(), model.list.len());
        }
        // Drain: the watcher now knows exactly the true state.
        let mut rest = Vec::new();
        queue.take(usize::MAX, &mut rest);
        apply(&mut replica, &truth, &rest);
        prop_assert!(queue.is_empty());
        prop_assert_eq!(replica, truth);
        if exact {
            for event in &rest {
                match event {
                    Event::Resync { from } => since_resync = (*from, Vec::new()),
                    Event::Change(c) => since_resync.1.push(c.index),
                    Event::Progress { .. } => {}
                }
            }
            let (from, got) = since_resync;
            let want: Vec<u64> = pushed.into_iter().filter(|i| *i >= from).collect();
            prop_assert_eq!(got, want, "an exact queue delivers every change from its resync");
        }
    }
}

#[test]
fn a_watcher_that_keeps_up_sees_every_change() {
    let mut queue = Queue::new(2);
    let mut seen = Vec::new();
    for i in 1..=100 {
        queue.push(change(i, i % 3));
        let mut out = Vec::new();
        queue.take(10, &mut out);
        seen.extend(out);
    }
    assert_eq!(seen.len(), 100);
    assert_eq!(queue.stats().coalesced, 0);
    assert_eq!(queue.stats().resyncs, 0);
}

#[test]
fn a_lagging_watcher_gets_the_latest_per_object_then_one_resync() {
    let mut queue = Queue::new(3);
    for (index, object) in [(1, 7), (2, 8), (3, 7), (4, 7)] {
        queue.push(change(index, object));
    }
    let mut out = Vec::new();
    queue.take(10, &mut out);
    let indices: Vec<u64> = out
        .iter()
        .map(|e| match e {
            Event::Change(c) => c.index,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(indices, [2, 4], "object 7 coalesced to its latest change");

    for index in 5..=9 {
        queue.push(change(index, index)); // five objects: past the limit of 3
    }
    let mut out = Vec::new();
    queue.take(10, &mut out);
    assert_eq!(out[0], Event::Resync { from: 8 }, "{out:?}");
    assert_eq!(out.len(), 3, "then 8 and 9: {out:?}");
    assert_eq!(queue.stats().resyncs, 1);
}
