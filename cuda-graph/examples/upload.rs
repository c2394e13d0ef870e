//! G.5.1: first launch and `cuGraphUpload`.
//!
//! Physical memory for a graph's allocations cannot be mapped at instantiation (the stream is not
//! known yet), so the first launch maps it, and pays for it. Uploading the executable graph into
//! the stream it will run in does the mapping ahead of time, so that first launch runs at the
//! speed of later ones.
//!
//! Three cases, each starting with no graph memory reserved (after a trim), each a graph that
//! allocates 1 GiB, fills it, sums it and frees it: no upload; `ExecGraph::upload` into the launch
//! stream; and `InstantiateFlags::UPLOAD` through `Graph::instantiate_and_upload`. The first and
//! second launch of each are timed with events (and with the host clock), and every launch's sum
//! is checked.
//!
//! Run with `cargo run --release --example upload --features example-kernels`.

mod common;

use std::time::Instant;

use anyhow::ensure;
use common::{Kernels, args, config, mib_bytes, sum_config, verify_eq};
use cuda_graph::{
    AllocParams, AsStream, Device, DeviceBuffer, Event, ExecGraph, Graph, InstantiateFlags, Stream,
};

/// Size of the allocation.
const SIZE: usize = mib_bytes(1024);
/// Its elements.
const N: u64 = (SIZE / 4) as u64;

/// How the executable graph gets to the stream before its first launch.
#[derive(Clone, Copy, PartialEq)]
enum Case {
    NoUpload,
    Upload,
    InstantiateWithUpload,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::NoUpload => "no upload",
            Case::Upload => "ExecGraph::upload",
            Case::InstantiateWithUpload => "InstantiateFlags::UPLOAD",
        }
    }
}

/// What one case measured, in milliseconds.
struct Timing {
    case: Case,
    prepare_ms: f64,
    first_event_ms: f32,
    first_host_ms: f64,
    second_event_ms: f32,
    second_host_ms: f64,
}

fn main() {
    common::run(|device| {
        println!(
            "G.5.1 first launch with and without cuGraphUpload on {}",
            common::describe(device)?
        );
        let k = Kernels::load(device)?;
        let stream = Stream::new(device)?;
        let sum = DeviceBuffer::<u64>::zeroed(device, 1)?;
        // Warm up the kernels and the graph machinery, so the first case is not charged for
        // one-time costs that have nothing to do with graph memory.
        let warm = build(device, &k, &sum, 1, mib_bytes(2))?;
        let warm_exec = warm.instantiate(InstantiateFlags::NONE)?;
        warm_exec.launch(&stream)?;
        stream.synchronize()?;
        drop((warm_exec, warm));

        let mut timings = Vec::new();
        for (i, case) in [Case::NoUpload, Case::Upload, Case::InstantiateWithUpload]
            .into_iter()
            .enumerate()
        {
            timings.push(run_case(device, &k, &stream, &sum, case, i as u32 + 2)?);
        }

        println!(
            "\n  {:<26} {:>12} {:>22} {:>22}",
            "case", "prepare", "first launch", "second launch"
        );
        println!(
            "  {:<26} {:>12} {:>22} {:>22}",
            "", "(host)", "(events / host)", "(events / host)"
        );
        for t in &timings {
            println!(
                "  {:<26} {:>9.3} ms {:>8.3} / {:>7.3} ms {:>8.3} / {:>7.3} ms",
                t.case.name(),
                t.prepare_ms,
                t.first_event_ms,
                t.first_host_ms,
                t.second_event_ms,
                t.second_host_ms
            );
        }
        let plain = &timings[0];
        let uploaded = &timings[1];
        println!(
            "\n  first launch: {:.3} ms without upload, {:.3} ms after upload ({:+.3} ms); the mapping moved into upload ({:.3} ms)",
            plain.first_event_ms,
            uploaded.first_event_ms,
            uploaded.first_event_ms - plain.first_event_ms,
            uploaded.prepare_ms
        );
        Ok(())
    });
}

/// A graph that allocates `bytes`, fills them with `value`, adds their sum to `sum`, frees them.
fn build(
    device: &Device,
    k: &Kernels,
    sum: &DeviceBuffer<u64>,
    value: u32,
    bytes: usize,
) -> anyhow::Result<Graph> {
    let n = (bytes / 4) as u64;
    let cfg = config(n);
    let mut graph = Graph::new(device)?;
    let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, bytes))?;
    // SAFETY: (both kernel nodes) the arguments match fill_u32 and sum_u32 (sizes checked by
    // `common::args`); both nodes run between buf's alloc and free nodes; `sum` outlives every
    // launch (each is synchronized before it is read).
    let fill =
        unsafe { graph.add_kernel_node(&[alloc], &k.fill, cfg, &args::pnv(&buf, n, value))? };
    // SAFETY: as above.
    let total =
        unsafe { graph.add_kernel_node(&[fill], &k.sum, sum_config(), &args::sum(&buf, n, sum))? };
    graph.add_mem_free_node(&[total], &buf)?;
    Ok(graph)
}

/// Times one launch on `stream` with events and the host clock, and checks the sum it adds.
fn timed_launch(
    device: &Device,
    exec: &ExecGraph,
    stream: &Stream,
    sum: &DeviceBuffer<u64>,
    value: u32,
) -> anyhow::Result<(f32, f64)> {
    sum.copy_from(&[0])?;
    let (start, end) = (Event::new(device)?, Event::new(device)?);
    let host = Instant::now();
    start.record(stream)?;
    exec.launch(stream)?;
    end.record(stream)?;
    end.synchronize()?;
    let host_ms = host.elapsed().as_secs_f64() * 1e3;
    let event_ms = end.elapsed_ms_since(&start)?;
    verify_eq("Σ of the allocation", sum.to_vec()?[0], N * value as u64)?;
    Ok((event_ms, host_ms))
}

fn run_case(
    device: &Device,
    k: &Kernels,
    stream: &Stream,
    sum: &DeviceBuffer<u64>,
    case: Case,
    value: u32,
) -> anyhow::Result<Timing> {
    // No graph memory left from before: whatever the first launch needs must be mapped anew.
    device.synchronize()?;
    device.graph_mem_trim()?;
    let before = device.graph_mem_info()?;
    ensure!(
        before.reserved_current.0 == 0,
        "graph memory should be all returned after a trim with no graph alive: {before}"
    );
    let graph = build(device, k, sum, value, SIZE)?;
    let host = Instant::now();
    let exec = match case {
        Case::NoUpload => graph.instantiate(InstantiateFlags::NONE)?,
        Case::Upload => {
            let exec = graph.instantiate(InstantiateFlags::NONE)?;
            exec.upload(stream)?;
            exec
        }
        Case::InstantiateWithUpload => {
            graph.instantiate_and_upload(InstantiateFlags::NONE, stream)?
        }
    };
    stream.synchronize()?;
    let prepare_ms = host.elapsed().as_secs_f64() * 1e3;
    let prepared = device.graph_mem_info()?;
    let (first_event_ms, first_host_ms) = timed_launch(device, &exec, stream, sum, value)?;
    let (second_event_ms, second_host_ms) = timed_launch(device, &exec, stream, sum, value)?;
    println!(
        "  {:<26} ✓ two launches, each Σ = {} · {}; footprint before the first launch: {prepared}",
        case.name(),
        common::thousands(N),
        value
    );
    Ok(Timing {
        case,
        prepare_ms,
        first_event_ms,
        first_host_ms,
        second_event_ms,
        second_host_ms,
    })
}
