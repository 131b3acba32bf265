//! `calm bench activation` (seed 000, LVM event activation): N devices arrive in random order,
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
    let mut results = Vec::new();
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
