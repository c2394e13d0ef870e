//! The lifetime rules of graph allocations, checked on the builder's record before
//! instantiation. CUDA checks none of them: a node that breaks them silently reads or writes
//! another allocation's data (G.4.2).
//!
//! # Rules
//!
//! "Ordered after" means a path of edges leads from one node to the other. For each allocation
//! a graph allocates, uses or frees:
//!
//! 1. every node that uses it, and its free node, is ordered after its alloc node, when the alloc
//!    node is in this graph ([`Rule::NotAfterAlloc`]; node `e` of G.3.1 breaks this);
//! 2. when this graph frees it, every node that uses it is ordered before the free node: none
//!    after it ([`Rule::UseAfterFree`]), none unordered with it ([`Rule::UnorderedWithFree`],
//!    node `d` of G.3.1);
//! 3. it is freed at most once in the graph ([`Rule::FreedTwice`]), by one graph only
//!    ([`Rule::FreedByTwoGraphs`]), and allocated by one alloc node ([`Rule::AllocatedTwice`]);
//!    every node refers to an allocation that exists ([`Rule::UnknownAllocation`]). Without an
//!    order there is nothing to check, so dependencies on nodes that do not exist
//!    ([`Rule::UnknownDependency`]) and cycles ([`Rule::Cycle`]) are reported too (the driver
//!    would refuse a cycle at instantiation, with a less helpful error);
//! 4. used or freed in a graph other than its owner (G.3.3), it must be live, and the access
//!    ordered after the owner's launch. What is checked, and where:
//!    - within the using graph, rules 2 and 3 (its users are ordered before its free node there);
//!      rule 1 cannot apply, since the alloc node is in another graph;
//!    - at [`ExecGraph::launch`](crate::ExecGraph::launch), in host order: a graph that uses or
//!      frees another graph's allocation is refused unless a launch of the owner has made the
//!      allocation live and nothing has freed it since; so is relaunching a graph whose previous
//!      launch left allocations unfreed without AutoFreeOnLaunch
//!      ([`Error::UnfreedOnRelaunch`], naming them);
//!    - **not checked**: whether the device work is ordered. G.3.3 orders it by launching on the
//!      same stream, by events between streams, or by event record/wait nodes. The record knows
//!      which nodes record or wait on which event, but not which stream a launch goes to, which
//!      events streams wait on, nor (inside the consuming graph) which event stands for which
//!      allocation. A consumer launched on an unrelated stream with no event wait, or a kernel
//!      of the consuming graph that is not ordered after its event wait node, passes these
//!      checks and may run before the allocation exists or after it is freed.
//!
//! Uses are what the builder records: kernel arguments passed with
//! [`KernelArgs::ptr`](crate::KernelArgs::ptr), memset and memcpy operands, child graphs' uses,
//! and, in captured graphs, launches made through [`Capture::launch`](crate::Capture::launch).
//! An address passed as a plain integer, or work captured through other libraries, is invisible
//! to the checks.
//!
//! # Errors
//!
//! Each [`Violation`] names the offending node and the alloc or free node it must be ordered
//! with (by label, else by kind and position: `node 'e' (kernel add_u32, #5)`, `free node #4`),
//! the allocation, and the edge: the missing one whose addition fixes it, or the offending one
//! (with the whole offending path) that orders the node wrongly. `Display` is one sentence; the
//! fields carry the same data for programs.
//!
//! # Cost
//!
//! With `N` nodes, `E` edges and `A` allocations. First the fast check: when every dependency
//! comes earlier in the record (always so for the builder's own graphs, unless
//! [`Graph::add_dependency`] added a back edge) and each allocation's nodes lie within 64
//! consecutive positions, as in chains alloc → users → free, one pass gives each node its
//! ancestors among the 64 before it as a bit set, and every rule is a bit test: O(N + E + R)
//! for R references to allocations, with one heap allocation below 64 nodes. It only confirms.
//! Otherwise, or when it finds a violation, the general check runs: a topological sort,
//! O(N + E); then the allocations are taken in batches of 64, in topological order of their
//! alloc (or free) nodes, and each batch costs one bit-parallel pass over the stretch of the
//! topological order that its nodes span. For typical graphs the stretches barely overlap and
//! the whole check is linear in nodes plus edges. The worst case, where every allocation spans
//! the whole graph, is O(⌈A/64⌉ · (N + E)). Finding the offending path of a
//! [`Rule::UseAfterFree`] costs O(N + E) per violation, on failure only. Memory: O(N + E + A).
//! Naming the violations reads the record, on failure only.

mod fast;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::record::MemRole;

pub use crate::lifetime_error::{AllocKey, LifetimeError, NodeRef, Rule, Violation};
pub use crate::record::{NodeRecord, Record};

impl Graph {
    /// Checks the lifetime rules on the record (no GPU needed); [`Graph::instantiate`] does it
    /// too. A graph that uses and frees no graph allocation passes at once. Cost: see
    /// [the module](crate::check#cost).
    ///
    /// # Errors
    ///
    /// [`Error::Lifetime`] with every violation found, when the record breaks a rule of
    /// [`crate::check`]. Nothing else: the check calls no driver.
    pub fn check(&self) -> Result<()> {
        let record = &self.record;
        if fast::verify(record) {
            return Ok(());
        }
        let pairs = Pairs::of(record);
        if pairs.frees.is_empty() && pairs.uses.is_empty() {
            return Ok(());
        }
        let found = pairs.check();
        if found.is_empty() {
            return Ok(());
        }
        Err(Error::Lifetime(LifetimeError {
            violations: name(record, found),
        }))
    }
}

/// Checks a record against the rules; returns every violation, ordered by node, then rule.
/// Cost: see [the module](crate::check#cost).
#[must_use]
pub fn check_record(record: &Record) -> Vec<Violation> {
    if fast::verify(record) {
        return Vec::new();
    }
    name(record, Pairs::of(record).check())
}

/// No node, no position.
const NONE: u32 = u32::MAX;

/// A violation before its nodes are named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    rule: Rule,
    node: u32,
    key: Option<usize>,
    other: Option<u32>,
    missing: Option<(u32, u32)>,
    offending: Option<(usize, usize)>,
    path: Vec<u32>,
}

impl Found {
    fn new(rule: Rule, node: usize, key: Option<usize>, other: Option<u32>) -> Found {
        Found {
            rule,
            node: node as u32,
            key,
            other,
            missing: None,
            offending: None,
            path: Vec::new(),
        }
    }
}

/// Lists of `u32` grouped by an index (compressed sparse rows).
struct Rows {
    start: Vec<u32>,
    items: Vec<u32>,
}

impl Rows {
    /// Groups `(row, item)` pairs by row, keeping their order within each row.
    fn from_pairs(rows: usize, pairs: &[(u32, u32)]) -> Rows {
        // Counting sort in place: after the prefix sums `start[r + 1]` is where row r begins;
        // filling row r advances it to where row r ends, which is where row r + 1 begins. One
        // spare entry at the end is dropped.
        let mut start = vec![0u32; rows + 2];
        for &(r, _) in pairs {
            start[r as usize + 2] += 1;
        }
        for r in 0..rows {
            start[r + 2] += start[r + 1];
        }
        let mut items = vec![0u32; pairs.len()];
        for &(r, item) in pairs {
            let at = &mut start[r as usize + 1];
            items[*at as usize] = item;
            *at += 1;
        }
        start.pop();
        Rows { start, items }
    }

    #[inline]
    fn row(&self, r: usize) -> &[u32] {
        &self.items[self.start[r] as usize..self.start[r + 1] as usize]
    }
}

/// What the checks need, as (row, item) pairs: edges (node, dependency) and allocation
/// references (key, node), with the violations found while gathering them.
struct Pairs {
    nodes: usize,
    keys: usize,
    edges: Vec<(u32, u32)>,
    allocs: Vec<(u32, u32)>,
    frees: Vec<(u32, u32)>,
    uses: Vec<(u32, u32)>,
    elsewhere: Vec<bool>,
    found: Vec<Found>,
}

impl Pairs {
    /// The pairs of `record`, with the dependencies and keys that point nowhere as violations.
    fn of(record: &Record) -> Pairs {
        let nodes = record.nodes();
        let n = nodes.len();
        let keys = record.allocation_count();
        let mut pairs = Pairs {
            nodes: n,
            keys,
            edges: Vec::with_capacity(n),
            allocs: Vec::new(),
            frees: Vec::new(),
            uses: Vec::with_capacity(n),
            elsewhere: (0..keys)
                .map(|k| record.is_freed_elsewhere(AllocKey(k)))
                .collect(),
            found: Vec::new(),
        };
        for (i, node) in nodes.iter().enumerate() {
            for &d in node.deps() {
                if (d as usize) < n {
                    pairs.edges.push((i as u32, d));
                } else {
                    let mut v = Found::new(Rule::UnknownDependency, i, None, None);
                    v.offending = Some((d as usize, i));
                    pairs.found.push(v);
                }
            }
            // The record holds each (role, key) of a node once.
            for &(role, k) in node.refs() {
                if k.0 < keys {
                    pairs.list(role).push((k.0 as u32, i as u32));
                } else {
                    let v = Found::new(Rule::UnknownAllocation, i, Some(k.0), None);
                    pairs.found.push(v);
                }
            }
        }
        pairs
    }

    fn list(&mut self, role: MemRole) -> &mut Vec<(u32, u32)> {
        match role {
            MemRole::Alloc => &mut self.allocs,
            MemRole::Free => &mut self.frees,
            MemRole::Use => &mut self.uses,
        }
    }

    /// Runs the rules; returns the violations, unnamed.
    fn check(self) -> Vec<Found> {
        let Pairs {
            nodes: n,
            keys,
            edges,
            allocs,
            frees,
            uses,
            elsewhere,
            mut found,
        } = self;
        let deps = Rows::from_pairs(n, &edges);
        let allocs = Rows::from_pairs(keys, &allocs);
        let frees = Rows::from_pairs(keys, &frees);
        let users = Rows::from_pairs(keys, &uses);
        drop((edges, uses));
        for (k, &freed_elsewhere) in elsewhere.iter().enumerate() {
            for (row, rule) in [
                (allocs.row(k), Rule::AllocatedTwice),
                (frees.row(k), Rule::FreedTwice),
            ] {
                if let Some((&first, rest)) = row.split_first() {
                    for &again in rest {
                        found.push(Found::new(rule, again as usize, Some(k), Some(first)));
                    }
                }
            }
            if let (Some(&f), true) = (frees.row(k).first(), freed_elsewhere) {
                found.push(Found::new(
                    Rule::FreedByTwoGraphs,
                    f as usize,
                    Some(k),
                    None,
                ));
            }
        }

        match Order::new(n, deps) {
            Ok(order) => order.check(&allocs, &frees, &users, &mut found),
            Err(cycle) => found.push(cycle),
        }
        found
    }
}

/// Sorts, deduplicates and names the violations.
fn name(record: &Record, mut found: Vec<Found>) -> Vec<Violation> {
    found.sort_by(|a, b| {
        (a.node, a.rule, a.key, a.other, a.offending).cmp(&(
            b.node,
            b.rule,
            b.key,
            b.other,
            b.offending,
        ))
    });
    found.dedup();
    let nodes = record.nodes();
    let name = |i: u32| NodeRef {
        index: i as usize,
        kind: nodes[i as usize].kind.clone(),
        label: nodes[i as usize].label().map(str::to_owned),
    };
    found
        .into_iter()
        .map(|v| Violation {
            rule: v.rule,
            allocation: v
                .key
                .map_or_else(String::new, |k| record.describe(AllocKey(k))),
            key: v.key.map(AllocKey),
            node: name(v.node),
            other: v.other.map(name),
            missing_edge: v.missing.map(|(a, b)| (a as usize, b as usize)),
            offending_edge: v.offending,
            path: v.path.into_iter().map(name).collect(),
        })
        .collect()
}

/// A topological order, and the dependencies by position.
struct Order {
    /// Position of each node.
    pos: Vec<u32>,
    /// Node at each position.
    node: Vec<u32>,
    /// Dependencies of the node at each position, as positions (all smaller).
    deps: Rows,
}

/// One job of a batch: an allocation's key and the stretch of positions its nodes span.
#[derive(Clone, Copy)]
struct Span {
    lo: u32,
    hi: u32,
    key: u32,
}

impl Order {
    /// The nodes' own order when every dependency comes earlier (always so for a builder's
    /// graph, whose nodes can only depend on nodes that exist); otherwise Kahn's algorithm,
    /// with a stack, so that chains stay together in the order. A cycle comes back as its
    /// violation.
    fn new(n: usize, deps: Rows) -> std::result::Result<Order, Found> {
        let ordered = (0..n).all(|i| deps.row(i).iter().all(|&d| (d as usize) < i));
        if ordered {
            let identity: Vec<u32> = (0..n as u32).collect();
            return Ok(Order {
                pos: identity.clone(),
                node: identity,
                deps,
            });
        }
        Order::sorted(n, &deps)
    }

    /// Kahn's algorithm.
    fn sorted(n: usize, deps: &Rows) -> std::result::Result<Order, Found> {
        let mut indegree: Vec<u32> = (0..n).map(|i| deps.start[i + 1] - deps.start[i]).collect();
        let child_pairs: Vec<(u32, u32)> = (0..n)
            .flat_map(|i| deps.row(i).iter().map(move |&d| (d, i as u32)))
            .collect();
        let children = Rows::from_pairs(n, &child_pairs);
        drop(child_pairs);
        // Roots in reverse, so that the first root is taken first.
        let mut stack: Vec<u32> = (0..n as u32)
            .rev()
            .filter(|&i| indegree[i as usize] == 0)
            .collect();
        let mut pos = vec![NONE; n];
        let mut node = Vec::with_capacity(n);
        while let Some(v) = stack.pop() {
            pos[v as usize] = node.len() as u32;
            node.push(v);
            for &c in children.row(v as usize).iter().rev() {
                indegree[c as usize] -= 1;
                if indegree[c as usize] == 0 {
                    stack.push(c);
                }
            }
        }
        if node.len() < n {
            return Err(find_cycle(&pos, deps));
        }
        let pairs: Vec<(u32, u32)> = node
            .iter()
            .enumerate()
            .flat_map(|(p, &v)| {
                let pos = &pos;
                deps.row(v as usize)
                    .iter()
                    .map(move |&d| (p as u32, pos[d as usize]))
            })
            .collect();
        let deps = Rows::from_pairs(n, &pairs);
        Ok(Order { pos, node, deps })
    }

    /// Rules 1 and 2 for every allocation.
    fn check(&self, allocs: &Rows, frees: &Rows, users: &Rows, found: &mut Vec<Found>) {
        let keys = allocs.start.len() - 1;
        let pos = &self.pos;
        let mut mask = vec![0u64; self.node.len()];

        // Rule 1: forward from each alloc node to its users and free nodes (a node that both
        // uses and frees is found twice, and deduplicated with the rest).
        let targets = |k: usize| users.row(k).iter().chain(frees.row(k));
        // Spans are batched in the order of their alloc node (rule 1) or free node (rule 2), so
        // that a batch covers a short stretch of the order.
        let mut spans = Vec::new();
        for k in 0..keys {
            let Some(&a) = allocs.row(k).first() else {
                continue;
            };
            let lo = pos[a as usize];
            let mut hi = lo;
            for &t in targets(k) {
                let p = pos[t as usize];
                if p < lo {
                    let mut v = Found::new(Rule::NotAfterAlloc, t as usize, Some(k), Some(a));
                    v.missing = Some((a, t));
                    found.push(v);
                }
                hi = hi.max(p);
            }
            if hi > lo {
                spans.push(Span {
                    lo,
                    hi,
                    key: k as u32,
                });
            }
        }
        spans.sort_unstable_by_key(|s| (s.lo, s.key));
        for batch in spans.chunks(64) {
            let (lo, hi) = bounds(batch);
            mask[lo..=hi].fill(0);
            for (j, s) in batch.iter().enumerate() {
                mask[s.lo as usize] |= 1 << j;
            }
            self.forward(&mut mask, lo, hi);
            for (j, s) in batch.iter().enumerate() {
                let k = s.key as usize;
                let a = allocs.row(k)[0];
                for &t in targets(k) {
                    let p = pos[t as usize];
                    if p > s.lo && mask[p as usize] & (1 << j) == 0 {
                        let mut v = Found::new(Rule::NotAfterAlloc, t as usize, Some(k), Some(a));
                        v.missing = Some((a, t));
                        found.push(v);
                    }
                }
            }
        }

        // Rule 2: backward from each (first) free node to the users.
        let mut late: Vec<(u32, u32, u32)> = Vec::new(); // (key, user, free)
        spans.clear();
        for k in 0..keys {
            let Some(&f) = frees.row(k).first() else {
                continue;
            };
            let hi = pos[f as usize];
            let mut lo = hi;
            for &u in users.row(k) {
                let p = pos[u as usize];
                if p > hi {
                    late.push((k as u32, u, f));
                }
                lo = lo.min(p);
            }
            if lo < hi {
                spans.push(Span {
                    lo,
                    hi,
                    key: k as u32,
                });
            }
        }
        spans.sort_unstable_by_key(|s| (s.hi, s.key));
        for batch in spans.chunks(64) {
            let (lo, hi) = bounds(batch);
            mask[lo..=hi].fill(0);
            for (j, s) in batch.iter().enumerate() {
                mask[s.hi as usize] |= 1 << j;
            }
            self.backward(&mut mask, lo, hi);
            for (j, s) in batch.iter().enumerate() {
                let k = s.key as usize;
                let f = frees.row(k)[0];
                for &u in users.row(k) {
                    let p = pos[u as usize];
                    if p < s.hi && mask[p as usize] & (1 << j) == 0 {
                        // Before the free in the order, so the free cannot reach it.
                        let mut v =
                            Found::new(Rule::UnorderedWithFree, u as usize, Some(k), Some(f));
                        v.missing = Some((u, f));
                        found.push(v);
                    }
                }
            }
        }
        // Users after the free in the order: reached from it (use after free), or unordered.
        let mut search = PathSearch::new(if late.is_empty() { 0 } else { self.node.len() });
        for (k, u, f) in late {
            let mut v = Found::new(
                Rule::UnorderedWithFree,
                u as usize,
                Some(k as usize),
                Some(f),
            );
            v.missing = Some((u, f));
            if let Some(path) = search.path(self, f, u) {
                v.rule = Rule::UseAfterFree;
                let last = path[path.len() - 2];
                v.offending = Some((last as usize, u as usize));
                v.path = path;
            }
            found.push(v);
        }
    }

    /// Propagates each position's bits to its dependents, within `lo..=hi`.
    fn forward(&self, mask: &mut [u64], lo: usize, hi: usize) {
        for p in lo + 1..=hi {
            let mut m = mask[p];
            for &q in self.deps.row(p) {
                if q as usize >= lo {
                    m |= mask[q as usize];
                }
            }
            mask[p] = m;
        }
    }

    /// Propagates each position's bits to its dependencies, within `lo..=hi`.
    fn backward(&self, mask: &mut [u64], lo: usize, hi: usize) {
        for p in (lo + 1..=hi).rev() {
            let m = mask[p];
            if m == 0 {
                continue;
            }
            for &q in self.deps.row(p) {
                if q as usize >= lo {
                    mask[q as usize] |= m;
                }
            }
        }
    }
}

/// The stretch of positions a batch spans.
fn bounds(batch: &[Span]) -> (usize, usize) {
    let lo = batch.iter().map(|s| s.lo).min().unwrap_or(0) as usize;
    let hi = batch.iter().map(|s| s.hi).max().unwrap_or(0) as usize;
    (lo, hi)
}

/// Breadth-first searches for offending paths, sharing their buffers.
struct PathSearch {
    stamp: Vec<u32>,
    parent: Vec<u32>,
    generation: u32,
    queue: Vec<u32>,
}

impl PathSearch {
    fn new(n: usize) -> PathSearch {
        PathSearch {
            stamp: vec![0; n],
            parent: vec![NONE; n],
            generation: 0,
            queue: Vec::new(),
        }
    }

    /// A shortest path of edges from node `from` to node `to`, as nodes, if there is one.
    fn path(&mut self, order: &Order, from: u32, to: u32) -> Option<Vec<u32>> {
        let (start, goal) = (order.pos[to as usize], order.pos[from as usize]);
        if goal >= start {
            return None;
        }
        self.generation += 1;
        self.queue.clear();
        self.queue.push(start);
        self.stamp[start as usize] = self.generation;
        let mut head = 0;
        while head < self.queue.len() {
            let p = self.queue[head];
            head += 1;
            for &q in order.deps.row(p as usize) {
                if q < goal || self.stamp[q as usize] == self.generation {
                    continue;
                }
                self.stamp[q as usize] = self.generation;
                self.parent[q as usize] = p;
                if q == goal {
                    // Follow the parents from the goal (`from`) forward to `to`.
                    let mut path = vec![from];
                    let mut at = goal;
                    while at != start {
                        at = self.parent[at as usize];
                        path.push(order.node[at as usize]);
                    }
                    return Some(path);
                }
                self.queue.push(q);
            }
        }
        None
    }
}

/// A cycle among the nodes Kahn's algorithm could not order (each has a dependency among them),
/// from its lowest-numbered node in edge order.
fn find_cycle(pos: &[u32], deps: &Rows) -> Found {
    let n = pos.len();
    let unordered = |v: u32| pos[v as usize] == NONE;
    let start = (0..n as u32).find(|&v| unordered(v)).unwrap_or(0);
    // Walk dependencies (against the edges) until a node repeats.
    let mut seen = vec![NONE; n];
    let mut walk = Vec::new();
    let mut v = start;
    while seen[v as usize] == NONE {
        seen[v as usize] = walk.len() as u32;
        walk.push(v);
        v = deps
            .row(v as usize)
            .iter()
            .copied()
            .find(|&d| unordered(d))
            .unwrap_or(v);
    }
    let mut cycle = walk.split_off(seen[v as usize] as usize);
    cycle.reverse(); // edge order
    let lowest = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
    cycle.rotate_left(lowest);
    let first = cycle[0];
    let last = cycle[cycle.len() - 1];
    let mut v = Found::new(Rule::Cycle, first as usize, None, None);
    v.offending = Some((last as usize, first as usize));
    v.path = cycle;
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_kind::NodeKind;

    /// G.3.1: alloc → a → {b, c}; free after b and c; d after c (uses after free); e alone.
    #[test]
    fn guide_g3_1_nodes_d_and_e_are_caught() {
        let mut m = Record::new();
        let buf = m.add_allocation("allocation 'buf'");
        let alloc = m.add_node(NodeKind::MemAlloc, &[]);
        m.allocates(alloc, buf);
        let kernel = || NodeKind::Kernel("k".into());
        let a = m.add_node(kernel(), &[alloc]);
        let b = m.add_node(kernel(), &[a]);
        let c = m.add_node(kernel(), &[a]);
        for n in [a, b, c] {
            m.uses(n, buf);
        }
        let free = m.add_node(NodeKind::MemFree, &[b, c]);
        m.frees(free, buf);
        assert!(check_record(&m).is_empty(), "{:?}", check_record(&m));

        let d = m.add_node(kernel(), &[c]);
        m.set_label(d, "d");
        m.uses(d, buf);
        let e = m.add_node(kernel(), &[]);
        m.set_label(e, "e");
        m.uses(e, buf);
        let v = check_record(&m);
        let rules: Vec<_> = v.iter().map(|v| (v.node.index, v.rule)).collect();
        assert_eq!(
            rules,
            vec![
                (d, Rule::UnorderedWithFree),
                (e, Rule::NotAfterAlloc),
                (e, Rule::UnorderedWithFree)
            ]
        );
        assert!(v[1].to_string().contains("node 'e'"), "{}", v[1]);
    }

    /// The walk in `find_cycle` follows a dependency among the unordered nodes each time.
    #[test]
    fn cycle_is_reported_in_edge_order_from_its_lowest_node() {
        let mut m = Record::new();
        let x = m.add_node(NodeKind::Empty, &[]);
        let a = m.add_node(NodeKind::Empty, &[x]);
        let b = m.add_node(NodeKind::Empty, &[a]);
        let c = m.add_node(NodeKind::Empty, &[b]);
        m.add_edge(c, a);
        let v = check_record(&m);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].rule, Rule::Cycle);
        let path: Vec<usize> = v[0].path.iter().map(|n| n.index).collect();
        assert_eq!(path, vec![a, b, c]);
        assert_eq!(v[0].offending_edge, Some((c, a)));
    }
}
