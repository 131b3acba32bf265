//! Reads of a file's bytes as this mount sees them: the map (loaded again once when an object
//! turns out to be gone) planned into object reads.

use super::*;

impl Contents {
    /// Reads `len` bytes at `offset` of `handle` (fewer at the end of the file).
    /// Bytes `[offset, offset + len)` of `handle` as this mount sees it. An object gone from
    /// the store means the map this mount holds is older than a change made elsewhere
    /// (compaction rewrote the chunk, another mount truncated or overwrote it, and the deleter
    /// removed the old objects): the map is read again once and the read planned afresh.
    pub async fn read(
        &self,
        client: &Client,
        handle: Handle,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, i32> {
        let read = match self.read_planned(client, handle, offset, len, false).await {
            Err(ReadError::Data(DataError::Missing(what))) => {
                tracing::debug!(handle, %what, "an object of an old map is gone: map read again");
                self.read_planned(client, handle, offset, len, true).await
            }
            other => other,
        };
        read.map_err(|e| match e {
            ReadError::Meta(errno) => errno,
            ReadError::Data(e) => {
                tracing::warn!(handle, %e, "reading file contents");
                data_errno(&e)
            }
        })
    }

    async fn read_planned(
        &self,
        client: &Client,
        handle: Handle,
        offset: u64,
        len: u32,
        reload: bool,
    ) -> Result<Vec<u8>, ReadError> {
        let file = self.file(handle);
        let plan = {
            let mut state = file.lock().await;
            if self.changed.locked().remove(&handle) {
                state.loaded = false;
            }
            if !state.loaded || reload {
                let map = client
                    .read_map(handle)
                    .await
                    .map_err(|e| ReadError::Meta(stale_errno(&e)))?;
                state.data.refresh(map.attr.size, map.chunks, map.inline);
                state.loaded = true;
                if reload {
                    // The kernel's pages of the file may be as old as the map was.
                    state.cached = None;
                }
            }
            let end = self.size_cut_here(handle).map_or(u64::MAX, |size| {
                offset.saturating_add(u64::from(len)).min(size)
            });
            let len = end.saturating_sub(offset).min(u64::from(len));
            state.data.plan(offset, len)
        };
        let total: u64 = plan.iter().map(Part::len).sum();
        let mut out = Vec::with_capacity(total as usize);
        let mut fetches = Vec::new();
        for part in &plan {
            let objects = self.objects.clone();
            let part = part.clone();
            fetches.push(async move {
                match part {
                    // Inline bytes this mount no longer holds: the map has them.
                    Part::Object { id, .. } if calm_types::slices::is_inline(id) => Err(
                        DataError::Missing(format!("the bytes of inline slice {id:#x}")),
                    ),
                    Part::Object { id, size, off, len } => {
                        objects.read(id, size, off, len).await.map(Some)
                    }
                    _ => Ok(None),
                }
            });
        }
        use futures::StreamExt;
        let fetched: Vec<Result<Option<Bytes>, DataError>> = futures::stream::iter(fetches)
            .buffered(READS_IN_FLIGHT_MAX)
            .collect()
            .await;
        for (part, bytes) in plan.iter().zip(fetched) {
            match part {
                Part::Zeros(n) => out.resize(out.len() + *n as usize, 0),
                Part::Memory(b) => out.extend_from_slice(b),
                Part::Object { .. } => {
                    let bytes = bytes.map_err(ReadError::Data)?.ok_or_else(|| {
                        ReadError::Data(DataError::Missing(
                            "a part of the read was not fetched".into(),
                        ))
                    })?;
                    out.extend_from_slice(&bytes)
                }
            }
        }
        Ok(out)
    }
}

/// Why a read failed: the server (an errno), or the object store.
enum ReadError {
    Meta(i32),
    Data(DataError),
}
