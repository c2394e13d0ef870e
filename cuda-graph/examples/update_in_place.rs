//! Updating an executable graph in place instead of instantiating it again.
//!
//! A chain of k = 1000 kernels `add_u32(buf, n, v)` whose values change every step (step s adds
//! `s + i` at node i), the kind of graph a program rebuilds each iteration. Each step builds the
//! new graph and makes it runnable in three ways, each timed on the host and each followed by a
//! launch whose result is checked:
//!
//! - **instantiate**: `Graph::instantiate` of the new graph (the lifetime checks, then
//!   `cuGraphInstantiateWithFlags`);
//! - **update**: `ExecGraph::update` of one executable graph from the new graph (the checks,
//!   then `cuGraphExecUpdate`);
//! - **set params**: `ExecGraph::set_kernel_node_params` on each of the k nodes, from the values
//!   alone, with no new graph built.
//!
//! Prints the median time of each over the steps and the ratios. The graph has no memory nodes:
//! updates of graphs with memory nodes are refused (`UpdateRefusal::MemoryNodes`), since an
//! alloc node's address is fixed for the life of its graph.
//!
//! Run with `cargo run --release --example update_in_place --features example-kernels`.

mod common;

use std::time::{Duration, Instant};

use common::{Kernels, args, config, verify_u32};
use cuda_graph::{AsStream, Device, DeviceBuffer, Graph, InstantiateFlags, Node, Stream};

/// Kernels in the chain.
const K: u32 = 1000;
/// Elements of the buffer.
const N: u64 = 4096;
/// Steps timed (after one warm-up step).
const STEPS: u32 = 20;

/// The chain of step `step`: node i adds `step + i`.
fn chain(
    device: &Device,
    k: &Kernels,
    buf: &DeviceBuffer<u32>,
    step: u32,
) -> anyhow::Result<(Graph, Vec<Node>)> {
    let mut graph = Graph::new(device)?;
    let mut nodes: Vec<Node> = Vec::with_capacity(K as usize);
    for i in 0..K {
        let deps: Vec<Node> = nodes.last().copied().into_iter().collect();
        // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over the N elements of
        // `buf` (checked by `args::pnv`).
        let node = unsafe {
            graph.add_kernel_node(&deps, &k.add, config(N), &args::pnv(buf, N, step + i))?
        };
        nodes.push(node);
    }
    Ok((graph, nodes))
}

/// What one launch of step `step`'s chain adds to every element.
fn step_sum(step: u32) -> u32 {
    (0..K).fold(0u32, |s, i| s.wrapping_add(step + i))
}

/// Zeroes `buf`, launches, and checks that every element is `step`'s sum.
fn launch_and_verify(
    what: &str,
    exec: &cuda_graph::ExecGraph,
    stream: &Stream,
    buf: &DeviceBuffer<u32>,
    step: u32,
) -> anyhow::Result<()> {
    buf.copy_from(&vec![0; N as usize])?;
    exec.launch(stream)?;
    stream.synchronize()?;
    let expected = step_sum(step);
    verify_u32(&format!("{what}, step {step}"), &buf.to_vec()?, |_| {
        expected
    })
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    common::run(|device| {
        let k = Kernels::load(device)?;
        let stream = Stream::new(device)?;
        let buf = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
        let (first, first_nodes) = chain(device, &k, &buf, 0)?;
        let mut updated = first.instantiate(InstantiateFlags::NONE)?;
        let mut set = first.instantiate(InstantiateFlags::NONE)?;
        let (mut build, mut instantiate, mut update, mut set_params) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for step in 0..=STEPS {
            let t = Instant::now();
            let (graph, _) = chain(device, &k, &buf, step)?;
            let built = t.elapsed();

            let t = Instant::now();
            let fresh = graph.instantiate(InstantiateFlags::NONE)?;
            let instantiated = t.elapsed();
            launch_and_verify("instantiate", &fresh, &stream, &buf, step)?;

            let t = Instant::now();
            updated.update(&graph)?;
            let was_updated = t.elapsed();
            launch_and_verify("update", &updated, &stream, &buf, step)?;

            let t = Instant::now();
            for (i, &node) in first_nodes.iter().enumerate() {
                // SAFETY: as in `chain`: add_u32 over the N elements of `buf`.
                unsafe {
                    set.set_kernel_node_params(
                        &first,
                        node,
                        &k.add,
                        config(N),
                        &args::pnv(&buf, N, step + i as u32),
                    )?;
                }
            }
            let was_set = t.elapsed();
            launch_and_verify("set params", &set, &stream, &buf, step)?;

            if step > 0 {
                build.push(built);
                instantiate.push(instantiated);
                update.push(was_updated);
                set_params.push(was_set);
            }
        }
        let (b, i, u, s) = (
            median(build),
            median(instantiate),
            median(update),
            median(set_params),
        );
        println!("k = {K} kernels, {STEPS} steps, every launch verified; median per step:");
        println!(
            "  build the new graph              {:>10.1} µs",
            b.as_secs_f64() * 1e6
        );
        println!(
            "  instantiate it                   {:>10.1} µs",
            i.as_secs_f64() * 1e6
        );
        println!(
            "  update from it                   {:>10.1} µs  ({:.1}x faster than instantiate)",
            u.as_secs_f64() * 1e6,
            i.as_secs_f64() / u.as_secs_f64()
        );
        println!(
            "  set params of the {K} nodes     {:>10.1} µs  ({:.1}x faster than instantiate, and no build)",
            s.as_secs_f64() * 1e6,
            i.as_secs_f64() / s.as_secs_f64()
        );
        Ok(())
    });
}
