//! Graph allocations: memory that an alloc node of a graph provides, at an address fixed when the
//! node is added.
//!
//! An allocation freed in its own graph lives only inside each launch. One that is not (the
//! guide's G.3.3) stays live after the launch, and is an owned value: free it with
//! [`GraphAllocation::free_async`], with a free node in another graph, or by relaunching a graph
//! instantiated with AutoFreeOnLaunch. If nobody does, it is freed when the last handle that can
//! reach it drops (its own handles, the graph, the executable graphs, whose hold the driver
//! keeps until their launches are done), on a private stream that first waits for the launch
//! that allocated it and for every later use; never while that work may still run, and never
//! while a capture forbids it.
//!
//! # Order across streams
//!
//! Uses outside the owning graph are ordered by the crate, per real stream (see
//! [`crate::uses`]): stream work and graph launches that use a live allocation first wait for
//! the launch that allocated it when that ran on another stream; every free (`free_async`,
//! a free node of another graph, an AutoFreeOnLaunch relaunch, the RAII free) first waits for
//! every use the crate recorded. The state is locked across each of these operations, so a
//! free cannot slip between a use's check and its launch.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::deferred;
use crate::device::Device;
use crate::error::{AllocationRef, Error, Result, driver};
use crate::event::Event;
use crate::keep::Keep;
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;
use crate::uses::{StreamUses, wait};

/// Access a peer device gets to an allocation (`CUmemAccess_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Access {
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
    Read,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`; the only access alloc nodes support.
    ReadWrite,
}

impl Access {
    pub(crate) fn raw(self) -> sys::CUmemAccess_flags {
        match self {
            Access::Read => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            Access::ReadWrite => sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

/// What an alloc node allocates: size, resident device, and the peers that may access it
/// (G.7.1). Pinned device memory, as the guide's examples.
#[derive(Clone, Debug)]
pub struct AllocParams {
    pub(crate) bytes: usize,
    pub(crate) device: Device,
    pub(crate) peers: Vec<(Device, Access)>,
    pub(crate) label: Option<String>,
}

impl AllocParams {
    /// `bytes` of memory resident on `device`.
    #[must_use]
    pub fn new(device: &Device, bytes: usize) -> AllocParams {
        AllocParams {
            bytes,
            device: device.clone(),
            peers: Vec::new(),
            label: None,
        }
    }

    /// Also maps the allocation for `peer` (an entry of `accessDescs`). The resident device needs
    /// no entry.
    #[must_use = "returns the parameters with the change"]
    pub fn peer_access(mut self, peer: &Device, access: Access) -> AllocParams {
        self.peers.push((peer.clone(), access));
        self
    }

    /// A name for the allocation in errors and DOT output.
    #[must_use = "returns the parameters with the change"]
    pub fn label(mut self, label: impl Into<String>) -> AllocParams {
        self.label = Some(label.into());
        self
    }

    /// The access descriptors for the peers.
    pub(crate) fn access_descs(&self) -> Vec<sys::CUmemAccessDesc> {
        self.peers
            .iter()
            .map(|(peer, access)| sys::CUmemAccessDesc {
                location: device_location(peer),
                flags: access.raw(),
            })
            .collect()
    }

    /// The pool properties of the guide: pinned memory resident on the device.
    pub(crate) fn pool_props(&self) -> sys::CUmemPoolProps {
        sys::CUmemPoolProps {
            // Pinned only: driver 580 accepts an alloc node of allocation type managed, but
            // its memory is not managed memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED` is 0 after
            // the launch), so the crate offers none.
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: device_location(&self.device),
            ..Default::default()
        }
    }
}

/// Refuses sizes no allocation can have: 0 bytes, or the device's whole memory or more (CUDA
/// would accept the node and fail at upload or launch with `CUDA_ERROR_OUT_OF_MEMORY`). Sums
/// across allocations and graphs are not checked: what fits depends on what else is allocated
/// when a graph launches.
#[inline]
pub(crate) fn check_size(call: &'static str, device: &Device, bytes: usize) -> Result<()> {
    match device.memory_bytes() {
        Ok(memory) if bytes != 0 && bytes < memory => Ok(()),
        other => size_refused(call, bytes, other),
    }
}

/// [`check_size`]'s error: a size of 0 or of the device's memory (`memory`) or more, or the
/// error of reading the device's memory.
#[cold]
fn size_refused(call: &'static str, bytes: usize, memory: Result<usize>) -> Result<()> {
    if bytes == 0 {
        return Err(Error::invalid(call, "an allocation of 0 bytes"));
    }
    let memory = memory?;
    Err(Error::invalid(
        call,
        format!(
            "an allocation of {} on a device of {}",
            crate::bytes::Bytes(bytes as u64),
            crate::bytes::Bytes(memory as u64)
        ),
    ))
}

pub(crate) fn device_location(device: &Device) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device.ordinal() as i32,
    }
}

/// A handle to a graph allocation: address, size, owning graph. Cheap to clone; kernel
/// arguments, memset and memcpy nodes accept it, and record each use.
#[derive(Clone)]
pub struct GraphAllocation {
    inner: Arc<AllocInner>,
}

struct AllocInner {
    id: u64,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Device,
    /// The graph whose alloc node made it.
    owner: u64,
    label: Option<String>,
    /// The graphs that have a free node for it: usually one, kept without a lock (0: none)...
    free_graph: AtomicU64,
    /// ...and the count of the others, in [`Cold::more_free_graphs`], so that the common case
    /// takes no lock.
    more_free_count: AtomicUsize,
    /// Made at the first use of the run-time state (a launch, a free, stream work) or of a
    /// second graph that frees it. Out of line, the shared part of a handle stays small, and
    /// costs less to allocate and free: a graph that is built and dropped without being
    /// launched makes and frees one such part per alloc node, and none of these.
    cold: OnceLock<Box<Cold>>,
    _tracked: crate::live_objects::Tracked,
}

/// The parts of an allocation's shared state that a graph's build never touches.
#[derive(Default)]
struct Cold {
    state: Mutex<LiveState>,
    /// The graphs other than [`AllocInner::free_graph`] with a free node for it (freeing in two
    /// graphs is an error the lifetime checks report).
    more_free_graphs: Mutex<Vec<u64>>,
}

/// Run-time state: whether a launch made the allocation live, and what work may still use it.
#[derive(Default)]
pub(crate) struct LiveState {
    live: bool,
    /// Recorded after the launch that allocated it, on the stream of that id: the allocation's
    /// own event, re-recorded by each allocating launch.
    allocated: Option<(u64, Arc<Event>)>,
    /// The last use on each other stream.
    uses: StreamUses,
    /// Recorded after the last free outside the owning graph (`free_async`, another graph's
    /// free node), on the stream of that id: the owner's next launch, which maps the fixed
    /// address again, waits for it when it runs elsewhere.
    freed: Option<(u64, Arc<Event>)>,
}

// SAFETY: the address is a plain integer; the state is behind a mutex; the events and streams
// are thread-safe driver handles.
unsafe impl Send for AllocInner {}
// SAFETY: as above.
unsafe impl Sync for AllocInner {}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How many live allocations have a free node registered by more than their first freeing
/// graph (`more_free_count` above 0). While there are none, no graph that frees an allocation
/// shares it with another (a graph with a free node for an allocation is registered from the
/// node's addition until its drop), and the lifetime check reads no allocation's registry.
/// Changed under the allocation's `more_free_graphs` lock, so each allocation counts once.
static SHARED_FREES: AtomicUsize = AtomicUsize::new(0);

impl GraphAllocation {
    pub(crate) fn new(
        ptr: sys::CUdeviceptr,
        bytes: usize,
        device: &Device,
        owner: u64,
        label: Option<String>,
    ) -> GraphAllocation {
        GraphAllocation {
            inner: Arc::new(AllocInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                ptr,
                bytes,
                device: device.clone(),
                owner,
                label,
                free_graph: AtomicU64::new(0),
                more_free_count: AtomicUsize::new(0),
                cold: OnceLock::new(),
                _tracked: crate::live_objects::Tracked::new(
                    crate::live_objects::Kind::GraphAllocation,
                ),
            }),
        }
    }

    /// The address (fixed across instantiations and launches).
    #[must_use]
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.inner.ptr
    }

    /// The size in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.inner.bytes
    }

    /// The resident device.
    #[must_use]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// A process-unique number.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The allocation as errors name it ([`AllocationRef`]).
    #[must_use]
    pub fn describe(&self) -> AllocationRef {
        AllocationRef {
            id: self.inner.id,
            address: self.inner.ptr,
            bytes: self.inner.bytes,
            label: self.inner.label.clone(),
        }
    }

    /// The label given in [`AllocParams::label`], if any.
    #[must_use]
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// The [`id`](crate::Graph::id) of the graph whose alloc node makes it.
    #[must_use]
    pub fn owner_graph(&self) -> u64 {
        self.inner.owner
    }

    /// Whether a launch left it allocated and nothing has freed it since.
    #[must_use]
    pub fn is_live(&self) -> bool {
        // No state yet: nothing has made it live.
        let cold = self.inner.cold.get();
        cold.is_some_and(|c| c.state.lock().unwrap_or_else(|e| e.into_inner()).live)
    }

    /// Whether two handles name the same allocation.
    #[must_use]
    pub fn same(&self, other: &GraphAllocation) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether a graph other than `graph`, which has a free node for it, has one too.
    #[inline]
    pub(crate) fn freed_by_another_graph(&self, graph: u64) -> bool {
        if SHARED_FREES.load(Ordering::SeqCst) == 0 {
            // `graph` is registered, and alone: the first (a second would be counted).
            debug_assert_eq!(self.inner.free_graph.load(Ordering::Acquire), graph);
            return false;
        }
        self.registry_names_another(graph)
    }

    /// [`freed_by_another_graph`](GraphAllocation::freed_by_another_graph) from the registry.
    fn registry_names_another(&self, graph: u64) -> bool {
        let first = self.inner.free_graph.load(Ordering::Acquire);
        if first != 0 && first != graph {
            return true;
        }
        self.inner.more_free_count.load(Ordering::Acquire) > 0
            && self.more_free_graphs().iter().any(|&g| g != graph)
    }

    /// Graph `graph` has (`true`) or no longer has (`false`) a free node for it.
    #[inline]
    pub(crate) fn register_free(&self, graph: u64, present: bool) {
        let first = &self.inner.free_graph;
        if present {
            // The common case: the first graph to free it, or the same one again.
            match first.compare_exchange(0, graph, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {}
                Err(current) if current == graph => {}
                Err(_) => self.register_more_free(graph),
            }
        } else {
            let _ = first.compare_exchange(graph, 0, Ordering::AcqRel, Ordering::Acquire);
            if self.inner.more_free_count.load(Ordering::Acquire) > 0 {
                self.unregister_more_free(graph);
            }
        }
    }

    /// [`register_free`](GraphAllocation::register_free) of a second graph freeing it.
    #[cold]
    #[inline(never)]
    fn register_more_free(&self, graph: u64) {
        let mut more = self.more_free_graphs();
        if !more.contains(&graph) {
            more.push(graph);
        }
        self.set_more_free_count(more.len());
    }

    /// [`register_free`](GraphAllocation::register_free) of a graph that no longer frees it,
    /// while a second graph does or did.
    #[cold]
    #[inline(never)]
    fn unregister_more_free(&self, graph: u64) {
        let mut more = self.more_free_graphs();
        more.retain(|&g| g != graph);
        self.set_more_free_count(more.len());
    }

    /// Sets `more_free_count` (the caller holds the `more_free_graphs` lock), and counts the
    /// allocation in [`SHARED_FREES`] while it is above 0.
    fn set_more_free_count(&self, count: usize) {
        let before = self.inner.more_free_count.swap(count, Ordering::AcqRel);
        match (before, count) {
            (0, 1..) => {
                SHARED_FREES.fetch_add(1, Ordering::SeqCst);
            }
            (1.., 0) => {
                SHARED_FREES.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    fn cold(&self) -> &Cold {
        self.inner.cold.get_or_init(Box::default)
    }

    fn more_free_graphs(&self) -> MutexGuard<'_, Vec<u64>> {
        let more = &self.cold().more_free_graphs;
        more.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, LiveState> {
        self.cold().state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks the run-time state (for a launch that uses several allocations: lock them in
    /// [`id`](GraphAllocation::id) order).
    pub(crate) fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.state()
    }

    /// Frees the allocation on `stream` (`cuMemFreeAsync`), as G.3.3 does, after the work
    /// queued there and after every other use the crate knows of: the launch that allocated
    /// it and later uses on other streams (the stream waits for their events). It must be live
    /// (allocated by a launch, not yet freed).
    ///
    /// # Errors
    ///
    /// With nothing freed: [`Error::Capturing`] naming `GraphAllocation::free_async` when `stream`
    /// is capturing (free with [`Capture::free_async`](crate::Capture::free_async) instead);
    /// [`Error::NotLive`] naming it when the allocation is not live. [`Device::bind`]'s errors; [`Error::Driver`] naming
    /// `cuStreamIsCapturing`, `cuStreamGetId`, `cuStreamWaitEvent` (ordering the free after the
    /// uses) or `cuMemFreeAsync`. After the free, [`Error::Driver`] naming `cuEventCreate` or
    /// `cuEventRecord` when the free cannot be marked for the graph's next launch to wait for; the
    /// stream is then synchronized before the error is returned, and the allocation counts as
    /// freed.
    pub fn free_async(&self, stream: &impl AsStream) -> Result<()> {
        self.free_on("GraphAllocation::free_async", stream)
    }

    /// `free_async` on `stream`, its errors naming `call`.
    fn free_on(&self, call: &'static str, stream: &impl AsStream) -> Result<()> {
        // No capture of this crate begins between the check below and the free.
        let _gate = deferred::hold_gate();
        if stream.capture_status()? != CaptureStatus::None {
            return Err(Error::Capturing {
                call,
                instead: "use Capture::free_async, so that the captured graph records the free",
            });
        }
        let _order = crate::uses::hold_order_lock();
        let mut state = self.state();
        if !state.live {
            return Err(Error::NotLive {
                call,
                allocation: self.describe(),
            });
        }
        stream.device().bind()?;
        let id = stream.stream_id()?;
        state.order_free(stream.as_raw_stream(), id)?;
        // SAFETY: the address is a live graph allocation (checked above) on the stream's
        // device; every known use is ordered before this point of the stream.
        driver!(unsafe { sys::cuMemFreeAsync(self.inner.ptr, stream.as_raw_stream()) })?;
        state.forget();
        match crate::uses::recorded(&self.inner.device, stream, None) {
            Ok(event) => state.freed = Some((id, event)),
            Err(e) => {
                // The owner's next launch could not be ordered after this free: wait for it,
                // or, where that is impossible, never map the address again.
                state.freed = None;
                if !crate::uses::wait_unmarked(stream) {
                    state.doubt(call);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Frees it now, as `cudaFree` does for a graph allocation (G.3.3): on the device's private
    /// stream, after the launch that allocated it and every use the crate knows of, and returns
    /// once the memory is freed (the private stream is synchronized). It must be live.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let mut graph = Graph::new(&device)?;
    /// let (_, a) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, 1 << 20))?;
    /// let exec = graph.instantiate(InstantiateFlags::NONE)?;
    /// exec.launch(&Stream::new(&device)?)?;
    /// a.free()?; // waits for the launch, then frees
    /// assert!(!a.is_live());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// With nothing freed: [`Error::InHostFunction`] naming `GraphAllocation::free` in a host
    /// node's function; [`Error::Capturing`] naming it while a capture of this crate forbids the
    /// synchronize on this thread (a `Global` capture on any thread, a `ThreadLocal` one on this
    /// thread); [`Error::NotLive`] naming it when the allocation is not live; [`Device::bind`]'s
    /// errors; [`Error::Driver`] naming `cuStreamCreate` (the private stream, made once),
    /// `cuStreamWaitEvent` or `cuMemFreeAsync`. After the free is queued, [`Error::Driver`]
    /// naming `cuEventCreate`, `cuEventRecord` or `cuStreamSynchronize`: the allocation then
    /// counts as freed (it is no longer live), as the queued free will free it.
    pub fn free(&self) -> Result<()> {
        const CALL: &str = "GraphAllocation::free";
        if deferred::in_host_function() {
            return Err(Error::InHostFunction { call: CALL });
        }
        // Held from the check to the end of the synchronize: no capture of this crate begins
        // in between, inside which the synchronize would run.
        let _gate = deferred::hold_gate();
        if !deferred::release_allowed() {
            return Err(Error::Capturing {
                call: CALL,
                instead: "a capture of this crate forbids the synchronize here; free with free_async, or after the capture ends",
            });
        }
        let device = &self.inner.device;
        let raw = device.reaper_stream()?;
        // SAFETY: the device's private stream lives as long as the device, which `self` holds.
        let reaper = unsafe { crate::stream::BorrowedStream::from_raw(raw, device) };
        self.free_on(CALL, &reaper)?;
        reaper.synchronize()
    }

    /// Stream work that uses it is about to be queued on `stream` (outside a capture): refuses
    /// an allocation that is not live, and orders the stream after the launch that allocated
    /// it (errors name `call`). Call [`LiveState::used_on`] after queuing the work, under the
    /// same lock.
    pub(crate) fn before_stream_use(
        &self,
        call: &'static str,
        state: &LiveState,
        stream: &impl AsStream,
        id: u64,
    ) -> Result<()> {
        if !state.live {
            return Err(Error::NotLive {
                call,
                allocation: self.describe(),
            });
        }
        state.order_use(stream.as_raw_stream(), id)
    }

    /// A value that keeps the allocation's handle state alive (for graphs that refer to it).
    pub(crate) fn keep(&self) -> Keep {
        self.inner.clone() as Keep
    }
}

impl LiveState {
    /// Whether a launch allocated it and nothing freed it since.
    pub(crate) fn is_live(&self) -> bool {
        self.live
    }

    /// Work that `queued_by` queued on it can neither be marked nor waited for: it is kept,
    /// and no free, use or new mapping is ordered after that work ([`Error::InDoubt`]).
    pub(crate) fn doubt(&mut self, queued_by: &'static str) {
        self.uses.doubt(queued_by);
    }

    /// Makes `stream` (id `id`) wait for the launch that allocated it, when that ran elsewhere;
    /// [`Error::InDoubt`] when work on it could not be tracked.
    pub(crate) fn order_use(&self, stream: sys::CUstream, id: u64) -> Result<()> {
        self.uses.tracked()?;
        match &self.allocated {
            Some((s, event)) if *s != id => wait(stream, event),
            _ => Ok(()),
        }
    }

    /// Makes `stream` (id `id`) wait for every known use before it frees the allocation (or a
    /// relaunch with AutoFreeOnLaunch frees the previous one).
    pub(crate) fn order_free(&self, stream: sys::CUstream, id: u64) -> Result<()> {
        self.order_use(stream, id)?;
        self.uses.wait_on(stream, Some(id))
    }

    /// Work using it was queued on `stream`.
    pub(crate) fn used_on(
        &mut self,
        device: &Device,
        stream: &impl AsStream,
        id: u64,
    ) -> Result<()> {
        self.uses.note(device, stream, id)
    }

    /// A launch on the stream of id `id` allocated it; `event` was recorded after the launch
    /// (`None`: the launch is known to be complete).
    pub(crate) fn allocated_on(&mut self, id: u64, event: Option<&Arc<Event>>) {
        self.live = true;
        self.uses.clear();
        self.allocated = event.map(|e| (id, e.clone()));
    }

    /// A launch of a graph that frees it, on the stream of id `id`, was queued; `event` was
    /// recorded after it (`None`: the launch is known to be complete).
    pub(crate) fn freed_on(&mut self, id: u64, event: Option<&Arc<Event>>) {
        self.forget();
        self.freed = event.map(|e| (id, e.clone()));
    }

    /// Makes `stream` (id `id`), about to launch the owning graph again, wait for the last free
    /// outside it when that ran on another stream.
    pub(crate) fn order_realloc(&self, stream: sys::CUstream, id: u64) -> Result<()> {
        self.uses.tracked()?;
        match &self.freed {
            Some((s, event)) if *s != id => wait(stream, event),
            _ => Ok(()),
        }
    }

    /// A launch on the stream of id `id` used it; `event` was recorded after the launch.
    pub(crate) fn used_by_launch(&mut self, id: u64, event: &Arc<Event>) {
        self.uses.note_event(id, event);
    }

    /// It was freed (by a launch, a captured free, or `free_async`).
    pub(crate) fn forget(&mut self) {
        self.live = false;
        self.uses.clear();
    }
}

impl Drop for AllocInner {
    fn drop(&mut self) {
        if *self.more_free_count.get_mut() > 0 {
            SHARED_FREES.fetch_sub(1, Ordering::SeqCst);
        }
        let Some(cold) = self.cold.take() else {
            return;
        };
        let state = cold.state.into_inner().unwrap_or_else(|e| e.into_inner());
        if !state.live {
            return;
        }
        // Nobody freed it: free it on the device's private stream, after the launch that
        // allocated it and every use since; put off while a capture forbids it.
        let ptr = self.ptr;
        self.device.release(move |device| {
            let result = device.reaper_stream().and_then(|reaper| {
                let _order = crate::uses::hold_order_lock();
                if let Some((_, event)) = &state.allocated {
                    wait(reaper, event)?;
                }
                state.uses.wait_on(reaper, None)?;
                // SAFETY: the address is a live graph allocation, freed once, after every
                // known use; the reaper stream never captures.
                driver!(unsafe { sys::cuMemFreeAsync(ptr, reaper) })
            });
            if let Err(e) = result {
                device.record_drop_error(e);
            }
            true
        });
    }
}

impl fmt::Display for GraphAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.describe().fmt(f)
    }
}

impl fmt::Debug for GraphAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphAllocation")
            .field("id", &self.inner.id)
            .field("label", &self.inner.label)
            .field("ptr", &format_args!("{:#x}", self.inner.ptr))
            .field("bytes", &self.inner.bytes)
            .field("owner_graph", &self.inner.owner)
            .field("live", &self.is_live())
            .finish()
    }
}
