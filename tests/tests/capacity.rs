//! Device capacity and graph memory: what happens when graphs ask for more than the device has.
//!
//! One allocation of the device's whole memory or more is refused when its node is added
//! (`soundness.rs`). Sums across allocations and graphs are not checked by the crate: what fits
//! depends on what else is allocated when a graph launches, so the driver refuses the launch
//! (`CUDA_ERROR_OUT_OF_MEMORY`). This file shows that such a refusal leaves nothing of the
//! crate's behind: after the executable graphs are dropped and graph memory is trimmed (G.6),
//! no graph memory is used, all that the successful launch reserved is released, and a new
//! graph allocates and runs.
//!
//! What the refused launch itself reserved before it failed stays reserved through every trim:
//! the driver (580, on the H200) does that with raw driver calls too, and nothing tried
//! released it (the refused graph relaunched once it fit and its allocation freed, every graph
//! destroyed, the context synchronized, the device's default pool trimmed), which
//! [`the_driver_alone_keeps_part_of_a_refused_launch_reserved`] shows. When a driver releases it,
//! that test fails, and the first test can then ask for reserved 0.

mod safe_common;

use cuda_graph::sys;
use cuda_graph::{AllocParams, Graph, InstantiateFlags, Stream};
use safe_common::{BYTES, mem_info};

/// Two graphs whose escaping allocations (no free node, G.3.3) of 60% of the device's memory
/// each cannot both be live: the second launch is refused with `CUDA_ERROR_OUT_OF_MEMORY`;
/// afterwards, with everything dropped and trimmed, graph memory is 0 used, the first launch's
/// reserve is released, and a small graph still instantiates and runs.
#[test]
#[ignore = "needs a GPU"]
fn out_of_memory_launch_leaves_no_graph_memory_behind() {
    let Some(gpu) = safe_common::gpu("out_of_memory_launch_leaves_no_graph_memory_behind") else {
        return;
    };
    let device = &gpu.device;
    let stream = Stream::new(device).unwrap();
    let total = device.total_memory().unwrap();
    let big = total / 10 * 6;
    let params = AllocParams::new(device, big);
    let mut first = Graph::new(device).unwrap();
    let (_, a) = first.add_mem_alloc_node(&[], &params).unwrap();
    let mut second = Graph::new(device).unwrap();
    let (_, b) = second.add_mem_alloc_node(&[], &params).unwrap();
    let exec_first = first.instantiate(InstantiateFlags::NONE).unwrap();
    let exec_second = second.instantiate(InstantiateFlags::NONE).unwrap();
    exec_first.launch(&stream).unwrap();
    let refused = exec_second
        .launch(&stream)
        .and_then(|()| cuda_graph::AsStream::synchronize(&stream));
    println!("second launch: {refused:?}");
    let err = refused.expect_err("two allocations of 60% of the device's memory both launched");
    assert_eq!(
        err.code(),
        Some(cuda_graph::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        "the refusal is not CUDA_ERROR_OUT_OF_MEMORY: {err}"
    );
    assert!(a.is_live(), "the first graph's allocation is not live");
    assert!(
        !b.is_live(),
        "the refused launch left its allocation marked live"
    );
    let refused_at = mem_info(device, "with the first allocation live");
    drop((exec_first, exec_second, first, second, a, b));
    cuda_graph::flush_deferred();
    device.synchronize().unwrap();
    device.graph_mem_trim().unwrap();
    let after = mem_info(device, "after the drop and a trim");
    assert_eq!(
        after.used_current.0, 0,
        "graph memory still used after the drop: {after}"
    );
    // The first graph's allocation (`big` bytes) is released; what stays is at most what the
    // refused launch reserved (see the module docs).
    assert!(
        refused_at.reserved_current.0 - after.reserved_current.0 >= big as u64,
        "the successful launch's {big} bytes are not all released: {refused_at} before the drop, {after} after it"
    );

    // The device still serves graph memory.
    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    graph.add_mem_free_node(&[alloc], &buf).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    cuda_graph::AsStream::synchronize(&stream).unwrap();
    drop((exec, graph, buf));
    device.synchronize().unwrap();
    device.graph_mem_trim().unwrap();
    let end = mem_info(device, "after a graph that followed the refusal");
    assert_eq!(end.used_current.0, 0, "graph memory still used: {end}");
    assert!(
        end.reserved_current.0 <= after.reserved_current.0,
        "the later graph's memory stayed reserved: {end}, {after} before it"
    );
    let errors = device.drop_errors();
    assert_eq!(errors.count, 0, "errors in Drop: last {:?}", errors.last);
}

/// `cuGraphCreate` + `cuGraphAddMemAllocNode` of `bytes` on device 0 (no free node) +
/// `cuGraphInstantiateWithFlags`, in raw driver calls: the graph, its executable graph and the
/// allocation's address.
///
/// # Safety
///
/// The device's context is current.
unsafe fn raw_alloc_graph(bytes: usize) -> (sys::CUgraph, sys::CUgraphExec, sys::CUdeviceptr) {
    let ok = |r: sys::CUresult, call: &str| assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{call}");
    let mut graph = std::ptr::null_mut();
    // SAFETY: out-pointers valid, the context is current (the caller's promise).
    unsafe {
        ok(sys::cuGraphCreate(&mut graph, 0), "cuGraphCreate");
        let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
        params.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        params.bytesize = bytes;
        let mut node = std::ptr::null_mut();
        ok(
            sys::cuGraphAddMemAllocNode(&mut node, graph, std::ptr::null(), 0, &mut params),
            "cuGraphAddMemAllocNode",
        );
        let mut exec = std::ptr::null_mut();
        ok(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            "cuGraphInstantiateWithFlags",
        );
        (graph, exec, params.dptr)
    }
}

/// The same refused launch in raw driver calls, without the crate: after the successful
/// allocation is freed, every graph destroyed, the context synchronized and graph memory
/// trimmed, nothing is used but part of the device's memory stays reserved (the driver's
/// behaviour the module docs describe).
#[test]
#[ignore = "needs a GPU"]
fn the_driver_alone_keeps_part_of_a_refused_launch_reserved() {
    let Some(gpu) = safe_common::gpu("the_driver_alone_keeps_part_of_a_refused_launch_reserved")
    else {
        return;
    };
    let device = &gpu.device;
    device.bind().unwrap();
    let big = device.total_memory().unwrap() / 10 * 6;
    let ok = |r: sys::CUresult, call: &str| assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{call}");
    // SAFETY: raw driver calls on the current context, each handle used while live and
    // destroyed once.
    unsafe {
        let mut stream = std::ptr::null_mut();
        ok(sys::cuStreamCreate(&mut stream, 1), "cuStreamCreate");
        let (first, exec_first, address) = raw_alloc_graph(big);
        let (second, exec_second, _) = raw_alloc_graph(big);
        ok(sys::cuGraphLaunch(exec_first, stream), "cuGraphLaunch");
        assert_eq!(
            sys::cuGraphLaunch(exec_second, stream),
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            "the second launch of 60% of the device's memory"
        );
        let refused_at = mem_info(device, "raw, after the refused launch");
        ok(sys::cuMemFreeAsync(address, stream), "cuMemFreeAsync");
        ok(sys::cuStreamSynchronize(stream), "cuStreamSynchronize");
        ok(sys::cuGraphExecDestroy(exec_first), "cuGraphExecDestroy");
        ok(sys::cuGraphExecDestroy(exec_second), "cuGraphExecDestroy");
        ok(sys::cuGraphDestroy(first), "cuGraphDestroy");
        ok(sys::cuGraphDestroy(second), "cuGraphDestroy");
        ok(sys::cuStreamDestroy_v2(stream), "cuStreamDestroy");
        ok(sys::cuCtxSynchronize(), "cuCtxSynchronize");
        ok(
            sys::cuDeviceGraphMemTrim(device.as_raw()),
            "cuDeviceGraphMemTrim",
        );
        let after = mem_info(device, "raw, after the frees, the destroys and a trim");
        assert_eq!(after.used_current.0, 0, "graph memory still used: {after}");
        assert!(
            refused_at.reserved_current.0 - after.reserved_current.0 >= big as u64,
            "the successful launch's reserve was not released: {refused_at}, then {after}"
        );
        assert!(
            after.reserved_current.0 > 0,
            "this driver releases all of a refused launch's reserve: capacity.rs's first test can now ask for reserved 0 ({after})"
        );
    }
}
