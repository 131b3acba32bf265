//! The changelog service: readers' registration and cursors go through the namespace's
//! committer (they are durable state); reads run on snapshots; a follow read waits on the
//! committer's last index (a long poll), never on a timer.

use std::sync::Arc;
use std::time::Duration;

use calm_meta::{Follow, Meta, MetaError};
use calm_proto::changelog::{
    CL_LINGER_US_MAX, CL_WAIT_MS_MAX, mask_from_wire, record_to_wire, user_to_wire,
};
use calm_proto::pb::changelog_server::Changelog as ChangelogRpc;
use calm_proto::{pb, status_from_error};
use calm_store::Store;
use tonic::{Request, Response, Status};

#[derive(Debug)]
pub struct ChangelogService<S: Store> {
    meta: Arc<Meta<S>>,
    /// Readers are administered by administrators; records are read by mounts and
    /// administrators (they name every change, in directories a user may not see).
    auth: Arc<crate::auth::Auth>,
}

impl<S: Store> ChangelogService<S> {
    pub fn new(meta: Arc<Meta<S>>, auth: Arc<crate::auth::Auth>) -> Self {
        ChangelogService { meta, auth }
    }
}

fn answer<T, U>(
    result: Result<T, MetaError>,
    map: impl FnOnce(T) -> U,
) -> Result<Response<U>, Status> {
    result
        .map(|value| Response::new(map(value)))
        .map_err(|error| status_from_error(&error))
}

#[tonic::async_trait]
impl<S: Store> ChangelogRpc for ChangelogService<S> {
    async fn register(
        &self,
        r: Request<pb::ClRegisterRequest>,
    ) -> Result<Response<pb::ClUser>, Status> {
        self.auth.admin(&r, "registering a changelog reader")?;
        let r = r.into_inner();
        let result = match mask_from_wire(&r.mask) {
            Ok(mask) => self.meta.changelog_register(&r.name, mask).await,
            Err(error) => Err(error),
        };
        answer(result, |user| user_to_wire(&user))
    }

    async fn deregister(
        &self,
        r: Request<pb::ClUserRequest>,
    ) -> Result<Response<pb::ClUser>, Status> {
        self.auth.admin(&r, "deregistering a changelog reader")?;
        let result = self.meta.changelog_deregister(r.into_inner().id).await;
        answer(result, |user| user_to_wire(&user))
    }

    async fn users(&self, r: Request<pb::Empty>) -> Result<Response<pb::ClUsersReply>, Status> {
        self.auth.trusted(&r, "the changelog's readers")?;
        answer(self.meta.changelog_users(), |users| {
            let global = users
                .users
                .iter()
                .fold(calm_changelog::Mask::NONE, |m, u| m.union(u.mask));
            pb::ClUsersReply {
                last: users.last,
                first: users.first,
                users: users.users.iter().map(user_to_wire).collect(),
                global_mask: global.names(),
            }
        })
    }

    async fn read(
        &self,
        r: Request<pb::ClReadRequest>,
    ) -> Result<Response<pb::ClReadReply>, Status> {
        self.auth.trusted(&r, "reading the changelog")?;
        let r = r.into_inner();
        let limit = |n: u32| if n == 0 { usize::MAX } else { n as usize };
        let follow = Follow {
            wait: Duration::from_millis(u64::from(r.wait_ms.min(CL_WAIT_MS_MAX))),
            min_records: r.min_records as usize,
            linger: Duration::from_micros(u64::from(r.linger_us.min(CL_LINGER_US_MAX))),
        };
        let records = self
            .meta
            .changelog_follow(
                r.from,
                limit(r.max_records),
                limit(r.max_bytes),
                r.user,
                follow,
            )
            .await
            .map_err(|e| status_from_error(&e))?;
        // At least the last record read: a snapshot may show a commit's records a moment
        // before the committer publishes its index.
        let read_up_to = records.last().map_or(0, |r| r.index);
        let last = self.meta.changelog_last().max(read_up_to);
        Ok(Response::new(pb::ClReadReply {
            records: records.iter().map(record_to_wire).collect(),
            last,
        }))
    }

    async fn clear(&self, r: Request<pb::ClClearRequest>) -> Result<Response<pb::ClUser>, Status> {
        self.auth.admin(&r, "clearing a changelog reader")?;
        let r = r.into_inner();
        let result = self.meta.changelog_clear(r.id, r.index).await;
        answer(result, |user| user_to_wire(&user))
    }

    async fn set_mask(
        &self,
        r: Request<pb::ClMaskRequest>,
    ) -> Result<Response<pb::ClUser>, Status> {
        self.auth.admin(&r, "changing a changelog reader's mask")?;
        let r = r.into_inner();
        let result = match mask_from_wire(&r.mask) {
            Ok(mask) => self.meta.changelog_set_mask(r.id, mask).await,
            Err(error) => Err(error),
        };
        answer(result, |user| user_to_wire(&user))
    }
}
