//! An interval treap over an arena: the read locks of one resource, which (unlike write locks)
//! may overlap each other when their owners differ, and the ranges waiters ask for. Keys are `(start, owner)`; each node keeps
//! the largest `end` of its subtree, so "find a lock overlapping [a, b]" descends only into
//! subtrees that can hold one: O(log n + k) expected, k = locks overlapping.
//!
//! Priorities come from a fixed-seed xorshift, so the structure is deterministic.

/// No node.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    start: u64,
    /// Inclusive.
    end: u64,
    max_end: u64,
    owner: u64,
    left: u32,
    right: u32,
    priority: u32,
}

/// The set of read locks of one resource.
#[derive(Debug, Clone)]
pub struct Treap {
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    rng: u32,
    len: usize,
}

impl Default for Treap {
    fn default() -> Self {
        Self::new()
    }
}

impl Treap {
    pub fn new() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            rng: 0x9e37_79b9,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of arena per stored lock (for the memory figure).
    pub const NODE_BYTES: usize = std::mem::size_of::<Node>();

    fn next_priority(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng = x;
        x
    }

    fn max_end(&self, n: u32) -> Option<u64> {
        (n != NIL).then(|| self.nodes[n as usize].max_end)
    }

    fn update(&mut self, n: u32) {
        let node = self.nodes[n as usize];
        let mut m = node.end;
        if let Some(l) = self.max_end(node.left) {
            m = m.max(l);
        }
        if let Some(r) = self.max_end(node.right) {
            m = m.max(r);
        }
        self.nodes[n as usize].max_end = m;
    }

    fn key(&self, n: u32) -> (u64, u64) {
        let node = &self.nodes[n as usize];
        (node.start, node.owner)
    }

    /// Splits `t` into keys `< key` and keys `>= key`.
    fn split(&mut self, t: u32, key: (u64, u64)) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.key(t) < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.update(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.update(t);
            (l, t)
        }
    }

    /// Joins `l` and `r`, every key of `l` below every key of `r`.
    fn merge(&mut self, l: u32, r: u32) -> u32 {
        if l == NIL {
            return r;
        }
        if r == NIL {
            return l;
        }
        if self.nodes[l as usize].priority > self.nodes[r as usize].priority {
            let m = self.merge(self.nodes[l as usize].right, r);
            self.nodes[l as usize].right = m;
            self.update(l);
            l
        } else {
            let m = self.merge(l, self.nodes[r as usize].left);
            self.nodes[r as usize].left = m;
            self.update(r);
            r
        }
    }

    /// Adds the read lock `[start, end]` of `owner`. The key `(start, owner)` must be new.
    /// One descent: down to where the new node's priority puts it, then one split of the
    /// subtree below (expected O(1) nodes).
    pub fn insert(&mut self, start: u64, end: u64, owner: u64) {
        let node = Node {
            start,
            end,
            max_end: end,
            owner,
            left: NIL,
            right: NIL,
            priority: self.next_priority(),
        };
        let n = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.root = self.insert_at(self.root, n);
        self.len += 1;
    }

    fn insert_at(&mut self, t: u32, n: u32) -> u32 {
        if t == NIL {
            return n;
        }
        if self.nodes[n as usize].priority > self.nodes[t as usize].priority {
            let (l, r) = self.split(t, self.key(n));
            self.nodes[n as usize].left = l;
            self.nodes[n as usize].right = r;
            self.update(n);
            return n;
        }
        if self.key(n) < self.key(t) {
            let child = self.insert_at(self.nodes[t as usize].left, n);
            self.nodes[t as usize].left = child;
        } else {
            let child = self.insert_at(self.nodes[t as usize].right, n);
            self.nodes[t as usize].right = child;
        }
        self.update(t);
        t
    }

    /// Removes the read lock keyed `(start, owner)`; returns whether it was there. One
    /// descent to the node, then one merge of its two subtrees.
    pub fn remove(&mut self, start: u64, owner: u64) -> bool {
        let (root, found) = self.remove_at(self.root, (start, owner));
        self.root = root;
        if found {
            self.len -= 1;
        }
        found
    }

    fn remove_at(&mut self, t: u32, key: (u64, u64)) -> (u32, bool) {
        if t == NIL {
            return (NIL, false);
        }
        let here = self.key(t);
        if here == key {
            let node = self.nodes[t as usize];
            self.free.push(t);
            return (self.merge(node.left, node.right), true);
        }
        let found = if key < here {
            let (child, found) = self.remove_at(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = child;
            found
        } else {
            let (child, found) = self.remove_at(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = child;
            found
        };
        if found {
            self.update(t);
        }
        (t, found)
    }

    /// Calls `visit(start, end, owner)` for every entry overlapping `[a, b]`, in key order,
    /// until it returns false. Returns false when stopped. Descends only into subtrees whose
    /// largest `end` reaches `a` and whose keys can start at or before `b`.
    pub fn visit_overlaps(
        &self,
        a: u64,
        b: u64,
        visit: &mut dyn FnMut(u64, u64, u64) -> bool,
    ) -> bool {
        self.visit_in(self.root, a, b, visit)
    }

    fn visit_in(
        &self,
        t: u32,
        a: u64,
        b: u64,
        visit: &mut dyn FnMut(u64, u64, u64) -> bool,
    ) -> bool {
        if t == NIL || self.nodes[t as usize].max_end < a {
            return true;
        }
        let node = self.nodes[t as usize];
        if !self.visit_in(node.left, a, b, visit) {
            return false;
        }
        if node.start > b {
            return true;
        }
        if node.end >= a && !visit(node.start, node.end, node.owner) {
            return false;
        }
        self.visit_in(node.right, a, b, visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Treap {
        /// Order, heap and `max_end` invariants of the subtree `t`; returns its size.
        fn check(&self, t: u32, low: Option<(u64, u64)>, high: Option<(u64, u64)>) -> usize {
            if t == NIL {
                return 0;
            }
            let node = self.nodes[t as usize];
            let key = (node.start, node.owner);
            assert!(
                low.is_none_or(|l| l < key) && high.is_none_or(|h| key < h),
                "order"
            );
            let mut max_end = node.end;
            for child in [node.left, node.right] {
                if child != NIL {
                    let c = self.nodes[child as usize];
                    assert!(c.priority <= node.priority, "heap");
                    max_end = max_end.max(c.max_end);
                }
            }
            assert_eq!(node.max_end, max_end, "max_end");
            1 + self.check(node.left, low, Some(key)) + self.check(node.right, Some(key), high)
        }
    }

    #[test]
    fn the_treap_matches_a_list_on_random_operations() {
        let mut treap = Treap::new();
        let mut model: Vec<(u64, u64, u64)> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (start, owner) = ((x >> 8) % 200, (x >> 20) % 4);
            let end = start + (x >> 30) % 20;
            match x % 3 {
                0 | 1 if !model.iter().any(|m| (m.0, m.2) == (start, owner)) => {
                    treap.insert(start, end, owner);
                    model.push((start, end, owner));
                }
                _ => {
                    let present = model.iter().position(|m| (m.0, m.2) == (start, owner));
                    assert_eq!(treap.remove(start, owner), present.is_some());
                    if let Some(i) = present {
                        model.swap_remove(i);
                    }
                }
            }
            let (a, b) = ((x >> 40) % 220, (x >> 40) % 220 + (x >> 50) % 30);
            let mut seen = Vec::new();
            treap.visit_overlaps(a, b, &mut |s, e, o| {
                seen.push((s, e, o));
                true
            });
            let mut expected: Vec<(u64, u64, u64)> = model
                .iter()
                .copied()
                .filter(|(s, e, _)| *s <= b && a <= *e)
                .collect();
            expected.sort_by_key(|(s, _, o)| (*s, *o));
            assert_eq!(seen, expected);
            assert_eq!(treap.check(treap.root, None, None), model.len());
            assert_eq!(treap.len(), model.len());
        }
    }
}
