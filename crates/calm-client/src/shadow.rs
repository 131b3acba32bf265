//! A client's copy of every lock it was granted, per file and owner, with the lock manager's
//! merge-and-split rules (each owner's locks in a `RangeLocks` of its own, so they never
//! conflict): what the router reclaims at a file's new decider after a takeover.

use std::collections::{BTreeMap, HashMap};

use calm_locks::{FlockTable, Owner, RangeLocks, Request, Scope};

/// The locks one owner holds on one file.
#[derive(Debug, Default)]
struct Held {
    ranges: RangeLocks,
    flock: FlockTable,
}

/// Every lock the router was granted: file → owner → locks.
#[derive(Debug, Default)]
pub(crate) struct Shadow {
    files: HashMap<u64, BTreeMap<Owner, Held>>,
}

impl Shadow {
    /// Whether any lock is held on `resource`.
    pub(crate) fn holds(&self, resource: u64) -> bool {
        self.files.contains_key(&resource)
    }

    pub(crate) fn set(&mut self, request: &Request) {
        let held = self
            .files
            .entry(request.resource)
            .or_default()
            .entry(request.owner)
            .or_default();
        // One owner never conflicts with itself: these only merge, split and convert.
        let _ = match request.scope {
            Scope::Range(range) => held.ranges.set(0, range, request.kind).map(|_| ()),
            Scope::WholeFile => {
                held.flock
                    .set(0, request.kind)
                    .map(|_| ())
                    .map_err(|_| calm_locks::Lock {
                        owner: 0,
                        range: calm_locks::Range { start: 0, end: 0 },
                        kind: request.kind,
                    })
            }
        };
    }

    pub(crate) fn unlock(&mut self, request: &Request) {
        if let Some(owners) = self.files.get_mut(&request.resource) {
            if let Some(held) = owners.get_mut(&request.owner) {
                match request.scope {
                    Scope::Range(range) => {
                        held.ranges.unlock(0, range);
                    }
                    Scope::WholeFile => {
                        held.flock.unlock(0);
                    }
                }
                if held.ranges.is_empty() && held.flock.is_empty() {
                    owners.remove(&request.owner);
                }
            }
            if owners.is_empty() {
                self.files.remove(&request.resource);
            }
        }
    }

    pub(crate) fn release(&mut self, owner: Owner, resource: Option<u64>) {
        match resource {
            Some(resource) => {
                if let Some(owners) = self.files.get_mut(&resource) {
                    owners.remove(&owner);
                    if owners.is_empty() {
                        self.files.remove(&resource);
                    }
                }
            }
            None => {
                self.files.retain(|_, owners| {
                    owners.remove(&owner);
                    !owners.is_empty()
                });
            }
        }
    }

    /// The locks held on `resource`, as requests that take them again.
    pub(crate) fn requests(&self, resource: u64) -> Vec<Request> {
        let Some(owners) = self.files.get(&resource) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (owner, held) in owners {
            for lock in held.ranges.locks() {
                out.push(Request {
                    resource,
                    owner: *owner,
                    scope: Scope::Range(lock.range),
                    kind: lock.kind,
                });
            }
            for (_, kind) in held.flock.holders() {
                out.push(Request {
                    resource,
                    owner: *owner,
                    scope: Scope::WholeFile,
                    kind,
                });
            }
        }
        out
    }

    /// The files with a lock.
    pub(crate) fn resources(&self) -> impl Iterator<Item = u64> + '_ {
        self.files.keys().copied()
    }

    /// Locks held, over every file.
    pub(crate) fn len(&self) -> usize {
        self.files
            .values()
            .flat_map(|owners| owners.values())
            .map(|held| held.ranges.len() + held.flock.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_locks::{LockKind, Range};

    fn request(resource: u64, owner: u64, scope: Scope, kind: LockKind) -> Request {
        Request {
            resource,
            owner: Owner::File { file: owner },
            scope,
            kind,
        }
    }

    fn range(start: u64, end: u64) -> Scope {
        Scope::Range(Range { start, end })
    }

    #[test]
    fn the_copy_of_held_locks_merges_splits_and_releases_as_the_server_does() {
        let mut shadow = Shadow::default();
        shadow.set(&request(1, 7, range(0, 9), LockKind::Read));
        shadow.set(&request(1, 7, range(10, 19), LockKind::Read));
        shadow.set(&request(1, 7, range(5, 6), LockKind::Write));
        shadow.set(&request(1, 8, Scope::WholeFile, LockKind::Write));
        shadow.set(&request(2, 7, range(0, 0), LockKind::Write));
        let held = shadow.requests(1);
        assert_eq!(
            held,
            vec![
                request(1, 7, range(0, 4), LockKind::Read),
                request(1, 7, range(5, 6), LockKind::Write),
                request(1, 7, range(7, 19), LockKind::Read),
                request(1, 8, Scope::WholeFile, LockKind::Write),
            ]
        );
        shadow.unlock(&request(1, 7, range(3, 12), LockKind::Read));
        assert_eq!(
            shadow.requests(1)[..2],
            [
                request(1, 7, range(0, 2), LockKind::Read),
                request(1, 7, range(13, 19), LockKind::Read),
            ]
        );
        shadow.release(Owner::File { file: 8 }, Some(1));
        shadow.release(Owner::File { file: 7 }, None);
        assert_eq!(shadow.len(), 0);
        assert!(shadow.files.is_empty());
    }
}
