//! Graph-memory footprint in the safe layer (G.4, G.5.1, G.6), and the RAII free of an escaped
//! allocation, measured with `Device::graph_mem_info`.
//!
//! The attributes are process-wide, so every footprint assertion of the suite lives in this one
//! binary and its tests hold one lock for their whole run (`safe_common::gpu`): `cargo test` runs
//! them as threads of one process (`cargo nextest` as processes of their own). Each test starts
//! from a trimmed device and ends by asserting that, after it dropped everything, synchronized and
//! trimmed, graph memory used and reserved are both 0 (G.6).
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Every line the tests print about memory starts with `FOOTPRINT`.

mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, Device, DeviceBuffer, Graph, GraphAllocation, InstantiateFlags,
    KernelArgs, Node, Stream,
};
use safe_common::{Gpu, MIB, assert_released, config, gpu, mem_info};

/// The size of each allocation of the footprint tests.
const BIG: u64 = 64 * MIB;
/// Its `u32` elements.
const BIG_N: u64 = BIG / 4;

/// Prints the attributes as `FOOTPRINT <test> <what>: used ... reserved ...`.
fn footprint(device: &Device, test: &str, what: &str) -> cuda_graph::GraphMemInfo {
    mem_info(device, &format!("FOOTPRINT {test} {what}"))
}

/// Starts a footprint test from a clean device: synchronized, trimmed (nothing used or reserved)
/// and with both high-water marks reset.
fn clean_start(device: &Device, test: &str) {
    assert_released(device, &format!("FOOTPRINT {test} at the start"));
    device.reset_graph_mem_high_watermarks().unwrap();
    let info = footprint(device, test, "after resetting the high-water marks");
    assert_eq!(info.used_high.0, 0, "{info}");
    assert_eq!(info.reserved_high.0, 0, "{info}");
}

/// Appends to `graph`, after `deps`: alloc `BIG` → fill with `value` → sum into `sum` → free.
/// Returns the free node and the allocation.
fn alloc_fill_sum_free(
    g: &Gpu,
    graph: &mut Graph,
    deps: &[Node],
    value: u32,
    sum: &DeviceBuffer<u64>,
) -> (Node, GraphAllocation) {
    let (alloc, buf) = graph
        .add_mem_alloc_node(deps, &AllocParams::new(&g.device, BIG as usize))
        .unwrap();
    // SAFETY: fill_u32(u32*, u64, u32) and sum_u32(const u32*, u64, u64*) over the BIG_N values
    // of `buf`, between its alloc node and its free node; `sum` holds one u64.
    let fill = unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.fill,
            config(BIG_N),
            &KernelArgs::new().ptr(&buf).value(BIG_N).value(value),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let summed = unsafe {
        graph.add_kernel_node(
            &[fill],
            &g.k.sum,
            config(BIG_N),
            &KernelArgs::new().ptr(&buf).value(BIG_N).ptr(sum),
        )
    }
    .unwrap();
    let free = graph.add_mem_free_node(&[summed], &buf).unwrap();
    (free, buf)
}

/// Checks that `sums[i]` is `BIG_N * values[i]`.
#[track_caller]
fn assert_sums(sums: &[DeviceBuffer<u64>], values: impl Fn(usize) -> u32) {
    for (i, sum) in sums.iter().enumerate() {
        assert_eq!(
            sum.to_vec().unwrap(),
            vec![BIG_N * u64::from(values(i))],
            "sum of allocation {i}"
        );
    }
}

/// G.4.1: a chain of 16 × (alloc 64 MiB → fill → sum → free) in one graph, each alloc node after
/// the previous free node, reuses one address range and one 64 MiB of physical memory: after
/// the launch the used high-water mark is exactly 64 MiB.
#[test]
#[ignore = "needs a GPU"]
fn g4_1_chain_of_16_allocations_uses_64_mib() {
    const TEST: &str = "G.4.1 chain of 16 x 64 MiB";
    let Some(g) = gpu("g4_1_chain_of_16_allocations_uses_64_mib") else {
        return;
    };
    let device = &g.device;
    clean_start(device, TEST);
    {
        let stream = Stream::new(device).unwrap();
        let sums: Vec<DeviceBuffer<u64>> = (0..16)
            .map(|_| DeviceBuffer::zeroed(device, 1).unwrap())
            .collect();
        let mut graph = Graph::new(device).unwrap();
        let mut deps = Vec::new();
        let mut addresses = Vec::new();
        for (i, sum) in sums.iter().enumerate() {
            let (free, buf) = alloc_fill_sum_free(&g, &mut graph, &deps, i as u32 + 1, sum);
            deps = vec![free];
            addresses.push(buf.ptr());
        }
        addresses.dedup();
        println!(
            "FOOTPRINT {TEST}: {} distinct address(es) for 16 allocations",
            addresses.len()
        );
        graph.check().unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_sums(&sums, |i| i as u32 + 1);
        let info = footprint(device, TEST, "after the launch");
        assert_eq!(info.used_high.0, BIG, "used high-water mark: {info}");
        assert!(info.reserved_high.0 >= BIG, "{info}");
    }
    assert_released(device, &format!("FOOTPRINT {TEST} after drop"));
}

/// G.4.2: eight graphs, each alloc 64 MiB → fill → sum → free, launched one after the other in
/// one stream, share one 64 MiB of physical memory: the used high-water mark is 64 MiB.
#[test]
#[ignore = "needs a GPU"]
fn g4_2_eight_graphs_in_one_stream_use_64_mib() {
    const TEST: &str = "G.4.2 eight 64 MiB graphs in one stream";
    let Some(g) = gpu("g4_2_eight_graphs_in_one_stream_use_64_mib") else {
        return;
    };
    let device = &g.device;
    clean_start(device, TEST);
    {
        let stream = Stream::new(device).unwrap();
        let sums: Vec<DeviceBuffer<u64>> = (0..8)
            .map(|_| DeviceBuffer::zeroed(device, 1).unwrap())
            .collect();
        let mut graphs = Vec::new();
        for (i, sum) in sums.iter().enumerate() {
            let mut graph = Graph::new(device).unwrap();
            alloc_fill_sum_free(&g, &mut graph, &[], 20 + i as u32, sum);
            graphs.push(graph);
        }
        let execs: Vec<_> = graphs
            .iter()
            .map(|graph| graph.instantiate(InstantiateFlags::NONE).unwrap())
            .collect();
        for exec in &execs {
            exec.launch(&stream).unwrap();
        }
        stream.synchronize().unwrap();
        assert_sums(&sums, |i| 20 + i as u32);
        let info = footprint(device, TEST, "after the launches");
        assert_eq!(info.used_high.0, BIG, "used high-water mark: {info}");
        assert!(info.reserved_high.0 >= BIG, "{info}");
    }
    assert_released(device, &format!("FOOTPRINT {TEST} after drop"));
}

/// G.5.1: `upload` maps the graph's memory into the stream ahead of the launch; the launch on the
/// same stream then runs with it. Also `instantiate_and_upload`.
#[test]
#[ignore = "needs a GPU"]
fn g5_1_upload_then_launch() {
    const TEST: &str = "G.5.1 upload then launch";
    let Some(g) = gpu("g5_1_upload_then_launch") else {
        return;
    };
    let device = &g.device;
    clean_start(device, TEST);
    {
        let stream = Stream::new(device).unwrap();
        let sum = DeviceBuffer::<u64>::zeroed(device, 1).unwrap();
        let mut graph = Graph::new(device).unwrap();
        alloc_fill_sum_free(&g, &mut graph, &[], 3, &sum);
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        footprint(device, TEST, "after instantiate");
        exec.upload(&stream).unwrap();
        stream.synchronize().unwrap();
        let uploaded = footprint(device, TEST, "after upload, before the launch");
        assert!(
            uploaded.used_current.0 >= BIG,
            "upload maps the memory before the launch: {uploaded}"
        );
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let launched = footprint(device, TEST, "after the launch");
        assert_eq!(launched.used_high.0, BIG, "{launched}");
        assert_eq!(sum.to_vec().unwrap(), vec![BIG_N * 3]);
        drop(exec);

        sum.copy_from(&[0]).unwrap();
        let exec = graph
            .instantiate_and_upload(InstantiateFlags::NONE, &stream)
            .unwrap();
        assert!(exec.flags().contains(InstantiateFlags::UPLOAD));
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(
            sum.to_vec().unwrap(),
            vec![BIG_N * 3],
            "instantiate_and_upload"
        );
        footprint(device, TEST, "after instantiate_and_upload and launch");
    }
    assert_released(device, &format!("FOOTPRINT {TEST} after drop"));
}

/// RAII: an allocation that escapes its graph (no free node) and that nobody frees stays live
/// while any handle can reach it, and is freed when the last one drops, after the work that used
/// it. A trim spares memory that a live allocation holds (G.6), so: with the executable graph
/// still holding the allocation, a trim leaves 64 MiB used; once the last handle has dropped, a
/// synchronize and a trim leave nothing used or reserved. (Used memory does not drop to 0 at the
/// free itself: the driver keeps freed graph memory mapped until a trim, as it does after a graph
/// that frees its own allocations is destroyed; see `g6_trim_after_drop_returns_everything`.)
#[test]
#[ignore = "needs a GPU"]
fn raii_frees_an_escaped_allocation_nobody_frees() {
    const TEST: &str = "RAII escaped allocation";
    let Some(g) = gpu("raii_frees_an_escaped_allocation_nobody_frees") else {
        return;
    };
    let device = &g.device;
    clean_start(device, TEST);
    {
        let stream = Stream::new(device).unwrap();
        let sum = DeviceBuffer::<u64>::zeroed(device, 1).unwrap();
        let mut graph = Graph::new(device).unwrap();
        let (alloc, escaped) = graph
            .add_mem_alloc_node(
                &[],
                &AllocParams::new(device, BIG as usize).label("escaped"),
            )
            .unwrap();
        // SAFETY: fill_u32 over the BIG_N values of `escaped`, after its alloc node.
        unsafe {
            graph.add_kernel_node(
                &[alloc],
                &g.k.fill,
                config(BIG_N),
                &KernelArgs::new().ptr(&escaped).value(BIG_N).value(9u32),
            )
        }
        .unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        // SAFETY: sum_u32 over the BIG_N values of `escaped` (live: allocated by the launch queued
        // before on this stream) into `sum`.
        unsafe {
            g.k.sum.launch(
                &stream,
                config(BIG_N),
                &KernelArgs::new().ptr(&escaped).value(BIG_N).ptr(&sum),
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(sum.to_vec().unwrap(), vec![BIG_N * 9]);
        assert!(escaped.is_live());
        let live = footprint(device, TEST, "live after the launch");
        assert_eq!(live.used_current.0, BIG, "{live}");

        // The handle and the graph go; the executable graph still reaches the allocation, which
        // a trim therefore spares.
        drop(escaped);
        drop(graph);
        device.synchronize().unwrap();
        device.graph_mem_trim().unwrap();
        let reachable = footprint(device, TEST, "handle and graph dropped, exec kept, trimmed");
        assert_eq!(reachable.used_current.0, BIG, "{reachable}");
        assert_eq!(exec.unfreed_allocations().len(), 1);
        assert!(exec.unfreed_allocations()[0].is_live());

        // The last handle goes: freed on the device's private stream.
        drop(exec);
        device.synchronize().unwrap();
        footprint(device, TEST, "all handles dropped, after synchronize");
    }
    // Freed: the trim returns everything (a leaked allocation would keep 64 MiB used).
    assert_released(
        device,
        &format!("FOOTPRINT {TEST} after the last handle dropped"),
    );
}

/// G.6: destroying a graph does not return its memory to the OS; `graph_mem_trim` does. After a
/// 64 MiB graph ran and everything was dropped, memory is still reserved; after the trim, used and
/// reserved are both 0.
#[test]
#[ignore = "needs a GPU"]
fn g6_trim_after_drop_returns_everything() {
    const TEST: &str = "G.6 trim";
    let Some(g) = gpu("g6_trim_after_drop_returns_everything") else {
        return;
    };
    let device = &g.device;
    clean_start(device, TEST);
    {
        let stream = Stream::new(device).unwrap();
        let sum = DeviceBuffer::<u64>::zeroed(device, 1).unwrap();
        let mut graph = Graph::new(device).unwrap();
        alloc_fill_sum_free(&g, &mut graph, &[], 4, &sum);
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(sum.to_vec().unwrap(), vec![BIG_N * 4]);
        let ran = footprint(device, TEST, "after the launch");
        assert!(ran.reserved_current.0 >= BIG, "{ran}");
    }
    device.synchronize().unwrap();
    let dropped = footprint(device, TEST, "after dropping everything, before the trim");
    assert!(
        dropped.reserved_current.0 >= BIG,
        "destroying the graph keeps the memory reserved: {dropped}"
    );
    let trimmed = assert_released(device, &format!("FOOTPRINT {TEST}"));
    println!("FOOTPRINT {TEST} final: {trimmed}");
}
