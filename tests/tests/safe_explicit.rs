//! G.3.1 in the safe layer: explicit graphs with alloc and free nodes, kernels that use the
//! allocation, memset, memcpy, empty, host and child graph nodes; the lifetime check that refuses
//! the guide's node `e`; one instantiation at a time for graphs with memory nodes.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_graph::check::Rule;
use cuda_graph::{
    AllocParams, AsStream, DeviceBuffer, Error, Graph, InstantiateFlags, KernelArgs, NodeKind,
    Stream,
};
use safe_common::{BYTES, N, assert_all, assert_iota, config, gpu, iota_sum};

/// The guide's G.3.1 graph, with kernels whose results can be checked: `a` writes an iota into
/// the allocation, `b` copies it out, `c` sums it (after a memset node that zeroes the sum); the
/// free node depends on `b` and `c`. Launched twice: the allocation's address is fixed and the
/// results are the same. Then node `e`, which uses the allocation without depending on the alloc
/// node, makes instantiation fail with `Error::Lifetime` naming it.
#[test]
#[ignore = "needs a GPU"]
fn g3_1_explicit_graph_and_node_e_refused() {
    let Some(g) = gpu("g3_1_explicit_graph_and_node_e_refused") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let sum = DeviceBuffer::<u64>::zeroed(device, 1).unwrap();

    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("buf"))
        .unwrap();
    assert_eq!(buf.bytes(), BYTES);
    assert_ne!(buf.ptr(), 0);
    assert_eq!(buf.owner_graph(), graph.id());
    assert_eq!(buf.label(), Some("buf"));
    assert!(!buf.is_live());
    let cfg = config(N);
    // SAFETY: (all kernel nodes below) the argument lists match iota_u32(u32*, u64, u32),
    // copy_u32(u32*, const u32*, u64) and sum_u32(const u32*, u64, u64*); `buf` holds N values,
    // `out` N, `sum` one u64; the lifetime check verifies the ordering of the uses of `buf`.
    let a = unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            cfg,
            &KernelArgs::new().ptr(&buf).value(N).value(7u32),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let b = unsafe {
        graph.add_kernel_node(
            &[a],
            &g.k.copy,
            cfg,
            &KernelArgs::new().ptr(&out).ptr(&buf).value(N),
        )
    }
    .unwrap();
    let zero_sum = graph.add_memset_node(&[], &sum, 0, 2).unwrap();
    // SAFETY: as above.
    let c = unsafe {
        graph.add_kernel_node(
            &[a, zero_sum],
            &g.k.sum,
            cfg,
            &KernelArgs::new().ptr(&buf).value(N).ptr(&sum),
        )
    }
    .unwrap();
    let free = graph.add_mem_free_node(&[b, c], &buf).unwrap();
    for (node, label) in [(a, "a"), (b, "b"), (c, "c"), (free, "free")] {
        graph.set_label(node, label).unwrap();
    }
    assert_eq!(graph.nodes().len(), 6);
    assert!(graph.has_memory_nodes());
    assert_eq!(graph.node(alloc).unwrap().kind(), NodeKind::MemAlloc);
    assert_eq!(graph.node(free).unwrap().kind(), NodeKind::MemFree);
    assert_eq!(
        graph.node(free).unwrap().deps(),
        vec![b.index() as u32, c.index() as u32]
    );
    assert_eq!(graph.allocations().count(), 1);
    graph.check().unwrap();

    // Our DOT marks the allocation's lifetime; the driver's DOT is written too.
    let dot = graph.to_dot();
    assert!(dot.contains("alloc A0") && dot.contains("free A0") && dot.contains("uses A0"));
    let path = std::env::temp_dir().join(format!("safe_g3_1_{}.dot", std::process::id()));
    graph.debug_dot_print(&path).unwrap();
    let driver_dot = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(driver_dot.contains("digraph"), "{driver_dot}");
    println!("G.3.1 graph, our DOT:\n{dot}");

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    assert!(exec.unfreed_allocations().is_empty());
    let address = buf.ptr();
    for launch in 0..2 {
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_iota(
            &out.to_vec().unwrap(),
            7,
            &format!("launch {launch}: b's copy"),
        );
        assert_eq!(
            sum.to_vec().unwrap(),
            vec![iota_sum(7, N)],
            "launch {launch}: c's sum"
        );
        assert_eq!(buf.ptr(), address, "the address is fixed across launches");
        assert!(!buf.is_live(), "freed in its own graph");
    }

    // Node e: uses the allocation, not ordered after the alloc node.
    // SAFETY: fill_u32(u32*, u64, u32); the graph is never launched with this node.
    let e = unsafe {
        graph.add_kernel_node(
            &[],
            &g.k.fill,
            cfg,
            &KernelArgs::new().ptr(&buf).value(N).value(4u32),
        )
    }
    .unwrap();
    graph.set_label(e, "e").unwrap();
    drop(exec);
    let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    println!("instantiate with node e: {err}");
    let Error::Lifetime(lifetime) = &err else {
        panic!("expected Error::Lifetime, got {err:?}");
    };
    assert!(err.to_string().contains("node 'e'"), "{err}");
    let first = &lifetime.violations[0];
    assert_eq!(first.rule, Rule::NotAfterAlloc);
    assert_eq!(first.node.index, e.index());
    assert_eq!(first.node.label.as_deref(), Some("e"));
    assert_eq!(first.other.as_ref().map(|o| o.index), Some(alloc.index()));
    assert!(
        lifetime
            .violations
            .iter()
            .all(|v| v.node.label.as_deref() == Some("e")),
        "only node e breaks a rule: {:?}",
        lifetime.violations
    );
    assert_eq!(graph.check().unwrap_err(), err);
}

/// A graph with memory nodes has at most one executable graph at a time: a second
/// instantiation is refused (before the driver is called) until the first is dropped.
#[test]
#[ignore = "needs a GPU"]
fn one_instantiation_at_a_time_with_memory_nodes() {
    let Some(g) = gpu("one_instantiation_at_a_time_with_memory_nodes") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    // SAFETY: fill_u32(u32*, u64, u32) on the N values of `buf`, after its alloc node.
    let fill = unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&buf).value(N).value(11u32),
        )
    }
    .unwrap();
    let copy = graph.add_memcpy_node(&[fill], &out, &buf, BYTES).unwrap();
    graph.add_mem_free_node(&[copy], &buf).unwrap();

    let first = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let err = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    println!("second instantiation: {err}");
    assert!(
        matches!(err, Error::AlreadyInstantiated { call } if call == "Graph::instantiate"),
        "expected AlreadyInstantiated, got {err:?}"
    );
    drop(first);
    let second = graph.instantiate(InstantiateFlags::NONE).unwrap();
    second.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        11,
        "copy of the second instantiation",
    );
}

/// Memset, memcpy, empty and host nodes around graph allocations: alloc → memset → empty →
/// add → memcpy to a device buffer → free; a second allocation filled by a memcpy from a device
/// buffer and copied out by a kernel; a host node that counts launches.
#[test]
#[ignore = "needs a GPU"]
fn memset_memcpy_empty_and_host_nodes() {
    let Some(g) = gpu("memset_memcpy_empty_and_host_nodes") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let out2 = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let input: Vec<u32> = (0..N as u32).map(|i| i * 3).collect();
    let input = DeviceBuffer::<u32>::from_slice(device, &input).unwrap();
    let launches = Arc::new(AtomicUsize::new(0));

    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("scratch"))
        .unwrap();
    let memset = graph
        .add_memset_node(&[alloc], &buf, 0xA5A5_0000, N as usize)
        .unwrap();
    let empty = graph.add_empty_node(&[memset]).unwrap();
    // SAFETY: add_u32(u32*, u64, u32) on the N values of `buf`, after the memset.
    let add = unsafe {
        graph.add_kernel_node(
            &[empty],
            &g.k.add,
            config(N),
            &KernelArgs::new().ptr(&buf).value(N).value(3u32),
        )
    }
    .unwrap();
    let copy_out = graph.add_memcpy_node(&[add], &out, &buf, BYTES).unwrap();
    graph.add_mem_free_node(&[copy_out], &buf).unwrap();

    let (alloc2, buf2) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("copied in"))
        .unwrap();
    let copy_in = graph
        .add_memcpy_node(&[alloc2], &buf2, &input, BYTES)
        .unwrap();
    // SAFETY: copy_u32(u32*, const u32*, u64): N values from `buf2` into `out2`.
    let copy2 = unsafe {
        graph.add_kernel_node(
            &[copy_in],
            &g.k.copy,
            config(N),
            &KernelArgs::new().ptr(&out2).ptr(&buf2).value(N),
        )
    }
    .unwrap();
    graph.add_mem_free_node(&[copy2], &buf2).unwrap();

    let counter = launches.clone();
    let host = graph
        .add_host_node(&[copy_out, copy2], move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert_eq!(graph.node(host).unwrap().kind(), NodeKind::Host);
    assert_eq!(graph.node(empty).unwrap().kind(), NodeKind::Empty);
    assert_eq!(graph.node(memset).unwrap().kind(), NodeKind::Memset);
    assert_eq!(graph.node(copy_in).unwrap().kind(), NodeKind::Memcpy);
    assert_eq!(graph.allocations().count(), 2);

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(
        launches.load(Ordering::SeqCst),
        3,
        "host node runs per launch"
    );
    assert_all(
        &out.to_vec().unwrap(),
        0xA5A5_0003,
        "memset + add, copied out",
    );
    let got2 = out2.to_vec().unwrap();
    if let Some(i) = (0..N as usize).find(|&i| got2[i] != i as u32 * 3) {
        panic!(
            "memcpy in + copy out: element {i} is {}, expected {}",
            got2[i],
            i * 3
        );
    }
}

/// A child graph that owns memory nodes: adding it by copy (`cuGraphAddChildGraphNode`, which
/// CUDA refuses for such children) is refused before the driver is called, with an error that
/// names the alternative; moving it in (`add_child_graph_node_moved`, CUDA 12.9+ headers) works, and
/// the parent then allocates, uses and frees its memory. A child without memory nodes is added
/// by copy.
#[test]
#[ignore = "needs a GPU"]
fn child_graph_with_memory_nodes_moved_not_copied() {
    let Some(g) = gpu("child_graph_with_memory_nodes_moved_not_copied") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let plain_out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();

    let mut child = Graph::new(device).unwrap();
    let (alloc, buf) = child
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("child buf"))
        .unwrap();
    // SAFETY: iota_u32(u32*, u64, u32) on the N values of `buf`, after its alloc node.
    let iota = unsafe {
        child.add_kernel_node(
            &[alloc],
            &g.k.iota,
            config(N),
            &KernelArgs::new().ptr(&buf).value(N).value(40u32),
        )
    }
    .unwrap();
    let copy = child.add_memcpy_node(&[iota], &out, &buf, BYTES).unwrap();
    child.add_mem_free_node(&[copy], &buf).unwrap();

    // A child without memory nodes, added by copy.
    let mut plain = Graph::new(device).unwrap();
    // SAFETY: fill_u32(u32*, u64, u32) on the N values of `plain_out`, a device buffer.
    unsafe {
        plain.add_kernel_node(
            &[],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&plain_out).value(N).value(9u32),
        )
    }
    .unwrap();

    let mut parent = Graph::new(device).unwrap();
    let err = parent.add_child_graph_node(&[], &child).unwrap_err();
    println!("child with memory nodes added by copy: {err}");
    assert!(
        matches!(&err, Error::InvalidArgument { call, .. } if *call == "cuGraphAddChildGraphNode"),
        "expected the refusal of a copied child with memory nodes, got {err:?}"
    );
    assert!(
        err.to_string().contains("add_child_graph_node_moved"),
        "{err}"
    );
    let plain_node = parent.add_child_graph_node(&[], &plain).unwrap();
    assert_eq!(
        parent.node(plain_node).unwrap().kind(),
        NodeKind::ChildGraph
    );

    #[cfg(cuda_graph_child_move)]
    {
        let moved = parent
            .add_child_graph_node_moved(&[plain_node], child)
            .unwrap();
        let record = parent.node(moved).unwrap();
        assert_eq!(record.kind(), NodeKind::ChildGraph);
        let memory_ops = record
            .refs()
            .iter()
            .filter(|(role, _)| *role != cuda_graph::MemRole::Use)
            .count();
        assert_eq!(memory_ops, 2, "the child's alloc and free: {record:?}");
        assert!(parent.has_memory_nodes());
        parent.check().unwrap();
        let exec = parent.instantiate(InstantiateFlags::NONE).unwrap();
        assert!(exec.unfreed_allocations().is_empty());
        for _ in 0..2 {
            exec.launch(&stream).unwrap();
        }
        stream.synchronize().unwrap();
        assert_iota(&out.to_vec().unwrap(), 40, "moved child's copy");
        assert!(!buf.is_live());
    }
    #[cfg(not(cuda_graph_child_move))]
    {
        println!("child graph ownership transfer needs CUDA 12.9+ headers; not built");
        drop(child);
        let exec = parent.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    }
    assert_all(&plain_out.to_vec().unwrap(), 9, "copied child's fill");
}

/// Memset nodes of 1- and 2-byte elements and 2-D regions (`Graph::add_memset_node_2d`): on a
/// 64 × 48-byte image, in this order, a `u16` memset of the whole image, a `u32` memset of
/// every third row (pitch 192), and a `u8` memset of the left 16 bytes of every other row
/// (pitch 128); every byte read back is what the three leave. A graph allocation written by a
/// 2-D memset between its alloc and free nodes passes the lifetime check.
#[test]
#[ignore = "needs a GPU"]
fn memset_nodes_of_each_element_size_and_in_two_dimensions() {
    let Some(g) = gpu("memset_nodes_of_each_element_size_and_in_two_dimensions") else {
        return;
    };
    let device = &g.device;
    const W: usize = 64;
    const H: usize = 48;
    let image = DeviceBuffer::<u8>::zeroed(device, W * H).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let all = graph
        .add_memset_node_2d(&[], &image, 0xA1B2u16, W * H / 2, 1, 0)
        .unwrap();
    let rows = graph
        .add_memset_node_2d(&[all], &image, 0x0403_0201u32, W / 4, H / 3, 3 * W)
        .unwrap();
    graph
        .add_memset_node_2d(&[rows], &image, 0xFFu8, 16, H / 2, 2 * W)
        .unwrap();
    let stream = Stream::new(device).unwrap();
    graph
        .instantiate(InstantiateFlags::NONE)
        .unwrap()
        .launch(&stream)
        .unwrap();
    stream.synchronize().unwrap();
    let got = image.to_vec().unwrap();
    for (i, &byte) in got.iter().enumerate() {
        let (row, col) = (i / W, i % W);
        let want = if row % 2 == 0 && col < 16 {
            0xFF
        } else if row % 3 == 0 {
            [1, 2, 3, 4][col % 4] // little-endian 0x04030201
        } else if i % 2 == 0 {
            0xB2 // little-endian 0xA1B2
        } else {
            0xA1
        };
        assert_eq!(byte, want, "row {row}, byte {col}");
    }

    let mut graph = Graph::new(device).unwrap();
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    let set = graph
        .add_memset_node_2d(&[alloc], &a, 0x5Au8, 256, 16, 1024)
        .unwrap();
    graph.add_mem_free_node(&[set], &a).unwrap();
    graph.check().unwrap();
}

/// A graph built where no context is current is built, instantiated and launched, and writes
/// what it should: on this thread with `cuCtxSetCurrent(NULL)` before every step, on a new
/// thread, and made on this thread but given its kernel, memcpy and free nodes on a new thread
/// (safe code reaches no current context so: `Graph` is `Send`). Each node-adding call that
/// needs it makes the device's context current. Before `add_kernel_node` did, the process died
/// with SIGSEGV in `cuGraphAddKernelNode` (H200, driver 580; a function of a module loaded
/// from PTX), the steps printed up to "alloc node added".
#[test]
#[ignore = "needs a GPU"]
fn graph_built_where_no_context_is_current() {
    let Some(g) = gpu("graph_built_where_no_context_is_current") else {
        return;
    };
    let device = &g.device;
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let step = |what: &str| eprintln!("graph_built_where_no_context_is_current: {what}");
    let unbind = || {
        // SAFETY: unbinds the calling thread's context; the crate binds again where it must.
        let code = unsafe { cuda_graph::sys::cuCtxSetCurrent(std::ptr::null_mut()) };
        assert_eq!(code, cuda_graph::sys::CUresult::CUDA_SUCCESS);
    };
    let build = |value: u32| {
        unbind();
        let mut graph = Graph::new(device).unwrap();
        step("graph made");
        unbind();
        let (alloc, buf) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
            .unwrap();
        step("alloc node added");
        unbind();
        // SAFETY: fill_u32(u32*, u64, u32) on the N values of `buf`, after its alloc node.
        let fill = unsafe {
            graph.add_kernel_node(
                &[alloc],
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(&buf).value(N).value(value),
            )
        }
        .unwrap();
        step("kernel node added");
        unbind();
        let copy = graph.add_memcpy_node(&[fill], &out, &buf, BYTES).unwrap();
        step("memcpy node added");
        unbind();
        graph.add_mem_free_node(&[copy], &buf).unwrap();
        step("free node added");
        unbind();
        graph
    };
    let run = |graph: Graph, value: u32| {
        let stream = Stream::new(device).unwrap();
        unbind();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        step("instantiated");
        unbind();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        step("launched");
        assert_all(&out.to_vec().unwrap(), value, "the graph's copy");
        step("checked");
    };
    run(build(21), 21);
    let graph = std::thread::scope(|s| s.spawn(|| build(22)).join().unwrap());
    run(graph, 22);

    // Made here, continued on a new thread, where no context was ever current.
    let mut graph = Graph::new(device).unwrap();
    let (alloc, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    let graph = std::thread::scope(|s| {
        s.spawn(|| {
            let mut graph = graph;
            // SAFETY: fill_u32(u32*, u64, u32) on the N values of `buf`, after its alloc node.
            let fill = unsafe {
                graph.add_kernel_node(
                    &[alloc],
                    &g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(23u32),
                )
            }
            .unwrap();
            step("kernel node added on a new thread");
            let copy = graph.add_memcpy_node(&[fill], &out, &buf, BYTES).unwrap();
            graph.add_mem_free_node(&[copy], &buf).unwrap();
            graph
        })
        .join()
        .unwrap()
    });
    run(graph, 23);
}
