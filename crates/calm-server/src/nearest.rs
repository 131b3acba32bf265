//! Who is nearest to a limit, for `calm status`: the user identities' lock sessions and the
//! locks of each session, and the quotas' bytes and inodes, each as a share of its limit.

use calm_meta::{Caller, Meta};
use calm_proto::pb;
use calm_store::Store;

use crate::LockTable;
use crate::auth::{SESSIONS_PER_USER_MAX, SessionOwners};

/// Figures `calm status` shows at most.
pub const NEAREST_MAX: usize = 10;

/// Only figures at least this share of their limit are shown (a tenth).
const SHOWN_FROM: f64 = 0.1;

fn near(who: String, what: String, used: u64, limit: u64) -> pb::NearLimit {
    pb::NearLimit {
        who,
        what,
        used,
        limit,
    }
}

fn share(n: &pb::NearLimit) -> f64 {
    n.used as f64 / n.limit.max(1) as f64
}

/// The figures nearest their limits, nearest first, at most [`NEAREST_MAX`].
pub fn nearest<S: Store>(
    sessions: &SessionOwners,
    locks: &LockTable,
    meta: &Meta<S>,
) -> Vec<pb::NearLimit> {
    let mut all = Vec::new();
    for (who, owned) in sessions.by_owner() {
        let open: Vec<u64> = owned
            .into_iter()
            .filter(|s| locks.session_locks(*s).is_some())
            .collect();
        // Sessions are limited for user identities only; a mount's are its own.
        let user = open.iter().any(|s| {
            locks
                .session_locks(*s)
                .is_some_and(|(_, max)| max <= crate::auth::LOCKS_PER_USER_SESSION_MAX)
        });
        if user {
            all.push(near(
                who.clone(),
                "lock sessions".into(),
                open.len() as u64,
                SESSIONS_PER_USER_MAX as u64,
            ));
        }
        for session in open {
            if let Some((held, max)) = locks.session_locks(session) {
                all.push(near(
                    who.clone(),
                    format!("locks of session {session}"),
                    held,
                    max,
                ));
            }
        }
    }
    if let Ok(reports) = meta.quotas(&Caller::default(), false) {
        for r in reports {
            let l = r.limits;
            for (what, used, limits) in [
                ("bytes", r.usage.bytes, [l.bytes, l.soft_bytes]),
                ("inodes", r.usage.inodes, [l.inodes, l.soft_inodes]),
            ] {
                if let Some(limit) = limits.into_iter().filter(|n| *n > 0).min() {
                    all.push(near(
                        r.target.to_string(),
                        what.into(),
                        used.max(0) as u64,
                        limit,
                    ));
                }
            }
        }
    }
    all.retain(|n| share(n) >= SHOWN_FROM);
    all.sort_by(|a, b| share(b).total_cmp(&share(a)));
    all.truncate(NEAREST_MAX);
    all
}
