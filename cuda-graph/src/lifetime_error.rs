//! The error that reports broken lifetime rules of graph allocations ([`crate::check`] states
//! and checks them): each violation names its rule, the allocation, the offending node and the
//! node it must be ordered with, and the missing or offending edge. Plain data that needs no
//! graph, so that [`Error`](crate::Error) can hold it; [`crate::check`] re-exports every item.

use std::fmt;

use crate::node_kind::NodeKind;

/// An allocation of a [`Record`](crate::Record): its graph-local key, given when a node of the
/// record first names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey(pub usize);

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
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
    /// More than one alloc node allocates the allocation (possible only in a record built
    /// by hand, [`Record::new`](crate::Record::new)).
    AllocatedTwice,
    /// A node allocates, frees or uses an allocation that does not exist (possible only in a
    /// record built by hand, [`Record::new`](crate::Record::new)).
    UnknownAllocation,
    /// A node depends on a node that does not exist (possible only in a record built
    /// by hand, [`Record::new`](crate::Record::new)).
    UnknownDependency,
    /// The dependencies form a cycle, so no order exists.
    Cycle,
}

/// One broken rule: the allocation, the offending node, the node it must be ordered with, and
/// the missing or offending edge.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The allocation, as its label or number, size and address; empty for the rules about
    /// edges alone ([`Rule::Cycle`], [`Rule::UnknownDependency`]).
    pub allocation: String,
    /// The allocation's key in the [`Record`](crate::Record) (for a
    /// [`Graph`](crate::Graph), in [`Graph::record`](crate::Graph::record)); `None` for the rules
    /// about edges alone.
    pub key: Option<AllocKey>,
    /// The node that breaks the rule.
    pub node: NodeRef,
    /// The node it must be ordered with or conflicts with: the alloc node
    /// ([`NotAfterAlloc`](Rule::NotAfterAlloc), [`AllocatedTwice`](Rule::AllocatedTwice): the
    /// first one), the free node ([`UseAfterFree`](Rule::UseAfterFree),
    /// [`UnorderedWithFree`](Rule::UnorderedWithFree), [`FreedTwice`](Rule::FreedTwice): the
    /// first one); `None` otherwise.
    pub other: Option<NodeRef>,
    /// The edge `(from, to)`, as positions, whose addition (directly, or as a path of edges)
    /// fixes the violation: `(alloc node, node)` for [`NotAfterAlloc`](Rule::NotAfterAlloc),
    /// `(node, free node)` for [`UnorderedWithFree`](Rule::UnorderedWithFree) and
    /// [`UseAfterFree`](Rule::UseAfterFree) (after the offending path is cut).
    pub missing_edge: Option<(usize, usize)>,
    /// The edge `(from, to)`, as positions, that orders things wrongly: for
    /// [`UseAfterFree`](Rule::UseAfterFree), the last edge of the path from the free node to the
    /// node; for [`Cycle`](Rule::Cycle), the edge that closes the cycle into its lowest-numbered
    /// node; for [`UnknownDependency`](Rule::UnknownDependency), the dependency on a node that
    /// does not exist.
    pub offending_edge: Option<(usize, usize)>,
    /// For [`UseAfterFree`](Rule::UseAfterFree), a shortest path of edges from the free node to
    /// the node (both included); for [`Cycle`](Rule::Cycle), the cycle from `node` in edge
    /// order (its last node has an edge back to `node`); empty otherwise.
    pub path: Vec<NodeRef>,
}

impl Violation {
    /// Whether `node` is a free node (which "frees" rather than "uses" in sentences).
    fn verb(&self) -> &'static str {
        if self.node.kind == NodeKind::MemFree {
            "frees"
        } else {
            "uses"
        }
    }
}

/// Writes `a → b → c`, eliding the middle of long paths.
fn write_path(f: &mut fmt::Formatter<'_>, path: &[NodeRef], close: bool) -> fmt::Result {
    const KEEP: usize = 6;
    let mut first = true;
    let mut item = |f: &mut fmt::Formatter<'_>, text: &dyn fmt::Display| {
        let sep = if first { "" } else { " → " };
        first = false;
        write!(f, "{sep}{text}")
    };
    if path.len() <= KEEP {
        for n in path {
            item(f, n)?;
        }
    } else {
        for n in &path[..3] {
            item(f, n)?;
        }
        item(f, &format_args!("… ({} more)", path.len() - 5))?;
        for n in &path[path.len() - 2..] {
            item(f, n)?;
        }
    }
    if close {
        if let Some(start) = path.first() {
            item(f, start)?;
        }
    }
    Ok(())
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
                "{node} {} {alloc} but is not ordered after its alloc node, {other}: the edge {other} → {node} is missing (add it, or a path of edges between them)",
                self.verb()
            ),
            Rule::UseAfterFree => {
                write!(
                    f,
                    "{node} uses {alloc} after its free node, {other}, has freed it, through the offending path "
                )?;
                write_path(f, &self.path, false)?;
                match self
                    .path
                    .len()
                    .checked_sub(2)
                    .and_then(|i| self.path.get(i))
                {
                    Some(last) => write!(
                        f,
                        ": cut that path (its last edge is {last} → {node}) and add the edge {node} → {other}"
                    ),
                    None => write!(f, ": cut that path and add the edge {node} → {other}"),
                }
            }
            Rule::UnorderedWithFree => write!(
                f,
                "{node} uses {alloc} but is not ordered before its free node, {other}, so it may run after the free: the edge {node} → {other} is missing (add it, or a path of edges between them)"
            ),
            Rule::FreedTwice => write!(
                f,
                "{node} frees {alloc}, which {other} already frees: an allocation has one free node"
            ),
            Rule::FreedByTwoGraphs => write!(
                f,
                "{node} frees {alloc}, which another graph also frees: an allocation is freed by one graph only"
            ),
            Rule::AllocatedTwice => write!(
                f,
                "{node} allocates {alloc}, which {other} already allocates: an allocation has one alloc node"
            ),
            Rule::UnknownAllocation => write!(
                f,
                "{node} refers to {alloc}, which is not an allocation of the record"
            ),
            Rule::UnknownDependency => {
                let from = self.offending_edge.map(|(from, _)| from).unwrap_or(0);
                write!(
                    f,
                    "{node} depends on node #{from}, which does not exist: remove the offending edge #{from} → {node}"
                )
            }
            Rule::Cycle => {
                write!(f, "{node} is on the cycle ")?;
                write_path(f, &self.path, true)?;
                match self.path.last() {
                    Some(last) if self.path.len() > 1 => write!(
                        f,
                        ", and a graph with a cycle has no order: remove one of its edges, such as {last} → {node}"
                    ),
                    _ => write!(
                        f,
                        ", and a graph with a cycle has no order: remove its edge from {node} to itself"
                    ),
                }
            }
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
