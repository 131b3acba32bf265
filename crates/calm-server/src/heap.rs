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

/// How often a long-running process gives the allocator's free pages back to the system.
pub const RELEASE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Gives the pages the allocator holds free back to the system, in every arena and not only
/// at their tops. Without it, glibc keeps what a burst of work freed in the middle of an
/// arena for good: a mount's resident memory grew 9.4 → 12.9 MiB in 20 minutes of a soak while
/// its heap in use stayed flat (docs/benchmarks/2026-11-28, "The mounts' memory"). Takes each
/// arena's lock in turn for the walk of its free blocks (about a millisecond for a mount's).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free() {
    // SAFETY: malloc_trim(3) takes the allocator's own locks; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free() {}

/// Starts a thread that calls [`release_free`] every [`RELEASE_INTERVAL`] for as long as the
/// process lives (a server, a mount).
pub fn keep_releasing() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("calm-heap".into())
        .spawn(|| {
            loop {
                std::thread::sleep(RELEASE_INTERVAL);
                release_free();
            }
        })
        .map(|_| ())
}

/// Keeps glibc's malloc from holding memory a long-running server or mount no longer uses
/// (docs/benchmarks/2026-11-27, "The server's heap"), unless `MALLOC_ARENA_MAX` or
/// `MALLOC_MMAP_THRESHOLD_` in the environment say otherwise:
/// - two arenas: by default threads that contend for malloc get arenas of their own (up to
///   eight per core), and what is freed in one stays with it (a server's heap 29 → 57 MiB in
///   15 minutes, in steps; with two, 16–23 MiB at the same rate of operations);
/// - allocations of 256 KiB and more always on fresh pages, given back when freed: by default
///   the threshold rises to the size of each large block freed (4 MiB blocks of file contents),
///   and from then on such blocks come from the heap and fragment it (with two arenas, the
///   server's heap still grew 7.5 → 38 MiB in 30 minutes).
///
/// Small allocations are served from each thread's own cache without a lock either way.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_malloc() {
    const ARENAS_MAX: libc::c_int = 2;
    const MMAP_THRESHOLD_BYTES: libc::c_int = 256 * 1024;
    // SAFETY: mallopt(3) changes a malloc parameter; called first thing in a program's main,
    // before any other thread exists.
    unsafe {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS_MAX);
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_malloc() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn resident_anonymous_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let line = status
            .lines()
            .find(|l| l.starts_with("RssAnon:"))
            .expect("RssAnon");
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .expect("a number of kB");
        kib << 10
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn free_pages_in_the_middle_of_the_heap_go_back_to_the_system() {
        // Small blocks (below the size that gets pages of its own), all freed but the last:
        // the free space is below a block in use, where freeing alone never gives it back.
        const BLOCK: usize = 64 << 10;
        const BLOCKS: usize = 1024;
        // Other tests of this binary allocate and free meanwhile, a few MiB at most.
        const SLACK: u64 = 16 << 20;
        let mut blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![i as u8 | 1; BLOCK]).collect();
        let last = blocks.pop();
        drop(blocks);
        let before = resident_anonymous_bytes();
        release_free();
        let after = resident_anonymous_bytes();
        drop(std::hint::black_box(last));
        let freed = (BLOCK * (BLOCKS - 1)) as u64;
        assert!(
            after + freed <= before + SLACK,
            "resident {before} before and {after} after giving back {freed} bytes freed"
        );
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_large_allocation_counts_in_use_until_freed() {
        // The figures are the whole process's: the other tests of this binary allocate and free
        // meanwhile (11 MiB once, on a loaded machine), so the block is large and the slack a
        // quarter of it: three quarters of the block must be seen counted, then freed.
        const BLOCK: u64 = 256 << 20;
        const SLACK: u64 = BLOCK / 4;
        let before = figures().in_use;
        let block = vec![1u8; BLOCK as usize];
        let during = figures().in_use;
        assert!(
            during + SLACK >= before + BLOCK,
            "{before} then {during} with 256 MiB more allocated"
        );
        drop(std::hint::black_box(block));
        let after = figures().in_use;
        assert!(
            after + BLOCK <= during + SLACK,
            "{during} then {after} with 256 MiB freed"
        );
    }
}
