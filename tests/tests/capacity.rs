//! Device capacity and graph memory: what happens when graphs ask for more than the device has.
//!
//! One allocation of the device's whole memory or more is refused when its node is added
//! (`soundness.rs`). Sums across allocations and graphs are not checked by the crate: what fits
//! depends on what else is allocated when a graph launches, so the driver refuses the launch
//! (`CUDA_ERROR_OUT_OF_MEMORY`). This file shows that such a refusal leaves nothing behind:
//! after the executable graphs are dropped and graph memory is trimmed (G.6), the device's
//! graph memory is back to used 0 and reserved 0, and a new graph allocates and runs.

mod safe_common;

use cuda_graph::{AllocParams, Graph, InstantiateFlags, Stream};
use safe_common::{BYTES, assert_released, mem_info};

/// Two graphs whose escaping allocations (no free node, G.3.3) of 60% of the device's memory
/// each cannot both be live: the second launch is refused with `CUDA_ERROR_OUT_OF_MEMORY`;
/// afterwards, with everything dropped and trimmed, graph memory is 0 used and 0 reserved, and
/// a small graph still instantiates and runs.
#[test]
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
    mem_info(device, "with the first allocation live");
    drop((exec_first, exec_second, first, second, a, b));
    cuda_graph::flush_deferred();
    assert_released(device, "after an out-of-memory launch");

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
    assert_released(device, "after a graph that followed the refusal");
    let errors = device.drop_errors();
    assert_eq!(errors.count, 0, "errors in Drop: last {:?}", errors.last);
}
