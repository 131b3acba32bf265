//! What etcd's answers mean to calm: which errors are worth sending a request again (the
//! cluster did not answer this time), which are refusals that map to a store error (too many
//! operations, too large, out of space, compacted away), and the retry loops that send a
//! request until it is answered or its time is up.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::Inner;
use calm_store::StoreError;
use etcd_client::Client;

/// Whether an error means "the cluster did not answer (this time)": worth sending again.
fn transient(error: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match error {
        E::TransportError(_) | E::IoError(_) => true,
        // The connection to the member broke under the request (the member died, or closed
        // it): tonic reports it as a status of code Unknown whose source is the transport's
        // error.
        E::GRpcStatus(status) if broken_connection(status) => true,
        E::GRpcStatus(status) => {
            let message = status.message();
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) || message.contains("leader changed")
                || message.contains("no leader")
                || message.contains("timed out")
                || message.contains("not capable")
                || message.contains("too many requests")
                || message.contains("future revision")
        }
        _ => false,
    }
}

/// Whether `status` stands for a connection that broke rather than an answer of etcd's: an
/// I/O or transport error in its source chain.
fn broken_connection(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<std::io::Error>() || error.is::<tonic::transport::Error>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The cluster's refusals this store names: what etcd says, whether it means "full" (else a
/// limit), and what the operator can change.
const REFUSALS: &[(&str, bool, &str)] = &[
    (
        "database space exceeded",
        true,
        "the cluster's --quota-backend-bytes",
    ),
    (
        "too many operations in txn",
        false,
        "the cluster's --max-txn-ops is below this store's txn-ops-max",
    ),
    (
        "message length too large",
        false,
        "an answer larger than this store accepts",
    ),
    (
        "request is too large",
        false,
        "the cluster's --max-request-bytes is below this store's request-bytes-max",
    ),
];

/// Whether the cluster answered that the revision asked for is compacted away.
pub(crate) fn compacted_away(error: &etcd_client::Error) -> bool {
    error
        .to_string()
        .contains("required revision has been compacted")
}

/// Whether the cluster refused a request for its space quota.
pub(crate) fn out_of_space(error: &etcd_client::Error) -> bool {
    error.to_string().contains(REFUSALS[0].0)
}

/// Maps an error the cluster gave to the seam's errors.
pub(crate) fn store_error(error: etcd_client::Error) -> StoreError {
    let text = error.to_string();
    if let Some((_, full, hint)) = REFUSALS.iter().find(|(says, _, _)| text.contains(says)) {
        let message = format!("etcd: {text} ({hint})");
        return if *full {
            StoreError::Full(message)
        } else {
            StoreError::Limit(message)
        };
    }
    if compacted_away(&error) {
        // The snapshot's revision was compacted away: the transaction can be run again on a
        // newer one.
        StoreError::Conflict
    } else {
        StoreError::Io(format!("etcd: {text}"))
    }
}

/// Sends `request` until it gets an answer, while the cluster is unavailable and
/// `retry_ms_max` has not passed; each attempt is bounded by `attempt_ms_max` and by the time
/// left.
pub(crate) async fn retrying<T, F, Fut>(
    inner: &Inner,
    request: F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    retrying_until(inner, None, request).await
}

/// [`retrying`], within `until` when given: the deadline of a larger piece of work that this
/// request is part of (a commit, within its transaction's), which bounds every attempt, the
/// first too (past it, the request fails without being sent).
pub(crate) async fn retrying_until<T, F, Fut>(
    inner: &Inner,
    until: Option<Instant>,
    request: F,
) -> std::result::Result<T, etcd_client::Error>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let timed_out = || {
        etcd_client::Error::GRpcStatus(tonic::Status::new(
            tonic::Code::DeadlineExceeded,
            "etcd request timed out",
        ))
    };
    let deadline =
        until.unwrap_or_else(|| Instant::now() + Duration::from_millis(inner.options.retry_ms_max));
    if until.is_some() && Instant::now() >= deadline {
        return Err(timed_out());
    }
    let attempt = Duration::from_millis(inner.options.attempt_ms_max);
    let mut pause = Duration::from_millis(20);
    let mut first = until.is_none();
    // Members tried since the last pause: a member that does not answer is skipped at once,
    // the pause comes after every member was tried.
    let mut tried = 0;
    loop {
        // The first attempt has its whole time; a later one no more than is left before the
        // deadline, so that a request fails within `retry_ms_max` of its start.
        let budget = match std::mem::replace(&mut first, false) {
            true => attempt,
            false => attempt.min(deadline.saturating_duration_since(Instant::now())),
        };
        let (used, client) = inner.endpoints.client().await;
        let outcome = match client {
            Err(error) => Err(error),
            Ok(client) => {
                let sent = Instant::now();
                let outcome = match tokio::time::timeout(budget, request(client)).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(timed_out()),
                };
                inner
                    .stats
                    .latencies
                    .observe(sent.elapsed().as_nanos() as u64);
                outcome
            }
        };
        match outcome {
            Err(error) if transient(&error) && Instant::now() < deadline => {
                inner.stats.retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%error, member = used, "etcd did not answer; sending again");
                inner.endpoints.failed(used);
                tried += 1;
                if tried >= inner.endpoints.len() {
                    tried = 0;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
            Err(error) => {
                // What the caller will see as EIO: said here, with the reason.
                if transient(&error) {
                    tracing::warn!(%error, retry_ms_max = inner.options.retry_ms_max,
                        "etcd did not answer within the retry limit");
                } else if compacted_away(&error) {
                    // Expected: a compaction another server made first, or a read at a
                    // revision compacted under it (run again as a conflict).
                    tracing::debug!(%error, "etcd: history compacted already");
                } else {
                    tracing::warn!(%error, "etcd refused a request");
                }
                return Err(error);
            }
            ok => return ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_sent_again_an_answer_is_not() {
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(transient(&etcd_client::Error::GRpcStatus(broken)));
        for (code, message) in [
            (tonic::Code::Unavailable, "connection refused"),
            (tonic::Code::Unknown, "etcdserver: leader changed"),
            (tonic::Code::Unknown, "etcdserver: request timed out"),
        ] {
            let status = tonic::Status::new(code, message);
            assert!(
                transient(&etcd_client::Error::GRpcStatus(status)),
                "{message}"
            );
        }
        for (code, message) in [
            (tonic::Code::Unknown, "transport error"),
            (
                tonic::Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
        ] {
            let status = tonic::Status::new(code, message);
            assert!(
                !transient(&etcd_client::Error::GRpcStatus(status)),
                "{message}"
            );
        }
    }
}
