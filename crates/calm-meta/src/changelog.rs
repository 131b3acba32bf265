//! The changelog inside the namespace: every mutation appends its record in the very
//! transaction that applies it, so the two are durable together or not at all.
//!
//! No shared lock on the hot path: records get their indices from [`ClState::last`], which
//! only the committer thread touches, one group commit at a time. Nothing but the records is
//! written per group (to the store's record log, `WriteTxn::log_append`): the last index is
//! the log's last, and the counter `Ncl_last` is written only by purge steps (for when every
//! record is gone). Indices are dense and follow
//! commit order because groups commit one after the other and, inside a group, operations
//! apply in queue order.
//!
//! What this module owns: the committer's changelog state (readers, last index, first
//! retained index), the backlog check run before an operation writes anything, the readers'
//! mutations (register, deregister, clear, mask), purge and idle GC. The record format and the
//! reader rules are calm-changelog's.

use std::sync::Arc;

use calm_changelog::record::RecordRef;
use calm_changelog::{
    ChangelogConfig, ChangelogError, Mask, Record, RecordType, Registry, User, UserId,
};
use calm_store::{ReadTxn, WriteTxn, decode_counter};

use crate::Caller;
use crate::error::MetaError;
use crate::layout::*;
use crate::outcome::{Failure, Outcome};

/// Most records one purge step deletes (one step rides along each group commit, or runs
/// alone when the committer is idle).
pub const PURGE_RECORDS_PER_STEP: u64 = 2048;

/// The committer's changelog state. Cloned before a group and put back if its commit fails:
/// the clone allocates nothing (the readers are shared until a group changes them, the
/// encoding buffer is not copied), as most groups only append records.
#[derive(Debug)]
pub struct ClState {
    /// The readers (copied on the first change after a clone: `Arc::make_mut`).
    pub registry: Arc<Registry>,
    /// Index of the last record written (0: none).
    pub last: u64,
    /// Index of the first record still stored (`last + 1` when none is).
    pub first: u64,
    pub config: ChangelogConfig,
    /// Types written at all (the union of the readers' masks), cached.
    mask: Mask,
    /// A purge step failed; the next group commit clears this.
    purge_deferred: bool,
    /// Every appending commit writes the last index to `Ncl_last`. For a shared store (etcd),
    /// where finding the greatest key of a range is a scan of the range on the server, so the
    /// last index must be read from a counter; the write costs nothing there (one more
    /// operation in the commit's one request). LMDB knows its log's last index (one seek, or
    /// the segment log's bounds) and saves the write.
    pub counted: bool,
    /// The record being appended, encoded (kept for the next one: no allocation per record).
    scratch: Vec<u8>,
}

impl Clone for ClState {
    fn clone(&self) -> Self {
        ClState {
            registry: self.registry.clone(),
            last: self.last,
            first: self.first,
            config: self.config,
            mask: self.mask,
            purge_deferred: self.purge_deferred,
            counted: self.counted,
            scratch: Vec::new(),
        }
    }
}

impl ClState {
    pub fn new(registry: Registry, last: u64, first: u64, config: ChangelogConfig) -> Self {
        let mask = registry.global_mask();
        ClState {
            registry: Arc::new(registry),
            last,
            first,
            config,
            mask,
            purge_deferred: false,
            counted: false,
            scratch: Vec::new(),
        }
    }

    /// Reads the state of a store: its readers (at most `users_max`, so a bounded scan), the
    /// last index, and the first stored record (one seek).
    ///
    /// With `counted` (a shared store: see [`ClState::counted`]) the last index is the counter
    /// `Ncl_last`, which every appending commit keeps exact there.
    pub fn load<R: ReadTxn>(
        view: &R,
        config: ChangelogConfig,
        counted: bool,
    ) -> Result<ClState, MetaError> {
        ClState::load_from(view, config, counted, 0)
    }

    /// [`ClState::load`], seeking the first stored record from `first_floor`, an index known
    /// to be at or below it (records are purged from the first on, never put back). On a
    /// store that keeps deleted keys until a compaction (etcd), a seek from the log's start
    /// walks every record purged within the history kept, tens of thousands under churn;
    /// from the first record known before, it walks only those purged since.
    pub fn load_from<R: ReadTxn>(
        view: &R,
        config: ChangelogConfig,
        counted: bool,
        first_floor: u64,
    ) -> Result<ClState, MetaError> {
        let mut users = Vec::new();
        let mut bad = None;
        view.visit(&[TAG_CL_USER], CL_USER_END, &mut |key, value| {
            match cl_user_id(key).and_then(|id| User::decode(id, value)) {
                Some(user) => users.push(user),
                None => bad = Some(format!("changelog reader key {key:?} does not decode")),
            }
            std::ops::ControlFlow::Continue(())
        })?;
        if let Some(why) = bad {
            return Err(MetaError::Corrupt(why));
        }
        let counter = |key: &[u8]| -> Result<u64, MetaError> {
            Ok(match view.get(key)? {
                Some(bytes) => decode_counter(key, &bytes)?,
                None => 0,
            })
        };
        let next_id = counter(KEY_CL_USER_NEXT)? as UserId;
        // The last index is the log's last record's; the counter keeps it only for when
        // every record has been purged (see `purge_step`), unless it is kept exact.
        let stored_last = if counted { None } else { view.log_last()? };
        let last = counter(KEY_CL_LAST)?.max(stored_last.unwrap_or(0));
        let first = match first_floor {
            0 => view.log_first()?,
            floor => first_from(view, floor)?,
        }
        .unwrap_or(last + 1);
        let mut state = ClState::new(Registry::new(users, next_id), last, first, config);
        state.counted = counted;
        Ok(state)
    }

    /// Reads the state again from `view` (another server wrote the store), keeping the
    /// configuration and a deferred purge.
    pub fn reload<R: ReadTxn>(&mut self, view: &R) -> Result<(), MetaError> {
        let deferred = self.purge_deferred;
        *self = ClState::load_from(view, self.config, self.counted, self.first)?;
        self.purge_deferred = deferred;
        Ok(())
    }

    /// Whether records of type `kind` are written.
    pub fn wants(&self, kind: RecordType) -> bool {
        self.mask.contains(kind)
    }

    fn refresh_mask(&mut self) {
        self.mask = self.registry.global_mask();
    }

    /// Makes room for one record of `kind` under the backlog limit, before the operation
    /// writes anything: deregisters the most lagging reader (with a MARK saying so) while the
    /// policy says so, or refuses with ENOSPC.
    pub fn make_room<T: WriteTxn>(
        &mut self,
        txn: &mut T,
        kind: RecordType,
        now: i64,
        caller: &Caller,
    ) -> Outcome<()> {
        while self.wants(kind) {
            match self.registry.make_room(self.last, 1, &self.config) {
                Ok(None) => return Ok(()),
                Ok(Some(victim)) => {
                    tracing::warn!(
                        reader = victim,
                        limit = self.config.backlog_records_max,
                        "changelog backlog limit reached: deregistering the most lagging reader"
                    );
                    self.remove_user(txn, victim, "backlog limit", now, caller)?;
                }
                Err(error) => return Err(Failure::Meta(MetaError::NoSpace(error.to_string()))),
            }
        }
        Ok(())
    }

    /// Deregisters `id` and writes a MARK naming it and why (for the remaining readers).
    fn remove_user<T: WriteTxn>(
        &mut self,
        txn: &mut T,
        id: UserId,
        why: &str,
        now: i64,
        caller: &Caller,
    ) -> Outcome<()> {
        Arc::make_mut(&mut self.registry)
            .deregister(id)
            .map_err(cl_error)?;
        txn.delete(&cl_user_key(id))?;
        self.refresh_mask();
        let text = format!("cl{id} deregistered: {why}");
        self.append(txn, mark(text.into_bytes(), now, caller).as_ref())
    }

    /// Appends `record` under the next index if its type is wanted.
    pub fn append<T: WriteTxn>(&mut self, txn: &mut T, record: RecordRef<'_>) -> Outcome<()> {
        if !self.wants(record.kind) {
            return Ok(());
        }
        let index = self.last + 1;
        self.scratch.clear();
        record
            .encode_into(&mut self.scratch)
            .map_err(|e| Failure::Meta(MetaError::Invalid(e.to_string())))?;
        txn.log_append(index, &self.scratch)?;
        if self.counted {
            txn.put(KEY_CL_LAST, &index.to_le_bytes())?;
        }
        self.last = index;
        Ok(())
    }

    pub fn register<T: WriteTxn>(
        &mut self,
        txn: &mut T,
        name: &str,
        mask: Mask,
        now: i64,
    ) -> Outcome<User> {
        let user = Arc::make_mut(&mut self.registry)
            .register(name, mask, self.last, now, &self.config)
            .map_err(cl_error)?;
        txn.put(&cl_user_key(user.id), &user.encode())?;
        txn.put(KEY_CL_USER_NEXT, &(u64::from(user.id) + 1).to_le_bytes())?;
        self.refresh_mask();
        Ok(user)
    }

    pub fn deregister<T: WriteTxn>(&mut self, txn: &mut T, id: UserId) -> Outcome<User> {
        let user = Arc::make_mut(&mut self.registry)
            .deregister(id)
            .map_err(cl_error)?;
        txn.delete(&cl_user_key(id))?;
        self.refresh_mask();
        Ok(user)
    }

    pub fn clear<T: WriteTxn>(
        &mut self,
        txn: &mut T,
        id: UserId,
        index: u64,
        now: i64,
    ) -> Outcome<User> {
        let user = Arc::make_mut(&mut self.registry)
            .clear(id, index, self.last, now)
            .map_err(cl_error)?;
        txn.put(&cl_user_key(id), &user.encode())?;
        Ok(user)
    }

    pub fn set_mask<T: WriteTxn>(&mut self, txn: &mut T, id: UserId, mask: Mask) -> Outcome<User> {
        let user = Arc::make_mut(&mut self.registry)
            .set_mask(id, mask)
            .map_err(cl_error)?;
        txn.put(&cl_user_key(id), &user.encode())?;
        self.refresh_mask();
        Ok(user)
    }

    /// Whether stored records wait for a purge (and the last step did not fail).
    pub fn purge_pending(&self) -> bool {
        !self.purge_deferred && self.registry.purge_point(self.last) >= self.first
    }

    /// After a failed purge step: wait for the next group instead of retrying at once.
    pub fn defer_purge(&mut self) {
        self.purge_deferred = true;
    }

    /// Deletes up to [`PURGE_RECORDS_PER_STEP`] records every reader has cleared, and no more
    /// than the transaction has room for under the store's limit of writes (`writes_max`):
    /// the purge of a store with a small limit (etcd's 128 operations) goes in many small
    /// steps instead of failing whole. Returns how many. Indices are dense, so the records
    /// are named, not searched.
    pub fn purge_step<T: WriteTxn>(
        &mut self,
        txn: &mut T,
        writes_max: Option<usize>,
    ) -> Outcome<u64> {
        self.purge_deferred = false;
        let point = self.registry.purge_point(self.last);
        if point < self.first {
            return Ok(0);
        }
        let room = match writes_max {
            // Three writes are kept: the last index (written when the purge empties the log),
            // and what a store adds of its own to a purge and a commit (etcd: the log's floor
            // and the commit key).
            Some(max) => max.saturating_sub(txn.writes_pending().unwrap_or(0) + 3) as u64,
            None => PURGE_RECORDS_PER_STEP,
        };
        let step = room.min(PURGE_RECORDS_PER_STEP);
        if step == 0 {
            // The group fills the transaction: the next one purges.
            return Ok(0);
        }
        let upto = point.min(self.first + step - 1);
        txn.log_purge(self.first, upto)?;
        // The last record carries the last index; once it is purged, the counter must. So the
        // counter is written only when a purge empties the changelog, never per group.
        if upto == self.last {
            txn.put(KEY_CL_LAST, &self.last.to_le_bytes())?;
        }
        let purged = upto + 1 - self.first;
        self.first = upto + 1;
        Ok(purged)
    }

    /// Deregisters readers idle past the configured limits, when a GC pass is due.
    pub fn gc_idle<T: WriteTxn>(&mut self, txn: &mut T, now: i64) -> Outcome<Vec<UserId>> {
        let victims = Arc::make_mut(&mut self.registry).idle_victims(self.last, now, &self.config);
        for id in &victims {
            tracing::warn!(
                reader = id,
                "changelog reader idle past its limit: deregistering"
            );
            self.remove_user(txn, *id, "idle", now, &Caller::default())?;
        }
        Ok(victims)
    }
}

/// The index of the first record stored at or after `from`.
fn first_from<R: ReadTxn>(view: &R, from: u64) -> Result<Option<u64>, MetaError> {
    let mut first = None;
    view.log_visit(from, &mut |index, _| {
        first = Some(index);
        std::ops::ControlFlow::Break(())
    })?;
    Ok(first)
}

fn cl_error(error: ChangelogError) -> Failure {
    Failure::Meta(match error {
        ChangelogError::NoSuchUser(_) => MetaError::NotFound,
        ChangelogError::TooManyUsers { .. } | ChangelogError::BacklogFull { .. } => {
            MetaError::NoSpace(error.to_string())
        }
        _ => MetaError::Invalid(error.to_string()),
    })
}

/// A MARK record carrying `text`.
pub fn mark(text: Vec<u8>, now: i64, caller: &Caller) -> Record {
    let mut text = text;
    text.truncate(calm_changelog::record::RECORD_NAME_LEN_MAX);
    Record {
        index: 0,
        kind: RecordType::Mark,
        flags: 0,
        time_ns: now,
        target: 0,
        generation: 0,
        parent: 0,
        name: text,
        session: caller.session,
        uid: caller.uid,
        gid: caller.gid,
        rename: None,
    }
}
