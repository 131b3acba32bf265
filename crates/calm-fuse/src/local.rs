//! The makes and removals this mount answers itself, in the directories it holds
//! ([`crate::dirs`]), queued to the client's outbox; giving a directory back; and the handles
//! granted in advance that such makes use.

use std::sync::{Arc, Weak};
use std::time::Duration;

use calm_client::Client;
use calm_client::outbox::Change;
use calm_proto::pb;
use calm_types::{Attr, Handle, Kind, MetaError, NewNode};
use fuser::Errno;
use tokio::runtime::Handle as Runtime;

use crate::dirs::{GRANT_COUNT, LocalMake};
use crate::holding::Asker;
use crate::shared::Shared;

/// Wait before a grant of handles is asked again after one failed.
const GRANT_RETRY: Duration = Duration::from_secs(1);

/// `client` with an outbox where the mount holds (`hold`): the changes it answers itself in
/// directories it holds are sent in order, before every other request.
pub(crate) fn outbox_client(client: Client, hold: bool, runtime: &Runtime) -> Client {
    if !hold {
        return client;
    }
    let _runtime = runtime.enter();
    let outbox = calm_client::outbox::Outbox::start(&client);
    client.with_outbox(outbox)
}

fn asker(client: &Client) -> Option<Asker> {
    client.caller().map(|c| Asker {
        uid: c.uid,
        gid: c.gid,
    })
}

impl Shared {
    /// Waits, where the mount holds `parent`, until its outbox has room for one more change:
    /// a mount that answers faster than its server applies waits here rather than giving the
    /// directory back.
    /// Waits first while the mount asks to hold `parent` (its answer may let it answer here).
    pub(crate) async fn room_to_answer(&self, client: &Client, parent: Handle) {
        self.dirs.settled(parent).await;
        if let Some(outbox) = client.outbox()
            && !outbox.has_room()
            && self.dirs.holds(parent)
        {
            outbox.room().await;
        }
    }

    /// Answers here the make of `node` as `name` in `parent` by `client`'s caller, if the
    /// mount holds `parent` and may: the node's attributes and the directory's after it (the
    /// make is queued to be sent).
    /// Only regular files (made with O_EXCL) and directories.
    pub(crate) fn make_here(
        &self,
        client: &Client,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
    ) -> Option<(Attr, Attr)> {
        let outbox = client.outbox()?;
        if !matches!(node.kind, Kind::File | Kind::Dir) || !outbox.has_room() {
            return None;
        }
        let maker = asker(client)?;
        let local = LocalMake {
            kind: node.kind,
            mode: node.mode,
            maker,
        };
        let attr = self.dirs.make(parent, name, &local, |handle, now| {
            // A file is held as one made through the server is; a directory's names are.
            let mut request = calm_client::make_request(parent, name, node, true, true);
            request.handle = handle;
            // The times this mount answered with are the server's too.
            request.time_ns = now;
            outbox.push_now(client, Change::Make(request));
        });
        if self.dirs.handles_low() {
            self.handles_wanted.notify_one();
        }
        let (attr, dir) = attr?;
        if attr.kind == Kind::File {
            let held = match maker.uid {
                0 => calm_proto::HOLD_MODE_TIMES | calm_proto::HOLD_OWNER,
                _ => calm_proto::HOLD_MODE_TIMES,
            };
            self.holding
                .granted(attr.handle, parent, maker, client, held);
        }
        Some((attr, dir))
    }

    /// Makes a node that is not a regular file: a directory here where the mount holds
    /// `parent`, else through the server (`parent` given back first); a directory so made
    /// asks to be held. The node, and the directory's attributes the server answered with.
    pub(crate) async fn make_node(
        self: &Arc<Self>,
        client: &Client,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
    ) -> Result<(Attr, Option<Attr>), MetaError> {
        if node.kind == Kind::Dir {
            self.room_to_answer(client, parent).await;
        }
        if node.kind == Kind::Dir
            && let Some((attr, dir)) = self.make_here(client, parent, name, node)
        {
            return Ok((attr, Some(dir)));
        }
        let busy = self.through_server(parent).await;
        let made = self.make_node_there(client, parent, name, node).await;
        drop(busy);
        if made.is_ok() {
            self.ask_to_hold(client, parent);
        }
        made
    }

    /// [`Shared::make_node`] through the server: a directory asks to be held.
    async fn make_node_there(
        &self,
        client: &Client,
        parent: Handle,
        name: &[u8],
        node: &NewNode,
    ) -> Result<(Attr, Option<Attr>), MetaError> {
        let maker = asker(client);
        let hold = node.kind == Kind::Dir && self.hold_files && self.holding.may_ask();
        let Some(maker) = maker.filter(|_| hold) else {
            return client.make_in_dir(parent, name, node, true).await;
        };
        let (attr, dir, held) = client.make_held(parent, name, node, true, true).await?;
        // Not if the server asked for it back before its answer came here.
        if held.bits & calm_proto::HOLD_NAMES != 0 && !self.holding.take_early(attr.handle) {
            let room = (held.room > 0).then_some(held.room);
            self.dirs.granted(&attr, (parent, name), maker, room);
        }
        Ok((attr, dir))
    }

    /// Answers here the unlink (`rmdir` false) or rmdir of `name` in `parent` by `client`'s
    /// caller, if the mount holds `parent` and may: the directory's attributes after it (the
    /// removal is queued).
    pub(crate) fn remove_here(
        &self,
        client: &Client,
        parent: Handle,
        name: &[u8],
        rmdir: bool,
    ) -> Option<Attr> {
        let outbox = client.outbox()?;
        let asker = asker(client)?;
        if !outbox.has_room() {
            return None;
        }
        // A file open here may have to be kept as an orphan, and one held keeps changes: the
        // server decides those.
        let busy = |handle| self.is_open(handle) || self.holding.holds(handle);
        let removed = self
            .dirs
            .remove(parent, name, rmdir, asker, busy, |_, now| {
                let request = pb::RemoveRequest {
                    parent,
                    name: name.to_vec(),
                    keep: Vec::new(),
                    time_ns: now,
                };
                let change = match rmdir {
                    true => Change::Rmdir(request),
                    false => Change::Unlink(request),
                };
                outbox.push_now(client, change);
            });
        removed.map(|(_, dir)| dir)
    }

    /// Gives directory `dir` back if this mount holds it: what was answered in it is sent
    /// first. Before anything of this mount changes the directory through the server.
    pub(crate) async fn give_back_dir(&self, dir: Handle) {
        if !self.dirs.release(dir) {
            return;
        }
        if let Some(outbox) = self.client.outbox() {
            outbox.drained().await;
        }
        self.return_soon(dir);
    }

    /// Before a change in directory `dir` goes to the server (a make, removal or rename in
    /// it, a change of its attributes): waits while the mount asks to hold it, gives it back
    /// if held, and counts the change as on its way until the guard is dropped (after its
    /// answer), so that the mount asks to hold `dir` only when nothing of its own is.
    pub(crate) async fn through_server(&self, dir: Handle) -> crate::dirs::Busy<'_> {
        let busy = self.dirs.through_server(dir).await;
        self.give_back_dir(dir).await;
        busy
    }

    /// After a make or removal in `dir` the server answered: asks to hold `dir`, which has
    /// names already, where the mount may answer its makes and removals itself (in the
    /// background; the makes and removals in `dir` meanwhile wait for the answer). The server
    /// lets it only where no other mount follows its changes.
    pub(crate) fn ask_to_hold(self: &Arc<Self>, client: &Client, dir: Handle) {
        if !self.hold_files || !self.holding.may_ask() || client.outbox().is_none() {
            return;
        }
        let watch_id = self.cache.watch_id();
        let Some(maker) = asker(client).filter(|_| watch_id != 0) else {
            return;
        };
        if !self.dirs.ask(dir) {
            return;
        }
        let ticket = self.cache.ticket();
        let (shared, client) = (self.clone(), client.clone());
        tokio::spawn(async move {
            let held = match client.hold_dir(dir, watch_id).await {
                Ok(held) => held,
                Err(e) => {
                    tracing::debug!(%e, dir, "asking to hold a directory");
                    None
                }
            };
            let Some(held) = held else {
                // A recall that came before this answer is of no hold of this mount.
                shared.holding.take_early(dir);
                return shared.dirs.asked(dir, false);
            };
            let (attr, parent, generation) = (&held.attr, held.parent, held.generation);
            shared
                .dirs
                .granted_named(attr, parent, &held.names, maker, generation);
            // Asked back before the answer came here: given back already.
            if shared.holding.take_early(dir) {
                shared.dirs.release(dir);
                return shared.dirs.asked(dir, false);
            }
            let names = held.names.iter().map(|e| e.name.as_slice());
            shared.cache.listed_here(ticket, dir, names);
            shared.dirs.asked(dir, true);
        });
    }

    /// Gives back `dir` and the directories held that were made in it (a name of it moves).
    pub(crate) async fn give_back_dirs_in(&self, dir: Handle) {
        self.give_back_dir(dir).await;
        for held in self.dirs.held_in(dir) {
            self.give_back_dir(held).await;
        }
    }

    /// Makes every change answered before durable: the outbox sent, the server synced; a change
    /// the server refused since the last sync fails it (EIO).
    pub(crate) async fn sync_all(&self, client: &Client) -> Result<(), Errno> {
        client
            .sync()
            .await
            .map_err(|e| Errno::from_i32(e.errno()))?;
        match client.outbox().and_then(|outbox| outbox.take_failure()) {
            Some(e) => {
                tracing::error!(%e, "a change answered earlier was refused by the server");
                Err(Errno::EIO)
            }
            None => Ok(()),
        }
    }

    /// Keeps handles granted in advance while the mount lives: asks for more whenever few are
    /// left.
    pub(crate) async fn keep_handles(shared: Weak<Shared>) {
        loop {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let wanted = strong.handles_wanted.clone();
            let Some(outbox) = strong.client.outbox().cloned() else {
                return;
            };
            if strong.dirs.wants_handles() {
                let granted = outbox.grant(&strong.client, GRANT_COUNT).await;
                let failed = granted.is_err();
                if let Err(e) = &granted {
                    tracing::debug!(%e, "asking for handles in advance");
                }
                strong
                    .dirs
                    .handles_granted(granted.ok().map(|first| (first, GRANT_COUNT)));
                drop(strong);
                if failed {
                    tokio::time::sleep(GRANT_RETRY).await;
                }
                continue;
            }
            drop(strong);
            // Woken by a make that used handles; looked at again each second, to end with the
            // mount.
            let _ = tokio::time::timeout(Duration::from_secs(1), wanted.notified()).await;
        }
    }
}
