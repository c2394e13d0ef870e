//! Every code fragment of the CUDA Programming Guide's "Graph Memory Nodes" (G.3–G.7) in the
//! runtime API, as the guide writes it, in raw FFI,
//! with the test kernels of `cuda-graph/kernels/graph_kernels.cu` doing the work and their output copied back
//! and checked.
//!
//! Each test skips (prints `SKIPPED ...`) without a GPU, and fails instead with
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Every test frees and destroys what it creates, and all of them hold
//! [`serial`] so that, under `cargo test` (one process, many threads), a global-mode capture or a
//! footprint measurement never overlaps another test. The footprint checks (G.4.1's chain, G.4.2,
//! G.6) measure process-wide graph memory and live in one test, `footprint_g4_g6`.

//!
//! Built only where the headers have `cudaLibraryLoadData` (CUDA 12.5 and newer; see
//! `tests/build.rs`): with older ones this file holds no test.
#![cfg(cuda_graph_tests_runtime_library)]

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use cuda_graph_sys::*;
use cuda_graph_tests::{
    Args, DeviceBuffer, GraphMem, MIB, RuntimeKernels, alloc_node_params, assert_all, assert_iota,
    cannot_run, iota_sum, kernel_node, launch, read_u32, require_gpu, require_gpus, rt, rt_expect,
    serial,
};

/// Elements of the small allocations (4 MiB of `u32`).
const N: usize = 1 << 20;
/// Bytes of the small allocations.
const SIZE: usize = N * 4;
/// Bytes of the footprint tests' allocations.
const BIG: usize = 64 * MIB;
/// Elements of a `BIG` allocation.
const BIG_N: usize = BIG / 4;

/// Makes device 0 current and loads the kernels.
fn setup() -> RuntimeKernels {
    // SAFETY: device 0 exists (require_gpu passed).
    unsafe { rt!(cudaSetDevice(0)) };
    RuntimeKernels::load()
}

/// A new non-blocking stream: it does not synchronize with the legacy stream, so every ordering a
/// test relies on is one it states.
fn new_stream() -> cudaStream_t {
    let mut s = null_mut();
    // SAFETY: valid out-pointer; the caller destroys the stream.
    unsafe { rt!(cudaStreamCreateWithFlags(&mut s, cudaStreamNonBlocking)) };
    s
}

/// A new event without timing.
fn new_event() -> cudaEvent_t {
    let mut e = null_mut();
    // SAFETY: valid out-pointer; the caller destroys the event.
    unsafe { rt!(cudaEventCreateWithFlags(&mut e, cudaEventDisableTiming)) };
    e
}

/// Adds a kernel node running `kernel` over `n` elements with `args`, after `deps`.
///
/// # Safety
/// `graph` and `deps` are valid; `args` match the kernel and its pointers are valid when the node
/// runs.
unsafe fn add_kernel(
    graph: cudaGraph_t,
    deps: &[cudaGraphNode_t],
    kernel: cudaKernel_t,
    n: usize,
    mut args: Args,
) -> cudaGraphNode_t {
    let mut node = null_mut();
    let params = kernel_node(kernel, n, &mut args);
    // SAFETY: the caller guarantees graph, deps and args; `params` and `args` outlive the call.
    unsafe {
        rt!(cudaGraphAddKernelNode(
            &mut node,
            graph,
            deps.as_ptr(),
            deps.len(),
            &params
        ));
    }
    node
}

/// The types of a graph's nodes.
///
/// # Safety
/// `graph` is valid.
unsafe fn node_types(graph: cudaGraph_t) -> Vec<cudaGraphNodeType> {
    let mut count = 0usize;
    // SAFETY: a null node array asks for the count.
    unsafe { rt!(cudaGraphGetNodes(graph, null_mut(), &mut count)) };
    let mut nodes = vec![null_mut(); count];
    // SAFETY: `nodes` has room for `count` handles.
    unsafe { rt!(cudaGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) };
    nodes
        .iter()
        .map(|&node| {
            let mut t = cudaGraphNodeType::cudaGraphNodeTypeEmpty;
            // SAFETY: `node` belongs to `graph`.
            unsafe { rt!(cudaGraphNodeGetType(node, &mut t)) };
            t
        })
        .collect()
}

fn count_of(types: &[cudaGraphNodeType], t: cudaGraphNodeType) -> usize {
    types.iter().filter(|&&x| x == t).count()
}

/// Trims graph memory and resets both high-water marks of device 0.
///
/// # Safety
/// No graph work may be in flight that the caller still needs measured.
unsafe fn trim_and_reset_highs() {
    let mut zero: u64 = 0;
    // SAFETY: the attributes take a cuuint64_t; 0 is the only value allowed for the high marks.
    unsafe {
        rt!(cudaDeviceSynchronize());
        rt!(cudaDeviceGraphMemTrim(0));
        rt!(cudaDeviceSetGraphMemAttribute(
            0,
            cudaGraphMemAttributeType::cudaGraphMemAttrUsedMemHigh,
            (&raw mut zero).cast(),
        ));
        rt!(cudaDeviceSetGraphMemAttribute(
            0,
            cudaGraphMemAttributeType::cudaGraphMemAttrReservedMemHigh,
            (&raw mut zero).cast(),
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// G.3.1 Explicit APIs
// ---------------------------------------------------------------------------------------------

/// G.3.1: an explicit graph: alloc node → kernel a → kernels b and c → free node depending on b
/// and c. `a` writes the allocation; `b` copies it out and `c` sums it, so both results are
/// checked after the free.
///
/// The guide's kernel nodes `d` (after `c`, not before the free) and `e` (not after the alloc)
/// are its counter-examples: each would access the allocation outside its lifetime, which is
/// illegal, so they are never built or launched with the allocation. To keep the figure's shape
/// (a node after `c` that the free does not wait for, and a root node), `d` and `e` are built on
/// buffers of their own, which is legal, and checked too.
#[test]
#[ignore = "needs a GPU"]
fn g3_1_explicit_graph_alloc_kernels_free() {
    const TEST: &str = "g3_1_explicit_graph_alloc_kernels_free";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let out_b = DeviceBuffer::zeroed(SIZE);
    let out_c = DeviceBuffer::zeroed(8);
    let out_d = DeviceBuffer::zeroed(SIZE);
    let out_e = DeviceBuffer::zeroed(SIZE);
    let stream = new_stream();
    const BASE: u32 = 31;

    // SAFETY: every handle is created here before use and destroyed once; kernel arguments match
    // the kernels and point at live memory (the graph allocation only between its alloc and free
    // nodes, in graph order).
    unsafe {
        // Create the graph - it starts out empty
        let mut graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut graph, 0));

        // parameters for a basic allocation: pinned, resident on device 0
        let mut params = alloc_node_params(0, SIZE);
        let mut alloc_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc_node,
            graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;
        assert!(
            !dptr.is_null(),
            "cudaGraphAddMemAllocNode returned no address"
        );

        // nodeParams->kernelParams[0] = params.dptr;
        let a = add_kernel(
            graph,
            &[alloc_node],
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
        );
        let b = add_kernel(
            graph,
            &[a],
            k.copy_u32,
            N,
            Args::new().ptr(out_b.ptr()).ptr(dptr).u64(N as u64),
        );
        let c = add_kernel(
            graph,
            &[a],
            k.sum_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).ptr(out_c.ptr()),
        );

        // b and c use the allocation, so the free node depends on them (a is covered through them).
        let dependencies = [b, c];
        let mut free_node = null_mut();
        rt!(cudaGraphAddMemFreeNode(
            &mut free_node,
            graph,
            dependencies.as_ptr(),
            2,
            dptr
        ));

        // The guide's d (after c, unordered with the free) and e (no dependency on the alloc) must
        // not touch the allocation: here they write buffers of their own.
        let _d = add_kernel(
            graph,
            &[c],
            k.fill_u32,
            N,
            Args::new().ptr(out_d.ptr()).u64(N as u64).u32(0xD),
        );
        let _e = add_kernel(
            graph,
            &[],
            k.fill_u32,
            N,
            Args::new().ptr(out_e.ptr()).u64(N as u64).u32(0xE),
        );

        let types = node_types(graph);
        assert_eq!(types.len(), 7);
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeMemAlloc),
            1
        );
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeMemFree),
            1
        );
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeKernel),
            5
        );

        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        // The graph frees what it allocates, so it relaunches freely.
        for launch_no in 1..=2u64 {
            rt!(cudaGraphLaunch(exec, stream));
            rt!(cudaStreamSynchronize(stream));
            assert_iota(
                &out_b.read_u32(),
                BASE,
                "G.3.1 node b (copy of the allocation)",
            );
            assert_eq!(
                out_c.read_u64()[0],
                launch_no * iota_sum(BASE, N),
                "G.3.1 node c (sum)"
            );
            assert_all(&out_d.read_u32(), 0xD, "G.3.1 node d (own buffer)");
            assert_all(&out_e.read_u32(), 0xE, "G.3.1 node e (own buffer)");
        }

        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaStreamDestroy(stream));
    }
}

// ---------------------------------------------------------------------------------------------
// G.3.2 Stream Capture
// ---------------------------------------------------------------------------------------------

/// G.3.2: the same graph (without d and e) made by capturing `cudaMallocAsync`, kernels A, B, C,
/// a fork into stream2 and a join back with events, and `cudaFreeAsync`. Checks the captured
/// graph's nodes (1 alloc, 3 kernels, 1 free) and the kernels' output.
#[test]
#[ignore = "needs a GPU"]
fn g3_2_stream_capture_fork_join() {
    const TEST: &str = "g3_2_stream_capture_fork_join";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let out_b = DeviceBuffer::zeroed(SIZE);
    let out_c = DeviceBuffer::zeroed(8);
    let (stream1, stream2) = (new_stream(), new_stream());
    let (event1, event2) = (new_event(), new_event());
    const BASE: u32 = 7;

    // SAFETY: handles are created before use and destroyed once; the captured kernels use the
    // allocation only between its capture-ordered alloc and free.
    unsafe {
        let mut graph: cudaGraph_t = null_mut();
        let mut dptr: *mut c_void = null_mut();
        rt!(cudaStreamBeginCapture(
            stream1,
            cudaStreamCaptureMode::cudaStreamCaptureModeGlobal
        ));

        rt!(cudaMallocAsync(&mut dptr, SIZE, stream1));
        // kernel_A<<< ..., stream1 >>>(dptr, ...);
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
            stream1,
        );

        // Fork into stream2
        rt!(cudaEventRecord(event1, stream1));
        rt!(cudaStreamWaitEvent(stream2, event1, 0));

        // kernel_B<<< ..., stream1 >>>(dptr, ...);
        launch(
            k.copy_u32,
            N,
            Args::new().ptr(out_b.ptr()).ptr(dptr).u64(N as u64),
            stream1,
        );
        // kernel_C<<< ..., stream2 >>>(dptr, ...): ordered after the alloc through event1.
        launch(
            k.sum_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).ptr(out_c.ptr()),
            stream2,
        );

        // Join stream2 back to origin stream (stream1)
        rt!(cudaEventRecord(event2, stream2));
        rt!(cudaStreamWaitEvent(stream1, event2, 0));

        // Free depends on all work accessing the memory.
        rt!(cudaFreeAsync(dptr, stream1));

        // End capture in the origin stream
        rt!(cudaStreamEndCapture(stream1, &mut graph));

        let types = node_types(graph);
        assert_eq!(types.len(), 5, "captured node types: {types:?}");
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeMemAlloc),
            1
        );
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeKernel),
            3
        );
        assert_eq!(
            count_of(&types, cudaGraphNodeType::cudaGraphNodeTypeMemFree),
            1
        );

        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        rt!(cudaGraphLaunch(exec, stream1));
        rt!(cudaStreamSynchronize(stream1));
        assert_iota(&out_b.read_u32(), BASE, "G.3.2 kernel B");
        assert_eq!(
            out_c.read_u64()[0],
            iota_sum(BASE, N),
            "G.3.2 kernel C (sum)"
        );

        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaEventDestroy(event1));
        rt!(cudaEventDestroy(event2));
        rt!(cudaStreamDestroy(stream1));
        rt!(cudaStreamDestroy(stream2));
    }
}

// ---------------------------------------------------------------------------------------------
// G.3.3 Accessing and Freeing Graph Memory Outside of the Allocating Graph
// ---------------------------------------------------------------------------------------------

/// G.3.3, ordering with a single stream: a graph that only allocates, launched into `stream`, then
/// a kernel and `cudaFreeAsync` in the same stream.
#[test]
#[ignore = "needs a GPU"]
fn g3_3_single_stream_ordering() {
    const TEST: &str = "g3_3_single_stream_ordering";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let stream = new_stream();
    const BASE: u32 = 1000;

    // SAFETY: handles are created before use and destroyed once; the allocation is used in stream
    // order after the allocating graph's launch and before cudaFreeAsync.
    unsafe {
        let mut alloc_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut alloc_graph, 0));
        let mut params = alloc_node_params(0, SIZE);
        let mut alloc_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc_node,
            alloc_graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;

        let mut alloc_graph_exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut alloc_graph_exec, alloc_graph, 0));

        rt!(cudaGraphLaunch(alloc_graph_exec, stream));
        // kernel<<< …, stream >>>(dptr, …);
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
            stream,
        );
        let mut host = vec![0u32; N];
        rt!(cudaMemcpyAsync(
            host.as_mut_ptr().cast(),
            dptr,
            SIZE,
            cudaMemcpyKind::cudaMemcpyDeviceToHost,
            stream,
        ));
        rt!(cudaFreeAsync(dptr, stream));
        rt!(cudaStreamSynchronize(stream));
        assert_iota(&host, BASE, "G.3.3 single stream");

        rt!(cudaGraphExecDestroy(alloc_graph_exec));
        rt!(cudaGraphDestroy(alloc_graph));
        rt!(cudaStreamDestroy(stream));
    }
}

/// G.3.3, ordering with events between streams: the allocating graph runs in `allocStream`,
/// a kernel in `stream2` waits for it through `allocEvent`, and a separate freeing graph (a kernel
/// node that copies the allocation out, then the free node) runs in `stream3` after
/// `streamUseDoneEvent`. (The guide adds kernel node `a` to `graph` but its free node to
/// `freeGraph` with `a` as dependency; both belong to `freeGraph`, as here. Its
/// `cudaStreamRecordEvent` is `cudaEventRecord`.)
#[test]
#[ignore = "needs a GPU"]
fn g3_3_event_ordering_with_free_graph() {
    const TEST: &str = "g3_3_event_ordering_with_free_graph";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let out = DeviceBuffer::zeroed(SIZE);
    let (alloc_stream, stream2, stream3) = (new_stream(), new_stream(), new_stream());
    let (alloc_event, stream_use_done_event) = (new_event(), new_event());
    const BASE: u32 = 5000;

    // SAFETY: handles are created before use and destroyed once; every access to the allocation is
    // ordered after the allocating launch (allocEvent) and before the free node
    // (streamUseDoneEvent, then the graph edge a → free).
    unsafe {
        // Contents of allocating graph
        let mut alloc_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut alloc_graph, 0));
        let mut params = alloc_node_params(0, SIZE);
        let mut alloc_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc_node,
            alloc_graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;

        // contents of consuming/freeing graph
        let mut free_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut free_graph, 0));
        let a = add_kernel(
            free_graph,
            &[],
            k.copy_u32,
            N,
            Args::new().ptr(out.ptr()).ptr(dptr).u64(N as u64),
        );
        let mut free_node = null_mut();
        rt!(cudaGraphAddMemFreeNode(
            &mut free_node,
            free_graph,
            &a,
            1,
            dptr
        ));

        let mut alloc_graph_exec: cudaGraphExec_t = null_mut();
        let mut free_graph_exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut alloc_graph_exec, alloc_graph, 0));
        rt!(cudaGraphInstantiate(&mut free_graph_exec, free_graph, 0));

        rt!(cudaGraphLaunch(alloc_graph_exec, alloc_stream));

        // establish the dependency of stream2 on the allocation node
        rt!(cudaEventRecord(alloc_event, alloc_stream));
        rt!(cudaStreamWaitEvent(stream2, alloc_event, 0));

        // kernel<<< …, stream2 >>> (dptr, …);
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
            stream2,
        );

        // establish the dependency between the stream 3 and the allocation use
        rt!(cudaEventRecord(stream_use_done_event, stream2));
        rt!(cudaStreamWaitEvent(stream3, stream_use_done_event, 0));

        // it is now safe to launch the freeing graph, which may also access the memory
        rt!(cudaGraphLaunch(free_graph_exec, stream3));
        rt!(cudaStreamSynchronize(stream3));
        assert_iota(&out.read_u32(), BASE, "G.3.3 events: freeing graph's copy");

        // The allocation was freed by the other graph, so the allocating graph may launch again.
        rt!(cudaGraphLaunch(alloc_graph_exec, alloc_stream));
        rt!(cudaFreeAsync(dptr, alloc_stream));
        rt!(cudaStreamSynchronize(alloc_stream));

        rt!(cudaGraphExecDestroy(alloc_graph_exec));
        rt!(cudaGraphExecDestroy(free_graph_exec));
        rt!(cudaGraphDestroy(alloc_graph));
        rt!(cudaGraphDestroy(free_graph));
        rt!(cudaEventDestroy(alloc_event));
        rt!(cudaEventDestroy(stream_use_done_event));
        for s in [alloc_stream, stream2, stream3] {
            rt!(cudaStreamDestroy(s));
        }
    }
}

/// G.3.3, ordering with event nodes in the graphs: the allocating graph records `allocEvent` from
/// an event-record node after its alloc node; the freeing graph waits on `allocEvent` (for its
/// own kernel) and on `streamUseDoneEvent` (for the stream's kernel) before its free node.
///
/// The stream's kernel and the graph's kernel node are not ordered with each other, so they work
/// on disjoint halves of the allocation, and each half is copied out before the free: the stream
/// writes and copies the low half, the freeing graph the high half (its `kernelNode` is the fill
/// plus a copy node after it; the free node depends on the copy and on the wait node).
#[test]
#[ignore = "needs a GPU"]
fn g3_3_event_nodes_in_alloc_and_free_graphs() {
    const TEST: &str = "g3_3_event_nodes_in_alloc_and_free_graphs";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let half = N / 2;
    let out_lo = DeviceBuffer::zeroed(half * 4);
    let out_hi = DeviceBuffer::zeroed(half * 4);
    let (alloc_stream, stream2, stream3) = (new_stream(), new_stream(), new_stream());
    // event indicating when the allocation will be ready for use.
    let alloc_event = new_event();
    // event indicating when the stream operations are done with the allocation.
    let stream_use_done_event = new_event();
    const BASE: u32 = 90;
    const FILL: u32 = 0xABCD;

    // SAFETY: handles are created before use and destroyed once; the stream's accesses are ordered
    // after the record node (allocEvent) and before the free (streamUseDoneEvent wait node); the
    // graph's accesses after the allocEvent wait node and before the free by graph edges.
    unsafe {
        // Contents of allocating graph with event record node
        let mut alloc_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut alloc_graph, 0));
        let mut params = alloc_node_params(0, SIZE);
        let mut alloc_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc_node,
            alloc_graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;
        let dptr_hi = dptr.cast::<u32>().add(half).cast::<c_void>();
        // note: this event record node depends on the alloc node
        let mut record_node = null_mut();
        rt!(cudaGraphAddEventRecordNode(
            &mut record_node,
            alloc_graph,
            &alloc_node,
            1,
            alloc_event
        ));
        let mut alloc_graph_exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut alloc_graph_exec, alloc_graph, 0));

        // contents of consuming/freeing graph with event wait nodes
        let mut wait_and_free_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut wait_and_free_graph, 0));
        let mut stream_use_done_event_node = null_mut();
        rt!(cudaGraphAddEventWaitNode(
            &mut stream_use_done_event_node,
            wait_and_free_graph,
            null(),
            0,
            stream_use_done_event,
        ));
        let mut alloc_ready_event_node = null_mut();
        rt!(cudaGraphAddEventWaitNode(
            &mut alloc_ready_event_node,
            wait_and_free_graph,
            null(),
            0,
            alloc_event
        ));

        // The allocReadyEventNode provides ordering with the alloc node for use in a consuming graph.
        let kernel_node = add_kernel(
            wait_and_free_graph,
            &[alloc_ready_event_node],
            k.fill_u32,
            half,
            Args::new().ptr(dptr_hi).u64(half as u64).u32(FILL),
        );
        let copy_node = add_kernel(
            wait_and_free_graph,
            &[kernel_node],
            k.copy_u32,
            half,
            Args::new().ptr(out_hi.ptr()).ptr(dptr_hi).u64(half as u64),
        );

        // The free node has to be ordered after both external and internal users.
        let dependencies = [copy_node, stream_use_done_event_node];
        let mut free_node = null_mut();
        rt!(cudaGraphAddMemFreeNode(
            &mut free_node,
            wait_and_free_graph,
            dependencies.as_ptr(),
            2,
            dptr
        ));
        let mut wait_and_free_graph_exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(
            &mut wait_and_free_graph_exec,
            wait_and_free_graph,
            0
        ));

        rt!(cudaGraphLaunch(alloc_graph_exec, alloc_stream));

        // establish the dependency of stream2 on the event node satisfies the ordering requirement
        rt!(cudaStreamWaitEvent(stream2, alloc_event, 0));
        // kernel<<< …, stream2 >>> (dptr, …);
        launch(
            k.iota_u32,
            half,
            Args::new().ptr(dptr).u64(half as u64).u32(BASE),
            stream2,
        );
        launch(
            k.copy_u32,
            half,
            Args::new().ptr(out_lo.ptr()).ptr(dptr).u64(half as u64),
            stream2,
        );
        rt!(cudaEventRecord(stream_use_done_event, stream2));

        // the event wait node in the waitAndFreeGraphExec establishes the dependency on the
        // "readyForFreeEvent" that is needed to prevent the kernel running in stream two from
        // accessing the allocation after the free node in execution order.
        rt!(cudaGraphLaunch(wait_and_free_graph_exec, stream3));

        rt!(cudaStreamSynchronize(stream3));
        rt!(cudaStreamSynchronize(stream2));
        assert_iota(&out_lo.read_u32(), BASE, "G.3.3 event nodes: stream's half");
        assert_all(&out_hi.read_u32(), FILL, "G.3.3 event nodes: graph's half");

        rt!(cudaGraphExecDestroy(alloc_graph_exec));
        rt!(cudaGraphExecDestroy(wait_and_free_graph_exec));
        rt!(cudaGraphDestroy(alloc_graph));
        rt!(cudaGraphDestroy(wait_and_free_graph));
        rt!(cudaEventDestroy(alloc_event));
        rt!(cudaEventDestroy(stream_use_done_event));
        for s in [alloc_stream, stream2, stream3] {
            rt!(cudaStreamDestroy(s));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// G.3.4 cudaGraphInstantiateFlagAutoFreeOnLaunch
// ---------------------------------------------------------------------------------------------

/// G.3.4: a producer graph (captured on `cudaStreamPerThread`: two `cudaMallocAsync`, kernels that
/// fill them) instantiated with `cudaGraphInstantiateFlagAutoFreeOnLaunch`, and two consumer graphs
/// (sums into accumulators), launched in a loop in which consumer 2 runs on some iterations only.
/// The producer relaunches with its allocations unfreed; the accumulated sums prove every
/// iteration saw the produced data; `cudaFreeAsync` frees the last allocations.
///
/// And the contrast the guide states: the same kind of producer instantiated without the flag
/// fails to relaunch (`cudaErrorInvalidValue`) until its allocation is freed.
#[test]
#[ignore = "needs a GPU"]
fn g3_4_auto_free_on_launch_producer_consumers() {
    const TEST: &str = "g3_4_auto_free_on_launch_producer_consumers";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let sum1 = DeviceBuffer::zeroed(8);
    let sum2 = DeviceBuffer::zeroed(8);
    let my_stream = new_stream();
    let per_thread = cudaStreamPerThread;
    let global = cudaStreamCaptureMode::cudaStreamCaptureModeGlobal;
    const ITERATIONS: u64 = 6;

    // SAFETY: handles are created before use and destroyed once; consumers use data1/data2 in
    // stream order after each producer launch; the final allocations are freed by cudaFreeAsync.
    unsafe {
        // Create producer graph which allocates memory and populates it with data
        let mut graph: cudaGraph_t = null_mut();
        let (mut data1, mut data2): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        rt!(cudaStreamBeginCapture(per_thread, global));
        rt!(cudaMallocAsync(&mut data1, SIZE, per_thread));
        rt!(cudaMallocAsync(&mut data2, SIZE, per_thread));
        // produce<<<...>>>(data1, data2);
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(data1).u64(N as u64).u32(1),
            per_thread,
        );
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(data2).u64(N as u64).u32(1000),
            per_thread,
        );
        rt!(cudaStreamEndCapture(per_thread, &mut graph));
        let mut producer: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiateWithFlags(
            &mut producer,
            graph,
            u64::from(cudaGraphInstantiateFlags::cudaGraphInstantiateFlagAutoFreeOnLaunch.0),
        ));
        rt!(cudaGraphDestroy(graph));

        // Create first consumer graph by capturing an asynchronous library call
        rt!(cudaStreamBeginCapture(per_thread, global));
        launch(
            k.sum_u32,
            N,
            Args::new().ptr(data1).u64(N as u64).ptr(sum1.ptr()),
            per_thread,
        );
        rt!(cudaStreamEndCapture(per_thread, &mut graph));
        let mut consumer1: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiateWithFlags(&mut consumer1, graph, 0)); // regular instantiation
        rt!(cudaGraphDestroy(graph));

        // Create second consumer graph
        rt!(cudaStreamBeginCapture(per_thread, global));
        launch(
            k.sum_u32,
            N,
            Args::new().ptr(data2).u64(N as u64).ptr(sum2.ptr()),
            per_thread,
        );
        rt!(cudaStreamEndCapture(per_thread, &mut graph));
        let mut consumer2: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiateWithFlags(&mut consumer2, graph, 0));
        rt!(cudaGraphDestroy(graph));

        // Launch in a loop
        let mut launch_consumer2 = false;
        let mut consumer2_launches = 0u64;
        let mut iteration = 0u64;
        // determineAction: run ITERATIONS times, consumer 2 on every other iteration.
        let mut determine_action = |launch_consumer2: &mut bool| {
            iteration += 1;
            *launch_consumer2 = iteration % 2 == 1;
            iteration < ITERATIONS
        };
        loop {
            rt!(cudaGraphLaunch(producer, my_stream));
            rt!(cudaGraphLaunch(consumer1, my_stream));
            if launch_consumer2 {
                rt!(cudaGraphLaunch(consumer2, my_stream));
                consumer2_launches += 1;
            }
            if !determine_action(&mut launch_consumer2) {
                break;
            }
        }

        rt!(cudaFreeAsync(data1, my_stream));
        rt!(cudaFreeAsync(data2, my_stream));

        rt!(cudaGraphExecDestroy(producer));
        rt!(cudaGraphExecDestroy(consumer1));
        rt!(cudaGraphExecDestroy(consumer2));
        rt!(cudaStreamSynchronize(my_stream));

        println!(
            "G.3.4: {ITERATIONS} producer launches, consumer 2 ran {consumer2_launches} times"
        );
        assert_eq!(consumer2_launches, ITERATIONS / 2);
        assert_eq!(
            sum1.read_u64()[0],
            ITERATIONS * iota_sum(1, N),
            "consumer 1 sums"
        );
        assert_eq!(
            sum2.read_u64()[0],
            consumer2_launches * iota_sum(1000, N),
            "consumer 2 sums"
        );

        // Without the flag, a relaunch with the allocation unfreed fails.
        let mut data3: *mut c_void = null_mut();
        rt!(cudaStreamBeginCapture(my_stream, global));
        rt!(cudaMallocAsync(&mut data3, SIZE, my_stream));
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(data3).u64(N as u64).u32(3),
            my_stream,
        );
        rt!(cudaStreamEndCapture(my_stream, &mut graph));
        let mut plain: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiateWithFlags(&mut plain, graph, 0));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaGraphLaunch(plain, my_stream));
        rt!(cudaStreamSynchronize(my_stream));
        assert_iota(&read_u32(data3, N), 3, "G.3.4 producer without the flag");
        rt_expect!(
            cudaGraphLaunch(plain, my_stream),
            cudaError_t::cudaErrorInvalidValue
        );
        // Once freed, it launches again.
        rt!(cudaFreeAsync(data3, my_stream));
        rt!(cudaGraphLaunch(plain, my_stream));
        rt!(cudaFreeAsync(data3, my_stream));
        rt!(cudaStreamSynchronize(my_stream));
        rt!(cudaGraphExecDestroy(plain));
        rt!(cudaStreamDestroy(my_stream));
    }
}

// ---------------------------------------------------------------------------------------------
// G.4.1 Address Reuse within a Graph
// ---------------------------------------------------------------------------------------------

/// G.4.1, addresses: alloc 1 → kernels → free 1 → {alloc 2, alloc 3}. Alloc 2 depends on free 1
/// and so may reuse alloc 1's address (CUDA does: asserted); alloc 3 also depends on free 1 but
/// not on free 2, so its range must not overlap alloc 2's (asserted). All three are written and
/// summed, and the sums are checked.
#[test]
#[ignore = "needs a GPU"]
fn g4_1_address_reuse_within_graph() {
    const TEST: &str = "g4_1_address_reuse_within_graph";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let sums = DeviceBuffer::zeroed(3 * 8);
    let stream = new_stream();

    // SAFETY: handles are created before use and destroyed once; each allocation is used only
    // between its alloc and free nodes.
    unsafe {
        let mut graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut graph, 0));
        let sum_at = |i: usize| sums.ptr().cast::<u64>().add(i).cast::<c_void>();

        // One allocation's life: alloc (after deps) → fill → sum → free.
        let life = |deps: &[cudaGraphNode_t], value: u32, i: usize| {
            let mut params = alloc_node_params(0, SIZE);
            let mut alloc = null_mut();
            rt!(cudaGraphAddMemAllocNode(
                &mut alloc,
                graph,
                deps.as_ptr(),
                deps.len(),
                &mut params
            ));
            let p = params.dptr;
            let fill = add_kernel(
                graph,
                &[alloc],
                k.fill_u32,
                N,
                Args::new().ptr(p).u64(N as u64).u32(value),
            );
            let sum = add_kernel(
                graph,
                &[fill],
                k.sum_u32,
                N,
                Args::new().ptr(p).u64(N as u64).ptr(sum_at(i)),
            );
            let mut free = null_mut();
            rt!(cudaGraphAddMemFreeNode(&mut free, graph, &sum, 1, p));
            (p as usize, free)
        };

        let (p1, free1) = life(&[], 1, 0);
        // (2) depends on free (1): it may reuse (1)'s address.
        let (p2, _free2) = life(&[free1], 2, 1);
        // (3) depends on free (1) but not on free (2): its lifetime overlaps (2)'s.
        let (p3, _free3) = life(&[free1], 3, 2);

        let reuse = |p: usize| {
            if p == p1 {
                "reuses alloc1's address"
            } else {
                "new address"
            }
        };
        println!(
            "G.4.1 addresses: alloc1 {p1:#x}, alloc2 {p2:#x} ({}), alloc3 {p3:#x} ({})",
            reuse(p2),
            reuse(p3)
        );
        // The guide says CUDA *can* reuse the address; the CUDA 13 driver (580) on an H200 does,
        // so it is asserted: a change here is a change in CUDA's behaviour worth knowing about.
        assert_eq!(
            p2, p1,
            "alloc 2, ordered after free 1, reuses alloc 1's address"
        );
        assert!(
            p3 + SIZE <= p2 || p2 + SIZE <= p3,
            "alloc 3 [{p3:#x}, +{SIZE}) overlaps alloc 2 [{p2:#x}, +{SIZE}) though their lifetimes overlap"
        );

        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        rt!(cudaGraphLaunch(exec, stream));
        rt!(cudaStreamSynchronize(stream));
        let got = sums.read_u64();
        let n = N as u64;
        assert_eq!(
            got,
            vec![n, 2 * n, 3 * n],
            "G.4.1 sums of the three allocations"
        );

        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaStreamDestroy(stream));
    }
}

// ---------------------------------------------------------------------------------------------
// G.5.1 First Launch / cudaGraphUpload
// ---------------------------------------------------------------------------------------------

/// G.5.1: `cudaGraphUpload` maps the graph's memory ahead of the first launch and binds it to the
/// upload stream; launching into the same stream then runs it. Checks that the mapped footprint
/// (`cudaGraphMemAttrUsedMemCurrent`) grows by at least the allocation at the upload, before any
/// launch, and the kernels' output on two launches.
#[test]
#[ignore = "needs a GPU"]
fn g5_1_upload_then_launch_same_stream() {
    const TEST: &str = "g5_1_upload_then_launch_same_stream";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let out = DeviceBuffer::zeroed(SIZE);
    let stream = new_stream();
    const BASE: u32 = 77;

    // SAFETY: handles are created before use and destroyed once; the allocation is used only
    // between its alloc and free nodes.
    unsafe {
        let mut graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut graph, 0));
        let mut params = alloc_node_params(0, SIZE);
        let mut alloc = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc,
            graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;
        let fill = add_kernel(
            graph,
            &[alloc],
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
        );
        let copy = add_kernel(
            graph,
            &[fill],
            k.copy_u32,
            N,
            Args::new().ptr(out.ptr()).ptr(dptr).u64(N as u64),
        );
        let mut free = null_mut();
        rt!(cudaGraphAddMemFreeNode(&mut free, graph, &copy, 1, dptr));

        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        // Nothing else holds graph memory (tests are serialized and free what they make).
        rt!(cudaDeviceSynchronize());
        rt!(cudaDeviceGraphMemTrim(0));
        let before = GraphMem::query(0);
        rt!(cudaGraphUpload(exec, stream));
        rt!(cudaStreamSynchronize(stream));
        let after = GraphMem::query(0);
        println!("G.5.1 before cudaGraphUpload: {before}; after: {after}");
        // The upload maps the graph's memory before any launch.
        assert!(
            after.used_current >= before.used_current + SIZE as u64,
            "cudaGraphUpload maps the allocation: before {before}, after {after}"
        );
        for _ in 0..2 {
            rt!(cudaGraphLaunch(exec, stream));
            rt!(cudaStreamSynchronize(stream));
            assert_iota(&out.read_u32(), BASE, "G.5.1 launch after upload");
            out.zero();
        }

        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaStreamDestroy(stream));
    }
}

// ---------------------------------------------------------------------------------------------
// G.4.1 footprint, G.4.2 Physical Memory Management and Sharing, G.6 Physical Memory Footprint
// ---------------------------------------------------------------------------------------------

/// The footprint checks, in one test because graph memory is process-wide:
///
/// 1. G.4.1: one graph chaining 16 × (alloc 64 MiB → fill → sum → free), each alloc after the
///    previous free, uses one address and maps 64 MiB (`cudaGraphMemAttrUsedMemCurrent` and its
///    high mark).
/// 2. G.4.2: 8 graphs of alloc 64 MiB → fill → sum → free, all instantiated and launched into one
///    stream, use 64 MiB (used high == 64 MiB; reserved printed).
/// 3. G.6: after destroying them the pool keeps its memory (reserved > 0); `cudaDeviceGraphMemTrim`
///    returns it (reserved and used current == 0); resetting the high marks with
///    `cudaDeviceSetGraphMemAttribute` brings them to 0; trim spares an allocation still live
///    (not freed by its graph) and releases it once it is freed.
///
/// Each step's figures are printed before its assertions.
#[test]
#[ignore = "needs a GPU"]
fn footprint_g4_g6() {
    const TEST: &str = "footprint_g4_g6";
    let Some(_gpu) = require_gpu(TEST) else {
        return;
    };
    let _serial = serial();
    let k = setup();
    let stream = new_stream();
    let big = BIG as u64;

    // SAFETY: handles are created before use and destroyed once; each allocation is used only
    // between its alloc and free nodes (or, for step 4, until cudaFreeAsync).
    unsafe {
        trim_and_reset_highs();
        let start = GraphMem::query(0);
        println!("footprint at start (after trim): {start}");
        assert_eq!(
            start.used_current, 0,
            "graph memory still mapped at start: {start}"
        );
        assert_eq!(
            start.reserved_current, 0,
            "graph memory still reserved at start: {start}"
        );

        // 1. G.4.1: a chain of 16 allocations in one graph.
        const CHAIN: usize = 16;
        let sums = DeviceBuffer::zeroed(CHAIN * 8);
        let mut graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut graph, 0));
        let mut prev_free: Option<cudaGraphNode_t> = None;
        let mut addresses = Vec::new();
        for i in 0..CHAIN {
            let deps: Vec<cudaGraphNode_t> = prev_free.into_iter().collect();
            let mut params = alloc_node_params(0, BIG);
            let mut alloc = null_mut();
            rt!(cudaGraphAddMemAllocNode(
                &mut alloc,
                graph,
                deps.as_ptr(),
                deps.len(),
                &mut params
            ));
            let p = params.dptr;
            addresses.push(p as usize);
            let out = sums.ptr().cast::<u64>().add(i).cast::<c_void>();
            let fill = add_kernel(
                graph,
                &[alloc],
                k.fill_u32,
                BIG_N,
                Args::new().ptr(p).u64(BIG_N as u64).u32(i as u32 + 1),
            );
            let sum = add_kernel(
                graph,
                &[fill],
                k.sum_u32,
                BIG_N,
                Args::new().ptr(p).u64(BIG_N as u64).ptr(out),
            );
            let mut free = null_mut();
            rt!(cudaGraphAddMemFreeNode(&mut free, graph, &sum, 1, p));
            prev_free = Some(free);
        }
        let mut distinct = addresses.clone();
        distinct.sort_unstable();
        distinct.dedup();
        println!(
            "G.4.1 chain: {CHAIN} allocations of 64 MiB use {} distinct address(es): {:#x?}",
            distinct.len(),
            distinct
        );
        // As in g4_1_address_reuse_within_graph: each alloc after the previous free reuses its
        // address (observed with the CUDA 13 driver on an H200; the guide says it can).
        assert_eq!(distinct.len(), 1, "G.4.1 chain reuses one address");
        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        rt!(cudaGraphLaunch(exec, stream));
        rt!(cudaStreamSynchronize(stream));
        let chain = GraphMem::query(0);
        println!("G.4.1 chain of {CHAIN} x 64 MiB, after launch: {chain}");
        let expected: Vec<u64> = (1..=CHAIN as u64).map(|v| v * BIG_N as u64).collect();
        assert_eq!(sums.read_u64(), expected, "G.4.1 chain sums");
        assert_eq!(chain.used_current, big, "G.4.1 chain maps 64 MiB: {chain}");
        assert_eq!(chain.used_high, big, "G.4.1 chain high mark: {chain}");
        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        drop(sums);
        trim_and_reset_highs();

        // 2. G.4.2: 8 graphs in one stream share physical memory.
        const GRAPHS: usize = 8;
        let sums = DeviceBuffer::zeroed(GRAPHS * 8);
        let mut graphs = Vec::new();
        let mut execs = Vec::new();
        for i in 0..GRAPHS {
            let mut graph: cudaGraph_t = null_mut();
            rt!(cudaGraphCreate(&mut graph, 0));
            let mut params = alloc_node_params(0, BIG);
            let mut alloc = null_mut();
            rt!(cudaGraphAddMemAllocNode(
                &mut alloc,
                graph,
                null(),
                0,
                &mut params
            ));
            let p = params.dptr;
            let out = sums.ptr().cast::<u64>().add(i).cast::<c_void>();
            let fill = add_kernel(
                graph,
                &[alloc],
                k.fill_u32,
                BIG_N,
                Args::new().ptr(p).u64(BIG_N as u64).u32(i as u32 + 1),
            );
            let sum = add_kernel(
                graph,
                &[fill],
                k.sum_u32,
                BIG_N,
                Args::new().ptr(p).u64(BIG_N as u64).ptr(out),
            );
            let mut free = null_mut();
            rt!(cudaGraphAddMemFreeNode(&mut free, graph, &sum, 1, p));
            let mut exec: cudaGraphExec_t = null_mut();
            rt!(cudaGraphInstantiate(&mut exec, graph, 0));
            graphs.push(graph);
            execs.push(exec);
        }
        for &exec in &execs {
            rt!(cudaGraphLaunch(exec, stream));
        }
        rt!(cudaStreamSynchronize(stream));
        let shared = GraphMem::query(0);
        println!("G.4.2 {GRAPHS} graphs x 64 MiB launched in one stream: {shared}");
        let expected: Vec<u64> = (1..=GRAPHS as u64).map(|v| v * BIG_N as u64).collect();
        assert_eq!(sums.read_u64(), expected, "G.4.2 sums");
        assert_eq!(
            shared.used_high, big,
            "G.4.2: graphs in one stream share 64 MiB: {shared}"
        );

        // 3. G.6: destroying keeps the memory reserved; trim returns it.
        for exec in execs {
            rt!(cudaGraphExecDestroy(exec));
        }
        for graph in graphs {
            rt!(cudaGraphDestroy(graph));
        }
        drop(sums);
        rt!(cudaDeviceSynchronize());
        let destroyed = GraphMem::query(0);
        println!("G.6 after destroying the graphs, before trim: {destroyed}");
        assert!(
            destroyed.reserved_current > 0,
            "G.6: the pool keeps its memory until trimmed: {destroyed}"
        );
        rt!(cudaDeviceGraphMemTrim(0));
        let trimmed = GraphMem::query(0);
        println!("G.6 after cudaDeviceGraphMemTrim: {trimmed}");
        assert_eq!(
            trimmed.reserved_current, 0,
            "G.6: trim returns all memory: {trimmed}"
        );
        assert_eq!(
            trimmed.used_current, 0,
            "G.6: nothing mapped after trim: {trimmed}"
        );
        trim_and_reset_highs();
        let reset = GraphMem::query(0);
        println!("G.6 after resetting the high marks: {reset}");
        assert_eq!(
            (reset.used_high, reset.reserved_high),
            (0, 0),
            "G.6 high marks reset: {reset}"
        );

        // 4. G.6: trim spares memory in active use (an allocation not yet freed).
        let mut alloc_graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut alloc_graph, 0));
        let mut params = alloc_node_params(0, BIG);
        let mut alloc = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc,
            alloc_graph,
            null(),
            0,
            &mut params
        ));
        let p = params.dptr;
        add_kernel(
            alloc_graph,
            &[alloc],
            k.fill_u32,
            BIG_N,
            Args::new().ptr(p).u64(BIG_N as u64).u32(9),
        );
        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, alloc_graph, 0));
        rt!(cudaGraphLaunch(exec, stream));
        rt!(cudaStreamSynchronize(stream));
        rt!(cudaDeviceGraphMemTrim(0));
        let live = GraphMem::query(0);
        println!("G.6 trim with a live 64 MiB allocation: {live}");
        assert!(
            live.reserved_current >= big && live.used_current >= big,
            "G.6: trim spares live allocations: {live}"
        );
        let first = read_u32(p, 16);
        assert_all(&first, 9, "G.6 live allocation survives trim");
        rt!(cudaFreeAsync(p, stream));
        rt!(cudaStreamSynchronize(stream));
        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(alloc_graph));
        rt!(cudaDeviceGraphMemTrim(0));
        let end = GraphMem::query(0);
        println!("G.6 after freeing, destroying and trimming: {end}");
        assert_eq!(
            end.reserved_current, 0,
            "G.6: all returned at the end: {end}"
        );

        rt!(cudaStreamDestroy(stream));
    }
}

// ---------------------------------------------------------------------------------------------
// G.7 Peer Access (two GPUs)
// ---------------------------------------------------------------------------------------------

/// Whether devices `a` and `b` can access each other's memory; when not, reports it through
/// `cannot_run` (a printed skip, or a panic under `CUDA_GRAPH_REQUIRE_GPU=1`).
fn peers_or_skip(test: &str, a: i32, b: i32) -> bool {
    let (mut ab, mut ba) = (0, 0);
    // SAFETY: valid out-pointers; both devices exist (require_gpus passed).
    unsafe {
        rt!(cudaDeviceCanAccessPeer(&mut ab, a, b));
        rt!(cudaDeviceCanAccessPeer(&mut ba, b, a));
    }
    if ab == 0 || ba == 0 {
        cannot_run(
            test,
            &format!("devices {a} and {b} cannot access each other's memory"),
        );
        return false;
    }
    true
}

/// G.7.1: an allocation resident on device 1 (first as the guide's plain allocation, then with
/// access descriptors for device 0, and device 2 when there is one), written and copied out by
/// kernel nodes that run on device 0. Checks the node's parameters read back and the data.
/// Needs two GPUs (listed in `ci/needs-two-gpus.txt`); skips with a printed reason otherwise, or
/// fails under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[test]
#[ignore = "needs a GPU"]
fn g7_1_peer_access_graph_node_api() {
    const TEST: &str = "g7_1_peer_access_graph_node_api";
    let Some(gpu) = require_gpus(TEST, 2) else {
        return;
    };
    let _serial = serial();
    if !peers_or_skip(TEST, 0, 1) {
        return;
    }
    let k = setup();
    let out0 = DeviceBuffer::zeroed(SIZE); // on device 0
    let stream = new_stream(); // on device 0
    const BASE: u32 = 4242;

    // SAFETY: handles are created before use and destroyed once; device 0 accesses the device-1
    // allocation only through the access the node requested, between its alloc and free nodes.
    unsafe {
        let mut graph: cudaGraph_t = null_mut();
        rt!(cudaGraphCreate(&mut graph, 0));

        let mut params = alloc_node_params(1, SIZE); // specify device 1 as the resident device
        // allocate an allocation resident on device 1 accessible from device 1
        let mut plain_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut plain_node,
            graph,
            null(),
            0,
            &mut params
        ));
        let mut plain_free = null_mut();
        rt!(cudaGraphAddMemFreeNode(
            &mut plain_free,
            graph,
            &plain_node,
            1,
            params.dptr
        ));

        // boilerplate for the access descs (only ReadWrite and Device access supported by the add
        // node api); access requested for device 0 (and 2 when present). Device 1 is implicit.
        let mut peers = vec![0];
        if gpu.runtime_devices > 2 {
            peers.push(2);
        }
        let access_descs: Vec<cudaMemAccessDesc> = peers
            .iter()
            .map(|&id| cudaMemAccessDesc {
                location: cudaMemLocation {
                    type_: cudaMemLocationType::cudaMemLocationTypeDevice,
                    id,
                },
                flags: cudaMemAccessFlags::cudaMemAccessFlagsProtReadWrite,
            })
            .collect();
        params.accessDescCount = access_descs.len();
        params.accessDescs = access_descs.as_ptr();

        // allocate an allocation resident on device 1 accessible from devices 0, 1 (and 2).
        let mut alloc_node = null_mut();
        rt!(cudaGraphAddMemAllocNode(
            &mut alloc_node,
            graph,
            null(),
            0,
            &mut params
        ));
        let dptr = params.dptr;

        let mut back = cudaMemAllocNodeParams::default();
        rt!(cudaGraphMemAllocNodeGetParams(alloc_node, &mut back));
        assert_eq!(back.poolProps.location.id, 1, "resident device");
        assert_eq!(
            back.accessDescCount,
            peers.len(),
            "access descriptors kept by the node"
        );
        let ids: Vec<i32> = (0..back.accessDescCount)
            .map(|i| (*back.accessDescs.add(i)).location.id)
            .collect();
        println!("G.7.1 allocation on device 1 at {dptr:p}, peer access for devices {ids:?}");
        assert_eq!(ids, peers);

        // Kernel nodes created with device 0 current run on device 0.
        rt!(cudaSetDevice(0));
        let write = add_kernel(
            graph,
            &[alloc_node],
            k.iota_u32,
            N,
            Args::new().ptr(dptr).u64(N as u64).u32(BASE),
        );
        let copy = add_kernel(
            graph,
            &[write],
            k.copy_u32,
            N,
            Args::new().ptr(out0.ptr()).ptr(dptr).u64(N as u64),
        );
        let mut free = null_mut();
        rt!(cudaGraphAddMemFreeNode(&mut free, graph, &copy, 1, dptr));

        let mut exec: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec, graph, 0));
        rt!(cudaGraphLaunch(exec, stream));
        rt!(cudaStreamSynchronize(stream));
        assert_iota(&out0.read_u32(), BASE, "G.7.1 device 0 through peer access");

        rt!(cudaGraphExecDestroy(exec));
        rt!(cudaGraphDestroy(graph));
        rt!(cudaStreamDestroy(stream));
    }
}

/// G.7.2: peer access recorded at capture time. `cudaMallocFromPoolAsync` from a pool on device 0
/// is captured into graph 1; then the pool gains access for device 1 (`cudaMemPoolSetAccess`);
/// a second capture makes graph 2. Graph 1's alloc node has no access for device 1, graph 2's has.
/// Graph 2 is launched, device 1 writes the allocation, device 0 reads it back, and
/// `cudaFreeAsync` frees it. Needs two GPUs (listed in `ci/needs-two-gpus.txt`); skips with a
/// printed reason otherwise, or fails under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[test]
#[ignore = "needs a GPU"]
fn g7_2_peer_access_stream_capture() {
    const TEST: &str = "g7_2_peer_access_stream_capture";
    let Some(_gpu) = require_gpus(TEST, 2) else {
        return;
    };
    let _serial = serial();
    if !peers_or_skip(TEST, 0, 1) {
        return;
    }
    let k = setup();
    let stream = new_stream(); // on device 0
    let global = cudaStreamCaptureMode::cudaStreamCaptureModeGlobal;
    const BASE: u32 = 123;

    // SAFETY: handles are created before use and destroyed once; device 1 accesses dptr2 only
    // after graph 2 mapped it for device 1, and before cudaFreeAsync.
    unsafe {
        // let memPool be resident and accessible on device 0
        let pool_props = cudaMemPoolProps {
            allocType: cudaMemAllocationType::cudaMemAllocationTypePinned,
            location: cudaMemLocation {
                type_: cudaMemLocationType::cudaMemLocationTypeDevice,
                id: 0,
            },
            ..Default::default()
        };
        let mut mem_pool: cudaMemPool_t = null_mut();
        rt!(cudaMemPoolCreate(&mut mem_pool, &pool_props));

        let access_desc = cudaMemAccessDesc {
            location: cudaMemLocation {
                type_: cudaMemLocationType::cudaMemLocationTypeDevice,
                id: 1,
            },
            flags: cudaMemAccessFlags::cudaMemAccessFlagsProtReadWrite,
        };

        let (mut dptr1, mut dptr2): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let (mut graph1, mut graph2): (cudaGraph_t, cudaGraph_t) = (null_mut(), null_mut());
        rt!(cudaStreamBeginCapture(stream, global));
        rt!(cudaMallocFromPoolAsync(&mut dptr1, SIZE, mem_pool, stream));
        rt!(cudaStreamEndCapture(stream, &mut graph1));

        rt!(cudaMemPoolSetAccess(mem_pool, &access_desc, 1));

        rt!(cudaStreamBeginCapture(stream, global));
        rt!(cudaMallocFromPoolAsync(&mut dptr2, SIZE, mem_pool, stream));
        rt!(cudaStreamEndCapture(stream, &mut graph2));

        // The node allocating dptr1 has device 0 access only; the one allocating dptr2 has device 0
        // and device 1 access, the pool's access when it was captured.
        let peer_ids = |graph: cudaGraph_t| -> Vec<i32> {
            let mut count = 1usize;
            let mut node: cudaGraphNode_t = null_mut();
            rt!(cudaGraphGetNodes(graph, &mut node, &mut count));
            assert_eq!(
                count, 1,
                "a capture of one cudaMallocFromPoolAsync has one node"
            );
            let mut p = cudaMemAllocNodeParams::default();
            rt!(cudaGraphMemAllocNodeGetParams(node, &mut p));
            (0..p.accessDescCount)
                .map(|i| (*p.accessDescs.add(i)).location.id)
                .collect()
        };
        let (ids1, ids2) = (peer_ids(graph1), peer_ids(graph2));
        println!("G.7.2 access of graph 1's allocation: {ids1:?}; of graph 2's: {ids2:?}");
        assert!(
            !ids1.contains(&1),
            "graph 1 captured before the pool gained device 1 access"
        );
        assert!(
            ids2.contains(&1),
            "graph 2 captured after the pool gained device 1 access"
        );

        let mut exec2: cudaGraphExec_t = null_mut();
        rt!(cudaGraphInstantiate(&mut exec2, graph2, 0));
        rt!(cudaGraphLaunch(exec2, stream));
        rt!(cudaStreamSynchronize(stream));

        // Device 1 writes the device-0 allocation through the mapping graph 2 made.
        rt!(cudaSetDevice(1));
        let stream1 = new_stream();
        launch(
            k.iota_u32,
            N,
            Args::new().ptr(dptr2).u64(N as u64).u32(BASE),
            stream1,
        );
        rt!(cudaStreamSynchronize(stream1));
        rt!(cudaStreamDestroy(stream1));
        rt!(cudaSetDevice(0));
        assert_iota(&read_u32(dptr2, N), BASE, "G.7.2 written by device 1");

        rt!(cudaFreeAsync(dptr2, stream));
        rt!(cudaStreamSynchronize(stream));
        rt!(cudaGraphExecDestroy(exec2));
        rt!(cudaGraphDestroy(graph1)); // never instantiated: nothing was allocated
        rt!(cudaGraphDestroy(graph2));
        rt!(cudaMemPoolDestroy(mem_pool));
        rt!(cudaStreamDestroy(stream));
    }
}
