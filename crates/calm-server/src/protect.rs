//! The protection service (`calm.v1.Protect`): what guards a namespace against a mistake and
//! a loss, as calls of a running server: the trash (listed, restored, purged), clones, a dump
//! streamed to an administrator (`calm dump --server`) and the collection of objects no file
//! names (`calm gc --server`). The dumps a server writes itself, and loads, are
//! [`crate::backup`]'s.

use std::io::Write;
use std::sync::Arc;

use calm_data::Objects;
use calm_meta::Meta;
use calm_proto::pb;
use calm_store::Store;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::auth;
use crate::backup::{dump_namespace, now_ns};
use calm_meta::dump::DumpError;

/// Bytes of one message of a streamed dump.
pub const DUMP_CHUNK_BYTES: usize = 1 << 20;
/// Messages of a streamed dump queued for a slow reader (the dump waits beyond them): what a
/// dump holds in memory besides its frame.
const DUMP_CHUNKS_QUEUED: usize = 4;

/// The protection service (`calm.v1.Protect`).
#[derive(Debug)]
pub struct ProtectService<S: Store> {
    meta: Arc<Meta<S>>,
    auth: Arc<auth::Auth>,
    /// The object store, for gc (`None`: a namespace without one).
    objects: Option<Objects>,
    /// Listings of the trash under way.
    listings: Arc<Listings>,
    /// Files mounts hold: a dump or a clone has them given back first.
    pub(crate) holds: Option<Arc<crate::holds::Holds>>,
}

impl<S: Store> ProtectService<S> {
    pub fn new(meta: Arc<Meta<S>>, auth: Arc<auth::Auth>, objects: Option<Objects>) -> Self {
        ProtectService {
            meta,
            auth,
            objects,
            listings: Arc::new(Listings::default()),
            holds: None,
        }
    }

    /// The same service, with the files mounts hold.
    pub(crate) fn holding(mut self, holds: Option<Arc<crate::holds::Holds>>) -> Self {
        self.holds = holds;
        self
    }

    /// Has every file a mount holds given back (what a dump or a clone reads must be what the
    /// holders answered, and what a clone or a restore makes must be in the directories they
    /// know); the pass returned is held until the change is applied (`crate::holds::gate`).
    #[must_use = "a pass counts only while it is held"]
    async fn recall_all(&self, session: u64) -> Option<crate::holds::gate::Pass<'_>> {
        let holds = self.holds.as_deref()?;
        let pass = holds.enter();
        holds.recall(session, crate::holds::Recall::All).await;
        Some(pass)
    }
}

/// Pages of the trash one user may have listed at once: more are refused.
pub const TRASH_LISTINGS_PER_USER_MAX: usize = 2;
/// Pages of the trash listed at once, everyone's: more wait their turn.
pub const TRASH_LISTINGS_MAX: usize = 8;

/// The listings of the trash under way: [`TRASH_LISTINGS_PER_USER_MAX`] per user, and
/// [`TRASH_LISTINGS_MAX`] in all. A page's memory is bounded (its entries read, its names and
/// paths), so these bound what listings hold whoever sends them.
#[derive(Debug)]
pub struct Listings {
    by_user: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    all: Arc<tokio::sync::Semaphore>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings {
            by_user: std::sync::Mutex::default(),
            all: Arc::new(tokio::sync::Semaphore::new(TRASH_LISTINGS_MAX)),
        }
    }
}

/// A listing's place, given back when dropped.
struct Listing {
    listings: Arc<Listings>,
    uid: u32,
    turn: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Listings {
    async fn enter(self: &Arc<Self>, uid: u32) -> Result<Listing, Status> {
        {
            let mut by_user = self.by_user.lock().unwrap_or_else(|p| p.into_inner());
            let n = by_user.entry(uid).or_default();
            if *n >= TRASH_LISTINGS_PER_USER_MAX {
                return Err(Status::resource_exhausted(format!(
                    "user {uid} lists the trash {TRASH_LISTINGS_PER_USER_MAX} times at once \
                     already: wait for one to end"
                )));
            }
            *n += 1;
        }
        let mut listing = Listing {
            listings: self.clone(),
            uid,
            turn: None,
        };
        listing.turn = Some(
            self.all
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Status::unavailable("the server is stopping"))?,
        );
        Ok(listing)
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        let mut by_user = self
            .listings
            .by_user
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_user.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                by_user.remove(&self.uid);
            }
        }
    }
}

/// What an online gc found and did.
#[derive(Debug)]
pub struct OnlineGc {
    pub audit: calm_data::audit::Audit,
    /// Candidates a commit named before the mark reached it: kept, and unmarked.
    pub named_after_all: u64,
    pub deleted: u64,
}

/// The slices the namespace names now (records and the deletion queue), by id.
async fn referenced_now<S: Store>(
    meta: &Arc<Meta<S>>,
) -> Result<Vec<calm_data::audit::Referenced>, String> {
    let meta = meta.clone();
    tokio::task::spawn_blocking(move || {
        let snapshot = meta.store().snapshot().map_err(|e| e.to_string())?;
        let referenced =
            calm_meta::data::referenced_objects(&snapshot).map_err(|e| e.to_string())?;
        Ok(crate::offline::merged(&referenced))
    })
    .await
    .map_err(|e| format!("reading the namespace: {e}"))?
}

/// Finds the objects no file names, older than `grace_s`, while the namespace is served; with
/// `delete`, removes them. No commit names an object it removes: the candidates are first
/// marked collected (from the mark on, a mutation naming one is refused with ESTALE: its
/// writer uploaded the object longer than the grace ago without naming it), then the names are
/// read again, and a candidate a commit named before its mark is kept and unmarked.
pub async fn collect_online<S: Store>(
    meta: &Arc<Meta<S>>,
    objects: &Objects,
    grace_s: u64,
    delete: bool,
) -> Result<OnlineGc, String> {
    let grace_ms = (grace_s.min(i64::MAX as u64 / 1000) * 1000) as i64;
    let listed = objects
        .list()
        .await
        .map_err(|e| format!("listing {}: {e}", objects.url()))?;
    let referenced = referenced_now(meta).await?;
    let now_ms = now_ns() / 1_000_000;
    let mut audit = calm_data::audit::audit(&referenced, &listed, now_ms, grace_ms);
    if !delete || audit.leaked.is_empty() {
        return Ok(OnlineGc {
            audit,
            named_after_all: 0,
            deleted: 0,
        });
    }
    let mut ids: Vec<u64> = audit.leaked.iter().map(|o| o.id).collect();
    ids.sort_unstable();
    ids.dedup();
    for part in ids.chunks(calm_meta::ops::data::COLLECTED_PER_OP_MAX) {
        meta.mark_collected(part.to_vec(), true)
            .await
            .map_err(|e| format!("marking objects collected: {e}"))?;
    }
    let again: std::collections::HashSet<u64> =
        referenced_now(meta).await?.iter().map(|r| r.id).collect();
    let named: Vec<u64> = ids.into_iter().filter(|id| again.contains(id)).collect();
    for part in named.chunks(calm_meta::ops::data::COLLECTED_PER_OP_MAX) {
        meta.mark_collected(part.to_vec(), false)
            .await
            .map_err(|e| format!("unmarking objects named after all: {e}"))?;
    }
    audit.leaked.retain(|o| named.binary_search(&o.id).is_err());
    let deleted = calm_data::audit::delete_leaked(objects, &audit)
        .await
        .map_err(|e| format!("deleting unnamed objects: {e}"))?;
    Ok(OnlineGc {
        audit,
        named_after_all: named.len() as u64,
        deleted,
    })
}

/// The dump's bytes as messages of [`DUMP_CHUNK_BYTES`] on a bounded channel: a dump that
/// outruns its reader waits for it.
struct ChunkSender {
    tx: mpsc::Sender<Result<pb::DumpChunk, Status>>,
    buf: Vec<u8>,
}

impl ChunkSender {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(DUMP_CHUNK_BYTES));
        self.tx
            .blocking_send(Ok(pb::DumpChunk { data }))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader left"))
    }
}

impl Write for ChunkSender {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = DUMP_CHUNK_BYTES - self.buf.len();
        let n = bytes.len().min(room);
        self.buf.extend_from_slice(&bytes[..n]);
        if self.buf.len() >= DUMP_CHUNK_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[tonic::async_trait]
impl<S: Store> pb::protect_server::Protect for ProtectService<S> {
    type DumpStream = ReceiverStream<Result<pb::DumpChunk, Status>>;

    async fn dump(&self, r: Request<pb::Empty>) -> Result<Response<Self::DumpStream>, Status> {
        self.auth.admin(&r, "a dump of the whole namespace")?;
        let _pass = self.recall_all(0).await;
        let (tx, rx) = mpsc::channel(DUMP_CHUNKS_QUEUED);
        let meta = self.meta.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = ChunkSender {
                tx: tx.clone(),
                buf: Vec::with_capacity(DUMP_CHUNK_BYTES),
            };
            let done = dump_namespace(&meta, &mut out).and_then(|_| {
                out.flush().map_err(|error| DumpError::Io {
                    what: "sending the dump",
                    error,
                })
            });
            if let Err(error) = done {
                let _ =
                    tx.blocking_send(Err(Status::internal(format!("the dump failed: {error}"))));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn gc(&self, r: Request<pb::GcRequest>) -> Result<Response<pb::GcReply>, Status> {
        self.auth.admin(&r, "collecting unnamed objects")?;
        let Some(objects) = &self.objects else {
            return Err(Status::failed_precondition(
                "this namespace names no object store",
            ));
        };
        let request = r.into_inner();
        let done = collect_online(&self.meta, objects, request.grace_s, request.delete)
            .await
            .map_err(Status::unavailable)?;
        let audit = &done.audit;
        Ok(Response::new(pb::GcReply {
            objects: audit.objects,
            bytes: audit.bytes,
            referenced: audit.referenced,
            leaked: audit.leaked.len() as u64,
            leaked_bytes: audit.leaked_bytes(),
            young: audit.young,
            deleted: done.deleted,
            named_after_all: done.named_after_all,
        }))
    }

    async fn trash_list(
        &self,
        r: Request<pb::TrashListRequest>,
    ) -> Result<Response<pb::TrashListReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let request = r.into_inner();
        let _listing = self.listings.enter(caller.uid).await?;
        let meta = self.meta.clone();
        let page = tokio::task::spawn_blocking(move || {
            meta.trash_list(&caller, request.after, request.max as usize)
        })
        .await
        .map_err(|e| Status::internal(format!("listing the trash: {e}")))?
        .map_err(|e| calm_proto::status_from_error(&e))?;
        let entries = page
            .entries
            .into_iter()
            .map(|l| pb::TrashEntry {
                handle: l.listed.handle,
                deleted_ns: l.listed.entry.deleted_ns,
                size: l.listed.entry.size,
                parent: l.listed.entry.parent,
                name: l.listed.entry.name,
                path: l.path,
                kind: l.listed.kind as u32,
                uid: l.listed.uid,
                gid: l.listed.gid,
            })
            .collect();
        Ok(Response::new(pb::TrashListReply {
            entries,
            next: page.next.unwrap_or(0),
        }))
    }

    async fn trash_restore(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::TrashRestoreReply>, Status> {
        let caller = self.auth.caller(&r)?;
        // The name comes back in a directory a mount may hold.
        let _pass = self.recall_all(caller.session).await;
        let restored = self
            .meta
            .trash_restore(caller, r.into_inner().handle)
            .await
            .map_err(|e| calm_proto::status_from_error(&e))?;
        Ok(Response::new(pb::TrashRestoreReply {
            attr: Some((&restored.attr).into()),
            parent: restored.parent,
            name: restored.name,
        }))
    }

    async fn clone_node(&self, r: Request<pb::CloneRequest>) -> Result<Response<pb::Attr>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall_all(caller.session).await;
        let request = r.into_inner();
        let attr = self
            .meta
            .clone_node(caller, request.src, request.parent, &request.name)
            .await
            .map_err(|e| calm_proto::status_from_error(&e))?;
        Ok(Response::new((&attr).into()))
    }

    async fn clone_entries(
        &self,
        r: Request<pb::CloneEntriesRequest>,
    ) -> Result<Response<pb::CloneEntriesReply>, Status> {
        let caller = self.auth.caller(&r)?;
        let _pass = self.recall_all(caller.session).await;
        let request = r.into_inner();
        let max = request.max as usize;
        let done = self
            .meta
            .clone_entries(caller, request.src, request.dst, request.after, max)
            .await
            .map_err(|e| calm_proto::status_from_error(&e))?;
        Ok(Response::new(pb::CloneEntriesReply {
            dirs: done
                .dirs
                .iter()
                .map(|&(src, dst)| pb::ClonedDir { src, dst })
                .collect(),
            more: done.next.is_some(),
            next: done.next.unwrap_or_default(),
            entries: done.entries,
        }))
    }

    async fn trash_purge(
        &self,
        r: Request<pb::HandleRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let caller = self.auth.caller(&r)?;
        self.meta
            .trash_purge(caller, r.into_inner().handle)
            .await
            .map_err(|e| calm_proto::status_from_error(&e))?;
        Ok(Response::new(pb::Empty {}))
    }
}
