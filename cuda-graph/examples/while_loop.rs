//! A loop on the GPU: a WHILE conditional node whose body runs until a kernel clears the
//! condition (`cudaGraphSetConditional` in device code), with graph allocations as its scratch
//! space.
//!
//! The graph allocates a vector and a counter, fills the vector with 0, 1, 2, ..., zeroes the
//! counter, then loops: the body adds 1 to every element (`add_u32`) and then counts the
//! iteration (`count_to_then_clear`, which clears the condition once the counter reaches the
//! limit). After the loop the graph copies both out and frees them. The number of iterations is
//! decided on the GPU; the host launches the graph once. For each limit the example checks the
//! vector and the counter, and times the launch (events) against a graph that unrolls the same
//! iterations as `limit` kernel nodes.
//!
//! The condition kernels come as a fatbin (`cuda_graph::kernels::CONDITION_FATBIN`): the device
//! runtime that provides `cudaGraphSetConditional` cannot be linked into a PTX module at load
//! time.
//!
//! Run with `cargo run --release --example while_loop --features example-kernels`.

mod common;

use anyhow::ensure;
use common::{Kernels, args, config, verify_u32};
use cuda_graph::{
    AllocParams, ConditionalKind, Device, DeviceBuffer, Event, Graph, InstantiateFlags, KernelArgs,
    LaunchConfig, Module, Stream,
};

/// Elements of the vector.
const N: u64 = 1 << 16;

/// The looping graph for `limit` iterations, writing the vector to `out` and the counter to
/// `count`.
fn looping(
    device: &Device,
    k: &Kernels,
    count_to: &cuda_graph::Function,
    limit: u32,
    out: &DeviceBuffer<u32>,
    count: &DeviceBuffer<u32>,
) -> anyhow::Result<Graph> {
    let mut graph = Graph::new(device)?;
    let (a, vector) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, N as usize * 4))?;
    let (c, counter) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, 4))?;
    // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base) over the N elements of
    // `vector` (checked by `args`).
    let filled =
        unsafe { graph.add_kernel_node(&[a], &k.iota, config(N), &args::pnv(&vector, N, 0))? };
    let zeroed = graph.add_memset_node(&[c], &counter, 0, 1)?;
    let condition = graph.add_condition(Some(1))?;
    let looped = graph.add_conditional_node(
        &[filled, zeroed],
        &condition,
        ConditionalKind::While,
        |bodies| {
            let body = &mut bodies[0];
            // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over `vector`.
            let added =
                unsafe { body.add_kernel_node(&[], &k.add, config(N), &args::pnv(&vector, N, 1))? };
            let counted = KernelArgs::new()
                .value(condition.as_raw())
                .ptr(&counter)
                .value(limit);
            // SAFETY: count_to_then_clear(CUgraphConditionalHandle h, unsigned* counter,
            // unsigned limit): this graph's condition and a counter of one word.
            unsafe {
                body.add_kernel_node(
                    &[added],
                    count_to,
                    LaunchConfig::new((1, 1, 1), (32, 1, 1)),
                    &counted,
                )?
            };
            Ok(())
        },
    )?;
    let out_v = graph.add_memcpy_node(&[looped], out, &vector, N as usize * 4)?;
    let out_c = graph.add_memcpy_node(&[looped], count, &counter, 4)?;
    graph.add_mem_free_node(&[out_v], &vector)?;
    graph.add_mem_free_node(&[out_c], &counter)?;
    Ok(graph)
}

/// The same work with the iterations unrolled: `limit` add_u32 nodes in a chain.
fn unrolled(
    device: &Device,
    k: &Kernels,
    limit: u32,
    out: &DeviceBuffer<u32>,
) -> anyhow::Result<Graph> {
    let mut graph = Graph::new(device)?;
    let (a, vector) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, N as usize * 4))?;
    // SAFETY: as in `looping`.
    let mut last =
        unsafe { graph.add_kernel_node(&[a], &k.iota, config(N), &args::pnv(&vector, N, 0))? };
    for _ in 0..limit {
        // SAFETY: as in `looping`.
        last = unsafe {
            graph.add_kernel_node(&[last], &k.add, config(N), &args::pnv(&vector, N, 1))?
        };
    }
    let copied = graph.add_memcpy_node(&[last], out, &vector, N as usize * 4)?;
    graph.add_mem_free_node(&[copied], &vector)?;
    Ok(graph)
}

/// Launches `exec` on `stream` and returns the GPU time in milliseconds (events around it).
fn timed(exec: &cuda_graph::ExecGraph, stream: &Stream, device: &Device) -> anyhow::Result<f64> {
    let (start, end) = (Event::new(device)?, Event::new(device)?);
    start.record(stream)?;
    exec.launch(stream)?;
    end.record(stream)?;
    end.synchronize()?;
    Ok(end.elapsed_since(&start)?.as_secs_f64() * 1e3)
}

fn main() {
    common::run(|device| {
        let k = Kernels::load(device)?;
        let conditions = Module::from_cubin(device, cuda_graph::kernels::CONDITION_FATBIN)?;
        let count_to = conditions.function("count_to_then_clear")?;
        let stream = Stream::new(device)?;
        let out = DeviceBuffer::<u32>::zeroed(device, N as usize)?;
        let count = DeviceBuffer::<u32>::zeroed(device, 1)?;
        println!("WHILE loop on the GPU over a vector of {N} u32 in a graph allocation:");
        println!(
            "  {:>6}  {:>10}  {:>14}  {:>14}",
            "limit", "iterations", "loop (ms)", "unrolled (ms)"
        );
        for limit in [1u32, 10, 100, 1000] {
            let exec = looping(device, &k, &count_to, limit, &out, &count)?
                .instantiate(InstantiateFlags::NONE)?;
            timed(&exec, &stream, device)?; // the first launch maps the graph's memory
            let loop_ms = timed(&exec, &stream, device)?;
            let iterations = count.to_vec()?[0];
            ensure!(
                iterations == limit,
                "the loop ran {iterations} times, not {limit}"
            );
            verify_u32(&format!("the loop to {limit}"), &out.to_vec()?, |i| {
                i as u32 + limit
            })?;

            let flat = unrolled(device, &k, limit, &out)?.instantiate(InstantiateFlags::NONE)?;
            timed(&flat, &stream, device)?;
            let flat_ms = timed(&flat, &stream, device)?;
            verify_u32(&format!("the unrolled {limit}"), &out.to_vec()?, |i| {
                i as u32 + limit
            })?;
            println!("  {limit:>6}  {iterations:>10}  {loop_ms:>14.3}  {flat_ms:>14.3}");
        }
        println!("every launch verified: the vector holds i + limit, the counter the limit");
        Ok(())
    });
}
