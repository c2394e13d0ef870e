//! The check of small graphs, without a heap allocation: at most 64 nodes, each dependency
//! earlier than its node, at most 64 allocations. One forward pass gives every node its
//! ancestors as a 64-bit set; each rule is then a bit test. It only confirms: when a rule
//! fails, or the graph is not small, [`verify`] says no and the general check runs, finds the
//! violations and names them. Graphs of up to 21 alloc → kernel → free segments take this path.

use super::{AllocKey, Model};
use crate::alloc::GraphAllocation;
use crate::graph::{Graph, MemOp};

/// Largest graph (in nodes, and in allocations) this check takes.
const MAX: usize = 64;

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
    type Key: Copy + PartialEq;
    fn node_count(&self) -> usize;
    /// Calls `f` with each dependency of `node`; `false` when one points nowhere.
    fn each_dep(&self, node: usize, f: impl FnMut(usize)) -> bool;
    /// Calls `f` with each allocation `node` allocates, frees or uses; `false` when one does
    /// not exist.
    fn each_ref(&self, node: usize, f: impl FnMut(Ref, Self::Key)) -> bool;
    /// Whether another graph frees `key` too.
    fn freed_elsewhere(&self, key: Self::Key) -> bool;
}

#[derive(Clone, Copy)]
struct Entry<K> {
    key: K,
    allocs: u64,
    frees: u64,
    users: u64,
}

/// Whether `view` is small and breaks no rule (`check`), or only whether it is small (`!check`).
/// When it says yes, it has called `role` with each allocation and its role bits, in the
/// order the graph first names them; when it says no, it has called nothing.
pub(super) fn verify<V: View>(view: &V, check: bool, mut role: impl FnMut(V::Key, u8)) -> bool {
    let n = view.node_count();
    if n > MAX {
        return false;
    }
    // ancestors[i]: bit j set when a path leads from node j to node i.
    let mut ancestors = [0u64; MAX];
    let mut entries: [Option<Entry<V::Key>>; MAX] = [None; MAX];
    let mut count = 0;
    for i in 0..n {
        let mut set = 0u64;
        let mut earlier = true;
        let known = view.each_dep(i, |d| {
            if d < i {
                set |= ancestors[d] | 1 << d;
            } else {
                earlier = false;
            }
        });
        if !(known && earlier) {
            return false;
        }
        ancestors[i] = set;
        let mut fits = true;
        let known = view.each_ref(i, |what, key| {
            // Chains name recent allocations: search from the newest.
            let found = entries[..count]
                .iter()
                .rposition(|e| e.is_some_and(|e| e.key == key));
            let at = match found {
                Some(at) => at,
                None if count < MAX => {
                    entries[count] = Some(Entry {
                        key,
                        allocs: 0,
                        frees: 0,
                        users: 0,
                    });
                    count += 1;
                    count - 1
                }
                None => {
                    fits = false;
                    return;
                }
            };
            if let Some(e) = &mut entries[at] {
                let bits = match what {
                    Ref::Alloc => &mut e.allocs,
                    Ref::Free => &mut e.frees,
                    Ref::Use => &mut e.users,
                };
                *bits |= 1 << i;
            }
        });
        if !(known && fits) {
            return false;
        }
    }
    let entries = entries[..count].iter().flatten();
    if check && !entries.clone().all(|e| obeys(view, e, &ancestors)) {
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
fn obeys<V: View>(view: &V, e: &Entry<V::Key>, ancestors: &[u64; MAX]) -> bool {
    if e.allocs.count_ones() > 1 || e.frees.count_ones() > 1 {
        return false;
    }
    if e.frees != 0 && view.freed_elsewhere(e.key) {
        return false;
    }
    let all_after = |from: u64, nodes: u64| {
        // Every node of `nodes` other than `from` has `from` among its ancestors.
        bits(nodes & !from).all(|t| ancestors[t] & from != 0)
    };
    if e.allocs != 0 && !all_after(e.allocs, e.users | e.frees) {
        return false;
    }
    // Every user other than the free node is an ancestor of the free node.
    if e.frees != 0 {
        let free = e.frees.trailing_zeros() as usize;
        let users = e.users & !e.frees;
        if users & !ancestors[free] != 0 {
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

/// A graph allocation, compared by identity.
#[derive(Clone, Copy)]
pub(super) struct ById<'g>(pub(super) &'g GraphAllocation);

impl PartialEq for ById<'_> {
    fn eq(&self, other: &ById<'_>) -> bool {
        self.0.id() == other.0.id()
    }
}

impl<'g> View for &'g Graph {
    type Key = ById<'g>;

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn each_dep(&self, node: usize, mut f: impl FnMut(usize)) -> bool {
        for &d in self.nodes[node].deps.iter() {
            f(d as usize);
        }
        true
    }

    fn each_ref(&self, node: usize, mut f: impl FnMut(Ref, ById<'g>)) -> bool {
        let record = &self.nodes[node];
        for op in record.mem.iter() {
            match op {
                MemOp::Alloc(a) => f(Ref::Alloc, ById(a)),
                MemOp::Free(a) => f(Ref::Free, ById(a)),
            }
        }
        for a in record.uses.iter() {
            f(Ref::Use, ById(a));
        }
        true
    }

    fn freed_elsewhere(&self, key: ById<'g>) -> bool {
        key.0.freed_by_another_graph(self.id)
    }
}

impl View for Model {
    type Key = AllocKey;

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
        // 66 nodes: too many for one 64-bit set.
        assert!(!verify(&chain(22), true, |_, _| {}));
        assert!(general_passes(&chain(22)));

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

    /// On random in-order graphs the answer is exactly the general check's.
    #[test]
    fn agrees_with_the_general_check() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let (mut confirmed, mut declined) = (0, 0);
        for _ in 0..20_000 {
            let n = 1 + next(40);
            let keys = next(6);
            let mut m = Model::new();
            for _ in 0..keys {
                m.add_allocation("a");
            }
            for i in 0..n {
                let deps: Vec<usize> = (0..i).filter(|_| next(4) == 0).collect();
                let node = m.add_node(NodeKind::Empty, &deps);
                if keys > 0 {
                    let k = super::AllocKey(next(keys));
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
            let small = verify(&m, true, |_, _| {});
            assert_eq!(small, general_passes(&m), "{m:?}");
            if small {
                confirmed += 1;
            } else {
                declined += 1;
            }
        }
        // Both answers occur often enough to mean something.
        assert!(
            confirmed > 1_000 && declined > 1_000,
            "{confirmed} / {declined}"
        );
    }
}
