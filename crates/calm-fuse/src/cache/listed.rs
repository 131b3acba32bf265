//! Names this mount knows: the directories whose every name it knows (`crate::listings`),
//! kept as exactly as the kernel's own cache ([`Coherence`]'s tickets and marks).

use std::sync::atomic::Ordering;
use std::time::Duration;

use calm_types::Handle;
use calm_types::sync::Locked;

use super::{Coherence, Stale, Ticket};
use crate::listings::Outcome;

impl Coherence {
    /// Whether `name` is known not to be in `parent`, for a lookup that began at `ticket`:
    /// the TTL of the absence to answer the kernel with, or None (ask the server). Known for a
    /// directory this mount made, while it follows the changes and no other client changed
    /// the directory's names since (`crate::listings`): a name another client made there is
    /// seen once its record arrives, exactly as for an absence the kernel keeps.
    pub fn known_absent(&self, ticket: Ticket, parent: Handle, name: &[u8]) -> Option<Duration> {
        if !self.follows() || !self.listings.locked().absent(parent, name) {
            return None;
        }
        // After the look: a change of the directory marked before it was forgotten.
        let ttl = self.absence_ttl(ticket, parent);
        if ttl.is_zero() {
            return None;
        }
        self.absences_known.fetch_add(1, Ordering::Relaxed);
        Some(ttl)
    }

    /// This mount made the directory `dir` by a request that began at `ticket`: it is empty,
    /// and its names are known from now on, unless another client changed it since the
    /// request began or the changes are not followed.
    pub fn made_dir_here(&self, ticket: Ticket, dir: Handle) {
        self.listed_here(ticket, dir, std::iter::empty());
    }

    /// The server told this mount every name of directory `dir` (which it holds now), by a
    /// request that began at `ticket`: known from now on, on the same terms as
    /// [`Coherence::made_dir_here`].
    pub fn listed_here<'a>(
        &self,
        ticket: Ticket,
        dir: Handle,
        names: impl Iterator<Item = &'a [u8]>,
    ) {
        let fresh = |cache: &Self| {
            ticket.follows && cache.follows() && !cache.reply_ttl(ticket, dir).is_zero()
        };
        if !fresh(self) {
            return;
        }
        self.listings.locked().listed(dir, names);
        // A change marked while inserting: undo (its forgetting may have run before).
        if !fresh(self) {
            self.listings.locked().forget(dir);
        }
    }

    /// This mount made or linked `name` in `dir` (`Outcome::Known` also for EEXIST).
    pub fn name_added_here(&self, dir: Handle, name: &[u8], outcome: Outcome) {
        self.listings.locked().added(dir, name, outcome);
    }

    /// This mount removed `name` from `dir` (`Outcome::Known` also for ENOENT).
    pub fn name_removed_here(&self, dir: Handle, name: &[u8], outcome: Outcome) {
        self.listings.locked().removed(dir, name, outcome);
    }

    /// This mount renamed `from` to `to` (see [`Listings::renamed`]).
    pub fn renamed_here(
        &self,
        from: (Handle, &[u8]),
        to: (Handle, &[u8]),
        exchange: bool,
        outcome: Outcome,
    ) {
        self.listings.locked().renamed(from, to, exchange, outcome);
    }

    /// Other clients changed what `stale` names (already marked): the names of those
    /// directories are no longer known.
    pub(super) fn others_changed(&self, stale: &[Stale]) {
        let mut listings = self.listings.locked();
        if listings.len().0 == 0 {
            return;
        }
        for s in stale {
            listings.forget(s.handle());
        }
    }
}
