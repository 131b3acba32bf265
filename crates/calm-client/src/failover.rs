//! A client of several servers of one namespace (`calm mount --server A,B,C`): when the
//! connection to its server is lost, it connects to the next one of the list that answers and
//! sends again what was in flight.
//!
//! Sending a mutation again is safe because every mutation of such a client carries a request
//! id (`calm_proto::REQUEST_KEY`): a random client id, the mutation's number, and the number up
//! to which the client has all its answers. A server applies a request id at most once and
//! answers a repeat as the first attempt was answered (`calm_types::request`), so a create,
//! rename or unlink whose answer was lost with its server is not applied twice.

use calm_types::sync::Locked;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_types::RequestId;

use crate::ClientTls;

/// Longest a call keeps looking for a server that answers, in milliseconds: past it, the call
/// fails with the last error.
pub const FAILOVER_MS_MAX: u64 = 60_000;
/// Longest a call waits for its answer, in milliseconds, whether its server is gone or holds
/// the connection without answering (stopped, or stuck): past it, the call fails as if the
/// connection were lost. A lock wait, and the calls that read the whole namespace, are not
/// bounded (a signal ends a lock wait).
pub const ANSWER_MS_MAX: u64 = FAILOVER_MS_MAX;
/// Pause after every server of the list was tried without an answer.
const ROUND_PAUSE_MS: u64 = 100;
/// Longest one connection attempt waits.
pub const CONNECT_MS_MAX: u64 = 1_000;
/// Shortest time between two moves: a server that accepts connections and drops them at once
/// (one stopping, whose socket still completes connections) is tried again after it, not in a
/// tight loop.
pub const MOVE_INTERVAL_MS_MIN: u64 = 100;

/// The servers a client may move to, and its request ids.
#[derive(Debug)]
pub struct Failover {
    pub(crate) addrs: Vec<String>,
    pub(crate) tls: Option<ClientTls>,
    /// Which address the current connection is to.
    pub(crate) at: AtomicU64,
    client_id: u64,
    next_seq: AtomicU64,
    /// Request numbers sent and not yet answered.
    in_flight: Mutex<BTreeSet<u64>>,
    /// One move at a time; when the last one was made.
    pub(crate) moving: tokio::sync::Mutex<Option<Instant>>,
    /// Moves so far (a call that saw the connection it used replaced does not move again).
    pub(crate) moves: AtomicU64,
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

impl Failover {
    pub(crate) fn new(addrs: Vec<String>, tls: Option<ClientTls>, at: usize) -> Failover {
        Failover {
            addrs,
            tls,
            at: AtomicU64::new(at as u64),
            client_id: random_u64(),
            next_seq: AtomicU64::new(1),
            in_flight: Mutex::new(BTreeSet::new()),
            moving: tokio::sync::Mutex::new(None),
            moves: AtomicU64::new(0),
        }
    }

    /// A fresh request id for a mutation about to be sent.
    pub(crate) fn next_request(&self) -> RequestId {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let mut in_flight = self.in_flight.locked();
        in_flight.insert(seq);
        let acked = in_flight.first().map_or(seq, |first| *first) - 1;
        RequestId {
            client: self.client_id,
            seq,
            acked,
        }
    }

    /// The mutation `id` was answered (or will not be sent again).
    pub(crate) fn answered(&self, id: RequestId) {
        self.in_flight.locked().remove(&id.seq);
    }
}

/// A request id a caller keeps across calls: a mutation whose answer never came is sent
/// again with the same id however many calls it takes (a server that applied it answers as it
/// did the first time, also after a restart), and the id stays unacknowledged until the
/// holder drops it, so that no server deletes its record meanwhile.
#[derive(Debug)]
pub struct HeldRequest {
    failover: Arc<Failover>,
    id: RequestId,
}

impl HeldRequest {
    pub(crate) fn new(failover: Arc<Failover>) -> HeldRequest {
        let id = failover.next_request();
        HeldRequest { failover, id }
    }

    pub fn id(&self) -> RequestId {
        self.id
    }
}

impl Drop for HeldRequest {
    fn drop(&mut self) {
        self.failover.answered(self.id);
    }
}

/// A mutation's request id while its call runs: marked answered when the call ends, however
/// it ends (answered, failed, or its future dropped before the answer came). An id left in
/// flight would hold back the acknowledged number every later request carries, and the
/// server would keep all of this client's request records from then on.
#[derive(Debug)]
pub(crate) struct InFlight {
    failover: Option<Arc<Failover>>,
    id: Option<RequestId>,
}

impl InFlight {
    pub(crate) fn new(failover: Option<Arc<Failover>>, id: Option<RequestId>) -> InFlight {
        InFlight { failover, id }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let (Some(failover), Some(id)) = (&self.failover, self.id) {
            failover.answered(id);
        }
    }
}

/// Whether `status` says the connection was lost (the server died, or cannot be reached),
/// rather than being an answer of the server's: only those are sent elsewhere.
pub fn connection_lost(status: &tonic::Status) -> bool {
    // Every answer of a server's carries its error code; a transport failure does not.
    if status.metadata().get(calm_proto::ERROR_CODE_KEY).is_some()
        || status
            .metadata()
            .get(calm_proto::locks::LOCK_CODE_KEY)
            .is_some()
    {
        return false;
    }
    match status.code() {
        tonic::Code::Unavailable => true,
        tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal => {
            let mut source = std::error::Error::source(status);
            while let Some(error) = source {
                if error.is::<std::io::Error>()
                    || error.is::<tonic::transport::Error>()
                    || error.to_string().contains("h2 protocol error")
                {
                    return true;
                }
                source = error.source();
            }
            let message = status.message();
            message.contains("transport error")
                || message.contains("connection")
                || message.contains("broken pipe")
        }
        _ => false,
    }
}

/// How long a call may still look for a server.
#[derive(Debug)]
pub struct Budget {
    deadline: Instant,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            deadline: Instant::now() + Duration::from_millis(FAILOVER_MS_MAX),
        }
    }
}

impl Budget {
    pub fn left(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// `call`'s answer; with `bounded`, an unavailable status when the budget ran out
    /// before it came (a status without a server's error code: the connection counts as
    /// lost).
    pub(crate) async fn bound<T>(
        &self,
        bounded: bool,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        if !bounded {
            return call.await;
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, call).await {
            Ok(answer) => answer,
            Err(_) => Err(tonic::Status::unavailable(format!(
                "the server did not answer within {} s",
                ANSWER_MS_MAX / 1000
            ))),
        }
    }
}

pub(crate) async fn round_pause() {
    tokio::time::sleep(Duration::from_millis(ROUND_PAUSE_MS)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_count_up_and_acknowledge_what_was_answered() {
        let failover = Failover::new(vec!["a".into()], None, 0);
        let one = failover.next_request();
        let two = failover.next_request();
        assert_eq!((one.seq, one.acked), (1, 0));
        assert_eq!((two.seq, two.acked), (2, 0), "1 is still in flight");
        failover.answered(one);
        let three = failover.next_request();
        assert_eq!((three.seq, three.acked), (3, 1));
        failover.answered(two);
        failover.answered(three);
        let four = failover.next_request();
        assert_eq!((four.seq, four.acked), (4, 3));
        assert_eq!(one.client, four.client);
    }

    #[test]
    fn a_call_dropped_before_its_answer_leaves_nothing_in_flight() {
        let failover = Arc::new(Failover::new(vec!["a".into()], None, 0));
        let one = failover.next_request();
        let call = async {
            let _in_flight = InFlight::new(Some(failover.clone()), Some(one));
            std::future::pending::<()>().await;
        };
        let mut call = Box::pin(call);
        // Polled once (the request is out), then cancelled.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(call.as_mut().poll(&mut cx).is_pending());
        let two = failover.next_request();
        assert_eq!(two.acked, 0, "1 is in flight while its call runs");
        drop(call);
        failover.answered(two);
        let three = failover.next_request();
        assert_eq!(three.acked, 2, "the cancelled call's id is acknowledged");
    }

    #[test]
    fn only_a_lost_connection_is_sent_elsewhere() {
        assert!(connection_lost(&tonic::Status::unavailable(
            "tcp connect error"
        )));
        assert!(connection_lost(&tonic::Status::unknown("transport error")));
        let mut answered = tonic::Status::unavailable("the store is busy");
        answered
            .metadata_mut()
            .insert(calm_proto::ERROR_CODE_KEY, "9".parse().unwrap());
        assert!(!connection_lost(&answered));
        assert!(!connection_lost(&tonic::Status::not_found("no such file")));
        assert!(!connection_lost(&tonic::Status::unknown("something else")));
    }
}
