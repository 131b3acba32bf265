//! `calm-bench`: the drivers behind `calm-bench …`. Each benchmark measures calm and its
//! baseline in the same run, on the same machine and data, and reports both with their ratio;
//! none of them asserts a timing.
//!
//! - [`startup`]: seed 004 (PVFS2). Restart-to-ready of a populated store, cold cache, after a
//!   clean stop and after kill -9, against the seed's full scan that rebuilds the used-handle
//!   ledger.
//! - [`mdtest`]: create, stat and unlink rates in-process and over gRPC, against the same
//!   operations on the kernel's tmpfs.
//! - [`changelog`]: seed 003 (Lustre changelog): metadata rates with the changelog off, on
//!   with an idle reader, and on with a reader reading and clearing; a reader draining a
//!   backlog against the peak create rate.
//! - [`locks`]: seed 001 (Lustre flock): N byte-range locks on one resource against a naive
//!   list and the kernel's own fcntl locks.
//! - [`activation`]: seed 000 (LVM event activation): simulated device arrivals in pools of 4,
//!   calm's O(1) assembly against a rescan of every known device per event.
//! - [`storm`]: seed 002 (systemd mount storms): mount-table watchers through a storm of bind
//!   mounts, and namespace watchers through a storm of creates.
//! - [`mount`]: system calls through a real calm mount (create, stat, unlink, N fcntl locks on
//!   one file) against the same calls on the kernel's tmpfs.
//! - [`soak`]: appends, fsync'd writes, sqlite transactions, creates and unlinks from several
//!   mounts for N minutes, each minute against the first; [`appends`]: what atomic appends
//!   cost one mount, against appends through the page cache.
//! - [`servers`]: 1, 2 and 3 servers of one namespace on etcd; [`churn`]: creates and unlinks
//!   on them for N minutes, the rate and etcd's database size per minute.
//! - [`mount_cost`], [`server_cost`]: what metrics cost through a mount and to a server's
//!   clients, the arms in turn or at the same time ([`side_by_side`]: rates and each arm's
//!   processor time in the same windows).

pub mod activation;
pub mod appends;
pub mod changelog;
pub mod churn;
pub mod cli;
pub mod clusters;
pub mod data;
pub mod heap;
pub mod locks;
pub mod mdtest;
pub mod mdtest_report;
pub mod mistakes;
pub mod mount;
pub mod mount_cost;
pub mod multiples;
pub mod procs;
pub mod programs;
pub mod protect;
pub mod quota;
pub mod server_cost;
pub mod servers;
pub mod side_by_side;
pub mod soak;
pub mod startup;
pub mod storm;
pub mod syscalls;
pub mod transport;

use std::time::Duration;

/// The runtime of a benchmark's own clients: two worker threads (the machine's cores), so
/// that every benchmark measures with the same one.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))
}

/// Moves this process into a private mount namespace (mounts made from now on vanish with
/// it, however it ends). Works only while the process is single-threaded; false otherwise or
/// without the privilege.
pub fn enter_private_namespace() -> bool {
    // SAFETY: unshare(2) and mount(2) with constant arguments; no memory is shared.
    unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) == 0
    }
}

/// A progress bar for long work, drawn on stderr (hidden when stderr is not a terminal).
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} ({{per_sec}}, eta {{eta}})"
        ))
        .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Empties the page cache so that the next read comes from the disk. Needs root; returns
/// whether it worked (a benchmark reports a warm cache when it did not).
pub fn drop_caches() -> bool {
    std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success())
        && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}
