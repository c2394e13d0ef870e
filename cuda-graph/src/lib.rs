//! Safe CUDA graphs with graph-owned memory.
//!
//! `cuda-graph` wraps the driver API's graph-memory machinery (the Programming Guide's "Graph
//! Memory Nodes"): alloc and free nodes, stream capture of `cuMemAllocAsync`/`cuMemFreeAsync`,
//! AutoFreeOnLaunch, upload, trim and the footprint attributes, and peer access. Every handle is
//! owned by a value whose `Drop` releases it; allocations that outlive their graph (G.3.3) are
//! owned values too, freed by you or, failing that, when the last handle that reaches them drops.
//! And what CUDA does not do: before instantiation, the graph's [`Record`] of nodes, edges and
//! the allocations they allocate, free and use is checked against the lifetime rules of graph
//! allocations ([`check`]).
//!
//! It needs only `libcuda.so.1` at run time, loaded when first used, and shares the primary
//! context with runtime-API code on the same device.
//!
//! # G.3.1: an explicit graph
//!
//! An alloc node, kernels `a`, `b`, `c` that use the allocation, and a free node after `b` and
//! `c`. Node `e` of the guide, which is not ordered after the alloc node, is refused at
//! instantiation with an error that names it.
//!
//! The kernels of this example and the next are the project's test kernels, which the
//! `example-kernels` feature exposes as `cuda_graph::kernels::PTX` for the crate's examples and
//! tests (not part of the stable API); your own load the same way, with [`Module::from_ptx`] or
//! [`Module::from_cubin`].
//!
// Both examples are compiled as doc tests where that feature is on (`cargo test --workspace` turns
// it on, through the workspace's tests); without it, the doc-test collection (`cfg(doctest)`)
// sees them as `ignore`. The rendered docs always show `no_run`.
#![cfg_attr(any(feature = "example-kernels", not(doctest)), doc = "```no_run")]
#![cfg_attr(all(not(feature = "example-kernels"), doctest), doc = "```ignore")]
//! use cuda_graph::{AllocParams, AsStream, Device, DeviceBuffer, Graph, InstantiateFlags};
//! use cuda_graph::{KernelArgs, LaunchConfig, Module, Stream};
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::get(0)?;
//! let module = Module::from_ptx(&device, cuda_graph::kernels::PTX)?;
//! let (iota, copy) = (module.function("iota_u32")?, module.function("copy_u32")?);
//! let n: u64 = 1 << 20;
//! let config = LaunchConfig::for_elements(n, 256);
//! let (out_b, out_c) = (DeviceBuffer::<u32>::zeroed(&device, n as usize)?, DeviceBuffer::<u32>::zeroed(&device, n as usize)?);
//!
//! let mut graph = Graph::new(&device)?;
//! let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&device, n as usize * 4))?;
//! // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base);
//! // copy_u32(unsigned* dst, const unsigned* src, unsigned long long n).
//! let a = unsafe { graph.add_kernel_node(&[alloc], &iota, config, &KernelArgs::new().ptr(&buf).value(n).value(0u32))? };
//! let copy_to = |out| KernelArgs::new().ptr(out).ptr(&buf).value(n);
//! let b = unsafe { graph.add_kernel_node(&[a], &copy, config, &copy_to(&out_b))? };
//! let c = unsafe { graph.add_kernel_node(&[a], &copy, config, &copy_to(&out_c))? };
//! graph.add_mem_free_node(&[b, c], &buf)?;
//!
//! let exec = graph.instantiate(InstantiateFlags::NONE)?;
//! let stream = Stream::new(&device)?;
//! exec.launch(&stream)?;
//! stream.synchronize()?;
//! assert_eq!(out_b.to_vec()?[12345], 12345);
//!
//! // Node e: uses the allocation without depending on the alloc node.
//! let e = unsafe { graph.add_kernel_node(&[], &copy, config, &copy_to(&out_c))? };
//! graph.set_label(e, "e")?;
//! drop(exec);
//! let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
//! assert!(err.to_string().contains("node 'e'"));
//! # Ok(()) }
//! ```
//!
//! # G.3.2: stream capture with fork and join
//!
#![cfg_attr(any(feature = "example-kernels", not(doctest)), doc = "```no_run")]
#![cfg_attr(all(not(feature = "example-kernels"), doctest), doc = "```ignore")]
//! use cuda_graph::{capture, AsStream, CaptureMode, Device, DeviceBuffer, InstantiateFlags};
//! use cuda_graph::{KernelArgs, LaunchConfig, Module, Stream};
//!
//! # fn main() -> cuda_graph::Result<()> {
//! let device = Device::get(0)?;
//! let module = Module::from_ptx(&device, cuda_graph::kernels::PTX)?;
//! let (iota, copy) = (module.function("iota_u32")?, module.function("copy_u32")?);
//! let (stream1, stream2) = (Stream::new(&device)?, Stream::new(&device)?);
//! let n: u64 = 1 << 20;
//! let config = LaunchConfig::for_elements(n, 256);
//! let (out_b, out_c) = (DeviceBuffer::<u32>::zeroed(&device, n as usize)?, DeviceBuffer::<u32>::zeroed(&device, n as usize)?);
//!
//! let (graph, ()) = capture(&stream1, CaptureMode::Global, |cap| {
//!     let dptr = cap.malloc_async(n as usize * 4)?;
//!     let copy_to = |out| KernelArgs::new().ptr(out).ptr(&dptr).value(n);
//!     // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base);
//!     // copy_u32(unsigned* dst, const unsigned* src, unsigned long long n).
//!     unsafe { cap.launch(&iota, config, &KernelArgs::new().ptr(&dptr).value(n).value(0u32))? }; // A
//!     cap.fork(&stream2)?;                                                  // event1
//!     unsafe { cap.launch(&copy, config, &copy_to(&out_b))? };              // kernel B
//!     unsafe { cap.launch_on(&stream2, &copy, config, &copy_to(&out_c))? }; // kernel C
//!     cap.join(&stream2)?;                                        // event2
//!     cap.free_async(&dptr)                                       // after A, B and C
//! })?;
//! let exec = graph.instantiate(InstantiateFlags::NONE)?;
//! exec.launch(&stream1)?;
//! stream1.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! # Reading a graph back
//!
//! [`Graph::node_params`] returns what the driver made of a node, explicit or captured, as a
//! [`NodeParams`]: a kernel's function and shape, a memset's value and extent, a copy's ends and
//! extent, an alloc node's address, size, pool properties and peer access list (G.7), a free
//! node's address. [`Graph::dependencies`], [`Graph::dependents`], [`Graph::root_nodes`] and
//! [`Graph::driver_nodes`] list the driver's edges and nodes as [`DriverNode`]s: the record's
//! [`Node`] wherever the record holds the driver's node, so that the answers line up with
//! [`Graph::nodes`].
//!
//! # Safety model
//!
//! A safe function of this crate never lets the GPU or the host touch memory its owner has
//! freed, never hands Rust an invalid value, and never loses memory or a driver error, whatever
//! safe code does: drop things early, `mem::forget` guards, move values across threads, use the
//! per-thread default stream, pass odd sizes. Kernel launches are `unsafe` only because kernel
//! arguments are untyped at the ABI. The invariants, and the tests that show them (in
//! `tests/tests/soundness.rs` unless named otherwise; each failed before its fix):
//!
//! **Ownership follows the GPU.** Whatever a node, a captured call or a launch refers to stays
//! allocated until the GPU can no longer touch it. A [`Graph`] keeps, in one list, the
//! [`Function`]'s module of every kernel node, the memory of every [`DeviceAddress`] operand
//! (memset, memcpy, kernel arguments passed with [`KernelArgs::ptr`]), the memory of every
//! [`PinnedBuffer`] a memcpy node copies to or from, host closures, events, and child graphs'
//! lists; [`Capture`] keeps the same for captured calls. A conditional node's bodies are built
//! in a closure that sees them as [`Body`] values, which cannot leave it
//! (`tests/compile-fail/conditional_body_cannot_leave_its_closure`), and what they use is
//! recorded on the node and kept by the graph on every way out of the closure, a panic included
//! (`tests/attack_keep_stub.rs`: `panic_in_a_conditional_build_closure_drops_what_the_body_refers_to`;
//! `tests/safe_conditional.rs`: `a_body_whose_build_panicked_keeps_what_it_refers_to`). The allocations of its alloc nodes are
//! held by its record, and by each [`ExecGraph`] when they outlive a launch (one freed in its own
//! graph is never live after a launch: its handle guards no memory the GPU uses). Every [`ExecGraph`] made from the graph holds the list too, and marks its
//! launches with an event; dropped, it destroys the executable graph (CUDA defers
//! `cuGraphExecDestroy` for launches in flight) and lets go of the list once the event after its
//! last launch has completed (launches of one executable graph run one after another). A graph
//! that uses nothing outside itself, launched on an owned [`Stream`], records that event only
//! when it is needed (the drop, an update, a node's new parameters), on the stream of the
//! latest launch: an event recorded later still completes after the launch. The stream's own
//! drop records it first when it comes first, and while the stream captures the release waits
//! for the capture to end (`tests/attack_new.rs`: the `lazy_mark` tests; `tests/soundness.rs`:
//! `launch_marked_after_its_stream_is_dropped_keeps_what_it_uses`,
//! `launch_marked_while_its_stream_captures_keeps_what_it_uses`). On a [`BorrowedStream`],
//! whose owner may destroy it at any time, and for graphs that use allocations outside
//! themselves or host-visible memory, the event is recorded after each launch. Shared ownership was chosen over lifetimes because
//! an executable graph outlives the borrow of anything it was built from, and a launch outlives
//! the executable graph. Safe functions that hand an address, handle or closure to the driver,
//! and what keeps it valid:
//!
//! | function | handed to the driver | kept by | test |
//! |---|---|---|---|
//! | [`Graph::add_memset_node`], [`Graph::add_memcpy_node`] | device addresses | the graph's list | `memset_node_keeps_its_device_buffer_alive`, `memset_node_keeps_its_stream_allocation_alive`, `memcpy_node_keeps_its_source_and_destination_alive` |
//! | [`Graph::add_memcpy_node_htod`], [`Graph::add_memcpy_node_dtoh`], [`Capture::memcpy_htod_async`], [`Capture::memcpy_dtoh_async`] | a pinned host address, a device address | the list | `tests/host_memory_stub.rs`: `memcpy_nodes_keep_their_dropped_pinned_buffers`, `captured_copies_keep_their_pinned_buffers`; `tests/safe_host_memory.rs`: `pinned_buffers_dropped_after_building_are_the_ones_copied` |
//! | [`StreamMemOps::memcpy_htod_async`], [`StreamMemOps::memcpy_dtoh_async`] | a pinned host address, a device address | the buffer's memory, whose free waits for the copy's event; on a stream that captures into a capture of this crate, the captured graph's list | `tests/host_memory_stub.rs`: `stream_copy_keeps_its_dropped_pinned_buffer_until_it_ran`, `captured_copies_keep_their_pinned_buffers` |
//! | [`PinnedBuffer`] | `cuMemFreeHost` | its handle or the last graph holding it, then every stream copy's and launch's event recorded on it; queued while a capture forbids it | `tests/host_memory_stub.rs`: `pinned_buffer_dropped_during_a_global_capture_is_freed_after_it` |
//! | [`PinnedBuffer::as_slice`], [`PinnedBuffer::as_mut_slice`] (host views) | nothing: the host reads and writes | waits for every recorded GPU use first; GPU work on the buffer refused while alive (below) | `tests/host_memory_stub.rs`: `views_wait_for_queued_copies_and_launches`, `gpu_work_is_refused_while_a_view_lives`, `view_during_a_global_capture_waits_without_synchronizing`; `tests/safe_host_memory.rs`: `view_waits_for_the_launch_and_refuses_the_next` |
//! | [`ManagedBuffer`] as a [`DeviceAddress`] (memset, memcpy and kernel nodes, stream work, kernel arguments) | a managed address | the list, or the buffer's memory, whose free waits for the recorded events; refused while a host view lives | `tests/managed_stub.rs`: `graphs_keep_a_dropped_managed_buffer`, `gpu_work_is_refused_while_a_view_lives`; `tests/safe_managed.rs`: `managed_buffer_dropped_after_building_is_the_one_written` |
//! | [`ManagedBuffer`] | `cuMemFree` | its handle or the last graph holding it, then every recorded GPU use's event; refused (`ManagedBuffer::zeroed`) unless every device reports concurrent managed access | `tests/managed_stub.rs`: `drop_after_stream_work_frees_after_it_ran`, `refused_without_concurrent_managed_access` |
//! | [`HostBuffer::as_slice`], [`HostBuffer::as_mut_slice`] on a [`ManagedBuffer`] (host views) | nothing: the host reads and writes | as for pinned buffers | `tests/managed_stub.rs`: `views_wait_for_queued_gpu_work`; `tests/safe_managed.rs`: `kernel_sets_a_managed_flag_that_a_view_reads_after_it` |
//! | [`Graph::add_kernel_node`], [`Capture::launch`] (unsafe: argument types) | function, argument addresses | the list | `kernel_node_keeps_its_module_loaded`, `captured_launch_keeps_its_module_loaded` |
//! | [`Graph::add_host_node`] | a closure | the list | `host_node_closure_lives_until_the_driver_is_done_with_it` |
//! | [`Graph::add_event_record_node`], [`Graph::add_event_wait_node`] | an event | the list | `tests/safe_outside.rs` |
//! | [`ExecGraph::update`], [`ExecGraph::set_kernel_node_params`] (unsafe: argument types) | the new graph's parameters; new kernel arguments | the executable graph's list, the previous one until the launches queued before are done | `update_keeps_the_previous_operands_until_queued_launches_are_done`, `set_kernel_node_params_changes_one_node_and_refuses_what_the_checks_do_not_cover` |
//! | [`Graph::add_child_graph_node`] | a child graph | the driver's copy, and the child's list | `tests/safe_explicit.rs` |
//! | [`Graph::add_mem_alloc_node`], [`Capture::malloc_async`] | an address fixed for the graph's life | the list; a second instantiation is refused while it is live | `second_instantiation_never_remaps_a_live_allocation` |
//! | [`GraphAllocation::free_async`], [`Capture::free_async`], free nodes | a free | ordered after every known use (below) | `free_async_waits_for_a_queued_consumer_on_another_stream`, `relaunch_on_another_stream_keeps_a_pending_kernel_use`, `per_thread_stream_uses_from_two_threads_are_both_waited_for` |
//! | [`StreamAllocation`] | a stream-ordered free | its handle or the last graph holding it | `stream_allocation_drop_waits_for_a_graph_on_another_stream`, `stream_allocation_dropped_in_a_thread_local_capture_of_the_per_thread_stream_is_freed` |
//! | [`DeviceBuffer`] | `cuMemFree` | its handle or the last graph holding it | `memset_node_keeps_its_device_buffer_alive` |
#![cfg_attr(
    feature = "cudarc",
    doc = "| [`CudarcSlice`] (the `cudarc` feature), [`CudarcSlice::new`] | a cudarc slice's address; cudarc's free on the slice's stream | its handle or the last graph holding it; the free waits for every use the crate recorded, on any stream | `cudarc_slice_dropped_after_building_a_graph_that_writes_it_stays_allocated` (kernel and memset nodes), `capture_on_a_cudarc_stream_keeps_cudarc_memory` (a kernel operand, and a slice only cudarc's captured work reads, kept through `as_cudarc`), `cudarc_slice_free_waits_for_a_kernel_on_another_stream` (`tests/safe_cudarc.rs`) |"
)]
#![cfg_attr(
    feature = "cudarc",
    doc = "| [`CudarcSlice::into_inner`], [`CudarcSlice::as_cudarc`] | the slice, back to cudarc | the slice's stream waits for the recorded uses first (`into_inner`: then cudarc's write event is recorded there); what cudarc and the crate do not see of each other: [`CudarcSlice`] | `into_inner_orders_cudarc_after_the_crates_work` |"
)]
#![cfg_attr(
    feature = "cudarc",
    doc = "| [`Device::from_cudarc`]; [`BorrowedStream::from_cudarc`] (unsafe: captures begun outside the crate, cudarc's `begin_capture` among them) | cudarc's context and stream handles | the borrow of the `CudaContext`, `CudaStream` (the device retains its primary context itself) | `cudarc_handles_the_crate_cannot_order_are_refused`, `capture_on_a_cudarc_stream_keeps_cudarc_memory` |"
)]
//! | [`Stream`], [`Event`], [`Module`], [`MemPool`], [`ExecGraph`], [`Graph`] drops | destroys | each value; queued while a capture forbids it | `device_buffers_dropped_during_another_threads_global_capture_are_freed`, `stream_dropped_during_a_capture_does_not_free_into_it`, `last_exec_graph_dropped_inside_a_global_capture_keeps_the_capture_and_frees`, `deferred_frees_belong_to_the_device_not_the_handle` |
//!
//! **The host and the GPU never touch pinned or managed memory at once.** A [`PinnedBuffer`]'s
//! memory (and a [`ManagedBuffer`]'s: one [`HostBuffer`] type, two kinds) is
//! shared the way a [`DeviceBuffer`]'s is, not borrowed: a memcpy node or captured copy puts it
//! in the graph's list (a lifetime would not do, for the reason above: the executable graph
//! outlives the borrow). Rust code reads and writes it only through views
//! ([`PinnedBuffer::as_slice`], [`PinnedBuffer::as_mut_slice`], and `to_vec` and
//! `copy_from_slice`, which take one). The memory records its GPU uses, per real stream: an
//! event after each stream copy ([`StreamMemOps::memcpy_htod_async`],
//! [`StreamMemOps::memcpy_dtoh_async`]) and the event after each launch of an executable graph
//! whose list holds it. Taking a view first counts it, then waits for those events
//! (`cuEventSynchronize`; polled with `cuEventQuery` where a capture of this crate forbids
//! synchronizing); while a view is counted, stream copies and launches that would use the
//! memory are refused with [`Error::InUseByHost`], with nothing queued. Both decide under the
//! memory's lock, so a GPU use is either recorded before a view is counted (and waited for) or
//! refused. A forgotten view leaves the buffer refusing GPU work, never racing it. A view is
//! refused in a host node's function ([`Error::InHostFunction`]), which may be the very work
//! it would wait for. Pageable host memory (`&[T]`, `&mut [T]`) is not offered in graphs,
//! captures or stream copies: a node reads its host memory at every launch, long after a
//! borrowed slice may be gone, and a stream copy from pageable memory may still read it after
//! the call returns; [`DeviceBuffer::copy_from`] and [`DeviceBuffer::to_vec`] copy pageable
//! memory synchronously. A [`ManagedBuffer`] is also a [`DeviceAddress`]: every stream memset,
//! copy or kernel that names it is refused under a view and recorded like a copy, and graphs whose
//! nodes name it keep it and record their launches in it; it is refused on systems without
//! concurrent managed access, where the host may not touch managed memory while any kernel runs.
//! Outside what the crate sees: the address of [`PinnedBuffer::as_ptr`]
//! passed to kernels or copies as a plain value, and graphs launched by other code (handed
//! over with [`Graph::into_raw`], or launched from the device).
//!
//! **Order is enforced or refused, never assumed.** Uses of a graph allocation outside its
//! graph are recorded per real stream: the driver's stream id (`cuStreamGetId`), so the
//! per-thread default stream is a different stream on each thread. Stream work
//! ([`Function::launch`]) and graph launches that use a live allocation wait for the launch
//! that allocated it when it ran on another stream, and refuse one that is not live; every free
//! ([`GraphAllocation::free_async`], another graph's free node, an AutoFreeOnLaunch relaunch,
//! the RAII free) waits for every recorded use; a [`StreamAllocation`] waits the same way for
//! kernels launched on other streams. What the crate cannot see: addresses passed as plain
//! values ([`KernelArgs::value`]), work queued through raw handles or other libraries, and
//! kernels that hand addresses to other kernels. [`Capture::launch_on`] and [`Capture::join`]
//! refuse a stream that is not capturing into the capture
//! (`capture_launch_on_a_stream_outside_the_capture_is_refused`), and [`Capture::begin`] a
//! stream that already captures (`first_capture_writes_its_output_after_a_refused_second_begin`),
//! and [`ExecGraph::launch`] a stream that captures into a capture of this crate
//! (`exec_graph_launched_into_a_capture_is_refused`).
//! A consumer launched on another stream after its producer waits for it
//! (`consumer_on_another_stream_reads_the_producers_data`).
//!
//! **Work on graph memory is queued under one lock.** The driver misorders graph-memory work
//! that threads queue into streams they share: on the H200 (driver 580) an [`ExecGraph`] that
//! leaves allocations live, relaunched while another thread queues work on the same streams,
//! ran out of the order its events set (a use of the previous launch's allocation saw the
//! relaunch's data, or the reverse), and `cuGraphLaunch` crashed inside the driver. Plain CUDA
//! does the same (`bench/probe/stream_change_order.cu`: tens of bad rounds in 3000 with only
//! the launches serialized, none with each thread's waits, launch and records serialized). So
//! every sequence of the crate that orders and queues work on graph memory (the waits before
//! it, the call, the event after it) runs under one process-wide lock: launches of graphs with
//! memory nodes, [`GraphAllocation::free_async`] and [`GraphAllocation::free`], stream work on
//! graph allocations, the RAII free (`relaunch_into_streams_another_thread_shares_stays_in_order`,
//! `tests/stress_streams.rs`). Work queued through raw handles by other code is outside it.
//!
//! **Releases never disturb a capture, and none is lost.** While a capture begun through this
//! crate is active in `Global` mode (any thread) or `ThreadLocal` mode (its thread), frees,
//! unloads and destroys are queued instead of failing or being captured, and run when the
//! capture ends (or at [`flush_deferred`]); the queue is one per process. A stream-ordered
//! free on a stream that captures waits for the capture to end; a [`Stream`] dropped meanwhile
//! is destroyed after it. Captures begun by other code are not known: a release that then fails
//! is recorded, not retried, and work the crate queues on a stream that such a capture records
//! is outside what it sees: the `unsafe` that began it, or [`BorrowedStream::from_raw`]'s
//! contract, keeps the two apart. A forgotten [`Capture`] guard leaves its stream capturing until the
//! [`Stream`] drops, which ends the capture and records [`Error::CaptureLeftOpen`]
//! (`forgotten_capture_is_ended_when_its_stream_drops`). Once the process begins to exit
//! (an exit handler registered at [`init`], which runs before the driver's own teardown),
//! releases are left to the process's end instead of calling a driver that is being torn
//! down (`tests/hunt_stub.rs`, `no_driver_call_from_the_release_thread_during_exit_teardown`).
//!
//! Releases are ordered against capture beginnings: a release holds a process-wide gate shared
//! from its check to its end, and [`Capture::begin`] holds it exclusively until the capture is
//! registered, so no release runs inside a capture begun after its check. The same gate covers
//! the "not capturing" checks of `free_async`, `StreamAllocation::new` and every stream-ordered
//! operation on memory (`Function::launch`, [`StreamMemOps`]), and a wait that forks a stream
//! into a capture ([`Capture::fork`]) holds it exclusively too, so that none of them is captured
//! after its check (`tests/attack_new.rs`). A [`Capture`] guard of its own exists only for an
//! owned [`Stream`] (other streams capture through [`capture`], whose closure cannot lose the
//! guard): `tests/compile-fail/capture_guard_needs_an_owned_stream`.
//! A host node's function runs on a driver thread: there the crate refuses to bind a context
//! and queues releases. No user code runs under the gate: what a finished release held (a keep
//! list, with a host closure's captures) is dropped once the thread lets go of it, so a user's
//! `Drop` that waits for a thread beginning a capture does not wait for itself
//! (`tests/attack_release_stub.rs`).
//!
//! **A release makes its driver calls with the device's context current.** A value may be
//! dropped on a thread where no context is current, where a driver call may kill the process
//! (`cuGraphAddKernelNode` did: `graph_built_where_no_context_is_current`). Each release makes
//! the context current first; where it cannot, it makes no driver call: it stays queued and is
//! tried again at the next flush, what it would free is kept meanwhile, and the error is
//! recorded once (`tests/context_audit_stub.rs`, `tests/attack_release_stub.rs`).
//!
//! **The checks are not optional in safe code.** [`Graph::instantiate_unchecked`] is `unsafe`
//! (`tests/compile-fail/instantiate_unchecked_needs_unsafe`); a child graph moved into a parent
//! is checked before it disappears into one node (`tests/attack_stub.rs`).
//!
//! **A captured graph's nodes are matched to the calls that made them.** The checks read a
//! captured graph's record, so each node's uses and dependencies must be those of the call that
//! made it. On an owned [`Stream`], which only the crate queues work on, the guard notes each
//! call's dependencies as the driver makes them (an operation captured on a stream depends on
//! the stream's dependencies and becomes them; [`Capture::fork`] and [`Capture::join`] add the
//! other stream's, as an event wait in a capture does), and [`Capture::end`] matches the calls
//! to the nodes by the order in which `cuGraphGetNodes` lists them, the order captured. It
//! confirms both before the record is used: the graph holds exactly the nodes the crate
//! captured, and the capturing stream's last dependencies (`cuStreamGetCaptureInfo`, just
//! before the capture ends) are the nodes the guard placed there. When something else changed
//! the capture's dependencies (the crate's own work captured outside the guard, through
//! [`Function::launch`] or [`StreamMemOps`]; a wait through [`AsStream::wait_event`]; a
//! stream the guard did not fork in), the edges are read from the driver instead, and each call
//! must depend on the call before it on its stream. Otherwise it returns
//! [`Error::CaptureNotMatched`] and destroys the graph (`tests/capture_stub.rs`: raw work on the
//! stream, a driver listing the nodes in reverse order; `tests/safe_capture.rs`:
//! `nodes_matched_by_order_agree_with_nodes_asked_for`,
//! `other_code_in_a_capture_is_refused_on_owned_streams_and_read_on_borrowed_ones`). On a
//! [`BorrowedStream`], and from the fork of one on, other code may add nodes: each call asks the
//! driver for its node (`cuStreamGetCaptureInfo`), and the nodes and edges are read from the
//! driver; a call that uses graph allocations but cannot tell its node (the query fails, or the
//! stream reports none) makes [`Capture::end`] return [`Error::CaptureNodeUnknown`] and destroy
//! the graph, whose record would lack the uses (`tests/attack_keep_stub.rs`:
//! `captured_call_whose_node_is_lost_fails_the_capture`). What the crate relies on without checking every node: that `cuGraphGetNodes` lists a
//! captured graph's nodes in the order captured (the test above compares both readings on the
//! GPU), and that work queued through an owned stream's raw handle neither adds nor removes
//! nodes nor changes dependencies without adding a node.
//!
//! **No error is dropped.** Driver errors met in `Drop`, and panics of values dropped by a
//! deferred release, are counted per device, with the last one: [`Device::drop_errors`]. The
//! GPU tests assert the record stays empty.
//!
//! **Work that cannot be marked is waited for, or kept.** Every launch and stream operation on
//! memory the crate tracks is followed by an event that later frees wait for; a launch's event
//! is made before the launch, so that failing to make it queues nothing. When the record fails
//! after the work is queued, the crate synchronizes the stream; where it cannot (a capture of
//! this crate forbids the synchronize, or it fails), the work's end is unknown, and what it
//! refers to is kept for the rest of the process: later frees and uses of its memory return
//! [`Error::InDoubt`], and the executable graph's drop records it instead of releasing its list
//! (`tests/attack_new.rs`, `launch_whose_event_fails_during_a_global_capture_is_never_counted_done`).
//! [`ExecGraph::set_kernel_node_params`] keeps one setting per node, releasing the one before
//! after the launches queued with it (`set_kernel_node_params_keeps_the_latest_setting_only`).
//!
//! **Bits are validated; sizes are checked.** Device memory is read back only as
//! [`bytemuck::Pod`] types (`DeviceBuffer<&T>`, `<bool>`, `<char>` do not compile:
//! `tests/compile-fail/device_buffer_of_*`); every size product on a path to the driver is
//! checked (`memset_node_word_count_overflow_is_an_error`; for pinned buffers and host copies,
//! `tests/host_memory_stub.rs`, `sizes_and_bounds_are_typed_errors_naming_the_call`); a
//! [`PinnedBuffer`] holds `Pod` values too, zeroed when allocated; an allocation of the
//! device's whole memory or more is refused (`alloc_node_of_the_whole_device_memory_is_refused`;
//! sums across graphs are the driver's to refuse, at launch). What the readbacks ([`Graph::node_params`],
//! [`Graph::driver_nodes`], ...) take from the driver is integers, newtypes of integers and raw
//! pointers, valid for every bit pattern; the only pointer followed is an alloc node's peer
//! access list, which the node owns while the graph lives; a list's count is the driver's, and
//! its buffer is reserved without overflow, filled by a second call with that room, and refused
//! when the second answer is longer than the first (`tests/readback_stub.rs`, under a stub that
//! reports a list asked for with too little room).
//!
//! **Untrusted text stays text.** Labels and names are escaped in DOT output
//! (`tests/dot_stub.rs`).
//!
//! # Footprint
//!
//! [`Device::graph_mem_info`] returns the four graph-memory attributes as one value that prints
//! as `used 64.0 MiB (high 64.0 MiB), reserved 64.0 MiB (high 128.0 MiB)`;
//! [`Device::graph_mem_trim`] returns unused memory to the OS.

#![warn(missing_docs)]
// The crate's API conventions, kept here because `[lints] workspace = true` in Cargo.toml cannot
// be combined with lints of the crate's own: every `Result` says when it errs, and values that
// are pointless to drop are `#[must_use]`.
#![warn(clippy::missing_errors_doc, clippy::must_use_candidate)]

pub use bytemuck;
pub use cuda_graph_sys as sys;

mod alloc;
mod bytes;
mod capture;
pub mod check;
pub mod conditional;
// cudarc 0.19 interop: `Device::from_cudarc`, `BorrowedStream::from_cudarc`, `CudarcSlice`; only
// with the `cudarc` feature (off by default).
#[cfg(feature = "cudarc")]
mod cudarc;
mod deferred;
mod device;
mod dot;
mod error;
mod event;
mod exec;
mod flags;
mod footprint;
mod graph;
mod handle;
mod host_memory;
mod inline_list;
mod int_hash;
mod keep;
// The PTX of the project's example and test kernels (`fill_u32`, `copy_u32`, ...), for the
// examples, the workspace's tests and the benchmarks: not part of the stable API, so only with
// the `example-kernels` feature (off by default). Its docs say the same.
#[cfg(feature = "example-kernels")]
pub mod kernels;
mod lifetime_error;
mod live_objects;
mod managed;
mod memory;
mod module;
mod node_kind;
mod pinned;
mod pool;
mod readback;
mod record;
mod stream;
mod stream_alloc;
mod transfer;
mod uses;

pub use alloc::{Access, AllocParams, GraphAllocation};
pub use bytes::Bytes;
pub use capture::{Capture, CaptureMode, capture};
pub use conditional::{Body, Condition, ConditionalKind};
// `self::`: a bare `cudarc::` here would also name the cudarc crate.
#[cfg(feature = "cudarc")]
pub use self::cudarc::{CudarcSlice, Refused};
pub use deferred::{DropErrors, flush_deferred};
pub use device::{Device, HEADERS_VERSION, device_count, driver_version, init};
pub use error::{AllocationRef, DriverError, Error, Result, UpdateRefusal};
pub use event::{Event, EventFlags};
pub use exec::{ExecGraph, InstantiateFlags};
pub use footprint::GraphMemInfo;
pub use graph::{Graph, Node, NodeKind};
pub use handle::{Handle, OwnedHandle};
pub use host_memory::{HostBuffer, HostKind, HostMut, HostRef};
pub use inline_list::Few;
pub use live_objects::{LiveObjects, live_objects};
pub use managed::{Managed, ManagedBuffer, ManagedMut, ManagedRef};
pub use memory::{DeviceAddress, DeviceBuffer, MemsetValue};
pub use module::{Function, KernelArgs, LaunchConfig, Module};
pub use pinned::{Pinned, PinnedBuffer, PinnedMut, PinnedRef};
pub use pool::MemPool;
pub use readback::{
    DriverNode, KernelNodeParams, MemAllocNodeParams, MemcpyNodeParams, MemcpyOperand,
    MemsetNodeParams, NodeParams,
};
pub use record::{MemRole, NodeRecord, Record};
pub use stream::{AsStream, BorrowedStream, CaptureStatus, Stream, StreamFlags};
pub use stream_alloc::StreamAllocation;
pub use transfer::StreamMemOps;
