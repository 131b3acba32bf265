//! `calm node`: find targets, assemble pools, activate each pool once.
//!
//! One code path for boot and steady state: bind the uevent socket, read the kernel's uevent
//! sequence number R, enumerate once (block devices under /sys/class/block and the given
//! target directories, reading labels with bounded parallelism), then follow the uevents after
//! R. A sequence gap or a socket overflow re-enumerates and applies the difference. Each
//! arrival reads only that device's label and costs O(1) bookkeeping ([`Assembly`]).
//! Activation (mounting a pool's members under ROOT/pools/NAME/INDEX) runs in a bounded pool of
//! worker threads, so a slow mount never stalls event processing; a mount's completion is its
//! call's result. The pools' state goes to ROOT/pools.json (written when events pause, at most
//! once a second during a storm) for `calm pools`.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::label::{self, Label, Uuid, uuid_text};
use crate::pools::{Action, Assembly, DeviceId, Refused};
use crate::pools_file;
use crate::uevent::{Received, UeventSocket};

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub root: PathBuf,
    pub target_dirs: Vec<PathBuf>,
    /// Labels read at once during an enumeration.
    pub read_parallelism: usize,
    /// Pools being activated at once.
    pub activation_workers: usize,
    /// Activate a pool degraded when members are still missing this long after its first.
    pub degraded_after: Option<Duration>,
    /// Only these pools (by name); empty: every pool found.
    pub pools: Vec<String>,
}

/// What the agent knows of one device.
#[derive(Debug, Clone)]
struct Known {
    path: PathBuf,
    dir: bool,
}

#[derive(Debug)]
struct Job {
    pool: Uuid,
    name: String,
    members: Vec<(u32, PathBuf, bool)>,
}

/// Member index → its mount point, or why mounting it failed.
type MountResults = Vec<(u32, Result<PathBuf, String>)>;

#[derive(Debug)]
struct Done {
    pool: Uuid,
    results: MountResults,
}

/// One member target as the agent knows it (what it registers with a metadata server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSnapshot {
    /// The member's label (its pool's identity, generation and the member's index).
    pub label: Label,
    pub state: &'static str,
    pub mount_point: Option<PathBuf>,
    pub activated_ms: Option<u64>,
}

/// How often the agent reports its targets even when nothing changed (the registry is soft
/// state: a restarted server is refilled by the next report).
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Figures of a run (printed when it is ready, and at the end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    pub devices_scanned: usize,
    pub targets: usize,
    pub events: u64,
    pub enumerations: u64,
    pub pools_active: usize,
}

fn device_id_of_dir(path: &Path) -> DeviceId {
    // FNV-1a of the path, in the upper half of the id space (dev_t numbers are below it).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h | (1 << 63)
}

fn dev_t(major: u32, minor: u32) -> DeviceId {
    (u64::from(major) << 32) | u64::from(minor)
}

/// Every candidate now: block devices and the target directories.
fn candidates(options: &NodeOptions) -> Vec<(DeviceId, Known)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/class/block") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Ok(dev) = std::fs::read_to_string(entry.path().join("dev")) else {
                continue;
            };
            let Some((major, minor)) = dev.trim().split_once(':') else {
                continue;
            };
            let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
                continue;
            };
            out.push((
                dev_t(major, minor),
                Known {
                    path: Path::new("/dev").join(name),
                    dir: false,
                },
            ));
        }
    }
    for dir in &options.target_dirs {
        out.push((
            device_id_of_dir(dir),
            Known {
                path: dir.clone(),
                dir: true,
            },
        ));
    }
    out
}

/// Reads every candidate's label, `parallelism` at a time.
fn read_labels(found: &[(DeviceId, Known)], parallelism: usize) -> Vec<Option<Label>> {
    let next = AtomicUsize::new(0);
    let mut labels: Vec<Option<Label>> = vec![None; found.len()];
    let slots: Vec<std::sync::Mutex<Option<Label>>> =
        found.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..parallelism.max(1).min(found.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= found.len() {
                        break;
                    }
                    if let Ok(l) = label::read(&found[i].1.path) {
                        *slots[i].locked() = Some(l);
                    }
                }
            });
        }
    });
    for (slot, out) in slots.into_iter().zip(labels.iter_mut()) {
        *out = slot.into_inner().expect("slot");
    }
    labels
}

fn mount_member(path: &Path, dir: bool, target: &Path) -> Result<(), String> {
    std::fs::create_dir_all(target).map_err(|e| format!("{}: {e}", target.display()))?;
    if dir {
        let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
        // SAFETY: mount(2) with valid C strings.
        let rc = unsafe {
            libc::mount(
                c(path).as_ptr(),
                c(target).as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "bind {}: {}",
                path.display(),
                io::Error::last_os_error()
            ));
        }
        return Ok(());
    }
    let out = std::process::Command::new("mount")
        .arg(path)
        .arg(target)
        .output()
        .map_err(|e| format!("running mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn worker(
    root: PathBuf,
    jobs: std::sync::Arc<std::sync::Mutex<mpsc::Receiver<Job>>>,
    done: mpsc::Sender<Done>,
) {
    loop {
        let job = match jobs.locked().recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let results = job
            .members
            .iter()
            .map(|(index, path, dir)| {
                let target = root.join("pools").join(&job.name).join(index.to_string());
                (*index, mount_member(path, *dir, &target).map(|()| target))
            })
            .collect();
        if done
            .send(Done {
                pool: job.pool,
                results,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The node agent's state between events.
struct Agent<'a> {
    options: &'a NodeOptions,
    assembly: Assembly,
    known: HashMap<DeviceId, Known>,
    /// Pool → mount results of its activation.
    mounted: HashMap<Uuid, MountResults>,
    /// Pools still assembling → when their first member arrived.
    first_seen: HashMap<Uuid, Instant>,
    jobs: mpsc::Sender<Job>,
    figures: Figures,
    dirty: bool,
    report: &'a mut dyn FnMut(Vec<TargetSnapshot>),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Agent<'_> {
    fn act(&mut self, action: Action) {
        self.dirty = true;
        if let Action::Activate { pool, .. } = action {
            self.first_seen.remove(&pool);
            self.figures.pools_active += 1;
            let Some(p) = self.assembly.pool(&pool) else {
                return;
            };
            let members = p
                .members
                .iter()
                .enumerate()
                .filter_map(|(index, device)| {
                    let known = self.known.get(device.as_ref()?)?;
                    Some((index as u32, known.path.clone(), known.dir))
                })
                .collect();
            let _ = self.jobs.send(Job {
                pool,
                name: p.name.clone(),
                members,
            });
        }
    }

    fn arrive(&mut self, id: DeviceId, known: Known, label: &Label) {
        if !self.options.pools.is_empty() && !self.options.pools.contains(&label.pool_name) {
            return; // not a pool of this node
        }
        self.known.insert(id, known);
        match self.assembly.arrive(id, label, now_ms()) {
            Ok(Some(action)) => self.act(action),
            Ok(None) => {
                self.dirty = true;
                self.first_seen
                    .entry(label.pool)
                    .or_insert_with(Instant::now);
            }
            Err(Refused::Duplicate) => {}
            Err(refused) => {
                tracing::warn!(device = %self.known[&id].path.display(), ?refused, "target refused")
            }
        }
        self.figures.targets = self.assembly.members();
    }

    fn depart(&mut self, id: DeviceId) {
        self.known.remove(&id);
        if let Some(action) = self.assembly.depart(id) {
            self.act(action);
        }
        self.dirty = true;
        self.figures.targets = self.assembly.members();
    }

    /// One enumeration: every candidate's label, applied as arrivals, and departures of the
    /// devices no longer there.
    fn enumerate(&mut self) {
        let found = candidates(self.options);
        let labels = read_labels(&found, self.options.read_parallelism);
        self.figures.devices_scanned = found.len();
        self.figures.enumerations += 1;
        let mut seen = std::collections::HashSet::new();
        for ((id, known), label) in found.into_iter().zip(labels) {
            if let Some(label) = label {
                seen.insert(id);
                self.arrive(id, known, &label);
            }
        }
        let gone: Vec<DeviceId> = self
            .known
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.depart(id);
        }
    }

    fn uevent(&mut self, event: &crate::uevent::Uevent) {
        if event.subsystem != "block" {
            return;
        }
        let (Some(major), Some(minor), Some(name)) = (event.major, event.minor, &event.devname)
        else {
            return;
        };
        let id = dev_t(major, minor);
        match event.action.as_str() {
            "add" | "change" => {
                let path = Path::new("/dev").join(name);
                match label::read(&path) {
                    Ok(label) => self.arrive(id, Known { path, dir: false }, &label),
                    Err(_) if self.known.contains_key(&id) => self.depart(id),
                    Err(_) => {}
                }
            }
            "remove" if self.known.contains_key(&id) => self.depart(id),
            _ => {}
        }
    }

    fn degraded_timeouts(&mut self) {
        let Some(after) = self.options.degraded_after else {
            return;
        };
        let due: Vec<Uuid> = self
            .first_seen
            .iter()
            .filter(|(_, t)| t.elapsed() >= after)
            .map(|(p, _)| *p)
            .collect();
        for pool in due {
            self.first_seen.remove(&pool);
            if let Some(action) = self.assembly.activate_degraded(&pool, now_ms()) {
                self.act(action);
            }
        }
    }

    fn write_state(&mut self) -> io::Result<()> {
        let mut pools: Vec<_> = self.assembly.pools().collect();
        pools.sort_by(|a, b| a.name.cmp(&b.name).then(a.generation.cmp(&b.generation)));
        let entries = pools
            .iter()
            .map(|p| {
                let indices = |present: bool| -> Vec<u32> {
                    (0..p.members.len() as u32)
                        .filter(|i| p.members[*i as usize].is_some() == present)
                        .collect()
                };
                let mounts: Vec<(u32, Result<String, String>)> = self
                    .mounted
                    .get(&p.uuid)
                    .into_iter()
                    .flatten()
                    .map(|(index, r)| {
                        let r = r.as_ref().map(|path| path.display().to_string());
                        (*index, r.map_err(String::clone))
                    })
                    .collect();
                pools_file::pool(
                    &uuid_text(&p.uuid),
                    &p.name,
                    (p.generation, p.count),
                    (&indices(true), &indices(false)),
                    p.state.name(),
                    p.activated_at,
                    &mounts,
                )
            })
            .collect();
        let out = pools_file::text(entries);
        let path = self.options.root.join("pools.json");
        let tmp = self.options.root.join("pools.json.tmp");
        std::fs::write(&tmp, out)?;
        std::fs::rename(tmp, path)?;
        self.dirty = false;
        let snapshot = self.snapshot();
        (self.report)(snapshot);
        Ok(())
    }

    fn snapshot(&self) -> Vec<TargetSnapshot> {
        let mut out = Vec::new();
        for pool in self.assembly.pools() {
            let state = pool.state.name();
            for device in pool.members.iter().flatten() {
                let Some(label) = self.assembly.label_of(*device) else {
                    continue;
                };
                let mount_point = self.mounted.get(&pool.uuid).and_then(|results| {
                    results
                        .iter()
                        .find(|(i, _)| *i == label.index)
                        .and_then(|(_, r)| r.as_ref().ok().cloned())
                });
                out.push(TargetSnapshot {
                    label: label.clone(),
                    state,
                    mount_point,
                    activated_ms: pool.activated_at,
                });
            }
        }
        out
    }
}

/// Runs the agent until `stop` is set; `rescan` set (e.g. by SIGHUP) asks for an enumeration
/// (directory targets send no uevents). `ready` is called once the first enumeration is
/// applied.
pub fn run(
    options: &NodeOptions,
    stop: &AtomicBool,
    rescan: &AtomicBool,
    ready: impl FnOnce(Figures),
    report: &mut dyn FnMut(Vec<TargetSnapshot>),
) -> io::Result<Figures> {
    std::fs::create_dir_all(options.root.join("pools"))?;
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let jobs_rx = std::sync::Arc::new(std::sync::Mutex::new(jobs_rx));
    let workers: Vec<_> = (0..options.activation_workers.max(1))
        .map(|_| {
            let (root, jobs, done) = (options.root.clone(), jobs_rx.clone(), done_tx.clone());
            std::thread::spawn(move || worker(root, jobs, done))
        })
        .collect();
    drop(done_tx);
    let mut agent = Agent {
        options,
        assembly: Assembly::new(),
        known: HashMap::new(),
        mounted: HashMap::new(),
        first_seen: HashMap::new(),
        jobs: jobs_tx,
        figures: Figures::default(),
        dirty: true,
        report,
    };
    // Bind first, then read R, then enumerate: every change after R arrives as an event, and
    // every change before it is in the enumeration.
    let mut socket = UeventSocket::open()?;
    let mut last = crate::uevent::seqnum()?;
    agent.enumerate();
    agent.write_state()?;
    ready(agent.figures);
    let mut written = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let received = socket.recv(200)?;
        let idle = matches!(received, Received::Idle);
        match received {
            Received::Event(event) => {
                agent.figures.events += 1;
                if event.seqnum <= last {
                    continue; // already in the enumeration
                }
                if event.seqnum != last + 1 {
                    tracing::warn!(
                        expected = last + 1,
                        got = event.seqnum,
                        "uevent gap: enumerating again"
                    );
                    last = crate::uevent::seqnum()?;
                    agent.enumerate();
                    continue;
                }
                last = event.seqnum;
                agent.uevent(&event);
            }
            Received::Lost => {
                tracing::warn!("uevent socket overflow: enumerating again");
                last = crate::uevent::seqnum()?;
                agent.enumerate();
            }
            Received::Idle => {
                agent.degraded_timeouts();
            }
        }
        if rescan.swap(false, Ordering::AcqRel) {
            last = crate::uevent::seqnum()?;
            agent.enumerate();
        }
        while let Ok(done) = done_rx.try_recv() {
            for (index, result) in &done.results {
                if let Err(e) = result {
                    tracing::warn!(pool = %uuid_text(&done.pool), index, %e, "activating a member");
                }
            }
            agent.mounted.insert(done.pool, done.results);
            agent.dirty = true;
        }
        // The state file costs O(pools): written when events pause, at most once a second
        // during a storm.
        if (agent.dirty && (idle || written.elapsed() >= Duration::from_secs(1)))
            || written.elapsed() >= REPORT_EVERY
        {
            agent.write_state()?;
            written = Instant::now();
        }
    }
    agent.write_state()?;
    let figures = agent.figures;
    drop(agent);
    for w in workers {
        let _ = w.join();
    }
    Ok(figures)
}
