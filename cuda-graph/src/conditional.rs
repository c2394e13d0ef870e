//! Conditional nodes: a node whose body graphs run on the GPU if, or while, a condition value
//! is non-zero, or the one body the value selects (`cuGraphConditionalHandleCreate`,
//! `cuGraphAddNode` with `CU_GRAPH_NODE_TYPE_CONDITIONAL`; CUDA 12.3 for IF and WHILE, 12.8 for
//! IF-ELSE and SWITCH).
//!
//! The lifetime rules of [`crate::check`] see a conditional node as one node that uses every
//! graph allocation its bodies use (whether a body runs is decided on the GPU, so each use must
//! be valid whether it runs or not): the node must come after those allocations' alloc nodes
//! and before their free nodes. Memory nodes inside a body are refused for the same reason. What
//! the bodies refer to is kept by the graph, as for its other nodes.

use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::error::{Error, Result, driver};
use crate::event::Event;
use crate::graph::{Graph, Node, next_graph_id};
use crate::memory::{DeviceAddress, MemsetValue};
use crate::module::{Function, KernelArgs, LaunchConfig};
use crate::node_kind::NodeKind;
use crate::pinned::PinnedBuffer;
use crate::record::MemRole;
use crate::sys;

/// A condition value of a graph (`CUgraphConditionalHandle`), made by
/// [`Graph::add_condition`]: set from device code with `cudaGraphSetConditional`, and, when made
/// with a default, reset to it at the start of every launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Condition {
    raw: sys::CUgraphConditionalHandle,
    graph: u64,
}

impl Condition {
    /// The raw handle, to pass to a kernel that sets it (`cudaGraphSetConditional`).
    #[must_use]
    pub fn as_raw(&self) -> sys::CUgraphConditionalHandle {
        self.raw
    }
}

/// What a conditional node does with its condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConditionalKind {
    /// One body, run once if the condition is non-zero.
    If,
    /// Two bodies: the first runs if the condition is non-zero, the second otherwise (a CUDA
    /// 12.8 driver or newer).
    IfElse,
    /// One body, run again and again while the condition is non-zero (checked before each run).
    While,
    /// `n` bodies: the one the condition's value selects runs, none when it is `n` or more (a
    /// CUDA 12.8 driver or newer, and headers).
    #[cfg(cuda_graph_cond_switch)]
    Switch(u32),
}

impl ConditionalKind {
    fn raw(self) -> (sys::CUgraphConditionalNodeType, u32) {
        use sys::CUgraphConditionalNodeType as T;
        match self {
            ConditionalKind::If => (T::CU_GRAPH_COND_TYPE_IF, 1),
            ConditionalKind::IfElse => (T::CU_GRAPH_COND_TYPE_IF, 2),
            ConditionalKind::While => (T::CU_GRAPH_COND_TYPE_WHILE, 1),
            #[cfg(cuda_graph_cond_switch)]
            ConditionalKind::Switch(n) => (T::CU_GRAPH_COND_TYPE_SWITCH, n),
        }
    }
}

/// A conditional node's body as its build closure sees it ([`Graph::add_conditional_node`]):
/// nodes are added to it as to a [`Graph`], but memory nodes (a body cannot hold them), and it
/// cannot leave the closure. The body's graph belongs to the conditional node, and what its
/// nodes use is recorded on that node when the closure returns: a body that outlived the
/// closure would hold a handle the parent graph destroys, and take nodes the parent's record
/// never sees. So a `Body` is neither made nor moved out by its users (no constructor, no
/// `Default`, no mutable access to the graph inside), and reads as a `&Graph`.
pub struct Body {
    graph: Graph,
}

impl Deref for Body {
    type Target = Graph;
    fn deref(&self) -> &Graph {
        &self.graph
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Body").field(&self.graph).finish()
    }
}

impl Body {
    /// As [`Graph::add_kernel_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_kernel_node`]'s.
    ///
    /// # Safety
    ///
    /// As [`Graph::add_kernel_node`].
    pub unsafe fn add_kernel_node(
        &mut self,
        deps: &[Node],
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<Node> {
        // SAFETY: the caller upholds `Graph::add_kernel_node`'s contract.
        unsafe { self.graph.add_kernel_node(deps, function, config, args) }
    }

    /// As [`Graph::add_memset_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_memset_node`]'s.
    pub fn add_memset_node(
        &mut self,
        deps: &[Node],
        target: &impl DeviceAddress,
        value: u32,
        count: usize,
    ) -> Result<Node> {
        self.graph.add_memset_node(deps, target, value, count)
    }

    /// As [`Graph::add_memset_node_2d`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_memset_node_2d`]'s.
    pub fn add_memset_node_2d<T: MemsetValue>(
        &mut self,
        deps: &[Node],
        target: &impl DeviceAddress,
        value: T,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<Node> {
        (self.graph).add_memset_node_2d(deps, target, value, width, height, pitch)
    }

    /// As [`Graph::add_memcpy_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_memcpy_node`]'s.
    pub fn add_memcpy_node(
        &mut self,
        deps: &[Node],
        dst: &impl DeviceAddress,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<Node> {
        self.graph.add_memcpy_node(deps, dst, src, bytes)
    }

    /// As [`Graph::add_memcpy_node_htod`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_memcpy_node_htod`]'s.
    pub fn add_memcpy_node_htod<T: bytemuck::Pod>(
        &mut self,
        deps: &[Node],
        dst: &impl DeviceAddress,
        src: &PinnedBuffer<T>,
        bytes: usize,
    ) -> Result<Node> {
        self.graph.add_memcpy_node_htod(deps, dst, src, bytes)
    }

    /// As [`Graph::add_memcpy_node_dtoh`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_memcpy_node_dtoh`]'s.
    pub fn add_memcpy_node_dtoh<T: bytemuck::Pod>(
        &mut self,
        deps: &[Node],
        dst: &PinnedBuffer<T>,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<Node> {
        self.graph.add_memcpy_node_dtoh(deps, dst, src, bytes)
    }

    /// As [`Graph::add_empty_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_empty_node`]'s.
    pub fn add_empty_node(&mut self, deps: &[Node]) -> Result<Node> {
        self.graph.add_empty_node(deps)
    }

    /// As [`Graph::add_host_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_host_node`]'s.
    pub fn add_host_node(
        &mut self,
        deps: &[Node],
        f: impl Fn() + Send + Sync + 'static,
    ) -> Result<Node> {
        self.graph.add_host_node(deps, f)
    }

    /// As [`Graph::add_event_record_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_event_record_node`]'s.
    pub fn add_event_record_node(&mut self, deps: &[Node], event: &Event) -> Result<Node> {
        self.graph.add_event_record_node(deps, event)
    }

    /// As [`Graph::add_event_wait_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_event_wait_node`]'s.
    pub fn add_event_wait_node(&mut self, deps: &[Node], event: &Event) -> Result<Node> {
        self.graph.add_event_wait_node(deps, event)
    }

    /// As [`Graph::add_child_graph_node`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_child_graph_node`]'s.
    pub fn add_child_graph_node(&mut self, deps: &[Node], child: &Graph) -> Result<Node> {
        self.graph.add_child_graph_node(deps, child)
    }

    /// As [`Graph::add_child_graph_node_moved`] (CUDA 12.9 headers and newer).
    ///
    /// # Errors
    ///
    /// As [`Graph::add_child_graph_node_moved`]'s.
    #[cfg(cuda_graph_child_move)]
    pub fn add_child_graph_node_moved(&mut self, deps: &[Node], child: Graph) -> Result<Node> {
        self.graph.add_child_graph_node_moved(deps, child)
    }

    /// As [`Graph::add_dependency`].
    ///
    /// # Errors
    ///
    /// As [`Graph::add_dependency`]'s.
    pub fn add_dependency(&mut self, from: Node, to: Node) -> Result<()> {
        self.graph.add_dependency(from, to)
    }

    /// As [`Graph::set_label`].
    ///
    /// # Errors
    ///
    /// As [`Graph::set_label`]'s.
    pub fn set_label(&mut self, node: Node, label: impl Into<String>) -> Result<()> {
        self.graph.set_label(node, label)
    }

    /// As [`Graph::add_condition`], for a conditional node inside this body.
    ///
    /// # Errors
    ///
    /// As [`Graph::add_condition`]'s.
    pub fn add_condition(&mut self, default: Option<u32>) -> Result<Condition> {
        self.graph.add_condition(default)
    }

    /// As [`Graph::add_conditional_node`]: a conditional node inside this body.
    ///
    /// # Errors
    ///
    /// As [`Graph::add_conditional_node`]'s.
    pub fn add_conditional_node(
        &mut self,
        deps: &[Node],
        condition: &Condition,
        kind: ConditionalKind,
        build: impl FnOnce(&mut [Body]) -> Result<()>,
    ) -> Result<Node> {
        self.graph
            .add_conditional_node(deps, condition, kind, build)
    }
}

impl Graph {
    /// Makes a condition value for conditional nodes of this graph
    /// (`cuGraphConditionalHandleCreate`). With `default`, the value is set to it at the start
    /// of every launch (`CU_GRAPH_COND_ASSIGN_DEFAULT`); without, it starts at 0 and keeps what
    /// device code last set across launches.
    ///
    /// # Errors
    ///
    /// [`Device::bind`](crate::Device::bind)'s errors; [`Error::Driver`] naming
    /// `cuGraphConditionalHandleCreate` (a driver older than CUDA 12.3, for one).
    pub fn add_condition(&mut self, default: Option<u32>) -> Result<Condition> {
        self.device.bind()?;
        let (value, flags) = match default {
            Some(v) => (v, sys::CU_GRAPH_COND_ASSIGN_DEFAULT),
            None => (0, 0),
        };
        let mut raw = 0;
        // SAFETY: `raw` is a valid out-pointer; the graph and the context are live.
        driver!(unsafe {
            sys::cuGraphConditionalHandleCreate(
                &mut raw,
                self.raw,
                self.device.context_raw(),
                value,
                flags,
            )
        })?;
        Ok(Condition {
            raw,
            graph: self.id,
        })
    }

    /// Adds a conditional node after `deps`, and builds its bodies: `build` receives them as
    /// [`Body`] values (one for [`If`](ConditionalKind::If) and
    /// [`While`](ConditionalKind::While), two for [`IfElse`](ConditionalKind::IfElse), `n` for a
    /// switch), which cannot leave it, and adds their nodes. The node owns the bodies; what their
    /// nodes refer to is kept by this graph, and the graph allocations they use count as used by
    /// the conditional node (see the module docs), whichever way `build` ends: a panic in it goes
    /// on after they are recorded.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// # let device = Device::get(0)?;
    /// # let module = Module::from_ptx(&device, "")?;
    /// # let fill = module.function("fill_u32")?;
    /// let out = DeviceBuffer::<u32>::zeroed(&device, 256)?;
    /// let mut graph = Graph::new(&device)?;
    /// let run_it = graph.add_condition(Some(1))?; // reset to 1 at every launch
    /// graph.add_conditional_node(&[], &run_it, ConditionalKind::If, |bodies| {
    ///     let args = KernelArgs::new().ptr(&out).value(256u64).value(7u32);
    ///     // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over `out`.
    ///     unsafe { bodies[0].add_kernel_node(&[], &fill, LaunchConfig::new((1, 1, 1), (256, 1, 1)), &args)? };
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphAddNode`, before the driver is called, when
    /// `condition` belongs to another graph or a switch has no body, or when a node of `deps`
    /// belongs to another graph or is listed twice; [`Device::bind`](crate::Device::bind)'s
    /// errors; [`Error::Driver`] naming `cuGraphAddNode` when the driver refuses the node (a
    /// kind it does not support, for one). The error of `build`: the node then stays in the
    /// graph with what `build` added to its bodies, and the bodies' uses are recorded all the
    /// same. A [`Body`] offers no memory nodes; a child graph with memory nodes moved into one
    /// is refused ([`Error::InvalidArgument`] naming `cuGraphAddNode`).
    pub fn add_conditional_node(
        &mut self,
        deps: &[Node],
        condition: &Condition,
        kind: ConditionalKind,
        build: impl FnOnce(&mut [Body]) -> Result<()>,
    ) -> Result<Node> {
        const CALL: &str = "cuGraphAddNode";
        if condition.graph != self.id {
            return Err(Error::invalid(
                CALL,
                "the condition was made for another graph",
            ));
        }
        let (type_, size) = kind.raw();
        if size == 0 {
            return Err(Error::invalid(CALL, "a switch needs at least one body"));
        }
        self.device.bind()?;
        let mut params = sys::CUgraphNodeParams {
            type_: sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ..Default::default()
        };
        params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle: condition.raw,
            type_,
            size,
            phGraph_out: std::ptr::null_mut(),
            ctx: self.device.context_raw(),
        };
        let (raw, indices) = self.add_raw(CALL, deps, |node, graph, deps, count| {
            // SAFETY: `add_raw`'s pointers are valid for the call (no edge data); the driver
            // fills in the bodies it makes.
            unsafe {
                sys::cuGraphAddNode_v2(node, graph, deps, std::ptr::null(), count, &mut params)
            }
        })?;
        // SAFETY: the union holds the conditional parameters written above, whose
        // `phGraph_out` the driver set to an array of `size` body graphs that the node owns.
        let raw_bodies = unsafe {
            let out = params.__bindgen_anon_1.conditional.phGraph_out;
            std::slice::from_raw_parts(out, size as usize).to_vec()
        };
        let mut bodies: Vec<Body> = raw_bodies
            .into_iter()
            .map(|raw| {
                let mut graph = Graph::wrap(raw, &self.device, next_graph_id());
                graph.owns_raw = false;
                graph.in_body = true;
                Body { graph }
            })
            .collect();
        // The node is in the raw graph whatever `build` does, a panic included: what the
        // bodies use is recorded and kept before the panic goes on.
        let built = catch_unwind(AssertUnwindSafe(|| build(&mut bodies)));
        let node = self.push(raw, NodeKind::Conditional, indices);
        for body in &mut bodies {
            let body = &mut body.graph;
            self.add_refs(node, body.record.handles(|role| role == MemRole::Use));
            self.keep.get_mut().take_from(body.keep.get_mut());
        }
        match built {
            Ok(built) => built.map(|()| node),
            Err(panic) => resume_unwind(panic),
        }
    }
}
