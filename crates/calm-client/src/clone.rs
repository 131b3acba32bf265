//! `calm clone`: a copy of a file or of a tree made of metadata alone. The top is cloned
//! first (a directory empty), then each directory's entries into its copy, a request per
//! directory (or per slice of a large one), many directories at once.

use crate::{Client, Result};

/// Directories cloned at once.
const DIRS_IN_FLIGHT: usize = 16;
/// Entries asked for per request (the server may do fewer).
const ENTRIES_PER_REQUEST: u32 = 4096;

/// What a clone made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cloned {
    /// The copy's handle.
    pub handle: u64,
    /// Nodes made below it, and the requests that made them.
    pub entries: u64,
    pub requests: u64,
}

/// Clones `src` as `name` in directory `parent`.
pub async fn clone_tree(client: &Client, src: u64, parent: u64, name: &[u8]) -> Result<Cloned> {
    let top = client.clone_node(src, parent, name).await?;
    let mut cloned = Cloned {
        handle: top.handle,
        entries: 0,
        requests: 1,
    };
    if top.kind != calm_types::Kind::Dir {
        return Ok(cloned);
    }
    let mut todo = vec![(src, top.handle)];
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < DIRS_IN_FLIGHT
            && let Some((from, to)) = todo.pop()
        {
            let client = client.clone();
            running.spawn(async move { one_dir(&client, from, to).await });
        }
        let Some(joined) = running.join_next().await else {
            return Ok(cloned);
        };
        let (dirs, entries, requests) =
            joined.map_err(|e| crate::MetaError::Io(format!("a clone request failed: {e}")))??;
        cloned.entries += entries;
        cloned.requests += requests;
        todo.extend(dirs);
    }
}

/// Clones every entry of `src` into `dst`: the subdirectories made, the entries, the requests.
async fn one_dir(client: &Client, src: u64, dst: u64) -> Result<(Vec<(u64, u64)>, u64, u64)> {
    let (mut dirs, mut entries, mut requests) = (Vec::new(), 0, 0);
    let mut after = Vec::new();
    loop {
        let done = client
            .clone_entries(src, dst, after, ENTRIES_PER_REQUEST)
            .await?;
        requests += 1;
        entries += done.entries;
        dirs.extend(done.dirs.iter().map(|d| (d.src, d.dst)));
        if !done.more {
            return Ok((dirs, entries, requests));
        }
        after = done.next;
    }
}
