//! G.3.3: using and freeing a graph allocation outside the graph that allocated it.
//!
//! An allocation that its graph does not free stays live after the launch, as an owned
//! [`GraphAllocation`](cuda_graph::GraphAllocation). Other work may use it and something else
//! frees it, as long as every access is ordered after the allocation and before the free. The
//! guide's three ways of ordering it, each run for two rounds (the allocating graph can be
//! relaunched once its allocation has been freed):
//!
//! 1. one stream: the allocating graph, a kernel and `free_async`, in stream order;
//! 2. events between streams: allocation on one stream, a kernel on a second, and a graph with
//!    a kernel and the free node on a third, ordered by recorded and awaited events;
//! 3. event nodes: the allocating graph records an event; the freeing graph waits for it and for
//!    an event recorded after the outside kernel, and its free node depends on both users.
//!
//! Run with `cargo run --example outside_access --features example-kernels`.

mod common;

use anyhow::ensure;
use common::{Kernels, args, config, thousands, verify_u32};
use cuda_graph::{
    AllocParams, AsStream, Device, DeviceBuffer, Event, EventFlags, Graph, InstantiateFlags, Stream,
};

/// Elements of the allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// How many times each ordering runs.
const ROUNDS: u32 = 2;

fn main() {
    common::run(|device| {
        println!(
            "G.3.3 accessing and freeing graph memory outside the allocating graph, on {}",
            common::describe(device)?
        );
        let k = Kernels::load(device)?;
        one_stream(device, &k)?;
        events_between_streams(device, &k)?;
        event_nodes(device, &k)?;
        Ok(())
    });
}

/// An allocation of N `u32` made by an alloc node, labelled `dptr`.
fn params(device: &Device) -> AllocParams {
    AllocParams::new(device, N as usize * 4).label("dptr")
}

/// Ordering 1: everything in one stream.
fn one_stream(device: &Device, k: &Kernels) -> anyhow::Result<()> {
    println!("  1. one stream: launch(alloc graph); kernel(dptr); free_async(dptr)");
    let cfg = config(N);
    let stream = Stream::new(device)?;
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize)?;

    let mut alloc_graph = Graph::new(device)?;
    let (_, dptr) = alloc_graph.add_mem_alloc_node(&[], &params(device))?;
    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE)?;
    ensure!(
        alloc_exec.unfreed_allocations().len() == 1,
        "the allocating graph should leave dptr live after each launch"
    );

    for round in 1..=ROUNDS {
        alloc_exec.launch(&stream)?;
        ensure!(dptr.is_live(), "dptr should be live after the launch");
        // SAFETY: (both launches) the argument lists match iota_u32 and copy_u32 and their sizes
        // are checked by `common::args`; dptr is live from the graph launch queued before them on
        // this stream until the free queued after them; `out` outlives the synchronize below.
        unsafe { k.iota.launch(&stream, cfg, &args::pnv(&dptr, N, round))? };
        // SAFETY: as above.
        unsafe { k.copy.launch(&stream, cfg, &args::copy(&out, &dptr, N))? };
        dptr.free_async(&stream)?;
        stream.synchronize()?;
        ensure!(!dptr.is_live(), "dptr should be freed");
        verify_u32("out (copied from dptr)", &out.to_vec()?, |i| {
            round + i as u32
        })?;
        println!(
            "     round {round}: ✓ the kernel wrote dptr[i] = {round} + i, read back for all {} elements; dptr freed",
            thousands(N)
        );
    }
    Ok(())
}

/// Ordering 2: events recorded and awaited between three streams.
fn events_between_streams(device: &Device, k: &Kernels) -> anyhow::Result<()> {
    println!(
        "  2. events between streams: alloc graph on s1 -> event -> kernel on s2 -> event -> free graph (kernel + free node) on s3"
    );
    let cfg = config(N);
    let (alloc_stream, stream2, stream3) = (
        Stream::new(device)?,
        Stream::new(device)?,
        Stream::new(device)?,
    );
    let alloc_event = Event::with_flags(device, EventFlags::DISABLE_TIMING)?;
    let use_done = Event::with_flags(device, EventFlags::DISABLE_TIMING)?;
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize)?;

    // The allocating graph: just the alloc node.
    let mut alloc_graph = Graph::new(device)?;
    let (_, dptr) = alloc_graph.add_mem_alloc_node(&[], &params(device))?;

    // The consuming and freeing graph: kernel a reads dptr, then the free node.
    let mut free_graph = Graph::new(device)?;
    // SAFETY: the arguments match copy_u32 (checked by `common::args`); the graph is launched
    // only after the kernel on stream2 that writes dptr (event use_done), and its free node runs
    // after this node; `out` outlives every launch.
    let a = unsafe { free_graph.add_kernel_node(&[], &k.copy, cfg, &args::copy(&out, &dptr, N))? };
    free_graph.add_mem_free_node(&[a], &dptr)?;

    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE)?;
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE)?;

    for round in 1..=ROUNDS {
        alloc_exec.launch(&alloc_stream)?;
        // stream2 depends on the allocation (a stream synchronize would do as well).
        alloc_event.record(&alloc_stream)?;
        stream2.wait_event(&alloc_event)?;
        // SAFETY: the arguments match iota_u32; dptr is allocated before this kernel (alloc_event)
        // and freed after it (use_done, awaited by stream3 before the freeing graph).
        unsafe {
            k.iota
                .launch(&stream2, cfg, &args::pnv(&dptr, N, 10 * round))?
        };
        // stream3 depends on the use on stream2; now the freeing graph may run.
        use_done.record(&stream2)?;
        stream3.wait_event(&use_done)?;
        free_exec.launch(&stream3)?;
        device.synchronize()?;
        ensure!(!dptr.is_live(), "dptr should be freed by the freeing graph");
        verify_u32("out (copied by the freeing graph)", &out.to_vec()?, |i| {
            10 * round + i as u32
        })?;
        println!(
            "     round {round}: ✓ s2 wrote dptr[i] = {} + i, the freeing graph read it back ({} elements) and freed dptr",
            10 * round,
            thousands(N)
        );
    }
    Ok(())
}

/// Ordering 3: event record and wait nodes inside the graphs.
fn event_nodes(device: &Device, k: &Kernels) -> anyhow::Result<()> {
    println!(
        "  3. event nodes: alloc graph records alloc_event; free graph waits for alloc_event and use_done, free after both users"
    );
    let cfg = config(N);
    let (alloc_stream, stream2, stream3) = (
        Stream::new(device)?,
        Stream::new(device)?,
        Stream::new(device)?,
    );
    // Ready for use: recorded by the allocating graph. Done with it: recorded after the stream use.
    let alloc_event = Event::with_flags(device, EventFlags::DISABLE_TIMING)?;
    let use_done = Event::with_flags(device, EventFlags::DISABLE_TIMING)?;
    let out2 = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out3 = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let zeros = vec![0u32; N as usize];

    // The allocating graph: alloc node, a kernel that fills dptr (so that both readers below see
    // defined data), and the event record node after them.
    let mut alloc_graph = Graph::new(device)?;
    let (alloc, dptr) = alloc_graph.add_mem_alloc_node(&[], &params(device))?;
    // SAFETY: the arguments match iota_u32; the node is ordered after the alloc node, and dptr
    // is freed only after alloc_event, which is recorded after this node.
    let fill =
        unsafe { alloc_graph.add_kernel_node(&[alloc], &k.iota, cfg, &args::pnv(&dptr, N, 0))? };
    alloc_graph.add_event_record_node(&[fill], &alloc_event)?;

    // The waiting and freeing graph.
    let mut wait_and_free = Graph::new(device)?;
    let use_done_node = wait_and_free.add_event_wait_node(&[], &use_done)?;
    let alloc_ready_node = wait_and_free.add_event_wait_node(&[], &alloc_event)?;
    // The wait for alloc_event orders this kernel after the alloc node of the other graph.
    // SAFETY: the arguments match copy_u32; the node runs after alloc_event (dptr allocated and
    // filled) and before the free node; `out3` outlives every launch.
    let kernel = unsafe {
        wait_and_free.add_kernel_node(
            &[alloc_ready_node],
            &k.copy,
            cfg,
            &args::copy(&out3, &dptr, N),
        )?
    };
    // The free node is ordered after both the inside user (kernel) and the outside one
    // (use_done_node): neither may access dptr after it is freed.
    wait_and_free.add_mem_free_node(&[kernel, use_done_node], &dptr)?;

    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE)?;
    let wait_and_free_exec = wait_and_free.instantiate(InstantiateFlags::NONE)?;

    for round in 1..=ROUNDS {
        out2.copy_from(&zeros)?;
        out3.copy_from(&zeros)?;
        alloc_exec.launch(&alloc_stream)?;
        // Waiting for the event node's event satisfies the ordering after the allocation.
        stream2.wait_event(&alloc_event)?;
        // SAFETY: the arguments match copy_u32; the kernel runs after alloc_event (dptr allocated
        // and filled) and the free node waits for use_done, recorded after it.
        unsafe { k.copy.launch(&stream2, cfg, &args::copy(&out2, &dptr, N))? };
        use_done.record(&stream2)?;
        // The wait node for use_done keeps the free after the kernel on stream2.
        wait_and_free_exec.launch(&stream3)?;
        device.synchronize()?;
        ensure!(
            !dptr.is_live(),
            "dptr should be freed by the waiting and freeing graph"
        );
        verify_u32("out2 (read on stream2)", &out2.to_vec()?, |i| i as u32)?;
        verify_u32("out3 (read in the freeing graph)", &out3.to_vec()?, |i| {
            i as u32
        })?;
        println!(
            "     round {round}: ✓ both readers (stream2 and the freeing graph) saw dptr[i] = i for all {} elements; dptr freed",
            thousands(N)
        );
    }
    Ok(())
}
