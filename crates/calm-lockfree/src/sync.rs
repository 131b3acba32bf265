//! The atomics and locks of this crate: the standard library's, or loom's in a build with the
//! `loom` feature.

#[cfg(feature = "loom")]
pub(crate) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering, fence},
};
#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering, fence},
};

/// Waits a moment for another thread's few stores (a slot being claimed or freed).
pub(crate) fn spin() {
    #[cfg(feature = "loom")]
    loom::thread::yield_now();
    #[cfg(not(feature = "loom"))]
    std::hint::spin_loop();
}
