//! The changelog as its readers see it: registering, clearing and masking readers (through the
//! committer), reading records on a snapshot, and following the last index as commits reach it
//! (a long poll that may linger to fill a batch).

use super::*;

/// How a follow read waits (a long poll, never a timer that polls): see
/// [`Meta::changelog_follow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    /// Longest to wait when no record is there yet.
    pub wait: std::time::Duration,
    /// Answer when this many records are there…
    pub min_records: usize,
    /// …or, when some are, this long after the call, whichever is sooner.
    pub linger: std::time::Duration,
}

impl Follow {
    /// Lingers up to [`CL_FOLLOW_LINGER`] for [`CL_FOLLOW_BATCH_RECORDS`] records, and up to
    /// `wait` for a first one (what `calm changelog read --follow` does).
    pub fn batching(wait: std::time::Duration) -> Follow {
        Follow {
            wait,
            min_records: CL_FOLLOW_BATCH_RECORDS,
            linger: CL_FOLLOW_LINGER,
        }
    }
}

/// A batching follower's records per answer, by default.
pub const CL_FOLLOW_BATCH_RECORDS: usize = 1024;

/// A batching follower's linger, by default: inside the 10 ms the changelog's commit-to-read
/// goal allows (the bench's following reader: p99 6.1–7.0 ms at 1–64 clients), and a wake-up
/// every 5 ms instead of every 1 ms. Each wake-up of a follower costs the server's cores a
/// reader's turn (on a VM, waking an idle vCPU). Measured on weak evidence
/// (docs/benchmarks/2026-11-23): with 1 ms, the writes' rate with a following reader was 0.968
/// of the rate without a changelog (mean of 8 runs at 1–16 clients), with 5 ms 0.978; two full
/// runs with 5 ms then gave 0.981 and 0.969.
pub const CL_FOLLOW_LINGER: std::time::Duration = std::time::Duration::from_millis(5);

/// Most records one changelog read returns.
pub const CL_READ_RECORDS_MAX: usize = 65_536;

/// Most encoded bytes one changelog read returns (under the 4 MiB gRPC message limit).
pub const CL_READ_BYTES_MAX: usize = 3 << 20;

/// The changelog's readers as a snapshot sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogUsers {
    /// Index of the last record written (0: none yet).
    pub last: u64,
    /// Index of the first record still stored (`last + 1` when none is).
    pub first: u64,
    pub users: Vec<User>,
}

impl<S: Store> Meta<S> {
    async fn submit_user(&self, op: Op) -> Result<User> {
        match self.submit(op).await? {
            Done::User(user) => Ok(user),
            _ => unreachable!("changelog operation answers with its reader"),
        }
    }

    /// Registers a changelog reader; it gets every record written from now on whose type is
    /// in `mask`.
    pub async fn changelog_register(&self, name: &str, mask: Mask) -> Result<User> {
        self.submit_user(Op::ClRegister {
            name: name.to_string(),
            mask,
        })
        .await
    }

    /// Deregisters a reader; what only it still needed is purged in the background.
    pub async fn changelog_deregister(&self, id: UserId) -> Result<User> {
        self.submit_user(Op::ClDeregister { id }).await
    }

    /// Marks every record up to `index` (0: the last) processed by `id`. Returns at once; the
    /// purge of what every reader has cleared runs in the background.
    pub async fn changelog_clear(&self, id: UserId, index: u64) -> Result<User> {
        self.submit_user(Op::ClClear { id, index }).await
    }

    pub async fn changelog_set_mask(&self, id: UserId, mask: Mask) -> Result<User> {
        self.submit_user(Op::ClMask { id, mask }).await
    }

    /// The readers, and the first and last indices, on a snapshot.
    pub fn changelog_users(&self) -> Result<ChangelogUsers> {
        self.blocking(|| {
            // Read before the snapshot: a first the committer knew then is stored in it.
            let floor = self
                .stats
                .cl_first
                .load(std::sync::atomic::Ordering::Relaxed);
            let snap = self.store.snapshot()?;
            let state = changelog::ClState::load_from(
                &snap,
                calm_changelog::ChangelogConfig::default(),
                self.shared,
                floor,
            )?;
            Ok(ChangelogUsers {
                last: state.last,
                first: state.first,
                users: state.registry.users().cloned().collect(),
            })
        })
    }

    /// Records from index `from` on, at most `max_records` (and [`CL_READ_RECORDS_MAX`]) and
    /// about `max_bytes` encoded bytes (and [`CL_READ_BYTES_MAX`]; at least one record).
    /// With `reader`, starts after what it has cleared and skips types outside its mask.
    pub fn changelog_read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
    ) -> Result<Vec<Record>> {
        let mut batch = ReadBatch::new(max_records, max_bytes);
        self.changelog_read_more(from, reader, &mut batch, false)?;
        Ok(batch.records)
    }

    /// Reads records from index `from` on into `batch` until it is full or the log ends;
    /// returns the index to go on from (past every record visited, those outside the
    /// reader's mask included).
    ///
    /// With `recent`, on a snapshot that sees this server's commits and those of others it
    /// has been told of ([`Store::snapshot_recent`]: no round trip on a shared store), for a
    /// follower that knows which records to expect.
    fn changelog_read_more(
        &self,
        from: u64,
        reader: Option<UserId>,
        batch: &mut ReadBatch,
        recent: bool,
    ) -> Result<u64> {
        if batch.full() {
            return Ok(from);
        }
        self.blocking(|| {
            let snap = if recent {
                self.store.snapshot_recent()?
            } else {
                self.store.snapshot()?
            };
            let (mut from, mask) = (from, reader_mask(&snap, reader)?);
            if let Some((cleared, _)) = mask {
                from = from.max(cleared + 1);
            }
            let mut next = from;
            let mut bad = None;
            snap.log_visit(from, &mut |index, value| {
                match Record::decode(index, value) {
                    Ok(record) => {
                        next = index + 1;
                        if mask.is_none_or(|(_, m)| m.contains(record.kind)) {
                            batch.bytes += value.len();
                            batch.records.push(record);
                        }
                    }
                    Err(error) => {
                        bad = Some(MetaError::Corrupt(format!(
                            "changelog record {index}: {error}"
                        )));
                        return ControlFlow::Break(());
                    }
                }
                if batch.full() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            match bad {
                Some(error) => Err(error),
                None => Ok(next),
            }
        })
    }

    /// [`Meta::changelog_read`] of the records this server knows of (up to
    /// [`Meta::changelog_last`]): none without a read when `from` is past them, else on a
    /// recent snapshot (no round trip on a shared store), and on a full one only when the
    /// recent one lacks some. For a follower woken by [`Meta::changelog_wait`].
    pub fn changelog_read_known(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
    ) -> Result<Vec<Record>> {
        let last = self.changelog_last();
        let mut batch = ReadBatch::new(max_records, max_bytes);
        if from > last {
            return Ok(batch.records);
        }
        self.changelog_read_known_more(from, last, reader, &mut batch)?;
        Ok(batch.records)
    }

    /// [`Meta::changelog_read_more`] of records known to reach `upto`: on a recent snapshot,
    /// and on a full one only when the recent one lacks some.
    fn changelog_read_known_more(
        &self,
        from: u64,
        upto: u64,
        reader: Option<UserId>,
        batch: &mut ReadBatch,
    ) -> Result<u64> {
        let next = self.changelog_read_more(from, reader, batch, true)?;
        if next <= upto {
            return self.changelog_read_more(next, reader, batch, false);
        }
        Ok(next)
    }

    /// [`Meta::changelog_read`] for a follower: when fewer than `follow.min_records` records
    /// are there, waits for them up to `follow.linger` after the call; past that, answers with
    /// what is there, or, when nothing is, waits up to `follow.wait` for the first record.
    /// Each wait sleeps until a commit reaches the index it needs or its time is up (records
    /// of types outside the reader's mask count there, so it may read again and go on).
    ///
    /// A follower that keeps up is so woken once a linger (by its timer, or by a full batch),
    /// not on every group commit; an idle one sleeps until the next record (no polling).
    pub async fn changelog_follow(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        reader: Option<UserId>,
        follow: Follow,
    ) -> Result<Vec<Record>> {
        let mut last = self.changelog_last();
        let mut batch = ReadBatch::new(max_records, max_bytes);
        // Each read after a wait goes on from where the one before stopped: a record is
        // decoded once per call, however many times the follower wakes. A follower that has
        // read every record this server knows of waits for the next without reading (a
        // record committed elsewhere a moment ago is told to this server within moments, and
        // wakes it).
        let mut next = if from > last && !follow.wait.is_zero() {
            from
        } else {
            self.changelog_read_more(from, reader, &mut batch, false)?
        };
        let min_records = follow.min_records.clamp(1, batch.max_records);
        if batch.records.len() >= min_records || batch.full() || follow.wait.is_zero() {
            return Ok(batch.records);
        }
        let called = tokio::time::Instant::now();
        let deadline = called + follow.wait;
        let linger_end = (called + follow.linger).min(deadline);
        loop {
            let now = tokio::time::Instant::now();
            let lingering = now < linger_end;
            if !lingering && !batch.records.is_empty() {
                break;
            }
            let (until, index) = if lingering {
                (
                    linger_end,
                    last + (min_records - batch.records.len()) as u64,
                )
            } else {
                (deadline, last + 1)
            };
            let left = until.saturating_duration_since(now);
            if left.is_zero() {
                break;
            }
            let reached = self.changelog_wait_until(index, left).await?;
            if reached != last {
                last = reached;
                next = self.changelog_read_known_more(next, reached, reader, &mut batch)?;
                if batch.records.len() >= min_records || batch.full() {
                    break;
                }
            }
        }
        Ok(batch.records)
    }

    /// The index of the last record committed.
    pub fn changelog_last(&self) -> u64 {
        self.last_index.get()
    }

    /// Waits until a record after `after` is committed, or `timeout` passes; returns the last
    /// index then. For follow mode (a long poll): no fixed-interval polling.
    pub async fn changelog_wait(&self, after: u64, timeout: std::time::Duration) -> Result<u64> {
        self.changelog_wait_until(after.saturating_add(1), timeout)
            .await
    }

    /// Waits until the last index is at least `index`, or `timeout` passes; returns the last
    /// index then. The waiter is woken once, when a commit reaches `index`. Busy when
    /// [`FOLLOWERS_WAITING_MAX`] followers wait already.
    pub async fn changelog_wait_until(
        &self,
        index: u64,
        timeout: std::time::Duration,
    ) -> Result<u64> {
        self.last_index
            .wait_until(index, timeout)
            .await
            .map_err(|busy| MetaError::Busy(busy.to_string()))
    }
}

/// The records of one read so far, and its limits (clamped to the namespace's).
struct ReadBatch {
    records: Vec<Record>,
    /// Encoded bytes of `records`.
    bytes: usize,
    max_records: usize,
    max_bytes: usize,
}

impl ReadBatch {
    fn new(max_records: usize, max_bytes: usize) -> ReadBatch {
        ReadBatch {
            records: Vec::new(),
            bytes: 0,
            max_records: max_records.clamp(1, CL_READ_RECORDS_MAX),
            max_bytes: max_bytes.clamp(1, CL_READ_BYTES_MAX),
        }
    }

    /// No record more is taken (at least one is, whatever its size).
    fn full(&self) -> bool {
        self.records.len() >= self.max_records || self.bytes >= self.max_bytes
    }
}

/// A reader's cleared index and mask, if `reader` is given.
fn reader_mask<R: ReadTxn>(view: &R, reader: Option<UserId>) -> Result<Option<(u64, Mask)>> {
    let Some(id) = reader else {
        return Ok(None);
    };
    let bytes = view.get(&cl_user_key(id))?.ok_or(MetaError::NotFound)?;
    let user = User::decode(id, &bytes)
        .ok_or_else(|| MetaError::Corrupt(format!("changelog reader cl{id} does not decode")))?;
    Ok(Some((user.cleared, user.mask)))
}
