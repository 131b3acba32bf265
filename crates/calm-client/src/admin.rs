//! A server's status, and the targets node agents register with it.

use super::*;

impl Client {
    pub async fn status(&self) -> Result<StatusReply> {
        check(meta_call!(self, status, pb::Empty {}))
    }

    /// Registers a node's targets (soft state; `complete`: every target the node holds).
    pub async fn register_targets(&self, registration: pb::TargetRegistration) -> Result<()> {
        check(
            self.remote(|conn| {
                let request = registration.clone();
                async move { conn.targets.clone().register(request).await }
            })
            .await,
        )
        .map(|_| ())
    }

    /// Every registered target.
    pub async fn list_targets(&self) -> Result<Vec<pb::TargetEntry>> {
        Ok(check(
            self.remote(|conn| {
                let request = pb::Empty {};
                async move { conn.targets.clone().list(request).await }
            })
            .await,
        )?
        .targets)
    }
}
