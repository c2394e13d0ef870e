//! What a node does: the kind of node in the builder's record, in the lifetime checks' model
//! and in their errors.

use std::fmt;
use std::sync::Arc;

/// What a node does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeKind {
    /// A kernel, by name.
    Kernel(Arc<str>),
    /// An allocation (`cuGraphAddMemAllocNode`).
    MemAlloc,
    /// A free (`cuGraphAddMemFreeNode`).
    MemFree,
    /// A memset.
    Memset,
    /// A memcpy.
    Memcpy,
    /// An empty node, for dependencies only.
    Empty,
    /// A host function.
    Host,
    /// An event record.
    EventRecord,
    /// An event wait.
    EventWait,
    /// A child graph.
    ChildGraph,
    /// A conditional node ([`crate::conditional`]), with its bodies' uses.
    Conditional,
    /// A node type of the driver that the builder does not make (seen in captured graphs).
    Other(u32),
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeKind::Kernel(name) => write!(f, "kernel {name}"),
            NodeKind::MemAlloc => f.write_str("alloc node"),
            NodeKind::MemFree => f.write_str("free node"),
            NodeKind::Memset => f.write_str("memset node"),
            NodeKind::Memcpy => f.write_str("memcpy node"),
            NodeKind::Empty => f.write_str("empty node"),
            NodeKind::Host => f.write_str("host node"),
            NodeKind::EventRecord => f.write_str("event record node"),
            NodeKind::EventWait => f.write_str("event wait node"),
            NodeKind::ChildGraph => f.write_str("child graph node"),
            NodeKind::Conditional => f.write_str("conditional node"),
            NodeKind::Other(t) => write!(f, "node of type {t}"),
        }
    }
}

/// Lets a [`NodeRecord::kind`](crate::NodeRecord::kind) be compared with a kind:
/// `node.kind() == NodeKind::MemFree`.
impl PartialEq<NodeKind> for &NodeKind {
    fn eq(&self, other: &NodeKind) -> bool {
        **self == *other
    }
}
