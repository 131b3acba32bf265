//! Who loads a server: requests and the time spent answering them, per user or per job, in a
//! table of bounded size. Counting a key already in the table takes no lock (its slot is found
//! by hashing and its counters are atomics); a new key takes a free slot (a lock on that rare
//! path only, to record its name); when none is free its requests go to "other", so a client
//! inventing identities or job ids cannot grow the table. A sweep ([`Load::sweep`], at each
//! reading) frees the slots of keys idle since the last one, their figures kept in "other",
//! so the table follows who is loading the server now.

use std::hash::{BuildHasher, RandomState};

use crate::sync::{AtomicU64, Mutex, Ordering, spin};

/// Slots of a table: keys counted by name at once.
pub const LOAD_SLOTS: usize = 256;

/// Slots looked at for a key before its requests go to "other".
const PROBES: usize = 8;

/// A slot's hash when it is free (a key hashing to 0 or 1 is moved off them).
const FREE: u64 = 0;
/// A slot's hash while a count claims it or a sweep frees it: a count that finds it waits
/// (a few stores), so that two counts of a new key never claim two slots for it.
const FREEING: u64 = 1;

/// Most bytes of a key kept (longer ones are cut).
pub const LOAD_KEY_BYTES_MAX: usize = 64;

#[derive(Debug, Default)]
struct Slot {
    hash: AtomicU64,
    requests: AtomicU64,
    nanos: AtomicU64,
    /// The requests counted at the last sweep (idle since: freed at the next).
    swept: AtomicU64,
    name: Mutex<String>,
}

/// One key's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub key: String,
    pub requests: u64,
    pub nanos: u64,
}

/// A table of requests and time per key. Keys are placed by a hasher with random keys
/// (`RandomState`), so that a client cannot choose ids that collide.
#[derive(Debug)]
pub struct Load<H = RandomState> {
    slots: Box<[Slot]>,
    hasher: H,
    other_requests: AtomicU64,
    other_nanos: AtomicU64,
}

impl Default for Load {
    fn default() -> Self {
        Load::with_slots(LOAD_SLOTS, RandomState::new())
    }
}

impl<H: BuildHasher> Load<H> {
    /// A table of `slots` slots (at least one) placing keys with `hasher` (a model of the
    /// table's races takes few slots and a hasher that places the same way in every run).
    pub fn with_slots(slots: usize, hasher: H) -> Load<H> {
        Load {
            slots: (0..slots.max(1)).map(|_| Slot::default()).collect(),
            hasher,
            other_requests: AtomicU64::new(0),
            other_nanos: AtomicU64::new(0),
        }
    }

    /// One request of `key` that took `nanos`.
    pub fn count(&self, key: &str, nanos: u64) {
        let key = cut(key);
        let hash = match self.hasher.hash_one(key) {
            FREE | FREEING => 2,
            hash => hash,
        };
        let start = hash as usize % self.slots.len();
        for probe in 0..PROBES {
            let slot = &self.slots[(start + probe) % self.slots.len()];
            if self.count_in(slot, key, hash, nanos) {
                return;
            }
        }
        self.other_requests.fetch_add(1, Ordering::Relaxed);
        self.other_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Counts the request in `slot` if the slot is `key`'s or free (then claimed for it);
    /// false if it is another key's.
    fn count_in(&self, slot: &Slot, key: &str, hash: u64, nanos: u64) -> bool {
        loop {
            match slot.hash.load(Ordering::Acquire) {
                // Being claimed (perhaps for this key) or freed: settled in a few stores.
                FREEING => spin(),
                FREE => {
                    // Claim it: the winner names it; a loser looks again.
                    if slot
                        .hash
                        .compare_exchange(FREE, FREEING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.claim(slot, key, hash);
                    }
                }
                seen if seen == hash => {
                    slot.requests.fetch_add(1, Ordering::Relaxed);
                    slot.nanos.fetch_add(nanos, Ordering::Relaxed);
                    return true;
                }
                _ => return false,
            }
        }
    }

    /// Names a slot this count took from free, and opens it to `hash`'s counts.
    fn claim(&self, slot: &Slot, key: &str, hash: u64) {
        *slot.name.lock().unwrap_or_else(|e| e.into_inner()) = key.to_string();
        slot.swept.store(0, Ordering::Relaxed);
        // What a count racing the slot's last sweep left in it was its old key's.
        let stray = slot.requests.swap(0, Ordering::Relaxed);
        let stray_nanos = slot.nanos.swap(0, Ordering::Relaxed);
        self.other_requests.fetch_add(stray, Ordering::Relaxed);
        self.other_nanos.fetch_add(stray_nanos, Ordering::Relaxed);
        slot.hash.store(hash, Ordering::Release);
    }

    /// Frees the slots of keys with no request since the last sweep; their figures go to
    /// "other" (whose totals thus never go back).
    pub fn sweep(&self) {
        for slot in self.slots.iter() {
            let hash = slot.hash.load(Ordering::Acquire);
            if hash == FREE || hash == FREEING {
                continue;
            }
            let requests = slot.requests.load(Ordering::Relaxed);
            if requests != slot.swept.load(Ordering::Relaxed) {
                slot.swept.store(requests, Ordering::Relaxed);
                continue;
            }
            if slot
                .hash
                .compare_exchange(hash, FREEING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // A count that found the slot just before it was taken may land after these
            // swaps: the slot's next claim moves it to "other" too.
            let requests = slot.requests.swap(0, Ordering::Relaxed);
            let nanos = slot.nanos.swap(0, Ordering::Relaxed);
            self.other_requests.fetch_add(requests, Ordering::Relaxed);
            self.other_nanos.fetch_add(nanos, Ordering::Relaxed);
            slot.hash.store(FREE, Ordering::Release);
        }
    }

    /// The `n` keys with the most requests, the most first (ties by key), then "other": every
    /// other key's figures, and those swept out.
    pub fn top(&self, n: usize) -> Vec<Loaded> {
        let mut keys: Vec<Loaded> = self
            .slots
            .iter()
            .filter(|slot| {
                let hash = slot.hash.load(Ordering::Acquire);
                hash != FREE && hash != FREEING
            })
            .map(|slot| Loaded {
                key: slot.name.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                requests: slot.requests.load(Ordering::Relaxed),
                nanos: slot.nanos.load(Ordering::Relaxed),
            })
            .collect();
        keys.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.key.cmp(&b.key)));
        let mut other = Loaded {
            key: "other".to_string(),
            requests: self.other_requests.load(Ordering::Relaxed),
            nanos: self.other_nanos.load(Ordering::Relaxed),
        };
        for rest in keys.iter().skip(n) {
            other.requests += rest.requests;
            other.nanos += rest.nanos;
        }
        keys.truncate(n);
        keys.push(other);
        keys
    }
}

/// `key` cut to [`LOAD_KEY_BYTES_MAX`] bytes, at a character's boundary.
fn cut(key: &str) -> &str {
    if key.len() <= LOAD_KEY_BYTES_MAX {
        return key;
    }
    let mut end = LOAD_KEY_BYTES_MAX;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Step {
        Count(u8, u16),
        Sweep,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (any::<u8>(), any::<u16>()).prop_map(|(k, n)| Step::Count(k, n)),
            1 => Just(Step::Sweep),
        ]
    }

    proptest! {
        /// Against a model that keeps every key: nothing counted is lost or counted twice
        /// (the table's keys and "other" add up to the model's totals), a key in the table
        /// has at most what the model has, and the table never holds more than its slots.
        #[test]
        fn the_table_adds_up_to_a_model_that_keeps_every_key(
            steps in proptest::collection::vec(step(), 1..600),
            keys in 1usize..600,
        ) {
            let load = Load::default();
            let mut model: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            for s in &steps {
                match s {
                    Step::Count(k, nanos) => {
                        let key = format!("{}", *k as usize * 7 % keys);
                        load.count(&key, u64::from(*nanos));
                        let entry = model.entry(key).or_default();
                        entry.0 += 1;
                        entry.1 += u64::from(*nanos);
                    }
                    Step::Sweep => load.sweep(),
                }
                let top = load.top(LOAD_SLOTS);
                prop_assert!(top.len() <= LOAD_SLOTS + 1);
                let requests: u64 = top.iter().map(|l| l.requests).sum();
                let nanos: u64 = top.iter().map(|l| l.nanos).sum();
                prop_assert_eq!(requests, model.values().map(|v| v.0).sum::<u64>());
                prop_assert_eq!(nanos, model.values().map(|v| v.1).sum::<u64>());
                for loaded in &top[..top.len() - 1] {
                    let (r, n) = model[&loaded.key];
                    prop_assert!(loaded.requests <= r && loaded.nanos <= n);
                }
            }
        }
    }

    #[test]
    fn the_busiest_keys_come_first_and_the_rest_is_other() {
        let load = Load::default();
        for (key, times) in [("1000", 50), ("2000", 10), ("3000", 30)] {
            for _ in 0..times {
                load.count(key, 1_000);
            }
        }
        let top = load.top(2);
        let shown: Vec<(&str, u64)> = top.iter().map(|l| (l.key.as_str(), l.requests)).collect();
        assert_eq!(shown, [("1000", 50), ("3000", 30), ("other", 10)]);
        assert_eq!(top[0].nanos, 50_000);
    }

    #[test]
    fn a_flood_of_new_keys_cannot_grow_the_table_and_idle_keys_make_room() {
        let load = Load::default();
        for i in 0..100_000 {
            load.count(&format!("job-{i}"), 1);
        }
        let top = load.top(usize::MAX);
        assert!(top.len() <= LOAD_SLOTS + 1, "{}", top.len());
        assert_eq!(top.iter().map(|l| l.requests).sum::<u64>(), 100_000);
        // The flood stops; two sweeps free its slots, and a real user gets one.
        load.sweep();
        load.sweep();
        load.count("1000", 5);
        let top = load.top(1);
        assert_eq!(top[0].key, "1000");
        assert_eq!(top[1].requests, 100_000);
    }

    #[test]
    fn a_long_key_is_cut_at_a_character() {
        let load = Load::default();
        let long = "é".repeat(100);
        load.count(&long, 1);
        let top = load.top(1);
        assert!(top[0].key.len() <= LOAD_KEY_BYTES_MAX);
        assert!(long.starts_with(&top[0].key));
    }
}

/// The table's races under every interleaving loom finds: counts of one new key from two
/// threads, and counts racing a sweep.
#[cfg(all(test, feature = "loom"))]
mod models {
    use super::*;
    use loom::sync::Arc;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::BuildHasherDefault;

    /// Places a key in the same slot in every run (loom runs the model many times).
    type Fixed = BuildHasherDefault<DefaultHasher>;

    /// Every request the table holds: its keys', "other"'s, and what a count racing a sweep
    /// left in a free slot (moved to "other" when the slot is claimed again).
    fn held<H>(load: &Load<H>) -> u64 {
        load.other_requests.load(Ordering::Relaxed)
            + load
                .slots
                .iter()
                .map(|slot| slot.requests.load(Ordering::Relaxed))
                .sum::<u64>()
    }

    fn run(load: &Arc<Load<Fixed>>, work: fn(&Load<Fixed>)) -> loom::thread::JoinHandle<()> {
        let load = load.clone();
        loom::thread::spawn(move || work(&load))
    }

    #[test]
    fn two_counts_of_a_new_key_take_one_slot_and_count_twice() {
        loom::model(|| {
            let load = Arc::new(Load::with_slots(2, Fixed::default()));
            let one = run(&load, |load| load.count("job-a", 3));
            let two = run(&load, |load| load.count("job-a", 4));
            one.join().unwrap();
            two.join().unwrap();
            let top = load.top(2);
            assert_eq!(
                top,
                [
                    Loaded {
                        key: "job-a".into(),
                        requests: 2,
                        nanos: 7
                    },
                    Loaded {
                        key: "other".into(),
                        requests: 0,
                        nanos: 0
                    },
                ],
            );
        });
    }

    #[test]
    fn counts_racing_a_sweep_lose_no_request() {
        loom::model(|| {
            let load = Arc::new(Load::with_slots(1, Fixed::default()));
            // "job-a" is idle since the last sweep: the next one frees its slot.
            load.count("job-a", 1);
            load.sweep();
            let counts = run(&load, |load| {
                load.count("job-a", 1);
                load.count("job-b", 1);
            });
            let sweep = run(&load, |load| load.sweep());
            counts.join().unwrap();
            sweep.join().unwrap();
            assert_eq!(held(&load), 3);
            // A key shown once at most (the slot may be freed meanwhile: its figures are then
            // "other"'s).
            let shown = load.top(1);
            assert!(shown.len() <= 2, "{shown:?}");
            assert_eq!(shown.last().map(|l| l.key.as_str()), Some("other"));
        });
    }
}
