//! Graph allocations: memory that an alloc node of a graph provides, at an address fixed when the
//! node is added.
//!
//! An allocation freed in its own graph lives only inside each launch. One that is not (the
//! guide's G.3.3) stays live after the launch, and is an owned value: free it with
//! [`GraphAllocation::free_async`], with a free node in another graph, or by relaunching a graph
//! instantiated with AutoFreeOnLaunch. If nobody does, it is freed when the last handle that can
//! reach it drops (its own handles, the graph, the executable graph), on a private stream that
//! first waits for the last launch that allocated it and for every later stream launch that used
//! it; never while that work may still run, and never by a host synchronization that could
//! disturb a capture in progress.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::Device;
use crate::error::{Error, Result, check};
use crate::event::{Event, EventFlags};
use crate::memory::DeviceAddress;
use crate::stream::{AsStream, CaptureStatus};
use crate::sys;

/// Access a peer device gets to an allocation (`CUmemAccess_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    pub fn peer_access(mut self, peer: &Device, access: Access) -> AllocParams {
        self.peers.push((peer.clone(), access));
        self
    }

    /// A name for the allocation in errors and DOT output.
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
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: device_location(&self.device),
            ..Default::default()
        }
    }
}

/// Refuses sizes no allocation can have: 0 bytes, or more than the device's memory (CUDA would
/// accept the node and fail at upload or launch, keeping nearly the whole device reserved for
/// graphs until the process exits).
pub(crate) fn check_size(call: &'static str, device: &Device, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Err(Error::invalid(call, "an allocation of 0 bytes"));
    }
    let memory = device.memory_bytes()?;
    if bytes > memory {
        return Err(Error::invalid(
            call,
            format!(
                "an allocation of {} on a device of {}",
                crate::graph_mem::Bytes(bytes as u64),
                crate::graph_mem::Bytes(memory as u64)
            ),
        ));
    }
    Ok(())
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
    state: Mutex<LiveState>,
    /// The graphs that have a free node for it: usually one, kept without a lock (0: none)...
    free_graph: AtomicU64,
    /// ...and any others (freeing in two graphs is an error the lifetime checks report), with
    /// their count, so that the common case takes no lock.
    more_free_graphs: Mutex<Vec<u64>>,
    more_free_count: AtomicUsize,
    _tracked: crate::track::Tracked,
}

/// Run-time state: whether a launch made the allocation live, and what work may still use it.
#[derive(Default)]
struct LiveState {
    live: bool,
    /// Events recorded after the launch that allocated it and after stream work that used it.
    pending: Vec<(sys::CUstream, Event)>,
}

// SAFETY: the address is a plain integer; the state is behind a mutex; the events and streams
// are thread-safe driver handles.
unsafe impl Send for AllocInner {}
// SAFETY: as above.
unsafe impl Sync for AllocInner {}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

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
                state: Mutex::new(LiveState::default()),
                free_graph: AtomicU64::new(0),
                more_free_graphs: Mutex::new(Vec::new()),
                more_free_count: AtomicUsize::new(0),
                _tracked: crate::track::Tracked::new(crate::track::Kind::GraphAllocation),
            }),
        }
    }

    /// The address (fixed across instantiations and launches).
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.inner.ptr
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.inner.bytes
    }

    /// The resident device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// A process-unique number.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The label given in [`AllocParams::label`], if any.
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// The [`id`](crate::Graph::id) of the graph whose alloc node makes it.
    pub fn owner_graph(&self) -> u64 {
        self.inner.owner
    }

    /// Whether a launch left it allocated and nothing has freed it since.
    pub fn is_live(&self) -> bool {
        self.state().live
    }

    /// Whether two handles name the same allocation.
    pub fn same(&self, other: &GraphAllocation) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether a graph other than `graph` has a free node for it.
    pub(crate) fn freed_by_another_graph(&self, graph: u64) -> bool {
        let first = self.inner.free_graph.load(Ordering::Acquire);
        if first != 0 && first != graph {
            return true;
        }
        self.inner.more_free_count.load(Ordering::Acquire) > 0
            && self.more_free_graphs().iter().any(|&g| g != graph)
    }

    /// Graph `graph` has (`true`) or no longer has (`false`) a free node for it.
    pub(crate) fn register_free(&self, graph: u64, present: bool) {
        let first = &self.inner.free_graph;
        if present {
            // The common case: the first graph to free it, or the same one again.
            match first.compare_exchange(0, graph, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(current) if current == graph => return,
                Err(_) => {}
            }
            let mut more = self.more_free_graphs();
            if !more.contains(&graph) {
                more.push(graph);
            }
            self.inner
                .more_free_count
                .store(more.len(), Ordering::Release);
        } else {
            let _ = first.compare_exchange(graph, 0, Ordering::AcqRel, Ordering::Acquire);
            if self.inner.more_free_count.load(Ordering::Acquire) > 0 {
                let mut more = self.more_free_graphs();
                more.retain(|&g| g != graph);
                self.inner
                    .more_free_count
                    .store(more.len(), Ordering::Release);
            }
        }
    }

    fn more_free_graphs(&self) -> MutexGuard<'_, Vec<u64>> {
        self.inner
            .more_free_graphs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, LiveState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frees the allocation on `stream` after the work queued there (`cuMemFreeAsync`), as
    /// G.3.3 does. It must be live (allocated by a launch, not yet freed); the caller orders
    /// the free after every use on other streams (events), as CUDA requires.
    pub fn free_async(&self, stream: &impl AsStream) -> Result<()> {
        if stream.capture_status()? != CaptureStatus::None {
            return Err(Error::invalid(
                "GraphAllocation::free_async",
                format!(
                    "{self} would be freed inside a stream capture; use Capture::free_async so the captured graph records the free"
                ),
            ));
        }
        let mut state = self.state();
        if !state.live {
            return Err(Error::invalid(
                "GraphAllocation::free_async",
                format!("{self} is not live: no launch has allocated it, or it was already freed"),
            ));
        }
        stream.device().bind()?;
        check(
            // SAFETY: the address is a live graph allocation (checked above) on the stream's device.
            unsafe { sys::cuMemFreeAsync(self.inner.ptr, stream.as_raw_stream()) },
            "cuMemFreeAsync",
        )?;
        state.live = false;
        state.pending.clear();
        Ok(())
    }

    /// A launch allocated it; `event` completes after that launch.
    pub(crate) fn mark_allocated(&self, stream: sys::CUstream, event: &Event) {
        let mut state = self.state();
        state.live = true;
        state.pending.clear();
        state.pending.push((stream, event.clone()));
    }

    /// A launch of a graph that uses it (without owning or freeing it) was queued on `stream`;
    /// `event` completes after that launch. The RAII free must wait for it.
    pub(crate) fn note_launch_use(&self, stream: sys::CUstream, event: &Event) {
        let mut state = self.state();
        if !state.live {
            return;
        }
        state.pending.retain(|(s, _)| *s != stream);
        state.pending.push((stream, event.clone()));
    }

    /// A launch of a graph with a free node for it (or a captured free) freed it.
    pub(crate) fn mark_freed(&self) {
        let mut state = self.state();
        state.live = false;
        state.pending.clear();
    }

    /// Stream work that uses it was queued on `stream`: the RAII free must wait for it.
    pub(crate) fn note_stream_use(&self, stream: &impl AsStream) -> Result<()> {
        let mut state = self.state();
        if !state.live || stream.capture_status()? != CaptureStatus::None {
            return Ok(());
        }
        let raw = stream.as_raw_stream();
        if let Some((_, event)) = state.pending.iter().find(|(s, _)| *s == raw) {
            return event.record(stream);
        }
        let event = Event::with_flags(stream.device(), EventFlags::DISABLE_TIMING)?;
        event.record(stream)?;
        state.pending.push((raw, event));
        Ok(())
    }
}

impl Drop for AllocInner {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if !state.live {
            return;
        }
        // Nobody freed it: free it on the device's private stream, after every launch and
        // stream use we know of. Errors cannot be returned from drop; the device may be gone.
        let Ok(reaper) = self.device.reaper_stream() else {
            return;
        };
        for (_, event) in &state.pending {
            // SAFETY: both handles are live; the event was recorded outside any capture.
            let _ = unsafe { sys::cuStreamWaitEvent(reaper, event.as_raw(), 0) };
        }
        // SAFETY: the address is a live graph allocation; the reaper stream is never captured.
        let _ = unsafe { sys::cuMemFreeAsync(self.ptr, reaper) };
    }
}

impl DeviceAddress for GraphAllocation {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.inner.ptr
    }
    fn byte_len(&self) -> usize {
        self.inner.bytes
    }
    fn graph_allocation(&self) -> Option<&GraphAllocation> {
        Some(self)
    }
}

impl fmt::Display for GraphAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner.label {
            Some(label) => write!(f, "allocation '{label}'"),
            None => write!(
                f,
                "allocation #{} ({} at {:#x})",
                self.inner.id,
                crate::graph_mem::Bytes(self.inner.bytes as u64),
                self.inner.ptr
            ),
        }
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
