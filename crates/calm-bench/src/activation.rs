//! `calm-bench activation` (seed 000, LVM event activation): N devices arrive in random order,
//! in pools of 4; each arrival reads that device's label (from memory: simulated devices) and
//! activation is registration only. calm's assembly (O(1) per event) against the shape of LVM
//! before its fix, in the same run: every event rescans every known device and recounts every
//! pool (O(n) per event, O(n²) in all), stopped at a time cap with the count reached.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use calm_node::label::{Label, Uuid};
use calm_node::pools::{Action, Assembly};
use serde::Serialize;

/// Members per pool.
pub const POOL_SIZE: u32 = 4;

#[derive(Debug, Clone)]
pub struct ActivationOptions {
    pub devices: Vec<u64>,
    /// Longest one baseline run may take, in seconds.
    pub cap_seconds: f64,
    /// Loop devices in the real run (0: skip it).
    pub loop_devices: u64,
    /// Where the real run's images and mount points are made.
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct ActivationResult {
    pub devices: u64,
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// From the first event to every pool active (or to the cap).
    pub seconds: f64,
    /// CPU of the bookkeeping per event, in microseconds.
    pub cpu_us_per_event: f64,
    pub pools_active: u64,
    /// Events handled (fewer than `devices` when the run hit the cap).
    pub events: u64,
    pub stopped: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ActivationReport {
    pub bench: &'static str,
    pub pool_size: u32,
    pub results: Vec<ActivationResult>,
}

fn uuid(n: u64) -> Uuid {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&n.to_le_bytes());
    u[8..].copy_from_slice(&(n ^ 0x5eed_5eed_5eed_5eed).to_le_bytes());
    u
}

/// The simulated devices' labels, and an arrival order (a fixed-seed shuffle).
fn devices(n: u64) -> (Vec<Label>, Vec<u64>) {
    let labels = (0..n)
        .map(|d| Label {
            target: uuid(1 << 40 | d),
            pool: uuid(d / u64::from(POOL_SIZE)),
            pool_name: format!("pool{}", d / u64::from(POOL_SIZE)),
            index: (d % u64::from(POOL_SIZE)) as u32,
            count: POOL_SIZE,
            generation: 1,
        })
        .collect();
    let mut order: Vec<u64> = (0..n).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    (labels, order)
}

fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime(2) fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn calm_run(n: u64) -> ActivationResult {
    let (labels, order) = devices(n);
    let pools = n.div_ceil(u64::from(POOL_SIZE));
    let mut assembly = Assembly::new();
    let mut active = 0u64;
    let cpu0 = thread_cpu();
    let started = Instant::now();
    for &d in &order {
        // The event names one device; only its label is read.
        let label = &labels[d as usize];
        if let Ok(Some(Action::Activate { .. })) = assembly.arrive(d, label, 0) {
            active += 1; // activation = registration
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = thread_cpu() - cpu0;
    debug_assert_eq!(active, pools);
    ActivationResult {
        devices: n,
        implementation: "calm",
        seconds,
        cpu_us_per_event: cpu.as_secs_f64() * 1e6 / n as f64,
        pools_active: active,
        events: n,
        stopped: false,
    }
}

/// The seed's shape: every event rescans every known device and recounts every pool.
fn rescan_run(n: u64, cap: f64) -> ActivationResult {
    let (labels, order) = devices(n);
    let mut known: Vec<u64> = Vec::new();
    let mut activated: HashMap<Uuid, ()> = HashMap::new();
    let cpu0 = thread_cpu();
    let started = Instant::now();
    let mut events = 0;
    let mut stopped = false;
    for &d in &order {
        known.push(d);
        let mut members: HashMap<Uuid, u32> = HashMap::new();
        for k in &known {
            let label = &labels[*k as usize];
            *members.entry(label.pool).or_default() += 1;
        }
        for (pool, count) in members {
            if count == POOL_SIZE {
                activated.entry(pool).or_insert(());
            }
        }
        events += 1;
        if events % 64 == 0 && started.elapsed().as_secs_f64() > cap {
            stopped = true;
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = thread_cpu() - cpu0;
    ActivationResult {
        devices: n,
        implementation: "rescan",
        seconds,
        cpu_us_per_event: cpu.as_secs_f64() * 1e6 / events.max(1) as f64,
        pools_active: activated.len() as u64,
        events,
        stopped,
    }
}

pub fn run(options: &ActivationOptions) -> Result<ActivationReport, String> {
    if options
        .devices
        .iter()
        .any(|n| *n == 0 || n % u64::from(POOL_SIZE) != 0)
    {
        return Err(format!(
            "--devices values must be positive multiples of {POOL_SIZE} (pools of {POOL_SIZE})"
        ));
    }
    if !options.loop_devices.is_multiple_of(u64::from(POOL_SIZE)) {
        return Err(format!("--loop-devices must be a multiple of {POOL_SIZE}"));
    }
    let mut results = Vec::new();
    if options.loop_devices > 0 {
        results.push(loop_run(options.loop_devices, &options.dir)?);
    }
    let mut rescan_capped = false;
    for &n in &options.devices {
        results.push(calm_run(n));
        if !rescan_capped {
            let r = rescan_run(n, options.cap_seconds);
            rescan_capped = r.stopped;
            results.push(r);
        }
    }
    Ok(ActivationReport {
        bench: "activation",
        pool_size: POOL_SIZE,
        results,
    })
}

/// Loop devices attached for the real run; unmounted and detached when dropped, even when the
/// run fails.
struct Loops {
    devices: Vec<String>,
    root: std::path::PathBuf,
}

impl Drop for Loops {
    fn drop(&mut self) {
        for line in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            if let Some(point) = line.split(' ').nth(4)
                && point.starts_with(self.root.to_str().unwrap_or("\0"))
                && let Ok(c) = std::ffi::CString::new(point)
            {
                // SAFETY: umount2(2) with a valid C string.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        for dev in &self.devices {
            let _ = std::process::Command::new("losetup")
                .args(["-d", dev])
                .status();
        }
    }
}

fn mounted_under(root: &std::path::Path) -> usize {
    let root = root.to_str().unwrap_or("\0");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|p| p.starts_with(root)))
        .count()
}

/// The real thing: `n` loop devices with ext4 and labels, attached while `calm node`'s agent
/// runs in this process (in a private mount namespace): real uevents, real label reads, real
/// mounts. Time from the first attach to the last pool mounted.
fn loop_run(n: u64, dir: &std::path::Path) -> Result<ActivationResult, String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let private = crate::enter_private_namespace();
    if !private {
        return Err("the loop-device run needs a private mount namespace (run as root)".into());
    }
    let work = tempfile::Builder::new()
        .prefix("calm-bench-activation-")
        .tempdir_in(dir)
        .map_err(|e| e.to_string())?;
    let root = work.path().join("root");
    let (labels, order) = devices(n);
    let run_tag = std::process::id();
    let mut images = Vec::new();
    for (d, label) in labels.iter().enumerate() {
        let img = work.path().join(format!("img{d}"));
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(8 << 20))
            .map_err(|e| e.to_string())?;
        let ok = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&img)
            .status()
            .map_err(|e| format!("mkfs.ext4: {e}"))?;
        if !ok.success() {
            return Err(format!("mkfs.ext4 {}: {ok}", img.display()));
        }
        let mut label = label.clone();
        label.pool_name = format!("bench{run_tag}-{}", label.pool_name);
        calm_node::label::write(&img, &label).map_err(|e| e.to_string())?;
        images.push(img);
    }
    let pools: Vec<String> = (0..n / u64::from(POOL_SIZE))
        .map(|p| format!("bench{run_tag}-pool{p}"))
        .collect();
    let options = calm_node::agent::NodeOptions {
        root: root.clone(),
        target_dirs: Vec::new(),
        read_parallelism: 16,
        activation_workers: 8,
        degraded_after: None,
        pools,
    };
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let agent = {
        let (options, stop) = (options.clone(), stop.clone());
        std::thread::spawn(move || {
            let rescan = AtomicBool::new(false);
            let cpu0 = thread_cpu();
            let figures = calm_node::agent::run(
                &options,
                &stop,
                &rescan,
                |_| {
                    let _ = ready_tx.send(());
                },
                &mut |_| {},
            );
            (figures, thread_cpu() - cpu0)
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the agent did not start".to_string())?;
    let mut loops = Loops {
        devices: Vec::new(),
        root: root.clone(),
    };
    let started = Instant::now();
    for &d in &order {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&images[d as usize])
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr)));
        }
        loops
            .devices
            .push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while mounted_under(&root) < n as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mounted = mounted_under(&root);
    stop.store(true, Ordering::Release);
    let (figures, cpu) = agent.join().map_err(|_| "the agent panicked".to_string())?;
    let figures = figures.map_err(|e| e.to_string())?;
    drop(loops);
    if mounted < n as usize {
        return Err(format!("{mounted} of {n} members mounted after 120 s"));
    }
    Ok(ActivationResult {
        devices: n,
        implementation: "calm-loop",
        seconds,
        cpu_us_per_event: cpu.as_secs_f64() * 1e6 / figures.events.max(1) as f64,
        pools_active: figures.pools_active as u64,
        events: figures.events,
        stopped: false,
    })
}

/// The report as a table for a terminal.
pub fn table(report: &ActivationReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>8} {:>7} {:>12} {:>14} {:>8} {:>9} {:>8}",
        "devices", "impl", "seconds", "cpu µs/event", "pools", "events", "stopped"
    )];
    for r in &report.results {
        lines.push(format!(
            "{:>8} {:>7} {:>12.6} {:>14.3} {:>8} {:>9} {:>8}",
            r.devices,
            r.implementation,
            r.seconds,
            r.cpu_us_per_event,
            r.pools_active,
            r.events,
            r.stopped
        ));
    }
    lines
}

/// Two panels over the number of disks: the time to every pool active, and the CPU per
/// arrival; calm's assembly beside the rescan per event (`--plot`). Runs stopped at their cap
/// are left out.
pub fn facets(report: &ActivationReport) -> Vec<crate::multiples::Facet> {
    let cells = report
        .results
        .iter()
        .filter(|r| !r.stopped && r.implementation != "calm-loop")
        .flat_map(|r| {
            let series = match r.implementation {
                "calm" => "calm".to_string(),
                other => format!("{other} of every disk per event"),
            };
            [
                crate::multiples::Cell::at(
                    "first arrival to every pool active",
                    ("disks", r.devices as f64),
                    ("seconds", r.seconds),
                    series.clone(),
                )
                .log(),
                crate::multiples::Cell::at(
                    "bookkeeping CPU per arrival",
                    ("disks", r.devices as f64),
                    ("µs", r.cpu_us_per_event),
                    series,
                )
                .log(),
            ]
        });
    crate::multiples::facets_of(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_activate_every_pool_of_a_small_boot() {
        let calm = calm_run(400);
        let rescan = rescan_run(400, 60.0);
        assert_eq!(calm.pools_active, 100);
        assert_eq!(rescan.pools_active, 100);
        assert!(!rescan.stopped);
    }
}
