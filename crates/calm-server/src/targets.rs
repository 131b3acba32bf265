//! The target registry: which node holds which target of which pool, in what state. Soft
//! state kept in memory — node agents register whenever their pools change and every few
//! seconds, so a restarted server is whole again after one round. Registering a target is O(1)
//! (a map insert); a node's complete registration also drops its targets it no longer lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use calm_proto::pb;
use calm_proto::pb::targets_server::Targets as TargetsRpc;
use tonic::{Request, Response, Status};

/// Most targets the registry holds.
pub const TARGETS_MAX: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct TargetRegistry {
    /// Target uuid → its latest registration.
    targets: Mutex<HashMap<String, pb::TargetEntry>>,
    /// Registering needs an administrator (a node agent runs as root).
    auth: Arc<crate::auth::Auth>,
}

impl TargetRegistry {
    pub fn new(auth: Arc<crate::auth::Auth>) -> TargetRegistry {
        TargetRegistry {
            targets: Mutex::default(),
            auth,
        }
    }

    pub fn len(&self) -> usize {
        self.targets.lock().expect("registry").len()
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
        let now = now_ms();
        let mut targets = self.targets.lock().expect("registry");
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
        let mut list: Vec<pb::TargetEntry> = self
            .targets
            .lock()
            .expect("registry")
            .values()
            .cloned()
            .collect();
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
