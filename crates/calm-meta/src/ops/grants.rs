//! Handles granted in advance: a client asks for a range of handles (`Op::Grant`), and its
//! mount, holding a directory, answers a make in it at once with the next of them and sends
//! the make after (`NewNode::granted`). The range is kept in the store (`W` keys) so that a
//! make sent again after the server restarted is still accepted, and only from that client.
//!
//! Invariants:
//! - a grant's handles come from the allocator like any other: below the persisted mark,
//!   never handed out twice;
//! - a granted handle names at most one node ever: each grant keeps the next handle it may
//!   give, which only grows (its client uses them in order), and the grant goes with its last
//!   handle;
//! - a client has at most [`GRANTS_PER_CLIENT_MAX`] grants at once, of at most
//!   [`GRANT_HANDLES_MAX`] handles each;
//! - a grant not used for [`GRANT_UNUSED_KEPT`] is forgotten (a mount killed, or one that
//!   moved to a newer grant, leaves its grants behind): each grant keeps the time it was last
//!   granted or used, the housekeeping thread finds the old ones ([`expired`]) and deletes
//!   those still old when their deletion is applied ([`forget`]). A mount uses a grant for
//!   [`GRANT_USED_FOR`] at most after it was granted, so a grant in use is never forgotten
//!   while a make it answered is on its way.

use std::time::Duration;

use calm_store::{ReadTxn, WriteTxn};

use crate::ctx::Ctx;
use crate::error::MetaError;
use crate::outcome::{Done, Outcome};
use crate::types::*;

/// The family of grants' keys: client and the grant's first handle (u64 BE each) → the next
/// handle it may give and its end (u64 le each). Before `X`, after `U`.
pub const TAG_GRANT: u8 = b'W';

/// Handles one grant holds at most.
pub const GRANT_HANDLES_MAX: u64 = 65_536;
/// Grants one client holds at once at most.
pub const GRANTS_PER_CLIENT_MAX: usize = 8;
/// How long a grant nobody used is kept.
pub const GRANT_UNUSED_KEPT: Duration = Duration::from_secs(3600);
pub use calm_types::GRANT_USED_FOR;
/// Most grants one sweep pass reads (it resumes after the last on its next pass).
pub const GRANT_SWEEP_KEYS_MAX: usize = 4096;
/// Most grants one [`Op::ForgetGrants`](crate::ops::Op) deletes.
pub const GRANT_FORGETS_PER_OP_MAX: usize = 64;

/// A grant's key.
pub type GrantKey = [u8; 17];

/// The key of `client`'s grant that starts at `first`.
pub fn grant_key(client: u64, first: Handle) -> GrantKey {
    let mut k = [0u8; 17];
    k[0] = TAG_GRANT;
    k[1..9].copy_from_slice(&client.to_be_bytes());
    k[9..].copy_from_slice(&first.to_be_bytes());
    k
}

/// A grant's value: the next handle it may give, the end of its range, and when it was last
/// granted or used (ns since the epoch; `None` in a grant written before grants kept it,
/// taken as written when the sweep began).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRecord {
    pub next: Handle,
    pub end: Handle,
    pub used_ns: Option<i64>,
}

impl GrantRecord {
    pub fn encode(&self) -> [u8; 24] {
        let mut v = [0u8; 24];
        v[..8].copy_from_slice(&self.next.to_le_bytes());
        v[8..16].copy_from_slice(&self.end.to_le_bytes());
        v[16..].copy_from_slice(&self.used_ns.unwrap_or(0).to_le_bytes());
        v
    }

    pub fn decode(value: &[u8]) -> Option<GrantRecord> {
        let used_ns = match value.len() {
            16 => None,
            24 => Some(i64::from_le_bytes(value[16..].try_into().ok()?)),
            _ => return None,
        };
        let next = u64::from_le_bytes(value[..8].try_into().ok()?);
        let end = u64::from_le_bytes(value[8..16].try_into().ok()?);
        (next < end).then_some(GrantRecord { next, end, used_ns })
    }
}

/// Grants `count` handles to `client`: answers the first.
pub(crate) fn grant<T: WriteTxn>(ctx: &mut Ctx<'_, T>, client: u64, count: u64) -> Outcome<Done> {
    if count == 0 || count > GRANT_HANDLES_MAX {
        return Err(MetaError::Invalid(format!(
            "{count} handles asked for; 1 to {GRANT_HANDLES_MAX} at once"
        ))
        .into());
    }
    let held = ctx
        .txn
        .scan(
            &grant_key(client, 0),
            &grant_key(client, u64::MAX),
            usize::MAX,
        )?
        .len();
    if held >= GRANTS_PER_CLIENT_MAX {
        return Err(MetaError::Invalid(format!(
            "a client holds at most {GRANTS_PER_CLIENT_MAX} grants of handles at once"
        ))
        .into());
    }
    let first = ctx.alloc.allocate_range(ctx.txn, count)?;
    let record = GrantRecord {
        next: first,
        end: first + count,
        used_ns: Some(ctx.now),
    };
    ctx.txn.put(&grant_key(client, first), &record.encode())?;
    Ok(Done::Ids(first))
}

/// Checks that `granted` names the next handle of one of its client's grants and no node
/// yet: the key of that grant and what it becomes once the handle is taken (`None`: it goes).
pub(crate) fn check<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    granted: Granted,
) -> Outcome<([u8; 17], Option<GrantRecord>)> {
    let refused = || {
        MetaError::Invalid(format!(
            "handle {} was not granted to this client, or was used",
            granted.handle
        ))
    };
    let from = grant_key(granted.client, 0);
    let upto = grant_key(granted.client, granted.handle.saturating_add(1));
    let (key, value) = ctx.txn.last_in(&from, &upto)?.ok_or_else(refused)?;
    let record = GrantRecord::decode(&value).ok_or_else(refused)?;
    if granted.handle < record.next || granted.handle >= record.end {
        return Err(refused().into());
    }
    if ctx.load(granted.handle).is_ok() {
        return Err(refused().into());
    }
    let key: [u8; 17] = key.as_slice().try_into().map_err(|_| refused())?;
    let after = GrantRecord {
        next: granted.handle + 1,
        end: record.end,
        used_ns: Some(ctx.now),
    };
    Ok((key, (after.next < after.end).then_some(after)))
}

/// Takes the handle [`check`] allowed: its grant moves past it, or goes with its last one.
pub(crate) fn take<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    (key, after): ([u8; 17], Option<GrantRecord>),
) -> Outcome<()> {
    match after {
        Some(record) => ctx.txn.put(&key, &record.encode())?,
        None => {
            ctx.txn.delete(&key)?;
        }
    }
    Ok(())
}

/// The grants at or after `from` (at most [`GRANT_SWEEP_KEYS_MAX`] read) last used before
/// `before_ns` (one written before grants kept the time counts as used at `unknown_ns`).
pub fn expired<R: ReadTxn>(
    view: &R,
    from: &[u8],
    before_ns: i64,
    unknown_ns: i64,
) -> calm_store::Result<crate::requests::SweptPage> {
    let old = |v: &[u8]| unused_since(v, before_ns, unknown_ns);
    crate::requests::old_keys(view, (from, &[TAG_GRANT + 1]), GRANT_SWEEP_KEYS_MAX, old)
}

/// Whether the grant `value` was last used before `before_ns` (or does not decode).
fn unused_since(value: &[u8], before_ns: i64, unknown_ns: i64) -> bool {
    let used_ns = GrantRecord::decode(value).map(|r| r.used_ns.unwrap_or(unknown_ns));
    used_ns.is_none_or(|at| at < before_ns)
}

/// Deletes the grants `keys` that are still last used before `before_ns` ([`expired`] found
/// them so; one used since is kept), as [`expired`] judged them.
pub(crate) fn forget<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    keys: &[[u8; 17]],
    before_ns: i64,
    unknown_ns: i64,
) -> Outcome<Done> {
    if keys.len() > GRANT_FORGETS_PER_OP_MAX || keys.iter().any(|k| k[0] != TAG_GRANT) {
        return Err(MetaError::Invalid(format!(
            "forgetting grants of handles: at most {GRANT_FORGETS_PER_OP_MAX} keys, all grants"
        ))
        .into());
    }
    for k in keys {
        let Some(value) = ctx.txn.get(k)? else {
            continue;
        };
        if unused_since(&value, before_ns, unknown_ns) {
            ctx.txn.delete(k)?;
        }
    }
    Ok(Done::Nothing)
}
