//! The target registry: which node holds which target of which pool, in what state. Soft
//! state kept in memory — node agents register whenever their pools change and every few
//! seconds, so a restarted server is whole again after one round. Registering a target is O(1)
//! (a map insert); a node's complete registration also drops its targets it no longer lists.
//!
//! With several servers on one store the registry is shared: each node's targets are one
//! value in the store's registry (`calm_store::registry::Registry::put_node`), kept under the
//! lease of the server the node registered with, and every server lists all of them. A node
//! whose server dies is listed again once it registers with another (its next round).

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use calm_proto::pb;
use calm_proto::pb::targets_server::Targets as TargetsRpc;
use prost::Message;
use tonic::{Request, Response, Status};

/// Most targets the registry holds.
pub const TARGETS_MAX: usize = 1 << 20;

/// Most bytes one node's targets take in a shared registry (etcd takes 1.5 MiB per request).
pub const NODE_TARGETS_BYTES_MAX: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct TargetRegistry {
    /// Target uuid → its latest registration (alone on the store).
    targets: Mutex<HashMap<String, pb::TargetEntry>>,
    /// The store's registry, with several servers: the targets live there instead.
    shared: Option<Arc<dyn calm_store::registry::Registry>>,
    /// Registering needs an administrator (a node agent runs as root).
    auth: Arc<crate::auth::Auth>,
}

impl TargetRegistry {
    pub fn new(auth: Arc<crate::auth::Auth>) -> TargetRegistry {
        Self::with_registry(auth, None)
    }

    /// A registry kept in `shared` (the store's registry of servers), when given.
    pub fn with_registry(
        auth: Arc<crate::auth::Auth>,
        shared: Option<Arc<dyn calm_store::registry::Registry>>,
    ) -> TargetRegistry {
        TargetRegistry {
            targets: Mutex::default(),
            shared,
            auth,
        }
    }

    /// A node's registration in the shared registry: merged with what the node registered
    /// before unless it is complete, then written whole.
    async fn register_shared(
        shared: Arc<dyn calm_store::registry::Registry>,
        registration: pb::TargetRegistration,
    ) -> Result<(), Status> {
        let unavailable = |e: calm_store::StoreError| {
            Status::unavailable(format!("the shared target registry: {e}"))
        };
        tokio::task::spawn_blocking(move || {
            let node = registration.node.clone();
            let mut entries: HashMap<String, pb::TargetEntry> = HashMap::new();
            if !registration.complete
                && let Some(bytes) = shared.node(&node).map_err(unavailable)?
            {
                let before = pb::TargetList::decode(bytes.as_slice())
                    .map_err(|e| Status::internal(format!("node {node}'s targets: {e}")))?;
                entries.extend(
                    before
                        .targets
                        .into_iter()
                        .map(|t| (t.target_uuid.clone(), t)),
                );
            }
            let now = now_ms();
            for mut entry in registration.targets {
                entry.node = node.clone();
                entry.registered_ms = now;
                entries.insert(entry.target_uuid.clone(), entry);
            }
            let list = pb::TargetList {
                targets: entries.into_values().collect(),
            };
            let bytes = list.encode_to_vec();
            if bytes.len() > NODE_TARGETS_BYTES_MAX {
                return Err(Status::resource_exhausted(format!(
                    "node {node}'s targets take {} bytes; a shared registry holds at most \
                     {NODE_TARGETS_BYTES_MAX} per node",
                    bytes.len()
                )));
            }
            shared.put_node(&node, &bytes).map_err(unavailable)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
    }

    /// Every node's targets in the shared registry.
    async fn list_shared(
        shared: Arc<dyn calm_store::registry::Registry>,
    ) -> Result<Vec<pb::TargetEntry>, Status> {
        tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            for bytes in shared
                .nodes()
                .map_err(|e| Status::unavailable(format!("the shared target registry: {e}")))?
            {
                let list = pb::TargetList::decode(bytes.as_slice())
                    .map_err(|e| Status::internal(format!("a node's targets: {e}")))?;
                all.extend(list.targets);
            }
            Ok(all)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
    }

    pub fn len(&self) -> usize {
        self.targets.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[tonic::async_trait]
impl TargetsRpc for TargetRegistry {
    async fn register(
        &self,
        r: Request<pb::TargetRegistration>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.auth.admin(&r, "registering targets")?;
        let r = r.into_inner();
        if r.node.is_empty() {
            return Err(Status::invalid_argument("a registration names its node"));
        }
        if r.targets.iter().any(|t| t.target_uuid.is_empty()) {
            return Err(Status::invalid_argument("a target without a uuid"));
        }
        if let Some(shared) = &self.shared {
            Self::register_shared(shared.clone(), r).await?;
            return Ok(Response::new(pb::Empty {}));
        }
        let now = now_ms();
        let mut targets = self.targets.locked();
        if r.complete {
            let listed: std::collections::HashSet<&str> =
                r.targets.iter().map(|t| t.target_uuid.as_str()).collect();
            targets.retain(|uuid, t| t.node != r.node || listed.contains(uuid.as_str()));
        }
        for mut entry in r.targets {
            if entry.target_uuid.is_empty() {
                return Err(Status::invalid_argument("a target without a uuid"));
            }
            if !targets.contains_key(&entry.target_uuid) && targets.len() >= TARGETS_MAX {
                return Err(Status::resource_exhausted(format!(
                    "the registry holds {TARGETS_MAX} targets"
                )));
            }
            entry.node = r.node.clone();
            entry.registered_ms = now;
            targets.insert(entry.target_uuid.clone(), entry);
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn list(&self, r: Request<pb::Empty>) -> Result<Response<pb::TargetList>, Status> {
        self.auth.identity(&r)?;
        let mut list: Vec<pb::TargetEntry> = match &self.shared {
            Some(shared) => Self::list_shared(shared.clone()).await?,
            None => self.targets.locked().values().cloned().collect(),
        };
        list.sort_by(|a, b| {
            (a.pool_name.as_str(), a.generation, a.index).cmp(&(
                b.pool_name.as_str(),
                b.generation,
                b.index,
            ))
        });
        Ok(Response::new(pb::TargetList { targets: list }))
    }
}
