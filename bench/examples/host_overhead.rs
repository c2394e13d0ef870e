//! The safe layer's own host cost: the benchmark's chain of k segments alloc → kernel → free,
//! built and instantiated through the safe API (with and without the lifetime checks) and
//! through raw `cuda-graph-sys` calls, against a driver that does nothing
//! (`tests/stub-driver/null_cuda.c`, loaded through `CUDA_GRAPH_LIBCUDA`). What remains is
//! what each path does on the host besides the driver's own work. `bench/host-overhead/run.sh`
//! builds the stub, runs this under valgrind and prints instructions per segment, which, unlike
//! time, do not vary from run to run.
//!
//! The same chain captured from a stream (`captured`, `captured-raw`) needs the stub's simulated
//! capture, which reads the captured graph back as the chain of captured calls.
//!
//! Usage: `host_overhead safe|unchecked|raw|captured|captured-raw K ROUNDS`; prints the mean
//! time per segment. With no usable driver it prints one line and exits 2.

use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::{null, null_mut};
use std::time::Instant;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, Function, Graph, InstantiateFlags, KernelArgs,
    LaunchConfig, Module, Node, Stream, StreamFlags, capture, sys,
};

const BYTES: usize = 1 << 18;
const ELEMENTS: u64 = (BYTES / 4) as u64;

/// Which path builds and instantiates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Safe,
    Unchecked,
    Raw,
    Captured,
    CapturedRaw,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [path, k, rounds] => {
            let path = match path.as_str() {
                "safe" => Some(Path::Safe),
                "unchecked" => Some(Path::Unchecked),
                "raw" => Some(Path::Raw),
                "captured" => Some(Path::Captured),
                "captured-raw" => Some(Path::CapturedRaw),
                _ => None,
            };
            path.zip(k.parse::<u32>().ok().filter(|&k| k > 0))
                .zip(rounds.parse::<u32>().ok())
        }
        _ => None,
    };
    let Some(((path, k), rounds)) = parsed else {
        eprintln!(
            "usage: host_overhead safe|unchecked|raw|captured|captured-raw K ROUNDS (K at least 1)"
        );
        return ExitCode::from(64);
    };
    let device = match Device::get(0) {
        Ok(device) => device,
        Err(e) => {
            eprintln!(
                "host_overhead: needs a CUDA driver (bench/host-overhead/run.sh loads a stub): {e}"
            );
            return ExitCode::from(2);
        }
    };
    match run(&device, path, k, rounds) {
        Ok(per_segment) => {
            println!("{per_segment:.0} ns per segment");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("host_overhead: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds and instantiates `rounds` chains of `k` segments; the mean time per segment.
fn run(device: &Device, path: Path, k: u32, rounds: u32) -> anyhow::Result<f64> {
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
    let fill = module.function("fill_u32")?;
    let config = LaunchConfig::for_elements(ELEMENTS, 256);
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?;
    let start = Instant::now();
    for _ in 0..rounds {
        match path {
            Path::Safe | Path::Unchecked => {
                let graph = safe_chain(device, &fill, config, k)?;
                let exec = if path == Path::Safe {
                    graph.instantiate(InstantiateFlags::NONE)?
                } else {
                    graph.instantiate_unchecked(InstantiateFlags::NONE)?
                };
                drop(exec);
            }
            Path::Raw => raw_chain(device, &fill, config, k)?,
            Path::Captured => {
                let graph = captured_chain(&stream, &fill, config, k)?;
                drop(graph.instantiate(InstantiateFlags::NONE)?);
            }
            Path::CapturedRaw => raw_captured_chain(&stream, &fill, config, k)?,
        }
    }
    let segments = f64::from(rounds) * f64::from(k);
    Ok(start.elapsed().as_nanos() as f64 / segments.max(1.0))
}

fn safe_chain(
    device: &Device,
    fill: &Function,
    config: LaunchConfig,
    k: u32,
) -> cuda_graph::Result<Graph> {
    let mut graph = Graph::new(device)?;
    let params = AllocParams::new(device, BYTES);
    let mut prev: Option<Node> = None;
    for i in 0..k {
        let (alloc, buf) = graph.add_mem_alloc_node(prev.as_slice(), &params)?;
        let args = KernelArgs::new().ptr(&buf).value(ELEMENTS).value(i);
        // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the allocation's
        // n values, between its alloc and free nodes.
        let kernel = unsafe { graph.add_kernel_node(&[alloc], fill, config, &args)? };
        prev = Some(graph.add_mem_free_node(&[kernel], &buf)?);
    }
    Ok(graph)
}

/// The chain captured through the safe API, as `src/safe_path.rs` builds it.
fn captured_chain(
    stream: &Stream,
    fill: &Function,
    config: LaunchConfig,
    k: u32,
) -> cuda_graph::Result<Graph> {
    let (graph, ()) = capture(stream, CaptureMode::Global, |cap| {
        for i in 0..k {
            let buf = cap.malloc_async(BYTES)?;
            let args = KernelArgs::new().ptr(&buf).value(ELEMENTS).value(i);
            // SAFETY: as in `safe_chain`; the kernel is captured between the allocation and
            // its free.
            unsafe { cap.launch(fill, config, &args)? };
            cap.free_async(&buf)?;
        }
        Ok(())
    })?;
    Ok(graph)
}

/// The captured chain in raw driver calls, as `src/raw_path.rs` writes it, instantiated and
/// destroyed.
fn raw_captured_chain(
    stream: &Stream,
    fill: &Function,
    config: LaunchConfig,
    k: u32,
) -> anyhow::Result<()> {
    let stream = stream.as_raw_stream();
    let global = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    ok(
        // SAFETY: the stream is live and not capturing.
        unsafe { sys::cuStreamBeginCapture(stream, global) },
        "cuStreamBeginCapture",
    )?;
    let mut result = Ok(());
    for i in 0..k {
        let mut dptr = 0;
        // SAFETY: valid out-pointer; the stream is capturing.
        result = ok(
            unsafe { sys::cuMemAllocAsync(&mut dptr, BYTES, stream) },
            "cuMemAllocAsync",
        );
        if result.is_err() {
            break;
        }
        let (mut n, mut v) = (ELEMENTS, i);
        let mut args: [*mut c_void; 3] = [
            (&raw mut dptr).cast(),
            (&raw mut n).cast(),
            (&raw mut v).cast(),
        ];
        let (grid, block) = (config.grid.0, config.block.0);
        // SAFETY: the arguments match fill_u32 and outlive the call; the kernel is captured
        // between the allocation and its free.
        result = ok(
            unsafe {
                sys::cuLaunchKernel(
                    fill.as_raw(),
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    args.as_mut_ptr(),
                    null_mut(),
                )
            },
            "cuLaunchKernel",
        );
        if result.is_err() {
            break;
        }
        // SAFETY: allocated in this capture, freed once.
        result = ok(
            unsafe { sys::cuMemFreeAsync(dptr, stream) },
            "cuMemFreeAsync",
        );
        if result.is_err() {
            break;
        }
    }
    let mut graph = null_mut();
    // SAFETY: ends the capture begun above; valid out-pointer.
    let ended = ok(
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
        "cuStreamEndCapture",
    );
    instantiate_and_destroy(graph, result.and(ended))
}

/// The same chain in raw driver calls, as `src/raw_path.rs` writes it.
fn raw_chain(device: &Device, fill: &Function, config: LaunchConfig, k: u32) -> anyhow::Result<()> {
    let mut graph = null_mut();
    ok(
        // SAFETY: valid out-pointer; flags must be 0.
        unsafe { sys::cuGraphCreate(&mut graph, 0) },
        "cuGraphCreate",
    )?;
    let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS {
        poolProps: sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device.ordinal() as i32,
            },
            ..Default::default()
        },
        bytesize: BYTES,
        ..Default::default()
    };
    let mut prev: sys::CUgraphNode = null_mut();
    let mut result = Ok(());
    for i in 0..k {
        let (deps, count) = if prev.is_null() {
            (null(), 0)
        } else {
            (&raw const prev, 1)
        };
        let mut alloc = null_mut();
        // SAFETY: valid out-pointers; `deps` holds `count` nodes of this graph.
        result = ok(
            unsafe { sys::cuGraphAddMemAllocNode(&mut alloc, graph, deps, count, &mut params) },
            "cuGraphAddMemAllocNode",
        );
        if result.is_err() {
            break;
        }
        let (mut p, mut n, mut v) = (params.dptr, ELEMENTS, i);
        let mut args: [*mut c_void; 3] = [
            (&raw mut p).cast(),
            (&raw mut n).cast(),
            (&raw mut v).cast(),
        ];
        let kernel_params = sys::CUDA_KERNEL_NODE_PARAMS {
            func: fill.as_raw(),
            gridDimX: config.grid.0,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: config.block.0,
            blockDimY: 1,
            blockDimZ: 1,
            kernelParams: args.as_mut_ptr(),
            ..Default::default()
        };
        let mut kernel = null_mut();
        // SAFETY: valid out-pointer; the arguments match fill_u32 and outlive the call.
        result = ok(
            unsafe { sys::cuGraphAddKernelNode(&mut kernel, graph, &alloc, 1, &kernel_params) },
            "cuGraphAddKernelNode",
        );
        if result.is_err() {
            break;
        }
        // SAFETY: valid out-pointer; the address came from the alloc node.
        result = ok(
            unsafe { sys::cuGraphAddMemFreeNode(&mut prev, graph, &kernel, 1, params.dptr) },
            "cuGraphAddMemFreeNode",
        );
        if result.is_err() {
            break;
        }
    }
    instantiate_and_destroy(graph, result)
}

/// A driver call's result as an error naming the call.
fn ok(code: sys::CUresult, call: &'static str) -> anyhow::Result<()> {
    anyhow::ensure!(
        code == sys::CUresult::CUDA_SUCCESS,
        "{call} failed: {:?}",
        code
    );
    Ok(())
}

/// After a raw build that ended with `built`: instantiates `graph` and destroys the executable
/// graph (when the build succeeded), then destroys `graph` (when there is one).
fn instantiate_and_destroy(graph: sys::CUgraph, built: anyhow::Result<()>) -> anyhow::Result<()> {
    let mut result = built;
    if result.is_ok() {
        let mut exec = null_mut();
        result = ok(
            // SAFETY: valid out-pointer; the graph is live.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) },
            "cuGraphInstantiateWithFlags",
        );
        if result.is_ok() {
            // SAFETY: made just above, destroyed once.
            let _ = unsafe { sys::cuGraphExecDestroy(exec) };
        }
    }
    if !graph.is_null() {
        // SAFETY: made by the build, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
    result
}
