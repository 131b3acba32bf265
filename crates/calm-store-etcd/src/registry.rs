//! The registry of the servers sharing a namespace on etcd (`calm_store::registry`):
//!
//! | key | value | lifetime |
//! |---|---|---|
//! | `PREFIX/c/m/<id, 16 hex>` | the address clients reach the server at | the server's lease |
//! | `PREFIX/c/a/<id>` | the view it decides by: member ids in hex, comma-separated | its lease |
//! | `PREFIX/c/h/<session, 16 hex>` | the identity that opened it: a client lock session the server opened | until closed or expired, or the server's holders lease ran out (`holders_ms` after its last renewal) |
//! | `PREFIX/c/t/<node, hex of its name>` | the node's targets (`calm.v1.TargetList`) | the lease of the server it registered with |
//!
//! Every call is one attempt bounded by the store's `attempt_ms_max` (a renewal that cannot
//! reach the cluster in time must say so, not retry past the lease).

use calm_types::sync::Locked;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm_store::registry::{MEMBERS_MAX, Members, Registry};
use calm_store::{Result, StoreError};
use etcd_client::{GetOptions, PutOptions, WatchOptions};

use crate::Inner;

/// How the etcd client library words a keep-alive of a lease that ran out.
const LEASE_NOT_FOUND: &str = "lease not found";

#[derive(Debug, Default, Clone, Copy)]
struct Joined {
    id: u64,
    lease: i64,
    /// The lease of the sessions recorded (longer: they outlive the server).
    holders: i64,
}

pub(crate) struct EtcdRegistry {
    inner: Arc<Inner>,
    joined: Mutex<Option<Joined>>,
    /// Signalled when the server joins.
    joining: std::sync::Condvar,
    members: Vec<u8>,
    acks: Vec<u8>,
    holders: Vec<u8>,
    nodes: Vec<u8>,
}

impl std::fmt::Debug for EtcdRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRegistry")
            .field("prefix", &self.inner.options.prefix)
            .finish()
    }
}

fn hex_id(bytes: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(bytes).ok()?, 16).ok()
}

fn etcd(error: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("etcd registry: {error}"))
}

impl EtcdRegistry {
    pub(crate) fn new(inner: Arc<Inner>) -> EtcdRegistry {
        let base = inner.options.prefix.as_bytes().to_vec();
        let key = |suffix: &[u8]| [base.as_slice(), suffix].concat();
        EtcdRegistry {
            members: key(b"/c/m/"),
            acks: key(b"/c/a/"),
            holders: key(b"/c/h/"),
            nodes: key(b"/c/t/"),
            joined: Mutex::new(None),
            joining: std::sync::Condvar::new(),
            inner,
        }
    }

    fn joined(&self) -> Result<(u64, i64)> {
        let joined = self.joined.locked();
        joined
            .as_ref()
            .map(|j| (j.id, j.lease))
            .ok_or_else(|| StoreError::Io("etcd registry: not joined".into()))
    }

    /// The holders' lease, once the server joined (waiting up to one call's bound).
    fn holders_lease(&self) -> Result<i64> {
        let budget = Duration::from_millis(self.inner.options.attempt_ms_max);
        let joined = self.joined.locked();
        let (joined, _) = self
            .joining
            .wait_timeout_while(joined, budget, |j| j.is_none())
            .unwrap_or_else(|p| p.into_inner());
        joined
            .map(|j| j.holders)
            .ok_or_else(|| StoreError::Io("etcd registry: the server has not joined yet".into()))
    }

    /// A lease of about `ms`; returns its id and the time granted.
    fn grant(&self, ms: u64) -> Result<(i64, u64)> {
        let ttl_s = ms.div_ceil(1000).max(1) as i64;
        let grant =
            self.once(move |mut client| async move { client.lease_grant(ttl_s, None).await })?;
        Ok((grant.id(), (grant.ttl().max(1) as u64) * 1000))
    }

    /// Renews `lease` once; whether it was still alive.
    fn keep_alive(&self, lease: i64) -> Result<bool> {
        let ttl = self.once(move |mut client| async move {
            let (mut keeper, mut stream) = match client.lease_keep_alive(lease).await {
                Ok(kept) => kept,
                // The cluster answered that the lease ran out (a TTL of 0), which the client
                // library reports as this error: an answer, not a failure to reach it.
                Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == LEASE_NOT_FOUND => {
                    return Ok(0);
                }
                Err(e) => return Err(e),
            };
            keeper.keep_alive().await?;
            Ok(stream.message().await?.map_or(0, |r| r.ttl()))
        })?;
        Ok(ttl > 0)
    }

    /// Runs one attempt of `request` on the store's runtime, within `attempt_ms_max`.
    fn once<T, F, Fut>(&self, request: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(etcd_client::Client) -> Fut + Send + 'static,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
    {
        let inner = self.inner.clone();
        let budget = Duration::from_millis(self.inner.options.attempt_ms_max);
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.inner.handle().spawn(async move {
            let (member, client) = inner.endpoints.client().await;
            let outcome = match client {
                Err(error) => Err(etcd(error)),
                Ok(client) => match tokio::time::timeout(budget, request(client)).await {
                    Ok(outcome) => outcome.map_err(etcd),
                    Err(_) => Err(StoreError::Io("etcd registry: request timed out".into())),
                },
            };
            if outcome.is_err() {
                // The next call tries the next member (a registry call is one attempt: the
                // caller's round comes again within a third of its lease).
                inner.endpoints.failed(member);
            }
            let _ = sender.send(outcome);
        });
        receiver
            .recv()
            .map_err(|_| StoreError::Io("etcd: the store's runtime stopped".into()))?
    }

    /// `[/c/a/, end of /c/m/)`: the acknowledgements and the members, in one range.
    fn acks_and_members(&self) -> (Vec<u8>, Vec<u8>) {
        (self.acks.clone(), calm_store::prefix_end(&self.members))
    }

    fn node_key(&self, node: &str) -> Vec<u8> {
        let hex: String = node.bytes().map(|b| format!("{b:02x}")).collect();
        [self.nodes.as_slice(), hex.as_bytes()].concat()
    }

    fn key(base: &[u8], id: u64) -> Vec<u8> {
        [base, format!("{id:016x}").as_bytes()].concat()
    }
}

impl Registry for EtcdRegistry {
    fn join(&self, id: u64, address: &str, lease_ms: u64, holders_ms: u64) -> Result<u64> {
        let (lease, granted_ms) = self.grant(lease_ms)?;
        let (holders, _) = self.grant(holders_ms.max(lease_ms))?;
        let key = Self::key(&self.members, id);
        let address = address.to_string();
        self.once(move |mut client| async move {
            client
                .put(key, address, Some(PutOptions::new().with_lease(lease)))
                .await
        })?;
        *self.joined.locked() = Some(Joined { id, lease, holders });
        self.joining.notify_all();
        Ok(granted_ms)
    }

    fn renew(&self) -> Result<bool> {
        let Some(joined) = *self.joined.locked() else {
            return Err(StoreError::Io("etcd registry: not joined".into()));
        };
        let member = self.keep_alive(joined.lease)?;
        let holders = self.keep_alive(joined.holders)?;
        Ok(member && holders)
    }

    fn members(&self) -> Result<Members> {
        let (start, end) = self.acks_and_members();
        let response = self.once(move |mut client| async move {
            client
                .get(
                    start,
                    Some(
                        GetOptions::new()
                            .with_range(end)
                            .with_limit(2 * MEMBERS_MAX as i64),
                    ),
                )
                .await
        })?;
        let mut members = Members::default();
        for kv in response.kvs() {
            if let Some(id) = kv.key().strip_prefix(self.members.as_slice()) {
                if let Some(id) = hex_id(id) {
                    members
                        .servers
                        .push((id, String::from_utf8_lossy(kv.value()).into_owned()));
                }
            } else if let Some(id) = kv.key().strip_prefix(self.acks.as_slice())
                && let Some(id) = hex_id(id)
            {
                let view = std::str::from_utf8(kv.value())
                    .unwrap_or("")
                    .split(',')
                    .filter_map(|s| hex_id(s.as_bytes()))
                    .collect();
                members.acks.push((id, view));
            }
        }
        Ok(members)
    }

    fn ack(&self, view: &[u64]) -> Result<()> {
        let (id, lease) = self.joined()?;
        let key = Self::key(&self.acks, id);
        let value = view
            .iter()
            .map(|s| format!("{s:016x}"))
            .collect::<Vec<_>>()
            .join(",");
        self.once(move |mut client| async move {
            client
                .put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await
        })?;
        Ok(())
    }

    fn hold(&self, session: u64, owner: &str) -> Result<()> {
        let lease = self.holders_lease()?;
        let key = Self::key(&self.holders, session);
        let owner = owner.to_string();
        self.once(move |mut client| async move {
            client
                .put(key, owner, Some(PutOptions::new().with_lease(lease)))
                .await
        })?;
        Ok(())
    }

    fn unhold(&self, session: u64) -> Result<()> {
        let key = Self::key(&self.holders, session);
        self.once(move |mut client| async move { client.delete(key, None).await })?;
        Ok(())
    }

    fn holders(&self) -> Result<Vec<(u64, String)>> {
        let start = self.holders.clone();
        let response = self.once(move |mut client| async move {
            client
                .get(start, Some(GetOptions::new().with_prefix()))
                .await
        })?;
        Ok(response
            .kvs()
            .iter()
            .filter_map(|kv| {
                let session = hex_id(kv.key().strip_prefix(self.holders.as_slice())?)?;
                Some((session, String::from_utf8_lossy(kv.value()).into_owned()))
            })
            .collect())
    }

    fn put_node(&self, node: &str, value: &[u8]) -> Result<()> {
        let (_, lease) = self.joined()?;
        let key = self.node_key(node);
        let value = value.to_vec();
        self.once(move |mut client| async move {
            client
                .put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await
        })?;
        Ok(())
    }

    fn node(&self, node: &str) -> Result<Option<Vec<u8>>> {
        let key = self.node_key(node);
        let response = self.once(move |mut client| async move { client.get(key, None).await })?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    fn nodes(&self) -> Result<Vec<Vec<u8>>> {
        let start = self.nodes.clone();
        let response = self.once(move |mut client| async move {
            client
                .get(start, Some(GetOptions::new().with_prefix()))
                .await
        })?;
        Ok(response
            .kvs()
            .iter()
            .map(|kv| kv.value().to_vec())
            .collect())
    }

    fn watch(&self) -> Result<std::sync::mpsc::Receiver<()>> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let inner = self.inner.clone();
        let (start, end) = self.acks_and_members();
        self.inner.handle().spawn(async move {
            loop {
                let (member, client) = inner.endpoints.client().await;
                let watched = match client {
                    Ok(mut client) => {
                        client
                            .watch(
                                start.clone(),
                                Some(WatchOptions::new().with_range(end.clone())),
                            )
                            .await
                    }
                    Err(error) => Err(error),
                };
                let mut stream = match watched {
                    Ok(stream) => stream,
                    Err(error) => {
                        inner.endpoints.failed(member);
                        tracing::warn!(%error, "etcd: watching the servers; trying again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                // A (re)started watch may have missed changes: say so once.
                if let Err(std::sync::mpsc::TrySendError::Disconnected(())) = sender.try_send(()) {
                    return;
                }
                while let Ok(Some(response)) = stream.message().await {
                    if !response.events().is_empty() || response.canceled() {
                        match sender.try_send(()) {
                            Ok(()) | Err(std::sync::mpsc::TrySendError::Full(())) => {}
                            Err(std::sync::mpsc::TrySendError::Disconnected(())) => return,
                        }
                    }
                    if response.canceled() {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Ok(receiver)
    }

    fn leave(&self) -> Result<()> {
        let Some(joined) = self.joined.locked().take() else {
            return Ok(());
        };
        let lease = joined.lease;
        self.once(move |mut client| async move { client.lease_revoke(lease).await })?;
        Ok(())
    }
}
