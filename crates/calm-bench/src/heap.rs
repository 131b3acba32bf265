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

    #[test]
    fn a_large_allocation_is_counted_and_its_release_too() {
        let before = heap_bytes_in_use();
        let block = vec![7u8; 8 << 20];
        let during = heap_bytes_in_use();
        assert!(during >= before + (8 << 20), "{before} → {during}");
        drop(std::hint::black_box(block));
        assert!(heap_bytes_in_use() < during);
    }
}
