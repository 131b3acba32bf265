//! Pool assembly as a pure state machine: devices arrive and leave with their labels; a pool
//! activates exactly once, when its last missing member arrives. Every arrival and departure is
//! O(1) bookkeeping (a per-pool count of missing members; no rescans) — the seed's failure was
//! a rescan of every known device per event, O(n²) over a boot.
//!
//! Rules:
//! - a device arriving again with the same label changes nothing (duplicate uevents);
//! - a device arriving with a different label is a departure of the old one, then an arrival;
//! - a label of a newer generation restarts its pool's assembly under that generation (the
//!   pool was re-created); members of older generations are stale and ignored;
//! - within a generation, a label whose name or member count differ from the pool's, or that
//!   claims an index another device holds, is a conflict: refused, the pool unchanged;
//! - a departure of a member of an active pool makes it degraded; the member's return restores
//!   it, without a second activation;
//! - optionally a pool missing members past a timeout activates degraded (`activate_degraded`).

use std::collections::HashMap;

use crate::label::{Label, Uuid};

/// The agent's name for a device (its dev_t, or a number for a directory target).
pub type DeviceId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolState {
    /// Members missing, never activated.
    Assembling,
    Active,
    /// Activated, and a member is missing now.
    Degraded,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub uuid: Uuid,
    pub name: String,
    pub count: u32,
    pub generation: u64,
    /// Member index → the device holding it.
    pub members: Vec<Option<DeviceId>>,
    pub missing: u32,
    pub state: PoolState,
    /// When (the caller's clock) it was activated, for this generation.
    pub activated_at: Option<u64>,
}

impl Pool {
    /// A pool as `label` describes it, with every member missing.
    fn fresh(label: &Label) -> Pool {
        Pool {
            uuid: label.pool,
            name: label.pool_name.clone(),
            count: label.count,
            generation: label.generation,
            members: vec![None; label.count as usize],
            missing: label.count,
            state: PoolState::Assembling,
            activated_at: None,
        }
    }
}

impl PoolState {
    pub fn name(self) -> &'static str {
        match self {
            PoolState::Assembling => "assembling",
            PoolState::Active => "active",
            PoolState::Degraded => "degraded",
        }
    }
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Activate the pool (mount its members), once per generation.
    Activate { pool: Uuid, degraded: bool },
    /// An active pool lost a member.
    Degraded { pool: Uuid },
    /// A degraded pool has every member again.
    Restored { pool: Uuid },
}

/// Why an arrival changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The same device with the same label again.
    Duplicate,
    /// A label of an older generation than its pool's.
    Stale {
        generation: u64,
        pool_generation: u64,
    },
    Conflict(String),
}

#[derive(Debug, Clone, Default)]
pub struct Assembly {
    pools: HashMap<Uuid, Pool>,
    /// Device → (pool, member index, its label).
    devices: HashMap<DeviceId, (Uuid, u32, Label)>,
}

impl Assembly {
    pub fn new() -> Assembly {
        Assembly::default()
    }

    pub fn pool(&self, uuid: &Uuid) -> Option<&Pool> {
        self.pools.get(uuid)
    }

    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.values()
    }

    /// The label a member device arrived with.
    pub fn label_of(&self, device: DeviceId) -> Option<&Label> {
        self.devices.get(&device).map(|(_, _, label)| label)
    }

    /// Devices counted as members now.
    pub fn members(&self) -> usize {
        self.devices.len()
    }

    /// A device with `label` arrived (or was found by the enumeration) at time `now`.
    pub fn arrive(
        &mut self,
        device: DeviceId,
        label: &Label,
        now: u64,
    ) -> Result<Option<Action>, Refused> {
        if let Some((_, _, old)) = self.devices.get(&device) {
            if old == label {
                return Err(Refused::Duplicate);
            }
            // Re-labelled: the old membership ends first.
            self.depart(device);
        }
        let pool = self
            .pools
            .entry(label.pool)
            .or_insert_with(|| Pool::fresh(label));
        if label.generation < pool.generation {
            return Err(Refused::Stale {
                generation: label.generation,
                pool_generation: pool.generation,
            });
        }
        if label.generation > pool.generation {
            // The pool was re-created: its assembly starts over (O(members of this pool)).
            for device in pool.members.iter().flatten() {
                self.devices.remove(device);
            }
            *pool = Pool::fresh(label);
        }
        if label.count != pool.count || label.pool_name != pool.name {
            return Err(Refused::Conflict(format!(
                "pool {} generation {}: label says {} members named {:?}, the pool has {} named {:?}",
                crate::label::uuid_text(&label.pool),
                label.generation,
                label.count,
                label.pool_name,
                pool.count,
                pool.name
            )));
        }
        let slot = &mut pool.members[label.index as usize];
        if let Some(other) = slot {
            return Err(Refused::Conflict(format!(
                "member {} of pool {:?} is already device {other}",
                label.index, pool.name
            )));
        }
        *slot = Some(device);
        pool.missing -= 1;
        self.devices
            .insert(device, (label.pool, label.index, label.clone()));
        if pool.missing > 0 {
            return Ok(None);
        }
        Ok(match pool.state {
            PoolState::Assembling => {
                pool.state = PoolState::Active;
                pool.activated_at = Some(now);
                Some(Action::Activate {
                    pool: pool.uuid,
                    degraded: false,
                })
            }
            PoolState::Degraded => {
                pool.state = PoolState::Active;
                Some(Action::Restored { pool: pool.uuid })
            }
            PoolState::Active => None,
        })
    }

    /// A device went away.
    pub fn depart(&mut self, device: DeviceId) -> Option<Action> {
        let (uuid, index, _) = self.devices.remove(&device)?;
        let pool = self.pools.get_mut(&uuid)?;
        pool.members[index as usize] = None;
        pool.missing += 1;
        if pool.state == PoolState::Active {
            pool.state = PoolState::Degraded;
            return Some(Action::Degraded { pool: uuid });
        }
        None
    }

    /// Activates a pool that is still assembling with at least one member present (a caller's
    /// timeout for degraded activation).
    pub fn activate_degraded(&mut self, uuid: &Uuid, now: u64) -> Option<Action> {
        let pool = self.pools.get_mut(uuid)?;
        if pool.state != PoolState::Assembling || pool.missing == pool.count {
            return None;
        }
        pool.state = PoolState::Degraded;
        pool.activated_at = Some(now);
        Some(Action::Activate {
            pool: *uuid,
            degraded: true,
        })
    }
}
