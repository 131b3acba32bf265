//! The lock service calls of a [`Client`]: sessions, batches of operations, waits and their
//! cancellation, listings, the view of the servers and reclaim reports.

use super::*;
use calm_proto::locks::LockCode;

impl Client {
    // ---- locks ----

    /// Opens a lock session whose lease lasts `lease_ms` unless renewed.
    pub async fn open_lock_session(&self, lease_ms: u64) -> Result<SessionId, LockFailure> {
        let reply = locks_call!(self, open_session, pb::OpenSessionRequest { lease_ms });
        check_lock(reply).map(|r| r.session)
    }

    /// Renews the lease; returns how many milliseconds it now lasts.
    pub async fn keep_alive(&self, session: SessionId) -> Result<u64, LockFailure> {
        let reply = locks_call!(self, keep_alive, pb::SessionRequest { session });
        check_lock(reply).map(|r| r.lease_ms)
    }

    /// Ends the session: its locks are released, its waiting requests refused.
    pub async fn close_lock_session(&self, session: SessionId) -> Result<(), LockFailure> {
        let reply = locks_call!(self, close_session, pb::SessionRequest { session });
        check_lock(reply).map(|_| ())
    }

    /// Applies `calls` in order in one round trip; one answer each.
    pub async fn lock_batch(
        &self,
        session: SessionId,
        calls: &[LockCall],
    ) -> Result<Vec<LockAnswer>, LockFailure> {
        let batch = pb::LockBatch {
            session,
            ops: calls.iter().map(LockCall::to_wire).collect(),
        };
        let reply = locks_call!(indexed self, apply, batch);
        self.note_index(&reply);
        let reply = check_lock(reply)?;
        answers_of(calls.len(), &reply.results)
    }

    /// Takes a lock, waiting as long as it takes (F_SETLKW); [`Client::lock_cancel`] with the
    /// same `tag` ends the wait with [`calm_proto::locks::LockCode::Cancelled`].
    pub async fn lock_wait(
        &self,
        session: SessionId,
        tag: u64,
        request: LockRequest,
    ) -> Result<LockAnswer, LockFailure> {
        self.lock_wait_for(session, tag, request, None).await
    }

    /// [`Client::lock_wait`] for a process of user `uid` (a mount's request), when said.
    pub async fn lock_wait_for(
        &self,
        session: SessionId,
        tag: u64,
        request: LockRequest,
        uid: Option<u32>,
    ) -> Result<LockAnswer, LockFailure> {
        let call = match uid {
            Some(uid) => LockCall::SetFor(request, uid),
            None => LockCall::Set(request),
        };
        let wait = pb::WaitRequest {
            session,
            tag,
            op: Some(call.to_wire()),
        };
        let reply = locks_call!(indexed unbounded self, wait, wait);
        self.note_index(&reply);
        let reply = check_lock(reply)?;
        Ok(LockAnswer::from_wire(&reply))
    }

    /// `message` carrying the changelog index this client's mutations reached: the server
    /// that grants a lock answers with an index at least as high, so that the next holder's
    /// mount drops what the previous one changed, also when the two locked through different
    /// servers from the one they wrote through.
    fn with_index<T>(&self, message: T, _: Option<calm_types::RequestId>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let reached = self.reached();
        if reached > 0 {
            request.metadata_mut().insert(
                calm_proto::INDEX_KEY,
                reached
                    .to_string()
                    .parse()
                    .expect("digits are valid metadata"),
            );
        }
        request
    }

    /// `message` as it is (lock calls name their session in the message).
    pub(crate) fn untagged<T>(
        &self,
        message: T,
        _: Option<calm_types::RequestId>,
    ) -> tonic::Request<T> {
        tonic::Request::new(message)
    }

    /// The servers that decide locks, as this one sees them.
    pub async fn members(&self) -> Result<pb::MembersReply, LockFailure> {
        let reply = locks_call!(self, members, pb::Empty {});
        check_lock(reply)
    }

    /// Reports that `sessions` reclaimed every lock they held, under `view`. False: the
    /// server decides by another view.
    pub async fn reclaim_done(
        &self,
        sessions: Vec<SessionId>,
        view: Vec<u64>,
    ) -> Result<bool, LockFailure> {
        let reply = locks_call!(
            self,
            reclaim_done,
            pb::ReclaimDoneRequest { sessions, view }
        );
        check_lock(reply).map(|r| r.accepted)
    }

    /// A client of another server (`addr`, as [`Client::connect`] takes it) that shares this
    /// one's changelog reach: the lock requests it sends carry what this client's mutations
    /// reached, and the lock answers it gets raise it.
    pub async fn sibling(&self, addr: &str) -> Result<Client> {
        let mut client = Client::connect(addr).await?;
        client.reached = self.reached.clone();
        Ok(client)
    }

    /// A client of the server that decides `handle`'s locks: this one, unless several servers
    /// share the namespace and another decides it.
    pub async fn decider(&self, handle: Handle) -> Result<Client> {
        let members = self
            .members()
            .await
            .map_err(|f| MetaError::Io(f.to_string()))?;
        self.decider_in(handle, &members).await
    }

    /// [`Client::decider`] by the view `members`.
    async fn decider_in(&self, handle: Handle, members: &pb::MembersReply) -> Result<Client> {
        let view: Vec<u64> = members.servers.iter().map(|m| m.id).collect();
        match calm_locks::peers::owner_of(handle, &view) {
            Some(owner) if members.has_peers && owner != members.me => {
                let member = members.servers.iter().find(|m| m.id == owner);
                let address = member
                    .map(|m| m.address.clone())
                    .ok_or_else(|| MetaError::Io(format!("server {owner:x} has no address")))?;
                self.sibling(&address).await
            }
            _ => Ok(self.clone()),
        }
    }

    /// Cancels the waiting request `tag` (EINTR). False when it was not waiting.
    pub async fn lock_cancel(&self, session: SessionId, tag: u64) -> Result<bool, LockFailure> {
        let reply = locks_call!(self, cancel, pb::CancelRequest { session, tag });
        check_lock(reply).map(|r| r.cancelled)
    }

    /// The locks and waiting requests of the file `handle` at the server deciding it, asked
    /// again while its decider moves (a server of several died and the others take its files
    /// over: its address does not answer, or the new decider answers `Moved` or `Grace`), for
    /// up to [`crate::routing::ROUTE_RETRY_MS_MAX`]. A server alone is asked once.
    pub async fn list_locks_at_decider(&self, handle: Handle) -> Result<LockListing, LockFailure> {
        let mut retry = crate::routing::Retry::new();
        loop {
            let members = self.members().await?;
            let outcome = match self.decider_in(handle, &members).await {
                Ok(decider) => decider.list_locks(handle).await,
                Err(error) => Err(LockFailure::new(LockCode::Unavailable, error.to_string())),
            };
            match outcome {
                Err(failure)
                    if members.has_peers
                        && crate::routing::retryable(failure.code)
                        && retry.pause().await => {}
                outcome => return outcome,
            }
        }
    }

    /// The locks and waiting requests of the file `handle`.
    pub async fn list_locks(&self, handle: Handle) -> Result<LockListing, LockFailure> {
        let reply = locks_call!(self, list, pb::ListLocksRequest { resource: handle });
        let reply = check_lock(reply)?;
        let locks = reply
            .locks
            .iter()
            .map(holder_from_wire)
            .collect::<Result<_, _>>()?;
        let waiting = reply
            .waiting
            .iter()
            .map(|w| {
                let request = LockRequest {
                    resource: handle,
                    owner: owner_from_wire(w.owner.as_ref())?,
                    scope: scope_from_wire(w.range.as_ref())?,
                    kind: calm_proto::locks::kind_from_wire(w.kind)?,
                };
                Ok((w.wait, w.session, request))
            })
            .collect::<Result<_, LockFailure>>()?;
        Ok(LockListing {
            locks,
            waiting,
            total: reply.total,
        })
    }
}

/// One answer per call sent, in order: a reply with fewer or more is a protocol error (the
/// calls it leaves unanswered may or may not have been applied), never a guess.
fn answers_of(sent: usize, results: &[pb::LockResult]) -> Result<Vec<LockAnswer>, LockFailure> {
    if results.len() != sent {
        return Err(LockFailure::new(
            LockCode::Unavailable,
            format!(
                "the server answered {} of {sent} lock calls: a protocol error",
                results.len()
            ),
        ));
    }
    Ok(results.iter().map(LockAnswer::from_wire).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_fewer_or_more_answers_than_calls_is_a_protocol_error() {
        let ok = pb::LockResult::default();
        assert_eq!(answers_of(2, &[ok.clone(), ok.clone()]).unwrap().len(), 2);
        for results in [vec![], vec![ok.clone()], vec![ok.clone(), ok.clone(), ok]] {
            let failure = answers_of(2, &results).expect_err("not one answer per call");
            assert_eq!(failure.code, LockCode::Unavailable);
            assert!(failure.message.contains("protocol error"), "{failure}");
        }
    }
}
