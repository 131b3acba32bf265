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
        let (l, r) = self.split(self.root, (start, owner));
        let l = self.merge(l, n);
        self.root = self.merge(l, r);
        self.len += 1;
    }

    /// Removes the read lock keyed `(start, owner)`; returns whether it was there.
    pub fn remove(&mut self, start: u64, owner: u64) -> bool {
        let (l, r) = self.split(self.root, (start, owner));
        let (m, r) = match owner.checked_add(1) {
            Some(next) => self.split(r, (start, next)),
            None => match start.checked_add(1) {
                Some(next) => self.split(r, (next, 0)),
                None => (r, NIL),
            },
        };
        let found = m != NIL;
        if found {
            debug_assert_eq!(self.key(m), (start, owner));
            self.free.push(m);
            self.len -= 1;
        }
        self.root = self.merge(l, r);
        found
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
