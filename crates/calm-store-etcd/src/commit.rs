//! A commit sent until its transaction's deadline: an answer lost on the way is sent again
//! unchanged (the compare on the commit key lets at most one copy apply), and the commit
//! key's token tells whether one did; when the last copy fails, the commit is settled (the
//! commit key moved on) before the error is returned, so no copy still in flight applies later.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::Inner;
use crate::retry::out_of_space;
use crate::retry::retrying_until;
use crate::retry::store_error;
use calm_store::{Result, StoreError};
use etcd_client::{Txn, TxnOp};

/// Sends a commit until `deadline` (its transaction's); on a lost answer sends it again
/// unchanged and asks the commit key whether one of the copies applied.
pub(crate) async fn commit(
    inner: &Inner,
    txn: Txn,
    token: Vec<u8>,
    revision: i64,
    deadline: Instant,
) -> Result<()> {
    let answered_once = std::sync::atomic::AtomicBool::new(false);
    let lost = std::sync::atomic::AtomicBool::new(false);
    let response = retrying_until(inner, Some(deadline), |mut client| {
        let txn = txn.clone();
        if answered_once.swap(true, Ordering::Relaxed) {
            lost.store(true, Ordering::Relaxed);
        }
        async move { client.txn(txn).await }
    })
    .await;
    let response = match response {
        Ok(response) => response,
        Err(error) if lost.load(Ordering::Relaxed) => {
            // A copy whose answer was lost may still be on its way to being applied: settle it
            // before answering, so that a commit reported failed never applies later.
            return match fence(inner, &token, revision).await? {
                Settled::Applied => {
                    inner.stats.commits.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Settled::NotApplied => Err(store_error(error)),
                Settled::Unknown(why) => Err(StoreError::Io(format!(
                    "etcd: a commit's answer was lost and whether it applied could not be \
                     settled ({why})"
                ))),
            };
        }
        // etcd applies the transaction that crosses the space quota and then answers it with
        // "database space exceeded" (and raises its alarm): whether it applied is in the
        // commit key, which the alarm leaves readable.
        Err(error) if out_of_space(&error) && applied(inner, &token, None).await? => {
            inner.stats.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Err(error) => return Err(store_error(error)),
    };
    if response.succeeded() {
        inner.stats.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(header) = response.header() {
            inner
                .own_commit_revision
                .store(header.revision(), Ordering::Relaxed);
        }
        return Ok(());
    }
    if lost.load(Ordering::Relaxed) && applied(inner, &token, None).await? {
        // An earlier copy applied; this one found the commit key moved by it.
        inner.stats.commits.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    inner.stats.conflicts.fetch_add(1, Ordering::Relaxed);
    inner.met_other_commit();
    Err(StoreError::Conflict)
}

/// What became of a commit whose answer was lost.
enum Settled {
    Applied,
    /// It did not apply and no copy of it ever can.
    NotApplied,
    Unknown(String),
}

/// Settles a commit that started at `revision` and whose answer was lost: moves the commit key
/// on if no commit landed since (then no copy of the lost commit, which compares against
/// `revision`, can apply any more), or else reads the key's token.
async fn fence(inner: &Inner, token: &[u8], revision: i64) -> Result<Settled> {
    let seq = inner.seq.clone();
    let fence_token = inner.next_token();
    // The fence and the reads of what it found share one `retry_ms_max`.
    let deadline = Instant::now() + Duration::from_millis(inner.options.retry_ms_max);
    let fenced = retrying_until(inner, Some(deadline), |mut client| {
        let txn = Txn::new()
            .when([inner.unchanged_since(revision)])
            .and_then([TxnOp::put(seq.clone(), fence_token.clone(), None)]);
        async move { client.txn(txn).await }
    })
    .await;
    match fenced {
        Ok(response) if response.succeeded() => Ok(Settled::NotApplied),
        // With the space alarm raised no write applies any more, the lost copy's included:
        // what the commit key names is final.
        Err(error) if out_of_space(&error) => Ok(if applied(inner, token, Some(deadline)).await? {
            Settled::Applied
        } else {
            Settled::NotApplied
        }),
        Ok(_) => Ok(if applied(inner, token, Some(deadline)).await? {
            Settled::Applied
        } else {
            // Another commit landed after `revision`: the lost one compares false forever.
            Settled::NotApplied
        }),
        Err(error) => Ok(Settled::Unknown(error.to_string())),
    }
}

/// Whether the commit key names `token`: the commit it stands for applied. (A later commit by
/// anyone rewrites the key, but a later commit could only compare true after seeing ours.)
async fn applied(inner: &Inner, token: &[u8], until: Option<Instant>) -> Result<bool> {
    let seq = inner.seq.clone();
    let response = retrying_until(inner, until, |mut client| {
        let seq = seq.clone();
        async move { client.get(seq, None).await }
    })
    .await
    .map_err(store_error)?;
    Ok(response.kvs().first().is_some_and(|kv| kv.value() == token))
}
