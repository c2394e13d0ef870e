//! The tour: the Programming Guide's graph-memory sections G.3.1 to G.3.4 and G.6, each in a
//! compact form, with every result checked, and a report: the device, one ✓ line per step with
//! what was checked, and the device's graph-memory footprint after each step, in MiB.
//!
//! Run with `cargo run --example tour --features example-kernels`. Each section has its own,
//! longer example: `explicit_graph`, `capture_fork_join`, `outside_access`,
//! `auto_free_on_launch`, `memory_reuse`, `upload`, `footprint`, `peer_access`, `lifetime_dot`.

mod common;

use anyhow::{Context, bail, ensure};
use common::{
    Footprint, Kernels, args, config, iota_sum, sum_config, thousands, verify_eq, verify_u32,
};
use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, Bytes, CaptureMode, Device, DeviceBuffer, Error, Graph,
    InstantiateFlags, Stream, capture,
};

/// Elements of every allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// Bytes of every allocation.
const BYTES: usize = N as usize * 4;

/// A step of the tour: it runs, records the footprint while its graphs are alive, and returns the
/// lines that say what it checked.
type Step = fn(&Device, &Kernels, &mut Footprint) -> anyhow::Result<Vec<String>>;

fn main() {
    common::run(|device| {
        println!("cuda-graph tour: graph memory nodes (CUDA Programming Guide G.3 to G.6)");
        println!("device: {}\n", common::describe(device)?);
        let k = Kernels::load(device)?;
        let mut footprint = Footprint::default();
        device.synchronize()?;
        device.graph_mem_trim()?;
        device.reset_graph_mem_high_watermarks()?;
        footprint.record(device, "start")?;

        let steps: [(&str, Step); 6] = [
            ("G.3.1 explicit graph", explicit_graph),
            ("G.3.1 lifetime check", lifetime_check),
            ("G.3.2 stream capture", capture_fork_join),
            ("G.3.3 outside access", outside_access),
            ("G.3.4 AutoFreeOnLaunch", auto_free_on_launch),
            ("G.6   trim and attributes", trim_and_attributes),
        ];
        for (title, step) in steps {
            let lines = step(device, &k, &mut footprint).with_context(|| title.to_string())?;
            let mut lines = lines.iter();
            println!(
                "  ✓ {title:<26} {}",
                lines.next().map_or("", String::as_str)
            );
            for line in lines {
                println!("    {:<26} {line}", "");
            }
        }

        println!(
            "\ngraph memory footprint of device {} (MiB):",
            device.ordinal()
        );
        print!("{}", footprint.table("  "));
        println!("\nall {} steps passed", steps.len());
        Ok(())
    });
}

/// G.3.1: alloc → a → {b, c} → free, and d after c, built node by node.
fn explicit_graph(device: &Device, k: &Kernels, fp: &mut Footprint) -> anyhow::Result<Vec<String>> {
    let (graph, buf, out_b, out_c) = g31_graph(device, k)?;
    graph.check()?;
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    let stream = Stream::new(device)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    fp.record(device, "G.3.1 graph launched")?;
    verify_u32("out_b", &out_b.to_vec()?, |i| i as u32)?;
    verify_u32("out_c", &out_c.to_vec()?, |i| (3 * i + 1) as u32)?;
    ensure!(
        !buf.is_live(),
        "the graph frees buf, so it must not be live"
    );
    Ok(vec![
        format!(
            "alloc -> a -> {{b, c}} -> free, d after c: {} nodes, checked and launched",
            graph.nodes().len()
        ),
        format!(
            "b copied buf[i] = i, c and d made 3i + 1: {} values each verified",
            thousands(N)
        ),
    ])
}

/// The G.3.1 graph with labelled nodes: returns it, the allocation and the two output buffers.
fn g31_graph(
    device: &Device,
    k: &Kernels,
) -> anyhow::Result<(
    Graph,
    cuda_graph::GraphAllocation,
    DeviceBuffer<u32>,
    DeviceBuffer<u32>,
)> {
    let cfg = config(N);
    let out_b = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out_c = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let mut graph = Graph::new(device)?;
    let (alloc, buf) =
        graph.add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("buf"))?;
    // SAFETY: (for the four kernel nodes) the argument lists come from `common::args`, which
    // matches each kernel's signature and checks sizes; buf is used only between its alloc and
    // free nodes; the output buffers are returned with the graph and outlive its launches.
    let a = unsafe { graph.add_kernel_node(&[alloc], &k.iota, cfg, &args::pnv(&buf, N, 0))? };
    // SAFETY: as above.
    let b = unsafe { graph.add_kernel_node(&[a], &k.copy, cfg, &args::copy(&out_b, &buf, N))? };
    // SAFETY: as above.
    let c = unsafe { graph.add_kernel_node(&[a], &k.axpy, cfg, &args::axpy(&out_c, &buf, N, 3))? };
    let free = graph.add_mem_free_node(&[b, c], &buf)?;
    // SAFETY: as above (d does not touch buf).
    let d = unsafe { graph.add_kernel_node(&[c], &k.add, cfg, &args::pnv(&out_c, N, 1))? };
    for (node, label) in [(a, "a"), (b, "b"), (c, "c"), (free, "free"), (d, "d")] {
        graph.set_label(node, label)?;
    }
    Ok((graph, buf, out_b, out_c))
}

/// G.3.1's node e, which uses the allocation without depending on its alloc node: refused.
fn lifetime_check(device: &Device, k: &Kernels, _: &mut Footprint) -> anyhow::Result<Vec<String>> {
    let (mut graph, buf, _out_b, _out_c) = g31_graph(device, k)?;
    // SAFETY: the arguments match add_u32; the node is never launched: instantiation refuses
    // the graph, as checked below.
    let e = unsafe { graph.add_kernel_node(&[], &k.add, config(N), &args::pnv(&buf, N, 4))? };
    graph.set_label(e, "e")?;
    let error = match graph.instantiate(InstantiateFlags::NONE) {
        Ok(_) => bail!("the graph with node e was instantiated"),
        Err(error) => error,
    };
    let message = error.to_string();
    ensure!(
        matches!(error, Error::Lifetime(_)) && message.contains("node 'e'"),
        "expected a lifetime error naming node 'e', got: {message}"
    );
    Ok(vec![
        "node e (no path from the alloc node) refused before CUDA saw it:".into(),
        message,
    ])
}

/// G.3.2: the same shape captured from two streams, forked and joined with events.
fn capture_fork_join(
    device: &Device,
    k: &Kernels,
    fp: &mut Footprint,
) -> anyhow::Result<Vec<String>> {
    let cfg = config(N);
    let out_b = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out_c = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let (stream1, stream2) = (Stream::new(device)?, Stream::new(device)?);
    let (graph, ()) = capture(&stream1, CaptureMode::Global, |cap| {
        let dptr = cap.malloc_async(BYTES)?;
        // SAFETY: (for the three launches) the argument lists come from `common::args`; dptr is
        // used between its captured allocation and free; the outputs outlive the launch.
        unsafe { cap.launch(&k.iota, cfg, &args::pnv(&dptr, N, 5))? };
        cap.fork(&stream2)?;
        // SAFETY: as above.
        unsafe { cap.launch(&k.copy, cfg, &args::copy(&out_b, &dptr, N))? };
        // SAFETY: as above.
        unsafe { cap.launch_on(&stream2, &k.axpy, cfg, &args::axpy(&out_c, &dptr, N, 2))? };
        cap.join(&stream2)?;
        cap.free_async(&dptr)
    })?;
    graph.check()?;
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    exec.launch(&stream1)?;
    stream1.synchronize()?;
    fp.record(device, "G.3.2 graph launched")?;
    verify_u32("out_b", &out_b.to_vec()?, |i| 5 + i as u32)?;
    verify_u32("out_c", &out_c.to_vec()?, |i| 2 * (5 + i as u32))?;
    Ok(vec![
        format!(
            "malloc_async, A, fork, B | C, join, free_async: {} nodes captured",
            graph.nodes().len()
        ),
        format!(
            "B copied 5 + i, C made 2·(5 + i): {} values each verified",
            thousands(N)
        ),
    ])
}

/// G.3.3: allocated by one graph, written by a kernel on the stream, read and freed by another
/// graph.
fn outside_access(device: &Device, k: &Kernels, fp: &mut Footprint) -> anyhow::Result<Vec<String>> {
    let cfg = config(N);
    let stream = Stream::new(device)?;
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let mut alloc_graph = Graph::new(device)?;
    let (_, dptr) =
        alloc_graph.add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("dptr"))?;
    let mut free_graph = Graph::new(device)?;
    // SAFETY: the arguments match copy_u32; the freeing graph runs after the allocating graph
    // and the writing kernel, in one stream, and its free node comes after this node.
    let read =
        unsafe { free_graph.add_kernel_node(&[], &k.copy, cfg, &args::copy(&out, &dptr, N))? };
    free_graph.add_mem_free_node(&[read], &dptr)?;
    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE)?;
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE)?;

    alloc_exec.launch(&stream)?;
    ensure!(dptr.is_live(), "dptr should outlive the allocating launch");
    // SAFETY: the arguments match iota_u32; dptr is live between the two graph launches queued
    // before and after this kernel on the same stream.
    unsafe { k.iota.launch(&stream, cfg, &args::pnv(&dptr, N, 9))? };
    stream.synchronize()?;
    fp.record(device, "G.3.3 allocation live")?;
    free_exec.launch(&stream)?;
    stream.synchronize()?;
    ensure!(!dptr.is_live(), "the freeing graph should have freed dptr");
    verify_u32("out", &out.to_vec()?, |i| 9 + i as u32)?;
    Ok(vec![
        "alloc graph -> kernel on the stream -> graph with kernel and free node, one stream".into(),
        format!(
            "the stream kernel wrote 9 + i, the freeing graph read {} values back",
            thousands(N)
        ),
    ])
}

/// G.3.4: a producer instantiated with AutoFreeOnLaunch, and consumers that vary per iteration.
fn auto_free_on_launch(
    device: &Device,
    k: &Kernels,
    fp: &mut Footprint,
) -> anyhow::Result<Vec<String>> {
    const ITERATIONS: u64 = 4;
    let cfg = config(N);
    let per_thread = BorrowedStream::per_thread(device);
    let my_stream = Stream::new(device)?;
    let (sum1, sum2) = (
        DeviceBuffer::<u64>::zeroed(device, 1)?,
        DeviceBuffer::<u64>::zeroed(device, 1)?,
    );
    let (producer_graph, (data1, data2)) = capture(&per_thread, CaptureMode::Global, |cap| {
        let (data1, data2) = (cap.malloc_async(BYTES)?, cap.malloc_async(BYTES)?);
        // SAFETY: (both launches) the arguments match iota_u32 and fill_u32; both allocations were
        // captured just before.
        unsafe { cap.launch(&k.iota, cfg, &args::pnv(&data1, N, 1))? };
        // SAFETY: as above.
        unsafe { cap.launch(&k.fill, cfg, &args::pnv(&data2, N, 3))? };
        Ok((data1, data2))
    })?;
    let (consumer1_graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: the arguments match sum_u32; launched only after a producer launch, in one
        // stream, while data1 is live (checked at launch); sum1 outlives every launch.
        unsafe { cap.launch(&k.sum, sum_config(), &args::sum(&data1, N, &sum1)) }
    })?;
    let (consumer2_graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: as for consumer 1, with data2 and sum2.
        unsafe { cap.launch(&k.sum, sum_config(), &args::sum(&data2, N, &sum2)) }
    })?;
    let producer = producer_graph.instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)?;
    let consumer1 = consumer1_graph.instantiate(InstantiateFlags::NONE)?;
    let consumer2 = consumer2_graph.instantiate(InstantiateFlags::NONE)?;
    let mut consumer2_runs = 0;
    for iteration in 0..ITERATIONS {
        producer.launch(&my_stream)?;
        consumer1.launch(&my_stream)?;
        if iteration % 2 == 1 {
            consumer2.launch(&my_stream)?;
            consumer2_runs += 1;
        }
    }
    my_stream.synchronize()?;
    fp.record(device, "G.3.4 after the loop")?;
    data1.free_async(&my_stream)?;
    data2.free_async(&my_stream)?;
    my_stream.synchronize()?;
    verify_eq(
        "Σ consumer 1",
        sum1.to_vec()?[0],
        ITERATIONS * iota_sum(N, 1),
    )?;
    verify_eq("Σ consumer 2", sum2.to_vec()?[0], consumer2_runs * 3 * N)?;
    Ok(vec![
        format!(
            "producer relaunched {ITERATIONS} times with its allocations live; consumer 1 ran {ITERATIONS} times, consumer 2 {consumer2_runs}"
        ),
        "consumer sums verified; data1 and data2 freed with free_async after the loop".into(),
    ])
}

/// G.6: with every graph of the tour dropped, trim returns the memory; then reset the high-water
/// marks.
fn trim_and_attributes(
    device: &Device,
    _: &Kernels,
    fp: &mut Footprint,
) -> anyhow::Result<Vec<String>> {
    device.synchronize()?;
    let before = fp.record(device, "G.6 all graphs dropped")?;
    device.graph_mem_trim()?;
    let trimmed = fp.record(device, "G.6 after trim")?;
    ensure!(
        trimmed.used_current == Bytes(0) && trimmed.reserved_current == Bytes(0),
        "with no graph and no live allocation, a trim should return everything: {trimmed}"
    );
    device.reset_graph_mem_high_watermarks()?;
    let reset = fp.record(device, "G.6 high-water marks reset")?;
    ensure!(
        reset.used_high == Bytes(0) && reset.reserved_high == Bytes(0),
        "the high-water marks should reset to the current values (0): {reset}"
    );
    Ok(vec![
        format!(
            "trim returned {} to the OS; used and reserved are now 0",
            before.reserved_current
        ),
        format!(
            "high-water marks were {} used / {} reserved, reset to 0",
            trimmed.used_high, trimmed.reserved_high
        ),
    ])
}
