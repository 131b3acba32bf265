//! What a server among peers counts beside the peers state's own counts: lock requests refused
//! because this server did not decide their file, and locks dropped because their file moved
//! to another server. Atomics: counted under no lock of their own.

use std::sync::atomic::{AtomicU64, Ordering};

use calm_locks::peers::Route;

/// The refusals' reasons, as labels: the file is decided by another server (the client asks
/// it), it is in a takeover's grace (only reclaims pass), or this server's membership is not
/// confirmed (it decides nothing).
pub const REFUSALS: [&str; 3] = ["moved", "grace", "lapsed"];

#[derive(Debug, Default)]
pub struct DeciderCounts {
    refused: [AtomicU64; 3],
    locks_moved: AtomicU64,
}

impl DeciderCounts {
    /// A request was routed `route`; `release`: an unlock or release, which a grace lets pass.
    pub fn routed(&self, route: Route, release: bool) {
        let why = match route {
            Route::Mine => return,
            Route::Grace if release => return,
            Route::Grace => 1,
            Route::Elsewhere(_) => 0,
            Route::Lapsed => 2,
        };
        self.refused[why].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` locks and waiting requests were dropped: their files moved to another server.
    pub fn moved(&self, n: u64) {
        self.locks_moved.fetch_add(n, Ordering::Relaxed);
    }

    /// Refusals by [`REFUSALS`], and locks dropped for a move.
    pub fn read(&self) -> ([u64; 3], u64) {
        (
            self.refused.each_ref().map(|n| n.load(Ordering::Relaxed)),
            self.locks_moved.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_route() {
        let p = DeciderCounts::default();
        p.routed(Route::Mine, false);
        p.routed(Route::Grace, true);
        p.routed(Route::Grace, false);
        p.routed(Route::Elsewhere(7), false);
        p.routed(Route::Elsewhere(7), true);
        p.routed(Route::Lapsed, false);
        p.moved(3);
        assert_eq!(p.read(), ([2, 1, 1], 3));
    }
}
