//! Reading a graph back from the driver (`cuda-graph/src/readback.rs`: `Graph::node_params`,
//! `node_type`, `dependencies`, `dependents`, `root_nodes`, `driver_nodes`) without a GPU,
//! against the checking stub driver (`stub-driver/hunt_cuda.c`), each test in a child process
//! of its own, as in `hunt_stub.rs`.
//!
//! The stub records every node, explicit or captured, with its dependencies and the parameters
//! it was made with, and answers the Get calls from that record as the driver does (a null array
//! asks for the count; a captured node depends on the node captured before it). So these tests
//! check the crate's side exactly: that each call is made on the right node with valid
//! out-pointers (the stub reports a wrong node type, short room for a list, or an unknown
//! handle as a `HUNT ERROR`, which fails the test), that the driver's structs are translated
//! field by field, and that the driver's nodes are mapped to the record's positions. What the
//! real driver reports for the same graphs is `safe_readback.rs`'s to check, on a GPU.
//!
//! The stub is written against the CUDA 13.0 driver API, so this file holds tests only in builds
//! on 13.0 headers or newer (`tests/build.rs`).
#![cfg(cuda_graph_tests_hunt_stub)]

mod hunt_common;

use hunt_common::{hunt_errors, isolated as isolated_with};

/// Runs `body` in a child process with the stub as its driver.
fn isolated(name: &str, body: fn()) {
    isolated_with(name, &[], body);
}

use cuda_graph::sys::{self, CUgraphNodeType as T, CUmemorytype as M};
use cuda_graph::{
    Access, AllocParams, CaptureMode, Device, DeviceAddress, DeviceBuffer, DriverNode, Error,
    Graph, KernelArgs, LaunchConfig, Module, Node, NodeKind, NodeParams, Stream, capture,
};

const WORDS: usize = 1 << 10;
const BYTES: usize = WORDS * 4;

/// The record's nodes as the driver's answers name them.
fn recorded(nodes: &[Node]) -> Vec<DriverNode> {
    nodes.iter().copied().map(DriverNode::Recorded).collect()
}

/// Asserts each node's driver-side dependencies and dependents, and the graph's roots and nodes.
#[track_caller]
fn assert_edges(
    graph: &Graph,
    nodes: &[Node],
    deps: &[&[Node]],
    dependents: &[&[Node]],
    roots: &[Node],
) {
    assert_eq!(graph.driver_nodes().unwrap(), recorded(nodes));
    assert_eq!(graph.root_nodes().unwrap(), recorded(roots));
    for (i, &node) in nodes.iter().enumerate() {
        assert_eq!(
            graph.dependencies(node).unwrap(),
            recorded(deps[i]),
            "dependencies of node {i}"
        );
        assert_eq!(
            graph.dependents(node).unwrap(),
            recorded(dependents[i]),
            "dependents of node {i}"
        );
    }
}

fn explicit_graph_body() {
    let device = Device::get(0).unwrap();
    let module = Module::from_ptx(&device, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&device, WORDS).unwrap();
    let mut graph = Graph::new(&device).unwrap();
    // The stub has one device: device 0 stands in for a peer in the access list.
    let params = AllocParams::new(&device, BYTES).peer_access(&device, Access::ReadWrite);
    let (alloc, buf) = graph.add_mem_alloc_node(&[], &params).unwrap();
    let cfg = LaunchConfig::new((4, 2, 1), (64, 2, 1)).with_shared_mem_bytes(256);
    let args = KernelArgs::new().ptr(&buf).value(WORDS as u64).value(7u32);
    // SAFETY: fill_u32(u32*, u64, u32) over the WORDS values of `buf`; the stub runs nothing.
    let kernel = unsafe { graph.add_kernel_node(&[alloc], &fill, cfg, &args) }.unwrap();
    // 4 rows of 16 u16 elements, 64 bytes apart.
    let memset = graph
        .add_memset_node_2d(&[kernel], &buf, 0xABCDu16, 16, 4, 64)
        .unwrap();
    let copy = graph.add_memcpy_node(&[memset], &out, &buf, BYTES).unwrap();
    // A second dependency of the copy, added after it.
    graph.add_dependency(alloc, copy).unwrap();
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
        assert_eq!(graph.node_params(node).unwrap().node_type(), ty);
    }

    let NodeParams::MemAlloc(a) = graph.node_params(alloc).unwrap() else {
        panic!("not an alloc node")
    };
    assert_eq!((a.address, a.bytes), (buf.ptr(), BYTES));
    assert_eq!((a.address, a.bytes), (buf.ptr(), buf.bytes()));
    assert_eq!(
        a.allocation_type,
        sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
    );
    let device0 = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    assert_eq!(a.location, device0);
    assert_eq!(
        a.peer_access,
        vec![sys::CUmemAccessDesc {
            location: device0,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }]
    );

    let NodeParams::Kernel(k) = graph.node_params(kernel).unwrap() else {
        panic!("not a kernel node")
    };
    assert_eq!(k.function, fill.as_raw());
    assert!(k.kernel.is_null());
    assert_eq!(k.config, cfg);
    assert_eq!(
        (k.config.grid, k.config.block, k.config.shared_mem_bytes),
        ((4, 2, 1), (64, 2, 1), 256)
    );

    let NodeParams::Memset(m) = graph.node_params(memset).unwrap() else {
        panic!("not a memset node")
    };
    assert_eq!((m.dst, m.value, m.element_size), (buf.ptr(), 0xABCD, 2));
    assert_eq!((m.width, m.height, m.pitch), (16, 4, 64));

    let NodeParams::Memcpy(c) = graph.node_params(copy).unwrap() else {
        panic!("not a memcpy node")
    };
    for (end, address) in [(c.src, buf.ptr()), (c.dst, out.device_ptr())] {
        assert_eq!(end.memory_type, M::CU_MEMORYTYPE_DEVICE);
        assert_eq!(end.address, address);
        assert_eq!((end.offset, end.pitch, end.height), ((0, 0, 0), 0, 0));
    }
    assert_eq!(c.extent, (BYTES, 1, 1));

    assert_eq!(
        graph.node_params(free).unwrap(),
        NodeParams::MemFree { address: buf.ptr() }
    );

    assert_edges(
        &graph,
        &nodes,
        &[&[], &[alloc], &[kernel], &[memset, alloc], &[copy]],
        &[&[kernel, copy], &[memset], &[copy], &[free], &[]],
        &[alloc],
    );
    assert_eq!(hunt_errors(), 0);
}

/// An explicit graph alloc → kernel → 2-D memset → memcpy → free, with a second edge
/// alloc → memcpy added afterwards: every node's type and parameters read back exactly as built
/// (the alloc node's address, size, pool properties and peer access list; the kernel's
/// function, grid, block and shared memory; the memset's value, element size, width, height and
/// pitch; the copy's ends and extent; the free's address), and the driver's nodes, roots,
/// dependencies and dependents are the record's positions.
#[test]
fn explicit_graph_reads_back_every_node() {
    isolated("explicit_graph_reads_back_every_node", explicit_graph_body);
}

fn captured_graph_body() {
    let device = Device::get(0).unwrap();
    let module = Module::from_ptx(&device, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&device, WORDS).unwrap();
    let stream = Stream::new(&device).unwrap();
    let cfg = LaunchConfig::new((8, 1, 1), (128, 1, 1));
    let (graph, a) = capture(&stream, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        let args = KernelArgs::new().ptr(&a).value(WORDS as u64).value(3u32);
        // SAFETY: fill_u32(u32*, u64, u32) over the WORDS values of `a`; the stub runs nothing.
        unsafe { cap.launch(&fill, cfg, &args)? };
        cap.memset_async(&a, 9u32, WORDS)?;
        cap.memcpy_async(&out, &a, BYTES)?;
        cap.free_async(&a)?;
        Ok(a)
    })
    .unwrap();
    let kinds: Vec<NodeKind> = graph.nodes().iter().map(|n| n.kind().clone()).collect();
    assert_eq!(kinds.len(), 5, "{kinds:?}");

    // The driver lists the captured nodes in the record's order.
    let nodes: Vec<Node> = graph
        .driver_nodes()
        .unwrap()
        .into_iter()
        .map(|n| n.recorded().expect("every captured node is in the record"))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(node.index(), i);
        assert_eq!(node.graph_id(), graph.id());
    }
    let [alloc, kernel, memset, copy, free] = nodes[..] else {
        unreachable!()
    };

    let NodeParams::MemAlloc(p) = graph.node_params(alloc).unwrap() else {
        panic!("not an alloc node")
    };
    assert_eq!((p.address, p.bytes), (a.ptr(), a.bytes()));
    assert_eq!(p.bytes, BYTES);
    // The stub's default pool: pinned memory on device 0, no peers.
    assert_eq!(
        p.allocation_type,
        sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
    );
    assert_eq!(
        (p.location.type_, p.location.id),
        (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 0)
    );
    assert!(p.peer_access.is_empty());

    let NodeParams::Kernel(k) = graph.node_params(kernel).unwrap() else {
        panic!("not a kernel node")
    };
    assert_eq!((k.function, k.config), (fill.as_raw(), cfg));

    let NodeParams::Memset(m) = graph.node_params(memset).unwrap() else {
        panic!("not a memset node")
    };
    assert_eq!((m.dst, m.value, m.element_size), (a.ptr(), 9, 4));
    assert_eq!((m.width, m.height), (WORDS, 1));

    let NodeParams::Memcpy(c) = graph.node_params(copy).unwrap() else {
        panic!("not a memcpy node")
    };
    // The stub records cuMemcpyAsync as a copy between unified addresses.
    assert_eq!(
        (c.src.memory_type, c.src.address),
        (M::CU_MEMORYTYPE_UNIFIED, a.ptr())
    );
    assert_eq!(
        (c.dst.memory_type, c.dst.address),
        (M::CU_MEMORYTYPE_UNIFIED, out.device_ptr())
    );
    assert_eq!(c.extent, (BYTES, 1, 1));

    assert_eq!(
        graph.node_params(free).unwrap(),
        NodeParams::MemFree { address: a.ptr() }
    );

    // One stream: a chain.
    assert_edges(
        &graph,
        &nodes,
        &[&[], &[alloc], &[kernel], &[memset], &[copy]],
        &[&[kernel], &[memset], &[copy], &[free], &[]],
        &[alloc],
    );
    assert_eq!(hunt_errors(), 0);
}

/// A captured graph (malloc_async, a launch, memset_async, memcpy_async, free_async on one
/// stream) reads back as the capture made it: the driver's nodes are the record's, in order, each
/// depending on the one before; the alloc node's address and size are the `GraphAllocation`'s,
/// the kernel's function and shape the launch's, the memset's value and extent the call's.
#[test]
fn captured_graph_reads_back_every_node() {
    isolated("captured_graph_reads_back_every_node", captured_graph_body);
}

fn unrecorded_body() {
    let device = Device::get(0).unwrap();
    let mut graph = Graph::new(&device).unwrap();
    let first = graph.add_empty_node(&[]).unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; the graph is live; no dependencies. An empty node
    // touches no memory, so the record's checks lose nothing by not seeing it.
    let status = unsafe { sys::cuGraphAddEmptyNode(&mut raw, graph.as_raw(), std::ptr::null(), 0) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    let both = vec![DriverNode::Recorded(first), DriverNode::Unrecorded(raw)];
    assert_eq!(graph.driver_nodes().unwrap(), both);
    assert_eq!(graph.root_nodes().unwrap(), both);
    assert_eq!(both[1].recorded(), None);
    assert_eq!(graph.nodes().len(), 1);
    assert_eq!(
        graph.node_params(first).unwrap(),
        NodeParams::Other(T::CU_GRAPH_NODE_TYPE_EMPTY)
    );

    // A node of another graph is refused before the driver is asked.
    let other = Graph::new(&device).unwrap();
    let refused = |e: Error, name: &str| {
        assert!(
            matches!(&e, Error::InvalidArgument { call, .. } if *call == name),
            "{name}: {e:?}"
        );
    };
    refused(other.node_params(first).unwrap_err(), "Graph::node_params");
    refused(other.node_type(first).unwrap_err(), "Graph::node_type");
    refused(
        other.dependencies(first).unwrap_err(),
        "Graph::dependencies",
    );
    refused(other.dependents(first).unwrap_err(), "Graph::dependents");
    assert!(other.driver_nodes().unwrap().is_empty());
    assert!(other.root_nodes().unwrap().is_empty());
    assert_eq!(hunt_errors(), 0);
}

/// A node that other code added through the raw handle is listed by its handle
/// (`DriverNode::Unrecorded`) beside the record's nodes; an empty node's parameters are its type
/// only; a node of another graph is refused by every per-node call, naming the method; an empty
/// graph lists no nodes.
#[test]
fn unrecorded_nodes_and_foreign_nodes() {
    isolated("unrecorded_nodes_and_foreign_nodes", unrecorded_body);
}
