//! Explicit graphs: the builder, which writes each node into the graph's [`Record`] (read by
//! the lifetime checks of [`crate::check`], without a GPU), and reading a raw graph into one.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::alloc::{AllocParams, GraphAllocation};
use crate::device::Device;
use crate::error::{Error, Result, check, driver};
use crate::event::Event;
use crate::handle::{Handle, OwnedHandle};
use crate::inline_list::Few;
use crate::int_hash::IdMap;
use crate::keep::{KeepList, Kept};
use crate::memory::DeviceAddress;
use crate::module::{Function, KernelArgs, LaunchConfig};
use crate::pinned::PinnedBuffer;
use crate::record::{MemRole, NodeRecord, Record};
use crate::sys;

pub use crate::node_kind::NodeKind;

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_graph_id() -> u64 {
    NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed)
}

/// A node of a [`Graph`]: the graph's id and the node's position in it. Copy; only valid with
/// the graph that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub(crate) graph: u64,
    pub(crate) index: u32,
}

impl Node {
    /// The node's position in its graph (0 for the first node added).
    #[must_use]
    pub fn index(self) -> usize {
        self.index as usize
    }

    /// The id of the graph it belongs to ([`Graph::id`]); a node read back from the driver
    /// ([`DriverNode`](crate::DriverNode)) is one of the graph that was asked.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let node = graph.add_empty_node(&[])?;
    /// assert_eq!(node.graph_id(), graph.id());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn graph_id(self) -> u64 {
        self.graph
    }
}

/// A CUDA graph under construction, with its record. Dropping it destroys the graph
/// (`cuGraphDestroy`); executable graphs made from it are independent of it, and keep alive
/// what its nodes refer to until their launches are done.
pub struct Graph {
    pub(crate) raw: sys::CUgraph,
    pub(crate) device: Device,
    pub(crate) id: u64,
    /// The nodes, their edges and the allocations they touch.
    pub(crate) record: Record,
    /// What the nodes refer to (the ownership rule of the crate docs' "Safety model").
    pub(crate) keep: RefCell<KeepList>,
    /// Set while an executable graph made from this graph exists (graphs with memory nodes
    /// allow only one).
    pub(crate) instantiated: Arc<AtomicBool>,
    /// Whether this value destroys `raw` on drop (false once moved into a parent, and for a
    /// conditional node's body, which its node owns).
    pub(crate) owns_raw: bool,
    /// Whether it is a conditional node's body, where memory nodes are refused
    /// ([`crate::conditional`]).
    pub(crate) in_body: bool,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: a CUgraph may be used from any thread as long as calls are not concurrent; `Graph`
// is not `Sync` and every mutation takes `&mut self`.
unsafe impl Send for Graph {}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("id", &self.id)
            .field("nodes", &self.record.nodes.len())
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Handle for Graph {
    type Raw = sys::CUgraph;

    fn as_raw(&self) -> sys::CUgraph {
        Graph::as_raw(self)
    }
}

impl OwnedHandle for Graph {
    /// [`Graph::into_raw`]; never refused.
    fn into_raw(self) -> Result<sys::CUgraph, Graph> {
        Ok(Graph::into_raw(self))
    }

    /// [`Graph::from_raw`]: fails when the graph's nodes cannot be read.
    unsafe fn from_raw(raw: sys::CUgraph, device: &Device) -> Result<Graph> {
        // SAFETY: the caller upholds `Graph::from_raw`'s contract, which this one states.
        unsafe { Graph::from_raw(raw, device) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        for allocation in self.record.freed() {
            allocation.register_free(self.id, false);
        }
        // Let go of with the release's job, once done: after the gate, where a panic in the
        // drop of a value it holds (a host closure's capture) is caught and recorded, as for
        // the other holders of the list.
        let keep = std::mem::take(&mut self.keep);
        if self.owns_raw {
            let raw = self.raw as usize;
            self.device.release(move |device| {
                let _held = &keep;
                // SAFETY: owned; destroyed once. Executable graphs do not depend on it.
                device.record(driver!(unsafe { sys::cuGraphDestroy(raw as sys::CUgraph) }));
                true
            });
        } else {
            crate::deferred::release(self.device.ordinal(), move || {
                let _held = &keep;
                true
            });
        }
    }
}

impl Graph {
    /// An empty graph whose nodes run on `device` (`cuGraphCreate`).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuGraphCreate`.
    pub fn new(device: &Device) -> Result<Graph> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; flags must be 0.
        driver!(unsafe { sys::cuGraphCreate(&mut raw, 0) })?;
        Ok(Graph::wrap(raw, device, next_graph_id()))
    }

    pub(crate) fn wrap(raw: sys::CUgraph, device: &Device, id: u64) -> Graph {
        Graph::wrap_with(raw, device, id, Record::of_graph(id))
    }

    /// [`wrap`](Graph::wrap) with `record` as the graph's record.
    pub(crate) fn wrap_with(raw: sys::CUgraph, device: &Device, id: u64, record: Record) -> Graph {
        Graph {
            raw,
            device: device.clone(),
            id,
            record,
            keep: RefCell::default(),
            instantiated: Arc::new(AtomicBool::new(false)),
            owns_raw: true,
            in_body: false,
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::Graph),
        }
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUgraph {
        self.raw
    }

    /// Takes ownership of a graph made elsewhere. Its existing nodes are read into the record as
    /// far as the driver describes them (memory nodes become [`GraphAllocation`]s; kernel
    /// arguments are not known, so the lifetime checks cannot see their uses).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuGraphGetNodes`, `cuGraphGetEdges`, `cuGraphNodeGetType`,
    /// `cuGraphMemAllocNodeGetParams` or `cuGraphMemFreeNodeGetParams` when the driver cannot
    /// describe the graph. The graph is taken all the same: on error it is destroyed.
    ///
    /// # Safety
    ///
    /// `raw` is a live graph for `device` that nothing else destroys or mutates from now on.
    /// No executable graph made from it exists and no allocation of its alloc nodes is live
    /// (allocated by a launch and not yet freed): its allocations are read back as new
    /// [`GraphAllocation`]s, which know nothing of earlier instantiations and launches, so the
    /// checks that refuse a second instantiation while the first one's allocations are live
    /// (G.3.3) cannot see them. A graph handed over with [`Graph::into_raw`] and taken back
    /// meets this once every executable graph made from it is dropped and each allocation that
    /// outlived a launch is freed.
    pub unsafe fn from_raw(raw: sys::CUgraph, device: &Device) -> Result<Graph> {
        // No node is known beforehand: the driver describes each.
        let known = Vec::<(sys::CUgraphNode, Infallible)>::new();
        // SAFETY: the caller hands over a live graph of `device`.
        unsafe {
            read_graph(
                raw,
                device,
                next_graph_id(),
                known,
                |no, _| match no {},
                &[],
                &[],
            )
        }
    }

    /// Gives up ownership: the caller destroys the graph. What its nodes refer to (modules,
    /// memory, host closures) is handed to the raw graph first, as a user object it retains,
    /// released when the graph and every executable graph made from it are done; if the driver
    /// refuses that, it is kept for the rest of the process instead (leaked, never freed early)
    /// and the error is recorded in [`Device::drop_errors`].
    #[must_use = "the handle is no longer destroyed on drop: destroy it, or it leaks"]
    pub fn into_raw(mut self) -> sys::CUgraph {
        // The record holds the graph allocations its nodes name; it goes with this value.
        let keep = self.keep.get_mut();
        for (allocation, _) in self.record.allocations_with_roles() {
            keep.push(allocation.keep());
        }
        if let Err(e) = retain_keep(&self) {
            self.device.record_drop_error(e);
            std::mem::forget(self.share_keep());
        }
        self.owns_raw = false;
        self.raw
    }

    /// What the nodes refer to as of now, for an executable graph or a user object to hold.
    pub(crate) fn share_keep(&self) -> Arc<Kept> {
        self.keep.borrow_mut().share()
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A process-unique number naming this graph ([`GraphAllocation::owner_graph`] refers to it).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The graph's record: its nodes, edges and the allocations they allocate, free and use,
    /// which the lifetime checks read.
    #[must_use]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The record's nodes, in the order added.
    #[must_use]
    pub fn nodes(&self) -> &[NodeRecord] {
        &self.record.nodes
    }

    /// The record of `node`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::node` when `node` belongs to another graph.
    pub fn node(&self, node: Node) -> Result<&NodeRecord> {
        self.index_of("Graph::node", node)
            .map(|i| &self.record.nodes[i])
    }

    /// Names a node, for errors and DOT output.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::set_label` when `node` belongs to another graph.
    pub fn set_label(&mut self, node: Node, label: impl Into<String>) -> Result<()> {
        let i = self.index_of("Graph::set_label", node)?;
        self.record.nodes[i].set_label(label.into());
        Ok(())
    }

    /// The allocations this graph's alloc nodes make.
    pub fn allocations(&self) -> impl Iterator<Item = &GraphAllocation> {
        let record = &self.record;
        record
            .nodes
            .iter()
            .flat_map(|n| n.keys(MemRole::Alloc))
            .filter_map(|k| record.allocation(k))
    }

    /// Whether the graph has alloc or free nodes (which forbid cloning, a second instantiation,
    /// and deleting nodes or edges).
    #[must_use]
    pub fn has_memory_nodes(&self) -> bool {
        self.record.has_memory_nodes()
    }

    /// Refuses a memory node in a conditional node's body: whether the body runs is decided on
    /// the GPU, so the lifetime checks could not tell whether its allocation exists.
    fn refuse_in_body(&self, call: &'static str) -> Result<()> {
        if self.in_body {
            return Err(Error::invalid(
                call,
                "a conditional node's body cannot hold memory nodes: whether it runs is decided on the GPU",
            ));
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn index_of(&self, call: &'static str, node: Node) -> Result<usize> {
        if node.graph != self.id || node.index as usize >= self.record.nodes.len() {
            return Err(Error::invalid(
                call,
                format!("node {} belongs to another graph", node.index),
            ));
        }
        Ok(node.index as usize)
    }

    /// The driver's handles and the record's positions of `deps`, refusing a node of another
    /// graph and a node listed twice. No dependency or one needs no heap allocation, and is
    /// resolved inline: this is the builder's hot path (`bench/README.md`, "Measurements behind
    /// code choices").
    #[inline(always)]
    fn resolve(
        &self,
        call: &'static str,
        deps: &[Node],
    ) -> Result<(Few<sys::CUgraphNode>, Few<u32>)> {
        match deps {
            [] => Ok((Few::Empty, Few::Empty)),
            [dep] => {
                let i = self.index_of(call, *dep)?;
                Ok((Few::One(self.record.nodes[i].raw), Few::One(i as u32)))
            }
            _ => self.resolve_many(call, deps),
        }
    }

    /// [`resolve`](Graph::resolve) for several dependencies.
    fn resolve_many(
        &self,
        call: &'static str,
        deps: &[Node],
    ) -> Result<(Few<sys::CUgraphNode>, Few<u32>)> {
        let mut raw = Few::new();
        let mut indices = Few::new();
        for &dep in deps {
            let i = self.index_of(call, dep)?;
            if indices.contains(&(i as u32)) {
                return Err(Error::invalid(
                    call,
                    format!("dependency on node {i} is listed twice"),
                ));
            }
            raw.push(self.record.nodes[i].raw);
            indices.push(i as u32);
        }
        Ok((raw, indices))
    }

    /// Makes a node after `deps`: `add` is the driver's call, given the out-pointer for the new
    /// node, the graph, and the dependencies' handles and count. Returns the node's handle and
    /// the dependencies' positions in the record.
    #[inline(always)]
    pub(crate) fn add_raw(
        &self,
        call: &'static str,
        deps: &[Node],
        add: impl FnOnce(
            *mut sys::CUgraphNode,
            sys::CUgraph,
            *const sys::CUgraphNode,
            usize,
        ) -> sys::CUresult,
    ) -> Result<(sys::CUgraphNode, Few<u32>)> {
        let (raw_deps, indices) = self.resolve(call, deps)?;
        let mut raw = std::ptr::null_mut();
        check(
            add(&mut raw, self.raw, raw_deps.as_ptr(), raw_deps.len()),
            call,
        )?;
        Ok((raw, indices))
    }

    /// Appends a node to the record.
    #[inline]
    pub(crate) fn push(&mut self, raw: sys::CUgraphNode, kind: NodeKind, deps: Few<u32>) -> Node {
        let index = self.record.push(raw, kind, deps);
        self.node_at(index)
    }

    /// The node at `index` of the record.
    #[inline]
    fn node_at(&self, index: usize) -> Node {
        Node {
            graph: self.id,
            index: index as u32,
        }
    }

    /// As [`push`](Graph::push), with what the node does to allocations.
    pub(crate) fn push_with<'a>(
        &mut self,
        raw: sys::CUgraphNode,
        kind: NodeKind,
        deps: Few<u32>,
        refs: impl IntoIterator<Item = (MemRole, &'a GraphAllocation)>,
    ) -> Node {
        let node = self.push(raw, kind, deps);
        self.add_refs(node, refs);
        node
    }

    /// Records what `node` does to allocations.
    #[inline]
    pub(crate) fn add_refs<'a>(
        &mut self,
        node: Node,
        refs: impl IntoIterator<Item = (MemRole, &'a GraphAllocation)>,
    ) {
        for (role, a) in refs {
            self.record.add_ref(node.index(), role, a);
        }
    }

    /// Adds an alloc node (`cuGraphAddMemAllocNode`, G.3.1) and returns it with the allocation,
    /// whose address is fixed from now on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemAllocNode`, before any driver call, for 0 bytes or a size
    /// of the device's whole memory or more. CUDA accepts a 0-byte allocation under stream
    /// capture (an alloc node of 0 bytes) and refuses it for an explicit node; this crate refuses
    /// both, so that every allocation it hands out has an address that is its own. A size the
    /// device cannot hold would be accepted by CUDA and fail only at the launch or upload. Sums
    /// of allocations are not checked: what fits depends on what else is allocated then.
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemAllocNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuDeviceTotalMem` (read once per device, for the size check) or `cuGraphAddMemAllocNode`.
    pub fn add_mem_alloc_node(
        &mut self,
        deps: &[Node],
        params: &AllocParams,
    ) -> Result<(Node, GraphAllocation)> {
        const CALL: &str = "cuGraphAddMemAllocNode";
        self.refuse_in_body(CALL)?;
        crate::alloc::check_size(CALL, &params.device, params.bytes)?;
        let descs = params.access_descs();
        let mut node_params = sys::CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: params.pool_props(),
            accessDescs: descs.as_ptr(),
            accessDescCount: descs.len(),
            bytesize: params.bytes,
            dptr: 0,
        };
        self.device.bind()?;
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; `descs` outlives it.
            unsafe { sys::cuGraphAddMemAllocNode(node, graph, deps, count, &mut node_params) }
        })?;
        let allocation = GraphAllocation::new(
            node_params.dptr,
            params.bytes,
            &params.device,
            self.id,
            params.label.clone(),
        );
        // Not in the keep list: the record holds it while the graph lives, and an executable
        // graph holds it when it outlives the launch (`Roles`); freed in this graph, it is
        // never live, and its handle guards nothing a launch uses.
        let index = self.record.push_alloc(raw, indices, allocation.clone());
        if let Some(label) = &params.label {
            self.record.nodes[index].set_label(label.clone());
        }
        Ok((self.node_at(index), allocation))
    }

    /// Adds a free node for `allocation` (`cuGraphAddMemFreeNode`): from this graph, or from
    /// another graph whose allocation outlives its launch (G.3.3).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemFreeNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Error::Driver`] naming `cuGraphAddMemFreeNode` when the
    /// driver refuses the node (an address that is not a graph allocation, for one). Freeing an
    /// allocation twice, or in two graphs, is not refused here: the lifetime checks report it.
    pub fn add_mem_free_node(
        &mut self,
        deps: &[Node],
        allocation: &GraphAllocation,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemFreeNode";
        self.refuse_in_body(CALL)?;
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; the driver validates the
            // address.
            unsafe { sys::cuGraphAddMemFreeNode(node, graph, deps, count, allocation.ptr()) }
        })?;
        let index =
            self.record
                .push_ref(raw, NodeKind::MemFree, indices, MemRole::Free, allocation);
        allocation.register_free(self.id, true);
        Ok(self.node_at(index))
    }

    /// Adds a kernel node (`cuGraphAddKernelNode`). Graph allocations among `args` are recorded
    /// as used by this node.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddKernelNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddKernelNode` when the driver refuses the node.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`]: `args` matches the kernel's parameters, and every address is
    /// valid for the kernel's accesses whenever the node runs (for graph allocations, the
    /// lifetime checks verify the ordering).
    pub unsafe fn add_kernel_node(
        &mut self,
        deps: &[Node],
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddKernelNode";
        // The device's context must be current: where none was, the driver crashed adding a
        // kernel node of a module loaded from PTX (H200, driver 580;
        // `graph_built_where_no_context_is_current`).
        self.device.bind()?;
        let (raw, indices) = args.with_pointers(|params| {
            let node_params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: function.as_raw(),
                gridDimX: config.grid.0,
                gridDimY: config.grid.1,
                gridDimZ: config.grid.2,
                blockDimX: config.block.0,
                blockDimY: config.block.1,
                blockDimZ: config.block.2,
                sharedMemBytes: config.shared_mem_bytes,
                kernelParams: params,
                ..Default::default()
            };
            self.add_raw(CALL, deps, |node, graph, deps, count| {
                // SAFETY: `add_raw`'s pointers are valid for the call; the driver copies the
                // parameters (the pointed-to argument values) during it; the caller vouches
                // for their types.
                unsafe { sys::cuGraphAddKernelNode(node, graph, deps, count, &node_params) }
            })
        })?;
        let kind = NodeKind::Kernel(function.shared_name());
        let keep = self.keep.get_mut();
        function.keep_in(keep);
        args.keep_unrecorded_in(keep);
        let mut uses = args.graph_allocations();
        Ok(match (uses.next(), uses.next()) {
            (None, _) => self.push(raw, kind, indices),
            (Some(a), None) => {
                let index = self.record.push_ref(raw, kind, indices, MemRole::Use, a);
                self.node_at(index)
            }
            _ => {
                let uses = args.graph_allocations().map(|a| (MemRole::Use, a));
                self.push_with(raw, kind, indices, uses)
            }
        })
    }

    /// Adds a memset node that writes `value` to `count` 32-bit words at the start of `target`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemsetNode`, before the driver is called, when
    /// `count` is 0 or `count` 32-bit words do not fit `target`; likewise when a node of `deps`
    /// belongs to another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`]
    /// naming `cuGraphAddMemsetNode`.
    pub fn add_memset_node(
        &mut self,
        deps: &[Node],
        target: &impl DeviceAddress,
        value: u32,
        count: usize,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemsetNode";
        crate::transfer::check_memset(CALL, target, count, 4)?;
        let params = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: target.device_ptr(),
            pitch: 0,
            value,
            elementSize: 4,
            width: count,
            height: 1,
        };
        self.add_memset_raw(deps, target, &params)
    }

    /// Adds the memset node `params` describes, whose region the caller checked against
    /// `target`; records its use of a graph allocation and keeps `target` alive.
    fn add_memset_raw(
        &mut self,
        deps: &[Node],
        target: &impl DeviceAddress,
        params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemsetNode";
        self.device.bind()?;
        let context = self.device.context_raw();
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; the region was checked
            // against the target's size.
            unsafe { sys::cuGraphAddMemsetNode(node, graph, deps, count, params, context) }
        })?;
        let uses = target.graph_allocation().map(|a| (MemRole::Use, a));
        let node = self.push_with(raw, NodeKind::Memset, indices, uses);
        target.owner().keep_unrecorded_in(self.keep.get_mut());
        Ok(node)
    }

    /// Adds a memset node that writes `value` (1, 2 or 4 bytes: `u8`, `u16` or `u32`) into a
    /// 2-D region of `target`: `height` rows of `width` elements, each row `pitch` bytes after
    /// the one before (`cuGraphAddMemsetNode` with `elementSize`, `width`, `height`, `pitch`).
    /// With `height` 1 it is a 1-D memset of `width` elements, and `pitch` is not used.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemsetNode`, before any driver call, for an
    /// empty region, a `pitch` shorter than a row (with more than one row), or a region that does
    /// not fit `target` (the last row ends at `pitch × (height − 1) + width × size` bytes,
    /// computed without overflow). The driver's own error for an address or pitch that is not a
    /// multiple of the element size.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let image = DeviceBuffer::<u8>::zeroed(&device, 64 * 48)?; // 48 rows of 64 bytes
    /// let mut graph = Graph::new(&device)?;
    /// // The left 16 bytes of every row, set to 0xFF.
    /// graph.add_memset_node_2d(&[], &image, 0xFFu8, 16, 48, 64)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_memset_node_2d<T: crate::memory::MemsetValue>(
        &mut self,
        deps: &[Node],
        target: &impl DeviceAddress,
        value: T,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemsetNode";
        let size = std::mem::size_of::<T>();
        let row = width.checked_mul(size);
        let pitch = if height == 1 { row.unwrap_or(0) } else { pitch };
        let end = row.and_then(|row| {
            pitch
                .checked_mul(height.checked_sub(1)?)
                .and_then(|start| start.checked_add(row))
        });
        let problem = if width == 0 || height == 0 {
            Some("an empty region".to_string())
        } else if row.is_some_and(|row| height > 1 && pitch < row) {
            Some(format!(
                "a pitch of {pitch} bytes is shorter than a row of {width} elements of {size} bytes"
            ))
        } else if end.is_none_or(|end| end > target.byte_len()) {
            let region = if height == 1 {
                format!("{width} elements of {size} bytes")
            } else {
                format!("{height} rows of {width} elements of {size} bytes, {pitch} bytes apart,")
            };
            Some(format!(
                "{region} do not fit a target of {} bytes",
                target.byte_len()
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::invalid(CALL, problem));
        }
        let params = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: target.device_ptr(),
            pitch,
            value: value.bits(),
            elementSize: size as u32,
            width,
            height,
        };
        self.add_memset_raw(deps, target, &params)
    }

    /// Adds a memcpy node copying `bytes` from `src` to `dst`, both device memory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemcpyNode`, before the driver is called, when
    /// `bytes` is 0 or more than `src` or `dst` holds, and likewise when a node of `deps` belongs
    /// to another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddMemcpyNode`.
    pub fn add_memcpy_node(
        &mut self,
        deps: &[Node],
        dst: &impl DeviceAddress,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemcpyNode";
        if bytes == 0 || bytes > dst.byte_len() || bytes > src.byte_len() {
            return Err(Error::invalid(
                CALL,
                format!(
                    "{bytes} bytes do not fit source ({}) and destination ({})",
                    src.byte_len(),
                    dst.byte_len()
                ),
            ));
        }
        let params = sys::CUDA_MEMCPY3D {
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcDevice: src.device_ptr(),
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstDevice: dst.device_ptr(),
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
            ..Default::default()
        };
        self.device.bind()?;
        let context = self.device.context_raw();
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; both ranges were checked
            // against their sizes.
            unsafe { sys::cuGraphAddMemcpyNode(node, graph, deps, count, &params, context) }
        })?;
        let uses = [dst.graph_allocation(), src.graph_allocation()];
        let uses = uses.into_iter().flatten().map(|a| (MemRole::Use, a));
        let node = self.push_with(raw, NodeKind::Memcpy, indices, uses);
        let keep = self.keep.get_mut();
        dst.owner().keep_unrecorded_in(keep);
        src.owner().keep_unrecorded_in(keep);
        Ok(node)
    }

    /// Adds a memcpy node copying the first `bytes` of the pinned host buffer `src` to device
    /// memory `dst` (`cuGraphAddMemcpyNode` with a `CU_MEMORYTYPE_HOST` source): the input
    /// half of NVIDIA's graphMemoryNodes sample. The graph keeps `src`'s memory and `dst`
    /// alive (the ownership rule of the crate docs' "Safety model"); a graph allocation as
    /// `dst` is a use the lifetime checks see. Each launch reads `src` as it is when the node
    /// runs: write it between launches through [`PinnedBuffer::as_mut_slice`], which waits for
    /// the launches queued before, and while which launches are refused
    /// ([`Error::InUseByHost`]).
    ///
    /// A pageable `&[T]` is not offered: the node reads its source at every launch, long after
    /// a borrowed slice may be gone.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddMemcpyNode`, before the driver is called, when
    /// `bytes` is 0 or more than `src` or `dst` holds, and likewise when a node of `deps` belongs
    /// to another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddMemcpyNode`.
    pub fn add_memcpy_node_htod<T: bytemuck::Pod>(
        &mut self,
        deps: &[Node],
        dst: &impl DeviceAddress,
        src: &PinnedBuffer<T>,
        bytes: usize,
    ) -> Result<Node> {
        crate::transfer::check_host_memcpy("cuGraphAddMemcpyNode", dst, src.byte_len(), bytes)?;
        let params = sys::CUDA_MEMCPY3D {
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: src.memory().ptr().cast_const(),
            srcPitch: bytes,
            srcHeight: 1,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstDevice: dst.device_ptr(),
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
            ..Default::default()
        };
        self.add_host_memcpy_node(deps, &params, dst, src.keep())
    }

    /// Adds a memcpy node copying the first `bytes` of device memory `src` into the pinned host
    /// buffer `dst` (`cuGraphAddMemcpyNode` with a `CU_MEMORYTYPE_HOST` destination): the
    /// output half of the graphMemoryNodes sample. Kept and recorded as in
    /// [`add_memcpy_node_htod`](Graph::add_memcpy_node_htod); read the result through
    /// [`PinnedBuffer::as_slice`], which waits for the launches queued before. A pageable
    /// `&mut [T]` is not offered, for the same reason.
    ///
    /// # Errors
    ///
    /// As [`add_memcpy_node_htod`](Graph::add_memcpy_node_htod)'s.
    pub fn add_memcpy_node_dtoh<T: bytemuck::Pod>(
        &mut self,
        deps: &[Node],
        dst: &PinnedBuffer<T>,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<Node> {
        crate::transfer::check_host_memcpy("cuGraphAddMemcpyNode", src, dst.byte_len(), bytes)?;
        let params = sys::CUDA_MEMCPY3D {
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcDevice: src.device_ptr(),
            srcPitch: bytes,
            srcHeight: 1,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            dstHost: dst.memory().ptr(),
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
            ..Default::default()
        };
        self.add_host_memcpy_node(deps, &params, src, dst.keep())
    }

    /// Adds the memcpy node `params` describes (one row of `bytes`, its pitches that row's
    /// length) between `device` memory and the pinned memory that `host` keeps, both checked by
    /// the caller; records the use of a graph allocation and keeps both alive.
    fn add_host_memcpy_node(
        &mut self,
        deps: &[Node],
        params: &sys::CUDA_MEMCPY3D,
        device: &impl DeviceAddress,
        host: crate::keep::Keep,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddMemcpyNode";
        self.device.bind()?;
        let context = self.device.context_raw();
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; both ranges were checked
            // against their sizes, and the graph keeps both memories from now on.
            unsafe { sys::cuGraphAddMemcpyNode(node, graph, deps, count, params, context) }
        })?;
        let uses = device.graph_allocation().map(|a| (MemRole::Use, a));
        let node = self.push_with(raw, NodeKind::Memcpy, indices, uses);
        let keep = self.keep.get_mut();
        device.owner().keep_unrecorded_in(keep);
        keep.push_host(host);
        Ok(node)
    }

    /// Adds an empty node, which only orders its dependencies before its dependents.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddEmptyNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Error::Driver`] naming `cuGraphAddEmptyNode`.
    pub fn add_empty_node(&mut self, deps: &[Node]) -> Result<Node> {
        const CALL: &str = "cuGraphAddEmptyNode";
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call.
            unsafe { sys::cuGraphAddEmptyNode(node, graph, deps, count) }
        })?;
        Ok(self.push(raw, NodeKind::Empty, indices))
    }

    /// Adds a host node that calls `f` on a driver thread when the node runs. `f` must not call
    /// CUDA: this crate's calls that reach the driver fail there ([`Device::bind`] is refused),
    /// and what `f` drops is released later. Nor should it wait for anything a launch holds
    /// (such as [`GraphAllocation::is_live`] of an allocation the graph's own launch uses). A
    /// panic in `f` is caught and ends the process (it cannot unwind into the driver).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddHostNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddHostNode`.
    pub fn add_host_node(
        &mut self,
        deps: &[Node],
        f: impl Fn() + Send + Sync + 'static,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddHostNode";
        type Callback = Box<dyn Fn() + Send + Sync>;
        unsafe extern "C" fn trampoline(data: *mut c_void) {
            // SAFETY: `data` is the `Callback` kept alive by the graph and its executable graphs.
            let callback = unsafe { &*(data as *const Callback) };
            let _host = crate::deferred::InHostFunction::enter();
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)).is_err() {
                std::process::abort();
            }
        }
        let callback: Arc<Callback> = Arc::new(Box::new(f));
        let params = sys::CUDA_HOST_NODE_PARAMS {
            fn_: Some(trampoline),
            userData: Arc::as_ptr(&callback) as *mut c_void,
        };
        // As for a kernel node (`add_kernel_node`), the device's context is made current.
        self.device.bind()?;
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; the callback data lives as
            // long as the graph and its executable graphs (`keep`).
            unsafe { sys::cuGraphAddHostNode(node, graph, deps, count, &params) }
        })?;
        self.keep.get_mut().push(callback);
        Ok(self.push(raw, NodeKind::Host, indices))
    }

    /// Adds a node that records `event` (G.3.3's third ordering).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddEventRecordNode` when a node of `deps` belongs
    /// to another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddEventRecordNode`.
    pub fn add_event_record_node(&mut self, deps: &[Node], event: &Event) -> Result<Node> {
        self.add_event_node(deps, event, NodeKind::EventRecord)
    }

    /// Adds a node that waits for `event`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddEventWaitNode` when a node of `deps` belongs to
    /// another graph or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddEventWaitNode`.
    pub fn add_event_wait_node(&mut self, deps: &[Node], event: &Event) -> Result<Node> {
        self.add_event_node(deps, event, NodeKind::EventWait)
    }

    fn add_event_node(&mut self, deps: &[Node], event: &Event, kind: NodeKind) -> Result<Node> {
        type AddEventNode = unsafe fn(
            *mut sys::CUgraphNode,
            sys::CUgraph,
            *const sys::CUgraphNode,
            usize,
            sys::CUevent,
        ) -> sys::CUresult;
        let (call, add): (&'static str, AddEventNode) = if kind == NodeKind::EventRecord {
            ("cuGraphAddEventRecordNode", sys::cuGraphAddEventRecordNode)
        } else {
            ("cuGraphAddEventWaitNode", sys::cuGraphAddEventWaitNode)
        };
        // As for a kernel node (`add_kernel_node`), the device's context is made current.
        self.device.bind()?;
        let (raw, indices) = self.add_raw(call, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; the event is kept alive with
            // the graph.
            unsafe { add(node, graph, deps, count, event.as_raw()) }
        })?;
        let node = self.push(raw, kind, indices);
        self.record.nodes[node.index()].set_event(event.clone());
        self.keep.get_mut().push(Arc::new(event.clone()));
        Ok(node)
    }

    /// Adds a copy of `child` as a child graph node (`cuGraphAddChildGraphNode`). CUDA refuses
    /// children with memory nodes this way (`CUDA_ERROR_NOT_SUPPORTED`); so does this method,
    /// before calling the driver ([`Error::InvalidArgument`]): move them with
    /// [`add_child_graph_node_moved`](Graph::add_child_graph_node_moved).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddChildGraphNode`, before the driver is called,
    /// when `child` has memory nodes, and likewise when a node of `deps` belongs to another graph
    /// or is listed twice; [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuGraphAddChildGraphNode`.
    pub fn add_child_graph_node(&mut self, deps: &[Node], child: &Graph) -> Result<Node> {
        const CALL: &str = "cuGraphAddChildGraphNode";
        if child.has_memory_nodes() {
            return Err(Error::invalid(
                CALL,
                "the child graph has alloc or free nodes, which CUDA does not copy into a parent; move it in with add_child_graph_node_moved (CUDA 12.9+)",
            ));
        }
        // As for a kernel node (`add_kernel_node`), the device's context is made current: the
        // child's kernel nodes are cloned.
        self.device.bind()?;
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call; the driver clones the child
            // graph.
            unsafe { sys::cuGraphAddChildGraphNode(node, graph, deps, count, child.raw) }
        })?;
        // The child's list as it is now, frozen: the child may change (or be moved into another
        // graph) later, and two graphs copied into each other must not hold each other.
        self.keep.get_mut().push(child.share_keep());
        let node = self.push(raw, NodeKind::ChildGraph, indices);
        self.add_refs(node, child.record.handles(|role| role == MemRole::Use));
        Ok(node)
    }

    /// Moves `child`, memory nodes and all, into this graph as a child graph node
    /// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, CUDA 12.9 headers and newer). Its allocations
    /// are then allocated and freed by this graph.
    ///
    /// # Errors
    ///
    /// [`Error::Lifetime`] when `child` breaks a rule of [`crate::check`] (checked here: the
    /// parent's record sees it as one node); [`Error::InvalidArgument`] naming `cuGraphAddNode`
    /// when a node of `deps` belongs to another graph or is listed twice; [`Device::bind`]'s
    /// errors; [`Error::Driver`] naming `cuGraphAddNode`. On error `child` is dropped.
    #[cfg(cuda_graph_child_move)]
    pub fn add_child_graph_node_moved(&mut self, deps: &[Node], mut child: Graph) -> Result<Node> {
        const CALL: &str = "cuGraphAddNode";
        if child.has_memory_nodes() {
            self.refuse_in_body(CALL)?;
        }
        // The parent's record folds the child into one node: the child's own order is checked
        // here, or never.
        child.check()?;
        let mut params = sys::CUgraphNodeParams {
            type_: sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH,
            ..Default::default()
        };
        params.__bindgen_anon_1.graph = sys::CUDA_CHILD_GRAPH_NODE_PARAMS {
            graph: child.raw,
            ownership: sys::CUgraphChildGraphNodeOwnership::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE,
        };
        // As for a kernel node (`add_kernel_node`), the device's context is made current.
        self.device.bind()?;
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call (no edge data); on success
            // the parent owns the child's handle.
            unsafe {
                sys::cuGraphAddNode_v2(node, graph, deps, std::ptr::null(), count, &mut params)
            }
        })?;
        child.owns_raw = false;
        // Shared, not taken: the child's list is shared with its executable graphs and with
        // graphs the child was copied into.
        self.keep.get_mut().push(child.share_keep());
        let node = self.push(raw, NodeKind::ChildGraph, indices);
        // The child's memory operations, then its uses, each in the child's order.
        let mem = [MemRole::Alloc, MemRole::Free];
        let refs: Vec<(MemRole, GraphAllocation)> = child
            .record
            .handles(|role| mem.contains(&role))
            .chain(child.record.handles(|role| role == MemRole::Use))
            .map(|(role, a)| (role, a.clone()))
            .collect();
        self.add_refs(node, refs.iter().map(|(role, a)| (*role, a)));
        for (role, allocation) in &refs {
            if *role == MemRole::Free {
                allocation.register_free(child.id, false);
                allocation.register_free(self.id, true);
            }
        }
        child.record = Record::of_graph(child.id);
        Ok(node)
    }

    /// Adds the edge `from → to` (`cuGraphAddDependencies`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddDependencies` when `from` or `to` belongs to
    /// another graph; [`Error::Driver`] naming `cuGraphAddDependencies` when the driver refuses the
    /// edge.
    pub fn add_dependency(&mut self, from: Node, to: Node) -> Result<()> {
        const CALL: &str = "cuGraphAddDependencies";
        let f = self.index_of(CALL, from)?;
        let t = self.index_of(CALL, to)?;
        let (from_raw, to_raw) = (self.record.nodes[f].raw, self.record.nodes[t].raw);
        check(
            // SAFETY: both nodes belong to this graph; one edge, no edge data.
            unsafe {
                sys::cuGraphAddDependencies_v2(self.raw, &from_raw, &to_raw, std::ptr::null(), 1)
            },
            CALL,
        )?;
        self.record.add_edge(f, t);
        Ok(())
    }

    /// Writes the driver's DOT description of the graph, with memory-node parameters
    /// (`cuGraphDebugDotPrint` with all detail flags).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphDebugDotPrint` when `path` contains a NUL byte;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuGraphDebugDotPrint` when the
    /// driver cannot write the file.
    pub fn debug_dot_print(&self, path: &std::path::Path) -> Result<()> {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid("cuGraphDebugDotPrint", "the path contains a NUL byte"))?;
        let verbose = sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE.0;
        // The verbose output reads every node's parameters: in the device's context.
        self.device.bind()?;
        // SAFETY: the path is NUL-terminated; the graph is live.
        driver!(unsafe { sys::cuGraphDebugDotPrint(self.raw, c_path.as_ptr(), verbose) })
    }
}

/// Makes `graph`, which is being handed over ([`Graph::into_raw`]), retain a user object that
/// holds its [`KeepList`]: the raw graph, and every executable graph instantiated from it, then
/// hold it until the driver is done with it.
fn retain_keep(graph: &Graph) -> Result<()> {
    unsafe extern "C" fn destroy(data: *mut c_void) {
        // SAFETY: `data` is the `Box<Payload>` leaked in `retain_keep`; the driver calls this
        // once, when the last reference is released.
        let payload = unsafe { Box::from_raw(data.cast::<Payload>()) };
        let (ordinal, keep) = *payload;
        // Driver thread: no CUDA here. The crate's release thread lets go of the list with
        // the job, once done.
        crate::deferred::enqueue_from_driver(
            ordinal,
            Box::new(move || {
                let _held = &keep;
                true
            }),
        );
    }
    /// The user object's data: the device's ordinal and the keep list.
    type Payload = (usize, Arc<Kept>);
    graph.device.bind()?;
    let payload: Payload = (graph.device.ordinal(), graph.share_keep());
    let data = Box::into_raw(Box::new(payload)).cast::<c_void>();
    let mut object = std::ptr::null_mut();
    // SAFETY: `data` is a leaked box that `destroy` frees; the flag is the one CUDA requires.
    let created = driver!(unsafe {
        sys::cuUserObjectCreate(
            &mut object,
            data,
            Some(destroy),
            1,
            sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
        )
    });
    if let Err(e) = created {
        // SAFETY: the driver did not take the box.
        drop(unsafe { Box::from_raw(data.cast::<Payload>()) });
        return Err(e);
    }
    // SAFETY: both handles are live; MOVE hands our one reference to the graph, which
    // releases it when destroyed (the destructor then runs once no executable graph holds
    // the object either).
    driver!(unsafe {
        sys::cuGraphRetainUserObject(
            graph.raw,
            object,
            1,
            sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
        )
    })
    .inspect_err(|_| {
        // SAFETY: our reference was not moved; releasing it runs the destructor.
        let _ = unsafe { sys::cuUserObjectRelease(object, 1) };
    })
}

/// Builds a [`Graph`] around a raw graph by reading its nodes and edges. The `captured` nodes
/// are known (`known_node` gives their record, which moves into the graph's); the others are
/// asked for their type, and their memory nodes are matched to `allocations` and
/// `frees` by address, or new allocations when made by other code. A capture passes the nodes
/// it reported ([`Capture::end`](crate::Capture::end)); [`Graph::from_raw`] passes none.
///
/// # Safety
///
/// `raw` is a live graph for `device`, owned by nobody else.
pub(crate) unsafe fn read_graph<C, K>(
    raw: sys::CUgraph,
    device: &Device,
    id: u64,
    captured: Vec<(sys::CUgraphNode, C)>,
    mut known_node: K,
    allocations: &[GraphAllocation],
    frees: &[GraphAllocation],
) -> Result<Graph>
where
    K: FnMut(C, Option<&mut IdMap<sys::CUdeviceptr, GraphAllocation>>) -> NodeParts,
{
    let mut graph = Graph::wrap(raw, device, id);
    // The nodes' parameters are read: in the device's context, as they were made.
    device.bind()?;
    // SAFETY: the caller hands over a live graph.
    let Listed { nodes, from, to } = &unsafe { nodes_and_edges(raw) }?;
    // The driver lists a captured graph's nodes in the order captured (so far): each known node
    // is then the next of `captured`, and no map is needed. From the first node out of that
    // order on, the rest are looked up by handle.
    let mut in_order = captured.into_iter().peekable();
    let mut known: Option<IdMap<usize, C>> = None;
    // Allocations by address, for memory nodes the capture did not report; made at the first
    // such node, from the allocations recorded before it.
    let mut by_address: Option<IdMap<sys::CUdeviceptr, GraphAllocation>> = None;
    let mut made: IdMap<sys::CUdeviceptr, VecDeque<GraphAllocation>> = IdMap::default();
    for a in allocations {
        made.entry(a.ptr()).or_default().push_back(a.clone());
    }
    graph.record.nodes.reserve(nodes.len());
    for &node in nodes {
        let what = match in_order.peek() {
            // (Empty once `known` is made.)
            Some(&(next, _)) if next == node => in_order.next().map(|(_, w)| w),
            _ => known
                .get_or_insert_with(|| in_order.by_ref().map(|(n, w)| (n as usize, w)).collect())
                .remove(&(node as usize)),
        };
        let (kind, refs) = match what {
            Some(what) => known_node(what, by_address.as_mut()),
            None => {
                let by_address =
                    by_address.get_or_insert_with(|| addresses(&graph.record, frees, id));
                // SAFETY: the node belongs to the live graph.
                unsafe { unknown_node(node, device, id, &mut made, by_address) }?
            }
        };
        graph.push_with(
            node,
            kind,
            Few::new(),
            refs.iter().map(|(role, a)| (*role, a)),
        );
    }
    add_edges(&mut graph.record, nodes, from, to);
    Ok(graph)
}

/// Adds to `record`, whose nodes are `nodes` in that order, the edges `from[i] → to[i]`; an
/// edge naming a node not in `nodes` is left out. Returns whether every edge leads from a node
/// to a later one.
pub(crate) fn add_edges(
    record: &mut Record,
    nodes: &[sys::CUgraphNode],
    from: &[sys::CUgraphNode],
    to: &[sys::CUgraphNode],
) -> bool {
    // A chain's edges come node after node: each edge's source is likely the node its last
    // target was, and its target the node after its source. Guesses are checked against the
    // handles; a miss looks the handle up in a map, made at the first miss.
    let mut index: Option<IdMap<usize, usize>> = None;
    let mut position = |node: sys::CUgraphNode, guess: usize| {
        if nodes.get(guess) == Some(&node) {
            return Some(guess);
        }
        let index = index.get_or_insert_with(|| {
            nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| (n as usize, i))
                .collect()
        });
        index.get(&(node as usize)).copied()
    };
    let mut last = 0;
    let mut forward = true;
    for (&f, &t) in from.iter().zip(to) {
        let Some(f) = position(f, last) else { continue };
        if let Some(t) = position(t, f + 1) {
            record.nodes[t].deps.push(f as u32);
            forward &= f < t;
            last = t;
        }
    }
    forward
}

/// A node's record apart from its handle and edges: its kind, and what it does to which
/// allocations.
pub(crate) type NodeParts = (NodeKind, Few<(MemRole, GraphAllocation)>);

/// The allocations a free node may free, by address: those of other graphs that the capture
/// frees, then those allocated by the nodes recorded so far (a later one replaces an earlier
/// one at the same address: free nodes free the allocation that last held their address).
fn addresses(
    recorded: &Record,
    frees: &[GraphAllocation],
    id: u64,
) -> IdMap<sys::CUdeviceptr, GraphAllocation> {
    let foreign = frees.iter().filter(|f| f.owner_graph() != id);
    let allocated = recorded
        .handles(|role| role == MemRole::Alloc)
        .map(|(_, a)| a);
    foreign
        .chain(allocated)
        .map(|a| (a.ptr(), a.clone()))
        .collect()
}

/// The record of a node the capture did not report: its type from the driver, and for memory
/// nodes the allocation, matched by address (alloc nodes to the allocations the capture made
/// in the order made, free nodes to `by_address`) or new when other code made it.
///
/// # Safety
///
/// `node` belongs to a live graph of `device`.
unsafe fn unknown_node(
    node: sys::CUgraphNode,
    device: &Device,
    id: u64,
    made: &mut IdMap<sys::CUdeviceptr, VecDeque<GraphAllocation>>,
    by_address: &mut IdMap<sys::CUdeviceptr, GraphAllocation>,
) -> Result<NodeParts> {
    // SAFETY: the node belongs to the graph.
    let kind = unsafe { node_kind(node) }?;
    let mut mem = Few::new();
    match kind {
        NodeKind::MemAlloc => {
            let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS::default();
            // SAFETY: the node is an alloc node; `params` is a valid out-pointer.
            driver!(unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut params) })?;
            let allocation = made
                .get_mut(&params.dptr)
                .and_then(VecDeque::pop_front)
                .unwrap_or_else(|| {
                    GraphAllocation::new(params.dptr, params.bytesize, device, id, None)
                });
            by_address.insert(params.dptr, allocation.clone());
            mem.push((MemRole::Alloc, allocation));
        }
        NodeKind::MemFree => {
            let mut ptr = 0;
            // SAFETY: the node is a free node; `ptr` is a valid out-pointer.
            driver!(unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut ptr) })?;
            if let Some(allocation) = by_address.get(&ptr).cloned() {
                allocation.register_free(id, true);
                mem.push((MemRole::Free, allocation));
            }
        }
        _ => {}
    }
    Ok((kind, mem))
}

/// What a node of a graph read back does, as the driver tells its type
/// (`cuGraphNodeGetType`); a kernel the crate did not record is named `captured`.
///
/// # Safety
///
/// `node` belongs to a live graph.
pub(crate) unsafe fn node_kind(node: sys::CUgraphNode) -> Result<NodeKind> {
    let mut kind_raw = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: the node belongs to a live graph.
    driver!(unsafe { sys::cuGraphNodeGetType(node, &mut kind_raw) })?;
    use sys::CUgraphNodeType as T;
    Ok(match kind_raw {
        T::CU_GRAPH_NODE_TYPE_KERNEL => NodeKind::Kernel("captured".into()),
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => NodeKind::MemAlloc,
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => NodeKind::MemFree,
        T::CU_GRAPH_NODE_TYPE_MEMSET => NodeKind::Memset,
        T::CU_GRAPH_NODE_TYPE_MEMCPY => NodeKind::Memcpy,
        T::CU_GRAPH_NODE_TYPE_EMPTY => NodeKind::Empty,
        T::CU_GRAPH_NODE_TYPE_HOST => NodeKind::Host,
        T::CU_GRAPH_NODE_TYPE_EVENT_RECORD => NodeKind::EventRecord,
        T::CU_GRAPH_NODE_TYPE_WAIT_EVENT => NodeKind::EventWait,
        T::CU_GRAPH_NODE_TYPE_GRAPH => NodeKind::ChildGraph,
        other => NodeKind::Other(other.0),
    })
}

/// Fills `list` from a driver call that writes up to `count` entries and says how many it
/// wrote; `list` ends up holding exactly those.
///
/// # Safety
///
/// `fill(ptr, &mut n)` writes at most `n` entries at `ptr` and sets `n` to the number written.
unsafe fn fill_list(
    list: &mut Vec<sys::CUgraphNode>,
    count: usize,
    fill: impl FnOnce(*mut sys::CUgraphNode, &mut usize) -> Result<()>,
) -> Result<()> {
    list.clear();
    list.reserve(count);
    let mut written = count;
    fill(list.as_mut_ptr(), &mut written)?;
    // SAFETY: the driver wrote `written` entries, at most the `count` reserved.
    unsafe { list.set_len(written.min(count)) };
    Ok(())
}

/// The graph's nodes (`cuGraphGetNodes`), in the order the driver lists them, into `nodes`.
///
/// # Safety
///
/// `raw` is a live graph.
pub(crate) unsafe fn graph_nodes(
    raw: sys::CUgraph,
    nodes: &mut Vec<sys::CUgraphNode>,
) -> Result<()> {
    let mut count = 0;
    // SAFETY: a null array asks for the count.
    driver!(unsafe { sys::cuGraphGetNodes(raw, std::ptr::null_mut(), &mut count) })?;
    nodes.clear();
    // An empty graph: ask no further (the driver refuses non-null arrays with a count of 0, as
    // cuGraphGetEdges does on the H200's 580 driver; the guard here is a precaution).
    if count == 0 {
        return Ok(());
    }
    let fill = |at, n: &mut usize| {
        // SAFETY: `at` has room for `n` entries.
        driver!(unsafe { sys::cuGraphGetNodes(raw, at, n) })
    };
    // SAFETY: the driver writes at most `n` nodes and says how many.
    unsafe { fill_list(nodes, count, fill) }
}

/// The graph's nodes into `nodes`, as [`graph_nodes`], in one driver call when the graph holds
/// at most `expected` of them (a captured graph read back, whose node count the guard knows).
/// The call is given room for one more: the driver fills what it has and says how many, so a
/// count of `expected` or fewer is the whole list; a full list may be cut short, and is read
/// again in two calls.
///
/// # Safety
///
/// `raw` is a live graph.
pub(crate) unsafe fn graph_nodes_expecting(
    raw: sys::CUgraph,
    nodes: &mut Vec<sys::CUgraphNode>,
    expected: usize,
) -> Result<()> {
    let room = expected.saturating_add(1);
    let fill = |at, n: &mut usize| {
        // SAFETY: `at` has room for `n` entries.
        driver!(unsafe { sys::cuGraphGetNodes(raw, at, n) })
    };
    // SAFETY: the driver writes at most `n` nodes and says how many.
    unsafe { fill_list(nodes, room, fill) }?;
    if nodes.len() < room {
        return Ok(());
    }
    // SAFETY: as above.
    unsafe { graph_nodes(raw, nodes) }
}

thread_local! {
    /// The emptied buffers of the last [`Listed`] dropped on this thread, for the next.
    static LISTED: Cell<[Vec<sys::CUgraphNode>; 3]> = const { Cell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// A graph's nodes and its edges (`from[i] → to[i]`) as the driver lists them, read into
/// buffers reused per thread: reading a captured graph back is on the capture's hot path.
pub(crate) struct Listed {
    pub(crate) nodes: Vec<sys::CUgraphNode>,
    pub(crate) from: Vec<sys::CUgraphNode>,
    pub(crate) to: Vec<sys::CUgraphNode>,
}

impl Listed {
    /// Empty lists, in this thread's spare buffers.
    pub(crate) fn new() -> Listed {
        let [nodes, from, to] = LISTED.try_with(Cell::take).unwrap_or_default();
        Listed { nodes, from, to }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        let lists = [
            std::mem::take(&mut self.nodes),
            std::mem::take(&mut self.from),
            std::mem::take(&mut self.to),
        ];
        if lists.iter().any(|l| l.capacity() > 1 << 20) {
            return;
        }
        // During the thread's teardown there is no spare to keep them in.
        let _ = LISTED.try_with(|spare| spare.set(lists));
    }
}

/// The graph's nodes, and its edges as two lists (from, to).
///
/// # Safety
///
/// `raw` is a live graph.
pub(crate) unsafe fn nodes_and_edges(raw: sys::CUgraph) -> Result<Listed> {
    let mut listed = Listed::new();
    // SAFETY: the caller's.
    unsafe { graph_nodes(raw, &mut listed.nodes) }?;
    let mut edges = 0;
    check(
        // SAFETY: null arrays ask for the count.
        unsafe {
            sys::cuGraphGetEdges_v2(
                raw,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut edges,
            )
        },
        "cuGraphGetEdges",
    )?;
    listed.from.clear();
    listed.to.clear();
    // A graph without edges (a single node) must not be asked with non-null arrays: the driver
    // returns CUDA_ERROR_INVALID_VALUE (seen capturing one kernel on the H200, driver 580).
    if edges == 0 {
        return Ok(listed);
    }
    listed.from.reserve(edges);
    listed.to.reserve(edges);
    let mut written = edges;
    check(
        // SAFETY: both arrays have room for `edges` entries; edge data is not asked for.
        unsafe {
            sys::cuGraphGetEdges_v2(
                raw,
                listed.from.as_mut_ptr(),
                listed.to.as_mut_ptr(),
                std::ptr::null_mut(),
                &mut written,
            )
        },
        "cuGraphGetEdges",
    )?;
    // SAFETY: the driver wrote `written` entries of each array, at most the `edges` reserved.
    unsafe {
        listed.from.set_len(written.min(edges));
        listed.to.set_len(written.min(edges));
    }
    Ok(listed)
}
