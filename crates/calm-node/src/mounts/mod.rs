//! An exact in-memory mount table of this process's mount namespace, kept from the kernel's
//! mount events: [`table`] (pure state), [`kernel`] (fanotify, statmount, listmount,
//! mountinfo), [`watcher`] (the thread, its fallback and its CPU budget, waiting for one's own
//! mount).

pub mod kernel;
pub mod table;
pub mod watcher;

pub use table::{Mount, MountChange, MountTable};
pub use watcher::{Mode, MountWatcher, WatcherStats};
