//! Watches of a [`Client`]: what to watch, the events, and the stream of one watch.

use super::*;

impl Client {
    // ---- watches ----

    /// Starts watching: a directory's entries (`recursive`: everything below it), the given
    /// handles, or every change, from changelog index `from` (0: from now).
    pub async fn watch(&self, what: WatchWhat, from: u64) -> Result<Watch> {
        let (dir, recursive, handles, all) = match what {
            WatchWhat::Dir { handle, recursive } => (handle, recursive, Vec::new(), false),
            WatchWhat::Handles(handles) => (0, false, handles, false),
            WatchWhat::All => (0, false, Vec::new(), true),
        };
        let request = pb::WatchRequest {
            dir,
            recursive,
            handles,
            from,
            batch_max: 0,
            all,
        };
        let mut stream = match &self.local {
            Some(local) => {
                let mut request = tonic::IntoRequest::into_request(request);
                request.extensions_mut().insert(calm_proto::InProcess);
                WatchStream::Local(check(local.watch.watch(request).await)?, local.clone())
            }
            None => {
                let mut budget = failover::Budget::default();
                loop {
                    let conn = self.conn();
                    match conn.watch.clone().watch(request.clone()).await {
                        Ok(stream) => {
                            break WatchStream::Remote(Box::new((
                                stream.into_inner(),
                                conn.watch.clone(),
                            )));
                        }
                        Err(status) if self.move_on(&status, &conn, &mut budget).await => {}
                        Err(status) => return Err(error_from_status(&status)),
                    }
                }
            }
        };
        let first = stream
            .message()
            .await?
            .ok_or_else(|| MetaError::Io("the watch ended before it began".into()))?;
        Ok(Watch {
            id: first.watch_id,
            stream,
            pending: std::collections::VecDeque::new(),
            passed: 0,
        })
    }
}

/// What to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchWhat {
    Dir {
        handle: Handle,
        recursive: bool,
    },
    Handles(Vec<Handle>),
    /// Every change, in order and never coalesced (for a mount and administrators only).
    All,
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Change(Record),
    /// Re-read the current state, then apply what follows (which starts at this index).
    Resync {
        from: u64,
    },
    /// The stream has passed this index.
    Progress {
        index: u64,
    },
}

/// Where a watch's batches come from: a connection, or the server in this process (then no
/// encoding of the batches and no socket between them).
enum WatchStream {
    Remote(Box<(tonic::Streaming<pb::WatchBatch>, WatchClient<Channel>)>),
    Local(LocalWatchStream, InProcess),
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WatchStream::Remote(..) => "WatchStream::Remote",
            WatchStream::Local(..) => "WatchStream::Local",
        })
    }
}

impl WatchStream {
    async fn message(&mut self) -> Result<Option<pb::WatchBatch>> {
        match self {
            WatchStream::Remote(remote) => {
                remote.0.message().await.map_err(|s| error_from_status(&s))
            }
            WatchStream::Local(stream, _) => {
                use tokio_stream::StreamExt;
                stream
                    .next()
                    .await
                    .transpose()
                    .map_err(|s| error_from_status(&s))
            }
        }
    }

    async fn watch_past(&self, request: pb::WatchPastRequest) -> Result<()> {
        match self {
            WatchStream::Remote(remote) => check(remote.1.clone().watch_past(request).await),
            WatchStream::Local(_, local) => {
                let mut request = tonic::IntoRequest::into_request(request);
                request.extensions_mut().insert(calm_proto::InProcess);
                check(local.watch.watch_past(request).await)
            }
        }
        .map(|_| ())
    }
}

/// A running watch.
#[derive(Debug)]
pub struct Watch {
    id: u64,
    stream: WatchStream,
    pending: std::collections::VecDeque<WatchEvent>,
    /// The highest index the stream has shown (a change or a progress event).
    passed: u64,
}

impl Watch {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The highest changelog index this stream has passed.
    pub fn passed(&self) -> u64 {
        self.passed
    }

    async fn fill(&mut self) -> Result<bool> {
        use pb::watch_event::Event as E;
        let Some(batch) = self.stream.message().await? else {
            return Ok(false);
        };
        for event in batch.events {
            let event = match event.event {
                Some(E::Record(bytes)) => {
                    let wire = <pb::ClRecord as prost::Message>::decode(bytes.as_slice())
                        .map_err(|e| MetaError::Io(format!("a watch record: {e}")))?;
                    let record = record_from_wire(&wire)?;
                    self.passed = self.passed.max(record.index);
                    WatchEvent::Change(record)
                }
                Some(E::ResyncFrom(from)) => WatchEvent::Resync { from },
                Some(E::Progress(index)) => {
                    self.passed = self.passed.max(index);
                    WatchEvent::Progress { index }
                }
                None => continue,
            };
            self.pending.push_back(event);
        }
        Ok(true)
    }

    /// The next event; None when the stream ended.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// The events that have arrived, at least one (waiting for the next batch when none
    /// has); None when the stream ended.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<WatchEvent>>> {
        while self.pending.is_empty() {
            if !self.fill().await? {
                return Ok(None);
            }
        }
        Ok(Some(self.pending.drain(..).collect()))
    }

    /// Waits until the stream has passed `index` (e.g. [`Client::reached`] after one's own
    /// mutations): every change up to it that this watch matches is then among the events
    /// received (still to be taken with [`Watch::next`]). Completion of the mutations
    /// themselves never waits on this.
    pub async fn wait_past(&mut self, index: u64) -> Result<()> {
        if self.passed >= index {
            return Ok(());
        }
        let request = pb::WatchPastRequest {
            watch_id: self.id,
            index,
        };
        self.stream.watch_past(request).await?;
        while self.passed < index {
            if !self.fill().await? {
                return Err(MetaError::Io("the watch ended".into()));
            }
        }
        Ok(())
    }
}
