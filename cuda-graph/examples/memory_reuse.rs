//! G.4: how CUDA reuses graph memory.
//!
//! 1. Address reuse within one graph (G.4.1): a chain of 16 allocations of 64 MiB, each
//!    allocated after the previous one is freed, may share one virtual address range; an
//!    allocation not ordered after a free cannot take the freed range.
//! 2. Physical reuse between graphs (G.4.2): eight graphs, each allocating and freeing 64 MiB,
//!    launched one after another into one stream, never run at the same time, so CUDA can back
//!    all of them with the same physical memory, each at its own virtual address.
//!
//! The device's graph-memory footprint is printed after each step. Every kernel's output is
//! checked (each allocation is filled and summed inside its lifetime).
//!
//! Run with `cargo run --example memory_reuse --features example-kernels`.

mod common;

use anyhow::ensure;
use common::{Kernels, args, config, iota_sum, mib_bytes, sum_config, verify_eq};
use cuda_graph::{
    AllocParams, AsStream, Bytes, Device, DeviceBuffer, Graph, GraphAllocation, InstantiateFlags,
    Node, Stream,
};

/// Size of every allocation.
const SIZE: usize = mib_bytes(64);
/// Elements of every allocation.
const N: u64 = (SIZE / 4) as u64;
/// Allocations in the chain of part 1.
const CHAIN: usize = 16;
/// Graphs in part 2.
const GRAPHS: usize = 8;

fn main() {
    common::run(|device| {
        println!(
            "G.4 optimized memory reuse on {}",
            common::describe(device)?
        );
        // Start from a clean slate: no graph memory reserved, high-water marks at zero.
        device.synchronize()?;
        device.graph_mem_trim()?;
        device.reset_graph_mem_high_watermarks()?;
        println!(
            "  start:                          {}",
            device.graph_mem_info()?
        );
        let k = Kernels::load(device)?;
        address_reuse(device, &k)?;
        physical_reuse(device, &k)?;
        Ok(())
    });
}

/// Adds alloc → iota(base) → sum(into `out`) → free after `deps`; returns the free node and the
/// allocation.
fn add_fill_sum_free(
    graph: &mut Graph,
    deps: &[Node],
    k: &Kernels,
    base: u32,
    out: &DeviceBuffer<u64>,
) -> anyhow::Result<(Node, GraphAllocation)> {
    let device = graph.device().clone();
    let cfg = config(N);
    let (alloc, buf) = graph.add_mem_alloc_node(deps, &AllocParams::new(&device, SIZE))?;
    // SAFETY: (both kernel nodes) the arguments match iota_u32 and sum_u32 (sizes checked by
    // `common::args`); both nodes are ordered between buf's alloc and free nodes; `out` outlives
    // every launch of the graph.
    let fill = unsafe { graph.add_kernel_node(&[alloc], &k.iota, cfg, &args::pnv(&buf, N, base))? };
    // SAFETY: as above.
    let sum =
        unsafe { graph.add_kernel_node(&[fill], &k.sum, sum_config(), &args::sum(&buf, N, out))? };
    let free = graph.add_mem_free_node(&[sum], &buf)?;
    Ok((free, buf))
}

/// Whether two allocations' address ranges overlap.
fn overlap(a: &GraphAllocation, b: &GraphAllocation) -> bool {
    a.ptr() < b.ptr() + b.bytes() as u64 && b.ptr() < a.ptr() + a.bytes() as u64
}

fn distinct(addresses: &[u64]) -> usize {
    let mut sorted = addresses.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.len()
}

/// Part 1: address reuse within one graph.
fn address_reuse(device: &Device, k: &Kernels) -> anyhow::Result<()> {
    println!(
        "\n  1. address reuse in one graph: {CHAIN} × 64 MiB, alloc(i+1) after free(i) (G.4.1)"
    );
    let sums: Vec<DeviceBuffer<u64>> = (0..CHAIN)
        .map(|_| DeviceBuffer::zeroed(device, 1))
        .collect::<Result<_, _>>()?;
    let mut graph = Graph::new(device)?;
    let mut allocations = Vec::new();
    let mut previous_free: Option<Node> = None;
    for (i, sum) in sums.iter().enumerate() {
        let deps: Vec<Node> = previous_free.into_iter().collect();
        let (free, buf) = add_fill_sum_free(&mut graph, &deps, k, i as u32, sum)?;
        previous_free = Some(free);
        allocations.push(buf);
    }
    let addresses: Vec<u64> = allocations.iter().map(|a| a.ptr()).collect();
    let reused = addresses.iter().filter(|&&a| a == addresses[0]).count();
    println!(
        "     {} distinct address(es) for {CHAIN} allocations; {reused} of them at {:#x}, the first one's",
        distinct(&addresses),
        addresses[0]
    );
    println!(
        "     after building:            {}",
        device.graph_mem_info()?
    );

    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    println!(
        "     after instantiating:       {}",
        device.graph_mem_info()?
    );
    let stream = Stream::new(device)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    let info = device.graph_mem_info()?;
    println!("     after launching:           {info}");
    for (i, sum) in sums.iter().enumerate() {
        verify_eq(
            &format!("Σ of allocation {i}"),
            sum.to_vec()?[0],
            iota_sum(N, i as u32),
        )?;
    }
    println!("     ✓ all {CHAIN} allocations were filled and summed correctly");
    report_sharing("the chain", info.used_high, CHAIN)?;

    // G.4.1's second picture: an alloc node that does not depend on a free node cannot take the
    // address that free releases, whatever other reuse happens.
    let mut graph2 = Graph::new(device)?;
    let (a_alloc, a) = graph2.add_mem_alloc_node(&[], &AllocParams::new(device, SIZE))?;
    let a_free = graph2.add_mem_free_node(&[a_alloc], &a)?;
    let (b_alloc, b) = graph2.add_mem_alloc_node(&[a_free], &AllocParams::new(device, SIZE))?;
    graph2.add_mem_free_node(&[b_alloc], &b)?;
    let (c_alloc, c) = graph2.add_mem_alloc_node(&[], &AllocParams::new(device, SIZE))?;
    graph2.add_mem_free_node(&[c_alloc], &c)?;
    println!(
        "     A at {:#x}; B (after A's free) at {:#x}{}; C (not after any free) at {:#x}",
        a.ptr(),
        b.ptr(),
        if b.ptr() == a.ptr() {
            ", A's range reused"
        } else {
            ""
        },
        c.ptr()
    );
    ensure!(
        !overlap(&c, &a) && !overlap(&c, &b),
        "C's lifetime may overlap A's and B's, so its range must not overlap theirs"
    );
    println!("     ✓ C does not overlap A or B: it is unordered with their frees");

    drop(exec);
    drop(graph);
    drop(graph2);
    device.graph_mem_trim()?;
    device.reset_graph_mem_high_watermarks()?;
    println!(
        "     after drop, trim, reset:   {}",
        device.graph_mem_info()?
    );
    Ok(())
}

/// Part 2: physical reuse between graphs launched into one stream.
fn physical_reuse(device: &Device, k: &Kernels) -> anyhow::Result<()> {
    println!(
        "\n  2. physical reuse between graphs: {GRAPHS} graphs × 64 MiB, launched in one stream (G.4.2)"
    );
    let stream = Stream::new(device)?;
    let sums: Vec<DeviceBuffer<u64>> = (0..GRAPHS)
        .map(|_| DeviceBuffer::zeroed(device, 1))
        .collect::<Result<_, _>>()?;
    let mut execs = Vec::new();
    let mut addresses = Vec::new();
    // The graphs stay alive (built and instantiated) together, so each keeps its own addresses.
    let mut graphs = Vec::new();
    for (g, sum) in sums.iter().enumerate() {
        let mut graph = Graph::new(device)?;
        let (_, buf) = add_fill_sum_free(&mut graph, &[], k, 100 * g as u32, sum)?;
        addresses.push(buf.ptr());
        execs.push(graph.instantiate(InstantiateFlags::NONE)?);
        graphs.push(graph);
    }
    println!(
        "     {} distinct virtual addresses for {GRAPHS} graphs",
        distinct(&addresses)
    );
    let mut last = device.graph_mem_info()?;
    for (g, exec) in execs.iter().enumerate() {
        exec.launch(&stream)?;
        stream.synchronize()?;
        last = device.graph_mem_info()?;
        println!("     after launching graph {g}:    {last}");
    }
    for (g, sum) in sums.iter().enumerate() {
        verify_eq(
            &format!("Σ of graph {g}'s allocation"),
            sum.to_vec()?[0],
            iota_sum(N, 100 * g as u32),
        )?;
    }
    println!("     ✓ all {GRAPHS} graphs filled and summed their allocation correctly");
    report_sharing("the eight graphs", last.used_high, GRAPHS)?;
    drop(execs);
    drop(graphs);
    println!(
        "     after dropping the graphs: {}",
        device.graph_mem_info()?
    );
    device.graph_mem_trim()?;
    println!(
        "     after trim:                {}",
        device.graph_mem_info()?
    );
    Ok(())
}

/// Prints how much physical memory `what` needed, against one allocation's worth (full
/// sharing, what the guide says CUDA should reach) and `count` allocations' worth (no sharing).
/// Fails only if there was no sharing at all.
fn report_sharing(what: &str, used_high: Bytes, count: usize) -> anyhow::Result<()> {
    let one = Bytes(SIZE as u64);
    let unshared = Bytes((SIZE * count) as u64);
    ensure!(
        used_high < unshared,
        "{what} used {used_high} of graph memory at the peak, as much as {count} separate allocations ({unshared}): no reuse"
    );
    if used_high <= one {
        println!(
            "     ✓ {what} used at most {used_high} at the peak: one allocation's worth instead of {unshared}"
        );
    } else {
        println!(
            "     ✓ {what} used at most {used_high} at the peak, less than {unshared} without reuse (full sharing would be {one})"
        );
    }
    Ok(())
}
