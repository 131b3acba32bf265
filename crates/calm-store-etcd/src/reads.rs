//! Reads at one revision: a key (from the read cache when it holds the revision), a range
//! in pages, a visit that stops when its visitor says so, the last key of a range; calm's
//! keys mapped into this file system's part of the etcd keyspace.

use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};
use std::sync::atomic::Ordering;

use crate::{
    EtcdStore, Pair, Pairs, RANGE_ANSWER_BYTES_MAX, VISIT_PAGE_BYTES, VISIT_PAGE_PAIRS_FIRST,
    VISIT_PAGE_PAIRS_MAX,
};
use calm_store::{Result, StoreError, Visitor};
use etcd_client::{GetOptions, GetResponse, SortOrder, SortTarget};

impl EtcdStore {
    pub(crate) fn data_key(&self, key: &[u8]) -> Vec<u8> {
        [self.inner.data.as_slice(), key].concat()
    }

    /// The etcd end of a calm range end (empty: the end of this file system's keyspace).
    pub(crate) fn data_end(&self, end: &[u8]) -> Vec<u8> {
        if end.is_empty() {
            self.inner.data_end.clone()
        } else {
            self.data_key(end)
        }
    }

    /// The value of `key` at `revision`, from the read cache when `cached` (the snapshot's
    /// commit has been applied to it), else from etcd (and then kept in the cache).
    pub(crate) fn get_cached(
        &self,
        key: &[u8],
        revision: i64,
        cached: bool,
    ) -> Result<Option<Vec<u8>>> {
        let full = self.data_key(key);
        if cached && let Some(value) = self.inner.cache.get(&full, revision) {
            return Ok(value);
        }
        let value = self.get_at(key, revision)?;
        self.inner.cache.put(full, value.clone(), revision);
        Ok(value)
    }

    pub(crate) fn get_at(&self, key: &[u8], revision: i64) -> Result<Option<Vec<u8>>> {
        self.inner.stats.key_reads.fetch_add(1, Ordering::Relaxed);
        let key = self.data_key(key);
        let mut response = self.call_at(revision, move |mut client, revision| {
            let key = key.clone();
            async move {
                client
                    .get(key, Some(at_revision(GetOptions::new(), revision)))
                    .await
            }
        })?;
        Ok(response
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.into_key_value().1))
    }

    /// Up to `limit` pairs of `[start, end)` at `revision`, ascending or descending; the keys
    /// without the data prefix; and whether more remain.
    pub(crate) fn range_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        limit: i64,
        descending: bool,
    ) -> Result<(Vec<Pair>, bool)> {
        self.inner.stats.range_reads.fetch_add(1, Ordering::Relaxed);
        let (start, end) = (self.data_key(start), self.data_end(end));
        let mut response: GetResponse = self.call_at(revision, move |client, revision| {
            let (start, end) = (start.clone(), end.clone());
            async move {
                let mut options =
                    at_revision(GetOptions::new().with_range(end), revision).with_limit(limit);
                if descending {
                    options = options.with_sort(SortTarget::Key, SortOrder::Descend);
                }
                client
                    .kv_client()
                    .max_decoding_message_size(RANGE_ANSWER_BYTES_MAX)
                    .get(start, Some(options))
                    .await
            }
        })?;
        let more = response.more();
        let skip = self.inner.data.len();
        let pairs = response
            .take_kvs()
            .into_iter()
            .map(|kv| {
                let (key, value) = kv.into_key_value();
                (key[skip..].to_vec(), value)
            })
            .collect();
        Ok((pairs, more))
    }

    /// Visits `[start, end)` at `revision` in pages, with the pairs of `overlay` (a
    /// transaction's writes: `None` deletes) merged in.
    pub(crate) fn visit_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        visit: &mut Visitor<'_>,
    ) -> Result<usize> {
        self.visit_known(start, end, revision, overlay, None, visit)
    }

    /// [`EtcdStore::visit_at`], with every stored pair of the range already `known` (read at
    /// `revision`) when given.
    pub(crate) fn visit_known(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        known: Option<Pairs>,
        visit: &mut Visitor<'_>,
    ) -> Result<usize> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let mut pending = overlay
            .range((Bound::Included(start.to_vec()), upper))
            .peekable();
        let mut visited = 0;
        let mut from = start.to_vec();
        let mut more_pages = known.is_none();
        let mut page_pairs = VISIT_PAGE_PAIRS_FIRST;
        let mut page: std::vec::IntoIter<(Vec<u8>, Vec<u8>)> =
            known.unwrap_or_default().into_iter();
        let mut next_remote = None;
        loop {
            if next_remote.is_none() {
                next_remote = page.next();
                if next_remote.is_none() && more_pages {
                    let (pairs, more) = match self.range_at(&from, end, revision, page_pairs, false)
                    {
                        Err(StoreError::Limit(_)) if page_pairs > 1 => {
                            page_pairs /= 2;
                            continue;
                        }
                        other => other?,
                    };
                    if let Some((last, _)) = pairs.last() {
                        from = [last.as_slice(), &[0]].concat();
                    }
                    let largest = pairs
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 64)
                        .max()
                        .unwrap_or(1);
                    page_pairs =
                        ((VISIT_PAGE_BYTES / largest) as i64).clamp(1, VISIT_PAGE_PAIRS_MAX);
                    more_pages = more && !pairs.is_empty();
                    page = pairs.into_iter();
                    next_remote = page.next();
                }
            }
            // The smaller key of the two sources goes first; on a tie the transaction's write
            // wins and the stored pair is dropped.
            let take_overlay = match (&next_remote, pending.peek()) {
                (None, None) => return Ok(visited),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((key, _)), Some((written, _))) => written.as_slice() <= key.as_slice(),
            };
            let flow = if take_overlay {
                let (key, value) = pending.next().expect("peeked");
                if next_remote.as_ref().is_some_and(|(k, _)| k == key) {
                    next_remote = None;
                }
                match value {
                    Some(value) => {
                        visited += 1;
                        visit(key, value)
                    }
                    None => ControlFlow::Continue(()),
                }
            } else {
                let (key, value) = next_remote.take().expect("checked");
                visited += 1;
                visit(&key, &value)
            };
            if flow.is_break() {
                return Ok(visited);
            }
        }
    }

    /// The greatest pair of `[start, end)` at `revision` that `overlay` does not delete, or the
    /// greatest one `overlay` writes, whichever is greater. etcd sorts a descending range after
    /// reading all of it: O(range) on the server, so calm's hot paths do not use it on etcd
    /// (appends probe forward; the changelog's last index is a counter there).
    pub(crate) fn last_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let written = overlay
            .range((Bound::Included(start.to_vec()), upper))
            .rev()
            .find_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.clone())));
        let mut stored = None;
        let mut below = end.to_vec();
        'pages: loop {
            let (pairs, more) = self.range_at(start, &below, revision, 16, true)?;
            for (key, value) in &pairs {
                if !matches!(overlay.get(key), Some(None)) {
                    stored = Some((key.clone(), value.clone()));
                    break 'pages;
                }
            }
            match pairs.last() {
                Some((key, _)) if more => below = key.clone(),
                _ => break,
            }
        }
        Ok(match (stored, written) {
            (Some(s), Some(w)) => Some(if w.0 >= s.0 { w } else { s }),
            (s, w) => s.or(w),
        })
    }
}

/// A read at `revision`. History at a revision is immutable, so any member that has applied
/// it can answer alone (a serializable read, no round through the leader); one that has not
/// yet answers "future revision", and the read is sent again.
pub(crate) fn at_revision(options: GetOptions, revision: i64) -> GetOptions {
    options.with_revision(revision).with_serializable()
}
