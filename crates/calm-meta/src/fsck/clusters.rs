//! The checks of a namespace over several clusters' stores (docs/design/etcd-clusters.md), once
//! each store was checked alone: the stores given are the namespace's clusters, all of them, in
//! its order; they belong to one namespace (one identity, one name hash); and its root is one
//! (every cluster's root has cluster 0's owner and mode, which cannot be changed). Within one
//! store, that every name of its root is one its hash places there is the store's own check
//! (`names`): no name or inode crosses clusters, so nothing else refers from one to another.

use crate::place::{CLUSTERS_MAX, NamespaceKeys, describe};

/// What a store says of the namespace it belongs to, read by its check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    /// `Splace` as stored; `None`: the store of a namespace of one store.
    pub place: Option<Vec<u8>>,
    /// `Snamehash` and `Sid` (`None`: missing or unreadable, which the store's check reports).
    pub keys: Option<NamespaceKeys>,
    /// The root's owner and mode (`None`: no root, which the store's check reports).
    pub root: Option<RootOwner>,
}

impl Membership {
    /// `(index, count)` when the store is a cluster of a namespace over several.
    pub fn cluster(&self) -> Option<(usize, usize)> {
        match self.place.as_deref() {
            Some([index, count]) if index < count && *count > 1 => {
                Some((usize::from(*index), usize::from(*count)))
            }
            _ => None,
        }
    }
}

/// A root's owner, group and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootOwner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// The problems of `members` as one namespace, given as its clusters cluster 0 first. One
/// store is a namespace of its own, or one cluster checked alone: nothing to compare.
pub fn check_clusters(members: &[Membership]) -> Vec<String> {
    let mut problems = Vec::new();
    let count = members.len();
    if count < 2 {
        return problems;
    }
    if count > CLUSTERS_MAX {
        problems.push(format!(
            "{count} stores given: a namespace has at most {CLUSTERS_MAX} clusters"
        ));
        return problems;
    }
    let expected_count = members.iter().find_map(|m| m.cluster()).map(|(_, n)| n);
    for (index, member) in members.iter().enumerate() {
        match member.place.as_deref() {
            Some(stored) if stored == [index as u8, count as u8] => {}
            None => problems.push(format!(
                "the store given as cluster {index} holds a namespace of its own, not a \
                 cluster of one over several"
            )),
            Some(stored) => problems.push(format!(
                "the store given as cluster {index} is {}: give every cluster's store, \
                 cluster 0 first, in the namespace's order",
                describe(stored)
            )),
        }
    }
    if let Some(expected) = expected_count
        && expected != count
    {
        problems.push(format!(
            "{count} stores given for a namespace of {expected} clusters"
        ));
    }
    let first = &members[0];
    for (index, member) in members.iter().enumerate().skip(1) {
        if let (Some(ours), Some(theirs)) = (&first.keys, &member.keys) {
            if ours.id != theirs.id {
                problems.push(format!(
                    "the store given as cluster {index} belongs to another namespace than \
                     cluster 0's (their identities differ)"
                ));
            } else if ours.name_key != theirs.name_key {
                problems.push(format!(
                    "cluster {index} orders names by another key than cluster 0: the root's \
                     names are not where lookups look for them"
                ));
            }
        }
        if let (Some(ours), Some(theirs)) = (first.root, member.root)
            && ours != theirs
        {
            problems.push(format!(
                "the root on cluster {index} has owner {}:{} and mode {:o}, on cluster 0 {}:{} \
                 and mode {:o}: the namespace's root is one directory",
                theirs.uid, theirs.gid, theirs.mode, ours.uid, ours.gid, ours.mode
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(index: u8, count: u8, id: u8) -> Membership {
        Membership {
            place: Some(vec![index, count]),
            keys: Some(NamespaceKeys {
                name_key: [id; 16],
                id: [id; 16],
            }),
            root: Some(RootOwner {
                uid: 0,
                gid: 0,
                mode: 0o755,
            }),
        }
    }

    #[test]
    fn the_clusters_in_order_of_one_namespace_are_clean() {
        let members: Vec<_> = (0..3).map(|i| member(i, 3, 7)).collect();
        assert_eq!(check_clusters(&members), Vec::<String>::new());
        // One store alone: nothing to compare, whatever it is.
        assert!(check_clusters(&members[1..2]).is_empty());
        assert!(check_clusters(&[Membership::default()]).is_empty());
    }

    #[test]
    fn each_way_of_not_being_one_namespace_is_named() {
        let swapped = [member(1, 3, 7), member(0, 3, 7), member(2, 3, 7)];
        let problems = check_clusters(&swapped);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("given as cluster 0 is cluster 1 of 3"));

        let fewer = [member(0, 3, 7), member(1, 3, 7)];
        let problems = check_clusters(&fewer);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("2 stores given for a namespace of 3 clusters")),
            "{problems:?}"
        );

        let alone = [member(0, 2, 7), Membership::default()];
        assert!(check_clusters(&alone)[0].contains("namespace of its own"));

        let mixed = [member(0, 2, 7), member(1, 2, 8)];
        let problems = check_clusters(&mixed);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("another namespace"));

        let mut rekeyed = member(1, 2, 7);
        rekeyed.keys.as_mut().unwrap().name_key = [9; 16];
        let problems = check_clusters(&[member(0, 2, 7), rekeyed]);
        assert!(problems[0].contains("another key"), "{problems:?}");

        let mut chmodded = member(1, 2, 7);
        chmodded.root.as_mut().unwrap().mode = 0o700;
        let problems = check_clusters(&[member(0, 2, 7), chmodded]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("mode 700, on cluster 0 0:0 and mode 755"),
            "{problems:?}"
        );
    }
}
