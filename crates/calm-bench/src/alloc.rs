//! A counting global allocator, so that memory per lock is measured rather than estimated.
//! The binary installs it (`#[global_allocator]`); the figure is the change of live heap bytes
//! across building a structure, divided by its element count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Live heap bytes of the process (allocated less freed), when [`Counting`] is installed.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting live bytes.
#[derive(Debug)]
pub struct Counting;

// SAFETY: every call is forwarded unchanged to `System`; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes now (0 forever when [`Counting`] is not the global allocator).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
