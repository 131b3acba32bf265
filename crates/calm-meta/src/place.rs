//! Where one store sits in a namespace made over several stores, one per metadata cluster
//! (docs/design/etcd-clusters.md): its number, the namespace's count of clusters, and what the
//! number gives the store: handles and slice ids with the number in their top byte, so that a
//! handle names its cluster and no two clusters ever hand out the same handle or object id.
//!
//! A store's place is written once, when the store is formatted (`Splace`), and checked at
//! every opening: a store opened at another place, alone, or with a namespace it was not made
//! for is refused before anything is written.

use calm_store::ReadTxn;

use crate::error::{MetaError, Result};
use crate::layout::{COOKIE_GROUP_BITS, KEY_NAME_HASH, KEY_NAMESPACE_ID, KEY_PLACE, NameHash};
use crate::types::{Handle, ROOT};

/// Most clusters in one namespace: a handle's or slice id's top byte names its cluster, and a
/// slice id's top bit is taken (`crate::slices::INLINE`), so the number has 7 bits.
pub const CLUSTERS_MAX: usize = 128;
/// Where the cluster's number sits in a handle and in a slice id.
pub const CLUSTER_SHIFT: u32 = 56;
/// Handles (and slice ids) one cluster can hand out.
pub const CLUSTER_HANDLES: u64 = 1 << CLUSTER_SHIFT;

const _: () = assert!((CLUSTERS_MAX as u64) << CLUSTER_SHIFT <= crate::slices::INLINE);

/// This store's place in a namespace over several clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The store's cluster number, below `count`.
    pub index: u8,
    /// The namespace's clusters.
    pub count: u8,
    /// Cluster 0's name hash key and identity, which every other cluster takes when it is
    /// formatted (a listing of the root merges the clusters' names in one hash order) and
    /// must have when it is opened; `None` for cluster 0 itself.
    pub namespace: Option<NamespaceKeys>,
}

/// The two random superblock fields a namespace is known by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceKeys {
    /// `Snamehash`: orders names.
    pub name_key: [u8; NameHash::LEN],
    /// `Sid`: the namespace's identity.
    pub id: [u8; 16],
}

impl Place {
    /// Cluster `index` of `count`, refused out of range.
    pub fn new(index: usize, count: usize, namespace: Option<NamespaceKeys>) -> Result<Place> {
        if count == 0 || count > CLUSTERS_MAX || index >= count {
            return Err(MetaError::Invalid(format!(
                "cluster {index} of {count}: a namespace has 1 to {CLUSTERS_MAX} clusters"
            )));
        }
        Ok(Place {
            index: index as u8,
            count: count as u8,
            namespace,
        })
    }

    /// The first handle this cluster hands out (cluster 0's start after the root).
    pub fn first_handle(&self) -> Handle {
        (u64::from(self.index) << CLUSTER_SHIFT).max(ROOT + 1)
    }

    /// The first slice id this cluster hands out (cluster 0's: the store's usual start).
    pub fn first_slice_id(&self) -> u64 {
        u64::from(self.index) << CLUSTER_SHIFT
    }

    /// `Splace`: the number and the count.
    pub fn encode(&self) -> [u8; 2] {
        [self.index, self.count]
    }

    /// Whether `stored` (a `Splace` value) is this place.
    pub fn matches(&self, stored: &[u8]) -> bool {
        stored == self.encode()
    }
}

/// The cluster a handle was handed out by (the root, handle 1, is every cluster's: see
/// docs/design/etcd-clusters.md).
pub fn cluster_of(handle: Handle) -> usize {
    (handle >> CLUSTER_SHIFT) as usize
}

/// The cluster of `count` holding a name of the root whose hash (the namespace's name hash) is
/// `hash`. Fixed for the namespace's life: its key and its count of clusters never change.
pub fn root_cluster(hash: u64, count: usize) -> usize {
    ((hash >> COOKIE_GROUP_BITS) % count.max(1) as u64) as usize
}

/// The cluster a slice id was handed out by.
pub fn cluster_of_slice(id: u64) -> usize {
    ((id & !crate::slices::INLINE) >> CLUSTER_SHIFT) as usize
}

/// Describes a `Splace` value for an error.
pub fn describe(stored: &[u8]) -> String {
    match stored {
        [index, count] => format!("cluster {index} of {count}"),
        other => format!("an unreadable place ({} bytes)", other.len()),
    }
}

/// The namespace's name hash key and identity, as the superblock of `snap` holds them.
pub fn namespace_keys<R: ReadTxn + ?Sized>(snap: &R) -> Result<NamespaceKeys> {
    let field = |key: &[u8]| -> Result<[u8; 16]> {
        snap.get(key)?
            .and_then(|value| <[u8; 16]>::try_from(value.as_ref()).ok())
            .ok_or_else(|| {
                MetaError::Corrupt(format!(
                    "superblock field {} is missing or not 16 bytes",
                    String::from_utf8_lossy(key)
                ))
            })
    };
    Ok(NamespaceKeys {
        name_key: field(KEY_NAME_HASH)?,
        id: field(KEY_NAMESPACE_ID)?,
    })
}

/// Refuses a store opened at a place it was not made for: alone when it is one cluster of
/// several, as a cluster when it was made alone, at another number or count, or with another
/// namespace's keys.
pub(crate) fn check<T: ReadTxn + ?Sized>(txn: &T, place: Option<&Place>) -> Result<()> {
    let stored = txn.get(KEY_PLACE)?;
    match (stored.as_deref(), place) {
        (None, None) => Ok(()),
        (None, Some(place)) if place.count == 1 => Ok(()),
        (None, Some(place)) => Err(MetaError::Invalid(format!(
            "this store holds a namespace of its own; it cannot become cluster {} of {} \
             (a namespace's clusters are chosen when it is made)",
            place.index, place.count
        ))),
        (Some(stored), None) => Err(MetaError::Invalid(format!(
            "this store is {} of a namespace over several metadata clusters: open it with \
             the others, in their order",
            describe(stored)
        ))),
        (Some(stored), Some(place)) if !place.matches(stored) => Err(MetaError::Invalid(format!(
            "this store is {} of its namespace, not cluster {} of {}: give the clusters in \
             the order the namespace was made with",
            describe(stored),
            place.index,
            place.count
        ))),
        (Some(_), Some(place)) => match place.namespace {
            Some(keys)
                if txn.get(KEY_NAME_HASH)?.as_deref() != Some(&keys.name_key[..])
                    || txn.get(KEY_NAMESPACE_ID)?.as_deref() != Some(&keys.id[..]) =>
            {
                Err(MetaError::Invalid(format!(
                    "cluster {} belongs to another namespace than cluster 0",
                    place.index
                )))
            }
            _ => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_slice_ids_name_their_cluster() {
        for index in [0usize, 1, 2, 127] {
            let place = Place::new(index, 128, None).unwrap();
            assert_eq!(cluster_of(place.first_handle()), index);
            assert_eq!(
                cluster_of(place.first_handle() + CLUSTER_HANDLES - 3),
                index
            );
            assert_eq!(cluster_of_slice(place.first_slice_id() + 5), index);
            assert_eq!(
                cluster_of_slice((place.first_slice_id() + 5) | crate::slices::INLINE),
                index
            );
        }
        assert_eq!(Place::new(0, 1, None).unwrap().first_handle(), ROOT + 1);
    }

    #[test]
    fn a_place_out_of_range_is_refused() {
        assert!(Place::new(0, 0, None).is_err());
        assert!(Place::new(2, 2, None).is_err());
        assert!(Place::new(0, CLUSTERS_MAX + 1, None).is_err());
    }
}
