//! G.3.4: one producer graph and several consumer graphs, with AutoFreeOnLaunch.
//!
//! The producer allocates `data1` and `data2` and fills them, and does not free them: which
//! consumers read them changes from one iteration to the next, so no consumer can free them.
//! Instantiated plainly, the producer cannot be relaunched while its allocations are live (this
//! crate refuses before CUDA does, naming them). Instantiated with
//! `InstantiateFlags::AUTO_FREE_ON_LAUNCH`, each launch first frees what the previous launch left
//! live, so the loop needs no bookkeeping; after the loop the application frees the last ones.
//!
//! Graphs are captured on the per-thread default stream, as in the guide, and launched on
//! `my_stream`. The consumers sum what they read, and the sums are checked against the number of
//! times each consumer ran.
//!
//! Run with `cargo run --example auto_free_on_launch --features example-kernels`.

mod common;

use anyhow::{Context, ensure};
use common::{Kernels, args, config, sum_config, thousands, verify_eq};
use cuda_graph::{
    AsStream, BorrowedStream, CaptureMode, Device, DeviceBuffer, Error, InstantiateFlags, Stream,
    capture,
};

/// Elements of each allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// Iterations of the launch loop.
const ITERATIONS: usize = 8;
/// The value the producer fills data2 with.
const DATA2_VALUE: u32 = 7;

fn main() {
    common::run(auto_free_on_launch);
}

/// The guide's `determineAction`: whether consumer 2 runs in `iteration` (a fixed pattern here,
/// a run-time condition in a real program).
fn launch_consumer2(iteration: usize) -> bool {
    iteration % 3 != 1
}

fn auto_free_on_launch(device: &Device) -> anyhow::Result<()> {
    println!(
        "G.3.4 AutoFreeOnLaunch: one producer, two consumers, on {}",
        common::describe(device)?
    );
    let k = Kernels::load(device)?;
    let cfg = config(N);
    let per_thread = BorrowedStream::per_thread(device);
    let my_stream = Stream::new(device)?;
    // Each consumer adds the sum of what it reads to its own counter.
    let sum1 = DeviceBuffer::<u64>::zeroed(device, 1)?;
    let sum2 = DeviceBuffer::<u64>::zeroed(device, 1)?;

    // The producer: allocates data1 and data2 and fills them; frees neither.
    let (producer_graph, (data1, data2)) = capture(&per_thread, CaptureMode::Global, |cap| {
        let data1 = cap.malloc_async(N as usize * 4)?;
        let data2 = cap.malloc_async(N as usize * 4)?;
        // SAFETY: (both launches) the arguments match iota_u32 and fill_u32 (sizes checked by
        // `common::args`); both allocations were captured just before.
        unsafe { cap.launch(&k.iota, cfg, &args::pnv(&data1, N, 1))? };
        // SAFETY: as above.
        unsafe { cap.launch(&k.fill, cfg, &args::pnv(&data2, N, DATA2_VALUE))? };
        Ok((data1, data2))
    })
    .context("capturing the producer")?;

    // Consumer 1, as if captured from a library call: sums data1.
    let (consumer1_graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: the arguments match sum_u32; the graph is launched only while the producer's
        // launch has left data1 live (checked by ExecGraph::launch), after it in one stream;
        // `sum1` outlives every launch.
        unsafe { cap.launch(&k.sum, sum_config(), &args::sum(&data1, N, &sum1)) }
    })
    .context("capturing consumer 1")?;
    // Consumer 2: sums data2.
    let (consumer2_graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: as for consumer 1, with data2 and sum2.
        unsafe { cap.launch(&k.sum, sum_config(), &args::sum(&data2, N, &sum2)) }
    })
    .context("capturing consumer 2")?;
    let consumer1 = consumer1_graph.instantiate(InstantiateFlags::NONE)?;
    let consumer2 = consumer2_graph.instantiate(InstantiateFlags::NONE)?;

    // First, without the flag: the second launch is refused while data1 and data2 are live.
    {
        let plain = producer_graph.instantiate(InstantiateFlags::NONE)?;
        plain.launch(&my_stream)?;
        match plain.launch(&my_stream) {
            Err(error @ Error::UnfreedOnRelaunch { .. }) => {
                println!("  without AutoFreeOnLaunch, the second launch is refused:");
                println!("    {error}");
            }
            Err(other) => anyhow::bail!("expected UnfreedOnRelaunch, got: {other}"),
            Ok(()) => anyhow::bail!("a relaunch with live allocations was accepted"),
        }
        data1.free_async(&my_stream)?;
        data2.free_async(&my_stream)?;
        my_stream.synchronize()?;
        // `plain` drops here: a graph with memory nodes has one executable graph at a time.
    }

    // With the flag: the loop does not track the producer's allocations at all.
    let producer = producer_graph.instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)?;
    let mut consumer2_runs = 0u64;
    let mut pattern = String::new();
    for iteration in 0..ITERATIONS {
        producer.launch(&my_stream)?;
        consumer1.launch(&my_stream)?;
        if launch_consumer2(iteration) {
            consumer2.launch(&my_stream)?;
            consumer2_runs += 1;
            pattern.push_str("P C1 C2 | ");
        } else {
            pattern.push_str("P C1 | ");
        }
    }
    println!(
        "  with AutoFreeOnLaunch, {ITERATIONS} iterations: {}",
        pattern.trim_end_matches(" | ")
    );
    ensure!(
        data1.is_live() && data2.is_live(),
        "the last producer launch should leave data1 and data2 live"
    );
    // The flag does not free the last launch's allocations: the application does.
    data1.free_async(&my_stream)?;
    data2.free_async(&my_stream)?;
    my_stream.synchronize()?;

    // Consumer 1 ran once per iteration, plus zero times in the refused demonstration above.
    let expected1 = ITERATIONS as u64 * common::iota_sum(N, 1);
    let expected2 = consumer2_runs * N * DATA2_VALUE as u64;
    verify_eq("Σ over consumer 1's launches", sum1.to_vec()?[0], expected1)?;
    verify_eq("Σ over consumer 2's launches", sum2.to_vec()?[0], expected2)?;
    println!(
        "  ✓ consumer 1 ran {ITERATIONS} times, read Σ data1 = {} each time (total {})",
        thousands(common::iota_sum(N, 1)),
        thousands(expected1)
    );
    println!(
        "  ✓ consumer 2 ran {consumer2_runs} times, read Σ data2 = {} each time (total {})",
        thousands(N * DATA2_VALUE as u64),
        thousands(expected2)
    );
    println!(
        "  ✓ data1 and data2 freed after the loop; footprint now: {}",
        device.graph_mem_info()?
    );
    Ok(())
}
