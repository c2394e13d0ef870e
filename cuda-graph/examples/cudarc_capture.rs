//! cudarc interop: a cudarc workload captured into a CUDA graph whose temporaries are graph
//! allocations, launched 1,000 times, against the same work done the cudarc way, with cudarc
//! allocations and frees of the temporaries in every iteration.
//!
//! The work of one iteration, on 1 Mi words: a temporary `t = x`, `t += 1`, `y += 2 t`, then `t`
//! is freed and cudarc copies `y` into `snapshot`. After k iterations `y = 2k (x + 1)`, and so is
//! the snapshot. Where the machine has cuBLAS, the iteration also runs a GEMM through cudarc's
//! cuBLAS (`CudaBlas`, `Gemm::gemm`, f32): `C += A B` (256 × 256 matrices of small integers,
//! column-major), with cuBLAS's workspace a temporary of the iteration (`cublasSetWorkspace`);
//! after k iterations `C = k A B`, which is checked against the product computed on the host.
//!
//! 1. Captured. `x`, `y`, `A` and `B` are cudarc allocations (`clone_htod`, `alloc_zeros`) moved
//!    into `CudarcSlice`s, so that the graph keeps them; the capture runs on cudarc's stream
//!    (`BorrowedStream::from_cudarc`); `t` and cuBLAS's workspace are graph allocations
//!    (`Capture::malloc_async` and `free_async`); the kernels are the crate's test kernels, given
//!    the cudarc memory with `KernelArgs::ptr`; the snapshot is cudarc's own `memcpy_dtod`, and the
//!    GEMM cuBLAS's kernels, captured among them (`A` and `B` through `CudarcSlice::as_cudarc`,
//!    which makes the capture's graph keep them). A GEMM before the capture, checked on the host,
//!    loads cuBLAS's kernels outside it.
//! 2. The cudarc way: each iteration allocates `t` with cudarc (`clone_dtod`: an allocation and a
//!    copy), launches the same kernels on cudarc's stream, copies with cudarc, and lets cudarc free
//!    `t` (its `Drop`); the GEMM's workspace is a cudarc allocation of the iteration too.
//!
//! All results are checked: the words of `y` and the snapshot exactly, the GEMM's `C` within a
//! relative tolerance (its exact value is an integer below 2^24, which f32 holds). A table shows
//! the footprint after each step: the device's graph memory (`Device::graph_mem_info`) and the
//! device memory in use (`cuMemGetInfo`, through cudarc's `CudaContext::mem_get_info`), and the
//! times of both loops.
//!
//! cuBLAS is opened at run time (cudarc's `cublas` feature, with its dynamic loading, which this
//! crate's dev-dependency on cudarc turns on): nothing links it. cudarc's loader panics when the
//! library or one of its symbols is missing, so the example looks first, with `dlopen` and
//! `dlsym` on the names cudarc tries, in its order (`cudarc::get_lib_name_candidates`). Without
//! it, the example prints one line `GEMM step NOT RUN: <why>` and runs and checks the rest.
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
    AsStream, BorrowedStream, Bytes, CaptureMode, CudarcSlice, Device, DeviceAddress, GraphMemInfo,
    InstantiateFlags, KernelArgs, NodeKind, capture,
};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use gemm::{DIM, GemmStep, WORKSPACE};

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
        // cuBLAS, where the machine has it: cudarc's loader panics without it, so look first.
        let mut gemm = match gemm::missing() {
            None => Some(GemmStep::new(&cs)?),
            Some(why) => {
                println!("  GEMM step NOT RUN: {why}; the rest runs and is checked");
                None
            }
        };

        device.synchronize()?;
        device.graph_mem_trim()?;
        device.reset_graph_mem_high_watermarks()?;
        let mut table = Table::default();
        table.row("start", device, &ctx)?;
        let graph_time = captured(device, &ctx, &cs, &k, &x, gemm.as_mut(), &mut table)?;
        let plain_time = cudarc_way(device, &ctx, &cs, &k, &x, gemm.as_mut(), &mut table)?;
        drop(gemm); // cuBLAS's handle, after all its work has completed

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

/// The GEMM's matrices: `A` and `B` (whatever holds them), and `C`, a plain cudarc slice (cudarc's
/// `Gemm::gemm` writes it through `&mut`, which a `CudarcSlice` does not hand out).
struct Matrices<'g, M> {
    step: &'g mut GemmStep,
    a: M,
    b: M,
    c: CudaSlice<f32>,
}

/// Part 1: the work captured on cudarc's stream, launched `ITERATIONS` times.
fn captured(
    device: &Device,
    ctx: &Arc<CudaContext>,
    cs: &Arc<CudaStream>,
    k: &Kernels,
    x_host: &[u32],
    gemm: Option<&mut GemmStep>,
    table: &mut Table,
) -> anyhow::Result<Duration> {
    println!("\n  1. captured on cudarc's stream, the temporaries graph allocations");
    // cudarc's allocations, in the crate's keeping: the graph below keeps them alive.
    let x = CudarcSlice::new(cs.clone_htod(x_host)?)?;
    let y = CudarcSlice::new(cs.alloc_zeros::<u32>(N as usize)?)?;
    // A plain cudarc slice: the destination of the cudarc copy captured below. The crate does not
    // see cudarc's work, so the graph does not keep it: it must outlive the executable graph (it
    // is dropped at the end of this function, after the graph).
    let mut snapshot = cs.alloc_zeros::<u32>(N as usize)?;
    // The GEMM's A and B in the crate's keeping too, and its C; one GEMM before the capture, so
    // that cuBLAS loads its kernels outside it, checked on the host, then C is zeroed again.
    let mut gemm = match gemm {
        Some(step) => {
            let a = CudarcSlice::new(cs.clone_htod(&step.a)?)?;
            let b = CudarcSlice::new(cs.clone_htod(&step.b)?)?;
            let mut c = cs.alloc_zeros::<f32>(DIM * DIM)?;
            // SAFETY: cuBLAS's scratch space, which only cuBLAS reads, after writing it.
            let warm_up = unsafe { cs.alloc::<u8>(WORKSPACE) }?;
            // SAFETY: `warm_up` is WORKSPACE bytes of device memory (cudarc's allocations are
            // 256-byte aligned and more), freed by cudarc on `cs` after the GEMM queued there,
            // and the handle's workspace is reset before that.
            unsafe { step.set_workspace(warm_up.device_ptr(cs).0, WORKSPACE) }?;
            step.run(a.as_cudarc()?, b.as_cudarc()?, &mut c, 0.0)?;
            step.reset_workspace()?;
            drop(warm_up);
            step.verify("the GEMM before the capture", &cs.clone_dtoh(&c)?, 1)?;
            cs.memset_zeros(&mut c)?;
            Some(Matrices { step, a, b, c })
        }
        None => None,
    };
    let step = if gemm.is_some() {
        "1. cudarc: x, y, snapshot, A, B, C"
    } else {
        "1. cudarc: x, y, snapshot"
    };
    table.row(step, device, ctx)?;

    // SAFETY: no capture begun outside this crate records `cs` (this example begins none with
    // cudarc), and no StreamAllocation is made on it.
    let stream = unsafe { BorrowedStream::from_cudarc(cs, device)? };
    let captured = capture(&stream, CaptureMode::ThreadLocal, |cap| {
        let t = cap.malloc_async(BYTES)?;
        // SAFETY: (the three launches) the argument lists of `common::args` match copy_u32,
        // add_u32 and axpy_u32 and check that N words fit; `t` is used between its alloc and
        // free, and the graph keeps `x` and `y`.
        unsafe {
            cap.launch(&k.copy, config(N), &args::copy(&t, &x, N))?;
            cap.launch(&k.add, config(N), &args::pnv(&t, N, 1))?;
            cap.launch(&k.axpy, config(N), &args::axpy(&y, &t, N, 2))?;
        }
        // The GEMM, C += A B, its workspace a graph allocation of its own. cuBLAS's errors are
        // not this crate's: kept apart, returned after the capture (the workspace is freed in
        // the graph either way, so that the capture ends with a graph that frees what it
        // allocates).
        let gemm_outcome = match gemm.as_mut() {
            Some(m) => {
                let workspace = cap.malloc_async(WORKSPACE)?;
                // SAFETY: `workspace` is WORKSPACE bytes of graph memory (aligned to the pool's
                // granularity, far above the 256 bytes cuBLAS needs), allocated from its alloc
                // node to its free node below; the GEMM captured between them, in stream order,
                // is its only user; the handle's workspace is reset after the capture, before
                // the handle's next call.
                let outcome = unsafe { m.step.set_workspace(workspace.device_ptr(), WORKSPACE) }
                    .and_then(|()| {
                        m.step
                            .run(m.a.as_cudarc()?, m.b.as_cudarc()?, &mut m.c, 1.0)
                    });
                cap.free_async(&workspace)?;
                outcome
            }
            None => Ok(()),
        };
        cap.free_async(&t)?;
        // cudarc's own copy, captured: a memcpy node after the kernels.
        cs.memcpy_dtod(y.as_cudarc()?, &mut snapshot)?;
        Ok(gemm_outcome)
    });
    if let Some(m) = gemm.as_mut() {
        m.step.reset_workspace()?;
    }
    let (graph, gemm_outcome) = captured?;
    gemm_outcome.context("the captured GEMM")?;
    let nodes = graph.nodes();
    let count = |f: fn(&NodeKind) -> bool| nodes.iter().filter(|n| f(n.kind())).count();
    println!(
        "     captured: {} nodes (alloc {}, kernels {}{}, free {}, memcpy {})",
        nodes.len(),
        count(|k| *k == NodeKind::MemAlloc),
        count(|k| matches!(k, NodeKind::Kernel(_))),
        if gemm.is_some() {
            ", cuBLAS's among them"
        } else {
            ""
        },
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
    if let Some(m) = &gemm {
        m.step
            .verify("C after the launches", &cs.clone_dtoh(&m.c)?, ITERATIONS)?;
    }

    drop((exec, graph, x, y));
    device.synchronize()?;
    // Plain cudarc slices, which the graph did not keep: after it.
    drop((snapshot, gemm));
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
    gemm: Option<&mut GemmStep>,
    table: &mut Table,
) -> anyhow::Result<Duration> {
    println!("\n  2. the cudarc way: the temporaries allocated and freed by cudarc each iteration");
    let x = cs.clone_htod(x_host)?;
    let y = cs.alloc_zeros::<u32>(N as usize)?;
    let mut snapshot = cs.alloc_zeros::<u32>(N as usize)?;
    let mut gemm = match gemm {
        Some(step) => Some(Matrices {
            a: cs.clone_htod(&step.a)?,
            b: cs.clone_htod(&step.b)?,
            c: cs.alloc_zeros::<f32>(DIM * DIM)?,
            step,
        }),
        None => None,
    };
    let step = if gemm.is_some() {
        "2. cudarc: x, y, snapshot, A, B, C"
    } else {
        "2. cudarc: x, y, snapshot"
    };
    table.row(step, device, ctx)?;
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
        if let Some(m) = gemm.as_mut() {
            // SAFETY: cuBLAS's scratch space, which only cuBLAS reads, after writing it.
            let workspace = unsafe { cs.alloc::<u8>(WORKSPACE) }?;
            // SAFETY: `workspace` is WORKSPACE bytes of device memory (256-byte aligned and
            // more), freed by cudarc on `cs` after the GEMM queued there (stream order); the
            // handle's workspace is set anew before its next call, or reset after the loop.
            unsafe { m.step.set_workspace(workspace.device_ptr(cs).0, WORKSPACE) }?;
            m.step.run(&m.a, &m.b, &mut m.c, 1.0)?;
            drop(workspace);
        }
        drop(t);
        cs.memcpy_dtod(&y, &mut snapshot)?;
    }
    if let Some(m) = gemm.as_mut() {
        m.step.reset_workspace()?;
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
    if let Some(m) = &gemm {
        m.step
            .verify("C after the iterations", &cs.clone_dtoh(&m.c)?, ITERATIONS)?;
    }
    drop((x, y, snapshot, gemm));
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

/// The GEMM step: cudarc's cuBLAS handle on cudarc's stream, the matrices' host values, and
/// their product computed on the host; and the look for libcublas before cudarc's loader.
mod gemm {
    use std::ffi::{CStr, c_void};
    use std::sync::Arc;

    use anyhow::{Context, bail, ensure};
    use cudarc::cublas::sys::{cublasOperation_t, cublasSetWorkspace_v2};
    use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig};
    use cudarc::driver::{CudaSlice, CudaStream};

    /// Rows and columns of the square matrices `A`, `B` and `C`.
    pub const DIM: usize = 256;

    /// Bytes of cuBLAS's workspace: what cuBLAS's docs recommend for Hopper (4 MiB elsewhere;
    /// 16 KiB is its least).
    pub const WORKSPACE: usize = 32 << 20;

    /// How far `C` may be from the host's product, relative to its size (at least 1). The values
    /// are integers below 2^24, exact in f32 whatever the order of the sums: any difference is
    /// an error, and the tolerance is there for the comparison of floats, not for the data.
    const TOLERANCE: f64 = 1e-5;

    /// The libcublas symbols that cudarc's `CudaBlas::new` (create, set the stream), its f32
    /// `Gemm::gemm`, its drop (destroy) and this example (set the workspace) load: cudarc
    /// panics at the first call of one that is missing.
    const SYMBOLS: [&CStr; 5] = [
        c"cublasCreate_v2",
        c"cublasSetStream_v2",
        c"cublasSetWorkspace_v2",
        c"cublasSgemm_v2",
        c"cublasDestroy_v2",
    ];

    /// The last `dlerror` text of this thread.
    fn dl_error() -> String {
        // SAFETY: dlerror takes no argument; it returns null or a NUL-terminated string that
        // stays valid until the next dl* call of this thread (copied below, before any).
        let text = unsafe { libc::dlerror() };
        if text.is_null() {
            return "no dlerror text".into();
        }
        // SAFETY: non-null: a NUL-terminated string of dlerror's, valid for this call (above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// Why cudarc's cuBLAS cannot be used on this machine, or `None` when it can: cudarc's
    /// dynamic loading panics when the library or a symbol is missing, so this opens the names
    /// cudarc tries, in its order, the way it does (`dlopen`, `RTLD_LAZY | RTLD_LOCAL`, as
    /// `libloading` does); the first that opens is the library cudarc will load, and every symbol
    /// the example uses must be in it. The library stays open (cudarc opens it again: one more
    /// reference to the same loaded library).
    pub fn missing() -> Option<String> {
        let names = cudarc::get_lib_name_candidates("cublas");
        let mut not_found = None;
        let mut other = None;
        for name in &names {
            let Ok(c_name) = std::ffi::CString::new(name.as_str()) else {
                continue;
            };
            // SAFETY: a NUL-terminated name; opening runs the library's initializers, as
            // cudarc's own load would.
            let handle =
                unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
            if handle.is_null() {
                let error = dl_error();
                // "cannot open shared object file" for a name that is not there; anything else
                // (a dependency that is missing, a wrong architecture) says more.
                if error.contains("No such file") {
                    not_found.get_or_insert(error);
                } else {
                    other.get_or_insert(error);
                }
                continue;
            }
            let absent: Vec<_> = SYMBOLS
                .iter()
                // SAFETY: `handle` is open (above); the names are NUL-terminated.
                .filter(|symbol| unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null())
                .map(|symbol| symbol.to_string_lossy())
                .collect();
            return (!absent.is_empty()).then(|| {
                format!(
                    "{name}, the libcublas cudarc loads, lacks {} (cudarc would panic at its first call)",
                    absent.join(", ")
                )
            });
        }
        Some(format!(
            "no libcublas opens under the {} names cudarc tries ({} … {}): {}",
            names.len(),
            names.first().map_or("", String::as_str),
            names.last().map_or("", String::as_str),
            other
                .or(not_found)
                .unwrap_or_else(|| "no dlerror text".into())
        ))
    }

    /// cudarc's cuBLAS handle, on the example's cudarc stream, and the GEMM's data.
    pub struct GemmStep {
        blas: CudaBlas,
        stream: Arc<CudaStream>,
        /// `A`, column-major: small integers (-3 to 3).
        pub a: Vec<f32>,
        /// `B`, column-major: small integers (-2 to 2).
        pub b: Vec<f32>,
        /// `A B`, computed on the host (f64).
        product: Vec<f64>,
    }

    impl GemmStep {
        /// A cuBLAS handle on `stream` (cudarc's `CudaBlas::new`), the matrices and their
        /// product on the host. Call only once [`missing`] has said `None`.
        pub fn new(stream: &Arc<CudaStream>) -> anyhow::Result<GemmStep> {
            let blas = CudaBlas::new(stream.clone()).context("cudarc's CudaBlas::new")?;
            let a: Vec<f32> = (0..DIM * DIM)
                .map(|i| ((i % DIM + 2 * (i / DIM)) % 7) as f32 - 3.0)
                .collect();
            let b: Vec<f32> = (0..DIM * DIM)
                .map(|i| ((3 * (i % DIM) + i / DIM) % 5) as f32 - 2.0)
                .collect();
            // Column-major: element (row r, column c) at r + c·DIM.
            let mut product = vec![0f64; DIM * DIM];
            for c in 0..DIM {
                for k in 0..DIM {
                    let bkc = f64::from(b[k + c * DIM]);
                    for r in 0..DIM {
                        product[r + c * DIM] += f64::from(a[r + k * DIM]) * bkc;
                    }
                }
            }
            Ok(GemmStep {
                blas,
                stream: stream.clone(),
                a,
                b,
                product,
            })
        }

        /// Makes `bytes` bytes at `ptr` cuBLAS's workspace for the handle's calls that follow
        /// (`cublasSetWorkspace`).
        ///
        /// # Safety
        ///
        /// `ptr` is device memory of the handle's context, at least `bytes` bytes, aligned to
        /// 256 bytes, that stays allocated while cuBLAS work queued or captured with it may run;
        /// the workspace is set anew or [reset](GemmStep::reset_workspace) before the handle's
        /// first call after that memory is freed.
        pub unsafe fn set_workspace(&self, ptr: u64, bytes: usize) -> anyhow::Result<()> {
            // SAFETY: the handle is live (held by `self.blas`); the caller vouches for the
            // memory; the symbol is there ([`missing`]).
            unsafe { cublasSetWorkspace_v2(*self.blas.handle(), ptr as *mut c_void, bytes) }
                .result()
                .context("cublasSetWorkspace")
        }

        /// Gives the handle back cuBLAS's own workspace: `cublasSetStream`, on the same stream,
        /// resets it.
        pub fn reset_workspace(&mut self) -> anyhow::Result<()> {
            // SAFETY: cudarc's set_stream is unsafe because work could then run concurrently on
            // two streams; this is the stream the handle already has.
            unsafe { self.blas.set_stream(self.stream.clone()) }.context("cublasSetStream")
        }

        /// Queues `C = A B + beta C` (cudarc's f32 `Gemm::gemm`, `cublasSgemm`) on the handle's
        /// stream.
        pub fn run(
            &self,
            a: &CudaSlice<f32>,
            b: &CudaSlice<f32>,
            c: &mut CudaSlice<f32>,
            beta: f32,
        ) -> anyhow::Result<()> {
            ensure!(
                [a.len(), b.len(), c.len()] == [DIM * DIM; 3],
                "the GEMM's matrices are not {DIM} × {DIM}"
            );
            let dim = DIM as i32;
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: dim,
                n: dim,
                k: dim,
                alpha: 1.0,
                lda: dim,
                ldb: dim,
                beta,
                ldc: dim,
            };
            // SAFETY: the three slices hold DIM × DIM f32 each (checked), column-major with
            // leading dimension DIM, untransposed: every element cuBLAS touches is inside them;
            // the handle's workspace is valid memory (`set_workspace`'s callers) or its own.
            unsafe { self.blas.gemm(cfg, a, b, c) }.context("cuBLAS's sgemm through cudarc")
        }

        /// Checks `got` (read back from `C`) against `times · A B`.
        pub fn verify(&self, what: &str, got: &[f32], times: u32) -> anyhow::Result<()> {
            ensure!(
                got.len() == self.product.len(),
                "{what}: {} values",
                got.len()
            );
            let mut worst = 0f64;
            let mut wrong = Vec::new();
            for (i, (&g, &p)) in got.iter().zip(&self.product).enumerate() {
                let want = p * f64::from(times);
                let error = (f64::from(g) - want).abs() / want.abs().max(1.0);
                worst = worst.max(error);
                if error > TOLERANCE || error.is_nan() {
                    wrong.push((i, g, want));
                }
            }
            if let Some(&(i, g, want)) = wrong.first() {
                bail!(
                    "{what}: C[{}, {}] is {g}, expected {want} ({times} · (A B) from the host; {} of {} values off by more than {TOLERANCE:e} relative)",
                    i % DIM,
                    i / DIM,
                    wrong.len(),
                    got.len()
                );
            }
            println!(
                "     ✓ {what}: C = {times}·A·B ({DIM} × {DIM}, cuBLAS through cudarc) against the host's product, largest relative error {worst:.1e}"
            );
            Ok(())
        }
    }
}
