//! Seeing a graph: the G.3.1 graph as DOT, twice.
//!
//! - `g31_driver.dot`: the driver's own description (`cuGraphDebugDotPrint` with every detail
//!   flag), memory-node parameters included.
//! - `g31_lifetime.dot`: this crate's rendering of its record (`Graph::to_dot`), where each
//!   allocation's alloc node, users and free node share a colour and a dashed line traces
//!   alloc → users → free.
//! - `g31_with_e_lifetime.dot`: the same with the guide's node e added, which uses the allocation
//!   outside its lifetime (the lifetime checks refuse it; the picture shows why).
//!
//! The files go to the directory given as the first argument (default `target/dot`). When
//! graphviz's `dot` is on `PATH`, our two DOT files are rendered to SVG next to them.
//!
//! Run with `cargo run --example lifetime_dot --features example-kernels [DIR]`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use common::{Kernels, args, config};
use cuda_graph::{AllocParams, Device, DeviceBuffer, Graph, GraphAllocation};

/// Elements of the allocation (the graph is never launched; the size only shows in the DOT).
const N: u64 = 1 << 20;

fn main() {
    let dir = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .unwrap_or_else(|| "target/dot".into()),
    );
    common::run(|device| lifetime_dot(device, &dir));
}

/// The G.3.1 graph with labelled nodes; with `with_e`, also node e.
fn g31(
    device: &Device,
    k: &Kernels,
    (out_b, out_c): (&DeviceBuffer<u32>, &DeviceBuffer<u32>),
    with_e: bool,
) -> anyhow::Result<(Graph, GraphAllocation)> {
    let cfg = config(N);
    let mut graph = Graph::new(device)?;
    let (alloc, buf) =
        graph.add_mem_alloc_node(&[], &AllocParams::new(device, N as usize * 4).label("buf"))?;
    // SAFETY: (for every kernel node here) the argument lists come from `common::args`, which
    // matches each kernel's signature and checks sizes. The graph is never instantiated or
    // launched, so no kernel runs.
    let a = unsafe { graph.add_kernel_node(&[alloc], &k.iota, cfg, &args::pnv(&buf, N, 0))? };
    // SAFETY: as above.
    let b = unsafe { graph.add_kernel_node(&[a], &k.copy, cfg, &args::copy(out_b, &buf, N))? };
    // SAFETY: as above.
    let c = unsafe { graph.add_kernel_node(&[a], &k.axpy, cfg, &args::axpy(out_c, &buf, N, 3))? };
    let free = graph.add_mem_free_node(&[b, c], &buf)?;
    // SAFETY: as above.
    let d = unsafe { graph.add_kernel_node(&[c], &k.add, cfg, &args::pnv(out_c, N, 1))? };
    for (node, label) in [
        (alloc, "alloc"),
        (a, "a"),
        (b, "b"),
        (c, "c"),
        (free, "free"),
        (d, "d"),
    ] {
        graph.set_label(node, label)?;
    }
    if with_e {
        // SAFETY: as above.
        let e = unsafe { graph.add_kernel_node(&[], &k.add, cfg, &args::pnv(&buf, N, 4))? };
        graph.set_label(e, "e")?;
    }
    Ok((graph, buf))
}

fn lifetime_dot(device: &Device, dir: &Path) -> anyhow::Result<()> {
    println!("G.3.1 graph as DOT, on {}", common::describe(device)?);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let k = Kernels::load(device)?;
    let out_b = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
    let out_c = DeviceBuffer::<u32>::zeroed(device, N as usize)?;

    let (graph, _buf) = g31(device, &k, (&out_b, &out_c), false)?;
    graph
        .check()
        .context("the G.3.1 graph should pass the lifetime checks")?;
    let driver_dot = dir.join("g31_driver.dot");
    graph.debug_dot_print(&driver_dot)?;
    let driver_text = std::fs::read_to_string(&driver_dot)
        .with_context(|| format!("reading {}", driver_dot.display()))?;
    ensure!(
        driver_text.contains("digraph"),
        "{} does not look like DOT",
        driver_dot.display()
    );
    println!(
        "  ✓ driver's DOT (cuGraphDebugDotPrint):      {} ({} bytes)",
        driver_dot.display(),
        driver_text.len()
    );

    let ours = write_dot(dir, "g31_lifetime", &graph)?;
    println!(
        "  ✓ lifetime DOT (Graph::to_dot):             {}",
        ours.display()
    );

    let (graph_e, _buf_e) = g31(device, &k, (&out_b, &out_c), true)?;
    let refusal = graph_e
        .check()
        .err()
        .context("the lifetime checks should refuse node e")?;
    ensure!(
        refusal.to_string().contains("node 'e'"),
        "the refusal should name node 'e': {refusal}"
    );
    let ours_e = write_dot(dir, "g31_with_e_lifetime", &graph_e)?;
    println!(
        "  ✓ with node e (refused by the checks):       {}",
        ours_e.display()
    );
    println!("    {refusal}");

    match render_svg(&ours)? {
        Some(svg) => {
            let svg_e = render_svg(&ours_e)?.context("graphviz vanished between two runs")?;
            println!(
                "  ✓ rendered with graphviz:                   {}",
                svg.display()
            );
            println!(
                "                                              {}",
                svg_e.display()
            );
        }
        None => println!(
            "  graphviz `dot` is not on PATH; render with: dot -Tsvg {} -o {}",
            ours.display(),
            ours.with_extension("svg").display()
        ),
    }
    Ok(())
}

/// Writes `graph.to_dot()` to `dir/name.dot` and checks that it names every labelled node.
fn write_dot(dir: &Path, name: &str, graph: &Graph) -> anyhow::Result<PathBuf> {
    let text = graph.to_dot();
    for label in graph.nodes().iter().filter_map(|n| n.label()) {
        ensure!(
            text.contains(&format!("{label}: ")),
            "our DOT lacks node '{label}'"
        );
    }
    let path = dir.join(format!("{name}.dot"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Renders `dot_file` to SVG next to it with graphviz; `None` when `dot` is not on `PATH`.
fn render_svg(dot_file: &Path) -> anyhow::Result<Option<PathBuf>> {
    let svg = dot_file.with_extension("svg");
    let status = match Command::new("dot")
        .arg("-Tsvg")
        .arg(dot_file)
        .arg("-o")
        .arg(&svg)
        .status()
    {
        Ok(status) => status,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("running graphviz `dot`"),
    };
    ensure!(
        status.success(),
        "dot -Tsvg {} failed ({status})",
        dot_file.display()
    );
    Ok(Some(svg))
}
