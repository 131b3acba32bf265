//! Model-based test of readers, cursors, masks and purge: random sequences of creates,
//! mkdirs, unlinks (some of names that do not exist), register, deregister, clear (including
//! backwards and past the end) and mask changes, run through the namespace and through a
//! model that keeps every record ever written in a list and each reader as (cleared, mask).
//! After every step: the readers and the last index agree, and what each reader reads is
//! exactly the model's records after its cleared index within its mask — the background purge
//! may never take a record some reader still needs.

use std::collections::{BTreeMap, BTreeSet};

use calm_changelog::{ChangelogConfig, Mask, RecordType};
use calm_meta::*;
use calm_store::mem::MemStore;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Create,
    Mkdir,
    Unlink(usize),
    Register(u32),
    Deregister(usize),
    Clear(usize, u64),
    SetMask(usize, u32),
}

/// Masks over the three types the steps produce.
fn mask_of(bits: u32) -> Mask {
    let mut mask = Mask::NONE.with(RecordType::Mark);
    for (bit, t) in [RecordType::Create, RecordType::Mkdir, RecordType::Unlink]
        .into_iter()
        .enumerate()
    {
        if bits & (1 << bit) != 0 {
            mask = mask.with(t);
        }
    }
    mask
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Create),
        1 => Just(Step::Mkdir),
        2 => (0..8usize).prop_map(Step::Unlink),
        1 => (0..8u32).prop_map(Step::Register),
        1 => (0..4usize).prop_map(Step::Deregister),
        2 => (0..4usize, 0..40u64).prop_map(|(k, i)| Step::Clear(k, i)),
        1 => (0..4usize, 0..8u32).prop_map(|(k, m)| Step::SetMask(k, m)),
    ]
}

#[derive(Default)]
struct Model {
    records: Vec<(u64, RecordType)>,
    users: BTreeMap<u32, (u64, Mask)>,
    next_id: u32,
    files: BTreeSet<String>,
    names: u64,
}

impl Model {
    fn last(&self) -> u64 {
        self.records.last().map_or(0, |r| r.0)
    }

    fn write(&mut self, kind: RecordType) {
        let wanted = self.users.values().any(|(_, m)| m.contains(kind));
        if wanted {
            let index = self.last() + 1;
            self.records.push((index, kind));
        }
    }

    fn nth_user(&self, k: usize) -> Option<u32> {
        self.users.keys().nth(k).copied()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn readers_cursors_and_purge_match_the_model(steps in prop::collection::vec(step(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let meta = Meta::open(MemStore::new(), MetaOptions { changelog: ChangelogConfig::default(), ..MetaOptions::default() }).unwrap();
        let mut model = Model { next_id: 1, ..Model::default() };
        for step in &steps {
            rt.block_on(async {
                match step.clone() {
                    Step::Create | Step::Mkdir => {
                        model.names += 1;
                        let name = format!("n{}", model.names);
                        if matches!(step, Step::Create) {
                            meta.create(ROOT, name.as_bytes(), 0o644).await.unwrap();
                            model.files.insert(name);
                            model.write(RecordType::Create);
                        } else {
                            meta.mkdir(ROOT, name.as_bytes(), 0o755).await.unwrap();
                            model.write(RecordType::Mkdir);
                        }
                    }
                    Step::Unlink(k) => {
                        let name = model.files.iter().nth(k).cloned().unwrap_or_else(|| "missing".into());
                        let answer = meta.unlink(ROOT, name.as_bytes()).await;
                        if model.files.remove(&name) {
                            answer.unwrap();
                            model.write(RecordType::Unlink);
                        } else {
                            assert_eq!(answer.unwrap_err(), MetaError::NotFound);
                        }
                    }
                    Step::Register(bits) => {
                        let user = meta.changelog_register("", mask_of(bits)).await.unwrap();
                        assert_eq!(user.id, model.next_id);
                        assert_eq!(user.cleared, model.last());
                        model.users.insert(user.id, (model.last(), mask_of(bits)));
                        model.next_id += 1;
                    }
                    Step::Deregister(k) => match model.nth_user(k) {
                        Some(id) => {
                            meta.changelog_deregister(id).await.unwrap();
                            model.users.remove(&id);
                        }
                        None => assert_eq!(meta.changelog_deregister(99).await.unwrap_err(), MetaError::NotFound),
                    },
                    Step::Clear(k, index) => {
                        let Some(id) = model.nth_user(k) else { return };
                        let answer = meta.changelog_clear(id, index).await;
                        let last = model.last();
                        let target = if index == 0 { last } else { index };
                        if target > last {
                            assert_eq!(answer.unwrap_err().errno(), 22);
                        } else {
                            let entry = model.users.get_mut(&id).unwrap();
                            entry.0 = entry.0.max(target);
                            assert_eq!(answer.unwrap().cleared, entry.0);
                        }
                    }
                    Step::SetMask(k, bits) => {
                        let Some(id) = model.nth_user(k) else { return };
                        meta.changelog_set_mask(id, mask_of(bits)).await.unwrap();
                        model.users.get_mut(&id).unwrap().1 = mask_of(bits);
                    }
                }
            });
            let users = meta.changelog_users().unwrap();
            prop_assert_eq!(users.last, model.last(), "after {:?}", step);
            prop_assert_eq!(meta.changelog_last(), model.last());
            let real: Vec<(u32, u64, Mask)> = users.users.iter().map(|u| (u.id, u.cleared, u.mask)).collect();
            let expected: Vec<(u32, u64, Mask)> = model.users.iter().map(|(id, (c, m))| (*id, *c, *m)).collect();
            prop_assert_eq!(real, expected, "readers after {:?}", step);
            for (id, (cleared, mask)) in &model.users {
                let read: Vec<(u64, RecordType)> = meta
                    .changelog_read(0, usize::MAX, usize::MAX, Some(*id))
                    .unwrap()
                    .iter()
                    .map(|r| (r.index, r.kind))
                    .collect();
                let wanted: Vec<(u64, RecordType)> = model
                    .records
                    .iter()
                    .filter(|(i, k)| i > cleared && mask.contains(*k))
                    .copied()
                    .collect();
                prop_assert_eq!(read, wanted, "cl{} after {:?}", id, step);
            }
        }
    }
}
