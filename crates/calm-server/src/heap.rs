//! The server's heap as its allocator sees it, for `calm status`: what is allocated now, and
//! what the allocator holds free without returning it to the system. Together they tell a
//! growing heap (a leak: in use grows) from a fragmented one (free grows), which the process's
//! resident memory alone cannot.

/// The allocator's figures, in bytes (zeros where the allocator does not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapFigures {
    /// Bytes allocated and not freed, in the allocator's arenas and in blocks of their own.
    pub in_use: u64,
    /// Bytes free in the arenas, kept by the allocator.
    pub free: u64,
}

/// The figures now. With glibc: `mallinfo2`, which walks each arena's free lists under its
/// lock (microseconds; asked once per status request).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn figures() -> HeapFigures {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's state.
    let info = unsafe { libc::mallinfo2() };
    HeapFigures {
        in_use: (info.uordblks + info.hblkhd) as u64,
        free: info.fordblks as u64,
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn figures() -> HeapFigures {
    HeapFigures::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_large_allocation_counts_in_use_until_freed() {
        // The figures are the whole process's: the other tests of this binary allocate and free
        // meanwhile, a few MiB at most.
        const SLACK: u64 = 4 << 20;
        const BLOCK: u64 = 64 << 20;
        let before = figures().in_use;
        let block = vec![1u8; BLOCK as usize];
        let during = figures().in_use;
        assert!(
            during + SLACK >= before + BLOCK,
            "{before} then {during} with 64 MiB more allocated"
        );
        drop(std::hint::black_box(block));
        let after = figures().in_use;
        assert!(
            after + BLOCK <= during + SLACK,
            "{during} then {after} with 64 MiB freed"
        );
    }
}
