//! cudarc interop: a cudarc workload captured into a CUDA graph whose temporary is a graph
//! allocation, launched 1,000 times, against the same work done the cudarc way, with a cudarc
//! allocation and free of the temporary in every iteration.
//!
//! The work of one iteration, on 1 Mi words: a temporary `t = x`, `t += 1`, `y += 2 t`, then `t`
//! is freed and cudarc copies `y` into `snapshot`. After k iterations `y = 2k (x + 1)`, and so is
//! the snapshot.
//!
//! 1. Captured. `x` and `y` are cudarc allocations (`clone_htod`, `alloc_zeros`) moved into
//!    `CudarcSlice`s, so that the graph keeps them; the capture runs on cudarc's stream
//!    (`BorrowedStream::from_cudarc`); `t` is a graph allocation (`Capture::malloc_async` and
//!    `free_async`); the kernels are the crate's test kernels, given the cudarc memory with
//!    `KernelArgs::ptr`; the snapshot is cudarc's own `memcpy_dtod`, captured among them.
//! 2. The cudarc way: each iteration allocates `t` with cudarc (`clone_dtod`: an allocation and a
//!    copy), launches the same kernels on cudarc's stream, copies with cudarc, and lets cudarc free
//!    `t` (its `Drop`).
//!
//! Both results are checked word by word. A table shows the footprint after each step: the
//! device's graph memory (`Device::graph_mem_info`) and the device memory in use
//! (`cuMemGetInfo`, through cudarc's `CudaContext::mem_get_info`), and the times of both loops.
//!
//! Run with `cargo run --release --example cudarc_capture --features example-kernels,cudarc`.
//! Without a GPU it prints one line saying why and exits with status 2 (before cudarc is called:
//! cudarc panics when the driver is missing).

mod common;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::{Kernels, args, config, mib, thousands, verify_u32};
use cuda_graph::{
    AsStream, BorrowedStream, Bytes, CaptureMode, CudarcSlice, Device, GraphMemInfo,
    InstantiateFlags, KernelArgs, NodeKind, capture,
};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr};

/// Words of `x`, `y`, `t` and the snapshot.
const N: u64 = 1 << 20;
/// Bytes of each.
const BYTES: usize = N as usize * 4;
/// Iterations of each loop.
const ITERATIONS: u32 = 1000;

/// `y[i]` after `ITERATIONS` iterations, `x[i] = i`: `2 · ITERATIONS · (i + 1)` (below 2^32).
fn expected(i: u64) -> u32 {
    2 * ITERATIONS * (i as u32 + 1)
}

fn main() {
    common::run(|device| {
        println!(
            "cudarc interop: a cudarc workload captured into a graph with a graph-allocated temporary, on {}",
            common::describe(device)?
        );
        // cudarc only now that the crate has found a device.
        let ctx = CudaContext::new(device.ordinal()).context("CudaContext::new")?;
        // SAFETY: every cudarc slice of this example is used by cudarc on `cs` only; the crate
        // orders its own work. With event tracking on, cudarc's operations in the capture would
        // wait for events recorded before it, which invalidates a capture.
        unsafe { ctx.disable_event_tracking() };
        let cs = ctx.new_stream().context("CudaContext::new_stream")?;
        ensure!(
            Device::from_cudarc(&ctx)?.context_raw() == device.context_raw(),
            "cudarc's context is not the device's primary context"
        );
        let k = Kernels::load(device)?;
        let x: Vec<u32> = (0..N as u32).collect();

        device.synchronize()?;
        device.graph_mem_trim()?;
        device.reset_graph_mem_high_watermarks()?;
        let mut table = Table::default();
        table.row("start", device, &ctx)?;
        let graph_time = captured(device, &ctx, &cs, &k, &x, &mut table)?;
        let plain_time = cudarc_way(device, &ctx, &cs, &k, &x, &mut table)?;

        println!("\n  footprint (MiB)\n{}", table.print("    "));
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(ITERATIONS);
        println!(
            "  {} iterations: graph {:.1} ms ({:.1} µs each), cudarc way {:.1} ms ({:.1} µs each)",
            thousands(u64::from(ITERATIONS)),
            graph_time.as_secs_f64() * 1e3,
            per(graph_time),
            plain_time.as_secs_f64() * 1e3,
            per(plain_time),
        );
        ctx.check_err().context("cudarc's error record")?;
        let errors = device.drop_errors();
        ensure!(
            errors.count == 0,
            "errors met in Drop: {} (the last: {:?})",
            errors.count,
            errors.last
        );
        Ok(())
    });
}

/// Part 1: the work captured on cudarc's stream, launched `ITERATIONS` times.
fn captured(
    device: &Device,
    ctx: &Arc<CudaContext>,
    cs: &Arc<CudaStream>,
    k: &Kernels,
    x_host: &[u32],
    table: &mut Table,
) -> anyhow::Result<Duration> {
    println!("\n  1. captured on cudarc's stream, the temporary a graph allocation");
    // cudarc's allocations, in the crate's keeping: the graph below keeps them alive.
    let x = CudarcSlice::new(cs.clone_htod(x_host)?)?;
    let y = CudarcSlice::new(cs.alloc_zeros::<u32>(N as usize)?)?;
    // A plain cudarc slice: the destination of the cudarc copy captured below. The crate does not
    // see cudarc's work, so the graph does not keep it: it must outlive the executable graph (it
    // is dropped at the end of this function, after the graph).
    let mut snapshot = cs.alloc_zeros::<u32>(N as usize)?;
    table.row("1. cudarc: x, y, snapshot", device, ctx)?;

    // SAFETY: no capture begun outside this crate records `cs` (this example begins none with
    // cudarc), and no StreamAllocation is made on it.
    let stream = unsafe { BorrowedStream::from_cudarc(cs, device)? };
    let (graph, ()) = capture(&stream, CaptureMode::ThreadLocal, |cap| {
        let t = cap.malloc_async(BYTES)?;
        // SAFETY: (the three launches) the argument lists of `common::args` match copy_u32,
        // add_u32 and axpy_u32 and check that N words fit; `t` is used between its alloc and
        // free, and the graph keeps `x` and `y`.
        unsafe {
            cap.launch(&k.copy, config(N), &args::copy(&t, &x, N))?;
            cap.launch(&k.add, config(N), &args::pnv(&t, N, 1))?;
            cap.launch(&k.axpy, config(N), &args::axpy(&y, &t, N, 2))?;
        }
        cap.free_async(&t)?;
        // cudarc's own copy, captured: a memcpy node after the kernels.
        cs.memcpy_dtod(y.as_cudarc()?, &mut snapshot)?;
        Ok(())
    })?;
    let nodes = graph.nodes();
    let count = |f: fn(&NodeKind) -> bool| nodes.iter().filter(|n| f(n.kind())).count();
    println!(
        "     captured: {} nodes (alloc {}, kernels {}, free {}, memcpy {})",
        nodes.len(),
        count(|k| *k == NodeKind::MemAlloc),
        count(|k| matches!(k, NodeKind::Kernel(_))),
        count(|k| *k == NodeKind::MemFree),
        count(|k| *k == NodeKind::Memcpy),
    );
    let exec = graph.instantiate_and_upload(InstantiateFlags::NONE, &stream)?;
    table.row("1. graph instantiated, uploaded", device, ctx)?;

    let start = Instant::now();
    for _ in 0..ITERATIONS {
        exec.launch(&stream)?;
    }
    stream.synchronize()?;
    let time = start.elapsed();
    table.row("1. after the launches", device, ctx)?;

    verify_u32("y", &cs.clone_dtoh(y.as_cudarc()?)?, expected)?;
    verify_u32("snapshot", &cs.clone_dtoh(&snapshot)?, expected)?;
    println!(
        "     ✓ y and the snapshot are 2·{}·(x + 1) after {} launches",
        ITERATIONS,
        thousands(u64::from(ITERATIONS))
    );

    drop((exec, graph, x, y));
    device.synchronize()?;
    drop(snapshot);
    device.graph_mem_trim()?;
    cs.synchronize()?;
    table.row("1. all dropped, graph memory trimmed", device, ctx)?;
    Ok(time)
}

/// Part 2: the same work the cudarc way, with a cudarc allocation and free of `t` each time.
fn cudarc_way(
    device: &Device,
    ctx: &Arc<CudaContext>,
    cs: &Arc<CudaStream>,
    k: &Kernels,
    x_host: &[u32],
    table: &mut Table,
) -> anyhow::Result<Duration> {
    println!("\n  2. the cudarc way: the temporary allocated and freed by cudarc each iteration");
    let x = cs.clone_htod(x_host)?;
    let y = cs.alloc_zeros::<u32>(N as usize)?;
    let mut snapshot = cs.alloc_zeros::<u32>(N as usize)?;
    table.row("2. cudarc: x, y, snapshot", device, ctx)?;
    // SAFETY: as in part 1.
    let stream = unsafe { BorrowedStream::from_cudarc(cs, device)? };
    let y_ptr = y.device_ptr(cs).0;

    let start = Instant::now();
    for _ in 0..ITERATIONS {
        let t = cs.clone_dtod(&x)?;
        let t_ptr = t.device_ptr(cs).0;
        // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) and
        // axpy_u32(unsigned* dst, const unsigned* src, unsigned long long n, unsigned a) with the
        // addresses of two cudarc slices of N words passed as values: both stay allocated until
        // cudarc frees `t` on `cs` after the kernels (stream order), and `y` after the loop.
        unsafe {
            k.add.launch(
                &stream,
                config(N),
                &KernelArgs::new().value(t_ptr).value(N).value(1u32),
            )?;
            k.axpy.launch(
                &stream,
                config(N),
                &KernelArgs::new()
                    .value(y_ptr)
                    .value(t_ptr)
                    .value(N)
                    .value(2u32),
            )?;
        }
        drop(t);
        cs.memcpy_dtod(&y, &mut snapshot)?;
    }
    cs.synchronize()?;
    let time = start.elapsed();
    table.row("2. after the iterations", device, ctx)?;

    verify_u32("y", &cs.clone_dtoh(&y)?, expected)?;
    verify_u32("snapshot", &cs.clone_dtoh(&snapshot)?, expected)?;
    println!(
        "     ✓ y and the snapshot are 2·{}·(x + 1) after {} iterations",
        ITERATIONS,
        thousands(u64::from(ITERATIONS))
    );
    drop((x, y, snapshot));
    cs.synchronize()?;
    table.row("2. all dropped", device, ctx)?;
    Ok(time)
}

/// The footprint after each step: graph memory, and device memory in use.
#[derive(Default)]
struct Table {
    rows: Vec<(String, GraphMemInfo, Bytes)>,
}

impl Table {
    /// Reads the graph-memory attributes and `cuMemGetInfo` after `step`.
    fn row(&mut self, step: &str, device: &Device, ctx: &CudaContext) -> anyhow::Result<()> {
        let info = device.graph_mem_info()?;
        let (free, total) = ctx.mem_get_info().context("cuMemGetInfo")?;
        self.rows
            .push((step.into(), info, Bytes(total.saturating_sub(free) as u64)));
        Ok(())
    }

    fn print(&self, indent: &str) -> String {
        let width = self
            .rows
            .iter()
            .map(|r| r.0.chars().count())
            .max()
            .unwrap_or(4);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{indent}{:<width$}  {:>10}  {:>10}  {:>14}  {:>14}",
            "step", "graph used", "used high", "graph reserved", "device in use"
        );
        for (step, info, in_use) in &self.rows {
            let _ = writeln!(
                out,
                "{indent}{step:<width$}  {:>10}  {:>10}  {:>14}  {:>14}",
                mib(info.used_current),
                mib(info.used_high),
                mib(info.reserved_current),
                mib(*in_use)
            );
        }
        out
    }
}
