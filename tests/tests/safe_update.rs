//! Updating an executable graph in place: `ExecGraph::update` from a graph of the same
//! topology, and `ExecGraph::set_kernel_node_params` on one node. Each update changes what the
//! following launches write and is checked element by element; a refused update leaves the
//! executable graph as it was; what the previous graph's nodes referred to stays allocated
//! until the launches queued before the update are done (a reuse probe).
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, DeviceAddress, DeviceBuffer, Error, Graph, InstantiateFlags, KernelArgs,
    Node, Stream, UpdateRefusal,
};
use probe::{PATTERN, SPIN_50_MS, add_spin_node};
use safe_common::{BYTES, Gpu, N, assert_all, assert_no_drop_errors, config, gpu};

/// A chain of `len` kernels that each fill `out` with `value + i` (node i); the last writes
/// `value + len - 1`.
fn fill_chain(g: &Gpu, out: &DeviceBuffer<u32>, len: u32, value: u32) -> (Graph, Vec<Node>) {
    let mut graph = Graph::new(&g.device).unwrap();
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..len {
        let deps: Vec<Node> = nodes.last().copied().into_iter().collect();
        // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the N values of
        // `out`.
        let node = unsafe {
            graph.add_kernel_node(
                &deps,
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(out).value(N).value(value + i),
            )
        }
        .unwrap();
        nodes.push(node);
    }
    (graph, nodes)
}

/// Launches `exec` on `stream`, waits, and checks that `out` holds `value`.
fn launch_and_check(
    exec: &cuda_graph::ExecGraph,
    stream: &Stream,
    out: &DeviceBuffer<u32>,
    value: u32,
    what: &str,
) {
    exec.launch(stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), value, what);
}

/// An update from a graph of the same topology with other kernel arguments changes what the
/// next launches write; one with another topology, or with memory nodes, is refused with the
/// driver's or the crate's reason and leaves the executable graph unchanged.
#[test]
#[ignore = "needs a GPU"]
fn update_changes_later_launches_and_a_refused_one_changes_nothing() {
    let Some(g) = gpu("update_changes_later_launches_and_a_refused_one_changes_nothing") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (first, _) = fill_chain(&g, &out, 3, 10);
    let mut exec = first.instantiate(InstantiateFlags::NONE).unwrap();
    launch_and_check(&exec, &stream, &out, 12, "before the update");

    // Same topology, other values: the original graph may go once the update is made.
    let (second, _) = fill_chain(&g, &out, 3, 100);
    exec.update(&second).unwrap();
    drop(second);
    launch_and_check(&exec, &stream, &out, 102, "after the update");
    launch_and_check(
        &exec,
        &stream,
        &out,
        102,
        "a second launch after the update",
    );

    // Another topology: the driver refuses, the executable graph keeps the last update.
    let (longer, _) = fill_chain(&g, &out, 4, 1000);
    let err = exec.update(&longer).unwrap_err();
    println!("CASE topology changed: {err}");
    assert!(
        matches!(
            err,
            Error::UpdateRefused {
                reason: UpdateRefusal::TopologyChanged,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), None);
    launch_and_check(&exec, &stream, &out, 102, "after a refused update");

    // A graph with memory nodes: refused by the crate before the driver.
    let mut with_memory = Graph::new(device).unwrap();
    let (alloc, a) = with_memory
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    with_memory.add_mem_free_node(&[alloc], &a).unwrap();
    let err = exec.update(&with_memory).unwrap_err();
    println!("CASE memory nodes: {err}");
    assert!(
        matches!(
            err,
            Error::UpdateRefused {
                reason: UpdateRefusal::MemoryNodes,
                node: None
            }
        ),
        "{err:?}"
    );
    launch_and_check(
        &exec,
        &stream,
        &out,
        102,
        "after a refused update with memory nodes",
    );

    // And the executable graph of a graph with memory nodes refuses any update.
    let mut exec_with_memory = with_memory.instantiate(InstantiateFlags::NONE).unwrap();
    let (plain, _) = fill_chain(&g, &out, 1, 7);
    let err = exec_with_memory.update(&plain).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UpdateRefused {
                reason: UpdateRefusal::MemoryNodes,
                ..
            }
        ),
        "{err:?}"
    );
    assert_no_drop_errors(device);
}

/// The previous graph's operands stay allocated until the launches queued before the update are
/// done: a launch that spins and then copies from a buffer only the previous graph refers to is
/// queued, the executable graph is updated to copy from another buffer, the previous graph and
/// its buffer are dropped at once, and a new buffer of the same size (the reuse probe, filled
/// with a pattern) is allocated. The queued copy must still read the old buffer's data, not the
/// pattern; the next launch reads the new source.
#[test]
#[ignore = "needs a GPU"]
fn update_keeps_the_previous_operands_until_queued_launches_are_done() {
    let Some(g) = gpu("update_keeps_the_previous_operands_until_queued_launches_are_done") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let copy_graph = |src: &DeviceBuffer<u32>| {
        let mut graph = Graph::new(device).unwrap();
        let spin = add_spin_node(&mut graph, &[], &g.k.spin_then_fill, SPIN_50_MS);
        // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n) over the N
        // values of `out` and `src`.
        unsafe {
            graph.add_kernel_node(
                &[spin],
                &g.k.copy,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(src).value(N),
            )
        }
        .unwrap();
        graph
    };
    let old_src = DeviceBuffer::from_slice(device, &vec![0x0101_0101u32; N as usize]).unwrap();
    let old_address = old_src.device_ptr();
    let new_src = DeviceBuffer::from_slice(device, &vec![0x0202_0202u32; N as usize]).unwrap();
    let old_graph = copy_graph(&old_src);
    let mut exec = old_graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    let new_graph = copy_graph(&new_src);
    exec.update(&new_graph).unwrap();
    drop((old_graph, old_src, new_graph));
    let probe = DeviceBuffer::from_slice(device, &vec![PATTERN; N as usize]).unwrap();
    println!(
        "PROBE the old source was at {old_address:#x}, the probe is at {:#x}",
        probe.device_ptr()
    );
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        0x0101_0101,
        "the launch queued before the update (the old source freed under it reads the probe's pattern)",
    );
    assert_all(&probe.to_vec().unwrap(), PATTERN, "the probe");
    launch_and_check(
        &exec,
        &stream,
        &out,
        0x0202_0202,
        "the launch after the update",
    );
    assert_no_drop_errors(device);
}

/// `set_kernel_node_params` changes one node's arguments for the next launches; it refuses a
/// graph other than the executable graph's own, a node that is not a kernel node, and a graph
/// allocation the node did not use, each before the driver and with the executable graph
/// unchanged.
#[test]
#[ignore = "needs a GPU"]
fn set_kernel_node_params_changes_one_node_and_refuses_what_the_checks_do_not_cover() {
    let Some(g) =
        gpu("set_kernel_node_params_changes_one_node_and_refuses_what_the_checks_do_not_cover")
    else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (graph, nodes) = fill_chain(&g, &out, 2, 5);
    let mut exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    launch_and_check(&exec, &stream, &out, 6, "before the change");
    // SAFETY: fill_u32 over the N values of `out`, as the node was built.
    unsafe {
        exec.set_kernel_node_params(
            &graph,
            nodes[1],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&out).value(N).value(77u32),
        )
    }
    .unwrap();
    launch_and_check(&exec, &stream, &out, 77, "after the change");

    let expect_invalid = |result: cuda_graph::Result<()>, what: &str| {
        let err = result.unwrap_err();
        println!("CASE {what}: {err}");
        assert!(
            matches!(&err, Error::InvalidArgument { call, .. } if *call == "cuGraphExecKernelNodeSetParams"),
            "{what}: {err:?}"
        );
    };
    let (other, other_nodes) = fill_chain(&g, &out, 2, 1);
    // SAFETY: as above; refused before the driver.
    expect_invalid(
        unsafe {
            exec.set_kernel_node_params(
                &other,
                other_nodes[1],
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(&out).value(N).value(1u32),
            )
        },
        "a node of another graph",
    );

    // A graph with an alloc node: the kernel node may not be pointed at an allocation it did
    // not use, nor may the alloc node be set as a kernel node.
    let mut with_memory = Graph::new(device).unwrap();
    let (alloc, a) = with_memory
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    let (alloc_b, b) = with_memory
        .add_mem_alloc_node(&[alloc], &AllocParams::new(device, BYTES))
        .unwrap();
    // SAFETY: fill_u32 over the N values of `a`, after its alloc node.
    let fill = unsafe {
        with_memory.add_kernel_node(
            &[alloc_b],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&a).value(N).value(3u32),
        )
    }
    .unwrap();
    with_memory.add_mem_free_node(&[fill], &a).unwrap();
    with_memory.add_mem_free_node(&[fill], &b).unwrap();
    let mut exec_memory = with_memory.instantiate(InstantiateFlags::NONE).unwrap();
    // SAFETY: as above; refused before the driver.
    expect_invalid(
        unsafe {
            exec_memory.set_kernel_node_params(
                &with_memory,
                alloc,
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(&a).value(N).value(1u32),
            )
        },
        "an alloc node",
    );
    // SAFETY: as above; refused before the driver.
    expect_invalid(
        unsafe {
            exec_memory.set_kernel_node_params(
                &with_memory,
                fill,
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(&b).value(N).value(1u32),
            )
        },
        "an allocation the node did not use",
    );
    // The same allocation with another value is allowed, and the graph still runs.
    // SAFETY: fill_u32 over the N values of `a`, as the node was built.
    unsafe {
        exec_memory.set_kernel_node_params(
            &with_memory,
            fill,
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&a).value(N).value(9u32),
        )
    }
    .unwrap();
    exec_memory.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    launch_and_check(
        &exec,
        &stream,
        &out,
        77,
        "the first graph, unchanged by the refusals",
    );
    assert_no_drop_errors(device);
}
