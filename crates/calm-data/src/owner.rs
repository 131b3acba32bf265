//! Which namespace owns an object store: the only one that deletes from it.
//!
//! An object store names its owner in a small file beside the objects (`namespace/owner`),
//! holding the owner's claim (random bytes the owning namespace keeps in its superblock).
//! A server claims its object store when it starts: an object store that names no owner
//! becomes its own, one that names it is its own, one that names another is refused (one it
//! cannot reach then is claimed before its first deletion). A server
//! deletes through a [`Objects::fenced`] handle, which reads the owner again before a deletion
//! (at most once a second): when another namespace took the store over (`calm load
//! --take-over-objects`, the way back from a lost metadata store), the old one deletes
//! nothing more from it. A loaded copy that keeps the original alive has a store of its own
//! (`calm load --objects`), its objects copied there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm_types::sync::Locked;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::error::DataError;
use crate::objects::{Fence, Objects};

/// Where, beside the objects, the owner is named.
pub const OWNER_DIR: &str = "namespace";
pub const OWNER_FILE: &str = "owner";
/// How long a check that this namespace owns the store holds before a deletion reads it again.
pub const OWNER_CHECK_EVERY: Duration = Duration::from_secs(1);
/// The longest claim an owner file may hold.
const CLAIM_BYTES_MAX: usize = 256;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Objects {
    fn owner_path(&self) -> Path {
        self.root.clone().join(OWNER_DIR).join(OWNER_FILE)
    }

    /// The claim the store's owner file holds (`None`: it names no owner).
    pub async fn owner(&self) -> Result<Option<Vec<u8>>, DataError> {
        let got = match self.store.get(&self.owner_path()).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let bytes = got.bytes().await?;
        if bytes.len() > CLAIM_BYTES_MAX {
            return Err(DataError::Corrupt(format!(
                "{}: the owner file holds {} bytes",
                self.url(),
                bytes.len()
            )));
        }
        Ok(Some(bytes.to_vec()))
    }

    /// Makes the store this claim's when it names no owner; an error when it names another.
    pub async fn claim(&self, claim: &[u8]) -> Result<(), DataError> {
        match self.owner().await? {
            Some(owner) if owner == claim => Ok(()),
            Some(owner) => Err(DataError::Taken(format!(
                "{} belongs to another namespace (owner {}, this namespace {}): a loaded copy \
                 keeps its files in a store of its own, and an object store taken over by a \
                 load no longer serves the namespace it was taken from",
                self.url(),
                hex(&owner),
                hex(claim)
            ))),
            None => self.take_over(claim).await,
        }
    }

    /// Makes the store this claim's, whoever owned it: its owner until now deletes nothing
    /// more from it.
    pub async fn take_over(&self, claim: &[u8]) -> Result<(), DataError> {
        self.store
            .put(&self.owner_path(), PutPayload::from(claim.to_vec()))
            .await?;
        Ok(())
    }

    /// This handle, deleting only while the store's owner is `claim`.
    pub fn fenced(mut self, claim: Vec<u8>) -> Objects {
        self.fence = Some(Arc::new(Fence {
            claim,
            checked: Mutex::new(None),
        }));
        self
    }

    /// Before a deletion: an error when this handle is fenced and the store's owner is no
    /// longer its claim.
    pub async fn check_owner(&self) -> Result<(), DataError> {
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        if fence
            .checked
            .locked()
            .is_some_and(|at| at.elapsed() < OWNER_CHECK_EVERY)
        {
            return Ok(());
        }
        match self.owner().await? {
            Some(owner) if owner == fence.claim => {
                *fence.checked.locked() = Some(Instant::now());
                Ok(())
            }
            // Not claimed yet (the store could not be reached when the server started).
            None => {
                self.take_over(&fence.claim).await?;
                *fence.checked.locked() = Some(Instant::now());
                Ok(())
            }
            owner => {
                *fence.checked.locked() = None;
                Err(DataError::Taken(format!(
                    "{} is no longer this namespace's (its owner is {}): nothing is deleted \
                     from it",
                    self.url(),
                    owner.as_deref().map(hex).unwrap_or_default()
                )))
            }
        }
    }
}
