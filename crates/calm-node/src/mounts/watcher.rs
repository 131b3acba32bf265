//! The mount-table watcher: a thread that keeps a [`MountTable`] exact.
//!
//! With fanotify mount events (Linux >= 6.15) each attach costs one `statmount(2)` of that
//! mount and each detach a map removal; a lost-event overflow costs one `listmount(2)` resync.
//! Without them it falls back to re-reading /proc/self/mountinfo when it changes, at most
//! once per `budget` × the last read's duration (the seed's 10 % CPU budget; 0: every time),
//! except while someone waits for a mount of their own: then at once, so that the completion
//! of one's own mount is never held back by the budget (the seed's first fix missed exactly
//! that and broke boot).

use calm_types::sync::Locked;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kernel::{self, KernelEvent, MountEvents};
use super::table::{Mount, MountChange, MountTable};

/// Changes a subscriber may have unread; past it, it is dropped (its receiver disconnects) and
/// should subscribe again and read the table.
pub const SUBSCRIBER_QUEUE_MAX: usize = 65_536;

/// How the watcher learns of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// fanotify mount events, statmount and listmount.
    Fanotify,
    /// /proc/self/mountinfo, re-read at most once per `budget` × the last read's duration.
    Mountinfo { budget: u32 },
}

/// What the watcher has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatcherStats {
    /// Kernel events handled (fanotify) or change notifications (mountinfo).
    pub events: u64,
    /// Full re-reads: listmount resyncs, or mountinfo parses.
    pub full_reads: u64,
    /// Overflows of the fanotify queue.
    pub overflows: u64,
    /// CPU time of the watcher thread.
    pub cpu: Duration,
}

#[derive(Debug, Default)]
struct State {
    table: MountTable,
    stats: WatcherStats,
    subscribers: Vec<SyncSender<MountChange>>,
    failed: Option<String>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Written to stop the thread or to make it look at `awaiting` again.
    wake: OwnedFd,
    /// Threads in `wait_until` (the watcher signals the condvar only when there are some).
    waiting: std::sync::atomic::AtomicUsize,
    /// The watcher thread's CPU clock (read on demand by `stats`, not per event).
    clock: Mutex<Option<libc::clockid_t>>,
}

impl Shared {
    fn poke(&self) {
        let one: u64 = 1;
        // SAFETY: write(2) of 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn apply(&self, changes: Vec<MountChange>, stats: impl FnOnce(&mut WatcherStats)) {
        let mut state = self.state.locked();
        stats(&mut state.stats);
        if !changes.is_empty() {
            state.subscribers.retain(|tx| {
                changes.iter().all(|c| match tx.try_send(c.clone()) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        tracing::warn!("a mount-change subscriber fell behind; dropping it");
                        false
                    }
                    Err(TrySendError::Disconnected(_)) => false,
                })
            });
        }
        drop(state);
        if self.waiting.load(std::sync::atomic::Ordering::Acquire) > 0 {
            self.changed.notify_all();
        }
    }
}

/// A running watcher; stops when dropped.
#[derive(Debug)]
pub struct MountWatcher {
    shared: Arc<Shared>,
    mode: Mode,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: read(2) of 8 bytes from our non-blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// poll(2) on `fds`; returns their revents (empty on timeout).
fn poll(fds: &[(i32, i16)], timeout: Option<Duration>) -> Vec<i16> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|(fd, events)| libc::pollfd {
            fd: *fd,
            events: *events,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: poll(2) on our array of its length.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![0; fds.len()];
    }
    pfds.iter().map(|p| p.revents).collect()
}

impl MountWatcher {
    /// Starts watching this process's mount namespace: with fanotify when the kernel has it,
    /// else with mountinfo and the 10× budget.
    pub fn start() -> std::io::Result<MountWatcher> {
        match MountWatcher::start_with(Mode::Fanotify) {
            Ok(watcher) => Ok(watcher),
            Err(e) => {
                tracing::info!(%e, "no fanotify mount events; watching /proc/self/mountinfo");
                MountWatcher::start_with(Mode::Mountinfo { budget: 10 })
            }
        }
    }

    /// Starts a watcher in the given mode. Returns once the table is complete.
    pub fn start_with(mode: Mode) -> std::io::Result<MountWatcher> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            wake: eventfd()?,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            clock: Mutex::new(None),
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let shared = shared.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("calm-mounts".into())
                .spawn(move || {
                    let mut clock: libc::clockid_t = 0;
                    // SAFETY: pthread_getcpuclockid(3) of this thread into a valid clockid_t.
                    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0
                    {
                        *shared.clock.locked() = Some(clock);
                    }
                    let result = match mode {
                        Mode::Fanotify => run_fanotify(&shared, &stop, ready_tx),
                        Mode::Mountinfo { budget } => {
                            run_mountinfo(&shared, &stop, budget, ready_tx)
                        }
                    };
                    if let Err(e) = result {
                        shared.state.locked().failed = Some(e.to_string());
                        shared.changed.notify_all();
                    }
                })?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(MountWatcher {
                shared,
                mode,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(std::io::Error::other(
                    "the mount watcher ended before it began",
                ))
            }
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The current table.
    pub fn table(&self) -> Vec<Mount> {
        self.shared.state.locked().table.mounts()
    }

    pub fn stats(&self) -> WatcherStats {
        let mut stats = self.shared.state.locked().stats;
        if let Some(clock) = *self.shared.clock.locked() {
            // SAFETY: timespec is plain data; clock_gettime(2) of the watcher thread's CPU clock
            // (valid while the thread runs, which it does as long as `self` lives).
            let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
                stats.cpu = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
            }
        }
        stats
    }

    /// Changes from now on (see [`SUBSCRIBER_QUEUE_MAX`]).
    pub fn subscribe(&self) -> Receiver<MountChange> {
        let (tx, rx) = sync_channel(SUBSCRIBER_QUEUE_MAX);
        self.shared.state.locked().subscribers.push(tx);
        rx
    }

    /// Declares a mount of one's own about to be made at `mount_point`: until the returned
    /// guard is waited on or dropped, the watcher processes changes at once.
    pub fn expect(&self, mount_point: &Path) -> Expected<'_> {
        self.shared
            .state
            .locked()
            .table
            .expect(mount_point.to_path_buf());
        self.shared.poke();
        Expected {
            watcher: self,
            mount_point: mount_point.to_path_buf(),
        }
    }

    /// Waits until `pred(table)` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&MountTable) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let waiting = &self.shared.waiting;
        waiting.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut state = self.shared.state.locked();
        loop {
            let done = if pred(&state.table) {
                Some(true)
            } else if state.failed.is_some() || Instant::now() >= deadline {
                Some(false)
            } else {
                None
            };
            if let Some(done) = done {
                waiting.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                return done;
            }
            let now = Instant::now();
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .expect("mount watcher")
                .0;
        }
    }

    /// Holds the table so that the watcher stops processing until the guard is dropped (its
    /// kernel queue then fills up: tests use it to make the queue overflow).
    #[doc(hidden)]
    pub fn freeze(&self) -> impl Drop + '_ {
        self.shared.state.locked()
    }

    /// Why the watcher thread stopped, if it did.
    pub fn failed(&self) -> Option<String> {
        self.shared.state.locked().failed.clone()
    }
}

impl Drop for MountWatcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.shared.poke();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A mount of one's own that the watcher is told to expect.
#[derive(Debug)]
pub struct Expected<'a> {
    watcher: &'a MountWatcher,
    mount_point: PathBuf,
}

impl Expected<'_> {
    /// Waits until a mount is at the expected mount point; returns it.
    pub fn wait(self, timeout: Duration) -> Option<Mount> {
        let point = self.mount_point.clone();
        let seen = self
            .watcher
            .wait_until(timeout, |table| table.at(&point).is_some());
        if !seen {
            return None;
        }
        let state = self.watcher.shared.state.locked();
        state.table.at(&point).cloned()
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        self.watcher
            .shared
            .state
            .locked()
            .table
            .unexpect(&self.mount_point);
    }
}

fn stopping(stop: &std::sync::atomic::AtomicBool) -> bool {
    stop.load(std::sync::atomic::Ordering::Acquire)
}

type Ready = std::sync::mpsc::Sender<std::io::Result<()>>;

fn run_fanotify(
    shared: &Shared,
    stop: &std::sync::atomic::AtomicBool,
    ready: Ready,
) -> std::io::Result<()> {
    // Mark first, then list: a mount that changes in between shows up in both, which the
    // table absorbs (attach is idempotent, an unknown detach is ignored).
    let mut events = match MountEvents::open() {
        Ok(events) => events,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let mut buf = Vec::new();
    let all = match kernel::list_all(&mut buf) {
        Ok(all) => all,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let initial = shared.state.locked().table.reload(all);
    shared.apply(initial, |s| s.full_reads += 1);
    let _ = ready.send(Ok(()));
    let fan_fd = events.raw_fd();
    loop {
        let revents = poll(
            &[
                (fan_fd, libc::POLLIN),
                (shared.wake.as_raw_fd(), libc::POLLIN),
            ],
            None,
        );
        if revents[1] != 0 {
            drain(&shared.wake);
        }
        if stopping(stop) {
            return Ok(());
        }
        if revents[0] == 0 {
            continue;
        }
        let batch = events.read()?;
        let mut changes = Vec::new();
        let mut overflow = false;
        let mut handled = 0;
        for event in batch {
            handled += 1;
            match event {
                KernelEvent::Attach(id) => {
                    if let Some(mount) = kernel::statmount(id, &mut buf)? {
                        let mut state = shared.state.locked();
                        changes.extend(state.table.attach(id, mount));
                    }
                }
                KernelEvent::Detach(id) => {
                    let mut state = shared.state.locked();
                    changes.extend(state.table.detach(id));
                }
                KernelEvent::Overflow => overflow = true,
            }
        }
        if overflow {
            // Events were lost: one listmount says what the table is now.
            let all = kernel::list_all(&mut buf)?;
            let mut state = shared.state.locked();
            changes.extend(state.table.reload(all));
        }
        shared.apply(changes, |s| {
            s.events += handled;
            if overflow {
                s.overflows += 1;
                s.full_reads += 1;
            }
        });
    }
}

fn run_mountinfo(
    shared: &Shared,
    stop: &std::sync::atomic::AtomicBool,
    budget: u32,
    ready: Ready,
) -> std::io::Result<()> {
    let fd = match kernel::mountinfo_fd() {
        Ok(fd) => fd,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let read = |shared: &Shared| -> std::io::Result<Duration> {
        let started = Instant::now();
        let text = read_all(&fd)?;
        let now = kernel::parse_mountinfo(&text)
            .into_iter()
            .map(|m| (u64::from(m.id), m))
            .collect();
        let changes = shared.state.locked().table.reload(now);
        let took = started.elapsed();
        shared.apply(changes, |s| s.full_reads += 1);
        Ok(took)
    };
    let mut last_read = match read(shared) {
        Ok(took) => took,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let _ = ready.send(Ok(()));
    let mut last_at = Instant::now();
    let mut pending = false;
    loop {
        let awaiting = shared.state.locked().table.awaiting();
        let allowed_at = last_at + last_read * budget;
        if pending && (awaiting || Instant::now() >= allowed_at) {
            last_read = read(shared)?;
            last_at = Instant::now();
            pending = false;
            continue;
        }
        // While a change waits for its budget, only the wake-up descriptor is watched (the
        // mountinfo descriptor would report the same change again and again).
        let revents = if pending {
            let wait = allowed_at.saturating_duration_since(Instant::now());
            let r = poll(&[(shared.wake.as_raw_fd(), libc::POLLIN)], Some(wait));
            vec![0, r[0]]
        } else {
            poll(
                &[
                    (fd.as_raw_fd(), libc::POLLPRI),
                    (shared.wake.as_raw_fd(), libc::POLLIN),
                ],
                None,
            )
        };
        if revents[1] != 0 {
            drain(&shared.wake);
        }
        if stopping(stop) {
            return Ok(());
        }
        if revents[0] != 0 {
            pending = true;
            shared.apply(Vec::new(), |s| s.events += 1);
        }
    }
}

/// Reads the whole of a /proc file from its start (which also clears its poll event).
fn read_all(fd: &OwnedFd) -> std::io::Result<String> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = 0i64;
    loop {
        // SAFETY: pread(2) into our buffer of its length.
        let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
        offset += n as i64;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}
