//! Executable graphs: instantiate (with the lifetime checks), upload, launch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::alloc::GraphAllocation;
use crate::deferred;
use crate::device::Device;
use crate::error::{AllocationRef, Error, Result, UpdateRefusal, check, driver};
use crate::event::spare_event;
use crate::flags::flag_set;
use crate::graph::{Graph, Node};
use crate::handle::Handle;
use crate::host_memory::HostMemory;
use crate::keep::{KeepList, Kept};
use crate::module::{Function, KernelArgs, LaunchConfig};
use crate::node_kind::NodeKind;
use crate::record::{ALLOCATES, FREES, MemRole, Record, USES};
use crate::stream::{AsStream, Mark, StreamTail};
use crate::sys;

/// The launch, as [`Error::InDoubt`] names it.
const LAUNCH: &str = "ExecGraph::launch";

/// Instantiation flags (`CUgraphInstantiate_flags`), a bit-set:
/// `InstantiateFlags::AUTO_FREE_ON_LAUNCH | InstantiateFlags::UPLOAD`. The raw bits are a `u64`,
/// as `cuGraphInstantiateWithFlags` takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InstantiateFlags(u64);

impl InstantiateFlags {
    /// No flags.
    pub const NONE: InstantiateFlags = InstantiateFlags(0);
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: each launch first frees the
    /// allocations the previous launch left live (G.3.4).
    pub const AUTO_FREE_ON_LAUNCH: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: upload as part of instantiation, into the stream
    /// given to [`Graph::instantiate_and_upload`].
    pub const UPLOAD: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: launchable from the device.
    pub const DEVICE_LAUNCH: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH.0 as u64,
    );
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: honour per-node priorities.
    pub const USE_NODE_PRIORITY: InstantiateFlags = InstantiateFlags(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0 as u64,
    );
}

flag_set!(InstantiateFlags(u64) {
    AUTO_FREE_ON_LAUNCH,
    UPLOAD,
    DEVICE_LAUNCH,
    USE_NODE_PRIORITY,
});

/// The allocations an executable graph must track, by their role in its graph.
#[derive(Debug, Default)]
struct Roles {
    /// Allocated by the graph and not freed by it: live after a launch.
    unfreed: Vec<GraphAllocation>,
    /// Allocated elsewhere and freed by the graph.
    foreign_frees: Vec<GraphAllocation>,
    /// Allocated elsewhere and used, not freed, by the graph.
    foreign_uses: Vec<GraphAllocation>,
}

impl Roles {
    /// The roles the record gave its allocations as nodes named them.
    fn of(record: &Record) -> Roles {
        let mut roles = Roles::default();
        for (allocation, bits) in record.allocations_with_roles() {
            let list = match bits & (ALLOCATES | FREES) {
                ALLOCATES => &mut roles.unfreed,
                FREES => &mut roles.foreign_frees,
                0 if bits == USES => &mut roles.foreign_uses,
                _ => continue,
            };
            list.push(allocation.clone());
        }
        roles
    }
}

impl Graph {
    /// Checks the lifetime rules ([`crate::check`]) and instantiates (`cuGraphInstantiateWithFlags`).
    ///
    /// # Errors
    ///
    /// [`Error::Lifetime`] when the graph breaks a rule of [`crate::check`], as [`Graph::check`]
    /// reports it; before the driver is called, [`Error::StillLive`] naming `Graph::instantiate`
    /// and the allocation when an allocation of this graph is still live from an earlier launch,
    /// and [`Error::AlreadyInstantiated`] when the graph has memory nodes and an [`ExecGraph`] of
    /// it still exists (CUDA allows one);
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuGraphInstantiateWithFlags`
    /// (`cuGraphInstantiateWithParams` with [`InstantiateFlags::UPLOAD`]) when the driver refuses
    /// the graph.
    pub fn instantiate(&self, flags: InstantiateFlags) -> Result<ExecGraph> {
        self.check()?;
        self.instantiate_raw(flags, std::ptr::null_mut(), Roles::of(&self.record))
    }

    /// As [`instantiate`](Graph::instantiate), and uploads into `stream` as part of it
    /// (adds [`InstantiateFlags::UPLOAD`]).
    ///
    /// # Errors
    ///
    /// Those of [`instantiate`](Graph::instantiate), the driver's call being
    /// `cuGraphInstantiateWithParams`.
    pub fn instantiate_and_upload(
        &self,
        flags: InstantiateFlags,
        stream: &impl AsStream,
    ) -> Result<ExecGraph> {
        self.check()?;
        self.instantiate_raw(
            flags | InstantiateFlags::UPLOAD,
            stream.as_raw_stream(),
            Roles::of(&self.record),
        )
    }

    /// Instantiates without the lifetime checks: for those who measured that they need it.
    ///
    /// # Errors
    ///
    /// Those of [`instantiate`](Graph::instantiate) but [`Error::Lifetime`]: the rules are not
    /// checked.
    ///
    /// # Safety
    ///
    /// The graph obeys the rules [`crate::check`] states (every user of an allocation ordered
    /// after its alloc node and before its free node, one free per allocation), as
    /// [`Graph::check`] would confirm. A graph that breaks them reads or writes memory that
    /// another allocation owns, or that is not mapped, when it runs.
    pub unsafe fn instantiate_unchecked(&self, flags: InstantiateFlags) -> Result<ExecGraph> {
        self.instantiate_raw(flags, std::ptr::null_mut(), Roles::of(&self.record))
    }

    fn instantiate_raw(
        &self,
        flags: InstantiateFlags,
        upload: sys::CUstream,
        roles: Roles,
    ) -> Result<ExecGraph> {
        const CALL: &str = "Graph::instantiate";
        deferred::flush_if_queued();
        let memory_nodes = self.has_memory_nodes();
        if let Some(live) = roles.unfreed.iter().find(|a| a.is_live()) {
            // The alloc node's address is fixed for the life of the graph: a second executable
            // graph would map it again while the first mapping is still in use.
            return Err(Error::StillLive {
                call: CALL,
                allocation: live.describe(),
            });
        }
        if memory_nodes && self.instantiated.swap(true, Ordering::AcqRel) {
            return Err(Error::AlreadyInstantiated { call: CALL });
        }
        let release = |e| {
            if memory_nodes {
                self.instantiated.store(false, Ordering::Release);
            }
            e
        };
        self.device.bind().map_err(release)?;
        let mut raw = std::ptr::null_mut();
        if upload.is_null() && !flags.contains(InstantiateFlags::UPLOAD) {
            // The common path: WithFlags costs less than WithParams (`bench/README.md`,
            // "Measurements behind code choices").
            // SAFETY: out-pointer valid; the graph is live.
            driver!(unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, flags.bits()) })
                .map_err(release)?;
        } else {
            let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
                flags: flags.bits(),
                hUploadStream: upload,
                ..Default::default()
            };
            // SAFETY: out-pointers valid; the graph and the upload stream are live.
            driver!(unsafe { sys::cuGraphInstantiateWithParams(&mut raw, self.raw, &mut params) })
                .map_err(release)?;
        }
        let keep = self.share_keep();
        let Roles {
            unfreed,
            foreign_frees,
            foreign_uses,
        } = roles;
        let (locked, [unfreed_at, frees_at, uses_at]) =
            locked_order([&unfreed, &foreign_frees, &foreign_uses]);
        Ok(ExecGraph {
            graph_id: self.id,
            nodes: self.record.nodes.len(),
            host_memory: host_memory_in(&keep),
            keep: Some(keep),
            node_keeps: Vec::new(),
            in_doubt: std::cell::Cell::new(false),
            last_launch: std::cell::RefCell::new(None),
            unmarked_on: std::cell::RefCell::new(None),
            events: std::cell::RefCell::new(Vec::new()),
            unfreed_at,
            frees_at,
            uses_at,
            raw,
            device: self.device.clone(),
            flags,
            unfreed,
            foreign_frees,
            foreign_uses,
            locked,
            instantiated: memory_nodes.then(|| self.instantiated.clone()),
            _tracked: crate::live_objects::Tracked::new(crate::live_objects::Kind::ExecGraph),
        })
    }
}

/// Refuses a launch into a capture of this crate (the caller holds the gate): captured, the
/// launch would become a node of the captured graph, whose runs the executable graph's event
/// does not follow, and its drop would release what that node refers to.
fn refuse_capture(stream: &impl AsStream) -> Result<()> {
    if deferred::any_capture() && crate::stream::capture_id(stream.as_raw_stream())?.is_some() {
        return Err(Error::Capturing {
            call: "ExecGraph::launch",
            instead: "add the graph to the graph being built as a child graph node (Graph::add_child_graph_node)",
        });
    }
    Ok(())
}

/// The host-visible memory (pinned or managed) that the nodes of a graph whose list is `keep`
/// use (its memcpy, memset and kernel nodes', its captured calls', its child graphs' and
/// conditional bodies', all of which are in the list), once each, in address order (the order
/// launches lock them in).
fn host_memory_in(keep: &Kept) -> Vec<Arc<HostMemory>> {
    if !keep.may_hold_host_memory() {
        return Vec::new();
    }
    crate::host_memory::in_address_order(keep.of_type::<HostMemory>())
}

/// Every allocation of `lists`, once each, in id order (the order the launch path locks them
/// in, so that launches that share allocations do not deadlock), and for each list the
/// positions of its allocations in that order.
fn locked_order<const N: usize>(
    lists: [&[GraphAllocation]; N],
) -> (Vec<GraphAllocation>, [Vec<usize>; N]) {
    if lists.iter().all(|l| l.is_empty()) {
        // A graph whose allocations are all its own and freed in it: nothing to lock.
        return (Vec::new(), std::array::from_fn(|_| Vec::new()));
    }
    let mut locked: Vec<GraphAllocation> = lists.iter().flat_map(|l| l.iter()).cloned().collect();
    locked.sort_by_key(GraphAllocation::id);
    locked.dedup_by_key(|a| a.id());
    let at = lists.map(|list| {
        list.iter()
            .map(|a| {
                locked
                    .binary_search_by_key(&a.id(), GraphAllocation::id)
                    .unwrap_or_default()
            })
            .collect()
    });
    (locked, at)
}

/// An executable graph (`CUgraphExec`), destroyed on drop.
///
/// `Send` but not `Sync`: CUDA does not allow launching one executable graph from two threads
/// at once, so sharing one between threads takes a `Mutex`, which the compiler then requires.
pub struct ExecGraph {
    raw: sys::CUgraphExec,
    /// The id of the graph it was instantiated from: the graph whose nodes name its nodes.
    graph_id: u64,
    /// How many nodes that graph had at instantiation: nodes added since are not in this one.
    nodes: usize,
    device: Device,
    flags: InstantiateFlags,
    /// Allocated by this graph and not freed in it: live after a launch.
    unfreed: Vec<GraphAllocation>,
    /// Allocated elsewhere and freed by this graph.
    foreign_frees: Vec<GraphAllocation>,
    /// Allocated elsewhere, used (not freed) by this graph.
    foreign_uses: Vec<GraphAllocation>,
    /// The three lists above, each allocation once, in id order: the launch path locks them.
    locked: Vec<GraphAllocation>,
    /// For each allocation of `unfreed`, `foreign_frees` and `foreign_uses`, its position in
    /// `locked`.
    unfreed_at: Vec<usize>,
    frees_at: Vec<usize>,
    uses_at: Vec<usize>,
    /// The host-visible memory (pinned, managed) its nodes use, in address order: each launch
    /// is refused while the host holds a view of one ([`Error::InUseByHost`]), and its event is
    /// recorded in each, for views and frees to wait for.
    host_memory: Vec<Arc<HostMemory>>,
    /// Events of earlier launches, recorded again once no allocation holds them.
    events: std::cell::RefCell<Vec<Arc<crate::event::Event>>>,
    /// What the nodes refer to: the graph's list, shared with it (the ownership rule).
    keep: Option<Arc<Kept>>,
    /// What kernel nodes set with [`ExecGraph::set_kernel_node_params`] refer to, by node
    /// position: one entry a node, the latest setting (an earlier one is released after the
    /// launches queued before it).
    node_keeps: Vec<(usize, Arc<Kept>)>,
    /// A launch was queued whose end cannot be known (its event record failed and the stream
    /// could not be waited for): nothing it refers to is ever released.
    in_doubt: std::cell::Cell<bool>,
    /// An event recorded after a launch: the latest one, unless `unmarked_on` is set. Launches
    /// of one executable graph run one after another (`cuGraphLaunch`: each is ordered behind
    /// the previous launches of the graph), so once the latest launch has completed, no launch
    /// can use what `keep` holds.
    last_launch: std::cell::RefCell<Option<Arc<crate::event::Event>>>,
    /// The owned stream of the latest launch, when that launch is not marked yet: a launch of a
    /// graph that uses nothing outside itself (the fast path) records no event; the event is
    /// recorded on this stream when the launches' end matters (`release_after_last_launch`),
    /// or by the stream when it is destroyed first ([`StreamTail`]).
    unmarked_on: std::cell::RefCell<Option<Arc<StreamTail>>>,
    instantiated: Option<Arc<AtomicBool>>,
    _tracked: crate::live_objects::Tracked,
}

// SAFETY: an executable graph may be launched or destroyed from any thread, one at a time;
// `ExecGraph` is not `Sync`, so it is never used from two threads at once.
unsafe impl Send for ExecGraph {}

impl std::fmt::Debug for ExecGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecGraph")
            .field("flags", &self.flags)
            .field("unfreed", &self.unfreed)
            .field("foreign_frees", &self.foreign_frees)
            .finish()
    }
}

impl ExecGraph {
    /// Launches the graph on `stream` (`cuGraphLaunch`).
    ///
    /// Refused before the driver is called when a previous launch left allocations live and the
    /// graph was instantiated without AutoFreeOnLaunch ([`Error::UnfreedOnRelaunch`]), or when a
    /// free node of this graph names an allocation that is not live.
    ///
    /// # Errors
    ///
    /// [`Error::UnfreedOnRelaunch`] as above; [`Error::Capturing`] naming `ExecGraph::launch`,
    /// with nothing launched, when `stream` captures into a capture begun through this crate
    /// (add the graph as a child graph node instead); [`Error::NotLive`] naming
    /// `ExecGraph::launch` and the allocation when the graph frees or uses an allocation of
    /// another graph that is not live; [`Error::InUseByHost`] naming `ExecGraph::launch`, with
    /// nothing launched, while the host holds a view of a [`PinnedBuffer`](crate::PinnedBuffer)
    /// that a memcpy node of the graph copies to or from, or of a
    /// [`ManagedBuffer`](crate::ManagedBuffer) that a node of the graph uses; [`Error::InDoubt`] after a launch whose
    /// end could not be tracked;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamGetId`, `cuStreamWaitEvent`
    /// (ordering the launch after other streams' uses and frees) or `cuGraphLaunch`. After the
    /// launch, [`Error::Driver`] naming `cuEventCreate` or `cuEventRecord` when the launch cannot
    /// be marked for later uses and frees to wait for; the stream is then synchronized before the
    /// error is returned.
    #[inline]
    pub fn launch(&self, stream: &impl AsStream) -> Result<()> {
        if self.unfreed.is_empty()
            && self.foreign_frees.is_empty()
            && self.foreign_uses.is_empty()
            && self.host_memory.is_empty()
        {
            // Special streams (per-thread, legacy) need the context current.
            self.device.bind()?;
            // No capture of this crate begins on the stream between the check and the launch.
            let _gate = deferred::hold_gate();
            refuse_capture(stream)?;
            // A graph with memory nodes maps graph memory as it runs (see `uses`).
            let _order = self
                .instantiated
                .is_some()
                .then(crate::uses::hold_order_lock);
            if let Some(tail) = stream.tail() {
                // SAFETY: both handles are live.
                driver!(unsafe { sys::cuGraphLaunch(self.raw, stream.as_raw_stream()) })?;
                // Marked later, on this stream: see `unmarked_on`.
                let mut unmarked_on = self.unmarked_on.borrow_mut();
                if !unmarked_on.as_ref().is_some_and(|t| Arc::ptr_eq(t, tail)) {
                    *unmarked_on = Some(tail.clone());
                }
                return Ok(());
            }
            let mut last = self.last_launch.borrow_mut();
            // Made before the launch, so that a failure to make it leaves nothing queued.
            let event = spare_event(&self.device, &mut last)?;
            // SAFETY: both handles are live.
            let launched = driver!(unsafe { sys::cuGraphLaunch(self.raw, stream.as_raw_stream()) });
            let marked = launched.and_then(|()| event.record_bound(stream));
            // A failed launch or record leaves the event as it was: after the launch before,
            // or never recorded.
            if marked.is_ok() || last.is_none() {
                *last = Some(event);
            }
            if marked.is_ok() {
                // After this launch, so after every earlier one.
                *self.unmarked_on.borrow_mut() = None;
            }
            if let Err(e) = marked {
                self.after_unmarked(&mut [], stream);
                return Err(e);
            }
            return Ok(());
        }
        self.launch_with_allocations(stream)
    }

    /// The launch of a graph that allocates, frees or uses allocations outside itself, or copies
    /// to or from host-visible memory: checked, ordered and recorded under the allocations' and
    /// the host memories' locks, so that no free on another thread slips between the check
    /// and the launch, nor a host view of the memory.
    fn launch_with_allocations(&self, stream: &impl AsStream) -> Result<()> {
        let auto_free = self.flags.contains(InstantiateFlags::AUTO_FREE_ON_LAUNCH);
        if !auto_free {
            let live: Vec<AllocationRef> = self
                .unfreed
                .iter()
                .filter(|a| a.is_live())
                .map(GraphAllocation::describe)
                .collect();
            if !live.is_empty() {
                return Err(Error::UnfreedOnRelaunch { allocations: live });
            }
        }
        self.device.bind()?;
        let id = stream.stream_id()?;
        let raw = stream.as_raw_stream();
        // The gate before the allocations' locks, as everywhere (`free_async`,
        // `Function::launch`): `mark` drops events under those locks, and an event's release
        // takes the gate. Taken only then, it would wait behind a `Capture::begin` that waits
        // for a thread holding the gate and waiting for one of these locks: a deadlock.
        let _gate = deferred::hold_gate();
        refuse_capture(stream)?;
        // From the first wait to the event after the launch (see `uses`).
        let _order = crate::uses::hold_order_lock();
        let mut states: Vec<_> = self.locked.iter().map(|a| a.lock()).collect();
        let frees = self.foreign_frees.iter().zip(&self.frees_at);
        let uses = self.foreign_uses.iter().zip(&self.uses_at);
        for (a, &at) in frees.clone().chain(uses.clone()) {
            let state = &states[at];
            if !state.is_live() {
                return Err(Error::NotLive {
                    call: "ExecGraph::launch",
                    allocation: a.describe(),
                });
            }
        }
        // After the allocations' locks, as everywhere (`host_memory`).
        let mut hosts: Vec<_> = self.host_memory.iter().map(|m| m.lock()).collect();
        for host in &hosts {
            host.before_gpu_use(LAUNCH)?;
        }
        for &at in &self.uses_at {
            states[at].order_use(raw, id)?;
        }
        for &at in &self.frees_at {
            states[at].order_free(raw, id)?;
        }
        for &at in &self.unfreed_at {
            if states[at].is_live() {
                // With AutoFreeOnLaunch the launch first frees the previous launch's allocation.
                states[at].order_free(raw, id)?;
            } else {
                // The launch maps the fixed address again: after any free of it elsewhere.
                states[at].order_realloc(raw, id)?;
            }
        }
        // One event after the launch, shared by every allocation it made, used or freed; an
        // earlier one that no allocation holds any more is recorded again. Made before the
        // launch, so that a failure to make it leaves nothing queued.
        let mut pool = self.events.borrow_mut();
        let mut spare = pool
            .iter()
            .position(|e| Arc::strong_count(e) == 1)
            .map(|i| pool.swap_remove(i));
        let event = spare_event(&self.device, &mut spare)?;
        // SAFETY: both handles are live; every allocation the graph uses or frees outside
        // itself is live and ordered before this point of the stream.
        driver!(unsafe { sys::cuGraphLaunch(self.raw, raw) })?;
        if let Err(e) = event.record_bound(stream) {
            if self.after_unmarked(&mut states, stream) {
                // Done: what it allocated, used and freed is in a known state.
                self.mark(&mut states, id, None);
            } else {
                for host in &mut hosts {
                    host.doubt(LAUNCH);
                }
            }
            return Err(e);
        }
        if pool.len() < 4 {
            pool.push(event.clone());
        }
        *self.last_launch.borrow_mut() = Some(event.clone());
        *self.unmarked_on.borrow_mut() = None;
        self.mark(&mut states, id, Some(&event));
        for host in &mut hosts {
            host.used_by_launch(id, &event);
        }
        Ok(())
    }

    /// A launch is queued on `stream` but its event could not be recorded: waits for it
    /// (`true`: it is done). Where it cannot be waited for, the launch's end is unknown: the
    /// allocations' states (`states`) and what the nodes refer to are kept for the rest of the
    /// process ([`Error::InDoubt`]).
    fn after_unmarked(
        &self,
        states: &mut [std::sync::MutexGuard<'_, crate::alloc::LiveState>],
        stream: &impl AsStream,
    ) -> bool {
        if crate::uses::wait_unmarked(stream) {
            return true;
        }
        self.in_doubt.set(true);
        for state in states {
            state.doubt(LAUNCH);
        }
        false
    }

    /// Records a launch on the stream of id `id` in the allocations' states; `event` was
    /// recorded after it (`None`: the launch is complete).
    fn mark(
        &self,
        states: &mut [std::sync::MutexGuard<'_, crate::alloc::LiveState>],
        id: u64,
        event: Option<&Arc<crate::event::Event>>,
    ) {
        for &at in &self.frees_at {
            states[at].freed_on(id, event);
        }
        for &at in &self.unfreed_at {
            states[at].allocated_on(id, event);
        }
        if let Some(event) = event {
            for &at in &self.uses_at {
                states[at].used_by_launch(id, event);
            }
        }
    }

    /// Maps the graph's memory and uploads it into `stream` ahead of the launch
    /// (`cuGraphUpload`, G.5.1).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuGraphUpload`.
    pub fn upload(&self, stream: &impl AsStream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live.
        driver!(unsafe { sys::cuGraphUpload(self.raw, stream.as_raw_stream()) })
    }

    /// Updates it in place from `graph` (`cuGraphExecUpdate`): a graph of the same topology
    /// (as many nodes, of the same kinds, with the same edges, added in the same order) whose
    /// nodes' parameters differ: other kernel arguments, launch configurations or functions of
    /// the same module's context, other memset or memcpy operands. Cheaper than instantiating
    /// `graph`. The lifetime checks run on `graph` first. Launches queued before the update run
    /// with the parameters they were queued with: what the previous graph's nodes refer to is
    /// kept until they are done, and from now on what `graph`'s nodes refer to (the ownership
    /// rule of the crate docs' "Safety model"); `graph` itself may be dropped or changed
    /// afterwards.
    ///
    /// Graphs with memory nodes are refused, either side: an alloc node's address is fixed for
    /// the life of its graph (G.3.1), so another graph's nodes use addresses that this
    /// executable graph does not map. Update the kernel nodes of such a graph with
    /// [`set_kernel_node_params`](ExecGraph::set_kernel_node_params), or instantiate the new
    /// graph.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// # let device = Device::get(0)?;
    /// # let stream = Stream::new(&device)?;
    /// # let module = Module::from_ptx(&device, "")?;
    /// # let fill = module.function("fill_u32")?;
    /// let out = DeviceBuffer::<u32>::zeroed(&device, 256)?;
    /// let build = |value: u32| -> Result<Graph> {
    ///     let mut graph = Graph::new(&device)?;
    ///     let args = KernelArgs::new().ptr(&out).value(256u64).value(value);
    ///     // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over `out`.
    ///     unsafe { graph.add_kernel_node(&[], &fill, LaunchConfig::new((1, 1, 1), (256, 1, 1)), &args)? };
    ///     Ok(graph)
    /// };
    /// let mut exec = build(1)?.instantiate(InstantiateFlags::NONE)?;
    /// exec.launch(&stream)?;
    /// exec.update(&build(2)?)?; // the next launch fills with 2
    /// exec.launch(&stream)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// With the executable graph unchanged: [`Error::UpdateRefused`] with
    /// [`UpdateRefusal::OtherDevice`] or [`UpdateRefusal::MemoryNodes`] before the driver is
    /// called; [`Error::Lifetime`] when `graph` breaks a rule of [`crate::check`];
    /// [`Device::bind`]'s errors; [`Error::UpdateRefused`] with the driver's reason and the
    /// position of the node of `graph` it names when the driver refuses the update
    /// (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`); [`Error::Driver`] naming `cuGraphExecUpdate`
    /// for another error.
    pub fn update(&mut self, graph: &Graph) -> Result<()> {
        let refused = |reason| Error::UpdateRefused { reason, node: None };
        if graph.device.ordinal() != self.device.ordinal() {
            return Err(refused(UpdateRefusal::OtherDevice));
        }
        if self.instantiated.is_some() || graph.has_memory_nodes() {
            return Err(refused(UpdateRefusal::MemoryNodes));
        }
        // A record without allocations passes the checks whatever its shape: no node can use
        // or free one (`Graph::check`), so the pass over its nodes is skipped.
        let allocations = graph.record.allocation_count() != 0;
        if allocations {
            graph.check()?;
        }
        // Read before the driver's update, which walks its own structures, while the build
        // has just written the list.
        let keep = graph.share_keep();
        let host_memory = host_memory_in(&keep);
        self.device.bind()?;
        let mut info = sys::CUgraphExecUpdateResultInfo {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: std::ptr::null_mut(),
            errorFromNode: std::ptr::null_mut(),
        };
        // SAFETY: both handles are live; `info` is a valid out-pointer.
        let code = unsafe { sys::cuGraphExecUpdate_v2(self.raw, graph.raw, &mut info) };
        if code == sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
            let node = (!info.errorNode.is_null())
                .then(|| graph.nodes().iter().position(|n| n.raw == info.errorNode))
                .flatten();
            return Err(Error::UpdateRefused {
                reason: UpdateRefusal::from_raw(info.result),
                node,
            });
        }
        check(code, "cuGraphExecUpdate")?;
        // What the previous nodes refer to stays until the launches queued so far are done,
        // and so do the settings of single nodes, which the update replaced.
        let previous = self.keep.replace(keep);
        self.host_memory = host_memory;
        let settings = std::mem::take(&mut self.node_keeps);
        self.release_after_last_launch((previous, settings));
        // Without memory nodes on either side, only the other graphs' allocations it uses change
        // (those `Roles::of` puts in `foreign_uses`). `locked` holds the allocations of all three
        // lists: when it is empty and `graph` has none, nothing changes.
        if allocations || !self.locked.is_empty() {
            let foreign_uses: Vec<GraphAllocation> = graph
                .record
                .allocations_with_roles()
                .filter(|&(_, bits)| bits == USES)
                .map(|(allocation, _)| allocation.clone())
                .collect();
            let (locked, [uses_at]) = locked_order([&foreign_uses]);
            self.foreign_uses = foreign_uses;
            self.locked = locked;
            self.uses_at = uses_at;
        }
        Ok(())
    }

    /// Sets the function, launch configuration and arguments of one kernel node of this
    /// executable graph (`cuGraphExecKernelNodeSetParams`), for the launches from now on;
    /// `node` is a node of `graph`, the graph it was instantiated from (after an
    /// [`update`](ExecGraph::update) too). The graph itself is not changed. The new function and whatever `args` passes with
    /// [`KernelArgs::ptr`] are kept until the executable graph's last launch is done, and so is
    /// what the node referred to before.
    ///
    /// The node may use no graph allocation that its record in `graph` does not use, and, for
    /// an allocation of another graph, that the executable graph does not track now (after an
    /// update, those of the graph it was updated from): so the lifetime checks made before
    /// still hold and the launches stay ordered after the allocation's. A new allocation takes
    /// a new graph (and [`update`](ExecGraph::update), or an instantiation). Host memory (pinned or
    /// managed) that `args` passes is tracked from then on as the graph's own: launches record
    /// their use of it and are refused while a view of it is held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `cuGraphExecKernelNodeSetParams`, before the driver is
    /// called, when `graph` is not the graph this executable graph was made from, `node` is not
    /// one of its kernel nodes (or was added to it after the instantiation), or `args` passes a
    /// graph allocation the node did not use;
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuGraphExecKernelNodeSetParams`
    /// when the driver refuses the change (a function of another context, for one).
    ///
    /// # Safety
    ///
    /// As [`Graph::add_kernel_node`]: `args` matches the function's parameters, and every
    /// address passed as a plain value is valid whenever the node runs.
    pub unsafe fn set_kernel_node_params(
        &mut self,
        graph: &Graph,
        node: Node,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        const CALL: &str = "cuGraphExecKernelNodeSetParams";
        if graph.id != self.graph_id {
            return Err(Error::invalid(
                CALL,
                "the graph is not the one this executable graph was made from",
            ));
        }
        let index = graph.index_of(CALL, node)?;
        if index >= self.nodes {
            return Err(Error::invalid(
                CALL,
                format!(
                    "node {index} was added to the graph after this executable graph was made from it"
                ),
            ));
        }
        let record = &graph.nodes()[index];
        if !matches!(record.kind(), NodeKind::Kernel(_)) {
            return Err(Error::invalid(
                CALL,
                format!("node {} is not a kernel node", node.index()),
            ));
        }
        // Used by the node, and allocated in the graph (by an alloc node, or a moved child's)
        // or tracked as another graph's.
        let covered = |a: &GraphAllocation| {
            graph.record.key_of(a).is_some_and(|k| {
                record.keys(MemRole::Use).any(|u| u == k)
                    && (graph.record.roles(k) & ALLOCATES != 0
                        || self.foreign_uses.iter().any(|u| u.same(a)))
            })
        };
        if let Some(new) = args.graph_allocations().find(|a| !covered(a)) {
            return Err(Error::invalid(
                CALL,
                format!(
                    "{} is not among the allocations node {} uses and the executable graph tracks; the checks made before do not cover it",
                    new.describe(),
                    node.index()
                ),
            ));
        }
        self.device.bind()?;
        args.with_pointers(|params| {
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
            // SAFETY: the executable graph is live, `record.raw` is a node of the graph it was
            // made from (checked above) and that graph is alive (borrowed); the driver copies
            // the argument values during the call; the caller vouches for their types.
            driver!(unsafe {
                sys::cuGraphExecKernelNodeSetParams_v2(self.raw, record.raw, &node_params)
            })
        })?;
        // The node's previous setting stays until the launches queued so far are done; the
        // graph's list keeps what the node referred to at instantiation.
        let mut set = KeepList::default();
        function.keep_in(&mut set);
        args.keep_unrecorded_in(&mut set);
        let set = set.share();
        // Launches from now on record their use of the node's host memory and refuse to run
        // while a view of it is held, as for the host memory the graph's nodes use.
        let hosts = args.host_memories();
        if !hosts.is_empty() {
            let mut all = std::mem::take(&mut self.host_memory);
            all.extend(hosts.into_iter().cloned());
            self.host_memory = crate::host_memory::in_address_order(all);
        }
        match self.node_keeps.iter_mut().find(|(at, _)| *at == index) {
            Some((_, previous)) => {
                let previous = std::mem::replace(previous, set);
                self.release_after_last_launch(previous);
            }
            None => self.node_keeps.push((index, set)),
        }
        Ok(())
    }

    /// Lets go of `keep` once the launches queued so far are done (at once when there were
    /// none). After a launch whose end is unknown ([`Error::InDoubt`]), never: it is kept for
    /// the rest of the process, and the error recorded. An unmarked latest launch is marked now,
    /// or, while its stream captures, by the queued release once the capture has ended.
    fn release_after_last_launch<T: Send + 'static>(&self, keep: T) {
        if self.in_doubt.get() {
            self.device
                .record_drop_error(Error::InDoubt { queued_by: LAUNCH });
            std::mem::forget(keep);
            return;
        }
        let mut last_launch = self.last_launch.borrow_mut();
        let mut pending = self.unmarked_on.borrow_mut().take();
        if let Some(tail) = &pending {
            let mut spare = last_launch.take();
            match tail.mark(&mut spare) {
                Mark::Event(event) => *last_launch = Some(event),
                Mark::Done => {}
                Mark::NotNow => {
                    // Still unmarked, for this graph's later releases too.
                    *last_launch = spare;
                    *self.unmarked_on.borrow_mut() = pending.clone();
                }
                Mark::Unknown(e) => {
                    self.in_doubt.set(true);
                    self.device.record(Err(e));
                    std::mem::forget(keep);
                    return;
                }
            }
            if self.unmarked_on.borrow().is_none() {
                pending = None;
            }
        }
        let mut last = last_launch.clone();
        drop(last_launch);
        let mut keep = Some(keep);
        self.device.release_after(move |device| {
            if let Some(tail) = &pending {
                match tail.mark(&mut None) {
                    Mark::NotNow => return false,
                    Mark::Event(event) => last = Some(event),
                    Mark::Done => last = None,
                    Mark::Unknown(e) => {
                        device.record(Err(e));
                        std::mem::forget(keep.take());
                        return true;
                    }
                }
                pending = None;
            }
            if let Some(event) = &last {
                match event.is_complete_bound() {
                    Ok(false) => return false,
                    Ok(true) => {}
                    Err(e) => {
                        // Whether the launches are done cannot be told: kept for the rest of
                        // the process rather than freed under them.
                        device.record(Err(e));
                        std::mem::forget(keep.take());
                    }
                }
            }
            // `keep` goes with the job, dropped after the gate.
            true
        });
    }

    /// The id of the graph it was instantiated from ([`Graph::id`]), whose nodes name this
    /// executable graph's nodes, after updates too.
    #[must_use]
    pub fn graph_id(&self) -> u64 {
        self.graph_id
    }

    /// The flags it was instantiated with.
    #[must_use]
    pub fn flags(&self) -> InstantiateFlags {
        self.flags
    }

    /// The allocations this graph leaves live after a launch (not freed in the graph).
    #[must_use]
    pub fn unfreed_allocations(&self) -> &[GraphAllocation] {
        &self.unfreed
    }

    /// The raw handle.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUgraphExec {
        self.raw
    }
}

impl Handle for ExecGraph {
    type Raw = sys::CUgraphExec;

    fn as_raw(&self) -> sys::CUgraphExec {
        ExecGraph::as_raw(self)
    }
}

impl Drop for ExecGraph {
    /// Destroys the executable graph (the driver defers it while launches run); what the nodes
    /// refer to is let go once the event after the last launch has completed. Put off while a
    /// capture forbids it; until the launch is done the release waits in the queue, which the
    /// crate's release thread works through.
    fn drop(&mut self) {
        let raw = self.raw as usize;
        let instantiated = self.instantiated.take();
        self.device.release(move |device| {
            // SAFETY: owned and destroyed once; live allocations stay live (their handles free
            // them).
            let destroyed = driver!(unsafe { sys::cuGraphExecDestroy(raw as sys::CUgraphExec) });
            device.record(destroyed);
            if let Some(flag) = &instantiated {
                flag.store(false, Ordering::Release);
            }
            true
        });
        let keep = (
            std::mem::take(&mut self.keep),
            std::mem::take(&mut self.node_keeps),
        );
        self.release_after_last_launch(keep);
        deferred::flush_if_queued();
    }
}
