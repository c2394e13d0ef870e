//! The brute-force oracle that the property tests and the fuzz target compare `check_record`
//! with: reachability by a search from every node, and the rules of `cuda_graph::check` applied
//! as its documentation states them, one allocation and one pair of nodes at a time. Included by
//! `check_properties.rs` (`mod oracle;`) and by `fuzz/fuzz_targets/check_record.rs` (`#[path]`).

use std::collections::BTreeSet;

use cuda_graph::MemRole;
use cuda_graph::check::{AllocKey, Record, Rule, Violation};

/// Reachability by brute force: `reach[i][j]` when a path of one or more edges leads from `i` to
/// `j`, found by a depth-first search from every node.
pub struct Oracle {
    n: usize,
    reach: Vec<Vec<bool>>,
    children: Vec<Vec<usize>>,
}

impl Oracle {
    pub fn new(m: &Record) -> Oracle {
        let n = m.nodes().len();
        let mut children = vec![Vec::new(); n];
        for (i, node) in m.nodes().iter().enumerate() {
            for &d in node.deps() {
                let d = d as usize;
                if d < n {
                    children[d].push(i);
                }
            }
        }
        let mut reach = vec![vec![false; n]; n];
        for (s, row) in reach.iter_mut().enumerate() {
            let mut stack: Vec<usize> = children[s].clone();
            while let Some(v) = stack.pop() {
                if !row[v] {
                    row[v] = true;
                    stack.extend(&children[v]);
                }
            }
        }
        Oracle { n, reach, children }
    }

    /// Ordered: equal, or a path leads from `a` to `b`.
    pub fn ordered(&self, a: usize, b: usize) -> bool {
        a == b || self.reach[a][b]
    }

    pub fn cyclic(&self) -> bool {
        (0..self.n).any(|i| self.reach[i][i])
    }

    pub fn is_edge(&self, from: usize, to: usize) -> bool {
        self.children[from].contains(&to)
    }

    /// Length in nodes of a shortest path from `a` to `b` (breadth-first).
    pub fn shortest(&self, a: usize, b: usize) -> Option<usize> {
        let mut dist = vec![usize::MAX; self.n];
        dist[a] = 1;
        let mut queue = std::collections::VecDeque::from([a]);
        while let Some(v) = queue.pop_front() {
            for &c in &self.children[v] {
                if dist[c] == usize::MAX {
                    dist[c] = dist[v] + 1;
                    if c == b {
                        return Some(dist[c]);
                    }
                    queue.push_back(c);
                }
            }
        }
        None
    }
}

/// A violation as comparable data: (node, rule, key, other, offending edge for dangling deps).
pub type Row = (
    usize,
    Rule,
    Option<usize>,
    Option<usize>,
    Option<(usize, usize)>,
);

/// The rules, applied one by one with the oracle's reachability.
pub fn expected(m: &Record, o: &Oracle) -> BTreeSet<Row> {
    let n = m.nodes().len();
    let keys = m.allocation_count();
    let mut rows = BTreeSet::new();
    let (mut allocs, mut frees, mut users) = (
        vec![BTreeSet::new(); keys],
        vec![BTreeSet::new(); keys],
        vec![BTreeSet::new(); keys],
    );
    for (i, node) in m.nodes().iter().enumerate() {
        for &d in node.deps() {
            let d = d as usize;
            if d >= n {
                rows.insert((i, Rule::UnknownDependency, None, None, Some((d, i))));
            }
        }
        for &(role, k) in node.refs() {
            let sets = match role {
                MemRole::Alloc => &mut allocs,
                MemRole::Free => &mut frees,
                MemRole::Use => &mut users,
            };
            match sets.get_mut(k.0) {
                Some(set) => {
                    set.insert(i);
                }
                None => {
                    rows.insert((i, Rule::UnknownAllocation, Some(k.0), None, None));
                }
            }
        }
    }
    let cyclic = o.cyclic();
    for k in 0..keys {
        let a = allocs[k].first().copied();
        let f = frees[k].first().copied();
        for &again in allocs[k].iter().skip(1) {
            rows.insert((again, Rule::AllocatedTwice, Some(k), a, None));
        }
        for &again in frees[k].iter().skip(1) {
            rows.insert((again, Rule::FreedTwice, Some(k), f, None));
        }
        if let Some(f) = f {
            if m.is_freed_elsewhere(AllocKey(k)) {
                rows.insert((f, Rule::FreedByTwoGraphs, Some(k), None, None));
            }
        }
        if cyclic {
            continue;
        }
        if let Some(a) = a {
            for &t in users[k].union(&frees[k]) {
                if !o.ordered(a, t) {
                    rows.insert((t, Rule::NotAfterAlloc, Some(k), Some(a), None));
                }
            }
        }
        if let Some(f) = f {
            for &u in &users[k] {
                if !o.ordered(u, f) {
                    let rule = if o.ordered(f, u) {
                        Rule::UseAfterFree
                    } else {
                        Rule::UnorderedWithFree
                    };
                    rows.insert((u, rule, Some(k), Some(f), None));
                }
            }
        }
    }
    rows
}

pub fn row(v: &Violation) -> Row {
    let offending = (v.rule == Rule::UnknownDependency)
        .then_some(v.offending_edge)
        .flatten();
    (
        v.node.index,
        v.rule,
        v.key.map(|k| k.0),
        v.other.as_ref().map(|o| o.index),
        offending,
    )
}
