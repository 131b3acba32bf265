//! Request records: a mutation sent with a request id (a client's id and the mutation's
//! sequence number) is recorded, in its own transaction, with what it answered; the same
//! request sent again — its client lost the answer when its server died, and asks another
//! server — finds the record and answers as the first attempt did, without applying anything
//! twice (docs/design/store-layout.md, `Q`).
//!
//! Records are bounded per client: each request also says up to which sequence number its
//! client has all its answers (`acked`), and the records at or below it are deleted then. The
//! committer remembers, per client, up to where a committed transaction deleted them
//! ([`Cleaned`]), so a request reads only the records above that: on a store that keeps
//! deleted keys until a compaction (etcd), a read from the client's first record would walk
//! every record the client ever had. A
//! client that goes away leaves the records of the requests it had in flight (at least its
//! last one, which no later request acknowledges): each record carries the time it was written,
//! and a sweep ([`expired`], then [`Op::ForgetRequests`](crate::ops::Op)) deletes the ones
//! older than `MetaOptions::request_records_kept` (default [`RECORDS_KEPT_DEFAULT`]), long
//! after any client stopped sending the request again (a client gives up on a request after
//! 60 s).

use std::ops::ControlFlow;

use calm_store::{ReadTxn, WriteTxn};

use crate::ctx::Ctx;
use crate::layout::TAG_REQUEST;
use crate::outcome::{Done, Outcome};
use crate::types::Handle;

pub use calm_types::RequestId;

/// What a recorded mutation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Nothing,
    /// The attributes of this inode (read again when replayed).
    Attr(Handle),
    Orphaned(Handle),
    Ids(u64),
}

/// The window of sequence numbers read for a client this server does not know yet (its
/// acknowledged records are at most its requests in flight before).
pub const ACKED_DELETES_MAX: usize = 4096;

/// Most acknowledged records one request deletes: its transaction stays within a store's
/// limit of operations per transaction (128 on etcd by default) with room for the operation's
/// own writes, however far its client's acknowledgement jumped (it jumps by every request
/// answered while an older one waited). The rest go with the client's next requests.
pub const RECORD_DELETES_PER_REQUEST: usize = 32;

/// How long a request record is kept by default: sixty times the longest a client sends one
/// request again.
pub const RECORDS_KEPT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(3600);
/// Most records one sweep pass reads (it resumes after the last on its next pass).
pub const SWEEP_KEYS_MAX: usize = 4096;
/// Most records one [`Op::ForgetRequests`](crate::ops::Op) deletes: a transaction of etcd
/// holds 128 operations by default.
pub const FORGETS_PER_OP_MAX: usize = 64;

pub fn key(client: u64, seq: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = TAG_REQUEST;
    k[1..9].copy_from_slice(&client.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The record's value: what `done` answered, and when (`now_ns`, the commit's clock).
fn encode(done: &Done, now_ns: i64) -> Option<[u8; 17]> {
    let (kind, value) = match done {
        Done::Nothing => (0, 0),
        Done::Attr(attr) => (1, attr.handle),
        Done::Orphaned(handle) => (2, *handle),
        Done::Ids(first) => (3, *first),
        // Changelog readers and quotas are administration, sent without request ids (setting
        // a quota twice sets it once).
        Done::User(_) | Done::Quota(_) | Done::Restored { .. } | Done::Cloned { .. } => {
            return None;
        }
    };
    let mut bytes = [0u8; 17];
    bytes[0] = kind;
    bytes[1..9].copy_from_slice(&value.to_le_bytes());
    bytes[9..].copy_from_slice(&now_ns.to_le_bytes());
    Some(bytes)
}

/// When a record was written (ns since the epoch); `None` for a record of format 6, which
/// kept no time (the first sweep deletes it).
pub fn written_ns(bytes: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(bytes.get(9..17)?.try_into().ok()?))
}

pub fn decode(bytes: &[u8]) -> Option<Recorded> {
    let value = u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?);
    if bytes.len() != 9 && bytes.len() != 17 {
        return None;
    }
    Some(match bytes[0] {
        0 => Recorded::Nothing,
        1 => Recorded::Attr(value),
        2 => Recorded::Orphaned(value),
        3 => Recorded::Ids(value),
        _ => return None,
    })
}

/// The answer `id` got the first time, if it was applied already.
pub(crate) fn replay<T: WriteTxn>(ctx: &mut Ctx<'_, T>, id: RequestId) -> Outcome<Option<Done>> {
    let Some(bytes) = ctx.txn.get(&key(id.client, id.seq))? else {
        return Ok(None);
    };
    let recorded = decode(&bytes).ok_or_else(|| {
        crate::MetaError::Io(format!("request record {} does not decode", id.to_text()))
    })?;
    Ok(Some(match recorded {
        Recorded::Nothing => Done::Nothing,
        Recorded::Attr(handle) => Done::Attr(ctx.load(handle)?.attr()),
        Recorded::Orphaned(handle) => Done::Orphaned(handle),
        Recorded::Ids(first) => Done::Ids(first),
    }))
}

/// Records that `id` answered `done`, and deletes the client's acknowledged records in
/// `acked` (from [`Cleaned::range`]), the first [`RECORD_DELETES_PER_REQUEST`] of them. The
/// sequence number up to which the client's records are then deleted (`id.acked` when every
/// record there was), or `None` when nothing was recorded.
pub(crate) fn record<T: WriteTxn>(
    ctx: &mut Ctx<'_, T>,
    id: RequestId,
    done: &Done,
    acked: &(RecordKey, RecordKey),
) -> Outcome<Option<u64>> {
    let Some(value) = encode(done, ctx.now) else {
        return Ok(None);
    };
    ctx.txn.put(&key(id.client, id.seq), &value)?;
    let mut found = Vec::new();
    let mut whole = true;
    ctx.txn.visit(&acked.0, &acked.1, &mut |k, _| {
        if found.len() == RECORD_DELETES_PER_REQUEST {
            whole = false;
            return ControlFlow::Break(());
        }
        found.push(k.to_vec());
        ControlFlow::Continue(())
    })?;
    // Visited in key order: every record up to the last one found is deleted.
    let upto = match found.last() {
        Some(last) if !whole => seq_of(last),
        _ => id.acked,
    };
    for k in found {
        ctx.txn.delete(&k)?;
    }
    Ok(Some(upto))
}

/// The sequence number of a record's key (its last eight bytes).
fn seq_of(key: &[u8]) -> u64 {
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&key[key.len() - 8..]);
    u64::from_be_bytes(seq)
}

/// The key of a request record.
pub type RecordKey = [u8; 17];

/// Most clients whose deleted records the committer remembers; past it, one is forgotten (its
/// next request reads its window of [`ACKED_DELETES_MAX`] sequence numbers again).
pub const CLIENTS_REMEMBERED_MAX: usize = 65_536;

/// Up to which sequence number each client's records are known deleted: a committed
/// transaction deleted every record of the client at or below it. Records below can come back
/// only from a request the client had given up on and that arrived late; the sweep deletes
/// them. Owned by the committer, changed only after a commit.
#[derive(Debug, Default)]
pub struct Cleaned {
    upto: std::collections::HashMap<u64, u64>,
}

impl Cleaned {
    /// The records `id`'s transaction deletes, `[start, end)`: those of its client above what
    /// is known deleted, up to its `acked`. A client not known (this server's first request of
    /// it) has its last [`ACKED_DELETES_MAX`] sequence numbers read; below them, only records
    /// of given-up requests can be left, and the sweep deletes those.
    pub fn range(&self, id: RequestId) -> (RecordKey, RecordKey) {
        let end = id.acked.saturating_add(1);
        let start = match self.upto.get(&id.client) {
            Some(&upto) => upto.saturating_add(1).min(end),
            None => end.saturating_sub(ACKED_DELETES_MAX as u64),
        };
        (key(id.client, start), key(id.client, end))
    }

    /// A committed transaction deleted every record of `client` at or below `acked`.
    pub fn committed(&mut self, client: u64, acked: u64) {
        if self.upto.len() >= CLIENTS_REMEMBERED_MAX
            && !self.upto.contains_key(&client)
            && let Some(&any) = self.upto.keys().next()
        {
            self.upto.remove(&any);
        }
        let upto = self.upto.entry(client).or_insert(acked);
        *upto = (*upto).max(acked);
    }

    /// Clients remembered.
    pub fn len(&self) -> usize {
        self.upto.len()
    }

    pub fn is_empty(&self) -> bool {
        self.upto.is_empty()
    }
}

/// One pass of a sweep: the keys it found old, and where the next pass resumes (`None`: the
/// end was reached).
pub type SweptPage = (Vec<RecordKey>, Option<Vec<u8>>);

/// The records at or after `from` (at most [`SWEEP_KEYS_MAX`] read) written before
/// `before_ns`.
pub fn expired<R: ReadTxn>(view: &R, from: &[u8], before_ns: i64) -> calm_store::Result<SweptPage> {
    let old = |v: &[u8]| written_ns(v).is_none_or(|at| at < before_ns);
    old_keys(view, (from, &[TAG_REQUEST + 1]), SWEEP_KEYS_MAX, old)
}

/// The 17-byte keys in `[from, to)` (at most `max` read) whose value `old` says is old.
pub(crate) fn old_keys<R: ReadTxn>(
    view: &R,
    (from, to): (&[u8], &[u8]),
    max: usize,
    old: impl Fn(&[u8]) -> bool,
) -> calm_store::Result<SweptPage> {
    let mut found = Vec::new();
    let mut seen = 0;
    let mut next = None;
    view.visit(from, to, &mut |k, v| {
        if seen == max {
            next = Some(k.to_vec());
            return ControlFlow::Break(());
        }
        seen += 1;
        if old(v)
            && let Ok(k) = <RecordKey>::try_from(k)
        {
            found.push(k);
        }
        ControlFlow::Continue(())
    })?;
    Ok((found, next))
}

/// Deletes the records `keys` (found expired by [`expired`]: a record is written once, so it
/// is still expired, or already gone).
pub(crate) fn forget<T: WriteTxn>(ctx: &mut Ctx<'_, T>, keys: &[[u8; 17]]) -> Outcome<Done> {
    if keys.len() > FORGETS_PER_OP_MAX || keys.iter().any(|k| k[0] != TAG_REQUEST) {
        return Err(crate::MetaError::Invalid(format!(
            "forgetting request records: at most {FORGETS_PER_OP_MAX} keys, all request records"
        ))
        .into());
    }
    for k in keys {
        ctx.txn.delete(k)?;
    }
    Ok(Done::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_records_round_trip_and_bad_ones_are_refused() {
        let id = RequestId {
            client: 0xabc,
            seq: 9,
            acked: 7,
        };
        assert_eq!(RequestId::from_text(&id.to_text()), Some(id));
        for bad in ["", "1:2", "1:2:3:4", "x:1:0", "1:0:0", "1:3:3"] {
            assert_eq!(RequestId::from_text(bad), None, "{bad}");
        }
        for done in [Done::Nothing, Done::Orphaned(5), Done::Ids(77)] {
            let bytes = encode(&done, 1234).unwrap();
            assert_eq!(written_ns(&bytes), Some(1234));
            let back = match decode(&bytes).unwrap() {
                Recorded::Nothing => Done::Nothing,
                Recorded::Orphaned(h) => Done::Orphaned(h),
                Recorded::Ids(n) => Done::Ids(n),
                Recorded::Attr(_) => unreachable!(),
            };
            assert_eq!(back, done);
        }
        assert_eq!(decode(&[9; 9]), None);
        // Format 6: no time.
        assert_eq!(decode(&[3, 7, 0, 0, 0, 0, 0, 0, 0]), Some(Recorded::Ids(7)));
        assert_eq!(written_ns(&[3, 7, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[0; 12]), None);
        assert_eq!(decode(&[0; 8]), None);
    }

    fn id(client: u64, seq: u64, acked: u64) -> RequestId {
        RequestId { client, seq, acked }
    }

    #[test]
    fn a_request_deletes_only_above_what_a_commit_deleted() {
        let mut cleaned = Cleaned::default();
        // Not known: the last ACKED_DELETES_MAX sequence numbers up to acked.
        assert_eq!(
            cleaned.range(id(5, 10_000, 9_000)),
            (key(5, 9_001 - ACKED_DELETES_MAX as u64), key(5, 9_001))
        );
        assert_eq!(cleaned.range(id(5, 3, 2)), (key(5, 0), key(5, 3)));
        cleaned.committed(5, 9_000);
        assert_eq!(
            cleaned.range(id(5, 10_002, 9_500)),
            (key(5, 9_001), key(5, 9_501))
        );
        // A request sent before a later one committed: nothing left to delete.
        assert_eq!(
            cleaned.range(id(5, 9_999, 8_000)),
            (key(5, 8_001), key(5, 8_001))
        );
        // What is known never goes back.
        cleaned.committed(5, 7);
        assert_eq!(
            cleaned.range(id(5, 10_003, 9_000)),
            (key(5, 9_001), key(5, 9_001))
        );
        // Other clients are their own.
        assert_eq!(cleaned.range(id(6, 2, 1)), (key(6, 0), key(6, 2)));
        assert_eq!(
            cleaned.range(id(5, u64::MAX, u64::MAX - 1)),
            (key(5, 9_001), key(5, u64::MAX))
        );
    }

    #[test]
    fn clients_remembered_are_bounded() {
        let mut cleaned = Cleaned::default();
        for client in 0..CLIENTS_REMEMBERED_MAX as u64 + 100 {
            cleaned.committed(client, 1);
            cleaned.committed(client, 2);
        }
        assert_eq!(cleaned.len(), CLIENTS_REMEMBERED_MAX);
        let last = CLIENTS_REMEMBERED_MAX as u64 + 99;
        assert_eq!(cleaned.range(id(last, 9, 8)), (key(last, 3), key(last, 9)));
    }
}
