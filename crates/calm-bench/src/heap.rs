//! The heap bytes the process has in use, as the C library's allocator accounts them
//! (`mallinfo2`: bytes handed out from its arenas and its own mappings), so that memory per
//! lock is measured rather than estimated — without instrumenting the allocator that `calm
//! serve` and `calm mount` run on. The figure includes what the allocator spends per block
//! (its chunk headers and rounding): what a program using these structures pays.

/// Bytes the allocator has handed out and not had back, over all its arenas.
pub fn heap_bytes_in_use() -> u64 {
    // SAFETY: mallinfo2 takes no argument and only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figure is the whole process's, and the other tests of this binary allocate and
    /// free beside it: a try that another thread's frees blurred is made again (a count that
    /// never sees the block fails every try).
    #[test]
    fn a_large_allocation_is_counted_and_its_release_too() {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = heap_bytes_in_use();
            // Opaque to the optimizer: it could otherwise make the block after the count.
            let block = std::hint::black_box(vec![7u8; 8 << 20]);
            let during = heap_bytes_in_use();
            drop(std::hint::black_box(block));
            let after = heap_bytes_in_use();
            if during >= before + (8 << 20) && after < during {
                return;
            }
            seen.push((before, during, after));
        }
        panic!("the block was not counted, or its release not: {seen:?}");
    }
}
