//! G.3.1: a graph built node by node with the explicit API.
//!
//! ```text
//!          alloc            (4 MiB, "buf")
//!            |
//!            a              iota:  buf[i] = i
//!          /   \
//!         b     c           b: out_b[i] = buf[i]      c: out_c[i] += 3 * buf[i]
//!          \   / \
//!          free   d         d: out_c[i] += 1   (after c, does not touch buf)
//! ```
//!
//! `b` and `c` only read `buf`, so they can run at the same time without a race; the free node
//! depends on both (and on `a` through them). Node `d` runs after `c` but is not ordered with the
//! free, so it must not touch `buf`, and does not. Then the guide's node `e`, which uses `buf`
//! without depending on the alloc node, is added: instantiation refuses the graph with an error
//! that names `e`, before CUDA ever sees it.
//!
//! Run with `cargo run --example explicit_graph --features example-kernels`.

mod common;

use anyhow::{Context, ensure};
use common::{Kernels, args, config, thousands, verify_u32};
use cuda_graph::check::Rule;
use cuda_graph::{
    AllocParams, AsStream, Device, DeviceBuffer, Error, Graph, InstantiateFlags, Stream,
};

/// Elements of the allocation: 4 MiB of `u32`.
const N: u64 = 1 << 20;
/// How many times the graph is launched.
const LAUNCHES: u32 = 3;

fn main() {
    common::run(explicit_graph);
}

fn explicit_graph(device: &Device) -> anyhow::Result<()> {
    println!("G.3.1 explicit graph on {}", common::describe(device)?);
    let k = Kernels::load(device)?;
    let cfg = config(N);

    // Ordinary device memory for the results: the graph allocation itself is gone after each
    // launch, so b and c copy out what they read.
    let out_b = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out_c = DeviceBuffer::<u32>::zeroed(device, N as usize)?;

    let mut graph = Graph::new(device)?;
    let params = AllocParams::new(device, N as usize * 4).label("buf");
    let (alloc, buf) = graph.add_mem_alloc_node(&[], &params)?;
    println!(
        "  alloc node: {} bytes at {:#x} (fixed for the life of the graph)",
        thousands(buf.bytes() as u64),
        buf.ptr()
    );
    // SAFETY: (for this and the next three kernel nodes) each argument list comes from
    // `common::args`, which matches the kernel's signature and checks that N elements fit every
    // buffer; `buf` is used only by nodes ordered between its alloc and free nodes (the lifetime
    // checks verify it at instantiation); `out_b` and `out_c` outlive every launch, each of which
    // is synchronized before they are read or dropped.
    let a = unsafe { graph.add_kernel_node(&[alloc], &k.iota, cfg, &args::pnv(&buf, N, 0))? };
    // SAFETY: as above.
    let b = unsafe { graph.add_kernel_node(&[a], &k.copy, cfg, &args::copy(&out_b, &buf, N))? };
    // SAFETY: as above.
    let c = unsafe { graph.add_kernel_node(&[a], &k.axpy, cfg, &args::axpy(&out_c, &buf, N, 3))? };
    // Kernel nodes b and c use the allocation, so the free node depends on them; a is covered
    // through them.
    let free = graph.add_mem_free_node(&[b, c], &buf)?;
    // d depends on c but not on the free node, so it must not (and does not) touch buf.
    // SAFETY: as above.
    let d = unsafe { graph.add_kernel_node(&[c], &k.add, cfg, &args::pnv(&out_c, N, 1))? };
    for (node, label) in [(a, "a"), (b, "b"), (c, "c"), (free, "free"), (d, "d")] {
        graph.set_label(node, label)?;
    }
    graph
        .check()
        .context("the lifetime checks should accept the guide's graph")?;
    println!(
        "  {} nodes: alloc -> a -> {{b, c}} -> free, d after c; lifetime checks pass",
        graph.nodes().len()
    );

    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    let stream = Stream::new(device)?;
    for launch in 1..=LAUNCHES {
        exec.launch(&stream)?;
        stream.synchronize()?;
        let l = launch as u64;
        // out_b is overwritten by every launch; out_c accumulates 3 * i + 1 per launch.
        verify_u32("out_b (b copied buf)", &out_b.to_vec()?, |i| i as u32)?;
        verify_u32("out_c (c then d)", &out_c.to_vec()?, |i| {
            (l * (3 * i + 1)) as u32
        })?;
        println!(
            "  launch {launch}: ✓ out_b[i] = i, out_c[i] = {launch}·(3i + 1) for all {} elements",
            thousands(N)
        );
    }
    // The graph frees what it allocates, so it can be relaunched freely and nothing is left live.
    ensure!(
        !buf.is_live(),
        "buf should not outlive a launch of a graph that frees it"
    );

    // The guide's node e: it uses the allocation but does not depend on the alloc node. CUDA
    // would accept it and e would read or write whatever memory is at that address; the builder's
    // checks refuse it. (An executable graph of a graph with memory nodes must be dropped before
    // instantiating again.)
    drop(exec);
    // SAFETY: the arguments match add_u32; the node is never launched, because instantiation
    // refuses the graph (asserted below).
    let e = unsafe { graph.add_kernel_node(&[], &k.add, cfg, &args::pnv(&buf, N, 4))? };
    graph.set_label(e, "e")?;
    let error = match graph.instantiate(InstantiateFlags::NONE) {
        Ok(_) => {
            anyhow::bail!("instantiation accepted node e, which uses buf outside its lifetime")
        }
        Err(error) => error,
    };
    let message = error.to_string();
    ensure!(
        message.contains("node 'e'"),
        "the error should name node 'e': {message}"
    );
    let Error::Lifetime(lifetime) = &error else {
        anyhow::bail!("expected a lifetime error, got: {message}");
    };
    ensure!(
        lifetime
            .violations
            .iter()
            .any(|v| v.rule == Rule::NotAfterAlloc && v.node.label.as_deref() == Some("e")),
        "expected e to break the 'ordered after the alloc node' rule: {lifetime:?}"
    );
    println!("  node e added without depending on the alloc node: ✓ refused at instantiation:");
    println!("    {message}");
    Ok(())
}
