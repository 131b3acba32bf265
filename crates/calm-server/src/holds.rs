//! Held files: a mount that made a regular file may change its mode, owner and times itself
//! (answering its callers at once) and send the changes later, as one, when it gives the file
//! back. Any other session's request that would see the file first has the server ask the
//! holder for it, on the stream the holder keeps open (`Meta.Holds`), and waits until the
//! holder sent its changes and gave it back: nobody else ever reads what a holder answered
//! differently (docs/design/mount.md "Held files").
//!
//! - A hold is granted only to a session whose stream is open, only by a server alone on its
//!   store, and ends with the stream (a mount that died loses its held changes, which it never
//!   said were durable).
//! - A holder that does not give a file back within [`RECALL_WAIT_MAX`] loses the hold, and
//!   its session is granted no more: the waiting request goes on, and the changes the holder
//!   sends later are applied when they come (late, never lost).
//! - At most [`HOLDS_MAX`] holds on a server and [`HOLDS_PER_SESSION_MAX`] per session; past
//!   them a make is answered without a hold.
//!
//! The table is kept by handle and by the directory the file was made in: a request naming a
//! name or listing a directory recalls the holds of that directory. Only the holder moves or
//! links its file, and it gives the file back first (the mount does), so the directory kept is
//! the file's only one while it is held.
//!
//! Copies ([`copies`]) are asked back on the same stream, with the same wait: a session with
//! a copy of a file answers its opens without asking, and another session's change of the
//! file is answered only once every copy of it was given back (or taken away).

mod copies;
pub(crate) mod gate;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use calm_meta::Handle;
use calm_proto::pb;
use calm_types::sync::Locked;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status};

/// Holds on one server.
pub const HOLDS_MAX: usize = 1 << 20;
/// Holds of one session.
pub const HOLDS_PER_SESSION_MAX: usize = 65_536;
/// How long a request waits for a holder to give its files back before taking the holds away.
pub const RECALL_WAIT_MAX: Duration = Duration::from_secs(5);
/// How often quota shares no hold claimed are looked for.
const SHARES_SWEPT_EVERY: Duration = Duration::from_secs(10);
/// Recall batches queued for one holder's stream before more recalls of it wait for room.
const RECALLS_QUEUED_MAX: usize = 64;
/// Copies on one server.
pub const COPIES_MAX: usize = 1 << 20;
/// Copies of one session.
pub const COPIES_PER_SESSION_MAX: usize = 65_536;

/// Which holds a request needs given back (those of other sessions than the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recall {
    /// The file itself.
    File(Handle),
    /// Every file held in this directory, and the directory if its names are held (a name
    /// in it is looked up, made, removed or listed).
    Dir(Handle),
    /// Every hold (quotas, clones, dumps: what reads many files at once).
    All,
}

#[derive(Debug)]
struct Hold {
    session: u64,
    dir: Handle,
    /// Asked back already (not asked again).
    recalled: bool,
    /// A directory held: the quota share its makes draw from (`calm_meta::quota::shares`).
    pool: Option<Handle>,
}

#[derive(Debug)]
struct Holder {
    /// The stream this session's holds belong to (a new stream of the session ends them).
    stream: u64,
    files: HashSet<Handle>,
    recalls: mpsc::Sender<Vec<Handle>>,
}

#[derive(Debug, Default)]
struct Table {
    files: HashMap<Handle, Hold>,
    dirs: HashMap<Handle, HashSet<Handle>>,
    holders: HashMap<u64, Holder>,
    next_stream: u64,
    /// Sessions that did not give a file back in time: granted no more holds (a mount that
    /// ignores recalls would have every other client's requests wait).
    distrusted: HashSet<u64>,
    copies: copies::Copies,
    /// Per quota share: the directories held that draw from it.
    pools: HashMap<Handle, usize>,
    /// Shares no directory held draws from any more, to release (outside the table's lock).
    released: Vec<Handle>,
}

impl Table {
    fn remove(&mut self, handle: Handle) -> Option<Hold> {
        let hold = self.files.remove(&handle)?;
        self.forget(handle, &hold);
        if let Some(holder) = self.holders.get_mut(&hold.session) {
            holder.files.remove(&handle);
        }
        Some(hold)
    }

    /// Takes `hold` of `handle` out of the directories' index and its share's count.
    fn forget(&mut self, handle: Handle, hold: &Hold) {
        if let Some(files) = self.dirs.get_mut(&hold.dir) {
            files.remove(&handle);
            if files.is_empty() {
                self.dirs.remove(&hold.dir);
            }
        }
        if let Some(pool) = hold.pool
            && let Some(count) = self.pools.get_mut(&pool)
        {
            *count -= 1;
            if *count == 0 {
                self.pools.remove(&pool);
                self.released.push(pool);
            }
        }
    }

    fn end_session(&mut self, session: u64) -> usize {
        self.copies.end_session(session);
        let Some(holder) = self.holders.remove(&session) else {
            return 0;
        };
        for handle in &holder.files {
            if let Some(hold) = self.files.remove(handle) {
                self.forget(*handle, &hold);
            }
        }
        holder.files.len()
    }

    /// The holds `recall` names that sessions other than `asker` have.
    fn wanted(&self, asker: u64, recall: Recall) -> Vec<Handle> {
        let others = |handle: &Handle| self.files.get(handle).is_some_and(|h| h.session != asker);
        match recall {
            Recall::File(handle) => [handle].into_iter().filter(others).collect(),
            // The files held in it, and the directory itself when a mount holds its names.
            Recall::Dir(dir) => {
                let held = self.dirs.get(&dir).into_iter().flatten().copied();
                let mut wanted: Vec<Handle> = held.filter(others).collect();
                if others(&dir) && !wanted.contains(&dir) {
                    wanted.push(dir);
                }
                wanted
            }
            Recall::All => self.files.keys().copied().filter(others).collect(),
        }
    }
}

/// The server's holds.
#[derive(Debug)]
pub struct Holds {
    table: Mutex<Table>,
    /// Holds in the table (read without the lock: most requests find none).
    count: AtomicUsize,
    /// Woken whenever holds end.
    ended: Notify,
    /// Holds taken away from holders that did not give them back in time.
    pub(crate) taken: AtomicUsize,
    /// Holds asked back for another client.
    pub(crate) recalled: AtomicUsize,
    /// Copies asked back for another client's change, and taken away.
    copies_recalled: AtomicUsize,
    copies_taken: AtomicUsize,
    /// How long a recall waits ([`RECALL_WAIT_MAX`]).
    wait: Duration,
    /// The quota shares the directories held draw from, released with their last hold.
    shares: Option<Arc<calm_meta::quota::Shares>>,
    /// Quota limits set or removed: a hold asked for before is not granted after
    /// ([`Holds::limits_changed`]).
    limits: AtomicU64,
    /// What a hold of a directory with names waits at ([`gate`]).
    gate: gate::Gate,
}

impl Default for Holds {
    fn default() -> Holds {
        Holds::new(RECALL_WAIT_MAX)
    }
}

impl Holds {
    /// Holds whose recalls wait at most `wait`.
    pub fn new(wait: Duration) -> Holds {
        Holds {
            table: Mutex::default(),
            count: AtomicUsize::new(0),
            ended: Notify::new(),
            taken: AtomicUsize::new(0),
            recalled: AtomicUsize::new(0),
            copies_recalled: AtomicUsize::new(0),
            copies_taken: AtomicUsize::new(0),
            wait,
            shares: None,
            limits: AtomicU64::new(0),
            gate: gate::Gate::default(),
        }
    }

    /// A pass through the gate, taken before a request looks at the holds and held until its
    /// change is applied ([`gate`]).
    pub fn enter(&self) -> gate::Pass<'_> {
        self.gate.enter()
    }

    /// Waits until every request that took a pass before now has been applied ([`gate`]).
    pub async fn settled(&self) {
        self.gate.turn().await
    }

    /// Whether `session` holds `handle`.
    pub fn held_by(&self, session: u64, handle: Handle) -> bool {
        let table = self.table.locked();
        table
            .files
            .get(&handle)
            .is_some_and(|h| h.session == session)
    }

    /// The count of quota limits set or removed.
    pub fn limits(&self) -> u64 {
        self.limits.load(Ordering::SeqCst)
    }

    /// A quota limit was set or removed: a hold asked for before (its make maybe judged
    /// without the limit, its share set aside without it) is not granted. The caller then
    /// recalls every hold granted before.
    pub fn limits_changed(&self) {
        self.limits.fetch_add(1, Ordering::SeqCst);
    }

    /// Holds whose directories' quota shares are kept in `shares` (released with their last
    /// hold).
    pub fn with_shares(self, shares: Arc<calm_meta::quota::Shares>) -> Holds {
        Holds {
            shares: Some(shares),
            ..self
        }
    }

    /// Gives back the room of quota shares set aside for directories whose hold was never
    /// granted (`calm_meta::quota::Shares::sweep`): how many. Under the table's lock, so that
    /// a share is never swept once a hold draws from it.
    pub fn sweep_shares(&self) -> usize {
        let Some(shares) = &self.shares else {
            return 0;
        };
        let table = self.table.locked();
        let claimed = |pool| table.pools.contains_key(&pool);
        shares.sweep(claimed, std::time::Instant::now())
    }

    /// Sweeps the quota shares no hold claimed, every [`SHARES_SWEPT_EVERY`], for ever.
    pub async fn keep_sweeping_shares(self: Arc<Self>) {
        let mut every = tokio::time::interval(SHARES_SWEPT_EVERY);
        loop {
            every.tick().await;
            let swept = self.sweep_shares();
            if swept > 0 {
                tracing::info!(swept, "quota shares no hold claimed gave their room back");
            }
        }
    }

    /// The quota share the directory `dir` held by `session` draws from.
    pub fn pool(&self, session: u64, dir: Handle) -> Option<Handle> {
        let table = self.table.locked();
        let hold = table.files.get(&dir)?;
        (hold.session == session).then_some(hold.pool)?
    }

    /// Releases the shares no directory held draws from any more; wakes who waits for holds
    /// to end when `ended` are.
    fn ended(&self, mut table: std::sync::MutexGuard<'_, Table>, ended: usize) {
        let released = std::mem::take(&mut table.released);
        self.count.fetch_sub(ended, Ordering::Relaxed);
        drop(table);
        if let Some(shares) = &self.shares {
            for pool in released {
                shares.release(pool);
            }
        }
        if ended > 0 {
            self.ended.notify_waiters();
        }
    }

    /// Opens `session`'s stream of recalls: a stream opened before ends, with its holds.
    pub fn open_stream(&self, session: u64) -> (u64, mpsc::Receiver<Vec<Handle>>) {
        let (tx, rx) = mpsc::channel(RECALLS_QUEUED_MAX);
        let mut table = self.table.locked();
        let ended = table.end_session(session);
        table.next_stream += 1;
        let stream = table.next_stream;
        table.holders.insert(
            session,
            Holder {
                stream,
                files: HashSet::new(),
                recalls: tx,
            },
        );
        self.ended(table, ended);
        (stream, rx)
    }

    /// `session`'s stream `stream` ended: so do its holds.
    pub fn close_stream(&self, session: u64, stream: u64) {
        let mut table = self.table.locked();
        if table.holders.get(&session).map(|h| h.stream) != Some(stream) {
            return;
        }
        let ended = table.end_session(session);
        self.ended(table, ended);
    }

    /// Grants `session` the hold of `handle`, just made in `dir`, if its stream is open and
    /// the limits allow. In a directory the session holds, the mount answered the make
    /// itself and holds what it made already: granted past the limits (the mount bounds what
    /// it holds so). `pool`: the quota share a directory's makes draw from.
    pub fn grant(&self, session: u64, handle: Handle, dir: Handle, pool: Option<Handle>) -> bool {
        let mut table = self.table.locked();
        let answered_there = table.files.get(&dir).is_some_and(|d| d.session == session);
        let full = table.files.len() >= HOLDS_MAX && !answered_there;
        if full || table.files.contains_key(&handle) {
            return false;
        }
        if table.distrusted.contains(&session) {
            return false;
        }
        let Some(holder) = table.holders.get_mut(&session) else {
            return false;
        };
        let full = holder.files.len() >= HOLDS_PER_SESSION_MAX && !answered_there;
        if full || holder.recalls.is_closed() {
            return false;
        }
        holder.files.insert(handle);
        table.files.insert(
            handle,
            Hold {
                session,
                dir,
                recalled: false,
                pool,
            },
        );
        if let Some(pool) = pool {
            *table.pools.entry(pool).or_default() += 1;
        }
        table.dirs.entry(dir).or_default().insert(handle);
        self.count.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `session` gives back these holds (those it has; others are ignored).
    pub fn give_back(&self, session: u64, handles: &[Handle]) {
        let mut table = self.table.locked();
        let mut ended = 0;
        for handle in handles {
            if table
                .files
                .get(handle)
                .is_some_and(|h| h.session == session)
            {
                table.remove(*handle);
                ended += 1;
            }
        }
        self.ended(table, ended);
    }

    /// The count of changes of `handle`, read before its map is read for a copy
    /// ([`Holds::grant_copy`]).
    pub fn changes(&self, handle: Handle) -> u64 {
        self.table.locked().copies.changes(handle)
    }

    /// Grants `session` a copy of `handle`, whose map it read after the count of changes was
    /// `changes`, if its stream is open, no change of the file counted since, and the limits
    /// allow.
    pub fn grant_copy(&self, session: u64, handle: Handle, changes: u64) -> bool {
        let mut table = self.table.locked();
        if table.copies.count() >= COPIES_MAX
            || table.copies.of(session) >= COPIES_PER_SESSION_MAX
            || table.distrusted.contains(&session)
        {
            return false;
        }
        if table
            .holders
            .get(&session)
            .is_none_or(|h| h.recalls.is_closed())
        {
            return false;
        }
        table.copies.grant(session, handle, changes)
    }

    /// `session` gives back its copies of these files.
    pub fn give_back_copies(&self, session: u64, handles: &[Handle]) {
        let mut table = self.table.locked();
        let mut ended = false;
        for handle in handles {
            ended |= table.copies.give_back(session, *handle);
        }
        drop(table);
        if ended {
            self.ended.notify_waiters();
        }
    }

    /// Copies kept now, asked back since start, taken away since start.
    pub fn copy_figures(&self) -> (u64, u64, u64) {
        let load = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
        let kept = self.table.locked().copies.count() as u64;
        (kept, load(&self.copies_recalled), load(&self.copies_taken))
    }

    /// A change of `handle` by `asker` committed: every other session's copy of it is asked
    /// back, and this waits until they are given back; one not given back within
    /// [`RECALL_WAIT_MAX`] is taken away (and its session is granted nothing more).
    pub async fn changed(&self, asker: u64, handle: Handle) {
        self.table.locked().copies.changed(handle);
        let given_back = self
            .ask_and_wait(|table| {
                if table.copies.wanted(asker, handle).is_empty() {
                    return None;
                }
                let asks: Vec<_> = table
                    .copies
                    .unasked(asker, handle)
                    .into_iter()
                    .filter_map(|session| table.holders.get(&session))
                    .map(|holder| (holder.recalls.clone(), vec![handle]))
                    .collect();
                self.copies_recalled
                    .fetch_add(asks.len(), Ordering::Relaxed);
                Some(asks)
            })
            .await;
        if !given_back {
            self.take_copies_away(asker, handle);
        }
    }

    /// Asks holders for what `ask` finds in the table (`None`: nothing is wanted any more;
    /// else each holder's stream with what to ask it for, nothing for what was asked already),
    /// and waits until nothing is wanted: whether that came within [`RECALL_WAIT_MAX`].
    async fn ask_and_wait(
        &self,
        mut ask: impl FnMut(&mut Table) -> Option<Vec<(mpsc::Sender<Vec<Handle>>, Vec<Handle>)>>,
    ) -> bool {
        let deadline = Instant::now() + self.wait;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let Some(asks) = ask(&mut self.table.locked()) else {
                return true;
            };
            for (recalls, handles) in asks {
                // A holder whose stream went away ends its holds and copies when the stream
                // ends.
                let _ = tokio::time::timeout_at(deadline, recalls.send(handles)).await;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// Takes away the copies of `handle` other sessions than `asker` did not give back in time.
    fn take_copies_away(&self, asker: u64, handle: Handle) {
        let mut table = self.table.locked();
        let sessions = table.copies.wanted(asker, handle);
        for session in &sessions {
            tracing::warn!(
                handle,
                session,
                "a mount did not give a copy of a file back in time: its copy is taken away, \
                 and it is granted no more"
            );
            table.copies.give_back(*session, handle);
            if table.distrusted.len() < HOLDS_PER_SESSION_MAX {
                table.distrusted.insert(*session);
            }
        }
        self.copies_taken
            .fetch_add(sessions.len(), Ordering::Relaxed);
        drop(table);
        self.ended.notify_waiters();
    }

    /// Holds in the table.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Holds now, asked back since start, taken away since start.
    pub fn figures(&self) -> (u64, u64, u64) {
        let load = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
        (load(&self.count), load(&self.recalled), load(&self.taken))
    }

    /// Has every hold `recall` names that another session than `asker` has given back, and
    /// waits for it; a holder that does not within [`RECALL_WAIT_MAX`] loses them.
    pub async fn recall(&self, asker: u64, recall: Recall) {
        if self.count() == 0 {
            return;
        }
        let given_back = self
            .ask_and_wait(|table| {
                let wanted = table.wanted(asker, recall);
                if wanted.is_empty() {
                    return None;
                }
                let mut asks: HashMap<u64, (mpsc::Sender<Vec<Handle>>, Vec<Handle>)> =
                    HashMap::new();
                for handle in wanted {
                    let hold = table.files.get_mut(&handle).expect("wanted holds exist");
                    if hold.recalled {
                        continue;
                    }
                    hold.recalled = true;
                    self.recalled.fetch_add(1, Ordering::Relaxed);
                    let session = hold.session;
                    if let Some(holder) = table.holders.get(&session) {
                        asks.entry(session)
                            .or_insert_with(|| (holder.recalls.clone(), Vec::new()))
                            .1
                            .push(handle);
                    }
                }
                Some(asks.into_values().collect())
            })
            .await;
        if !given_back {
            self.take_away(asker, recall);
        }
    }

    /// Takes away the holds `recall` names from holders that did not give them back in time.
    fn take_away(&self, asker: u64, recall: Recall) {
        let mut table = self.table.locked();
        let wanted = table.wanted(asker, recall);
        for handle in &wanted {
            if let Some(hold) = table.remove(*handle) {
                tracing::warn!(
                    handle,
                    session = hold.session,
                    "a mount did not give a file it held back in time: its holds are taken \
                     away, and it is granted no more"
                );
                if table.distrusted.len() < HOLDS_PER_SESSION_MAX {
                    table.distrusted.insert(hold.session);
                }
            }
        }
        self.taken.fetch_add(wanted.len(), Ordering::Relaxed);
        self.ended(table, wanted.len());
    }
}

/// The stream of recalls a holder keeps open.
pub type RecallStream = ReceiverStream<Result<pb::Recalls, Status>>;

/// `Meta.Holds`: opens `session`'s stream of recalls; its holds end with it.
pub(crate) fn serve(
    holds: Option<Arc<Holds>>,
    session: u64,
) -> Result<Response<RecallStream>, Status> {
    let Some(holds) = holds else {
        return Err(calm_proto::status_from_error(
            &calm_meta::MetaError::NotSupported(
                "this server lets no mount hold files: it shares its store with other servers"
                    .into(),
            ),
        ));
    };
    if session == 0 {
        return Err(Status::invalid_argument(
            "holding files needs a lock session",
        ));
    }
    let (stream, mut recalls) = holds.open_stream(session);
    let (tx, rx) = mpsc::channel(RECALLS_QUEUED_MAX);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                handles = recalls.recv() => {
                    let Some(handles) = handles else { break };
                    if tx.send(Ok(pb::Recalls { handles })).await.is_err() {
                        break;
                    }
                }
                _ = tx.closed() => break,
            }
        }
        holds.close_stream(session, stream);
    });
    Ok(Response::new(ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hold_is_granted_only_to_a_session_with_its_stream_open() {
        let holds = Holds::default();
        assert!(!holds.grant(7, 100, 1, None));
        let (stream, _rx) = holds.open_stream(7);
        assert!(holds.grant(7, 100, 1, None));
        assert!(!holds.grant(8, 100, 1, None), "one holder per file");
        assert_eq!(holds.count(), 1);
        holds.close_stream(7, stream);
        assert_eq!(holds.count(), 0);
        assert!(!holds.grant(7, 101, 1, None));
    }

    #[tokio::test]
    async fn a_recall_asks_the_holder_and_waits_until_it_gives_the_file_back() {
        let holds = std::sync::Arc::new(Holds::default());
        let (_stream, mut rx) = holds.open_stream(7);
        assert!(holds.grant(7, 100, 1, None));
        assert!(holds.grant(7, 101, 2, None));
        // The holder itself is never asked.
        holds.recall(7, Recall::All).await;
        let holder = {
            let holds = holds.clone();
            tokio::spawn(async move {
                let asked = rx.recv().await.expect("a recall");
                holds.give_back(7, &asked);
                asked
            })
        };
        holds.recall(8, Recall::Dir(1)).await;
        assert_eq!(holder.await.unwrap(), vec![100]);
        assert_eq!(
            holds.count(),
            1,
            "the file of the other directory stays held"
        );
        holds.recall(8, Recall::File(5)).await;
        assert_eq!(holds.count(), 1);
    }

    #[tokio::test]
    async fn a_holder_that_does_not_answer_loses_its_holds_after_the_wait() {
        let wait = Duration::from_millis(50);
        let holds = Holds::new(wait);
        let (_stream, _rx) = holds.open_stream(7);
        assert!(holds.grant(7, 100, 1, None));
        let started = tokio::time::Instant::now();
        holds.recall(8, Recall::File(100)).await;
        assert!(started.elapsed() >= wait);
        assert_eq!(holds.count(), 0);
        assert_eq!(holds.taken.load(Ordering::Relaxed), 1);
        // A session that ignored a recall holds nothing more, even on a new stream.
        assert!(!holds.grant(7, 101, 1, None));
        let (_again, _rx2) = holds.open_stream(7);
        assert!(!holds.grant(7, 102, 1, None));
    }

    #[tokio::test]
    async fn a_new_stream_of_a_session_ends_the_holds_of_the_old_one() {
        let holds = Holds::default();
        let (old, _rx) = holds.open_stream(7);
        assert!(holds.grant(7, 100, 1, None));
        let (_new, _rx2) = holds.open_stream(7);
        assert_eq!(holds.count(), 0);
        // The old stream's end does not end the new one's holds.
        assert!(holds.grant(7, 101, 1, None));
        holds.close_stream(7, old);
        assert_eq!(holds.count(), 1);
    }

    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Open(u64),
        Close(u64),
        Grant(u64, Handle, Handle, Option<Handle>),
        GiveBack(u64, Handle),
    }

    fn step() -> impl Strategy<Value = Step> {
        let session = 1..4u64;
        let handle = 10..30u64;
        // Files and directories made in directories 1 to 3, or in 10 and 11 (held themselves).
        let dir = prop_oneof![1..4u64, 10..12u64];
        prop_oneof![
            session.clone().prop_map(Step::Open),
            session.clone().prop_map(Step::Close),
            (session.clone(), handle.clone(), dir, 0..3u64)
                .prop_map(|(s, h, d, p)| { Step::Grant(s, h, d, (p > 0).then_some(p)) }),
            (session, handle).prop_map(|(s, h)| Step::GiveBack(s, h)),
        ]
    }

    proptest! {
        /// The table against a list of (file, session, directory) with the open streams: the
        /// same grants, the same holds asked back for every scope, the same count.
        #[test]
        fn the_table_answers_as_a_plain_list_of_holds(steps in prop::collection::vec(step(), 1..80)) {
            let holds = Holds::default();
            let mut streams: HashMap<u64, (u64, mpsc::Receiver<Vec<Handle>>)> = HashMap::new();
            let mut model: Vec<(Handle, u64, Handle, Option<Handle>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Open(s) => {
                        model.retain(|h| h.1 != s);
                        streams.insert(s, holds.open_stream(s));
                    }
                    Step::Close(s) => {
                        if let Some((stream, _)) = streams.remove(&s) {
                            holds.close_stream(s, stream);
                            model.retain(|h| h.1 != s);
                        }
                    }
                    Step::Grant(s, h, d, p) => {
                        let want = streams.contains_key(&s) && !model.iter().any(|m| m.0 == h);
                        prop_assert_eq!(holds.grant(s, h, d, p), want);
                        if want {
                            model.push((h, s, d, p));
                        }
                    }
                    Step::GiveBack(s, h) => {
                        holds.give_back(s, &[h]);
                        model.retain(|m| !(m.0 == h && m.1 == s));
                    }
                }
                prop_assert_eq!(holds.count(), model.len());
                // Each hold's share as granted; each share counted by the holds drawing
                // from it, and none waiting to be released.
                for m in &model {
                    prop_assert_eq!(holds.pool(m.1, m.0), m.3);
                    prop_assert_eq!(holds.pool(m.1 + 1, m.0), None);
                }
                let mut pools: HashMap<Handle, usize> = HashMap::new();
                for pool in model.iter().filter_map(|m| m.3) {
                    *pools.entry(pool).or_default() += 1;
                }
                let table = holds.table.locked();
                prop_assert_eq!(&table.pools, &pools);
                prop_assert!(table.released.is_empty());
                for asker in 0..4u64 {
                    let scopes = [
                        Recall::All,
                        Recall::Dir(1),
                        Recall::Dir(2),
                        Recall::Dir(10),
                        Recall::File(12),
                    ];
                    for scope in scopes {
                        let mut got = table.wanted(asker, scope);
                        got.sort();
                        let mut want: Vec<Handle> = model
                            .iter()
                            .filter(|m| m.1 != asker)
                            .filter(|m| match scope {
                                Recall::All => true,
                                // Held in it, or the directory itself held.
                                Recall::Dir(d) => m.2 == d || m.0 == d,
                                Recall::File(f) => m.0 == f,
                            })
                            .map(|m| m.0)
                            .collect();
                        want.sort();
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}
