//! Reading a graph back from the driver: a node's type and parameters (kernel, memset, memcpy,
//! alloc and free nodes), its dependencies and dependents, the graph's root nodes and all its
//! nodes, for explicit graphs (G.3.1) and captured ones (G.3.2) alike.
//!
//! This is an `impl Graph` block above `graph`, the module that defines [`Graph`]: the crate's
//! rule is that a method needing a higher layer lives in that layer's module (as
//! [`Graph::to_dot`] lives in `dot`), and reading back needs nothing of `graph` but its record,
//! while `graph` needs nothing of this. The answers are the driver's, not the record's
//! ([`Graph::nodes`]): they show what CUDA made of the calls, which for a captured graph is the
//! only full account of the kernels' shapes and the memsets' values.
//!
//! Nodes come back as [`DriverNode`]s: the crate's [`Node`] (its position in the record, so
//! results line up with [`Graph::nodes`]) wherever the driver's node is one the record holds,
//! which is every node the crate added or captured; the raw handle otherwise (a node added
//! through [`Graph::as_raw`] by other code).
//!
//! Every driver error names its call. The lists are read with two calls (the count, then the
//! entries): the buffer is reserved without overflow or abort, the second call is not made for
//! an empty list (the driver refuses non-null arrays with a count of 0 for some of these calls),
//! and a second answer longer than the first is an error rather than a silent truncation. The
//! structures read from the driver are made of integers, newtypes of integers and raw
//! pointers, valid for every bit pattern; nothing is handed to the driver for writing but
//! these out-parameters, and no pointer the driver returns is followed except an alloc node's
//! list of peer access descriptors, which the node owns while it exists.

use std::ffi::c_void;

use crate::error::{Error, Result, check, driver};
use crate::graph::{Graph, Node};
use crate::int_hash::IdMap;
use crate::module::LaunchConfig;
use crate::sys;

/// A node as the driver lists it: the record's [`Node`] where the record holds it, else the raw
/// handle (a node added through [`Graph::as_raw`] by other code, which the record does not see).
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let mut graph = Graph::new(&device)?;
/// let first = graph.add_empty_node(&[])?;
/// let second = graph.add_empty_node(&[first])?;
/// assert_eq!(graph.dependencies(second)?, vec![DriverNode::Recorded(first)]);
/// assert_eq!(graph.dependencies(second)?[0].recorded(), Some(first));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DriverNode {
    /// A node of the record: its position is [`Node::index`] in [`Graph::nodes`].
    Recorded(Node),
    /// A node the record does not hold, by its raw handle.
    Unrecorded(sys::CUgraphNode),
}

// SAFETY: the raw handle is a value here: `DriverNode` never dereferences it or passes it to
// the driver; whoever does so goes through `unsafe` calls whose contracts cover threads.
unsafe impl Send for DriverNode {}
// SAFETY: as for `Send`: nothing is reachable through a shared reference but the value.
unsafe impl Sync for DriverNode {}

impl DriverNode {
    /// The record's node, if it is one.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let node = graph.add_empty_node(&[])?;
    /// assert_eq!(graph.root_nodes()?[0].recorded(), Some(node));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn recorded(self) -> Option<Node> {
        match self {
            DriverNode::Recorded(node) => Some(node),
            DriverNode::Unrecorded(_) => None,
        }
    }
}

/// A node's parameters as the driver reports them ([`Graph::node_params`]): one variant per
/// kind of node whose parameters are read; the others carry their type only.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let mut graph = Graph::new(&device)?;
/// let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, 1 << 20))?;
/// let free = graph.add_mem_free_node(&[alloc], &buf)?;
/// match graph.node_params(free)? {
///     NodeParams::MemFree { address } => assert_eq!(address, buf.ptr()),
///     other => panic!("not a free node: {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeParams {
    /// A kernel node (`cuGraphKernelNodeGetParams`).
    Kernel(KernelNodeParams),
    /// A memset node (`cuGraphMemsetNodeGetParams`).
    Memset(MemsetNodeParams),
    /// A memcpy node (`cuGraphMemcpyNodeGetParams`).
    Memcpy(MemcpyNodeParams),
    /// An alloc node (`cuGraphMemAllocNodeGetParams`).
    MemAlloc(MemAllocNodeParams),
    /// A free node (`cuGraphMemFreeNodeGetParams`).
    MemFree {
        /// The address it frees.
        address: sys::CUdeviceptr,
    },
    /// A node of another type (empty, host, event, child graph, conditional, ...), whose
    /// parameters are not read: its type as the driver gives it.
    Other(sys::CUgraphNodeType),
}

impl NodeParams {
    /// The driver's type of the node these parameters belong to.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let node = graph.add_empty_node(&[])?;
    /// let params = graph.node_params(node)?;
    /// assert_eq!(params.node_type(), sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn node_type(&self) -> sys::CUgraphNodeType {
        use sys::CUgraphNodeType as T;
        match self {
            NodeParams::Kernel(_) => T::CU_GRAPH_NODE_TYPE_KERNEL,
            NodeParams::Memset(_) => T::CU_GRAPH_NODE_TYPE_MEMSET,
            NodeParams::Memcpy(_) => T::CU_GRAPH_NODE_TYPE_MEMCPY,
            NodeParams::MemAlloc(_) => T::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            NodeParams::MemFree { .. } => T::CU_GRAPH_NODE_TYPE_MEM_FREE,
            NodeParams::Other(t) => *t,
        }
    }
}

/// A kernel node's parameters: what it launches, and the launch's shape. The argument values
/// are not read (their types are not known here).
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let module = Module::from_ptx(&device, PTX)?;
/// let fill = module.function("fill_u32")?;
/// let buf = DeviceBuffer::<u32>::zeroed(&device, 1024)?;
/// let config = LaunchConfig::new((4, 1, 1), (256, 1, 1));
/// let mut graph = Graph::new(&device)?;
/// // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the 1024 values.
/// let node = unsafe {
///     graph.add_kernel_node(&[], &fill, config, &KernelArgs::new().ptr(&buf).value(1024u64).value(7u32))?
/// };
/// let NodeParams::Kernel(kernel) = graph.node_params(node)? else { unreachable!() };
/// assert_eq!((kernel.function, kernel.config), (fill.as_raw(), config));
/// # Ok(())
/// # }
/// # const PTX: &str = "";
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelNodeParams {
    /// The function it launches (`func`), the handle [`Function::as_raw`](crate::Function::as_raw)
    /// returns; null when it launches a library kernel ([`kernel`](Self::kernel)) instead.
    pub function: sys::CUfunction,
    /// The library kernel it launches (`kern`) when [`function`](Self::function) is null; null
    /// otherwise.
    pub kernel: sys::CUkernel,
    /// Its grid, block and dynamic shared memory (`gridDim*`, `blockDim*`, `sharedMemBytes`).
    pub config: LaunchConfig,
}

// SAFETY: the handles are values here: `KernelNodeParams` never dereferences them or passes
// them to the driver; whoever does so goes through `unsafe` calls whose contracts cover threads.
unsafe impl Send for KernelNodeParams {}
// SAFETY: as for `Send`: nothing is reachable through a shared reference but the values.
unsafe impl Sync for KernelNodeParams {}

/// A memset node's parameters (`CUDA_MEMSET_NODE_PARAMS`): `height` rows of `width` elements of
/// `element_size` bytes, each row `pitch` bytes after the one before, set to `value`.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let image = DeviceBuffer::<u8>::zeroed(&device, 64 * 48)?;
/// let mut graph = Graph::new(&device)?;
/// let node = graph.add_memset_node_2d(&[], &image, 0xFFu8, 16, 48, 64)?;
/// let NodeParams::Memset(memset) = graph.node_params(node)? else { unreachable!() };
/// assert_eq!((memset.value, memset.element_size), (0xFF, 1));
/// assert_eq!((memset.width, memset.height, memset.pitch), (16, 48, 64));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MemsetNodeParams {
    /// The first address it writes (`dst`).
    pub dst: sys::CUdeviceptr,
    /// The value, in the low `element_size` bytes.
    pub value: u32,
    /// Bytes per element: 1, 2 or 4 (`elementSize`).
    pub element_size: u32,
    /// Elements per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Bytes from one row's start to the next's (not used by a single row).
    pub pitch: usize,
}

/// One end of a copy ([`MemcpyNodeParams`]): the kind of memory and where the copy starts.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let (src, dst) = (DeviceBuffer::<u32>::zeroed(&device, 256)?, DeviceBuffer::<u32>::zeroed(&device, 256)?);
/// let mut graph = Graph::new(&device)?;
/// let node = graph.add_memcpy_node(&[], &dst, &src, 1024)?;
/// let NodeParams::Memcpy(copy) = graph.node_params(node)? else { unreachable!() };
/// assert_eq!(copy.src.memory_type, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
/// assert_eq!(copy.src.address, src.device_ptr());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MemcpyOperand {
    /// The kind of memory (`srcMemoryType`, `dstMemoryType`).
    pub memory_type: sys::CUmemorytype,
    /// The address: the device address for device and unified memory (`srcDevice`), the host
    /// address for host memory (`srcHost`, as an integer); 0 for an array, whose handle is not
    /// read.
    pub address: u64,
    /// The offset of the copied region: bytes in x, rows in y, slices in z (`srcXInBytes`,
    /// `srcY`, `srcZ`).
    pub offset: (usize, usize, usize),
    /// Bytes per row (`srcPitch`; 0 for a copy of one row).
    pub pitch: usize,
    /// Rows per slice (`srcHeight`; 0 for a copy of one slice).
    pub height: usize,
}

/// A memcpy node's parameters (`CUDA_MEMCPY3D`): source, destination and extent.
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let (src, dst) = (DeviceBuffer::<u32>::zeroed(&device, 256)?, DeviceBuffer::<u32>::zeroed(&device, 256)?);
/// let mut graph = Graph::new(&device)?;
/// let node = graph.add_memcpy_node(&[], &dst, &src, 1024)?;
/// let NodeParams::Memcpy(copy) = graph.node_params(node)? else { unreachable!() };
/// assert_eq!((copy.dst.address, copy.extent), (dst.device_ptr(), (1024, 1, 1)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MemcpyNodeParams {
    /// Where it copies from.
    pub src: MemcpyOperand,
    /// Where it copies to.
    pub dst: MemcpyOperand,
    /// Bytes per row, rows, slices (`WidthInBytes`, `Height`, `Depth`).
    pub extent: (usize, usize, usize),
}

/// An alloc node's parameters (`CUDA_MEM_ALLOC_NODE_PARAMS`): its address, size, the pool
/// properties it allocates with, and the peers that may access it (G.7.1; for a captured
/// allocation, the pool's access when it was captured, G.7.2).
///
/// ```no_run
/// # use cuda_graph::*;
/// # fn main() -> Result<()> {
/// let device = Device::get(0)?;
/// let mut graph = Graph::new(&device)?;
/// let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, 1 << 20))?;
/// let NodeParams::MemAlloc(params) = graph.node_params(alloc)? else { unreachable!() };
/// assert_eq!((params.address, params.bytes), (buf.ptr(), buf.bytes()));
/// assert_eq!(params.location.id, device.ordinal() as i32);
/// assert!(params.peer_access.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MemAllocNodeParams {
    /// The allocation's address, fixed for the graph's life (`dptr`).
    pub address: sys::CUdeviceptr,
    /// Its size in bytes (`bytesize`).
    pub bytes: usize,
    /// The kind of memory (`poolProps.allocType`; pinned for the crate's alloc nodes).
    pub allocation_type: sys::CUmemAllocationType,
    /// Where it resides (`poolProps.location`: a device and its ordinal, for the crate's).
    pub location: sys::CUmemLocation,
    /// The peers that may access it beside the resident device, as the node lists them
    /// (`accessDescs`): each one's location and access flags.
    pub peer_access: Vec<sys::CUmemAccessDesc>,
}

impl Graph {
    /// The driver's type of `node` (`cuGraphNodeGetType`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::node_type` when `node` belongs to another
    /// graph; [`Error::Driver`] naming `cuGraphNodeGetType`.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let (alloc, _buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, 1 << 20))?;
    /// assert_eq!(graph.node_type(alloc)?, sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    /// # Ok(())
    /// # }
    /// ```
    pub fn node_type(&self, node: Node) -> Result<sys::CUgraphNodeType> {
        let raw = self.raw_node("Graph::node_type", node)?;
        // SAFETY: `raw` is a node of this live graph, which `&self` keeps alive.
        unsafe { node_type(raw) }
    }

    /// The parameters of `node` as the driver reports them: its type (`cuGraphNodeGetType`),
    /// then for a kernel, memset, memcpy, alloc or free node the call that reads its
    /// parameters (`cuGraphKernelNodeGetParams`, `cuGraphMemsetNodeGetParams`,
    /// `cuGraphMemcpyNodeGetParams`, `cuGraphMemAllocNodeGetParams`,
    /// `cuGraphMemFreeNodeGetParams`). Captured nodes included: this is what a capture made of
    /// the calls captured.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::node_params` when `node` belongs to another
    /// graph; [`Device::bind`](crate::Device::bind)'s errors; [`Error::Driver`] naming the call that failed.
    /// [`Error::InvalidArgument`] naming `cuGraphMemAllocNodeGetParams` when the driver reports peer access descriptors at a
    /// null address, or more than this process can hold.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, 1 << 20))?;
    /// let memset = graph.add_memset_node(&[alloc], &buf, 7, 1024)?;
    /// let NodeParams::Memset(params) = graph.node_params(memset)? else { unreachable!() };
    /// assert_eq!((params.dst, params.value, params.width), (buf.ptr(), 7, 1024));
    /// # Ok(())
    /// # }
    /// ```
    pub fn node_params(&self, node: Node) -> Result<NodeParams> {
        let raw = self.raw_node("Graph::node_params", node)?;
        // A kernel node's parameters name its function: read in the device's context.
        self.device.bind()?;
        // SAFETY: `raw` is a node of this live graph, which `&self` keeps alive while the
        // parameters are read (an alloc node's access list among them).
        unsafe { node_params(raw) }
    }

    /// The nodes `node` depends on, as the driver lists them (`cuGraphNodeGetDependencies`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::dependencies` when `node` belongs to another
    /// graph; [`Error::Driver`] naming `cuGraphNodeGetDependencies`, with
    /// `CUDA_ERROR_LOSSY_QUERY` when an edge carries edge data (a programmatic dependency, which
    /// this does not read); [`Error::InvalidArgument`] naming `cuGraphNodeGetDependencies` when
    /// the driver reports more dependencies than this process can hold, or more on its second
    /// call than on its first.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let (a, b) = (graph.add_empty_node(&[])?, graph.add_empty_node(&[])?);
    /// let join = graph.add_empty_node(&[a, b])?;
    /// let deps: Vec<_> = graph.dependencies(join)?.into_iter().filter_map(DriverNode::recorded).collect();
    /// assert_eq!(deps.len(), 2);
    /// assert!(deps.contains(&a) && deps.contains(&b));
    /// # Ok(())
    /// # }
    /// ```
    pub fn dependencies(&self, node: Node) -> Result<Vec<DriverNode>> {
        const CALL: &str = "cuGraphNodeGetDependencies";
        let i = self.index_of("Graph::dependencies", node)?;
        let raw = self.record.nodes[i].raw;
        let list = node_list(CALL, |out, count| {
            // SAFETY: `raw` is a node of this live graph; `out` is null or holds `*count`
            // entries (`node_list`); edge data is not asked for.
            unsafe { sys::cuGraphNodeGetDependencies_v2(raw, out, std::ptr::null_mut(), count) }
        })?;
        // The record lists the same dependencies, likely in the same order: each is tried first.
        let guesses = &self.record.nodes[i].deps;
        let mut positions = Positions::new(self);
        Ok(list
            .into_iter()
            .enumerate()
            .map(|(k, dep)| positions.node(dep, guesses.get(k).map(|&g| g as usize)))
            .collect())
    }

    /// The nodes that depend on `node`, as the driver lists them
    /// (`cuGraphNodeGetDependentNodes`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Graph::dependents` when `node` belongs to another
    /// graph; [`Error::Driver`] naming `cuGraphNodeGetDependentNodes`, with
    /// `CUDA_ERROR_LOSSY_QUERY` when an edge carries edge data; [`Error::InvalidArgument`] naming
    /// `cuGraphNodeGetDependentNodes` when the driver reports more dependents than this process
    /// can hold, or more on its second call than on its first.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let first = graph.add_empty_node(&[])?;
    /// let second = graph.add_empty_node(&[first])?;
    /// assert_eq!(graph.dependents(first)?, vec![DriverNode::Recorded(second)]);
    /// assert!(graph.dependents(second)?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn dependents(&self, node: Node) -> Result<Vec<DriverNode>> {
        const CALL: &str = "cuGraphNodeGetDependentNodes";
        let raw = self.raw_node("Graph::dependents", node)?;
        let list = node_list(CALL, |out, count| {
            // SAFETY: `raw` is a node of this live graph; `out` is null or holds `*count`
            // entries (`node_list`); edge data is not asked for.
            unsafe { sys::cuGraphNodeGetDependentNodes_v2(raw, out, std::ptr::null_mut(), count) }
        })?;
        let mut positions = Positions::new(self);
        Ok(list.into_iter().map(|n| positions.node(n, None)).collect())
    }

    /// The graph's nodes without dependencies, as the driver lists them
    /// (`cuGraphGetRootNodes`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuGraphGetRootNodes`; [`Error::InvalidArgument`] naming
    /// `cuGraphGetRootNodes` when the driver reports more nodes than this process can hold, or
    /// more on its second call than on its first.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let root = graph.add_empty_node(&[])?;
    /// graph.add_empty_node(&[root])?;
    /// assert_eq!(graph.root_nodes()?, vec![DriverNode::Recorded(root)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn root_nodes(&self) -> Result<Vec<DriverNode>> {
        const CALL: &str = "cuGraphGetRootNodes";
        let graph = self.raw;
        let list = node_list(CALL, |out, count| {
            // SAFETY: the graph is live; `out` is null or holds `*count` entries (`node_list`).
            unsafe { sys::cuGraphGetRootNodes(graph, out, count) }
        })?;
        let mut positions = Positions::new(self);
        Ok(list.into_iter().map(|n| positions.node(n, None)).collect())
    }

    /// All the graph's nodes, as the driver lists them (`cuGraphGetNodes`). For a graph the
    /// crate built or captured, these are the record's nodes ([`Graph::nodes`]), each once.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuGraphGetNodes`; [`Error::InvalidArgument`] naming
    /// `cuGraphGetNodes` when the driver reports more nodes than this process can hold, or more
    /// on its second call than on its first.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let node = graph.add_empty_node(&[])?;
    /// assert_eq!(graph.driver_nodes()?, vec![DriverNode::Recorded(node)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn driver_nodes(&self) -> Result<Vec<DriverNode>> {
        const CALL: &str = "cuGraphGetNodes";
        let graph = self.raw;
        let list = node_list(CALL, |out, count| {
            // SAFETY: the graph is live; `out` is null or holds `*count` entries (`node_list`).
            unsafe { sys::cuGraphGetNodes(graph, out, count) }
        })?;
        // The driver lists nodes in the order they were made, the record's order.
        let mut positions = Positions::new(self);
        Ok(list
            .into_iter()
            .enumerate()
            .map(|(k, n)| positions.node(n, Some(k)))
            .collect())
    }

    /// The driver's handle of `node`, refusing a node of another graph.
    fn raw_node(&self, call: &'static str, node: Node) -> Result<sys::CUgraphNode> {
        self.index_of(call, node).map(|i| self.record.nodes[i].raw)
    }
}

/// The record's positions of the driver's handles: a guess is checked first, and the first
/// miss makes a map of every handle.
struct Positions<'g> {
    graph: &'g Graph,
    by_handle: Option<IdMap<usize, u32>>,
}

impl<'g> Positions<'g> {
    fn new(graph: &'g Graph) -> Positions<'g> {
        Positions {
            graph,
            by_handle: None,
        }
    }

    /// `raw` as a [`DriverNode`], trying the record's position `guess` first.
    fn node(&mut self, raw: sys::CUgraphNode, guess: Option<usize>) -> DriverNode {
        let nodes = self.graph.nodes();
        let hit = guess.filter(|&g| nodes.get(g).is_some_and(|n| n.raw == raw));
        let index = match hit {
            // Record positions fit a u32: the record numbers its nodes with one (`Node`).
            Some(g) => Some(g as u32),
            None => self
                .by_handle
                .get_or_insert_with(|| {
                    nodes
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.raw as usize, i as u32))
                        .collect()
                })
                .get(&(raw as usize))
                .copied(),
        };
        match index {
            Some(index) => DriverNode::Recorded(Node {
                graph: self.graph.id,
                index,
            }),
            None => DriverNode::Unrecorded(raw),
        }
    }
}

/// A list of nodes read with two calls of `query` (given the array, null to ask for the count,
/// and the count): the count, then, unless it is 0, the entries. The count is the driver's:
/// the buffer is reserved with `try_reserve_exact` (no overflow, no abort), and a second
/// answer longer than the first (the graph changed between the calls) is refused, not cut.
fn node_list(
    call: &'static str,
    mut query: impl FnMut(*mut sys::CUgraphNode, *mut usize) -> sys::CUresult,
) -> Result<Vec<sys::CUgraphNode>> {
    let mut count = 0;
    check(query(std::ptr::null_mut(), &mut count), call)?;
    // None: ask no further (some of these calls refuse a non-null array with a count of 0).
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut list = Vec::new();
    list.try_reserve_exact(count).map_err(|_| {
        Error::invalid(
            call,
            format!("the driver reports {count} nodes, more than this process can hold"),
        )
    })?;
    list.resize(count, std::ptr::null_mut());
    let mut written = count;
    check(query(list.as_mut_ptr(), &mut written), call)?;
    if written > count {
        return Err(Error::invalid(
            call,
            format!(
                "the driver reports {written} nodes after {count}: the graph changed between the two calls"
            ),
        ));
    }
    list.truncate(written);
    Ok(list)
}

/// The driver's type of `raw`.
///
/// # Safety
///
/// `raw` is a node of a live graph.
unsafe fn node_type(raw: sys::CUgraphNode) -> Result<sys::CUgraphNodeType> {
    let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: the caller's node; `kind` is a valid out-pointer.
    driver!(unsafe { sys::cuGraphNodeGetType(raw, &mut kind) })?;
    Ok(kind)
}

/// The parameters of `raw`, by its type.
///
/// # Safety
///
/// `raw` is a node of a live graph that stays alive during the call.
unsafe fn node_params(raw: sys::CUgraphNode) -> Result<NodeParams> {
    use sys::CUgraphNodeType as T;
    // SAFETY: the caller's node.
    let kind = unsafe { node_type(raw) }?;
    Ok(match kind {
        T::CU_GRAPH_NODE_TYPE_KERNEL => {
            let mut p = sys::CUDA_KERNEL_NODE_PARAMS::default();
            // SAFETY: a kernel node; `p` is a valid out-pointer of the struct the call writes
            // (`CUDA_KERNEL_NODE_PARAMS`, the `_v2` layout the call's `_v2` symbol takes). The
            // argument pointers it returns are not followed.
            driver!(unsafe { sys::cuGraphKernelNodeGetParams(raw, &mut p) })?;
            NodeParams::Kernel(KernelNodeParams {
                function: p.func,
                kernel: p.kern,
                config: LaunchConfig {
                    grid: (p.gridDimX, p.gridDimY, p.gridDimZ),
                    block: (p.blockDimX, p.blockDimY, p.blockDimZ),
                    shared_mem_bytes: p.sharedMemBytes,
                },
            })
        }
        T::CU_GRAPH_NODE_TYPE_MEMSET => {
            let mut p = sys::CUDA_MEMSET_NODE_PARAMS::default();
            // SAFETY: a memset node; `p` is a valid out-pointer.
            driver!(unsafe { sys::cuGraphMemsetNodeGetParams(raw, &mut p) })?;
            NodeParams::Memset(MemsetNodeParams {
                dst: p.dst,
                value: p.value,
                element_size: p.elementSize,
                width: p.width,
                height: p.height,
                pitch: p.pitch,
            })
        }
        T::CU_GRAPH_NODE_TYPE_MEMCPY => {
            let mut p = sys::CUDA_MEMCPY3D::default();
            // SAFETY: a memcpy node; `p` is a valid out-pointer. The host addresses it returns
            // are kept as integers, not followed.
            driver!(unsafe { sys::cuGraphMemcpyNodeGetParams(raw, &mut p) })?;
            NodeParams::Memcpy(MemcpyNodeParams {
                src: operand(
                    p.srcMemoryType,
                    p.srcHost,
                    p.srcDevice,
                    (p.srcXInBytes, p.srcY, p.srcZ),
                    p.srcPitch,
                    p.srcHeight,
                ),
                dst: operand(
                    p.dstMemoryType,
                    p.dstHost.cast_const(),
                    p.dstDevice,
                    (p.dstXInBytes, p.dstY, p.dstZ),
                    p.dstPitch,
                    p.dstHeight,
                ),
                extent: (p.WidthInBytes, p.Height, p.Depth),
            })
        }
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            // SAFETY: the caller's node, alive during the call.
            NodeParams::MemAlloc(unsafe { alloc_params(raw) }?)
        }
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => {
            let mut address = 0;
            // SAFETY: a free node; `address` is a valid out-pointer.
            driver!(unsafe { sys::cuGraphMemFreeNodeGetParams(raw, &mut address) })?;
            NodeParams::MemFree { address }
        }
        other => NodeParams::Other(other),
    })
}

/// One end of a copy, as [`MemcpyOperand`] describes it.
fn operand(
    memory_type: sys::CUmemorytype,
    host: *const c_void,
    device: sys::CUdeviceptr,
    offset: (usize, usize, usize),
    pitch: usize,
    height: usize,
) -> MemcpyOperand {
    use sys::CUmemorytype as M;
    let address = match memory_type {
        M::CU_MEMORYTYPE_DEVICE | M::CU_MEMORYTYPE_UNIFIED => device,
        M::CU_MEMORYTYPE_HOST => host.addr() as u64,
        _ => 0,
    };
    MemcpyOperand {
        memory_type,
        address,
        offset,
        pitch,
        height,
    }
}

/// An alloc node's parameters, with a copy of its peer access list.
///
/// # Safety
///
/// `raw` is an alloc node of a live graph that stays alive during the call.
unsafe fn alloc_params(raw: sys::CUgraphNode) -> Result<MemAllocNodeParams> {
    const CALL: &str = "cuGraphMemAllocNodeGetParams";
    let mut p = sys::CUDA_MEM_ALLOC_NODE_PARAMS::default();
    // SAFETY: an alloc node; `p` is a valid out-pointer. The driver points `accessDescs` at
    // memory the node owns, valid until the node is destroyed.
    driver!(unsafe { sys::cuGraphMemAllocNodeGetParams(raw, &mut p) })?;
    let count = p.accessDescCount;
    let mut peer_access = Vec::new();
    if count > 0 {
        if p.accessDescs.is_null() {
            return Err(Error::invalid(
                CALL,
                format!("the driver reports {count} peer access descriptors at a null address"),
            ));
        }
        peer_access.try_reserve_exact(count).map_err(|_| {
            Error::invalid(
                CALL,
                format!(
                    "the driver reports {count} peer access descriptors, more than this process can hold"
                ),
            )
        })?;
        for i in 0..count {
            // SAFETY: entry `i` of the node's array of `count` descriptors, which the node
            // owns and keeps while it exists (the caller keeps it); read unaligned, so that
            // no alignment is assumed. Every bit pattern is a valid `CUmemAccessDesc`
            // (integers and newtypes of integers).
            peer_access.push(unsafe { p.accessDescs.add(i).read_unaligned() });
        }
    }
    Ok(MemAllocNodeParams {
        address: p.dptr,
        bytes: p.bytesize,
        allocation_type: p.poolProps.allocType,
        location: p.poolProps.location,
        peer_access,
    })
}
