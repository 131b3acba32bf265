//! The clock leases are counted on: the time the server ran, not the time that passed.
//!
//! A lease runs out when its client did not renew it in time. A client cannot renew while the
//! server does not run (stopped with SIGSTOP, frozen with its cgroup, its machine suspended, or
//! starved of the processor): counted on the wall's time, every session would run out the
//! moment the server runs again, every lock be released while its holder still believes it
//! holds it, and the waiters granted at once. So the lease task ticks every
//! [`TICK_MS`]; a gap between two ticks (or between the last tick and any reading) of more
//! than [`STALL_MS_MIN`] is time the server did not run, and is left out of the clock: leases
//! (and a takeover's grace) pause with the server. Counting too little time only keeps a lock
//! longer, never hands it to two.

/// How often the lease task reads the clock when nothing else is due.
pub const TICK_MS: u64 = 100;
/// A gap between two readings past which the server is taken not to have run.
pub const STALL_MS_MIN: u64 = 1_000;

const _: () = assert!(STALL_MS_MIN >= 5 * TICK_MS);

/// Time since the start, less the stalls. Pure: it is given the raw time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunningClock {
    /// The raw time of the last reading.
    last_raw_ms: u64,
    /// Milliseconds of stalls left out so far.
    stalled_ms: u64,
}

impl RunningClock {
    /// The running time at raw time `raw_ms` (milliseconds since the start, never going back).
    /// A gap since the last reading past [`STALL_MS_MIN`] counts as one tick.
    pub fn at(&mut self, raw_ms: u64) -> u64 {
        let gap = raw_ms.saturating_sub(self.last_raw_ms);
        if gap > STALL_MS_MIN {
            self.stalled_ms += gap - TICK_MS;
        }
        self.last_raw_ms = self.last_raw_ms.max(raw_ms);
        self.last_raw_ms - self.stalled_ms
    }

    /// Milliseconds left out as stalls so far.
    pub fn stalled_ms(&self) -> u64 {
        self.stalled_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_left_out_and_regular_ticks_are_not() {
        let mut clock = RunningClock::default();
        let mut raw = 0;
        for _ in 0..50 {
            raw += TICK_MS;
            assert_eq!(clock.at(raw), raw);
        }
        // Stopped for ten minutes.
        raw += 600_000;
        assert_eq!(clock.at(raw), 5_000 + TICK_MS);
        assert_eq!(clock.stalled_ms(), 600_000 - TICK_MS);
        raw += TICK_MS;
        assert_eq!(clock.at(raw), 5_000 + 2 * TICK_MS);
        // A reading between ticks, and one from the past (another thread), change nothing.
        assert_eq!(clock.at(raw + 30), 5_000 + 2 * TICK_MS + 30);
        assert_eq!(clock.at(raw), 5_000 + 2 * TICK_MS + 30);
    }

    #[test]
    fn the_running_time_never_goes_back_and_never_outruns_the_raw_time() {
        let mut clock = RunningClock::default();
        let mut last = 0;
        let mut raw: u64 = 0;
        for step in [10, 1_500, 3, 900, 1_001, 20_000, 0, 7, 999, 1_000] {
            raw += step;
            let now = clock.at(raw);
            assert!(
                now >= last && now <= raw,
                "{step}: {now} after {last}, raw {raw}"
            );
            last = now;
        }
    }
}
