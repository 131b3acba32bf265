//! The checks of a file's contents and attributes: chunks (their slice records, against the
//! file's size and the cluster's ids), inline bytes, and extended attributes of live inodes.

use super::*;

impl Checker {
    /// A chunk of a live file, whose records fit it and name objects handed out.
    pub(super) fn chunk(&mut self, key: &[u8], value: &[u8]) {
        let (Some(handle), Some(chunk)) = (key_handle(key), key_chunk(key)) else {
            return self
                .report
                .problem(format!("chunk key {key:?} does not decode"));
        };
        self.report.chunks += 1;
        if self.live.binary_search(&handle).is_err() {
            self.report.problem(format!(
                "chunk {chunk} of handle {handle}, which is not a live inode"
            ));
        }
        match crate::slices::decode_chunk(value) {
            Ok(slices) => {
                self.report.slice_records += slices.len() as u64;
                self.report.slice_records_per_chunk_max = self
                    .report
                    .slice_records_per_chunk_max
                    .max(slices.len() as u64);
                for slice in slices {
                    if let Err(error) = slice.check() {
                        self.report
                            .problem(format!("chunk {chunk} of handle {handle}: {error}"));
                    }
                    if crate::slices::is_object(slice.id) && self.queued.contains(&slice.id) {
                        self.report.problem(format!(
                            "slice {} of chunk {chunk} of handle {handle} is queued for \
                             deletion: its object may be deleted while the file names it",
                            slice.id
                        ));
                    }
                    if self.collected.contains(&slice.id) {
                        self.report.problem(format!(
                            "slice {} of chunk {chunk} of handle {handle} names an object calm gc collected",
                            slice.id
                        ));
                    }
                    if crate::slices::is_inline(slice.id)
                        && self.inline_named.insert(slice.id, slice.size).is_some()
                    {
                        self.report.problem(format!(
                            "inline slice {:#x} is named twice (chunk {chunk} of handle {handle})",
                            slice.id
                        ));
                    }
                }
            }
            Err(error) => self
                .report
                .problem(format!("chunk {chunk} of handle {handle}: {error}")),
        }
    }

    /// The bytes of an inline slice: named by one record, of its length.
    pub(super) fn inline(&mut self, key: &[u8], value: &[u8]) {
        let Some(id) = key_handle(key).filter(|_| key.len() == 9) else {
            return self
                .report
                .problem(format!("inline bytes key {key:?} does not decode"));
        };
        self.report.inline_slices += 1;
        match self.inline_named.remove(&id) {
            None => self.report.problem(format!(
                "inline bytes of slice {id:#x}, which no record names"
            )),
            Some(size) if size as usize != value.len() => self.report.problem(format!(
                "inline slice {id:#x} holds {} bytes, its record says {size}",
                value.len()
            )),
            Some(_) => {}
        }
    }

    pub(super) fn xattr(&mut self, key: &[u8], value: &[u8]) {
        let Some(handle) = key_handle(key) else {
            return self.report.problem("xattr key shorter than 9 bytes".into());
        };
        self.report.xattrs += 1;
        if let Some(bit) = crate::acl::acl_bit(&key[9..]) {
            self.acl(handle, bit, value);
        }
        while self.live.get(self.live_at).is_some_and(|h| *h < handle) {
            self.live_at += 1;
        }
        if self.live.get(self.live_at) != Some(&handle) {
            self.report.problem(format!(
                "xattr of handle {handle}, which is not a live inode"
            ));
        }
    }

    /// An ACL's `X` key: only a default ACL is one (an access ACL is kept in its inode's
    /// record), of a directory marked with it, and it decodes.
    fn acl(&mut self, handle: Handle, bit: u8, value: &[u8]) {
        if bit == crate::acl::ACL_ACCESS {
            return self.report.problem(format!(
                "inode {handle} has an access ACL key: it belongs in the inode's record"
            ));
        }
        if let Err(error) = crate::acl::Acl::decode(value) {
            self.report
                .problem(format!("the default ACL of inode {handle}: {error}"));
        }
        match self.default_acls.get_mut(&handle) {
            Some(seen) => *seen = true,
            None => self.report.problem(format!(
                "inode {handle} has a default ACL but is not marked with it"
            )),
        }
    }
}
