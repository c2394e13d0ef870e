//! G.7 in the safe layer: peer access to graph allocations, from the access list of an alloc node
//! (G.7.1) and from a memory pool's access at the moment a capture allocates from it (G.7.2).
//!
//! These need two devices that can map each other's memory, and are listed in
//! `ci/needs-two-gpus.txt`. With fewer, each test prints `SKIPPED <test>: needs 2 GPUs ...` and
//! returns, or, under `CUDA_GRAPH_REQUIRE_GPU=1`, fails; `ci/gpu-run.sh` excludes them by name on a
//! machine with one GPU and reports them as not run. Without any GPU they skip like the other
//! safe_ tests.

mod safe_common;

use cuda_graph::{
    Access, AllocParams, AsStream, CaptureMode, DeviceBuffer, Graph, InstantiateFlags, KernelArgs,
    MemPool, Stream, capture, sys,
};
use safe_common::{BYTES, Kernels, N, assert_iota, config, gpus};

/// The devices (by ordinal) that the alloc node of `graph` maps its allocation for, from the
/// driver's own record (`cuGraphMemAllocNodeGetParams`): the resident device first.
fn alloc_node_access(graph: &Graph) -> Vec<i32> {
    let raw = graph.as_raw();
    let mut count = 0;
    // SAFETY: a null array asks for the node count; the graph is live.
    let status = unsafe { sys::cuGraphGetNodes(raw, std::ptr::null_mut(), &mut count) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` entries.
    let status = unsafe { sys::cuGraphGetNodes(raw, nodes.as_mut_ptr(), &mut count) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    for node in nodes {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: the node belongs to the live graph; `kind` is a valid out-pointer.
        let status = unsafe { sys::cuGraphNodeGetType(node, &mut kind) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            continue;
        }
        let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS::default();
        // SAFETY: an alloc node; `params` is a valid out-pointer.
        let status = unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut params) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        let mut devices = vec![params.poolProps.location.id];
        if params.accessDescCount > 0 && !params.accessDescs.is_null() {
            // SAFETY: the driver returns `accessDescCount` descriptors, valid while the node is.
            let descs =
                unsafe { std::slice::from_raw_parts(params.accessDescs, params.accessDescCount) };
            devices.extend(descs.iter().map(|d| d.location.id));
        }
        return devices;
    }
    panic!("the graph has no alloc node");
}

/// G.7.1: an allocation resident on device 0 with device 1 in its access list. The graph fills it
/// on device 0 and leaves it live; a kernel on device 1 copies it into device-1 memory; device 0
/// frees it.
#[test]
#[ignore = "needs a GPU"]
fn g7_1_alloc_node_with_peer_access() {
    let Some((g, devices)) = gpus("g7_1_alloc_node_with_peer_access", 2) else {
        return;
    };
    let (dev0, dev1) = (&devices[0], &devices[1]);
    let k1 = Kernels::load(dev1);
    let stream0 = Stream::new(dev0).unwrap();
    let stream1 = Stream::new(dev1).unwrap();
    let out1 = DeviceBuffer::<u32>::zeroed(dev1, N as usize).unwrap();

    let mut graph = Graph::new(dev0).unwrap();
    let (alloc, shared) = graph
        .add_mem_alloc_node(
            &[],
            &AllocParams::new(dev0, BYTES)
                .peer_access(dev1, Access::ReadWrite)
                .label("shared"),
        )
        .unwrap();
    // SAFETY: iota_u32 over the N values of `shared`, after its alloc node, on device 0.
    unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            config(N),
            &KernelArgs::new().ptr(&shared).value(N).value(17u32),
        )
    }
    .unwrap();
    let access = alloc_node_access(&graph);
    println!("G.7.1 alloc node maps for devices {access:?}");
    assert_eq!(access, vec![0, 1]);

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream0).unwrap();
    stream0.synchronize().unwrap();
    // SAFETY: copy_u32 on device 1 from the N values of `shared` (live, mapped for device 1) into
    // `out1`.
    unsafe {
        k1.copy.launch(
            &stream1,
            config(N),
            &KernelArgs::new().ptr(&out1).ptr(&shared).value(N),
        )
    }
    .unwrap();
    stream1.synchronize().unwrap();
    assert_iota(
        &out1.to_vec().unwrap(),
        17,
        "device 1 reads device 0's graph allocation",
    );
    shared.free_async(&stream0).unwrap();
    stream0.synchronize().unwrap();
}

/// G.7.2: a capture records the pool's access when it allocates from the pool. Graph 1 is
/// captured before device 1 is granted access to the pool, graph 2 after: only graph 2's alloc
/// node maps for device 1.
#[test]
#[ignore = "needs a GPU"]
fn g7_2_pool_access_is_recorded_at_capture() {
    let Some((g, devices)) = gpus("g7_2_pool_access_is_recorded_at_capture", 2) else {
        return;
    };
    let (dev0, dev1) = (&devices[0], &devices[1]);
    let stream = Stream::new(dev0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(dev0, N as usize).unwrap();
    let pool = MemPool::new(dev0).unwrap();
    assert_eq!(pool.access(dev1).unwrap(), None);

    let capture_from_pool = |base: u32| {
        capture(&stream, CaptureMode::Global, |cap| {
            let buf = cap.malloc_from_pool_async(&pool, BYTES)?;
            // SAFETY: iota_u32 then copy_u32 over the N values of `buf` and `out`.
            unsafe {
                cap.launch(
                    &g.k.iota,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(base),
                )?;
                cap.launch(
                    &g.k.copy,
                    config(N),
                    &KernelArgs::new().ptr(&out).ptr(&buf).value(N),
                )?;
            }
            cap.free_async(&buf)
        })
        .unwrap()
        .0
    };
    let graph1 = capture_from_pool(1);
    pool.set_access(dev1, Access::ReadWrite).unwrap();
    assert_eq!(pool.access(dev1).unwrap(), Some(Access::ReadWrite));
    let graph2 = capture_from_pool(2);

    let access1 = alloc_node_access(&graph1);
    let access2 = alloc_node_access(&graph2);
    println!("G.7.2 graph 1 maps for {access1:?}, graph 2 for {access2:?}");
    assert!(
        !access1.contains(&1),
        "graph 1 was captured before the access: {access1:?}"
    );
    assert!(
        access2.contains(&1),
        "graph 2 was captured after: {access2:?}"
    );

    for (base, graph) in [(1, &graph1), (2, &graph2)] {
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_iota(&out.to_vec().unwrap(), base, &format!("graph {base}"));
    }
}
