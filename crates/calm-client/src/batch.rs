//! The client's side of `Meta.Batch`: namespace calls that queue while earlier ones are on
//! their way go to the server together.
//!
//! At most [`IN_FLIGHT_MAX`] batches are in flight per client (and its clones). A call made
//! while fewer are goes out at once, alone: one process's calls wait for nothing. A call made
//! while all are in flight waits for the first of them to be answered and then goes out with
//! every other call that queued meanwhile (up to [`BATCH_CALLS_MAX`] calls and
//! [`BATCH_BYTES_MAX`] bytes per batch). So the number of requests, and what each costs the
//! client and the server, grows with the rate of round trips, not with the rate of calls.
//!
//! Each call is answered as it would have been alone (calm-proto's `batch` module): the same
//! reply and `calm-index`, or the same status and `calm-code`. A batch that fails as a whole
//! (the connection broke) fails each of its calls with that status.

use std::sync::{Arc, OnceLock};

use calm_proto::batch::{BATCH_BYTES_MAX, BATCH_CALLS_MAX, Replied, metadata_of, response_of};
use calm_proto::pb;
use calm_proto::pb::meta_client::MetaClient;
use prost::Message;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Batches one client may have in flight at once.
pub const IN_FLIGHT_MAX: usize = 4;

struct Queued {
    call: pb::Call,
    answer: oneshot::Sender<Result<pb::CallReply, Status>>,
}

/// The queue of one client's calls, and the task that sends them.
#[derive(Debug)]
pub(crate) struct Batcher {
    rpc: MetaClient<Channel>,
    /// Started by the first call (a client may be made outside a runtime).
    queue: OnceLock<mpsc::UnboundedSender<Queued>>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued").finish_non_exhaustive()
    }
}

impl Batcher {
    pub(crate) fn new(rpc: MetaClient<Channel>) -> Arc<Batcher> {
        Arc::new(Batcher {
            rpc,
            queue: OnceLock::new(),
        })
    }

    /// Sends `request` as a call of a batch; `op` makes the call's operation of it.
    pub(crate) async fn call<T, R: Replied>(
        &self,
        request: Request<T>,
        op: impl FnOnce(T) -> pb::call::Op,
    ) -> Result<Response<R>, Status> {
        let call = pb::Call {
            metadata: metadata_of(request.metadata()),
            op: Some(op(request.into_inner())),
        };
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_batches(self.rpc.clone(), receiver));
            sender
        });
        let (answer, answered) = oneshot::channel();
        let lost = || Status::unavailable("the client's batch sender stopped");
        queue.send(Queued { call, answer }).map_err(|_| lost())?;
        let reply = answered.await.map_err(|_| lost())??;
        response_of(reply)
    }
}

/// Takes the queued calls a batch at a time, each batch once one of the in-flight slots is
/// free; ends when every sender (every clone of the client) is gone.
async fn send_batches(rpc: MetaClient<Channel>, mut queue: mpsc::UnboundedReceiver<Queued>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut bytes = first.call.encoded_len();
        let mut batch = vec![first];
        while batch.len() < BATCH_CALLS_MAX && bytes < BATCH_BYTES_MAX {
            match queue.try_recv() {
                Ok(queued) => {
                    bytes += queued.call.encoded_len();
                    batch.push(queued);
                }
                Err(_) => break,
            }
        }
        let mut rpc = rpc.clone();
        tokio::spawn(async move {
            let (calls, answers): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|q| (q.call, q.answer)).unzip();
            let sent = calls.len();
            let replies = match rpc
                .batch(pb::BatchRequest {
                    calls,
                    ordered: false,
                })
                .await
            {
                Ok(reply) => reply.into_inner().replies,
                Err(status) => {
                    for answer in answers {
                        let _ = answer.send(Err(status.clone()));
                    }
                    return;
                }
            };
            if replies.len() != sent {
                let wrong = Status::internal(format!(
                    "{sent} calls were answered with {} replies",
                    replies.len()
                ));
                for answer in answers {
                    let _ = answer.send(Err(wrong.clone()));
                }
                return;
            }
            for (answer, reply) in answers.into_iter().zip(replies) {
                // The caller may have gone (its request was cancelled): nothing to tell it.
                let _ = answer.send(Ok(reply));
            }
            drop(slot);
        });
    }
}
