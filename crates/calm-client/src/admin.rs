//! A server's status, and the targets node agents register with it.

use super::*;

impl Client {
    pub async fn status(&self) -> Result<StatusReply> {
        check(meta_call!(self, status, pb::Empty {}))
    }

    /// The objects no file names, older than `grace_s`, found (and with `delete` removed) by
    /// the server while it serves (an administrator's call).
    pub async fn gc(&self, grace_s: u64, delete: bool) -> Result<pb::GcReply> {
        let conn = self.conn();
        let request = self.tagged(pb::GcRequest { grace_s, delete }, None);
        check(conn.protect.clone().gc(request).await)
    }

    /// The server's dump of the whole namespace at one snapshot (an administrator's call),
    /// written to `out` as it arrives. Returns its length in bytes. Not sent again on another
    /// server: a dump cut short is an error, and the caller starts it again.
    pub async fn dump(&self, out: &mut (dyn std::io::Write + Send)) -> Result<u64> {
        if self.local.is_some() {
            return Err(MetaError::Invalid(
                "a dump is asked of a server through its address".into(),
            ));
        }
        let conn = self.conn();
        let request = self.tagged(pb::Empty {}, None);
        let mut stream = check(conn.protect.clone().dump(request).await)?;
        let mut bytes = 0u64;
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    out.write_all(&chunk.data)
                        .map_err(|e| MetaError::Io(format!("writing the dump: {e}")))?;
                    bytes += chunk.data.len() as u64;
                }
                Ok(None) => return Ok(bytes),
                Err(status) => return Err(error_from_status(&status)),
            }
        }
    }

    /// A page of entries of the trash with a handle above `after`, at most `max`: every one
    /// for an administrator, the caller's own for anyone else; and where the next page begins
    /// (`next`, 0 at the end: a page may hold few entries, or none, before it).
    pub async fn trash_list(&self, after: u64, max: u32) -> Result<pb::TrashListReply> {
        let conn = self.conn();
        let request = self.tagged(pb::TrashListRequest { after, max }, None);
        check(conn.protect.clone().trash_list(request).await)
    }

    /// Names entry `handle` of the trash again; answers where and under which name.
    pub async fn trash_restore(&self, handle: u64) -> Result<pb::TrashRestoreReply> {
        let conn = self.conn();
        let request = self.tagged(pb::HandleRequest { handle }, None);
        check(conn.protect.clone().trash_restore(request).await)
    }

    /// Destroys entry `handle` of the trash.
    pub async fn trash_purge(&self, handle: u64) -> Result<()> {
        let conn = self.conn();
        let request = self.tagged(pb::HandleRequest { handle }, None);
        check(conn.protect.clone().trash_purge(request).await).map(|_| ())
    }

    /// Clones node `src` as `name` in `parent` (a directory empty: [`Client::clone_entries`]
    /// fills it).
    pub async fn clone_node(&self, src: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        let conn = self.conn();
        let request = pb::CloneRequest {
            src,
            parent,
            name: name.to_vec(),
        };
        let attr = check(
            conn.protect
                .clone()
                .clone_node(self.tagged(request, None))
                .await,
        )?;
        Attr::try_from(attr)
    }

    /// Clones up to `max` entries of directory `src` (after `after`) into `dst`.
    pub async fn clone_entries(
        &self,
        src: u64,
        dst: u64,
        after: Vec<u8>,
        max: u32,
    ) -> Result<pb::CloneEntriesReply> {
        let conn = self.conn();
        let request = pb::CloneEntriesRequest {
            src,
            dst,
            after,
            max,
        };
        check(
            conn.protect
                .clone()
                .clone_entries(self.tagged(request, None))
                .await,
        )
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
