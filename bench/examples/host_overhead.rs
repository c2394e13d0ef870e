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
//! Launches (`launch`, `launch-raw`, `escaping`, `escaping-raw`; the stub for these is
//! `bench/host-overhead/launch_stub.c`, which adds `cuGraphLaunch`, `cuEventRecord` and
//! `cuStreamWaitEvent`): the chain built and instantiated once, then launched ROUNDS times, as
//! the benchmark's steady launch enqueues it; `escaping` is the benchmark's escaping graph (k
//! segments alloc → kernel, no free, AutoFreeOnLaunch), which the safe API launches on its slow
//! path.
//!
//! Updates (`update`, `update-raw`; the same stub, which adds `cuMemAlloc` for the buffer and
//! `cuEventQuery`): the benchmark's kernel chain (k kernel nodes `add_u32(buffer, n, v)`, each
//! after the previous one, no memory nodes) built and instantiated once, then ROUNDS times, as
//! the benchmark's steps do, rebuilt with new values, the executable graph updated from it
//! (`ExecGraph::update`, `cuGraphExecUpdate`) and launched, the graph dropped after (the stub
//! reports every launch complete, as the benchmark's are by the next update). Only the update
//! is timed; it is called through [`safe_update`] and
//! [`raw_update`], which a profiler counts alone (`callgrind --toggle-collect=*_update`).
//!
//! Usage: `host_overhead PATH K ROUNDS`, PATH one of safe, unchecked, raw, captured,
//! captured-raw (prints the mean time per segment), launch, launch-raw, escaping,
//! escaping-raw (the mean time per launch) or update, update-raw (the mean time of the update
//! per node). With no usable driver it prints one line and exits 2.

use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::{null, null_mut};
use std::time::Instant;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, ExecGraph, Function, Graph, Handle,
    InstantiateFlags, KernelArgs, LaunchConfig, Module, Node, Stream, StreamFlags, capture, sys,
};

const BYTES: usize = 1 << 18;
const ELEMENTS: u64 = (BYTES / 4) as u64;

/// Which path builds and instantiates, or launches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Safe,
    Unchecked,
    Raw,
    Captured,
    CapturedRaw,
    /// Launches of the explicit chain through the safe API (its fast launch path).
    Launch,
    /// The same through `cuGraphLaunch`.
    LaunchRaw,
    /// Launches of the escaping chain through the safe API (its slow launch path).
    Escaping,
    /// The same through `cuGraphLaunch`.
    EscapingRaw,
    /// The kernel chain rebuilt and updated through the safe API (`ExecGraph::update`).
    Update,
    /// The same in raw calls (`cuGraphExecUpdate`).
    UpdateRaw,
}

impl Path {
    /// Whether the path times launches (rather than build + instantiate).
    fn launches(self) -> bool {
        matches!(
            self,
            Path::Launch | Path::LaunchRaw | Path::Escaping | Path::EscapingRaw
        )
    }

    /// Whether the path rebuilds the kernel chain (and updates from it).
    fn updates(self) -> bool {
        matches!(self, Path::Update | Path::UpdateRaw)
    }
}

const USAGE: &str = "usage: host_overhead PATH K ROUNDS (K at least 1); PATH: safe, unchecked, raw, captured, captured-raw (build + instantiate, per segment), launch, launch-raw, escaping, escaping-raw (launches, per launch), update, update-raw (updates of the kernel chain, per node)";

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
                "launch" => Some(Path::Launch),
                "launch-raw" => Some(Path::LaunchRaw),
                "escaping" => Some(Path::Escaping),
                "escaping-raw" => Some(Path::EscapingRaw),
                "update" => Some(Path::Update),
                "update-raw" => Some(Path::UpdateRaw),
                _ => None,
            };
            path.zip(k.parse::<u32>().ok().filter(|&k| k > 0))
                .zip(rounds.parse::<u32>().ok())
        }
        _ => None,
    };
    let Some(((path, k), rounds)) = parsed else {
        eprintln!("{USAGE}");
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
    let result = if path.launches() {
        launches(&device, path, k, rounds).map(|ns| (ns, "launch"))
    } else if path.updates() {
        updates(&device, path, k, rounds).map(|ns| (ns, "node of the update"))
    } else {
        run(&device, path, k, rounds).map(|ns| (ns, "segment"))
    };
    match result {
        Ok((ns, unit)) => {
            println!("{ns:.0} ns per {unit}");
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
                    // SAFETY: the chain obeys the lifetime rules (the checked mode checks it).
                    unsafe { graph.instantiate_unchecked(InstantiateFlags::NONE)? }
                };
                drop(exec);
            }
            Path::Raw => raw_chain(device, &fill, config, k)?,
            Path::Captured => {
                let graph = captured_chain(&stream, &fill, config, k)?;
                drop(graph.instantiate(InstantiateFlags::NONE)?);
            }
            Path::CapturedRaw => raw_captured_chain(&stream, &fill, config, k)?,
            Path::Launch | Path::LaunchRaw | Path::Escaping | Path::EscapingRaw => {
                anyhow::bail!("launch paths are timed by `launches`")
            }
            Path::Update | Path::UpdateRaw => {
                anyhow::bail!("update paths are timed by `updates`")
            }
        }
    }
    let segments = f64::from(rounds) * f64::from(k);
    Ok(start.elapsed().as_nanos() as f64 / segments.max(1.0))
}

/// Builds and instantiates one chain of `k` segments (escaping for `escaping*`), launches it
/// `rounds` times on one stream; the mean time per launch (the host's: the stub runs nothing).
fn launches(device: &Device, path: Path, k: u32, rounds: u32) -> anyhow::Result<f64> {
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
    let fill = module.function("fill_u32")?;
    let config = LaunchConfig::for_elements(ELEMENTS, 256);
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?;
    let escaping = matches!(path, Path::Escaping | Path::EscapingRaw);
    let flags = if escaping {
        InstantiateFlags::AUTO_FREE_ON_LAUNCH
    } else {
        InstantiateFlags::NONE
    };
    match path {
        Path::Launch | Path::Escaping => {
            let graph = if escaping {
                safe_escaping_chain(device, &fill, config, k)?
            } else {
                safe_chain(device, &fill, config, k)?
            };
            let exec = graph.instantiate(flags)?;
            let start = Instant::now();
            for _ in 0..rounds {
                exec.launch(&stream)?;
            }
            let elapsed = start.elapsed();
            for a in exec.unfreed_allocations() {
                if a.is_live() {
                    a.free_async(&stream)?;
                }
            }
            Ok(elapsed.as_nanos() as f64 / f64::from(rounds.max(1)))
        }
        Path::LaunchRaw | Path::EscapingRaw => {
            let graph = raw_chain_graph(device, &fill, config, k, !escaping)?;
            let mut exec = null_mut();
            let mut result = ok(
                // SAFETY: valid out-pointer; the graph is live.
                unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags.bits()) },
                "cuGraphInstantiateWithFlags",
            );
            let start = Instant::now();
            if result.is_ok() {
                for _ in 0..rounds {
                    // SAFETY: both handles are live.
                    result = ok(
                        unsafe { sys::cuGraphLaunch(exec, stream.as_raw_stream()) },
                        "cuGraphLaunch",
                    );
                    if result.is_err() {
                        break;
                    }
                }
            }
            let elapsed = start.elapsed();
            if !exec.is_null() {
                // SAFETY: made above, destroyed once.
                let _ = unsafe { sys::cuGraphExecDestroy(exec) };
            }
            // SAFETY: made by raw_chain_graph, destroyed once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            result?;
            Ok(elapsed.as_nanos() as f64 / f64::from(rounds.max(1)))
        }
        _ => anyhow::bail!("not a launch path"),
    }
}

/// Builds the kernel chain of `k` nodes and instantiates it, then `rounds` times rebuilds it
/// with the round's values, updates the executable graph from it and launches it, dropping the
/// graph after; the mean time of the update per node.
fn updates(device: &Device, path: Path, k: u32, rounds: u32) -> anyhow::Result<f64> {
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
    let add = module.function("add_u32")?;
    let config = LaunchConfig::for_elements(ELEMENTS, 256);
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?;
    let buffer = DeviceBuffer::<u32>::zeroed(device, ELEMENTS as usize)?;
    let mut elapsed = std::time::Duration::ZERO;
    match path {
        Path::Update => {
            let mut exec = safe_add_chain(device, &add, config, &buffer, k, 0)?
                .instantiate(InstantiateFlags::NONE)?;
            for step in 1..=rounds {
                let graph = safe_add_chain(device, &add, config, &buffer, k, step)?;
                let start = Instant::now();
                safe_update(&mut exec, &graph)?;
                elapsed += start.elapsed();
                drop(graph);
                exec.launch(&stream)?;
            }
        }
        Path::UpdateRaw => {
            let first = raw_add_chain(&add, config, buffer.as_raw(), k, 0)?;
            let mut exec = null_mut();
            let instantiated = ok(
                // SAFETY: valid out-pointer; the graph is live.
                unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, first, 0) },
                "cuGraphInstantiateWithFlags",
            );
            // SAFETY: made by raw_add_chain, destroyed once; the executable graph does not
            // need it.
            let _ = unsafe { sys::cuGraphDestroy(first) };
            instantiated?;
            let mut result = Ok(());
            for step in 1..=rounds {
                let graph = match raw_add_chain(&add, config, buffer.as_raw(), k, step) {
                    Ok(graph) => graph,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                };
                let start = Instant::now();
                result = raw_update(exec, graph);
                elapsed += start.elapsed();
                // SAFETY: made by raw_add_chain, destroyed once.
                let _ = unsafe { sys::cuGraphDestroy(graph) };
                if result.is_ok() {
                    result = ok(
                        // SAFETY: both handles are live.
                        unsafe { sys::cuGraphLaunch(exec, stream.as_raw_stream()) },
                        "cuGraphLaunch",
                    );
                }
                if result.is_err() {
                    break;
                }
            }
            // SAFETY: made above, destroyed once (the driver defers it while launches run).
            let _ = unsafe { sys::cuGraphExecDestroy(exec) };
            result?;
        }
        _ => anyhow::bail!("not an update path"),
    }
    let nodes = f64::from(rounds) * f64::from(k);
    Ok(elapsed.as_nanos() as f64 / nodes.max(1.0))
}

/// `ExecGraph::update`, not inlined: the function a profiler singles out.
#[inline(never)]
fn safe_update(exec: &mut ExecGraph, graph: &Graph) -> cuda_graph::Result<()> {
    exec.update(graph)
}

/// `cuGraphExecUpdate`, as `src/raw_path.rs` calls it, not inlined.
#[inline(never)]
fn raw_update(exec: sys::CUgraphExec, graph: sys::CUgraph) -> anyhow::Result<()> {
    let mut info = sys::CUgraphExecUpdateResultInfo {
        result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: null_mut(),
        errorFromNode: null_mut(),
    };
    ok(
        // SAFETY: both handles are live; `info` is a valid out-pointer.
        unsafe { sys::cuGraphExecUpdate_v2(exec, graph, &mut info) },
        "cuGraphExecUpdate",
    )
}

/// The kernel chain of step `step` through the safe API, as `src/safe_path.rs` builds it: `k`
/// nodes `add_u32(buffer, n, step + i)`, each after the previous one.
fn safe_add_chain(
    device: &Device,
    add: &Function,
    config: LaunchConfig,
    buffer: &DeviceBuffer<u32>,
    k: u32,
    step: u32,
) -> cuda_graph::Result<Graph> {
    let mut graph = Graph::new(device)?;
    let mut prev: Option<Node> = None;
    for i in 0..k {
        let args = KernelArgs::new()
            .ptr(buffer)
            .value(ELEMENTS)
            .value(step.wrapping_add(i));
        // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over the buffer's n
        // values; the buffer outlives the graphs.
        prev = Some(unsafe { graph.add_kernel_node(prev.as_slice(), add, config, &args)? });
    }
    Ok(graph)
}

/// The same kernel chain in raw driver calls, as `src/raw_path.rs` writes it. On an error the
/// graph is destroyed.
fn raw_add_chain(
    add: &Function,
    config: LaunchConfig,
    buffer: sys::CUdeviceptr,
    k: u32,
    step: u32,
) -> anyhow::Result<sys::CUgraph> {
    let mut graph = null_mut();
    ok(
        // SAFETY: valid out-pointer; flags must be 0.
        unsafe { sys::cuGraphCreate(&mut graph, 0) },
        "cuGraphCreate",
    )?;
    let mut prev: sys::CUgraphNode = null_mut();
    let mut result = Ok(());
    for i in 0..k {
        let (deps, count) = if prev.is_null() {
            (null(), 0)
        } else {
            (&raw const prev, 1)
        };
        let (mut p, mut n, mut v) = (buffer, ELEMENTS, step.wrapping_add(i));
        let mut args: [*mut c_void; 3] = [
            (&raw mut p).cast(),
            (&raw mut n).cast(),
            (&raw mut v).cast(),
        ];
        let kernel_params = raw_kernel_params(add.as_raw(), config, &mut args);
        let mut kernel = null_mut();
        // SAFETY: valid out-pointer; `deps` holds `count` nodes of this graph; the arguments
        // match add_u32 and outlive the call.
        result = ok(
            unsafe { sys::cuGraphAddKernelNode(&mut kernel, graph, deps, count, &kernel_params) },
            "cuGraphAddKernelNode",
        );
        if result.is_err() {
            break;
        }
        prev = kernel;
    }
    if let Err(e) = result {
        // SAFETY: made above, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
        return Err(e);
    }
    Ok(graph)
}

/// The escaping chain through the safe API, as `src/safe_path.rs` builds it: k segments
/// alloc → kernel, each after the previous kernel, nothing freed.
fn safe_escaping_chain(
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
        // SAFETY: fill_u32 over the allocation's n values; nothing frees it in the graph.
        prev = Some(unsafe { graph.add_kernel_node(&[alloc], fill, config, &args)? });
    }
    Ok(graph)
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

/// The same chain in raw driver calls, as `src/raw_path.rs` writes it, instantiated and
/// destroyed.
fn raw_chain(device: &Device, fill: &Function, config: LaunchConfig, k: u32) -> anyhow::Result<()> {
    let graph = raw_chain_graph(device, fill, config, k, true)?;
    instantiate_and_destroy(graph, Ok(()))
}

/// The chain in raw driver calls: with free nodes (`free`), or without (the escaping chain:
/// each alloc after the previous kernel). On an error the graph is destroyed.
fn raw_chain_graph(
    device: &Device,
    fill: &Function,
    config: LaunchConfig,
    k: u32,
    free: bool,
) -> anyhow::Result<sys::CUgraph> {
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
        let kernel_params = raw_kernel_params(fill.as_raw(), config, &mut args);
        let mut kernel = null_mut();
        // SAFETY: valid out-pointer; the arguments match fill_u32 and outlive the call.
        result = ok(
            unsafe { sys::cuGraphAddKernelNode(&mut kernel, graph, &alloc, 1, &kernel_params) },
            "cuGraphAddKernelNode",
        );
        if result.is_err() {
            break;
        }
        if !free {
            prev = kernel;
            continue;
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
    if let Err(e) = result {
        // SAFETY: made above, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
        return Err(e);
    }
    Ok(graph)
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

/// A one-dimensional kernel node's parameters for the raw paths: `args` must outlive the node's
/// creation (the driver copies the values it points to).
#[inline]
fn raw_kernel_params(
    func: sys::CUfunction,
    config: LaunchConfig,
    args: &mut [*mut c_void; 3],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func,
        gridDimX: config.grid.0,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: config.block.0,
        blockDimY: 1,
        blockDimZ: 1,
        kernelParams: args.as_mut_ptr(),
        ..Default::default()
    }
}
