//! The record of a graph: its nodes in the order added, their dependencies, and which node
//! allocates, frees or uses which graph allocation. Each allocation gets a graph-local
//! [`AllocKey`] when a node of the record first names it, and nodes refer to allocations by
//! key. The builder ([`Graph`](crate::Graph)'s `add_*` methods), the capture read-back and
//! moved child graphs write a graph's record; the lifetime checks ([`crate::check`]), DOT
//! output, instantiation, update and read-back read it.
//!
//! A record built by hand ([`Record::new`]) needs no GPU: its allocations are descriptions,
//! and tests and tools write into it what they want to check, dependencies and keys that point
//! nowhere included: [`check_record`](crate::check::check_record) reports those as violations
//! and never panics on a record.

use std::cell::Cell;
use std::fmt;

use crate::alloc::GraphAllocation;
use crate::event::Event;
use crate::inline_list::Few;
use crate::int_hash::IdMap;
use crate::node_kind::NodeKind;
use crate::sys;

pub use crate::lifetime_error::AllocKey;

/// What a node does to an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemRole {
    /// Allocates it: an alloc node, or a moved child graph that holds one.
    Alloc,
    /// Frees it.
    Free,
    /// Reads or writes it: kernel arguments passed with
    /// [`KernelArgs::ptr`](crate::KernelArgs::ptr), memset and memcpy operands, the uses of a
    /// child graph or of a conditional node's bodies.
    Use,
}

/// Role bits: the record allocates, frees or uses an allocation.
pub(crate) const ALLOCATES: u8 = 1;
pub(crate) const FREES: u8 = 2;
pub(crate) const USES: u8 = 4;

impl MemRole {
    /// The role's bit among [`ALLOCATES`], [`FREES`] and [`USES`].
    #[inline]
    pub(crate) const fn bit(self) -> u8 {
        match self {
            MemRole::Alloc => ALLOCATES,
            MemRole::Free => FREES,
            MemRole::Use => USES,
        }
    }
}

/// One node of a [`Record`].
#[derive(Clone, Debug)]
pub struct NodeRecord {
    /// The driver's node; null in a record built by hand.
    pub(crate) raw: sys::CUgraphNode,
    pub(crate) kind: NodeKind,
    /// Positions of the nodes it depends on.
    pub(crate) deps: Few<u32>,
    /// The allocations it allocates, frees or uses, each (role, key) once.
    pub(crate) refs: Few<(MemRole, AllocKey)>,
    /// The label and the event, which few nodes have: out of line, so that the record's nodes,
    /// which the builder appends to a growing `Vec`, stay small.
    extra: Option<Box<NodeExtra>>,
}

/// What a [`NodeRecord`] rarely has.
#[derive(Clone, Debug, Default)]
struct NodeExtra {
    label: Option<String>,
    /// The event an event record or event wait node records or waits for.
    event: Option<Event>,
}

impl NodeRecord {
    fn new(raw: sys::CUgraphNode, kind: NodeKind, deps: Few<u32>) -> NodeRecord {
        NodeRecord {
            raw,
            kind,
            deps,
            refs: Few::new(),
            extra: None,
        }
    }

    fn extra(&mut self) -> &mut NodeExtra {
        self.extra.get_or_insert_default()
    }

    /// Names the node.
    pub(crate) fn set_label(&mut self, label: String) {
        self.extra().label = Some(label);
    }

    /// The event an event record or event wait node records or waits for.
    pub(crate) fn set_event(&mut self, event: Event) {
        self.extra().event = Some(event);
    }

    /// What the node does.
    #[must_use]
    pub fn kind(&self) -> &NodeKind {
        &self.kind
    }

    /// The user's name for it, if any.
    #[must_use]
    pub fn label(&self) -> Option<&str> {
        self.extra.as_ref()?.label.as_deref()
    }

    /// Positions of the nodes it depends on, in the order the edges were added.
    #[must_use]
    pub fn deps(&self) -> &[u32] {
        &self.deps
    }

    /// The allocations it allocates, frees or uses, by key, in the order recorded.
    #[must_use]
    pub fn refs(&self) -> &[(MemRole, AllocKey)] {
        &self.refs
    }

    /// The keys of the allocations it has `role` for.
    pub fn keys(&self, role: MemRole) -> impl Iterator<Item = AllocKey> + '_ {
        self.refs
            .iter()
            .filter(move |(r, _)| *r == role)
            .map(|&(_, k)| k)
    }

    /// The event an event record or event wait node records or waits for.
    #[must_use]
    pub fn event(&self) -> Option<&Event> {
        self.extra.as_ref()?.event.as_ref()
    }
}

/// One allocation of a [`Record`], by its key.
#[derive(Clone, Debug)]
struct Entry {
    /// The allocation; `None` in a record built by hand.
    handle: Option<GraphAllocation>,
    /// Its id ([`GraphAllocation::id`]); 0 in a record built by hand.
    id: u64,
    /// What a record built by hand calls it.
    description: String,
    /// Set by hand: another graph frees it too.
    freed_elsewhere: bool,
    /// What the record does to it: [`ALLOCATES`], [`FREES`], [`USES`].
    roles: u8,
}

/// A graph's nodes, edges and the allocations they allocate, free and use: what the lifetime
/// checks read. [`Graph::record`](crate::Graph::record) is a graph's; [`Record::new`] starts
/// one by hand, for checks without a GPU.
///
/// ```
/// use cuda_graph::check::{Record, Rule, check_record};
/// use cuda_graph::NodeKind;
///
/// // G.3.1's graph without its last edge: kernel d runs unordered with the free node.
/// let mut record = Record::new();
/// let a = record.add_allocation("allocation 'a'");
/// let alloc = record.add_node(NodeKind::MemAlloc, &[]);
/// record.allocates(alloc, a);
/// let d = record.add_node(NodeKind::Kernel("d".into()), &[alloc]);
/// record.uses(d, a);
/// let free = record.add_node(NodeKind::MemFree, &[alloc]);
/// record.frees(free, a);
/// let violations = check_record(&record);
/// assert_eq!(violations.len(), 1);
/// assert_eq!(violations[0].rule, Rule::UnorderedWithFree);
/// ```
#[derive(Clone, Default)]
pub struct Record {
    /// The graph's id ([`Graph::id`](crate::Graph::id)); 0 for a record built by hand.
    graph: u64,
    pub(crate) nodes: Vec<NodeRecord>,
    allocations: Vec<Entry>,
    /// Key of each allocation with a handle, by [`GraphAllocation::id`]; made only once ids
    /// stop rising with keys. While they rise (a graph's own alloc nodes make allocations in
    /// order, with rising ids), a binary search over the entries finds a key.
    keys: Option<IdMap<u64, u32>>,
    /// Whether a node allocates or frees.
    memory_nodes: bool,
}

thread_local! {
    /// The emptied buffers of a record dropped on this thread, for the next record made here: a
    /// program that builds one graph after another then grows no buffer (building is the hot
    /// path of a graph that is rebuilt at every step).
    static SPARE: Cell<(Vec<NodeRecord>, Vec<Entry>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// The most nodes a spare buffer may hold room for: a record of a larger graph lets go of its
/// buffers.
const SPARE_NODES: usize = 1 << 16;

impl Drop for Record {
    fn drop(&mut self) {
        if self.nodes.capacity() == 0 && self.allocations.capacity() == 0 {
            return;
        }
        let mut nodes = std::mem::take(&mut self.nodes);
        let mut allocations = std::mem::take(&mut self.allocations);
        nodes.clear();
        allocations.clear();
        if nodes.capacity() > SPARE_NODES || allocations.capacity() > SPARE_NODES {
            return;
        }
        // During the thread's teardown there is no spare to keep them in.
        let _ = SPARE.try_with(|spare| {
            let (n, a) = spare.take();
            let nodes = if nodes.capacity() >= n.capacity() {
                nodes
            } else {
                n
            };
            let allocations = if allocations.capacity() >= a.capacity() {
                allocations
            } else {
                a
            };
            spare.set((nodes, allocations));
        });
    }
}

// SAFETY: the record holds the driver's node handles as identifiers only: it never passes them
// to the driver. The `Graph` that owns a record makes every driver call with them, and is
// neither `Sync` nor changed through `&self`. Everything else in it is `Send + Sync`.
unsafe impl Send for Record {}
// SAFETY: as for `Send`; `&Record` hands out no way to change it.
unsafe impl Sync for Record {}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("nodes", &self.nodes)
            .field("allocations", &self.allocations)
            .finish_non_exhaustive()
    }
}

impl Record {
    /// An empty record, to be built by hand.
    #[must_use]
    pub fn new() -> Record {
        Record::default()
    }

    /// The empty record of graph `graph`, with the buffers of a record dropped before on this
    /// thread.
    pub(crate) fn of_graph(graph: u64) -> Record {
        let (nodes, allocations) = SPARE.try_with(Cell::take).unwrap_or_default();
        Record {
            graph,
            nodes,
            allocations,
            keys: None,
            memory_nodes: false,
        }
    }

    /// The nodes, in the order added.
    #[must_use]
    pub fn nodes(&self) -> &[NodeRecord] {
        &self.nodes
    }

    /// How many allocations the record names: keys run from 0 to this, in the order nodes
    /// first named them (for a record built by hand, the order added).
    #[must_use]
    pub fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    /// The allocation of `key`; `None` for a key the record does not have and in a record
    /// built by hand.
    #[must_use]
    pub fn allocation(&self, key: AllocKey) -> Option<&GraphAllocation> {
        self.allocations.get(key.0)?.handle.as_ref()
    }

    /// The allocations `node` (a node of this record) has `role` for, in the order recorded.
    pub fn allocations_of<'r>(
        &'r self,
        node: &'r NodeRecord,
        role: MemRole,
    ) -> impl Iterator<Item = &'r GraphAllocation> + 'r {
        node.keys(role).filter_map(|k| self.allocation(k))
    }

    /// The key of `allocation`, if a node of the record names it.
    #[must_use]
    pub fn key_of(&self, allocation: &GraphAllocation) -> Option<AllocKey> {
        self.find(allocation.id())
    }

    /// The key of the allocation with id `id`.
    #[inline]
    fn find(&self, id: u64) -> Option<AllocKey> {
        let k = match &self.keys {
            Some(keys) => *keys.get(&id)? as usize,
            None => {
                let newest = self.allocations.last()?;
                if id == newest.id {
                    self.allocations.len() - 1
                } else if id > newest.id {
                    return None;
                } else {
                    self.allocations.binary_search_by_key(&id, |e| e.id).ok()?
                }
            }
        };
        Some(AllocKey(k))
    }

    /// The allocation of `key` for people: its description in a record built by hand, else
    /// the allocation's label or number, size and address.
    #[must_use]
    pub fn describe(&self, key: AllocKey) -> String {
        match self.allocations.get(key.0) {
            Some(Entry {
                handle: Some(a), ..
            }) => a.to_string(),
            Some(e) => e.description.clone(),
            None => format!("allocation key #{}", key.0),
        }
    }

    /// Whether another graph frees the allocation of `key` too: set by hand, or for a graph's
    /// record that frees it, a free node of another graph that exists now (`false` for an
    /// allocation the graph does not free: only a second free breaks a rule).
    #[must_use]
    pub fn is_freed_elsewhere(&self, key: AllocKey) -> bool {
        self.allocations.get(key.0).is_some_and(|e| {
            e.freed_elsewhere
                || (e.roles & FREES != 0)
                    && e.handle
                        .as_ref()
                        .is_some_and(|a| a.freed_by_another_graph(self.graph))
        })
    }

    /// Adds an allocation described as `description` (`"allocation 'buf'"`).
    pub fn add_allocation(&mut self, description: impl Into<String>) -> AllocKey {
        self.allocations.push(Entry {
            handle: None,
            id: 0,
            description: description.into(),
            freed_elsewhere: false,
            roles: 0,
        });
        AllocKey(self.allocations.len() - 1)
    }

    /// Adds a node after `deps` (positions of any nodes, earlier, later, or none: positions
    /// past `u32::MAX` are recorded as `u32::MAX`); returns its position.
    pub fn add_node(&mut self, kind: NodeKind, deps: &[usize]) -> usize {
        let deps = deps
            .iter()
            .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
            .collect();
        self.push(std::ptr::null_mut(), kind, deps)
    }

    /// Adds the edge `from → to`, once; `from` may be any position.
    ///
    /// # Panics
    ///
    /// If `to` is not a node of the record.
    pub fn add_edge(&mut self, from: usize, to: usize) {
        let from = u32::try_from(from).unwrap_or(u32::MAX);
        let deps = &mut self.nodes[to].deps;
        if !deps.contains(&from) {
            deps.push(from);
        }
    }

    /// Removes the edge `from → to`, if there is one.
    ///
    /// # Panics
    ///
    /// If `to` is not a node of the record.
    pub fn remove_edge(&mut self, from: usize, to: usize) {
        let from = u32::try_from(from).unwrap_or(u32::MAX);
        let deps = &mut self.nodes[to].deps;
        if deps.contains(&from) {
            *deps = deps.iter().copied().filter(|&d| d != from).collect();
        }
    }

    /// Labels a node.
    ///
    /// # Panics
    ///
    /// If `node` is not a node of the record.
    pub fn set_label(&mut self, node: usize, label: impl Into<String>) {
        self.nodes[node].set_label(label.into());
    }

    /// `node` allocates `allocation`.
    ///
    /// # Panics
    ///
    /// If `node` is not a node of the record.
    pub fn allocates(&mut self, node: usize, allocation: AllocKey) {
        self.add_key(node, MemRole::Alloc, allocation);
    }

    /// `node` frees `allocation`.
    ///
    /// # Panics
    ///
    /// If `node` is not a node of the record.
    pub fn frees(&mut self, node: usize, allocation: AllocKey) {
        self.add_key(node, MemRole::Free, allocation);
    }

    /// `node` uses `allocation`.
    ///
    /// # Panics
    ///
    /// If `node` is not a node of the record.
    pub fn uses(&mut self, node: usize, allocation: AllocKey) {
        self.add_key(node, MemRole::Use, allocation);
    }

    /// Another graph frees `allocation` too; a key the record does not have is ignored.
    pub fn set_freed_elsewhere(&mut self, allocation: AllocKey) {
        if let Some(e) = self.allocations.get_mut(allocation.0) {
            e.freed_elsewhere = true;
        }
    }

    /// Whether a node allocates or frees (alloc and free nodes, moved child graphs with them).
    #[inline]
    pub(crate) fn has_memory_nodes(&self) -> bool {
        self.memory_nodes
    }

    /// What the record does to the allocation of `key` (role bits); 0 for a key it does not
    /// have.
    pub(crate) fn roles(&self, key: AllocKey) -> u8 {
        self.allocations.get(key.0).map_or(0, |e| e.roles)
    }

    /// Each allocation with a handle, with its role bits, in key order.
    pub(crate) fn allocations_with_roles(&self) -> impl Iterator<Item = (&GraphAllocation, u8)> {
        self.allocations
            .iter()
            .filter_map(|e| Some((e.handle.as_ref()?, e.roles)))
    }

    /// Every (role, allocation) of the nodes, in node order, whose role `which` selects.
    pub(crate) fn handles(
        &self,
        which: impl Fn(MemRole) -> bool + Copy,
    ) -> impl Iterator<Item = (MemRole, &GraphAllocation)> {
        self.nodes.iter().flat_map(move |n| {
            n.refs().iter().filter_map(move |&(role, k)| {
                which(role).then_some(())?;
                Some((role, self.allocation(k)?))
            })
        })
    }

    /// Appends a node; returns its position.
    #[inline]
    pub(crate) fn push(&mut self, raw: sys::CUgraphNode, kind: NodeKind, deps: Few<u32>) -> usize {
        self.nodes.push(NodeRecord::new(raw, kind, deps));
        self.nodes.len() - 1
    }

    /// Appends a node that allocates `allocation`, which no node of the record names yet (a new
    /// alloc node's or captured allocation's), giving it the next key; returns the node's
    /// position.
    #[inline]
    pub(crate) fn push_alloc(
        &mut self,
        raw: sys::CUgraphNode,
        deps: Few<u32>,
        allocation: GraphAllocation,
    ) -> usize {
        let key = self.new_key(allocation, ALLOCATES);
        self.memory_nodes = true;
        self.nodes.push(NodeRecord {
            raw,
            kind: NodeKind::MemAlloc,
            deps,
            refs: Few::One((MemRole::Alloc, key)),
            extra: None,
        });
        self.nodes.len() - 1
    }

    /// Appends a node that has `role` for `allocation` alone; returns its position.
    #[inline(always)]
    pub(crate) fn push_ref(
        &mut self,
        raw: sys::CUgraphNode,
        kind: NodeKind,
        deps: Few<u32>,
        role: MemRole,
        allocation: &GraphAllocation,
    ) -> usize {
        let key = self.key_for(allocation);
        if let Some(e) = self.allocations.get_mut(key.0) {
            e.roles |= role.bit();
        }
        self.memory_nodes |= role != MemRole::Use;
        self.nodes.push(NodeRecord {
            raw,
            kind,
            deps,
            refs: Few::One((role, key)),
            extra: None,
        });
        self.nodes.len() - 1
    }

    /// Records that `node` has `role` for `allocation`, giving the allocation its key when the
    /// record first sees it.
    #[inline]
    pub(crate) fn add_ref(&mut self, node: usize, role: MemRole, allocation: &GraphAllocation) {
        let key = self.key_for(allocation);
        self.add_key(node, role, key);
    }

    /// The key of `allocation`, made when the record first sees it. The newest allocation is
    /// tried first: an alloc node's users and its free node usually follow it.
    #[inline]
    fn key_for(&mut self, allocation: &GraphAllocation) -> AllocKey {
        let newest = self.allocations.last().and_then(|e| e.handle.as_ref());
        if newest.is_some_and(|h| h.same(allocation)) {
            return AllocKey(self.allocations.len() - 1);
        }
        if let Some(key) = self.find(allocation.id()) {
            return key;
        }
        self.new_key(allocation.clone(), 0)
    }

    /// Gives `allocation`, which the record does not have, the next key, with role bits `roles`.
    #[inline]
    fn new_key(&mut self, allocation: GraphAllocation, roles: u8) -> AllocKey {
        let id = allocation.id();
        let key = self.allocations.len();
        let rising = self.allocations.last().is_none_or(|e| e.id < id);
        self.allocations.push(Entry {
            handle: Some(allocation),
            id,
            description: String::new(),
            freed_elsewhere: false,
            roles,
        });
        match &mut self.keys {
            Some(keys) => {
                keys.insert(id, key as u32);
            }
            None if rising => {}
            None => {
                let keys = self.allocations.iter().enumerate();
                self.keys = Some(keys.map(|(k, e)| (e.id, k as u32)).collect());
            }
        }
        AllocKey(key)
    }

    /// The allocations the record frees.
    pub(crate) fn freed(&self) -> impl Iterator<Item = &GraphAllocation> {
        self.allocations_with_roles()
            .filter(|&(_, roles)| roles & FREES != 0)
            .map(|(a, _)| a)
    }

    fn add_key(&mut self, node: usize, role: MemRole, key: AllocKey) {
        let refs = &mut self.nodes[node].refs;
        match refs {
            Few::Empty => *refs = Few::One((role, key)),
            _ if refs.contains(&(role, key)) => return,
            _ => refs.push((role, key)),
        }
        if let Some(e) = self.allocations.get_mut(key.0) {
            e.roles |= role.bit();
        }
        self.memory_nodes |= role != MemRole::Use;
    }
}
