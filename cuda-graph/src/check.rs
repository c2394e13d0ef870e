//! The lifetime rules of graph allocations, checked on the builder's record before
//! instantiation. CUDA checks none of them: a node that breaks them silently reads or writes
//! another allocation's data (G.4.2).
//!
//! Rules, for each allocation a graph allocates, uses or frees:
//!
//! 1. every node that uses it, and its free node, is ordered after its alloc node (node `e` of
//!    G.3.1 breaks this), when the alloc node is in this graph;
//! 2. when this graph frees it, every node that uses it is ordered before the free node: none
//!    after it, none unordered with it (node `d` of G.3.1);
//! 3. it is freed at most once in the graph, and by one graph only;
//! 4. used or freed in a graph other than its owner, it must be live when that graph launches:
//!    checked at [`ExecGraph::launch`](crate::ExecGraph::launch) in host order. Whether the
//!    device work of the two graphs is ordered (one stream, events between streams, event
//!    record/wait nodes) is not visible to this crate when the ordering goes through streams or
//!    events made elsewhere, and is not checked.
//!
//! Uses are what the builder records: kernel arguments passed with
//! [`KernelArgs::ptr`](crate::KernelArgs::ptr), memset and memcpy operands, and, in captured
//! graphs, launches made through [`Capture::launch`](crate::Capture::launch). An address passed
//! as a plain integer, or work captured through other libraries, is invisible to the checks.
//!
//! Cost: a topological sort, O(nodes + edges), then for each use one backward search from the
//! later node that stops at nodes earlier in topological order than the earlier one. On chains
//! (alloc → users → free) each search ends at once, so the check is linear in nodes plus edges;
//! the worst case, wide graphs whose uses span many unrelated nodes, is O(uses × (nodes + edges)).

use std::collections::HashMap;
use std::fmt;

use crate::alloc::GraphAllocation;
use crate::error::{Error, Result};
use crate::graph::{Graph, MemOp, NodeKind, NodeRecord};

/// A node named for people: its label, kind and position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    /// Position in the graph (order added).
    pub index: usize,
    /// What the node does.
    pub kind: NodeKind,
    /// The user's label, if any.
    pub label: Option<String>,
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "node '{label}' ({}, #{})", self.kind, self.index),
            None => write!(f, "{} #{}", self.kind, self.index),
        }
    }
}

/// Which rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A user (or the free node) is not ordered after the alloc node.
    NotAfterAlloc,
    /// A user is ordered after the free node.
    UseAfterFree,
    /// A user is neither before nor after the free node.
    UnorderedWithFree,
    /// The graph frees the allocation more than once.
    FreedTwice,
    /// More than one graph frees the allocation.
    FreedByTwoGraphs,
}

/// One broken rule: the allocation, the offending node, and the node it must be ordered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The allocation, as its label or number, size and address.
    pub allocation: String,
    /// The node that breaks the rule.
    pub node: NodeRef,
    /// The alloc or free node it must be ordered with (for `FreedTwice`, the first free node).
    pub other: Option<NodeRef>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (node, alloc) = (&self.node, &self.allocation);
        let other = self
            .other
            .as_ref()
            .map(|o| o.to_string())
            .unwrap_or_else(|| "its counterpart".into());
        match self.rule {
            Rule::NotAfterAlloc => write!(
                f,
                "{node} uses {alloc} but is not ordered after its alloc node, {other}: add a path of edges from {other} to {node}"
            ),
            Rule::UseAfterFree => write!(
                f,
                "{node} uses {alloc} after its free node, {other}, has freed it: make {other} depend on {node} instead"
            ),
            Rule::UnorderedWithFree => write!(
                f,
                "{node} uses {alloc} but is not ordered before its free node, {other}: add a path of edges from {node} to {other}"
            ),
            Rule::FreedTwice => write!(f, "{node} frees {alloc}, which {other} already frees"),
            Rule::FreedByTwoGraphs => write!(
                f,
                "{node} frees {alloc}, which another graph also frees; an allocation is freed by one graph only"
            ),
        }
    }
}

/// The violations found in one graph. `Display` gives the first in one sentence; the value
/// carries them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifetimeError {
    /// Every violation, in node order.
    pub violations: Vec<Violation>,
}

impl fmt::Display for LifetimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.violations.as_slice() {
            [] => f.write_str("graph allocation lifetime check failed"),
            [only] => write!(f, "graph allocation lifetime: {only}"),
            [first, rest @ ..] => write!(
                f,
                "graph allocation lifetime: {first} (and {} more)",
                rest.len()
            ),
        }
    }
}

impl std::error::Error for LifetimeError {}

impl Graph {
    /// Checks the lifetime rules on the record (no GPU needed). [`Graph::instantiate`] does it
    /// too.
    pub fn check(&self) -> Result<()> {
        let violations = check_nodes(&self.nodes, self.id);
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Error::Lifetime(LifetimeError { violations }))
        }
    }
}

/// What the record says about one allocation.
#[derive(Default)]
struct Lifetime<'a> {
    allocation: Option<&'a GraphAllocation>,
    alloc_node: Option<usize>,
    free_nodes: Vec<usize>,
    users: Vec<usize>,
}

/// Checks a node list; `graph` is the id of the graph it belongs to.
pub(crate) fn check_nodes(nodes: &[NodeRecord], graph: u64) -> Vec<Violation> {
    let mut lifetimes: HashMap<u64, Lifetime<'_>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for op in &node.mem {
            match op {
                MemOp::Alloc(a) => {
                    let entry = lifetimes.entry(a.id()).or_default();
                    entry.allocation = Some(a);
                    entry.alloc_node = Some(i);
                }
                MemOp::Free(a) => {
                    let entry = lifetimes.entry(a.id()).or_default();
                    entry.allocation = Some(a);
                    entry.free_nodes.push(i);
                }
            }
        }
        for a in &node.uses {
            let entry = lifetimes.entry(a.id()).or_default();
            entry.allocation.get_or_insert(a);
            if entry.users.last() != Some(&i) {
                entry.users.push(i);
            }
        }
    }
    if lifetimes.is_empty() {
        return Vec::new();
    }
    let mut reach = Reachability::new(nodes);
    let name = |i: usize| NodeRef {
        index: i,
        kind: nodes[i].kind.clone(),
        label: nodes[i].label.clone(),
    };
    let mut violations = Vec::new();
    for life in lifetimes.values() {
        let Some(allocation) = life.allocation else {
            continue;
        };
        let described = allocation.to_string();
        let mut violation = |rule, node, other: Option<usize>| {
            violations.push(Violation {
                rule,
                allocation: described.clone(),
                node: name(node),
                other: other.map(name),
            })
        };
        if let Some(a) = life.alloc_node {
            for &n in life.users.iter().chain(&life.free_nodes) {
                if !reach.reaches(a, n) {
                    violation(Rule::NotAfterAlloc, n, Some(a));
                }
            }
        }
        if let Some((&first, rest)) = life.free_nodes.split_first() {
            for &again in rest {
                violation(Rule::FreedTwice, again, Some(first));
            }
            for &u in &life.users {
                if !reach.reaches(u, first) {
                    let rule = if reach.reaches(first, u) {
                        Rule::UseAfterFree
                    } else {
                        Rule::UnorderedWithFree
                    };
                    violation(rule, u, Some(first));
                }
            }
            if allocation.free_graphs().iter().any(|&g| g != graph) {
                violation(Rule::FreedByTwoGraphs, first, None);
            }
        }
    }
    violations.sort_by_key(|v| (v.node.index, v.rule as u8));
    violations
}

/// Reachability queries on a DAG: `reaches(from, to)` searches backwards from `to`, pruning at
/// nodes that come before `from` in topological order.
struct Reachability<'a> {
    nodes: &'a [NodeRecord],
    /// Topological position of each node.
    order: Vec<u32>,
    /// Visit stamps, so that no query clears the array.
    stamp: Vec<u32>,
    generation: u32,
    stack: Vec<u32>,
}

impl<'a> Reachability<'a> {
    fn new(nodes: &'a [NodeRecord]) -> Self {
        // Kahn's algorithm over the dependency lists.
        let n = nodes.len();
        let mut indegree = vec![0u32; n];
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (i, node) in nodes.iter().enumerate() {
            indegree[i] = node.deps.len() as u32;
            for &d in &node.deps {
                children[d as usize].push(i as u32);
            }
        }
        let mut queue: Vec<u32> = (0..n as u32)
            .filter(|&i| indegree[i as usize] == 0)
            .collect();
        let mut order = vec![u32::MAX; n];
        let mut next = 0;
        while let Some(i) = queue.pop() {
            order[i as usize] = next;
            next += 1;
            for &c in &children[i as usize] {
                indegree[c as usize] -= 1;
                if indegree[c as usize] == 0 {
                    queue.push(c);
                }
            }
        }
        Reachability {
            nodes,
            order,
            stamp: vec![0; n],
            generation: 0,
            stack: Vec::new(),
        }
    }

    /// Whether a path of edges leads from `from` to `to` (a node reaches itself).
    fn reaches(&mut self, from: usize, to: usize) -> bool {
        if from == to {
            return true;
        }
        let floor = self.order[from];
        if self.order[to] <= floor {
            return false;
        }
        self.generation += 1;
        self.stack.clear();
        self.stack.push(to as u32);
        self.stamp[to] = self.generation;
        while let Some(v) = self.stack.pop() {
            for &d in &self.nodes[v as usize].deps {
                let d = d as usize;
                if d == from {
                    return true;
                }
                if self.stamp[d] != self.generation && self.order[d] > floor {
                    self.stamp[d] = self.generation;
                    self.stack.push(d as u32);
                }
            }
        }
        false
    }
}
