//! Sending what the mount kept of the files it holds ([`crate::holding`]), giving them back,
//! and following the server's recalls.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use calm_client::Client;
use calm_types::sync::Locked;
use calm_types::{Attr, Caller, Handle, MetaError, SetAttr};
use fuser::Errno;

use crate::holding::{Asker, Kept};
use crate::shared::Shared;

/// How long the mount waits before it opens the stream of recalls again after it ended; each
/// failure to open it doubles the wait, up to [`REOPEN_AFTER_MAX`] (a server that does not
/// know holds is asked rarely).
const REOPEN_AFTER: Duration = Duration::from_millis(200);
const REOPEN_AFTER_MAX: Duration = Duration::from_secs(10);
/// How often the mount checks that the stream of recalls is its lock session's: a session
/// replaced (its lease lost, the server restarted) has its stream opened again at once for
/// the new one, whose holds and copies the server grants only then.
const SESSION_CHECK_EVERY: Duration = Duration::from_millis(100);
/// Longest a hold given back at a close waits to go with others in one request.
pub const RETURNS_GATHER: Duration = Duration::from_millis(2);

impl Shared {
    /// Answers `change` of `handle` asked by `asker` here, if this mount holds the file and
    /// may: the file's attributes after it, as the caller is answered.
    pub(crate) fn keep(&self, handle: Handle, change: &SetAttr, asker: Asker) -> Option<Attr> {
        if !self.holding.holds(handle) {
            return None;
        }
        // A size is kept only over what the server has: with no write pending before it.
        if change.size.is_some() && self.contents.dirty_size(handle).is_some() {
            return None;
        }
        let mut attr = self.state().inodes.get(&handle)?.attr.clone()?;
        if change.size.is_some() {
            // The size the file has here: its commits since the attributes were answered
            // may have made it longer.
            attr.size = attr.size.max(self.contents.size_known(handle)?);
        }
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        if !self.holding.keep(handle, &mut attr, change, asker, now_ns) {
            return None;
        }
        if let Some(size) = change.size {
            self.contents.cut_here(handle, size);
        }
        Some(self.local_view(attr))
    }

    /// Sends `handle`'s kept changes, if it has any (its pending writes, which came before
    /// them, are committed first by the caller); the hold stays.
    pub(crate) async fn send_kept(&self, handle: Handle) -> Result<(), Errno> {
        self.send_held(handle, false).await
    }

    /// Gives `handle` back if this mount holds it: its kept changes go with it (its pending
    /// writes are committed first by the caller).
    pub(crate) async fn give_back(&self, handle: Handle) -> Result<(), Errno> {
        self.send_held(handle, true).await
    }

    async fn send_held(&self, handle: Handle, ending: bool) -> Result<(), Errno> {
        let Some(turn) = self.holding.turn(handle) else {
            return Ok(());
        };
        let _turn = turn.lock().await;
        let Some(kept) = self.holding.to_send(handle, ending) else {
            // Given back while this waited for its turn.
            return Ok(());
        };
        let folds = kept.as_ref().map(|k| k.folds);
        let sent = match kept {
            Some(kept) => self.send(handle, kept, ending).await,
            None => {
                if ending {
                    self.return_soon(handle);
                }
                Ok(())
            }
        };
        self.holding.sent(handle, folds, ending);
        sent
    }

    /// Gives `handle` back if this mount holds it, with its pending writes committed first.
    pub(crate) async fn give_back_whole(&self, handle: Handle) -> Result<(), Errno> {
        let Some(client) = self.holding.maker_client(handle) else {
            return Ok(());
        };
        self.push_and_give_back(&client, handle, None).await
    }

    /// Commits `handle`'s pending writes (for the open file `fh`, when the caller has one)
    /// and gives the file back if this mount holds it. The changes kept of a held file go in
    /// the request of its writes where they may (a small file's close asks once), and the
    /// hold is then given back with others; else they go after the writes, as
    /// [`Shared::give_back`] sends them.
    pub(crate) async fn push_and_give_back(
        &self,
        client: &Client,
        handle: Handle,
        fh: Option<u64>,
    ) -> Result<(), Errno> {
        if self.push_with_kept(client, handle, fh).await? {
            return Ok(());
        }
        self.push(client, handle, fh).await?;
        self.give_back(handle).await
    }

    /// The writes and kept changes of held file `handle` in one request, if it has both and
    /// they may: whether they went so (and the hold is being given back).
    async fn push_with_kept(
        &self,
        client: &Client,
        handle: Handle,
        fh: Option<u64>,
    ) -> Result<bool, Errno> {
        let Some(turn) = self.holding.turn(handle) else {
            return Ok(false);
        };
        let _turn = turn.lock().await;
        if !self.holding.has_kept(handle) || self.contents.dirty_size(handle).is_none() {
            return Ok(false);
        }
        // A size kept goes by itself (writes after it send it first: none are pending).
        if self.holding.has_kept_size(handle) {
            return Ok(false);
        }
        // The changes go as their maker asked them: together only when the maker closes.
        let maker = self.holding.maker_client(handle);
        if maker.is_none_or(|maker| maker.caller() != client.caller()) {
            return Ok(false);
        }
        self.locks.confirm(handle).await;
        if let Some(fh) = fh
            && self.lock_lost(handle, fh)
        {
            return Err(Errno::EIO);
        }
        // Nothing more is kept once the changes are on their way.
        let Some(Some(kept)) = self.holding.to_send(handle, true) else {
            return Ok(false);
        };
        let changed = self
            .contents
            .commit_then(client, handle, fh, &kept.change)
            .await
            .map_err(Errno::from_i32)?;
        if changed {
            self.holding.sent(handle, Some(kept.folds), true);
            self.return_later(handle);
        }
        Ok(changed)
    }

    /// Gives back every file held that was made in `dir` (a name of it moves).
    pub(crate) async fn give_back_in(&self, dir: Handle) -> Result<(), Errno> {
        for handle in self.holding.in_dir(dir) {
            self.give_back_whole(handle).await?;
        }
        Ok(())
    }

    async fn send(&self, handle: Handle, kept: Kept, release: bool) -> Result<(), Errno> {
        let sent = kept
            .client
            .setattr_releasing(handle, &kept.change, release)
            .await;
        if kept.change.size.is_some() {
            // A size kept: reads follow the server's map again.
            match &sent {
                Ok(attr) => self.contents.changed(attr).await,
                Err(_) => self.contents.uncut(handle),
            }
        }
        match sent {
            Ok(_) => Ok(()),
            // Gone (removed through another mount while open here): its changes with it.
            Err(MetaError::NotFound | MetaError::Stale) => Ok(()),
            Err(e) => {
                tracing::warn!(handle, %e, "sending the changes kept of a file held");
                Err(Errno::from_i32(e.errno()))
            }
        }
    }

    /// Queues `handle`, held with nothing kept, to be given back with others in one request,
    /// at once (the server may be waiting for it).
    pub(crate) fn return_soon(&self, handle: Handle) {
        self.returns.locked().holds.push(handle);
        self.returns_wanted.notify_one();
        self.returns_queued.notify_one();
    }

    /// Queues `handle`, held with nothing kept, to be given back with what other closes give
    /// back within [`RETURNS_GATHER`] (nobody waits for it: a request that does has the
    /// server ask for it, which sends it at once).
    fn return_later(&self, handle: Handle) {
        self.returns.locked().holds.push(handle);
        self.returns_queued.notify_one();
    }

    /// Queues the copy of `handle` to be given back with others in one request.
    pub(crate) fn return_copy_soon(&self, handle: Handle) {
        self.returns.locked().copies.push(handle);
        self.returns_wanted.notify_one();
        self.returns_queued.notify_one();
    }

    /// Drops this mount's copy of `handle` if it has one (it is about to change the file, or
    /// forgot it), and gives it back.
    pub(crate) fn drop_copy(&self, handle: Handle) {
        if self.copies.drop_copy(handle) {
            self.return_copy_soon(handle);
        }
    }

    /// Gives back, in batches, the files queued by [`Shared::return_soon`].
    pub(crate) async fn send_returns(shared: std::sync::Weak<Shared>) {
        loop {
            let queued = match shared.upgrade() {
                Some(shared) => shared.returns_queued.clone(),
                None => return,
            };
            queued.notified().await;
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let wanted = strong.returns_wanted.clone();
            drop(strong);
            // Gathered a moment, unless something queued is waited for.
            tokio::select! {
                _ = tokio::time::sleep(RETURNS_GATHER) => {}
                _ = wanted.notified() => {}
            }
            let Some(shared) = shared.upgrade() else {
                return;
            };
            loop {
                let (handles, copies): (Vec<Handle>, Vec<Handle>) = {
                    let mut returns = shared.returns.locked();
                    let most = crate::holding::RETURNS_PER_REQUEST_MAX;
                    let take = returns.holds.len().min(most);
                    let holds = returns.holds.drain(..take).collect();
                    let take = returns.copies.len().min(most);
                    (holds, returns.copies.drain(..take).collect())
                };
                if handles.is_empty() && copies.is_empty() {
                    break;
                }
                let client = shared.session_client();
                if let Err(e) = client.return_holds(handles, copies).await {
                    // The holds end with the stream when the server lost the session.
                    tracing::warn!(%e, "giving back files held");
                }
            }
        }
    }

    /// A client of the session the stream of recalls is open for (the session that holds
    /// the files and keeps the copies it asks back), else of the mount's lock session.
    fn session_client(&self) -> Client {
        let session = match self.stream_session.load(Ordering::Acquire) {
            0 => self.locks.session(),
            session => session,
        };
        self.session_client_of(session)
    }

    fn session_client_of(&self, session: u64) -> Client {
        self.client.with_caller(Caller {
            session,
            ..Caller::default()
        })
    }

    /// Keeps the stream of recalls open while the mount lives, and gives back what the
    /// server asks for: pending writes, then kept changes, then the hold.
    pub(crate) async fn follow_recalls(shared: std::sync::Weak<Shared>) {
        let mut wait = REOPEN_AFTER;
        loop {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let session = strong.locks.session();
            let opened = strong.session_client_of(session).holds().await;
            let mut stream = match opened {
                Ok(stream) => stream,
                Err(MetaError::NotSupported(_)) => return,
                Err(e) => {
                    tracing::debug!(%e, "opening the stream of recalls");
                    drop(strong);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(REOPEN_AFTER_MAX);
                    continue;
                }
            };
            wait = REOPEN_AFTER;
            strong.stream_session.store(session, Ordering::Release);
            strong.holding.stream_open(true);
            drop(strong);
            let mut check = tokio::time::interval(SESSION_CHECK_EVERY);
            loop {
                let handles = tokio::select! {
                    next = stream.next() => match next {
                        Ok(Some(handles)) => handles,
                        _ => break,
                    },
                    _ = check.tick() => {
                        match shared.upgrade() {
                            Some(strong) if strong.locks.session() == session => continue,
                            Some(_) => break,
                            None => return,
                        }
                    }
                };
                let Some(strong) = shared.upgrade() else {
                    return;
                };
                for handle in handles {
                    let shared = strong.clone();
                    tokio::spawn(async move { shared.recalled(handle).await });
                }
            }
            let Some(strong) = shared.upgrade() else {
                return;
            };
            // Ended: the server's side ends with the request, and the holds and copies of the
            // session with it, so the copies end here first.
            strong.copies.stream_ended();
            strong.dirs.stream_ended();
            drop(stream);
            // The server holds nothing of this mount any more: what was kept goes as it is.
            for (handle, kept) in strong.holding.stream_open(false) {
                let _ = strong.send(handle, kept, false).await;
            }
            drop(strong);
            tokio::time::sleep(REOPEN_AFTER).await;
        }
    }

    async fn recalled(self: Arc<Self>, handle: Handle) {
        // A directory held: what was answered in it goes first, then the directory.
        if self.dirs.holds(handle) {
            self.give_back_dir(handle).await;
            return;
        }
        // A copy (or the grant of one on its way here) ends: another client changed the file.
        // The next read loads its map again and the kernel drops its pages and attributes
        // before the copy goes back (and the change is answered).
        let had_copy = self.copies.recalled(handle);
        if had_copy {
            self.contents.changed_elsewhere(Some(handle));
            self.drop_kernel_cache(handle).await;
        }
        self.return_copy_soon(handle);
        if !self.holding.holds(handle) {
            // Not held (any more, or not yet: its grant is still on its way here).
            if !had_copy {
                self.holding.recalled_early(handle);
                self.return_soon(handle);
            }
            return;
        }
        if let Some(client) = self.holding.maker_client(handle)
            && let Err(e) = self.push(&client, handle, None).await
        {
            tracing::warn!(handle, ?e, "committing a held file's writes for its recall");
        }
        if self.give_back(handle).await.is_err() {
            // Its changes were refused: the hold ends all the same.
            self.return_soon(handle);
        }
    }
}
