//! The fast check: a record in order (every dependency earlier than its node) whose
//! allocations each live within 64 consecutive nodes (the nodes that allocate, use and free it
//! lie in a stretch of 64), which is what chains of alloc → users → free look like. One forward
//! pass gives every node its ancestors among the 64 nodes before it as a 64-bit set (a path
//! between two nodes only passes through nodes between them); each rule is then a bit test.
//! It only confirms: when a rule fails, or the record is not of this shape, [`verify`] says no
//! and the general check runs, finds the violations and names them.

use std::cell::Cell;

use super::{AllocKey, Record};
use crate::inline_list::Few;
use crate::record::MemRole;

/// The stretch of nodes, before a node, that its ancestor set covers.
const W: usize = 64;

/// One allocation: the nodes that allocate, free and use it, as bits counted from `first`.
#[derive(Clone, Copy)]
struct Entry {
    first: usize,
    allocs: u64,
    frees: u64,
    users: u64,
}

impl Entry {
    /// No node has named the allocation yet.
    const UNSEEN: Entry = Entry {
        first: usize::MAX,
        allocs: 0,
        frees: 0,
        users: 0,
    };
}

/// The most nodes, and allocations, of a record whose check needs no buffers but the stack's
/// (small graphs, whose instantiation the check's fixed cost weighs on most).
const SMALL_NODES: usize = 16;
const SMALL_ALLOCATIONS: usize = 8;

thread_local! {
    /// The buffers of the check before on this thread, for the next one: instantiating one
    /// graph after another then allocates nothing here.
    static SCRATCH: Cell<(Vec<u64>, Vec<Entry>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// Whether `record` has the fast check's shape and breaks no rule.
pub(super) fn verify(record: &Record) -> bool {
    let (n, count) = (record.nodes().len(), record.allocation_count());
    if n <= SMALL_NODES && count <= SMALL_ALLOCATIONS {
        let mut ancestors = [0u64; SMALL_NODES];
        let mut entries = [Entry::UNSEEN; SMALL_ALLOCATIONS];
        return verify_in(record, &mut ancestors[..n], &mut entries[..count]);
    }
    let (mut ancestors, mut entries) = SCRATCH.try_with(Cell::take).unwrap_or_default();
    ancestors.clear();
    ancestors.resize(n, 0);
    entries.clear();
    entries.resize(count, Entry::UNSEEN);
    let confirmed = verify_in(record, &mut ancestors, &mut entries);
    let _ = SCRATCH.try_with(|scratch| scratch.set((ancestors, entries)));
    confirmed
}

/// [`verify`], with `ancestors` one zeroed set per node and `entries` one unseen entry per
/// allocation key.
fn verify_in(record: &Record, ancestors: &mut [u64], entries: &mut [Entry]) -> bool {
    // ancestors[i], bit b: node i - 1 - b is an ancestor of node i.
    for (i, node) in record.nodes().iter().enumerate() {
        // Most nodes have one dependency and one allocation: those are matched first.
        let set = match &node.deps {
            Few::One(d) => match reach(i, *d as usize, ancestors) {
                Some(set) => set,
                None => return false,
            },
            deps => {
                let mut set = 0u64;
                for &d in deps.iter() {
                    match reach(i, d as usize, ancestors) {
                        Some(s) => set |= s,
                        None => return false,
                    }
                }
                set
            }
        };
        ancestors[i] = set;
        let named = match &node.refs {
            Few::One(r) => std::slice::from_ref(r),
            refs => refs.as_slice(),
        };
        for &(role, key) in named {
            let Some(e) = entries.get_mut(key.0) else {
                return false;
            };
            if e.first == usize::MAX {
                e.first = i;
            }
            let offset = i - e.first;
            if offset >= W {
                return false;
            }
            let bits = match role {
                MemRole::Alloc => &mut e.allocs,
                MemRole::Free => &mut e.frees,
                MemRole::Use => &mut e.users,
            };
            *bits |= 1 << offset;
        }
    }
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.first != usize::MAX)
        .all(|(k, e)| obeys(record, AllocKey(k), e, ancestors))
}

/// The ancestors node `i` has through its dependency `d` (`d` itself and, within the
/// stretch, `d`'s ancestors), as bits counted back from `i`; `None` when `d` is not earlier.
#[inline(always)]
fn reach(i: usize, d: usize, ancestors: &[u64]) -> Option<u64> {
    if d >= i {
        return None;
    }
    let distance = i - d;
    Some(if distance < W {
        (ancestors[d] << 1 | 1) << (distance - 1)
    } else if distance == W {
        1 << (W - 1)
    } else {
        0
    })
}

/// Rules 1 to 3 for one allocation.
fn obeys(record: &Record, key: AllocKey, e: &Entry, ancestors: &[u64]) -> bool {
    if e.allocs.count_ones() > 1 || e.frees.count_ones() > 1 {
        return false;
    }
    if e.frees != 0 && record.is_freed_elsewhere(key) {
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

#[cfg(test)]
mod tests {
    use super::super::{Pairs, Record};
    use super::verify;
    use crate::inline_list::Few;
    use crate::node_kind::NodeKind;

    fn general_passes(m: &Record) -> bool {
        Pairs::of(m).check().is_empty()
    }

    /// alloc → kernel → free, `k` times, each segment after the previous free.
    fn chain(k: usize) -> Record {
        let mut m = Record::new();
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
        assert!(verify(&chain(1)));
        assert!(verify(&chain(21)));
        // Longer than one 64-bit set: each allocation still lives within 64 nodes.
        assert!(verify(&chain(1000)));
        // An allocation that lives across 70 nodes is not for the fast check.
        let mut m = chain(1);
        let last = (0..70).fold(2, |prev, _| m.add_node(NodeKind::Empty, &[prev]));
        let user = m.add_node(NodeKind::Kernel("k".into()), &[last]);
        m.uses(user, super::AllocKey(0));
        assert!(!general_passes(&m) && !verify(&m));
        let mut m = chain(1);
        m.nodes[2].deps = Few::One(1);
        let free = 2;
        m.nodes[free].refs = Few::new();
        let late = (0..70).fold(free, |prev, _| m.add_node(NodeKind::Empty, &[prev]));
        let late_free = m.add_node(NodeKind::MemFree, &[late]);
        m.frees(late_free, super::AllocKey(0));
        assert!(general_passes(&m) && !verify(&m));

        // The kernel loses its edge from the alloc node: not ordered after it.
        let mut m = chain(2);
        m.nodes[1].deps = Few::new();
        assert!(!general_passes(&m) && !verify(&m));
        // The record keeps each allocation's roles whatever the order.
        assert_eq!(
            (m.roles(super::AllocKey(0)), m.roles(super::AllocKey(1))),
            (7, 7)
        );

        // A dependency on a later node: legal, but not in the record's order.
        let mut m = Record::new();
        let a = m.add_allocation("a");
        let kernel = m.add_node(NodeKind::Kernel("k".into()), &[1]);
        let alloc = m.add_node(NodeKind::MemAlloc, &[]);
        m.allocates(alloc, a);
        m.uses(kernel, a);
        assert!(general_passes(&m) && !verify(&m));
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
            let mut m = Record::new();
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
            let fast = verify(&m);
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
            let mut m = Record::new();
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
                if from < to {
                    m.add_edge(from, to);
                }
            }
            assert!(general_passes(&m) && verify(&m), "{m:?}");
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
    fn spans_64(m: &Record) -> bool {
        let mut span: Vec<(usize, usize)> = vec![(usize::MAX, 0); m.allocation_count()];
        for (i, node) in m.nodes.iter().enumerate() {
            for (_, k) in node.refs() {
                let s = &mut span[k.0];
                *s = (s.0.min(i), s.1.max(i));
            }
        }
        span.iter()
            .any(|&(lo, hi)| lo != usize::MAX && hi - lo >= 64)
    }
}
