//! Registered changelog readers and the decisions made from them.
//!
//! A reader ("user", as Lustre calls it) has an id shown as `cl<N>`, an optional name, a mask,
//! and the index up to which it has cleared (processed) records. From the readers follow:
//! - the global mask: a type no reader wants is not written at all (no reader, no records);
//! - the purge point: records every reader has cleared may go;
//! - the backlog: records some reader still needs (current index − lowest cleared index). A
//!   configurable limit on it is enforced before an operation is applied, by one of two
//!   explicit policies ([`BacklogPolicy`]);
//! - idle readers (no clear for too long, or too many records behind) are deregistered by a
//!   GC pass that runs at most once per interval.
//!
//! A reader's idle time counts from its last clear (or its registration): reading does not
//! change the store, clearing does.

use std::collections::{BTreeMap, BTreeSet};

use crate::record::Mask;

/// A reader's number; shown as `cl<N>`.
pub type UserId = u32;

/// Version of the user record encoding.
pub const USER_VERSION: u8 = 1;
/// Longest reader name, in bytes.
pub const USER_NAME_LEN_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: UserId,
    pub name: String,
    pub mask: Mask,
    /// Every record up to this index is processed by this reader.
    pub cleared: u64,
    pub registered_ns: i64,
    /// Time of the last clear (or of the registration).
    pub last_clear_ns: i64,
}

impl User {
    /// `cl<N>`.
    pub fn label(&self) -> String {
        format!("cl{}", self.id)
    }

    /// Parses `cl<N>` or `<N>`.
    pub fn parse_label(text: &str) -> Option<UserId> {
        text.strip_prefix("cl").unwrap_or(text).parse().ok()
    }

    /// Layout: version:u8 mask:u32 cleared:u64 registered_ns:i64 last_clear_ns:i64
    /// name_len:u8 name (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(30 + self.name.len());
        out.push(USER_VERSION);
        out.extend_from_slice(&self.mask.0.to_le_bytes());
        out.extend_from_slice(&self.cleared.to_le_bytes());
        out.extend_from_slice(&self.registered_ns.to_le_bytes());
        out.extend_from_slice(&self.last_clear_ns.to_le_bytes());
        out.push(self.name.len() as u8);
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub fn decode(id: UserId, bytes: &[u8]) -> Option<User> {
        if bytes.len() < 30 || bytes[0] != USER_VERSION {
            return None;
        }
        let name_len = bytes[29] as usize;
        let name = std::str::from_utf8(bytes.get(30..30 + name_len)?).ok()?;
        if bytes.len() != 30 + name_len {
            return None;
        }
        Some(User {
            id,
            mask: Mask(u32::from_le_bytes(bytes[1..5].try_into().ok()?)),
            cleared: u64::from_le_bytes(bytes[5..13].try_into().ok()?),
            registered_ns: i64::from_le_bytes(bytes[13..21].try_into().ok()?),
            last_clear_ns: i64::from_le_bytes(bytes[21..29].try_into().ok()?),
            name: name.to_string(),
        })
    }
}

/// What happens when an operation would push the backlog past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BacklogPolicy {
    /// Deregister the reader furthest behind (logged, and a MARK record says so), then go on.
    GcMostLagging,
    /// Refuse the operation with an out-of-space error before anything of it is applied.
    Refuse,
}

/// Named limits and GC settings. Zero turns an idle rule off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangelogConfig {
    /// Records some reader still needs, at most.
    pub backlog_records_max: u64,
    pub policy: BacklogPolicy,
    /// A reader that has not cleared for this long is deregistered (0: never).
    pub idle_time_max_ns: i64,
    /// A reader this many records behind is deregistered (0: never).
    pub idle_records_max: u64,
    /// GC of idle readers runs at most this often.
    pub gc_interval_min_ns: i64,
    pub users_max: usize,
}

impl Default for ChangelogConfig {
    fn default() -> Self {
        ChangelogConfig {
            backlog_records_max: 1 << 32,
            policy: BacklogPolicy::GcMostLagging,
            idle_time_max_ns: 0,
            idle_records_max: 0,
            gc_interval_min_ns: 3_600 * 1_000_000_000,
            users_max: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangelogError {
    NoSuchUser(UserId),
    TooManyUsers {
        limit: usize,
    },
    /// Clearing past the last record.
    IndexAhead {
        index: u64,
        current: u64,
    },
    BadName(String),
    /// The backlog limit is reached and the policy is to refuse.
    BacklogFull {
        limit: u64,
        lagging: UserId,
    },
}

impl std::fmt::Display for ChangelogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangelogError::NoSuchUser(id) => write!(f, "no changelog reader cl{id}"),
            ChangelogError::TooManyUsers { limit } => {
                write!(f, "the changelog has its limit of {limit} readers")
            }
            ChangelogError::IndexAhead { index, current } => write!(
                f,
                "cannot clear up to {index}: the last record is {current}"
            ),
            ChangelogError::BadName(why) => write!(f, "bad reader name: {why}"),
            ChangelogError::BacklogFull { limit, lagging } => write!(
                f,
                "changelog backlog full ({limit} records not yet cleared, most by cl{lagging}); \
                 clear or deregister that reader"
            ),
        }
    }
}

impl std::error::Error for ChangelogError {}

/// Every registered reader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    users: BTreeMap<UserId, User>,
    /// `(cleared, id)` of every reader: the purge point and the most lagging reader are its
    /// first entry, so the backlog check every operation makes does not grow with the number
    /// of readers. Kept equal to `users` by every mutation.
    by_cleared: BTreeSet<(u64, UserId)>,
    next_id: UserId,
    last_gc_ns: i64,
}

impl Registry {
    /// The registry as stored: its readers and the next id to hand out (ids are never reused).
    pub fn new(users: Vec<User>, next_id: UserId) -> Self {
        let next_id = users
            .iter()
            .map(|u| u.id + 1)
            .max()
            .unwrap_or(1)
            .max(next_id)
            .max(1);
        Registry {
            by_cleared: users.iter().map(|u| (u.cleared, u.id)).collect(),
            users: users.into_iter().map(|u| (u.id, u)).collect(),
            next_id,
            last_gc_ns: i64::MIN,
        }
    }

    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }

    pub fn get(&self, id: UserId) -> Option<&User> {
        self.users.get(&id)
    }

    pub fn next_id(&self) -> UserId {
        self.next_id
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Registers a reader that starts after record `current`.
    pub fn register(
        &mut self,
        name: &str,
        mask: Mask,
        current: u64,
        now_ns: i64,
        config: &ChangelogConfig,
    ) -> Result<User, ChangelogError> {
        if name.len() > USER_NAME_LEN_MAX {
            return Err(ChangelogError::BadName(format!(
                "{} bytes, at most {USER_NAME_LEN_MAX}",
                name.len()
            )));
        }
        if name.chars().any(|c| c.is_control()) {
            return Err(ChangelogError::BadName("control characters".into()));
        }
        if self.users.len() >= config.users_max {
            return Err(ChangelogError::TooManyUsers {
                limit: config.users_max,
            });
        }
        let user = User {
            id: self.next_id,
            name: name.to_string(),
            mask,
            cleared: current,
            registered_ns: now_ns,
            last_clear_ns: now_ns,
        };
        self.next_id += 1;
        self.users.insert(user.id, user.clone());
        self.by_cleared.insert((user.cleared, user.id));
        Ok(user)
    }

    pub fn deregister(&mut self, id: UserId) -> Result<User, ChangelogError> {
        let user = self
            .users
            .remove(&id)
            .ok_or(ChangelogError::NoSuchUser(id))?;
        self.by_cleared.remove(&(user.cleared, id));
        Ok(user)
    }

    /// Marks every record up to `index` (0: up to `current`) processed by `id`. Clearing never
    /// moves back: an index below the reader's cleared index changes nothing.
    pub fn clear(
        &mut self,
        id: UserId,
        index: u64,
        current: u64,
        now_ns: i64,
    ) -> Result<User, ChangelogError> {
        let index = if index == 0 { current } else { index };
        if index > current {
            return Err(ChangelogError::IndexAhead { index, current });
        }
        let user = self
            .users
            .get_mut(&id)
            .ok_or(ChangelogError::NoSuchUser(id))?;
        if index > user.cleared {
            self.by_cleared.remove(&(user.cleared, id));
            self.by_cleared.insert((index, id));
            user.cleared = index;
        }
        user.last_clear_ns = now_ns;
        Ok(user.clone())
    }

    pub fn set_mask(&mut self, id: UserId, mask: Mask) -> Result<User, ChangelogError> {
        let user = self
            .users
            .get_mut(&id)
            .ok_or(ChangelogError::NoSuchUser(id))?;
        user.mask = mask;
        Ok(user.clone())
    }

    /// The types written at all: those some reader wants.
    pub fn global_mask(&self) -> Mask {
        self.users.values().fold(Mask::NONE, |m, u| m.union(u.mask))
    }

    /// Records up to this index may be purged: every reader has cleared them (all of them,
    /// up to `current`, when no reader is left).
    pub fn purge_point(&self, current: u64) -> u64 {
        self.by_cleared
            .first()
            .map_or(current, |&(cleared, _)| cleared)
    }

    /// Records some reader still needs.
    pub fn backlog(&self, current: u64) -> u64 {
        current - self.purge_point(current).min(current)
    }

    /// The reader furthest behind (the lowest cleared index; the oldest id on a tie).
    pub fn most_lagging(&self) -> Option<UserId> {
        self.by_cleared.first().map(|&(_, id)| id)
    }

    /// Whether `adding` more records fit under the backlog limit. When they do not, the
    /// policy decides: `Ok(Some(id))` names the reader to deregister first, `Err` refuses.
    pub fn make_room(
        &self,
        current: u64,
        adding: u64,
        config: &ChangelogConfig,
    ) -> Result<Option<UserId>, ChangelogError> {
        if self.backlog(current) + adding <= config.backlog_records_max {
            return Ok(None);
        }
        let lagging = self.most_lagging().expect("a backlog needs a reader");
        match config.policy {
            BacklogPolicy::GcMostLagging => Ok(Some(lagging)),
            BacklogPolicy::Refuse => Err(ChangelogError::BacklogFull {
                limit: config.backlog_records_max,
                lagging,
            }),
        }
    }

    /// Readers idle past the limits, when a GC pass is due at `now_ns` (and marks it done).
    pub fn idle_victims(
        &mut self,
        current: u64,
        now_ns: i64,
        config: &ChangelogConfig,
    ) -> Vec<UserId> {
        if config.idle_time_max_ns == 0 && config.idle_records_max == 0 {
            return Vec::new();
        }
        if self.last_gc_ns != i64::MIN
            && now_ns.saturating_sub(self.last_gc_ns) < config.gc_interval_min_ns
        {
            return Vec::new();
        }
        self.last_gc_ns = now_ns;
        self.users
            .values()
            .filter(|u| {
                (config.idle_time_max_ns > 0
                    && now_ns.saturating_sub(u.last_clear_ns) > config.idle_time_max_ns)
                    || (config.idle_records_max > 0
                        && current.saturating_sub(u.cleared) > config.idle_records_max)
            })
            .map(|u| u.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Register,
        Deregister(u8),
        /// A reader (by position) clears up to this many records past its cleared index.
        Clear(u8, u8),
        /// Records are appended.
        Append(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Register),
            any::<u8>().prop_map(Step::Deregister),
            (any::<u8>(), 0u8..20).prop_map(|(u, n)| Step::Clear(u, n)),
            (0u8..20).prop_map(Step::Append),
        ]
    }

    proptest! {
        /// The purge point and the most lagging reader, kept in an index, are what a scan of
        /// every reader finds (the lowest cleared index; the lowest id on a tie).
        #[test]
        fn the_purge_point_and_the_most_lagging_reader_match_a_scan(
            steps in prop::collection::vec(step(), 1..80)
        ) {
            let config = ChangelogConfig::default();
            let mut registry = Registry::new(Vec::new(), 1);
            let mut current = 0u64;
            for step in steps {
                let ids: Vec<UserId> = registry.users().map(|u| u.id).collect();
                let pick = |k: u8| ids.get(usize::from(k) % ids.len().max(1)).copied();
                match step {
                    Step::Register => {
                        registry.register("r", Mask::all(), current, 0, &config).unwrap();
                    }
                    Step::Deregister(k) => {
                        if let Some(id) = pick(k) {
                            registry.deregister(id).unwrap();
                        }
                    }
                    Step::Clear(k, n) => {
                        if let Some(id) = pick(k) {
                            let cleared = registry.get(id).unwrap().cleared;
                            let index = (cleared + u64::from(n)).min(current);
                            registry.clear(id, index, current, 0).unwrap();
                        }
                    }
                    Step::Append(n) => current += u64::from(n),
                }
                let scan_point = registry.users().map(|u| u.cleared).min().unwrap_or(current);
                let scan_lagging = registry
                    .users()
                    .min_by_key(|u| (u.cleared, u.id))
                    .map(|u| u.id);
                prop_assert_eq!(registry.purge_point(current), scan_point);
                prop_assert_eq!(registry.most_lagging(), scan_lagging);
                prop_assert_eq!(registry.backlog(current), current - scan_point.min(current));
            }
        }
    }
}
