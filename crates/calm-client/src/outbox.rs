//! Changes a mount answered itself and sends after, in their order: makes and removals of names
//! in a directory it holds (docs/design/mount.md, "Directories held").
//!
//! - The changes go to the server in ordered batches (`BatchRequest.ordered`), one batch in
//!   flight at a time: the server applies them in the order they were answered, so a crash of
//!   either side keeps a prefix of them. Each carries a request id, so a batch sent again after
//!   a lost connection or a restarted server applies each change once.
//! - Every other request of the client (and of its clones) waits until every change queued
//!   before it was answered ([`Outbox::drained`]): the server sees this mount's requests in the
//!   order the mount answered them.
//! - At most [`OUTBOX_CHANGES_MAX`] changes wait at once ([`Outbox::has_room`]): past it the
//!   mount sends a change to the server itself, as before, after them.
//! - A change the server refuses (none should be: the mount answers only what it knows the
//!   server accepts) is counted, logged, and reported by the next [`Outbox::take_failure`]
//!   (a mount's next fsync or syncfs fails with it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use calm_proto::batch::{BATCH_CALLS_MAX, metadata_of};
use calm_proto::pb;
use calm_types::MetaError;
use calm_types::sync::Locked;
use tokio::sync::Notify;

use crate::Client;
use crate::failover::Failover;

/// Changes queued at most.
pub const OUTBOX_CHANGES_MAX: usize = 4096;

/// A change answered by the mount, to be sent.
#[derive(Debug, Clone)]
pub enum Change {
    Make(pb::MakeRequest),
    Unlink(pb::RemoveRequest),
    Rmdir(pb::RemoveRequest),
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<(u64, pb::Call, calm_types::RequestId)>,
    /// Number of the last change queued, and of the last one answered (from 1).
    queued: u64,
    answered: u64,
    /// The first change refused since it was last taken.
    failure: Option<MetaError>,
}

/// The ordered queue of one mount's changes, shared by its clients.
#[derive(Debug)]
pub struct Outbox {
    state: std::sync::Mutex<State>,
    /// Something was queued (the sender's wake-up).
    queued: Notify,
    /// Changes were answered (waiters on [`Outbox::drained`] and for room).
    answered: Notify,
    /// Request ids where the client has none of its own (a server in this process).
    ids: Option<Failover>,
    refused: AtomicU64,
    sent: AtomicU64,
    batches: AtomicU64,
}

impl Outbox {
    /// An outbox sending with `client`, which it keeps (started at once, in the runtime).
    pub fn start(client: &Client) -> Arc<Outbox> {
        let outbox = Arc::new(Outbox {
            state: std::sync::Mutex::new(State::default()),
            queued: Notify::new(),
            answered: Notify::new(),
            ids: client
                .failover
                .is_none()
                .then(|| Failover::new(Vec::new(), None, 0)),
            refused: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        });
        let sender = Client {
            outbox: None,
            ..client.clone()
        };
        tokio::spawn(send(Arc::downgrade(&outbox), sender));
        outbox
    }

    fn next_id(&self, client: &Client) -> calm_types::RequestId {
        match (&client.failover, &self.ids) {
            (Some(failover), _) => failover.next_request(),
            (None, Some(ids)) => ids.next_request(),
            (None, None) => unreachable!("an outbox has ids where its client has none"),
        }
    }

    fn answered_id(&self, client: &Client, id: calm_types::RequestId) {
        match (&client.failover, &self.ids) {
            (Some(failover), _) => failover.answered(id),
            (_, Some(ids)) => ids.answered(id),
            _ => {}
        }
    }

    /// Queues `change`, asked by `client`'s caller (its identity and session go with it), at
    /// once: the caller checked there is room ([`Outbox::has_room`]).
    pub fn push_now(&self, client: &Client, change: Change) {
        let id = self.next_id(client);
        let op = match change {
            Change::Make(m) => pb::call::Op::Make(m),
            Change::Unlink(m) => pb::call::Op::Unlink(m),
            Change::Rmdir(m) => pb::call::Op::Rmdir(m),
        };
        let call = pb::Call {
            metadata: metadata_of(client.tagged((), Some(id)).metadata()),
            op: Some(op),
        };
        let mut state = self.state.locked();
        state.queued += 1;
        let number = state.queued;
        state.queue.push_back((number, call, id));
        drop(state);
        self.queued.notify_one();
    }

    /// Handles granted to the client this outbox sends as (its request ids' client), for the
    /// nodes the mount makes: the first of `count`. Sent with `client`'s identity, without
    /// waiting for what is queued.
    pub async fn grant(
        &self,
        client: &Client,
        count: u64,
    ) -> Result<calm_types::Handle, MetaError> {
        let client = Client {
            outbox: None,
            ..client.clone()
        };
        let id = self.next_id(&client);
        let reply = rpc_call!(
            client,
            meta,
            tagged,
            |conn, request| conn.rpc.clone().grant_handles(request).await,
            grant_handles,
            pb::GrantRequest { count },
            Some(id),
            false,
            false,
            true
        );
        self.answered_id(&client, id);
        match reply {
            Ok(reply) => Ok(reply.into_inner().first),
            Err(status) => Err(calm_proto::error_from_status(&status)),
        }
    }

    /// Whether a change can be queued without waiting.
    pub fn has_room(&self) -> bool {
        self.state.locked().queue.len() < OUTBOX_CHANGES_MAX
    }

    /// Waits until a change can be queued without waiting (the changes answered and not yet
    /// applied are under [`OUTBOX_CHANGES_MAX`]).
    pub async fn room(&self) {
        loop {
            let answered = self.answered.notified();
            if self.has_room() {
                return;
            }
            answered.await;
        }
    }

    /// Waits until every change queued before this call was answered.
    pub async fn drained(&self) {
        let target = self.state.locked().queued;
        loop {
            let answered = self.answered.notified();
            if self.state.locked().answered >= target {
                return;
            }
            answered.await;
        }
    }

    /// The first change refused since the last call, if any.
    pub fn take_failure(&self) -> Option<MetaError> {
        self.state.locked().failure.take()
    }

    /// Changes queued, sent, batches they went in, and changes refused.
    pub fn figures(&self) -> (u64, u64, u64, u64) {
        (
            self.state.locked().queued,
            self.sent.load(Ordering::Relaxed),
            self.batches.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// Sends what is queued, a batch at a time, until the outbox is gone.
async fn send(outbox: std::sync::Weak<Outbox>, client: Client) {
    loop {
        let Some(strong) = outbox.upgrade() else {
            return;
        };
        let queued = strong.queued.notified();
        let batch: Vec<(u64, pb::Call, calm_types::RequestId)> = {
            let state = strong.state.locked();
            state.queue.iter().take(BATCH_CALLS_MAX).cloned().collect()
        };
        if batch.is_empty() {
            // Woken by the next push; looked at again each second, to end once the outbox's
            // last other holder dropped it.
            let idle = tokio::time::timeout(std::time::Duration::from_secs(1), queued).await;
            if idle.is_err() && Arc::strong_count(&strong) == 1 {
                return;
            }
            continue;
        }
        let calls: Vec<pb::Call> = batch.iter().map(|(_, call, _)| call.clone()).collect();
        let replies = client.send_ordered(calls).await;
        let last = batch.last().map_or(0, |(number, ..)| *number);
        for ((_, call, id), reply) in batch.iter().zip(&replies) {
            strong.answered_id(&client, *id);
            if let Err(e) = reply {
                strong.refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(?call.op, %e, "a change the mount answered was refused by the server");
                strong.state.locked().failure.get_or_insert(e.clone());
            }
        }
        strong.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
        strong.batches.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = strong.state.locked();
            state.queue.drain(..batch.len());
            state.answered = last;
        }
        strong.answered.notify_waiters();
    }
}

impl Client {
    /// This client with `outbox`: its other requests wait for the changes queued there.
    pub fn with_outbox(&self, outbox: Arc<Outbox>) -> Client {
        Client {
            outbox: Some(outbox),
            ..self.clone()
        }
    }

    /// The outbox this client's requests wait for, if it has one.
    pub fn outbox(&self) -> Option<&Arc<Outbox>> {
        self.outbox.as_ref()
    }

    /// Waits for the changes queued in this client's outbox (every request does, first).
    pub(crate) async fn after_outbox(&self) {
        if let Some(outbox) = &self.outbox {
            outbox.drained().await;
        }
    }

    /// Sends `calls` as one ordered batch, again until answered (a lost connection or a
    /// restarted server: each call's request id has it applied once): each call's answer.
    async fn send_ordered(&self, calls: Vec<pb::Call>) -> Vec<Result<(), MetaError>> {
        let sent = calls.len();
        let request = pb::BatchRequest {
            calls,
            ordered: true,
        };
        let mut pause = std::time::Duration::from_millis(10);
        let mut again = false;
        loop {
            match meta_call!(unbounded self, batch, request.clone()) {
                Ok(reply) => {
                    let replies = reply.into_inner().replies;
                    if replies.len() != sent {
                        let wrong = MetaError::Io(format!(
                            "{sent} changes were answered with {} replies",
                            replies.len()
                        ));
                        return vec![Err(wrong); sent];
                    }
                    let calls = request.calls.iter();
                    return calls
                        .zip(replies)
                        .map(|(call, reply)| match refusal(reply) {
                            // Sent again, a make answers from its record with its node, which
                            // a later change of the batch may have removed: applied all the same.
                            Err(MetaError::NotFound)
                                if again && matches!(call.op, Some(pb::call::Op::Make(_))) =>
                            {
                                Ok(())
                            }
                            answer => answer,
                        })
                        .collect();
                }
                Err(status) => {
                    // The server is gone or restarting: the changes wait for it, in order.
                    tracing::warn!(%status, "sending the changes the mount answered; again");
                    again = true;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
            }
        }
    }
}

/// What a call of an ordered batch answered: nothing to know but a refusal.
fn refusal(reply: pb::CallReply) -> Result<(), MetaError> {
    if reply.code == tonic::Code::Ok as u32 {
        return Ok(());
    }
    match calm_proto::batch::response_of::<pb::Empty>(reply) {
        Ok(_) => Ok(()),
        Err(status) => Err(calm_proto::error_from_status(&status)),
    }
}
