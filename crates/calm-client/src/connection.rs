//! How a [`Client`] reaches its servers: connecting (a Unix socket, TCP, TLS, several servers
//! of one namespace), the connection it sends on and moving to another server when its own
//! stops answering, the server in the same process (an embedded mount), request ids, the
//! caller's identity on each request, and the changelog index the replies carry.

use super::*;

/// One connection to a server, with a stub per service.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) rpc: MetaClient<Channel>,
    pub(crate) locks: LocksClient<Channel>,
    pub(crate) changelog: ChangelogClient<Channel>,
    pub(crate) watch: WatchClient<Channel>,
    pub(crate) targets: TargetsClient<Channel>,
    pub(crate) protect: calm_proto::pb::protect_client::ProtectClient<Channel>,
    /// Namespace calls over the connection, batched (shared by the client's clones).
    pub(crate) batch: Arc<batch::Batcher>,
}

impl Conn {
    fn new(channel: Channel) -> Conn {
        let rpc = MetaClient::new(channel.clone())
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX);
        Conn {
            batch: batch::Batcher::new(rpc.clone()),
            rpc,
            locks: LocksClient::new(channel.clone())
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
            changelog: ChangelogClient::new(channel.clone())
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
            targets: TargetsClient::new(channel.clone()),
            protect: calm_proto::pb::protect_client::ProtectClient::new(channel.clone()),
            watch: WatchClient::new(channel)
                .max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX),
        }
    }
}

impl Client {
    /// Connects to `addr`: `unix:PATH` (a server's Unix socket on this machine, which tells
    /// the server who this process is), `HOST:PORT` or a full `http://` URI (plain TCP: a
    /// server takes it from root on loopback only), over TLS when the environment names the
    /// files ([`TLS_ENV`]).
    pub async fn connect(addr: &str) -> Result<Client> {
        if addr.contains(',') {
            let addrs: Vec<String> = addr.split(',').map(str::to_string).collect();
            return Self::connect_servers(&addrs).await;
        }
        let tls = match addr.starts_with("unix:") {
            true => None,
            false => ClientTls::from_env()?,
        };
        Self::connect_with(addr, tls.as_ref()).await
    }

    /// [`Client::connect`], over TLS with the client certificate of `tls` when given
    /// (`HOST:PORT` or `https://`).
    pub async fn connect_with(addr: &str, tls: Option<&ClientTls>) -> Result<Client> {
        let connecting =
            |e: &dyn std::fmt::Display| MetaError::Io(format!("connecting to {addr}: {e}"));
        if let Some(path) = addr.strip_prefix("unix:") {
            let path = std::path::PathBuf::from(path);
            // The URI is not used: every connection is made to the socket.
            let endpoint = tonic::transport::Endpoint::from_static("http://localhost");
            let channel = endpoint
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(&path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(|e| connecting(&e))?;
            return Ok(Self::from_channel(channel));
        }
        let uri = if addr.contains("://") {
            addr.to_string()
        } else if tls.is_some() {
            format!("https://{addr}")
        } else {
            format!("http://{addr}")
        };
        let mut endpoint = Channel::from_shared(uri)
            .map_err(|e| MetaError::Invalid(format!("server address {addr:?}: {e}")))?
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.config()?)
                .map_err(|e| MetaError::Invalid(format!("TLS for {addr}: {e}")))?;
        }
        let channel = endpoint.connect().await.map_err(|e| connecting(&e))?;
        let mut client = Self::from_channel(channel);
        client.committer = Arc::new(committer::Committer::new(true, tls.cloned()));
        Ok(client)
    }

    /// A client over an existing channel.
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            local: None,
            conn: Arc::new(std::sync::RwLock::new(Arc::new(Conn::new(channel)))),
            failover: None,
            committer: Arc::new(committer::Committer::new(false, None)),
            caller: None,
            job: None,
            reached: Arc::new(AtomicU64::new(0)),
            outbox: None,
        }
    }

    /// Connects to the first of `addrs` that answers (each as [`Client::connect`] takes it);
    /// when the connection is lost, the client moves to the next one that answers and sends
    /// again what was in flight, mutations with their request ids.
    pub async fn connect_servers(addrs: &[String]) -> Result<Client> {
        let tls = match addrs.iter().all(|a| a.starts_with("unix:")) {
            true => None,
            false => ClientTls::from_env()?,
        };
        Self::connect_servers_with(addrs, tls.as_ref()).await
    }

    /// [`Client::connect_servers`] with the client certificate of `tls` for TCP addresses.
    pub async fn connect_servers_with(addrs: &[String], tls: Option<&ClientTls>) -> Result<Client> {
        if addrs.is_empty() {
            return Err(MetaError::Invalid("no server named".into()));
        }
        let tls = tls.cloned();
        let mut last = None;
        for (i, addr) in addrs.iter().enumerate() {
            match Self::connect_with(addr, tls.as_ref()).await {
                Ok(mut client) => {
                    client.failover = Some(Arc::new(failover::Failover::new(
                        addrs.to_vec(),
                        tls.clone(),
                        i,
                    )));
                    return Ok(client);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one address was tried"))
    }

    /// The address of the server this client is connected to, when it has a list.
    pub fn server(&self) -> Option<String> {
        let failover = self.failover.as_ref()?;
        let at = failover.at.load(Ordering::Acquire) as usize;
        failover.addrs.get(at).cloned()
    }

    pub(crate) fn conn(&self) -> Arc<Conn> {
        self.conn.read_locked().clone()
    }

    pub(crate) fn next_request(&self) -> Option<calm_types::RequestId> {
        self.failover.as_ref().map(|f| f.next_request())
    }

    /// Sends a request over the connection with `send`, again on another server of the list
    /// when the connection is lost (the calls that have no in-process path: changelog and
    /// targets).
    pub(crate) async fn remote<T, F, Fut>(&self, send: F) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let mut budget = failover::Budget::default();
        loop {
            let conn = self.conn();
            match send(conn.clone()).await {
                Err(status) if self.move_on(&status, &conn, &mut budget).await => continue,
                reply => return reply,
            }
        }
    }

    /// After `status` on a request sent over `used`: whether to send it again, on another
    /// server (moving there first if no other request did already), within `budget`.
    pub(crate) async fn move_on(
        &self,
        status: &tonic::Status,
        used: &Arc<Conn>,
        budget: &mut failover::Budget,
    ) -> bool {
        let Some(failover) = &self.failover else {
            return false;
        };
        if self.local.is_some() || !failover::connection_lost(status) || !budget.left() {
            return false;
        }
        let mut last_move = failover.moving.lock().await;
        if !Arc::ptr_eq(&self.conn(), used) {
            // Another request moved already.
            return true;
        }
        let interval = std::time::Duration::from_millis(failover::MOVE_INTERVAL_MS_MIN);
        if let Some(at) = *last_move
            && at.elapsed() < interval
        {
            tokio::time::sleep(interval - at.elapsed()).await;
        }
        let count = failover.addrs.len();
        let from = failover.at.load(Ordering::Acquire) as usize;
        while budget.left() {
            for step in 1..=count {
                let at = (from + step) % count;
                let addr = &failover.addrs[at];
                let connecting = Self::connect_with(addr, failover.tls.as_ref());
                let timeout = std::time::Duration::from_millis(failover::CONNECT_MS_MAX);
                if let Ok(Ok(client)) = tokio::time::timeout(timeout, connecting).await {
                    let conn = client.conn();
                    *self.conn.write_locked() = conn;
                    failover.at.store(at as u64, Ordering::Release);
                    failover.moves.fetch_add(1, Ordering::Relaxed);
                    *last_move = Some(std::time::Instant::now());
                    tracing::warn!(
                        from = %failover.addrs[from],
                        to = %addr,
                        %status,
                        "the connection to the server was lost; moved to another"
                    );
                    return true;
                }
            }
            failover::round_pause().await;
        }
        false
    }

    /// This client, calling the namespace and lock services of `local` (a server in this
    /// process) directly; changelog, watch and target requests still go over the connection.
    pub fn in_process(self, local: InProcess) -> Client {
        Client {
            local: Some(local),
            ..self
        }
    }

    /// This client, naming `caller` (session, uid, gid) in every mutation it sends; the
    /// server records it in the mutation's changelog record.
    pub fn with_caller(&self, caller: Caller) -> Client {
        Client {
            caller: Some(caller),
            ..self.clone()
        }
    }

    /// Who this client acts for (`None`: the server decides, as for an administrator).
    pub fn caller(&self) -> Option<&Caller> {
        self.caller.as_ref()
    }

    /// Times this client (and its clones) moved to another server of its namespace because
    /// the one in use stopped answering.
    pub fn server_moves(&self) -> u64 {
        self.failover
            .as_ref()
            .map_or(0, |f| f.moves.load(Ordering::Relaxed))
    }

    /// The same client, its requests naming `job` as the caller's job (letters, digits and
    /// `._:-` only, at most `calm_metrics::LOAD_KEY_BYTES_MAX` bytes: a mount sanitizes
    /// what it reads from a process).
    pub fn with_job(self, job: Option<Arc<str>>) -> Client {
        Client { job, ..self }
    }

    /// The highest changelog index a mutation or a lock answer of this client (or a clone)
    /// carried: once a watch stream has passed it, every change this client made, and every
    /// change made before a lock it was granted, is in the stream.
    pub fn reached(&self) -> u64 {
        self.reached.load(Ordering::Acquire)
    }

    /// [`check`] for a mutation: notes the changelog index it reached.
    pub(crate) fn mutated<T>(
        &self,
        reply: std::result::Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T> {
        self.note_index(&reply);
        check(reply)
    }

    /// Notes the changelog index an answer says the namespace reached (mutations, and lock
    /// answers: what a lock's previous holder committed is at or below it).
    pub(crate) fn note_index<T>(
        &self,
        reply: &std::result::Result<tonic::Response<T>, tonic::Status>,
    ) {
        if let Ok(response) = reply
            && let Some(index) = response
                .metadata()
                .get(calm_proto::INDEX_KEY)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        {
            self.reached.fetch_max(index, Ordering::AcqRel);
        }
    }

    pub(crate) fn tagged<T>(
        &self,
        message: T,
        id: Option<calm_types::RequestId>,
    ) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(id) = id {
            request.metadata_mut().insert(
                calm_proto::REQUEST_KEY,
                id.to_text().parse().expect("hex digits are valid metadata"),
            );
        }
        if let Some(job) = &self.job
            && let Ok(value) = job.parse()
        {
            request
                .metadata_mut()
                .insert(calm_proto::changelog::JOB_KEY, value);
        }
        if let Some(caller) = &self.caller {
            let metadata = request.metadata_mut();
            for (key, value) in [
                (SESSION_KEY, caller.session.to_string()),
                (UID_KEY, caller.uid.to_string()),
                (GID_KEY, caller.gid.to_string()),
            ] {
                metadata.insert(key, value.parse().expect("digits are valid metadata"));
            }
            if !caller.groups.as_slice().is_empty() {
                let groups: Vec<String> = caller
                    .groups
                    .as_slice()
                    .iter()
                    .map(u32::to_string)
                    .collect();
                metadata.insert(
                    GROUPS_KEY,
                    groups.join(",").parse().expect("digits are valid metadata"),
                );
            }
        }
        request
    }
}
