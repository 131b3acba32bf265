//! The calm binary's tests, one module per part, in one test binary (one link of the workspace
//! instead of one per file): servers, mounts, programs and faults through the real `calm`
//! (`common` starts them), and the repository's rules (`architecture`, `docs`). Each test still
//! runs in a process of its own under nextest; the tiers name them by module
//! (`.config/nextest.toml`).

#[macro_use]
mod common;

mod architecture;
mod changelog;
mod channel;
mod coherence;
mod copies;
mod crash;
mod crash_mounts;
mod data;
mod data_faults;
mod docs;
mod endurance;
mod etcd;
mod faults;
mod fsck;
mod holds;
mod locks;
mod metrics;
mod mount;
mod node;
mod peers;
mod pjdfstest;
mod protect;
mod restart_locks;
mod security;
mod server;
mod trash_clone;
mod watch;
