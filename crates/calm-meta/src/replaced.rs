//! Files replaced moments ago stay readable by their handle: the last contents of a small file
//! that lost its last name to a rename over it (a program saving `f.tmp` as `f`).
//!
//! Another mount's kernel may still hold the name `f` as the file it replaced (the change
//! reaches every mount about a millisecond after its commit), or may have looked the name up
//! just before the rename: its open then names a file that is gone. The kernel answers such an
//! open's ESTALE by looking the name up again and opening once more, but a writer that replaces
//! the file again between that lookup and that open (a loop saving a file hundreds of times a
//! second) makes the caller see ESTALE. So the committer keeps, for
//! [`REPLACED_READABLE_FOR`], the final map of each file replaced that way whose bytes are all
//! kept beside its records (inline: no object to be deleted), and the server answers an open
//! by that handle with it: the open reads the file as it was when the name was looked up, as
//! it would on a local file system where the open came first.
//!
//! Pure: time is given. Files of at most [`REPLACED_FILE_BYTES_MAX`]; bounded by count ([`REPLACED_KEPT_MAX`]) and bytes
//! ([`REPLACED_BYTES_MAX`]); the oldest go first.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::FileMap;
use crate::perm::Owner;
use crate::types::Handle;

/// How long a replaced file stays readable by its handle.
pub const REPLACED_READABLE_FOR: Duration = Duration::from_secs(1);
/// The largest file kept.
pub const REPLACED_FILE_BYTES_MAX: u64 = 64 << 10;
/// Replaced files kept at most.
pub const REPLACED_KEPT_MAX: usize = 4096;
/// Bytes of replaced files' contents kept at most.
pub const REPLACED_BYTES_MAX: u64 = 16 << 20;

/// The last maps of files replaced lately, by handle.
#[derive(Debug, Default)]
pub struct Replaced {
    maps: HashMap<Handle, (i64, ReplacedFile)>,
    /// `(replaced_ns, handle)` in the order kept; an entry whose handle was kept again later
    /// is skipped when it comes out.
    order: VecDeque<(i64, Handle)>,
    bytes: u64,
}

/// A replaced file as it was when it lost its last name: its map (with no link left) and
/// who may read it.
#[derive(Debug, Clone)]
pub struct ReplacedFile {
    pub map: FileMap,
    pub owner: Owner,
}

/// The bytes a kept map holds.
fn map_bytes(file: &ReplacedFile) -> u64 {
    file.map
        .inline
        .iter()
        .map(|(_, data)| data.len() as u64)
        .sum()
}

impl Replaced {
    /// Keeps `map`, the final map of a file replaced at `now_ns`; drops what is too old or
    /// over the bounds.
    pub fn keep(&mut self, mut file: ReplacedFile, now_ns: i64) {
        let bytes = map_bytes(&file);
        if bytes > REPLACED_BYTES_MAX {
            return;
        }
        file.map.attr.nlink = 0;
        let handle = file.map.attr.handle;
        if let Some((_, old)) = self.maps.insert(handle, (now_ns, file)) {
            self.bytes -= map_bytes(&old);
        }
        self.bytes += bytes;
        self.order.push_back((now_ns, handle));
        self.expire(now_ns);
        while self.maps.len() > REPLACED_KEPT_MAX || self.bytes > REPLACED_BYTES_MAX {
            if !self.drop_oldest() {
                break;
            }
        }
    }

    /// The final map of `handle` if it was replaced less than [`REPLACED_READABLE_FOR`]
    /// before `now_ns`.
    pub fn get(&self, handle: Handle, now_ns: i64) -> Option<ReplacedFile> {
        let (at, file) = self.maps.get(&handle)?;
        (now_ns.saturating_sub(*at) < readable_ns()).then(|| file.clone())
    }

    /// Files kept now.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// Nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Drops every file replaced [`REPLACED_READABLE_FOR`] or longer before `now_ns`.
    pub fn expire(&mut self, now_ns: i64) {
        while let Some(&(at, _)) = self.order.front() {
            if now_ns.saturating_sub(at) < readable_ns() {
                break;
            }
            self.drop_oldest();
        }
    }

    /// Drops the oldest entry of the order (and its map, unless the handle was kept again
    /// since); false when there is none.
    fn drop_oldest(&mut self) -> bool {
        let Some((at, handle)) = self.order.pop_front() else {
            return false;
        };
        if self.maps.get(&handle).is_some_and(|(kept, _)| *kept == at)
            && let Some((_, file)) = self.maps.remove(&handle)
        {
            self.bytes -= map_bytes(&file);
        }
        true
    }
}

fn readable_ns() -> i64 {
    REPLACED_READABLE_FOR.as_nanos() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Attr, Kind};
    use proptest::prelude::*;

    fn map(handle: Handle, bytes: usize) -> ReplacedFile {
        let map = FileMap {
            attr: Attr {
                handle,
                generation: 1,
                kind: Kind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                nlink: 1,
                size: bytes as u64,
                rdev: 0,
                atime_ns: 0,
                mtime_ns: 0,
                ctime_ns: 0,
            },
            chunks: Vec::new(),
            more: false,
            inline: vec![(handle, vec![7; bytes])],
        };
        let owner = Owner {
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            acl: None,
        };
        ReplacedFile { map, owner }
    }

    const SECOND: i64 = 1_000_000_000;

    #[test]
    fn a_replaced_file_is_readable_for_a_second_with_no_link() {
        let mut replaced = Replaced::default();
        replaced.keep(map(5, 10), 100);
        let got = replaced.get(5, 100 + SECOND - 1).expect("kept");
        assert_eq!((got.map.attr.nlink, got.map.inline[0].1.len()), (0, 10));
        assert!(replaced.get(5, 100 + SECOND).is_none());
        assert!(replaced.get(6, 100).is_none());
        replaced.expire(100 + SECOND);
        assert!(replaced.is_empty());
    }

    proptest! {
        /// Against a model that keeps everything with its time: the same answers within the
        /// bounds, never more than the bounds, and only what the model has.
        #[test]
        fn answers_what_a_model_keeps(
            steps in proptest::collection::vec((0u64..64, 0usize..(1 << 21), 0i64..SECOND / 4, any::<bool>()), 1..300)
        ) {
            let mut replaced = Replaced::default();
            let mut model: HashMap<Handle, (i64, usize)> = HashMap::new();
            let mut now = 0i64;
            for (handle, bytes, step, keep) in steps {
                now += step;
                if keep {
                    replaced.keep(map(handle, bytes), now);
                    if bytes as u64 <= REPLACED_BYTES_MAX {
                        model.insert(handle, (now, bytes));
                    }
                }
                let got = replaced.get(handle, now);
                match (got, model.get(&handle)) {
                    (Some(got), Some((at, bytes))) => {
                        prop_assert!(now - at < SECOND);
                        prop_assert_eq!(got.map.inline[0].1.len(), *bytes);
                    }
                    (Some(_), None) => prop_assert!(false, "kept what the model does not have"),
                    // Dropped: too old, or the bounds made room.
                    (None, _) => {}
                }
                // What was kept at this step is there.
                if keep && bytes as u64 <= REPLACED_BYTES_MAX {
                    prop_assert!(replaced.get(handle, now).is_some());
                }
                prop_assert!(replaced.len() <= REPLACED_KEPT_MAX);
                prop_assert!(replaced.bytes <= REPLACED_BYTES_MAX);
                let sum: u64 = replaced.maps.values().map(|(_, m)| map_bytes(m)).sum();
                prop_assert_eq!(sum, replaced.bytes);
            }
        }
    }
}
