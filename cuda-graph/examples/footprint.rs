//! G.6: the physical memory footprint of graph memory.
//!
//! The driver keeps graph memory in a pool of its own: destroying a graph does not give the
//! memory back to the OS; `Device::graph_mem_trim` (`cuDeviceGraphMemTrim`) does, for whatever no
//! live allocation and no scheduled or running graph uses. The four attributes
//! (`Device::graph_mem_info`): used (mapped by at least one graph) and reserved (held by the
//! driver for graphs), each current and high-water; the high-water marks can be reset.
//!
//! Steps: a graph that allocates and frees 256 MiB; a graph whose 128 MiB allocation outlives
//! its launch; dropping the first graph; a trim that must leave the live allocation alone;
//! freeing it; dropping everything and trimming down to nothing; resetting the high-water marks.
//! The footprint after each step is printed as a table in MiB.
//!
//! Run with `cargo run --example footprint --features example-kernels`.

mod common;

use anyhow::ensure;
use common::{Footprint, Kernels, args, config, mib_bytes, sum_config, verify_eq};
use cuda_graph::{
    AllocParams, AsStream, Bytes, Device, DeviceBuffer, Graph, InstantiateFlags, Stream,
};

/// The allocation freed inside its graph.
const A_SIZE: usize = mib_bytes(256);
/// The allocation that outlives its graph's launch.
const B_SIZE: usize = mib_bytes(128);

fn main() {
    common::run(footprint);
}

fn footprint(device: &Device) -> anyhow::Result<()> {
    println!(
        "G.6 physical memory footprint on {}",
        common::describe(device)?
    );
    let k = Kernels::load(device)?;
    let stream = Stream::new(device)?;
    let mut table = Footprint::default();

    device.synchronize()?;
    device.graph_mem_trim()?;
    device.reset_graph_mem_high_watermarks()?;
    let start = table.record(device, "start (after trim and reset)")?;
    ensure!(
        start.used_current.0 == 0 && start.reserved_current.0 == 0,
        "no graph exists yet, so nothing should be used or reserved after a trim: {start}"
    );

    // Graph A: allocates 256 MiB, fills and sums it, frees it.
    let a_n = (A_SIZE / 4) as u64;
    let a_sum = DeviceBuffer::<u64>::zeroed(device, 1)?;
    let mut graph_a = Graph::new(device)?;
    let (alloc, buf) =
        graph_a.add_mem_alloc_node(&[], &AllocParams::new(device, A_SIZE).label("A"))?;
    // SAFETY: (both kernel nodes) the arguments match fill_u32 and sum_u32 (sizes checked by
    // `common::args`); the nodes run between A's alloc and free nodes; `a_sum` outlives the launch.
    let fill = unsafe {
        graph_a.add_kernel_node(&[alloc], &k.fill, config(a_n), &args::pnv(&buf, a_n, 3))?
    };
    // SAFETY: as above.
    let sum = unsafe {
        graph_a.add_kernel_node(&[fill], &k.sum, sum_config(), &args::sum(&buf, a_n, &a_sum))?
    };
    graph_a.add_mem_free_node(&[sum], &buf)?;
    let exec_a = graph_a.instantiate(InstantiateFlags::NONE)?;
    table.record(device, "graph A (256 MiB) instantiated")?;
    exec_a.launch(&stream)?;
    stream.synchronize()?;
    verify_eq("Σ of A", a_sum.to_vec()?[0], 3 * a_n)?;
    let launched_a = table.record(device, "graph A launched")?;
    ensure!(
        launched_a.reserved_current.0 >= A_SIZE as u64,
        "after A's launch at least 256 MiB should be reserved: {launched_a}"
    );
    println!("  ✓ graph A filled and summed its 256 MiB (Σ = 3 · {a_n})");

    // Graph B: allocates 128 MiB and fills it, but does not free it: it stays live after launch.
    let b_n = (B_SIZE / 4) as u64;
    let mut graph_b = Graph::new(device)?;
    let (alloc, b) =
        graph_b.add_mem_alloc_node(&[], &AllocParams::new(device, B_SIZE).label("B"))?;
    // SAFETY: the arguments match iota_u32; the node runs after B's alloc node, and B is freed
    // below only after this graph's launch, in the same stream.
    unsafe { graph_b.add_kernel_node(&[alloc], &k.iota, config(b_n), &args::pnv(&b, b_n, 0))? };
    let exec_b = graph_b.instantiate(InstantiateFlags::NONE)?;
    exec_b.launch(&stream)?;
    stream.synchronize()?;
    ensure!(b.is_live(), "B should outlive the launch");
    table.record(device, "graph B (128 MiB, not freed) launched")?;

    // Destroying a graph does not return its memory to the OS.
    let before_drop = device.graph_mem_info()?;
    drop(exec_a);
    drop(graph_a);
    let after_drop = table.record(device, "graph A dropped")?;
    println!(
        "  ✓ dropping graph A left {} reserved (was {}): the driver keeps graph memory until a trim",
        after_drop.reserved_current, before_drop.reserved_current
    );

    // Trim: B's allocation is live, so the memory behind it stays.
    device.graph_mem_trim()?;
    let trimmed = table.record(device, "trim while B is live")?;
    ensure!(
        trimmed.reserved_current.0 >= B_SIZE as u64 && trimmed.used_current.0 >= B_SIZE as u64,
        "a trim must not take the memory of a live allocation (B, 128 MiB): {trimmed}"
    );
    println!(
        "  ✓ the trim kept B's memory: used {}, reserved {}",
        trimmed.used_current, trimmed.reserved_current
    );
    // Verify that B's contents survived the trim: sum them on the stream.
    let b_sum = DeviceBuffer::<u64>::zeroed(device, 1)?;
    // SAFETY: the arguments match sum_u32; B is live (allocated by graph B's launch, freed only
    // below, after this kernel in the same stream); `b_sum` outlives the synchronize.
    unsafe {
        k.sum
            .launch(&stream, sum_config(), &args::sum(&b, b_n, &b_sum))?
    };
    stream.synchronize()?;
    verify_eq(
        "Σ of B after the trim",
        b_sum.to_vec()?[0],
        common::iota_sum(b_n, 0),
    )?;
    println!("  ✓ B's contents are intact after the trim");

    b.free_async(&stream)?;
    stream.synchronize()?;
    table.record(device, "B freed (free_async)")?;
    drop(exec_b);
    drop(graph_b);
    drop(b);
    table.record(device, "graph B dropped")?;

    device.graph_mem_trim()?;
    let empty = table.record(device, "trim with no graph left")?;
    ensure!(
        empty.used_current.0 == 0 && empty.reserved_current.0 == 0,
        "with no graph and no live allocation, a trim should return everything: {empty}"
    );
    ensure!(
        empty.used_high.0 >= A_SIZE as u64 && empty.reserved_high.0 >= A_SIZE as u64,
        "the high-water marks should remember at least A's 256 MiB: {empty}"
    );
    println!(
        "  ✓ after the last trim nothing is used or reserved; the high-water marks still say {} used, {} reserved",
        empty.used_high, empty.reserved_high
    );

    device.reset_graph_mem_high_watermarks()?;
    let reset = table.record(device, "high-water marks reset")?;
    ensure!(
        reset.used_high == Bytes(0) && reset.reserved_high == Bytes(0),
        "resetting the high-water marks should bring them to the current values (0): {reset}"
    );
    println!("  ✓ resetting the high-water marks brought them down to the current values, 0");

    println!("\n  graph memory of device {} (MiB):", device.ordinal());
    print!("{}", table.table("    "));
    Ok(())
}
