//! G.3.2: the graph of G.3.1 (without d and e), made by capturing stream-ordered work.
//!
//! `malloc_async` and `free_async` on a capturing stream become alloc and free nodes; kernel C
//! runs on a second stream forked from the first through an event, and joined back before the
//! free, so the captured free node depends on A, B and C. The graph's record is printed, checked
//! by the lifetime rules, and the graph is launched and its output verified.
//!
//! Run with `cargo run --example capture_fork_join --features example-kernels`.

mod common;

use anyhow::{Context, ensure};
use common::{Kernels, args, config, thousands, verify_u32};
use cuda_graph::{
    AsStream, CaptureMode, CaptureStatus, Device, DeviceBuffer, InstantiateFlags, MemRole,
    NodeKind, Stream, capture,
};

/// Elements of the allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// How many times the graph is launched.
const LAUNCHES: u32 = 3;

fn main() {
    common::run(capture_fork_join);
}

fn capture_fork_join(device: &Device) -> anyhow::Result<()> {
    println!(
        "G.3.2 stream capture with fork and join on {}",
        common::describe(device)?
    );
    let k = Kernels::load(device)?;
    let cfg = config(N);
    let out_b = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out_c = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let (stream1, stream2) = (Stream::new(device)?, Stream::new(device)?);

    let (graph, dptr) = capture(&stream1, CaptureMode::Global, |cap| {
        let dptr = cap.malloc_async(N as usize * 4)?;
        // SAFETY: (for the three launches) the argument lists come from `common::args`, which
        // matches each kernel's signature and checks the sizes; `dptr` is used between its
        // captured allocation and free, and the output buffers outlive every launch.
        unsafe { cap.launch(&k.iota, cfg, &args::pnv(&dptr, N, 0))? }; // kernel A: dptr[i] = i

        // Fork into stream2: an event recorded on stream1, waited for on stream2.
        cap.fork(&stream2)?;

        // SAFETY: as above.
        unsafe { cap.launch(&k.copy, cfg, &args::copy(&out_b, &dptr, N))? }; // kernel B
        // The event dependency becomes a graph edge: kernel C depends on A, hence on the alloc.
        // SAFETY: as above.
        unsafe { cap.launch_on(&stream2, &k.axpy, cfg, &args::axpy(&out_c, &dptr, N, 3))? }; // kernel C

        // Join stream2 back into stream1, then free: the free depends on all work using dptr.
        cap.join(&stream2)?;
        cap.free_async(&dptr)?;
        Ok(dptr)
    })
    .context("capturing G.3.2")?;
    ensure!(
        stream1.capture_status()? == CaptureStatus::None,
        "stream1 should have left capture mode"
    );

    println!("  captured graph ({} nodes):", graph.nodes().len());
    for (i, node) in graph.nodes().iter().enumerate() {
        let mut line = format!("    #{i} {}", node.kind());
        if !node.deps().is_empty() {
            let deps: Vec<String> = node.deps().iter().map(|d| format!("#{d}")).collect();
            line += &format!(", after {}", deps.join(" "));
        }
        if node.keys(MemRole::Use).next().is_some() {
            line += ", uses dptr";
        }
        println!("{line}");
    }
    let count = |f: fn(&NodeKind) -> bool| graph.nodes().iter().filter(|n| f(n.kind())).count();
    let allocs = count(|kind| matches!(kind, NodeKind::MemAlloc));
    let frees = count(|kind| matches!(kind, NodeKind::MemFree));
    let kernels = count(|kind| matches!(kind, NodeKind::Kernel(_)));
    ensure!(
        (allocs, kernels, frees) == (1, 3, 1),
        "expected 1 alloc, 3 kernel and 1 free node; got {allocs}, {kernels}, {frees}"
    );
    let users = graph
        .nodes()
        .iter()
        .filter(|n| n.keys(MemRole::Use).next().is_some())
        .count();
    ensure!(
        users == 3,
        "the record should show 3 kernels using dptr, shows {users}"
    );
    let free_node = graph
        .nodes()
        .iter()
        .find(|n| matches!(n.kind(), NodeKind::MemFree))
        .context("no free node")?;
    ensure!(
        graph
            .record()
            .allocations_of(free_node, MemRole::Free)
            .any(|a| a.same(&dptr)),
        "the free node should free dptr"
    );
    graph.check().context("the lifetime checks")?;
    println!(
        "  ✓ 1 alloc, 3 kernels, 1 free; the free is ordered after A, B and C (lifetime checks pass)"
    );

    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    for launch in 1..=LAUNCHES {
        exec.launch(&stream1)?;
        stream1.synchronize()?;
        let l = launch as u64;
        verify_u32("out_b (kernel B copied dptr)", &out_b.to_vec()?, |i| {
            i as u32
        })?;
        verify_u32(
            "out_c (kernel C accumulated 3·dptr)",
            &out_c.to_vec()?,
            |i| (3 * l * i) as u32,
        )?;
        println!(
            "  launch {launch}: ✓ out_b[i] = i, out_c[i] = {}·i for all {} elements",
            3 * launch,
            thousands(N)
        );
    }
    ensure!(
        !dptr.is_live(),
        "dptr is freed inside the graph, so it should not be live after a launch"
    );
    Ok(())
}
