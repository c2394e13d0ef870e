//! Stream capture: a guard that always ends the capture (on `?`, on panic, on drop) and leaves
//! the stream usable; stream-ordered allocation that becomes alloc/free nodes (G.3.2, G.3.4);
//! fork and join of other streams through events.

use std::cell::{Cell, RefCell};

use crate::alloc::GraphAllocation;
use crate::deferred::{self, CapturedOutside, Restricts};
use crate::device::Device;
use crate::error::{Error, Result, check, driver};
use crate::event::{Event, EventFlags};
use crate::graph::{
    Graph, Listed, NodeKind, add_edges, next_graph_id, nodes_and_edges, read_graph,
};
use crate::inline_list::Few;
use crate::int_hash::IdMap;
use crate::keep::KeepList;
use crate::memory::{DeviceAddress, MemsetValue};
use crate::module::{Function, KernelArgs, LaunchConfig};
use crate::pinned::PinnedBuffer;
use crate::pool::MemPool;
use crate::record::{MemRole, Record};
use crate::stream::{
    AsStream, CaptureStatus, Stream, capture_id, capture_info, last_captured_node,
    raw_capture_status, wait_event_unnoted,
};
use crate::sys;
use crate::transfer::{check_host_memcpy, check_memcpy, check_memset};

/// How a capture reacts to capture-unsafe calls on other threads (`CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`: unsafe calls from any thread are errors.
    Global,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only from this thread.
    ThreadLocal,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`: not checked.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode as M;
        match self {
            CaptureMode::Global => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// A capture in progress on a stream. [`end`](Capture::end) returns the graph; dropping the
/// guard instead (an early `?`, a panic) ends the capture and discards the graph, so the stream
/// is never left capturing.
///
/// While it is open, the crate puts off releases that the capture forbids (in `Global` mode on
/// every thread, in `ThreadLocal` mode on this one: see [`flush_deferred`](crate::flush_deferred)).
/// A guard that is forgotten (`std::mem::forget`) leaves the stream capturing and those releases
/// put off; dropping the stream then ends the capture and records
/// [`Error::CaptureLeftOpen`] in [`Device::drop_errors`](crate::Device::drop_errors).
///
/// Each call records its node in the graph's record as it captures. On an owned [`Stream`]
/// the guard notes each node's dependencies itself, and the node's handle is found when the
/// capture ends, by the order in which the driver lists the nodes, which the node count and the
/// capturing stream's last dependencies confirm: no driver call per captured call. Work queued on such a
/// stream through its raw handle meanwhile makes nodes the crate did not capture, and the
/// capture ends with [`Error::CaptureNotMatched`]. On a [`BorrowedStream`](crate::BorrowedStream)
/// (`stream.borrow()` for an owned one), and from the [`fork`](Capture::fork) of one on, each
/// call asks the driver for its node (`cuStreamGetCaptureInfo`), and other code may add nodes:
/// they are read from the driver (the crate docs' "Safety model").
#[must_use = "dropping the guard ends the capture and discards the graph; call `end`"]
pub struct Capture<'s, S: AsStream> {
    stream: &'s S,
    id: u64,
    /// The driver's id of this capture: streams forked into it report the same.
    capture_id: u64,
    /// What the nodes this guard's calls captured refer to, kept alive with the graph.
    keep: RefCell<KeepList>,
    /// What this guard's calls captured, in order, as the graph's record: each node with what
    /// it does to allocations, and its handle as the stream's capture reported it once calls
    /// ask for it ([`each_call`](Capture::each_call)); null until then, and null for a call
    /// whose node the stream did not report. Edges are read from the driver at the end.
    record: RefCell<Record>,
    /// While calls do not ask for their nodes: the stream of each node of `record`, whose
    /// consecutive calls must be joined by edges when the nodes are matched by their order.
    streams: RefCell<Vec<sys::CUstream>>,
    /// While calls do not ask for their nodes: for each stream of the capture, the positions of
    /// the nodes its next operation depends on, as the guard's calls, forks and joins made
    /// them (an operation captured on a stream depends on what the stream's dependencies were,
    /// and becomes them; a wait for an event adds the event's). `None` once a call met a stream
    /// the guard did not fork in: the edges are then read from the driver.
    heads: RefCell<Option<Heads>>,
    /// Whether each call asks the driver for its node (`cuStreamGetCaptureInfo`), rather than
    /// leaving the nodes to be told apart by their order when the capture ends.
    each_call: Cell<bool>,
    /// Whether a call that asked for its node captured work but could not tell its node (the
    /// query failed, or the stream reported none) while that node uses graph allocations:
    /// those uses cannot be recorded, so the capture's end destroys the graph
    /// ([`Error::CaptureNodeUnknown`]).
    node_unknown: Cell<bool>,
    /// Events of forks and joins, alive until the capture ends.
    events: RefCell<Vec<Event>>,
    ended: bool,
}

impl<S: AsStream> std::fmt::Debug for Capture<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").field("graph", &self.id).finish()
    }
}

impl<'s> Capture<'s, Stream> {
    /// Begins capturing `stream` (`cuStreamBeginCapture`). A stream that already captures
    /// (its own capture, or another's it was forked into) is refused before the driver is
    /// called: a second `cuStreamBeginCapture` fails and can disturb the capture in progress.
    ///
    /// A guard of its own only for an owned [`Stream`]: if the guard is forgotten, the stream's
    /// drop ends the capture. Other streams capture through [`capture`], whose closure cannot
    /// lose the guard.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Capturing`] naming `cuStreamBeginCapture` when the
    /// stream already captures (before the driver is called); [`Error::InvalidArgument`] naming it
    /// when called from a `Drop` that the crate runs in a release (before the driver is called),
    /// or when the stream does not report the capture just begun (which is then ended); [`Error::Driver`] naming `cuStreamIsCapturing`,
    /// `cuStreamBeginCapture` or `cuStreamGetCaptureInfo`.
    pub fn begin(stream: &'s Stream, mode: CaptureMode) -> Result<Capture<'s, Stream>> {
        Capture::begin_on(stream, mode)
    }
}

impl<'s, S: AsStream> Capture<'s, S> {
    /// [`Capture::begin`] on any stream.
    fn begin_on(stream: &'s S, mode: CaptureMode) -> Result<Capture<'s, S>> {
        stream.device().bind()?;
        if deferred::gate_held() {
            // A `Drop` that the crate runs in a release (a host closure's captured value, say):
            // the exclusive hold below would wait for this thread's own shared one.
            return Err(Error::invalid(
                "cuStreamBeginCapture",
                "called from a value's Drop that the crate runs while it releases memory or other objects; a capture cannot begin there",
            ));
        }
        // Exclusive until the capture is registered: no release checked before it runs inside
        // it, and no free checked "not capturing" on this stream is captured.
        let _gate = deferred::exclusive_gate();
        // The stream's context was made current above.
        if raw_capture_status(stream.as_raw_stream())? != CaptureStatus::None {
            return Err(Error::Capturing {
                call: "cuStreamBeginCapture",
                instead: "it is already capturing: end that capture first",
            });
        }
        // SAFETY: the stream is live.
        driver!(unsafe { sys::cuStreamBeginCapture(stream.as_raw_stream(), mode.raw()) })?;
        let capture_id = match capture_id(stream.as_raw_stream()) {
            Ok(Some(id)) => id,
            other => {
                let mut graph = std::ptr::null_mut();
                // SAFETY: ends the capture just begun; its graph, if any, is ours to destroy.
                unsafe {
                    let _ = sys::cuStreamEndCapture(stream.as_raw_stream(), &mut graph);
                    if !graph.is_null() {
                        let _ = sys::cuGraphDestroy(graph);
                    }
                }
                other?;
                return Err(Error::invalid(
                    "cuStreamBeginCapture",
                    "the stream does not report the capture just begun",
                ));
            }
        };
        let thread = std::thread::current().id();
        let restricts = match mode {
            CaptureMode::Global => Restricts::AllThreads,
            CaptureMode::ThreadLocal => Restricts::Thread(thread),
            CaptureMode::Relaxed => Restricts::Nothing,
        };
        let id = next_graph_id();
        deferred::capture_began(stream.as_raw_stream() as usize, capture_id, restricts);
        Ok(Capture {
            stream,
            capture_id,
            keep: RefCell::default(),
            id,
            record: RefCell::new(Record::of_graph(id)),
            streams: RefCell::new(SPARE_STREAMS.try_with(Cell::take).unwrap_or_default()),
            heads: RefCell::new(Some(Few::One((stream.as_raw_stream(), Few::Empty)))),
            // Only the crate queues work on an owned stream (its raw handle aside: see
            // `Capture`); other code may queue work on a borrowed one.
            each_call: Cell::new(stream.tail().is_none()),
            node_unknown: Cell::new(false),
            events: RefCell::new(Vec::new()),
            ended: false,
        })
    }

    /// The stream being captured.
    #[must_use]
    pub fn stream(&self) -> &'s S {
        self.stream
    }

    /// The capture status (`cuStreamIsCapturing`): `Invalidated` after an illegal call.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuStreamIsCapturing`.
    pub fn status(&self) -> Result<CaptureStatus> {
        self.stream.capture_status()
    }

    fn device(&self) -> &Device {
        self.stream.device()
    }

    /// `cuMemAllocAsync` on the capturing stream: becomes an alloc node of the captured graph and
    /// returns its allocation, usable by later captured work.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `cuMemAllocAsync`, before any driver call, for 0 bytes or a size
    /// of the device's whole memory or more. CUDA accepts a 0-byte allocation under stream
    /// capture (an alloc node of 0 bytes) and refuses it for an explicit node; this crate refuses
    /// both, so that every allocation it hands out has an address that is its own. A size the
    /// device cannot hold would be accepted by CUDA and fail only at the launch or upload. Sums
    /// of allocations are not checked: what fits depends on what else is allocated then.
    ///
    /// [`Error::Driver`] naming `cuDeviceTotalMem` (read once per device, for the size check),
    /// `cuMemAllocAsync` or `cuStreamGetCaptureInfo`.
    pub fn malloc_async(&self, bytes: usize) -> Result<GraphAllocation> {
        self.allocate("cuMemAllocAsync", bytes, |ptr| {
            // SAFETY: out-pointer valid; the stream is capturing.
            unsafe { sys::cuMemAllocAsync(ptr, bytes, self.stream.as_raw_stream()) }
        })
    }

    /// `cuMemAllocFromPoolAsync`: as [`malloc_async`](Capture::malloc_async), from `pool`, whose
    /// peer access at this moment is what the alloc node records (G.7.2).
    ///
    /// # Errors
    ///
    /// As [`malloc_async`](Capture::malloc_async)'s, naming `cuMemAllocFromPoolAsync`.
    pub fn malloc_from_pool_async(&self, pool: &MemPool, bytes: usize) -> Result<GraphAllocation> {
        self.allocate("cuMemAllocFromPoolAsync", bytes, |ptr| {
            // SAFETY: out-pointer valid; the pool and the stream are live.
            unsafe {
                sys::cuMemAllocFromPoolAsync(ptr, bytes, pool.as_raw(), self.stream.as_raw_stream())
            }
        })
    }

    fn allocate(
        &self,
        call: &'static str,
        bytes: usize,
        f: impl FnOnce(*mut sys::CUdeviceptr) -> sys::CUresult,
    ) -> Result<GraphAllocation> {
        crate::alloc::check_size(call, self.device(), bytes)?;
        let mut ptr = 0;
        check(f(&mut ptr), call)?;
        // Held by the record, as an alloc node's allocation is (`Graph::add_mem_alloc_node`).
        let allocation = GraphAllocation::new(ptr, bytes, self.device(), self.id, None);
        let Placed { node, slot, deps } = self.node_of(self.stream)?;
        let position = (self.record.borrow_mut()).push_alloc(node, deps, allocation.clone());
        self.placed(slot, position);
        Ok(allocation)
    }

    /// `cuMemFreeAsync` on the capturing stream: becomes a free node, ordered after the captured
    /// work before it. `allocation` may come from this capture or from another graph (G.3.3).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuMemFreeAsync` when the driver refuses the free (an address that
    /// is not a graph allocation, for one) or `cuStreamGetCaptureInfo`. Freeing an allocation twice
    /// is not refused here: the lifetime checks report it when the graph is checked or
    /// instantiated.
    pub fn free_async(&self, allocation: &GraphAllocation) -> Result<()> {
        self.free_captured(self.stream, allocation)
    }

    /// `cuMemFreeAsync` on `stream`, another stream that joined the capture through
    /// [`fork`](Capture::fork): becomes a free node ordered after the work captured on `stream`
    /// before it (the guide's `cudaFreeAsync(d, stream2)` inside a capture). Refused, with
    /// nothing freed, when `stream` is not capturing into this capture: the free would run now,
    /// on an address that exists only in the graph.
    ///
    /// # Errors
    ///
    /// [`Error::NotInCapture`] naming `Capture::free_async_on`, with nothing freed, when `stream`
    /// is not capturing into this capture; otherwise those of
    /// [`free_async`](Capture::free_async), and [`Error::Driver`] naming `cuStreamGetCaptureInfo`
    /// for the membership check.
    ///
    /// ```no_run
    /// # use cuda_graph::*;
    /// # fn main() -> Result<()> {
    /// let device = Device::get(0)?;
    /// let (s1, s2) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let graph = capture(&s1, CaptureMode::Global, |cap| {
    ///     let a = cap.malloc_async(1 << 20)?;
    ///     cap.fork(&s2)?; // s2 joins the capture after the allocation
    ///     cap.free_async_on(&s2, &a)?;
    ///     cap.join(&s2)
    /// })?
    /// .0;
    /// assert_eq!(graph.nodes().len(), 2); // the alloc node and the free node
    /// # Ok(())
    /// # }
    /// ```
    pub fn free_async_on(
        &self,
        stream: &impl AsStream,
        allocation: &GraphAllocation,
    ) -> Result<()> {
        self.check_member("Capture::free_async_on", stream)?;
        self.free_captured(stream, allocation)
    }

    fn free_captured(&self, stream: &impl AsStream, allocation: &GraphAllocation) -> Result<()> {
        // SAFETY: the stream captures into this capture; the driver validates the address.
        driver!(unsafe { sys::cuMemFreeAsync(allocation.ptr(), stream.as_raw_stream()) })?;
        let at = self.node_of(stream)?;
        let free = (NodeKind::MemFree, MemRole::Free);
        self.record_uses(at, free, std::iter::once(allocation));
        Ok(())
    }

    /// Launches a kernel into the capture (`cuLaunchKernel`), recording which graph allocations
    /// the captured node uses.
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuLaunchKernel` when the driver refuses
    /// the launch (a configuration the kernel cannot run with, for one), or
    /// `cuStreamGetCaptureInfo`.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`].
    pub unsafe fn launch(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        // SAFETY: the caller upholds the launch contract; the capturing stream is a member.
        unsafe { self.launch_captured(self.stream, function, config, args) }
    }

    /// Launches a kernel on `stream`, another stream that joined the capture through
    /// [`fork`](Capture::fork). Refused, with nothing launched, when `stream` is not capturing
    /// into this capture: the kernel would run now, on addresses that exist only in the graph.
    ///
    /// # Errors
    ///
    /// [`Error::NotInCapture`] naming `Capture::launch_on`, with nothing launched, when `stream`
    /// is not capturing into this capture; otherwise those of [`launch`](Capture::launch).
    ///
    /// # Safety
    ///
    /// As [`Function::launch`]: `args` matches the kernel's parameters, and every address
    /// passed as a plain value is valid whenever the captured graph's node runs (memory passed
    /// with [`KernelArgs::ptr`] is kept alive by the graph).
    pub unsafe fn launch_on(
        &self,
        stream: &impl AsStream,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        self.check_member("Capture::launch_on", stream)?;
        // SAFETY: the caller upholds the launch contract; the stream is a member (checked).
        unsafe { self.launch_captured(stream, function, config, args) }
    }

    /// Captures a launch on `stream` and records it.
    ///
    /// # Safety
    ///
    /// As [`launch_on`](Capture::launch_on), and `stream` captures into this capture.
    unsafe fn launch_captured(
        &self,
        stream: &impl AsStream,
        function: &Function,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        function.device().bind()?;
        // SAFETY: the caller upholds the launch contract; the stream captures, so the launch
        // becomes a node that the graph orders and keeps alive.
        unsafe { function.launch_raw(stream, config, args) }?;
        {
            let mut keep = self.keep.borrow_mut();
            function.keep_in(&mut keep);
            args.keep_unrecorded_in(&mut keep);
        }
        let at = self.node_of(stream)?;
        let kernel = (NodeKind::Kernel(function.shared_name()), MemRole::Use);
        self.record_uses(at, kernel, args.graph_allocations());
        Ok(())
    }

    /// `cuMemsetD8Async`, `cuMemsetD16Async` or `cuMemsetD32Async` (by `T`) of the first `count`
    /// elements of `target`, on the capturing stream: becomes a memset node of the captured
    /// graph, which keeps `target` alive; writing a graph allocation is a use the lifetime checks
    /// see.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Capture::memset_async`, before the driver, when `count`
    /// is 0 or the elements do not fit `target`; [`Device::bind`]'s errors; [`Error::Driver`]
    /// naming the memset call or `cuStreamGetCaptureInfo`.
    pub fn memset_async<T: MemsetValue>(
        &self,
        target: &impl DeviceAddress,
        value: T,
        count: usize,
    ) -> Result<()> {
        const CALL: &str = "Capture::memset_async";
        check_memset(CALL, target, count, std::mem::size_of::<T>())?;
        let operands = KernelArgs::new().ptr(target);
        self.captured_use(NodeKind::Memset, &operands, || {
            // SAFETY: `count` elements fit `target` (checked); the stream captures, so the
            // memset becomes a node of the graph, which keeps `target` alive.
            unsafe {
                T::memset_async(
                    target.device_ptr(),
                    value,
                    count,
                    self.stream.as_raw_stream(),
                )
            }
        })
    }

    /// `cuMemcpyAsync` of `bytes` from `src` to `dst`, both device memory, on the capturing
    /// stream: becomes a memcpy node of the captured graph, which keeps both alive; reading or
    /// writing a graph allocation is a use the lifetime checks see.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Capture::memcpy_async`, before the driver, when `bytes`
    /// is 0, does not fit `dst` or `src`, or the ranges overlap; [`Device::bind`]'s errors;
    /// [`Error::Driver`] naming `cuMemcpyAsync` or `cuStreamGetCaptureInfo`.
    pub fn memcpy_async(
        &self,
        dst: &impl DeviceAddress,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "Capture::memcpy_async";
        check_memcpy(CALL, dst, src, bytes)?;
        let operands = KernelArgs::new().ptr(dst).ptr(src);
        self.captured_use(NodeKind::Memcpy, &operands, || {
            // SAFETY: `bytes` fit both ranges, which do not overlap (checked); the stream
            // captures, so the copy becomes a node of the graph, which keeps both alive.
            driver!(unsafe {
                sys::cuMemcpyAsync(
                    dst.device_ptr(),
                    src.device_ptr(),
                    bytes,
                    self.stream.as_raw_stream(),
                )
            })
        })
    }

    /// `cuMemcpyHtoDAsync` of the first `bytes` of the pinned buffer `src` to device memory
    /// `dst`, on the capturing stream: becomes a memcpy node of the captured graph, which keeps
    /// both alive (and reads `src` at each launch as it is then: write it between launches
    /// through [`PinnedBuffer::as_mut_slice`](crate::PinnedBuffer::as_mut_slice)); writing a
    /// graph allocation is a use the lifetime checks see. Pageable host memory is not offered:
    /// the node reads its source at every launch.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming `Capture::memcpy_htod_async`, before the driver, when
    /// `bytes` is 0 or does not fit `dst` or `src`; [`Device::bind`]'s errors;
    /// [`Error::Driver`] naming `cuMemcpyHtoDAsync` or `cuStreamGetCaptureInfo`.
    pub fn memcpy_htod_async<T: bytemuck::Pod>(
        &self,
        dst: &impl DeviceAddress,
        src: &PinnedBuffer<T>,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "Capture::memcpy_htod_async";
        check_host_memcpy(CALL, dst, src.byte_len(), bytes)?;
        // Kept before the copy is captured: a node that exists keeps its source, whatever fails
        // after it.
        self.keep.borrow_mut().push_host(src.keep());
        let operands = KernelArgs::new().ptr(dst);
        self.captured_use(NodeKind::Memcpy, &operands, || {
            // SAFETY: `bytes` fit both (checked); the stream captures, so the copy becomes a
            // node of the graph, which keeps both alive.
            driver!(unsafe {
                sys::cuMemcpyHtoDAsync(
                    dst.device_ptr(),
                    src.memory().ptr().cast_const(),
                    bytes,
                    self.stream.as_raw_stream(),
                )
            })
        })
    }

    /// `cuMemcpyDtoHAsync` of the first `bytes` of device memory `src` into the pinned buffer
    /// `dst`, on the capturing stream: becomes a memcpy node of the captured graph, kept and
    /// recorded as in [`memcpy_htod_async`](Capture::memcpy_htod_async); read the result after a
    /// launch through [`PinnedBuffer::as_slice`](crate::PinnedBuffer::as_slice), which waits for
    /// it.
    ///
    /// # Errors
    ///
    /// As [`memcpy_htod_async`](Capture::memcpy_htod_async)'s, naming
    /// `Capture::memcpy_dtoh_async` and `cuMemcpyDtoHAsync`.
    pub fn memcpy_dtoh_async<T: bytemuck::Pod>(
        &self,
        dst: &PinnedBuffer<T>,
        src: &impl DeviceAddress,
        bytes: usize,
    ) -> Result<()> {
        const CALL: &str = "Capture::memcpy_dtoh_async";
        check_host_memcpy(CALL, src, dst.byte_len(), bytes)?;
        self.keep.borrow_mut().push_host(dst.keep());
        let operands = KernelArgs::new().ptr(src);
        self.captured_use(NodeKind::Memcpy, &operands, || {
            // SAFETY: as in `memcpy_htod_async`, with the pinned memory written.
            driver!(unsafe {
                sys::cuMemcpyDtoHAsync(
                    dst.memory().ptr(),
                    src.device_ptr(),
                    bytes,
                    self.stream.as_raw_stream(),
                )
            })
        })
    }

    /// Runs `op`, captured on the capturing stream as a node of `kind` whose device memory
    /// operands are `operands`: keeps them alive with the graph and records their uses of graph
    /// allocations on the node.
    fn captured_use(
        &self,
        kind: NodeKind,
        operands: &KernelArgs<'_>,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.device().bind()?;
        op()?;
        operands.keep_unrecorded_in(&mut self.keep.borrow_mut());
        let at = self.node_of(self.stream)?;
        self.record_uses(at, (kind, MemRole::Use), operands.graph_allocations());
        Ok(())
    }

    /// Forks `other` from the capturing stream: records an event here and makes `other` wait on
    /// it, so `other` joins the capture (G.3.2). Join it back with [`join`](Capture::join).
    ///
    /// # Errors
    ///
    /// [`Device::bind`]'s errors; [`Error::Driver`] naming `cuEventCreate`, `cuEventRecord` or
    /// `cuStreamWaitEvent`.
    pub fn fork(&self, other: &impl AsStream) -> Result<()> {
        if other.tail().is_none() {
            // Other code may queue work on a borrowed stream.
            self.ask_each_call("Capture::fork")?;
        }
        let event = Event::with_flags(self.device(), EventFlags::DISABLE_TIMING)?;
        event.record(self.stream)?;
        wait_event_unnoted(other, &event)?;
        self.events.borrow_mut().push(event);
        // `other` now depends on what this stream depends on, and on its own work before.
        self.merge_heads(other.as_raw_stream(), self.stream.as_raw_stream());
        Ok(())
    }

    /// In the dependency heads: `into` waited for what `from` depends on.
    fn merge_heads(&self, into: sys::CUstream, from: sys::CUstream) {
        let mut heads = self.heads.borrow_mut();
        let Some(list) = heads.as_mut() else { return };
        let Some(added) = list
            .iter()
            .find(|(s, _)| *s == from)
            .map(|(_, h)| h.clone())
        else {
            // A stream the guard did not fork in: its dependencies are not known.
            *heads = None;
            return;
        };
        match list.iter_mut().find(|(s, _)| *s == into) {
            Some((_, into)) => {
                for d in added.iter() {
                    if !into.contains(d) {
                        into.push(*d);
                    }
                }
            }
            None => list.push((into, added)),
        }
    }

    /// Where the call just captured on `stream` goes in the record: its node, once each call
    /// asks the driver for it (null when the stream does not report one), else null, the
    /// stream noted; and, while the guard knows them, the positions it depends on.
    #[inline(always)]
    fn node_of(&self, stream: &impl AsStream) -> Result<Placed> {
        let raw = stream.as_raw_stream();
        if self.each_call.get() {
            // The work is captured already: if its node cannot be told, the capture must not
            // end with a graph (its record may lack the node's uses).
            let node = last_captured_node(raw).inspect_err(|_| self.node_unknown.set(true))?;
            let node = node.unwrap_or(std::ptr::null_mut());
            return Ok(Placed {
                node,
                slot: usize::MAX,
                deps: Few::Empty,
            });
        }
        self.streams.borrow_mut().push(raw);
        let mut heads = self.heads.borrow_mut();
        let found = heads.as_ref().and_then(|list| {
            // The capturing stream first: most calls are on it.
            let at = list.iter().position(|(s, _)| *s == raw)?;
            Some((at, list[at].1.clone()))
        });
        let (slot, deps) = match found {
            Some(found) => found,
            None => {
                // A stream the guard did not fork in.
                *heads = None;
                (usize::MAX, Few::Empty)
            }
        };
        Ok(Placed {
            node: std::ptr::null_mut(),
            slot,
            deps,
        })
    }

    /// The call placed at `slot` of the dependency heads (see [`Placed`]) made the node at
    /// `position`: its stream's next operation depends on that node alone.
    #[inline]
    fn placed(&self, slot: usize, position: usize) {
        if let Some(list) = self.heads.borrow_mut().as_mut() {
            if let Some((_, heads)) = list.get_mut(slot) {
                *heads = Few::One(position as u32);
            }
        }
    }

    /// Records a node placed at `at` of `kind` that has `role` for each of `allocations`.
    fn record_uses<'a>(
        &self,
        at: Placed,
        (kind, role): (NodeKind, MemRole),
        allocations: impl IntoIterator<Item = &'a GraphAllocation>,
    ) {
        let mut record = self.record.borrow_mut();
        let mut allocations = allocations.into_iter();
        let Placed { node, slot, deps } = at;
        let first = allocations.next();
        if first.is_some() && node.is_null() && self.each_call.get() && role == MemRole::Use {
            // A use on a node the stream did not report: the read-back matches only alloc and
            // free nodes by address, so the use would be lost.
            self.node_unknown.set(true);
        }
        let position = match (first, allocations.next()) {
            (None, _) => record.push(node, kind, deps),
            (Some(a), None) => record.push_ref(node, kind, deps, role, a),
            (Some(a), Some(b)) => {
                let position = record.push_ref(node, kind, deps, role, a);
                for a in std::iter::once(b).chain(allocations) {
                    record.add_ref(position, role, a);
                }
                position
            }
        };
        drop(record);
        self.placed(slot, position);
    }

    /// From now on each call asks the driver for its node: other code may add nodes to the
    /// capture. The nodes of the calls so far are the graph's first ones, in order (the driver
    /// lists a captured graph's nodes in the order captured), but for those the crate made
    /// outside the guard, which are known by handle; the node count and the capturing stream's
    /// dependencies confirm it, as at the end of the capture.
    ///
    /// # Errors
    ///
    /// [`Error::CaptureNotMatched`] naming `call` when the graph holds nodes the crate did not
    /// capture; [`Error::Driver`] naming `cuStreamGetCaptureInfo` or `cuGraphGetNodes`.
    fn ask_each_call(&self, call: &'static str) -> Result<()> {
        if self.each_call.get() {
            return Ok(());
        }
        let origin = self.stream.as_raw_stream();
        let info = capture_info(origin)?;
        if !info.active || info.graph.is_null() {
            // Not capturing any more (invalidated): ending the capture reports it.
            return Ok(());
        }
        let graph = info.graph;
        let mut listed = Listed::new();
        // SAFETY: the graph of a capture in progress, read but not changed.
        unsafe { crate::graph::graph_nodes(graph, &mut listed.nodes) }?;
        let nodes = &listed.nodes;
        let mut record = self.record.borrow_mut();
        let outside = deferred::captured_outside(self.capture_id, |o| o.node_handles());
        let outside = outside.unwrap_or_default();
        let unmatched = || Error::CaptureNotMatched {
            call,
            captured: record.nodes.len() + outside.len(),
            found: nodes.len(),
        };
        let ours = in_order(nodes, &outside).ok_or_else(unmatched)?;
        if ours.len() != record.nodes.len() {
            return Err(unmatched());
        }
        // The capturing stream's dependencies, as the driver says, must be the nodes the guard
        // placed there (as `Capture::end` confirms it).
        if let Some(heads) = self.heads.borrow().as_ref() {
            if !placed_as_reported(heads, origin, &ours, &info.deps) {
                return Err(unmatched());
            }
        }
        for (node, &raw) in record.nodes.iter_mut().zip(&ours) {
            node.raw = raw;
        }
        self.streams.borrow_mut().clear();
        self.each_call.set(true);
        Ok(())
    }

    /// Refuses `stream` unless it captures into this capture.
    fn check_member(&self, call: &'static str, stream: &impl AsStream) -> Result<()> {
        if capture_id(stream.as_raw_stream())? == Some(self.capture_id) {
            return Ok(());
        }
        Err(Error::NotInCapture { call })
    }

    /// Joins `other` back: the capturing stream waits for an event recorded on `other`, which
    /// must capture into this capture.
    ///
    /// # Errors
    ///
    /// [`Error::NotInCapture`] naming `Capture::join` when `other` is not capturing into this
    /// capture; otherwise those of [`fork`](Capture::fork), and [`Error::Driver`] naming
    /// `cuStreamGetCaptureInfo` for the membership check.
    pub fn join(&self, other: &impl AsStream) -> Result<()> {
        self.check_member("Capture::join", other)?;
        let event = Event::with_flags(self.device(), EventFlags::DISABLE_TIMING)?;
        event.record(other)?;
        wait_event_unnoted(self.stream, &event)?;
        self.events.borrow_mut().push(event);
        self.merge_heads(self.stream.as_raw_stream(), other.as_raw_stream());
        Ok(())
    }

    /// Ends the capture (`cuStreamEndCapture`) and returns the graph with its record.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] naming `cuStreamEndCapture` when the capture failed (an illegal call
    /// invalidated it: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, for one), or naming
    /// `cuGraphGetNodes`, `cuGraphGetEdges`, `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`
    /// or `cuGraphMemFreeNodeGetParams` while the graph is read back. The capture is over either
    /// way, and the graph is destroyed on error.
    #[inline]
    pub fn end(mut self) -> Result<Graph> {
        // In place: the guard is not moved into the call that ends it.
        self.end_in_place()
    }

    /// [`end`](Capture::end), leaving the emptied guard to be dropped.
    fn end_in_place(&mut self) -> Result<Graph> {
        self.ended = true;
        // What the capturing stream depends on last, as the driver says, to confirm the
        // dependencies the guard noted (`read_in_order`).
        let frontier = if !self.each_call.get() && self.heads.borrow().is_some() {
            capture_info(self.stream.as_raw_stream())
                .ok()
                .map(|info| info.deps)
        } else {
            None
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by this guard); `raw` is a valid out-pointer.
        let mut ended =
            driver!(unsafe { sys::cuStreamEndCapture(self.stream.as_raw_stream(), &mut raw) });
        let outside = deferred::capture_ended(self.capture_id).unwrap_or_default();
        if ended.is_ok() && self.node_unknown.get() {
            ended = Err(Error::CaptureNodeUnknown {
                call: "Capture::end",
            });
        }
        if let Err(e) = ended {
            if !raw.is_null() {
                // SAFETY: a graph returned despite the error is ours to destroy.
                let _ = unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(e);
        }
        let mut graph = if self.each_call.get() {
            // SAFETY: `raw` is the captured graph, owned by nobody else.
            unsafe { self.read_by_handle(raw) }?
        } else {
            // SAFETY: as above.
            unsafe { self.read_in_order(raw, frontier, &outside) }?
        };
        let keep = graph.keep.get_mut();
        keep.take_from(self.keep.get_mut());
        keep.extend_unknown(outside.keep);
        Ok(graph)
    }

    /// The graph of a capture whose calls did not ask for their nodes: the driver lists a
    /// captured graph's nodes in the order captured, so each call's node is the next one that
    /// the crate did not make outside the guard (those are known by handle). Every node must be
    /// accounted for: other code's nodes could not be told apart.
    ///
    /// # Errors
    ///
    /// [`Error::CaptureNotMatched`] naming `Capture::end` when the graph holds nodes the crate
    /// did not capture; [`Error::Driver`] naming `cuGraphGetNodes`, `cuGraphGetEdges` or
    /// `cuGraphNodeGetType`. The graph is destroyed on error.
    ///
    /// # Safety
    ///
    /// `raw` is this capture's graph, owned by nobody else.
    unsafe fn read_in_order(
        &self,
        raw: sys::CUgraph,
        frontier: Option<Few<sys::CUgraphNode>>,
        captured_outside: &CapturedOutside,
    ) -> Result<Graph> {
        // Destroys `raw` if reading it fails.
        let mut graph = Graph::wrap_with(raw, self.stream.device(), self.id, Record::default());
        let mut record = self.record.take();
        let mut streams = self.streams.take();
        let heads = self.heads.take();
        let outside = captured_outside.node_handles();
        // With the dependencies noted and confirmed, only the nodes are read.
        let noted =
            heads.is_some() && frontier.is_some() && !captured_outside.changed_dependencies();
        let listed = if noted {
            let mut listed = Listed::new();
            let expected = record.nodes.len() + outside.len();
            // SAFETY: the caller hands over a live graph.
            unsafe { crate::graph::graph_nodes_expecting(raw, &mut listed.nodes, expected) }?;
            listed
        } else {
            // SAFETY: as above.
            unsafe { nodes_and_edges(raw) }?
        };
        let Listed { nodes, from, to } = &listed;
        let (captured, found) = (record.nodes.len() + outside.len(), nodes.len());
        let unmatched = || Error::CaptureNotMatched {
            call: "Capture::end",
            captured,
            found,
        };
        let count = record.nodes.len();
        if nodes.len() != count + outside.len() || streams.len() != count {
            return Err(unmatched());
        }
        let confirmed = if noted {
            for (node, &raw) in record.nodes.iter_mut().zip(nodes) {
                node.raw = raw;
            }
            // The capturing stream's last dependencies are the nodes the guard placed there.
            let origin = self.stream.as_raw_stream();
            match (&heads, &frontier) {
                (Some(heads), Some(frontier)) => placed_as_reported(heads, origin, nodes, frontier),
                _ => false,
            }
        } else {
            // The dependencies the guard noted are not all there are: the driver's edges.
            for node in &mut record.nodes {
                node.deps = Few::Empty;
            }
            if outside.is_empty() {
                for (node, &raw) in record.nodes.iter_mut().zip(nodes) {
                    node.raw = raw;
                }
            } else {
                // The nodes the crate made outside the guard go where the driver lists them.
                let mut ours = std::mem::take(&mut record.nodes).into_iter();
                let mut on = std::mem::take(&mut streams).into_iter();
                for &raw in nodes {
                    if outside.contains(&Some(raw)) {
                        // SAFETY: the node belongs to the live graph.
                        let kind = unsafe { crate::graph::node_kind(raw) }?;
                        record.push(raw, kind, Few::new());
                        streams.push(OUTSIDE);
                    } else {
                        let (Some(mut node), Some(stream)) = (ours.next(), on.next()) else {
                            return Err(unmatched());
                        };
                        node.raw = raw;
                        record.nodes.push(node);
                        streams.push(stream);
                    }
                }
            }
            add_edges(&mut record, nodes, from, to) && chained(&record, &streams)
        };
        streams.clear();
        let _ = SPARE_STREAMS.try_with(|spare| spare.set(streams));
        if !confirmed {
            return Err(unmatched());
        }
        for allocation in record.freed() {
            allocation.register_free(self.id, true);
        }
        graph.record = record;
        Ok(graph)
    }

    /// The graph of a capture whose calls asked for their nodes: the record's nodes are matched
    /// to the driver's by handle, in the driver's order, and the other nodes read from the
    /// driver ([`read_graph`]), memory nodes by address to the allocations and frees whose node
    /// the stream did not report.
    ///
    /// # Errors
    ///
    /// [`read_graph`]'s; the graph is destroyed on error.
    ///
    /// # Safety
    ///
    /// `raw` is this capture's graph, owned by nobody else.
    unsafe fn read_by_handle(&self, raw: sys::CUgraph) -> Result<Graph> {
        let id = self.id;
        let record = self.record.take();
        let mut known = Vec::with_capacity(record.nodes.len());
        let (mut allocations, mut frees) = (Vec::new(), Vec::new());
        for (i, node) in record.nodes.iter().enumerate() {
            if !node.raw.is_null() {
                known.push((node.raw, i));
                continue;
            }
            for &(role, key) in node.refs() {
                match (role, record.allocation(key)) {
                    (MemRole::Alloc, Some(a)) => allocations.push(a.clone()),
                    (MemRole::Free, Some(a)) => frees.push(a.clone()),
                    _ => {}
                }
            }
        }
        let parts =
            |i: usize, by_address: Option<&mut IdMap<sys::CUdeviceptr, GraphAllocation>>| {
                let node = &record.nodes[i];
                let refs: Few<(MemRole, GraphAllocation)> = node
                    .refs()
                    .iter()
                    .filter_map(|&(role, key)| Some((role, record.allocation(key)?.clone())))
                    .collect();
                let mut by_address = by_address;
                for (role, a) in refs.iter() {
                    match role {
                        MemRole::Alloc => {
                            if let Some(by_address) = by_address.as_deref_mut() {
                                by_address.insert(a.ptr(), a.clone());
                            }
                        }
                        MemRole::Free => a.register_free(id, true),
                        MemRole::Use => {}
                    }
                }
                (node.kind().clone(), refs)
            };
        // SAFETY: the caller's.
        unsafe {
            read_graph(
                raw,
                self.stream.device(),
                id,
                known,
                parts,
                &allocations,
                &frees,
            )
        }
    }
}

impl<S: AsStream> Drop for Capture<'_, S> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let device = self.stream.device();
        let mut raw = std::ptr::null_mut();
        // SAFETY: ends the capture this guard began; the graph, if any, is discarded.
        let ended =
            driver!(unsafe { sys::cuStreamEndCapture(self.stream.as_raw_stream(), &mut raw) });
        // An invalidated capture ends with an error, and is over; one the driver would not end
        // (the guard was moved to another thread) still captures, and stays registered.
        device.record(ended);
        if matches!(self.stream.capture_status(), Ok(CaptureStatus::None)) {
            deferred::capture_ended(self.capture_id);
        }
        if !raw.is_null() {
            // SAFETY: the discarded graph is ours to destroy.
            device.record(driver!(unsafe { sys::cuGraphDestroy(raw) }));
        }
    }
}

/// Captures `f`'s work on `stream` into a graph. The capture ends whatever `f` does: returns an
/// error, panics (the panic continues after the capture is ended), or succeeds.
///
/// # Errors
///
/// Those of [`Capture::begin`] (for any stream) and [`Capture::end`], and `f`'s own error, returned
/// after the capture is ended and its graph discarded.
pub fn capture<S: AsStream, T>(
    stream: &S,
    mode: CaptureMode,
    f: impl FnOnce(&Capture<'_, S>) -> Result<T>,
) -> Result<(Graph, T)> {
    let guard = Capture::begin_on(stream, mode)?;
    let value = f(&guard)?;
    Ok((guard.end()?, value))
}

/// Whether each node of `record`, captured on `streams` (by position), depends on the node
/// captured before it on the same stream, as every operation captured on a stream does (waits
/// on events during a capture add dependencies, never remove them): a check that the driver
/// listed the nodes in the order captured.
fn chained(record: &Record, streams: &[sys::CUstream]) -> bool {
    // The last position on each stream: captures use few streams, most of them one, so the
    // first stream is kept apart from the others.
    let mut first: Option<(sys::CUstream, usize)> = None;
    let mut others: Vec<(sys::CUstream, usize)> = Vec::new();
    for (position, &stream) in streams.iter().enumerate() {
        if stream == OUTSIDE {
            // A node the crate made outside the guard, on a stream it does not know: the next
            // call on each stream may follow it rather than the call before.
            first = None;
            others.clear();
            continue;
        }
        let last = match &mut first {
            Some((s, at)) if *s == stream => Some(at),
            Some(_) => match others.iter_mut().find(|(s, _)| *s == stream) {
                Some((_, at)) => Some(at),
                None => {
                    others.push((stream, position));
                    None
                }
            },
            None => {
                first = Some((stream, position));
                None
            }
        };
        if let Some(at) = last {
            let before = *at as u32;
            let joined = match &record.nodes[position].deps {
                Few::One(d) => *d == before,
                deps => deps.contains(&before),
            };
            if !joined {
                return false;
            }
            *at = position;
        }
    }
    true
}

thread_local! {
    /// The emptied stream list of the last capture that ended on this thread, for the next.
    static SPARE_STREAMS: Cell<Vec<sys::CUstream>> = const { Cell::new(Vec::new()) };
}

/// For each stream of a capture, the positions of the nodes its next operation depends on
/// (inline for a capture on one stream).
type Heads = Few<(sys::CUstream, Few<u32>)>;

/// Where a call's node goes in a capture's record (see [`Capture::node_of`]).
struct Placed {
    /// The node, when each call asks the driver for it; else null.
    node: sys::CUgraphNode,
    /// The entry of the stream it was captured on in the capture's dependency heads.
    slot: usize,
    /// The positions it depends on, as the guard noted them.
    deps: Few<u32>,
}

/// Whether the nodes the driver reports `origin` depends on (`reported`) are those the guard
/// placed there, taken by position among `nodes` (the capture's nodes in the order captured).
fn placed_as_reported(
    heads: &Heads,
    origin: sys::CUstream,
    nodes: &[sys::CUgraphNode],
    reported: &[sys::CUgraphNode],
) -> bool {
    let placed = heads.iter().find(|(s, _)| *s == origin).map(|(_, p)| p);
    placed.is_some_and(|placed| {
        placed.len() == reported.len()
            && placed
                .iter()
                .all(|&p| nodes.get(p as usize).is_some_and(|n| reported.contains(n)))
    })
}

/// In the streams [`chained`] checks, a node the crate made outside the guard.
const OUTSIDE: sys::CUstream = usize::MAX as sys::CUstream;

/// The nodes of `nodes` that the crate did not make outside a capture's guard, in order;
/// `None` when a node it made there is not among them or was not reported.
fn in_order(
    nodes: &[sys::CUgraphNode],
    outside: &[Option<sys::CUgraphNode>],
) -> Option<Vec<sys::CUgraphNode>> {
    if outside.is_empty() {
        return Some(nodes.to_vec());
    }
    let outside: Vec<sys::CUgraphNode> = outside.iter().copied().collect::<Option<_>>()?;
    let ours: Vec<sys::CUgraphNode> = nodes
        .iter()
        .copied()
        .filter(|n| !outside.contains(n))
        .collect();
    (ours.len() + outside.len() == nodes.len()).then_some(ours)
}
