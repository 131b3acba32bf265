//! What this mount answered reaches the server within a bound, also for files kept open for
//! long: bytes written and not committed, and the changes kept of files held, that waited
//! [`WRITE_BEHIND_MS`] are committed by a task of the mount, as a close would commit them
//! (docs/design/mount.md, "Durability"). The makes and removals answered in directories held
//! go at once already (`calm_client::outbox`).

use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::shared::Shared;

/// Longest an answered change stays only in this mount before its commit starts, in ms.
pub const WRITE_BEHIND_MS: u64 = 5000;
/// How often the mount looks for changes that waited that long.
const LOOK_EVERY: Duration = Duration::from_millis(500);

impl Shared {
    /// Commits, for as long as the mount lives, what waited [`WRITE_BEHIND_MS`].
    pub(crate) async fn keep_writing_behind(shared: Weak<Shared>) {
        let mut every = tokio::time::interval(LOOK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let waited = Duration::from_millis(WRITE_BEHIND_MS);
            if let Some(cutoff) = Instant::now().checked_sub(waited) {
                strong.write_behind(cutoff).await;
            }
        }
    }

    /// Commits the writes pending since `cutoff`, and sends the changes kept since then of the
    /// files held (after their writes, as an fsync does).
    async fn write_behind(&self, cutoff: Instant) {
        let mut due = self.contents.dirty_before(cutoff);
        due.extend(self.holding.kept_before(cutoff));
        due.sort_unstable();
        due.dedup();
        for handle in due {
            // Writes made under a lock this mount lost are never committed: their writers
            // are told (`Shared::follow_lost`), and the file waits for them.
            self.locks.confirm(handle).await;
            if self.any_lock_lost(handle) {
                continue;
            }
            let writer = self.holding.maker_client(handle);
            if let Some(client) = writer.or_else(|| self.writer_of(handle))
                && self.contents.dirty_size(handle).is_some()
                && let Err(e) = self.push(&client, handle, None).await
            {
                // Kept, to be sent again; a refusal is owed to the file's writers.
                tracing::warn!(handle, ?e, "committing writes that waited");
            }
            if let Err(e) = self.send_kept(handle).await {
                tracing::warn!(handle, ?e, "sending the changes kept of a file held");
            }
        }
    }
}
