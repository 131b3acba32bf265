//! The changelog calls of a [`Client`]: readers (register, deregister, list, mask), reads,
//! follows and clears.

use super::*;

/// Records asked for per read of [`Client::changelog_each`].
pub const CL_EACH_BATCH_RECORDS: u32 = 4096;

impl Client {
    /// Registers a changelog reader; `mask` is Lustre's type names, comma-separated (empty:
    /// DEFAULT).
    pub async fn changelog_register(&self, name: &str, mask: &str) -> Result<User> {
        let request = pb::ClRegisterRequest {
            name: name.to_string(),
            mask: mask.to_string(),
        };
        user_from_wire(&check(
            self.conn().changelog.clone().register(request).await,
        )?)
    }

    pub async fn changelog_deregister(&self, id: UserId) -> Result<User> {
        let request = pb::ClUserRequest { id };
        user_from_wire(&check(
            self.conn().changelog.clone().deregister(request).await,
        )?)
    }

    /// The last index, the first stored, the global mask and every reader.
    pub async fn changelog_users(&self) -> Result<pb::ClUsersReply> {
        check(
            self.remote(|conn| {
                let request = pb::Empty {};
                async move { conn.changelog.clone().users(request).await }
            })
            .await,
        )
    }

    /// Records from `from` (after what `user` cleared, within its mask); when there are none
    /// yet, waits up to `wait_ms` for some. Returns them and the last index.
    pub async fn changelog_read(
        &self,
        from: u64,
        max_records: u32,
        user: Option<UserId>,
        wait_ms: u32,
    ) -> Result<(Vec<Record>, u64)> {
        self.changelog_follow(
            from,
            max_records,
            user,
            FollowWait {
                wait_ms,
                ..FollowWait::default()
            },
        )
        .await
    }

    /// [`Client::changelog_read`] for a batching follower: see [`FollowWait`].
    pub async fn changelog_follow(
        &self,
        from: u64,
        max_records: u32,
        user: Option<UserId>,
        wait: FollowWait,
    ) -> Result<(Vec<Record>, u64)> {
        let request = pb::ClReadRequest {
            from,
            max_records,
            max_bytes: 0,
            user,
            wait_ms: wait.wait_ms,
            min_records: wait.min_records,
            linger_us: wait.linger_us,
        };
        let reply = check(
            self.remote(|conn| async move { conn.changelog.clone().read(request).await })
                .await,
        )?;
        let records = reply
            .records
            .iter()
            .map(record_from_wire)
            .collect::<Result<_>>()?;
        Ok((records, reply.last))
    }

    /// Hands `batch` the records from `from` on, in order, a batch at a time and at most `max`
    /// in all (0: no limit); with `user`, those after its cleared index and within its mask.
    /// Without a wait (`wait.wait_ms == 0`) it ends at the last record; with one it follows the
    /// records as they are committed, until `max` or an error (its own or `batch`'s).
    pub async fn changelog_each<E: From<MetaError>>(
        &self,
        from: u64,
        user: Option<UserId>,
        wait: FollowWait,
        max: u64,
        mut batch: impl FnMut(&[Record]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut next = from;
        let mut left = if max == 0 { u64::MAX } else { max };
        loop {
            let (records, _last) = self
                .changelog_follow(next, CL_EACH_BATCH_RECORDS, user, wait)
                .await?;
            if records.is_empty() && wait.wait_ms == 0 {
                return Ok(());
            }
            let taken = &records[..records.len().min(left.min(usize::MAX as u64) as usize)];
            batch(taken)?;
            left -= taken.len() as u64;
            if left == 0 {
                return Ok(());
            }
            if let Some(last) = taken.last() {
                next = last.index + 1;
            }
        }
    }

    pub async fn changelog_clear(&self, id: UserId, index: u64) -> Result<User> {
        let request = pb::ClClearRequest { id, index };
        user_from_wire(&check(
            self.remote(|conn| async move { conn.changelog.clone().clear(request).await })
                .await,
        )?)
    }

    pub async fn changelog_set_mask(&self, id: UserId, mask: &str) -> Result<User> {
        let request = pb::ClMaskRequest {
            id,
            mask: mask.to_string(),
        };
        user_from_wire(&check(
            self.remote(|conn| {
                let request = request.clone();
                async move { conn.changelog.clone().set_mask(request).await }
            })
            .await,
        )?)
    }
}
