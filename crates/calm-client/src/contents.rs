//! The calls of a [`Client`] about file contents: where the objects are, a file's map of
//! slices, writes and appends of slice records, and slice ids.

use super::*;

impl Client {
    /// The URL of the namespace's object store and the namespace's identity.
    pub async fn data_info(&self) -> Result<DataInfo> {
        let reply = check(meta_call!(self, data_info, pb::Empty {}))?;
        Ok(DataInfo {
            objects_url: reply.objects_url,
            namespace_id: reply.namespace_id,
        })
    }

    /// A file's attributes and whole slice map, read on one snapshot when it fits one reply
    /// (65 536 records); a larger map is read in parts, again from the start whenever the file
    /// changed between two of them, so the map is always one version of the file.
    pub async fn read_map(&self, handle: Handle) -> Result<FileMap> {
        self.read_map_with(handle, false).await.map(|(map, _)| map)
    }

    /// [`Client::read_map`], asking to keep a copy: whether the server granted one (then it
    /// asks for it back, on the session's stream of recalls, before it answers another
    /// session's change of the file). Granted only for a map read in one reply.
    pub async fn read_map_keeping(&self, handle: Handle) -> Result<(FileMap, bool)> {
        self.read_map_with(handle, true).await
    }

    async fn read_map_with(&self, handle: Handle, copy: bool) -> Result<(FileMap, bool)> {
        const TRIES_MAX: u32 = 16;
        'again: for _ in 0..TRIES_MAX {
            let mut map: Option<FileMap> = None;
            let mut from_chunk = 0;
            loop {
                let request = pb::ReadMapRequest {
                    handle,
                    from_chunk,
                    max_records: 0,
                    copy,
                };
                let reply = check(batched_call!(self, read_map, ReadMap, request))?;
                let attr: Attr = reply
                    .attr
                    .ok_or_else(|| MetaError::Io("a map without attributes".into()))?
                    .try_into()?;
                let mut chunks: Vec<(u64, Vec<calm_types::slices::Slice>)> = Vec::new();
                for record in &reply.records {
                    let (chunk, slice) = calm_proto::slice_from_wire(record);
                    match chunks.last_mut() {
                        Some((c, slices)) if *c == chunk => slices.push(slice),
                        _ => chunks.push((chunk, vec![slice])),
                    }
                }
                let next = chunks.last().map(|(c, _)| c + 1);
                let inline: Vec<(u64, Vec<u8>)> =
                    reply.inline.into_iter().map(|b| (b.id, b.data)).collect();
                match &mut map {
                    None => {
                        map = Some(FileMap {
                            attr,
                            chunks,
                            more: false,
                            inline,
                        })
                    }
                    Some(map) => {
                        let same = |a: &Attr, b: &Attr| {
                            a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.size == b.size
                        };
                        if !same(&map.attr, &attr) {
                            continue 'again;
                        }
                        map.chunks.extend(chunks);
                        map.inline.extend(inline);
                    }
                }
                match (reply.more, next) {
                    (true, Some(next)) => from_chunk = next,
                    _ => return Ok((map.expect("set above"), reply.copy && from_chunk == 0)),
                }
            }
        }
        Err(MetaError::Busy(format!(
            "file {handle} kept changing while its map was read ({TRIES_MAX} tries)"
        )))
    }

    /// Places slice records in a file and makes it at least `end` bytes long; `inline` holds
    /// the bytes of the records' inline slices, by id.
    pub async fn write(
        &self,
        handle: Handle,
        records: &[(u64, calm_types::slices::Slice)],
        end: u64,
        inline: Vec<(u64, Vec<u8>)>,
    ) -> Result<Attr> {
        self.write_held(None, handle, records, end, inline, None)
            .await
    }

    /// A request id for a mutation its caller may have to send again in later calls
    /// ([`Client::write_held`]); `None` for a client that sends none (one calling the server
    /// in its own process, whose answers are never lost).
    pub fn hold_request(&self) -> Option<crate::failover::HeldRequest> {
        self.failover.clone().map(crate::failover::HeldRequest::new)
    }

    /// [`Client::write`] with the request id `held` (a fresh one when `None`): a write whose
    /// answer never came, sent again with the same id, is answered as the server answered it
    /// the first time if it applied it (also across a restart of the server), and applied now
    /// if it did not. With `then`, that change of the file's attributes is applied right
    /// after the write, in the same request (see `WriteRequest.set_attr`): the answer shows
    /// whether it was.
    pub async fn write_held(
        &self,
        held: Option<&crate::failover::HeldRequest>,
        handle: Handle,
        records: &[(u64, calm_types::slices::Slice)],
        end: u64,
        inline: Vec<(u64, Vec<u8>)>,
        then: Option<&calm_types::SetAttr>,
    ) -> Result<Attr> {
        let request = pb::WriteRequest {
            set_attr: then.map(|change| calm_proto::setattr_to_wire(handle, change)),
            handle,
            records: records
                .iter()
                .map(|(chunk, s)| calm_proto::slice_to_wire(*chunk, s))
                .collect(),
            end,
            inline: inline
                .into_iter()
                .map(|(id, data)| pb::InlineBytes { id, data })
                .collect(),
        };
        let reply = match held {
            Some(held) => batched_call!(
                mutation placed held Some(held.id()),
                self,
                write,
                Write,
                request
            ),
            None => batched_call!(mutation placed, self, write, Write, request),
        };
        self.mutated(reply)?.try_into()
    }

    /// Places the whole of object `id` at the end of the file; with `inline`, the bytes of
    /// inline slice `id` (refused as not supported where the file's inline bytes may not be).
    pub async fn append(
        &self,
        handle: Handle,
        id: u64,
        size: u32,
        inline: Option<Vec<u8>>,
    ) -> Result<Attr> {
        let request = pb::AppendRequest {
            handle,
            id,
            size,
            inline,
        };
        self.mutated(meta_call!(mutation placed, self, append, request))?
            .try_into()
    }

    /// `count` new slice ids; returns the first.
    pub async fn alloc_slices(&self, count: u64) -> Result<u64> {
        let request = pb::AllocSlicesRequest { count };
        Ok(check(meta_call!(self, alloc_slices, request))?.first)
    }
}
