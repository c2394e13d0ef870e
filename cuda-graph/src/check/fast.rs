//! The fast check: a graph in record order (every dependency earlier than its node) whose
//! allocations each live within 64 consecutive nodes (the nodes that allocate, use and free it
//! lie in a stretch of 64), which is what chains of alloc → users → free look like. One forward
//! pass gives every node its ancestors among the 64 nodes before it as a 64-bit set (a path
//! between two nodes only passes through nodes between them); each rule is then a bit test.
//! It only confirms: when a rule fails, or the graph is not of this shape, [`verify`] says no
//! and the general check runs, finds the violations and names them.

use super::{AllocKey, Model};
use crate::alloc::GraphAllocation;
use crate::graph::{Graph, MemOp};
use crate::int_hash::IdMap;

/// The stretch of nodes, before a node, that its ancestor set covers.
const W: usize = 64;

/// What a node does to an allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ref {
    Alloc,
    Free,
    Use,
}

/// Role bits: the graph allocates, frees or uses the allocation.
pub(super) const ALLOCATES: u8 = 1;
pub(super) const FREES: u8 = 2;
pub(super) const USES: u8 = 4;

/// A graph as the checks read it: the builder's record or a [`Model`].
pub(super) trait View {
    /// Names one allocation.
    type Key: Copy;
    /// A number unique to the allocation.
    fn id(key: Self::Key) -> u64;
    fn node_count(&self) -> usize;
    /// Calls `f` with each dependency of `node`; `false` when one points nowhere.
    fn each_dep(&self, node: usize, f: impl FnMut(usize)) -> bool;
    /// Calls `f` with each allocation `node` allocates, frees or uses; `false` when one does
    /// not exist.
    fn each_ref(&self, node: usize, f: impl FnMut(Ref, Self::Key)) -> bool;
    /// Whether another graph frees `key` too.
    fn freed_elsewhere(&self, key: Self::Key) -> bool;
}

/// One allocation: the nodes that allocate, free and use it, as bits counted from `first`.
#[derive(Clone, Copy)]
struct Entry<K> {
    key: K,
    id: u64,
    first: usize,
    allocs: u64,
    frees: u64,
    users: u64,
}

/// Finds an allocation's entry by its id. Entries are made in the order the graph first names
/// the allocations; while their ids rise with that order (allocations of the graph's own alloc
/// nodes, made in order, have rising ids), an id above the newest is new and the others are
/// found by binary search. From the first id out of order on, a hash map finds them.
#[derive(Default)]
struct Lookup {
    unordered: bool,
    map: IdMap<u64, usize>,
}

impl Lookup {
    #[inline(always)]
    fn find<K>(&self, entries: &[Entry<K>], id: u64) -> Option<usize> {
        if self.unordered {
            return self.map.get(&id).copied();
        }
        let newest = entries.last()?;
        if id > newest.id {
            return None;
        }
        if id == newest.id {
            return Some(entries.len() - 1);
        }
        entries.binary_search_by_key(&id, |e| e.id).ok()
    }

    /// The newest entry was just added.
    #[inline(always)]
    fn added<K>(&mut self, entries: &[Entry<K>]) {
        let newest = entries.len() - 1;
        if self.unordered {
            self.map.insert(entries[newest].id, newest);
        } else if newest > 0 && entries[newest].id < entries[newest - 1].id {
            self.unordered = true;
            self.map = entries
                .iter()
                .enumerate()
                .map(|(at, e)| (e.id, at))
                .collect();
        }
    }
}

/// Whether `view` has the fast check's shape and breaks no rule (`check`), or only whether it
/// has the shape (`!check`). When it says yes, it has called `role` with each allocation and
/// its role bits, in the order the graph first names them; when it says no, it has called
/// nothing.
pub(super) fn verify<V: View>(view: &V, check: bool, mut role: impl FnMut(V::Key, u8)) -> bool {
    let n = view.node_count();
    // ancestors[i], bit b: node i - 1 - b is an ancestor of node i.
    let mut inline = [0u64; W];
    let mut heap = Vec::new();
    let ancestors: &mut [u64] = if n <= W {
        &mut inline[..n]
    } else {
        heap.resize(n, 0);
        &mut heap
    };
    let mut entries: Vec<Entry<V::Key>> = Vec::with_capacity(n / 2 + 1);
    let mut lookup = Lookup::default();
    for i in 0..n {
        let mut set = 0u64;
        let mut earlier = true;
        let known = view.each_dep(i, |d| {
            if d >= i {
                earlier = false;
                return;
            }
            let distance = i - d;
            if distance <= W {
                set |= 1 << (distance - 1);
            }
            if distance < W {
                set |= ancestors[d] << distance;
            }
        });
        if !(known && earlier) {
            return false;
        }
        ancestors[i] = set;
        let mut fits = true;
        let known = view.each_ref(i, |what, key| {
            let id = V::id(key);
            let at = match lookup.find(&entries, id) {
                Some(at) => at,
                None => {
                    entries.push(Entry {
                        key,
                        id,
                        first: i,
                        allocs: 0,
                        frees: 0,
                        users: 0,
                    });
                    lookup.added(&entries);
                    entries.len() - 1
                }
            };
            let e = &mut entries[at];
            let offset = i - e.first;
            if offset >= W {
                fits = false;
                return;
            }
            let bits = match what {
                Ref::Alloc => &mut e.allocs,
                Ref::Free => &mut e.frees,
                Ref::Use => &mut e.users,
            };
            *bits |= 1 << offset;
        });
        if !(known && fits) {
            return false;
        }
    }
    let entries = entries.iter();
    if check && !entries.clone().all(|e| obeys(view, e, ancestors)) {
        return false;
    }
    for e in entries {
        let bits = [(e.allocs, ALLOCATES), (e.frees, FREES), (e.users, USES)]
            .iter()
            .filter(|(nodes, _)| *nodes != 0)
            .fold(0, |acc, (_, bit)| acc | bit);
        role(e.key, bits);
    }
    true
}

/// Rules 1 to 3 for one allocation.
fn obeys<V: View>(view: &V, e: &Entry<V::Key>, ancestors: &[u64]) -> bool {
    if e.allocs.count_ones() > 1 || e.frees.count_ones() > 1 {
        return false;
    }
    if e.frees != 0 && view.freed_elsewhere(e.key) {
        return false;
    }
    // Whether a path leads from node `first + from` to node `first + to` (offsets < 64).
    let reaches =
        |from: usize, to: usize| to > from && ancestors[e.first + to] >> (to - from - 1) & 1 == 1;
    if e.allocs != 0 {
        let a = e.allocs.trailing_zeros() as usize;
        if !bits((e.users | e.frees) & !e.allocs).all(|t| reaches(a, t)) {
            return false;
        }
    }
    if e.frees != 0 {
        let f = e.frees.trailing_zeros() as usize;
        if !bits(e.users & !e.frees).all(|u| reaches(u, f)) {
            return false;
        }
    }
    true
}

/// The positions of the set bits.
fn bits(mut set: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (set != 0).then(|| {
            let i = set.trailing_zeros() as usize;
            set &= set - 1;
            i
        })
    })
}

/// A graph allocation of the record.
#[derive(Clone, Copy)]
pub(super) struct ById<'g>(pub(super) &'g GraphAllocation);

impl<'g> View for &'g Graph {
    type Key = ById<'g>;

    fn id(key: ById<'g>) -> u64 {
        key.0.id()
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    #[inline(always)]
    fn each_dep(&self, node: usize, mut f: impl FnMut(usize)) -> bool {
        self.nodes[node].deps.each(|&d| f(d as usize));
        true
    }

    #[inline(always)]
    fn each_ref(&self, node: usize, mut f: impl FnMut(Ref, ById<'g>)) -> bool {
        let record = &self.nodes[node];
        record.mem.each(|op| match op {
            MemOp::Alloc(a) => f(Ref::Alloc, ById(a)),
            MemOp::Free(a) => f(Ref::Free, ById(a)),
        });
        record.uses.each(|a| f(Ref::Use, ById(a)));
        true
    }

    fn freed_elsewhere(&self, key: ById<'g>) -> bool {
        key.0.freed_by_another_graph(self.id)
    }
}

impl View for Model {
    type Key = AllocKey;

    fn id(key: AllocKey) -> u64 {
        key.0 as u64
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn each_dep(&self, node: usize, mut f: impl FnMut(usize)) -> bool {
        let n = self.nodes.len();
        for &d in &self.nodes[node].deps {
            if d >= n {
                return false;
            }
            f(d);
        }
        true
    }

    fn each_ref(&self, node: usize, mut f: impl FnMut(Ref, AllocKey)) -> bool {
        let keys = self.allocations.len();
        let record = &self.nodes[node];
        let lists = [
            (Ref::Alloc, &record.allocs),
            (Ref::Free, &record.frees),
            (Ref::Use, &record.uses),
        ];
        for (what, list) in lists {
            for &k in list {
                if k.0 >= keys {
                    return false;
                }
                f(what, k);
            }
        }
        true
    }

    fn freed_elsewhere(&self, key: AllocKey) -> bool {
        self.freed_elsewhere.contains(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Model, Pairs};
    use super::verify;
    use crate::graph::NodeKind;

    fn general_passes(m: &Model) -> bool {
        Pairs::from_model(m).check().is_empty()
    }

    /// alloc → kernel → free, `k` times, each segment after the previous free.
    fn chain(k: usize) -> Model {
        let mut m = Model::new();
        let mut prev: Vec<usize> = Vec::new();
        for _ in 0..k {
            let a = m.add_allocation("a");
            let alloc = m.add_node(NodeKind::MemAlloc, &prev);
            m.allocates(alloc, a);
            let kernel = m.add_node(NodeKind::Kernel("k".into()), &[alloc]);
            m.uses(kernel, a);
            let free = m.add_node(NodeKind::MemFree, &[kernel]);
            m.frees(free, a);
            prev = vec![free];
        }
        m
    }

    #[test]
    fn confirms_small_legal_graphs_and_declines_the_rest() {
        assert!(verify(&chain(1), true, |_, _| {}));
        assert!(verify(&chain(21), true, |_, _| {}));
        // Longer than one 64-bit set: each allocation still lives within 64 nodes.
        assert!(verify(&chain(1000), true, |_, _| {}));
        // An allocation that lives across 70 nodes is not for the fast check.
        let mut m = chain(1);
        let last = (0..70).fold(2, |prev, _| m.add_node(NodeKind::Empty, &[prev]));
        let user = m.add_node(NodeKind::Kernel("k".into()), &[last]);
        m.uses(user, super::AllocKey(0));
        assert!(!general_passes(&m) && !verify(&m, true, |_, _| {}));
        let mut m = chain(1);
        m.nodes[2].deps = vec![1];
        let free = 2;
        m.nodes[free].frees.clear();
        let late = (0..70).fold(free, |prev, _| m.add_node(NodeKind::Empty, &[prev]));
        let late_free = m.add_node(NodeKind::MemFree, &[late]);
        m.frees(late_free, super::AllocKey(0));
        assert!(general_passes(&m) && !verify(&m, true, |_, _| {}));

        // The kernel loses its edge from the alloc node: not ordered after it.
        let mut m = chain(2);
        m.nodes[1].deps.clear();
        assert!(!general_passes(&m) && !verify(&m, true, |_, _| {}));
        // Without the check the roles still come back.
        let mut roles = Vec::new();
        assert!(verify(&m, false, |k, bits| roles.push((k.0, bits))));
        assert_eq!(roles, vec![(0, 7), (1, 7)]);

        // A dependency on a later node: legal, but not in the record's order.
        let mut m = Model::new();
        let a = m.add_allocation("a");
        let kernel = m.add_node(NodeKind::Kernel("k".into()), &[1]);
        let alloc = m.add_node(NodeKind::MemAlloc, &[]);
        m.allocates(alloc, a);
        m.uses(kernel, a);
        assert!(general_passes(&m) && !verify(&m, true, |_, _| {}));
    }

    /// On random in-order graphs the answer is exactly the general check's, as long as every
    /// allocation lives within 64 nodes (otherwise it declines).
    #[test]
    fn agrees_with_the_general_check() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n.max(1) as u64) as usize
        };
        let (mut confirmed, mut declined, mut large) = (0, 0, 0);
        for case in 0..20_000 {
            // Mostly small graphs; every fourth up to 300 nodes, with local edges and
            // allocations named near where they are made, as in programs.
            let n = if case % 4 == 0 {
                1 + next(300)
            } else {
                1 + next(40)
            };
            let keys = if n > 40 { 1 + n / 3 } else { next(6) };
            let mut m = Model::new();
            for _ in 0..keys {
                m.add_allocation("a");
            }
            for i in 0..n {
                let reach = if next(20) == 0 { i } else { i.min(8) };
                let deps: Vec<usize> = (i - reach..i).filter(|_| next(4) == 0).collect();
                let node = m.add_node(NodeKind::Empty, &deps);
                if keys > 0 {
                    let near = (i * keys / n).saturating_sub(1);
                    let k = if next(30) == 0 {
                        next(keys)
                    } else {
                        (near + next(3)).min(keys - 1)
                    };
                    let k = super::AllocKey(k);
                    match next(4) {
                        0 => m.allocates(node, k),
                        1 => m.frees(node, k),
                        2 => m.uses(node, k),
                        _ => {}
                    }
                }
            }
            if next(10) == 0 && keys > 0 {
                m.set_freed_elsewhere(super::AllocKey(next(keys)));
            }
            let fast = verify(&m, true, |_, _| {});
            let general = general_passes(&m);
            assert!(
                !fast || general,
                "confirmed a graph the general check refuses: {m:?}"
            );
            if fast {
                confirmed += 1;
                large += usize::from(n > 64);
            } else if general {
                // Declined a legal graph: only allowed when an allocation spans 64 nodes.
                assert!(
                    spans_64(&m),
                    "declined a legal graph of the fast shape: {m:?}"
                );
            }
            declined += usize::from(!fast);
        }
        // Legal programs of up to 400 segments: each a chain alloc → users → free, with extra
        // edges between nearby nodes; the fast check confirms every one.
        for _ in 0..2_000 {
            let mut m = Model::new();
            let mut prev: Vec<usize> = Vec::new();
            for _ in 0..1 + next(400) {
                let a = m.add_allocation("a");
                let alloc = m.add_node(NodeKind::MemAlloc, &prev);
                m.allocates(alloc, a);
                let users: Vec<usize> = (0..1 + next(3))
                    .map(|_| {
                        let u = m.add_node(NodeKind::Kernel("k".into()), &[alloc]);
                        m.uses(u, a);
                        u
                    })
                    .collect();
                let free = m.add_node(NodeKind::MemFree, &users);
                m.frees(free, a);
                prev = vec![free];
            }
            for _ in 0..next(m.nodes.len()) {
                let to = next(m.nodes.len());
                let from = to.saturating_sub(1 + next(8));
                if from < to && !m.nodes[to].deps.contains(&from) {
                    m.nodes[to].deps.push(from);
                }
            }
            assert!(general_passes(&m) && verify(&m, true, |_, _| {}), "{m:?}");
            confirmed += 1;
            large += usize::from(m.nodes.len() > 64);
        }
        // Both answers occur often enough to mean something, large graphs included.
        assert!(
            confirmed > 1_000 && declined > 1_000 && large > 100,
            "{confirmed} confirmed ({large} large), {declined} declined"
        );
    }

    /// Whether some allocation's nodes are 64 or more positions apart.
    fn spans_64(m: &Model) -> bool {
        let mut span: Vec<(usize, usize)> = vec![(usize::MAX, 0); m.allocations.len()];
        for (i, node) in m.nodes.iter().enumerate() {
            for k in node.allocs.iter().chain(&node.frees).chain(&node.uses) {
                let s = &mut span[k.0];
                *s = (s.0.min(i), s.1.max(i));
            }
        }
        span.iter()
            .any(|&(lo, hi)| lo != usize::MAX && hi - lo >= 64)
    }
}
