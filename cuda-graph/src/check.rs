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
use crate::graph::{Graph, MemOp, NodeKind};

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
        let violations = check_model(&self.model());
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Error::Lifetime(LifetimeError { violations }))
        }
    }

    /// The record as a [`Model`]: what the checks see.
    pub fn model(&self) -> Model {
        let mut model = Model::new();
        let mut keys: HashMap<u64, AllocKey> = HashMap::new();
        let mut key = |model: &mut Model, a: &GraphAllocation| {
            *keys.entry(a.id()).or_insert_with(|| {
                let k = model.add_allocation(a.to_string());
                if a.free_graphs().iter().filter(|&&g| g != self.id).count() > 0 {
                    model.set_freed_elsewhere(k);
                }
                k
            })
        };
        for node in &self.nodes {
            let deps: Vec<usize> = node.deps.iter().map(|&d| d as usize).collect();
            let i = model.add_node(node.kind.clone(), &deps);
            if let Some(label) = &node.label {
                model.set_label(i, label.clone());
            }
            for op in &node.mem {
                match op {
                    MemOp::Alloc(a) => {
                        let k = key(&mut model, a);
                        model.allocates(i, k);
                    }
                    MemOp::Free(a) => {
                        let k = key(&mut model, a);
                        model.frees(i, k);
                    }
                }
            }
            for a in &node.uses {
                let k = key(&mut model, a);
                model.uses(i, k);
            }
        }
        model
    }
}

/// An allocation of a [`Model`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey(pub usize);

/// One node of a [`Model`].
#[derive(Debug, Clone)]
pub struct ModelNode {
    /// What the node does.
    pub kind: NodeKind,
    /// The user's label.
    pub label: Option<String>,
    /// Positions of the nodes it depends on.
    pub deps: Vec<usize>,
    /// Allocations it allocates.
    pub allocs: Vec<AllocKey>,
    /// Allocations it frees.
    pub frees: Vec<AllocKey>,
    /// Allocations it uses.
    pub uses: Vec<AllocKey>,
}

/// What the checks read: nodes, edges, and which node allocates, frees or uses which
/// allocation. [`Graph::model`] makes one from a graph's record; tests and tools can build one
/// directly, without a GPU.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// The nodes, in the order added; dependencies point to earlier or later positions.
    pub nodes: Vec<ModelNode>,
    /// Each allocation's description, by key.
    pub allocations: Vec<String>,
    /// Allocations that another graph also frees.
    pub freed_elsewhere: Vec<AllocKey>,
}

impl Model {
    /// An empty model.
    pub fn new() -> Model {
        Model::default()
    }

    /// Adds an allocation described as `description` (`"allocation 'buf'"`).
    pub fn add_allocation(&mut self, description: impl Into<String>) -> AllocKey {
        self.allocations.push(description.into());
        AllocKey(self.allocations.len() - 1)
    }

    /// Adds a node after `deps`; returns its position.
    pub fn add_node(&mut self, kind: NodeKind, deps: &[usize]) -> usize {
        self.nodes.push(ModelNode {
            kind,
            label: None,
            deps: deps.to_vec(),
            allocs: Vec::new(),
            frees: Vec::new(),
            uses: Vec::new(),
        });
        self.nodes.len() - 1
    }

    /// Adds the edge `from → to`.
    pub fn add_edge(&mut self, from: usize, to: usize) {
        if !self.nodes[to].deps.contains(&from) {
            self.nodes[to].deps.push(from);
        }
    }

    /// Labels a node.
    pub fn set_label(&mut self, node: usize, label: impl Into<String>) {
        self.nodes[node].label = Some(label.into());
    }

    /// `node` allocates `allocation`.
    pub fn allocates(&mut self, node: usize, allocation: AllocKey) {
        self.nodes[node].allocs.push(allocation);
    }

    /// `node` frees `allocation`.
    pub fn frees(&mut self, node: usize, allocation: AllocKey) {
        self.nodes[node].frees.push(allocation);
    }

    /// `node` uses `allocation`.
    pub fn uses(&mut self, node: usize, allocation: AllocKey) {
        if !self.nodes[node].uses.contains(&allocation) {
            self.nodes[node].uses.push(allocation);
        }
    }

    /// Another graph frees `allocation` too.
    pub fn set_freed_elsewhere(&mut self, allocation: AllocKey) {
        self.freed_elsewhere.push(allocation);
    }
}

/// What the model says about one allocation.
#[derive(Default, Clone)]
struct Lifetime {
    alloc_node: Option<usize>,
    free_nodes: Vec<usize>,
    users: Vec<usize>,
}

/// Checks a model against the rules; returns every violation, ordered by node.
pub fn check_model(model: &Model) -> Vec<Violation> {
    let nodes = &model.nodes;
    let mut lifetimes = vec![Lifetime::default(); model.allocations.len()];
    for (i, node) in nodes.iter().enumerate() {
        for k in &node.allocs {
            lifetimes[k.0].alloc_node = Some(i);
        }
        for k in &node.frees {
            lifetimes[k.0].free_nodes.push(i);
        }
        for k in &node.uses {
            lifetimes[k.0].users.push(i);
        }
    }
    if lifetimes
        .iter()
        .all(|l| l.free_nodes.is_empty() && l.users.is_empty())
    {
        return Vec::new();
    }
    let mut reach = Reachability::new(nodes);
    let name = |i: usize| NodeRef {
        index: i,
        kind: nodes[i].kind.clone(),
        label: nodes[i].label.clone(),
    };
    let mut violations = Vec::new();
    for (k, life) in lifetimes.iter().enumerate() {
        let mut violation = |rule, node, other: Option<usize>| {
            violations.push(Violation {
                rule,
                allocation: model.allocations[k].clone(),
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
            if model.freed_elsewhere.contains(&AllocKey(k)) {
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
    nodes: &'a [ModelNode],
    /// Topological position of each node.
    order: Vec<u32>,
    /// Visit stamps, so that no query clears the array.
    stamp: Vec<u32>,
    generation: u32,
    stack: Vec<u32>,
}

impl<'a> Reachability<'a> {
    fn new(nodes: &'a [ModelNode]) -> Self {
        // Kahn's algorithm over the dependency lists.
        let n = nodes.len();
        let mut indegree = vec![0u32; n];
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (i, node) in nodes.iter().enumerate() {
            indegree[i] = node.deps.len() as u32;
            for &d in &node.deps {
                children[d].push(i as u32);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// G.3.1: alloc → a → {b, c}; free after b and c; d after c (uses after free); e alone.
    #[test]
    fn guide_g3_1_nodes_d_and_e_are_caught() {
        let mut m = Model::new();
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
        assert!(check_model(&m).is_empty(), "{:?}", check_model(&m));

        let d = m.add_node(kernel(), &[c]);
        m.set_label(d, "d");
        m.uses(d, buf);
        let e = m.add_node(kernel(), &[]);
        m.set_label(e, "e");
        m.uses(e, buf);
        let v = check_model(&m);
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
}
