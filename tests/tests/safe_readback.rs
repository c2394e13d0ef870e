//! Reading graphs back from the driver (`Graph::node_params`, `node_type`, `dependencies`,
//! `dependents`, `root_nodes`, `driver_nodes`) on a GPU: what the real driver reports for an
//! explicit graph (G.3.1) and for a captured one (G.3.2), checked against what was built or
//! captured, and the graphs' results checked too. `readback_stub.rs` checks the crate's side of
//! the same calls without a GPU.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use cuda_graph::sys::{self, CUgraphNodeType as T, CUmemorytype as M};
use cuda_graph::{
    AllocParams, AsStream, CaptureMode, DeviceAddress, DeviceBuffer, DriverNode, Graph,
    InstantiateFlags, KernelArgs, Node, NodeKind, NodeParams, Stream, capture,
};
use safe_common::{BYTES, N, assert_no_drop_errors, config, gpu};

/// The record's nodes as the driver's answers name them.
fn recorded(nodes: &[Node]) -> Vec<DriverNode> {
    nodes.iter().copied().map(DriverNode::Recorded).collect()
}

/// Asserts that the driver's nodes are `nodes`, in order, form a chain from the first (the one
/// root) to the last, and that each node's dependencies and dependents say so.
#[track_caller]
fn assert_chain(graph: &Graph, nodes: &[Node]) {
    assert_eq!(graph.driver_nodes().unwrap(), recorded(nodes));
    assert_eq!(graph.root_nodes().unwrap(), recorded(&nodes[..1]));
    for (i, &node) in nodes.iter().enumerate() {
        let before = if i == 0 { &[][..] } else { &nodes[i - 1..i] };
        let after = nodes.get(i + 1..i + 2).unwrap_or(&[]);
        assert_eq!(
            graph.dependencies(node).unwrap(),
            recorded(before),
            "dependencies of node {i}"
        );
        assert_eq!(
            graph.dependents(node).unwrap(),
            recorded(after),
            "dependents of node {i}"
        );
    }
}

/// The alloc node's parameters: the allocation's address and size, pinned memory resident on
/// `ordinal`, and no peer access.
#[track_caller]
fn assert_alloc(params: NodeParams, address: sys::CUdeviceptr, bytes: usize, ordinal: usize) {
    let NodeParams::MemAlloc(a) = params else {
        panic!("not an alloc node: {params:?}")
    };
    assert_eq!((a.address, a.bytes), (address, bytes), "{a:?}");
    assert_eq!(
        a.allocation_type,
        sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        "{a:?}"
    );
    assert_eq!(
        (a.location.type_, a.location.id),
        (
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            ordinal as i32
        ),
        "{a:?}"
    );
    assert!(a.peer_access.is_empty(), "{a:?}");
}

/// G.3.1's shape, read back: alloc → iota kernel → 2-D memset → memcpy out → free. The driver
/// reports the alloc node's address and size as the `GraphAllocation`'s (pinned, on device 0,
/// no peers), the kernel's function, grid, block and shared memory as built, the memset's
/// value, element size, width, height and pitch, the copy's device addresses and extent, the
/// free node's address, and the chain of edges. Launched, the output is the iota with the
/// memset's rows over it.
#[test]
#[ignore = "needs a GPU"]
fn explicit_graph_reads_back_what_was_built() {
    let Some(g) = gpu("explicit_graph_reads_back_what_was_built") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N).with_shared_mem_bytes(128);

    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("buf"))
        .unwrap();
    // SAFETY: iota_u32(u32*, u64, u32) over the N values of `buf`, after its alloc node (the
    // dynamic shared memory is not used by the kernel).
    let kernel = unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            cfg,
            &KernelArgs::new().ptr(&buf).value(N).value(5u32),
        )
    }
    .unwrap();
    // 4 rows of 16 u32, 256 bytes (64 values) apart.
    let memset = graph
        .add_memset_node_2d(&[kernel], &buf, 0xFFFF_FFFFu32, 16, 4, 256)
        .unwrap();
    let copy = graph.add_memcpy_node(&[memset], &out, &buf, BYTES).unwrap();
    let free = graph.add_mem_free_node(&[copy], &buf).unwrap();
    let nodes = [alloc, kernel, memset, copy, free];

    let types = [
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        T::CU_GRAPH_NODE_TYPE_KERNEL,
        T::CU_GRAPH_NODE_TYPE_MEMSET,
        T::CU_GRAPH_NODE_TYPE_MEMCPY,
        T::CU_GRAPH_NODE_TYPE_MEM_FREE,
    ];
    for (&node, ty) in nodes.iter().zip(types) {
        assert_eq!(graph.node_type(node).unwrap(), ty);
    }
    assert_alloc(
        graph.node_params(alloc).unwrap(),
        buf.ptr(),
        buf.bytes(),
        device.ordinal(),
    );
    assert_eq!(buf.bytes(), BYTES);

    let params = graph.node_params(kernel).unwrap();
    let NodeParams::Kernel(k) = params else {
        panic!("not a kernel node: {params:?}")
    };
    assert_eq!(k.function, g.k.iota.as_raw(), "{k:?}");
    assert_eq!(k.config, cfg, "{k:?}");

    let params = graph.node_params(memset).unwrap();
    let NodeParams::Memset(m) = params else {
        panic!("not a memset node: {params:?}")
    };
    assert_eq!(
        (m.dst, m.value, m.element_size),
        (buf.ptr(), 0xFFFF_FFFF, 4),
        "{m:?}"
    );
    assert_eq!((m.width, m.height, m.pitch), (16, 4, 256), "{m:?}");

    let params = graph.node_params(copy).unwrap();
    let NodeParams::Memcpy(c) = params else {
        panic!("not a memcpy node: {params:?}")
    };
    assert_eq!(
        (c.src.memory_type, c.src.address),
        (M::CU_MEMORYTYPE_DEVICE, buf.ptr()),
        "{c:?}"
    );
    assert_eq!(
        (c.dst.memory_type, c.dst.address),
        (M::CU_MEMORYTYPE_DEVICE, out.device_ptr()),
        "{c:?}"
    );
    assert_eq!(c.extent, (BYTES, 1, 1), "{c:?}");

    assert_eq!(
        graph.node_params(free).unwrap(),
        NodeParams::MemFree { address: buf.ptr() }
    );
    assert_chain(&graph, &nodes);

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    for (i, &v) in got.iter().enumerate() {
        let in_memset = i < 4 * 64 && i % 64 < 16;
        let want = if in_memset { 0xFFFF_FFFF } else { 5 + i as u32 };
        assert_eq!(v, want, "element {i}");
    }
    // Read back after instantiation too: the graph is unchanged.
    assert_eq!(
        graph.node_params(free).unwrap(),
        NodeParams::MemFree { address: buf.ptr() }
    );
    drop(exec);
    drop(graph);
    device.synchronize().unwrap();
    assert_no_drop_errors(device);
}

/// G.3.2's shape on one stream, read back: `malloc_async`, a fill kernel, `memset_async` of the
/// first 16 values, a copy kernel to `out`, `free_async`. The driver lists the captured nodes
/// in the record's order, as a chain; the alloc node's address and size are the captured
/// `GraphAllocation`'s (pinned, on device 0, no peers), the kernels' functions and shapes the
/// launches', the memset's value, element size, width and height the call's, and the free
/// node's address the allocation's. Launched, `out` holds the memset's values, then the fill's.
#[test]
#[ignore = "needs a GPU"]
fn captured_graph_reads_back_what_was_captured() {
    let Some(g) = gpu("captured_graph_reads_back_what_was_captured") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);
    let (graph, a) = capture(&stream, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        // SAFETY: fill_u32(u32*, u64, u32) and copy_u32(u32*, const u32*, u64) over the N values
        // of `a` and `out`.
        unsafe {
            cap.launch(
                &g.k.fill,
                cfg,
                &KernelArgs::new().ptr(&a).value(N).value(3u32),
            )?
        };
        cap.memset_async(&a, 9u32, 16)?;
        // SAFETY: as above.
        unsafe {
            cap.launch(
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out).ptr(&a).value(N),
            )?
        };
        cap.free_async(&a)?;
        Ok(a)
    })
    .unwrap();

    let nodes: Vec<Node> = graph
        .driver_nodes()
        .unwrap()
        .into_iter()
        .map(|n| n.recorded().expect("every captured node is in the record"))
        .collect();
    let kinds: Vec<&NodeKind> = nodes
        .iter()
        .map(|n| graph.node(*n).unwrap().kind())
        .collect();
    println!("captured nodes: {kinds:?}");
    assert_eq!(nodes.len(), 5, "{kinds:?}");
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(node.index(), i, "the driver's order is the record's");
        assert_eq!(node.graph_id(), graph.id());
    }
    let [alloc, fill, memset, copy, free] = nodes[..] else {
        unreachable!()
    };
    assert_eq!(*kinds[0], NodeKind::MemAlloc);
    assert!(matches!(kinds[1], NodeKind::Kernel(_)), "{kinds:?}");
    assert_eq!(*kinds[2], NodeKind::Memset);
    assert!(matches!(kinds[3], NodeKind::Kernel(_)), "{kinds:?}");
    assert_eq!(*kinds[4], NodeKind::MemFree);

    assert_alloc(
        graph.node_params(alloc).unwrap(),
        a.ptr(),
        a.bytes(),
        device.ordinal(),
    );
    assert_eq!(a.bytes(), BYTES);
    for (node, function) in [(fill, &g.k.fill), (copy, &g.k.copy)] {
        let params = graph.node_params(node).unwrap();
        let NodeParams::Kernel(k) = params else {
            panic!("not a kernel node: {params:?}")
        };
        assert_eq!(k.function, function.as_raw(), "{k:?}");
        assert_eq!(
            (k.config.grid, k.config.block),
            (cfg.grid, cfg.block),
            "{k:?}"
        );
        assert_eq!(k.config.shared_mem_bytes, 0, "{k:?}");
    }
    let params = graph.node_params(memset).unwrap();
    let NodeParams::Memset(m) = params else {
        panic!("not a memset node: {params:?}")
    };
    assert_eq!((m.dst, m.value, m.element_size), (a.ptr(), 9, 4), "{m:?}");
    assert_eq!((m.width, m.height), (16, 1), "{m:?}");
    assert_eq!(
        graph.node_params(free).unwrap(),
        NodeParams::MemFree { address: a.ptr() }
    );
    assert_chain(&graph, &nodes);

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, if i < 16 { 9 } else { 3 }, "element {i}");
    }
    drop(exec);
    drop(graph);
    device.synchronize().unwrap();
    assert_no_drop_errors(device);
}
