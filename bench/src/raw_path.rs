//! The workloads in raw `cuda-graph-sys` driver calls: what the safe layer does underneath,
//! without its record, checks or handles.

use std::ffi::{CString, c_void};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use cuda_graph::sys;

use crate::workload::{
    BenchError, CycleRun, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun, UpdateRun,
    Workloads, driver, update_value, verify_update,
};

/// The raw path's context, kernel and stream.
#[derive(Debug)]
pub struct RawPath {
    device: sys::CUdevice,
    ordinal: i32,
    context: sys::CUcontext,
    module: sys::CUmodule,
    fill: sys::CUfunction,
    /// `add_u32(p, n, v)`, the kernel chain's kernel.
    add: sys::CUfunction,
    stream: sys::CUstream,
    /// The chain `graph_chain` left for `launch_sync`.
    chain: Option<Chain>,
    /// The kernel chain `update_chain` set up for `update_step`.
    update: Option<UpdateChain>,
}

/// The kernel chain of the update measurements: the executable graph updated at every step
/// (destroyed before the buffer it uses: fields drop in order), its buffer, its shape, and host
/// room to read the buffer back into.
#[derive(Debug)]
struct UpdateChain {
    exec: OwnedExec,
    buffer: OwnedBuffer,
    k: u32,
    shape: Shape,
    host: Vec<u32>,
}

/// A chain left for the launch measurements.
#[derive(Debug)]
struct Chain {
    exec: OwnedExec,
    _graph: OwnedGraph,
    /// The allocations of an escaping chain ([`Mode::Escaping`]), live after each launch.
    escaped: Vec<sys::CUdeviceptr>,
}

impl RawPath {
    /// Retains device `ordinal`'s primary context (the one the runtime uses), makes it current,
    /// loads the kernels and creates a non-blocking stream.
    pub fn new(ordinal: usize) -> Result<RawPath> {
        let mut path = RawPath {
            device: 0,
            ordinal: ordinal as i32,
            context: null_mut(),
            module: null_mut(),
            fill: null_mut(),
            add: null_mut(),
            stream: null_mut(),
            chain: None,
            update: None,
        };
        // SAFETY: cuInit takes flags by value; 0 is the only valid value.
        driver(unsafe { sys::cuInit(0) }, "cuInit")?;
        driver(
            // SAFETY: valid out-pointer.
            unsafe { sys::cuDeviceGet(&mut path.device, path.ordinal) },
            "cuDeviceGet",
        )?;
        let mut context = null_mut();
        driver(
            // SAFETY: valid out-pointer; the device came from cuDeviceGet.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, path.device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        // From here on, Drop releases what was made.
        path.context = context;
        // SAFETY: the context is retained.
        driver(unsafe { sys::cuCtxSetCurrent(context) }, "cuCtxSetCurrent")?;
        let ptx = CString::new(cuda_graph::kernels::PTX)
            .map_err(|_| BenchError("the PTX contains a NUL byte".into()))?;
        driver(
            // SAFETY: valid out-pointer; the PTX is NUL-terminated and outlives the call.
            unsafe { sys::cuModuleLoadData(&mut path.module, ptx.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        driver(
            // SAFETY: valid out-pointer; the module is loaded; the name is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut path.fill, path.module, c"fill_u32".as_ptr()) },
            "cuModuleGetFunction",
        )?;
        driver(
            // SAFETY: valid out-pointer; the module is loaded; the name is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut path.add, path.module, c"add_u32".as_ptr()) },
            "cuModuleGetFunction",
        )?;
        driver(
            // SAFETY: valid out-pointer; the context is current.
            unsafe {
                sys::cuStreamCreate(
                    &mut path.stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0,
                )
            },
            "cuStreamCreate",
        )?;
        Ok(path)
    }

    /// The executable chain `graph_chain` left, for `call`, with the context current.
    fn kept(&self, call: &str) -> Result<sys::CUgraphExec> {
        self.bind()?;
        match &self.chain {
            Some(chain) => Ok(chain.exec.0),
            None => Err(BenchError(format!(
                "{call}: no chain (call graph_chain first)"
            ))),
        }
    }

    /// Makes the primary context current (the C path's runtime calls leave it current too; this
    /// is a no-op then, but the raw path does not rely on it).
    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        driver(
            unsafe { sys::cuCtxSetCurrent(self.context) },
            "cuCtxSetCurrent",
        )
    }

    /// The kernel chain of step `step`: `k` kernel nodes `add_u32(buffer, n, update_value(step,
    /// i))`, each after the previous one, no memory nodes.
    fn build_add_chain(
        &self,
        buffer: sys::CUdeviceptr,
        k: u32,
        shape: Shape,
        step: u32,
    ) -> Result<OwnedGraph> {
        let mut graph = OwnedGraph(null_mut());
        driver(
            // SAFETY: valid out-pointer; flags must be 0.
            unsafe { sys::cuGraphCreate(&mut graph.0, 0) },
            "cuGraphCreate",
        )?;
        let mut dptr = buffer;
        let mut n = shape.elements;
        let mut prev: sys::CUgraphNode = null_mut();
        for i in 0..k {
            let (deps, count) = if prev.is_null() {
                (null(), 0)
            } else {
                (&raw const prev, 1)
            };
            let mut v = update_value(step, i);
            let mut args: [*mut c_void; 3] = [
                (&raw mut dptr).cast(),
                (&raw mut n).cast(),
                (&raw mut v).cast(),
            ];
            let kernel_params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: self.add,
                gridDimX: shape.grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: shape.block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                ..Default::default()
            };
            let mut kernel = null_mut();
            driver(
                // SAFETY: out-pointer valid; `deps` holds `count` nodes of the graph; the
                // arguments match add_u32's parameters and are copied during the call; the
                // buffer holds n values and outlives the graph and its executable graphs.
                unsafe {
                    sys::cuGraphAddKernelNode(&mut kernel, graph.0, deps, count, &kernel_params)
                },
                "cuGraphAddKernelNode",
            )?;
            prev = kernel;
        }
        Ok(graph)
    }

    /// Builds `mode`'s chain; for [`Mode::Escaping`], also the addresses of its allocations.
    fn build(
        &self,
        mode: Mode,
        k: u32,
        shape: Shape,
    ) -> Result<(OwnedGraph, Vec<sys::CUdeviceptr>)> {
        let mut n = shape.elements;
        let mut escaped = Vec::new();
        match mode {
            Mode::Explicit | Mode::Escaping => {
                let mut graph = OwnedGraph(null_mut());
                driver(
                    // SAFETY: valid out-pointer; flags must be 0.
                    unsafe { sys::cuGraphCreate(&mut graph.0, 0) },
                    "cuGraphCreate",
                )?;
                let mut params = sys::CUDA_MEM_ALLOC_NODE_PARAMS {
                    poolProps: sys::CUmemPoolProps {
                        allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
                        location: sys::CUmemLocation {
                            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                            id: self.ordinal,
                        },
                        ..Default::default()
                    },
                    accessDescs: null(),
                    accessDescCount: 0,
                    bytesize: shape.bytes(),
                    dptr: 0,
                };
                let mut prev: sys::CUgraphNode = null_mut();
                for i in 0..k {
                    let (deps, count) = if prev.is_null() {
                        (null(), 0)
                    } else {
                        (&raw const prev, 1)
                    };
                    let mut alloc = null_mut();
                    driver(
                        // SAFETY: out-pointers valid; `deps` holds `count` nodes of the graph.
                        unsafe {
                            sys::cuGraphAddMemAllocNode(
                                &mut alloc,
                                graph.0,
                                deps,
                                count,
                                &mut params,
                            )
                        },
                        "cuGraphAddMemAllocNode",
                    )?;
                    let mut dptr = params.dptr;
                    let mut v = i;
                    let mut args: [*mut c_void; 3] = [
                        (&raw mut dptr).cast(),
                        (&raw mut n).cast(),
                        (&raw mut v).cast(),
                    ];
                    let kernel_params = sys::CUDA_KERNEL_NODE_PARAMS {
                        func: self.fill,
                        gridDimX: shape.grid,
                        gridDimY: 1,
                        gridDimZ: 1,
                        blockDimX: shape.block,
                        blockDimY: 1,
                        blockDimZ: 1,
                        sharedMemBytes: 0,
                        kernelParams: args.as_mut_ptr(),
                        ..Default::default()
                    };
                    let mut kernel = null_mut();
                    driver(
                        // SAFETY: out-pointer valid; the arguments match fill_u32's parameters and
                        // are copied during the call; the allocation is used between its nodes.
                        unsafe {
                            sys::cuGraphAddKernelNode(
                                &mut kernel,
                                graph.0,
                                &alloc,
                                1,
                                &kernel_params,
                            )
                        },
                        "cuGraphAddKernelNode",
                    )?;
                    if mode.escapes() {
                        // No free node: the allocation outlives the launch.
                        escaped.push(dptr);
                        prev = kernel;
                        continue;
                    }
                    let mut free = null_mut();
                    driver(
                        // SAFETY: out-pointer valid; `dptr` is the allocation of `alloc`.
                        unsafe { sys::cuGraphAddMemFreeNode(&mut free, graph.0, &kernel, 1, dptr) },
                        "cuGraphAddMemFreeNode",
                    )?;
                    prev = free;
                }
                Ok((graph, escaped))
            }
            Mode::Capture => {
                let stream = self.stream;
                driver(
                    // SAFETY: the stream is live and not capturing.
                    unsafe {
                        sys::cuStreamBeginCapture(
                            stream,
                            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
                        )
                    },
                    "cuStreamBeginCapture",
                )?;
                let capturing = CaptureGuard(stream);
                for i in 0..k {
                    let mut dptr = 0;
                    driver(
                        // SAFETY: valid out-pointer; the stream is capturing.
                        unsafe { sys::cuMemAllocAsync(&mut dptr, shape.bytes(), stream) },
                        "cuMemAllocAsync",
                    )?;
                    let mut v = i;
                    let mut args: [*mut c_void; 3] = [
                        (&raw mut dptr).cast(),
                        (&raw mut n).cast(),
                        (&raw mut v).cast(),
                    ];
                    driver(
                        // SAFETY: the arguments match fill_u32's parameters; the kernel is
                        // captured between the allocation and its free.
                        unsafe {
                            sys::cuLaunchKernel(
                                self.fill,
                                shape.grid,
                                1,
                                1,
                                shape.block,
                                1,
                                1,
                                0,
                                stream,
                                args.as_mut_ptr(),
                                null_mut(),
                            )
                        },
                        "cuLaunchKernel",
                    )?;
                    driver(
                        // SAFETY: `dptr` was allocated in this capture and is freed once.
                        unsafe { sys::cuMemFreeAsync(dptr, stream) },
                        "cuMemFreeAsync",
                    )?;
                }
                std::mem::forget(capturing);
                let mut graph = OwnedGraph(null_mut());
                driver(
                    // SAFETY: the stream is capturing; valid out-pointer.
                    unsafe { sys::cuStreamEndCapture(stream, &mut graph.0) },
                    "cuStreamEndCapture",
                )?;
                Ok((graph, escaped))
            }
        }
    }
}

impl Drop for RawPath {
    fn drop(&mut self) {
        if self.context.is_null() {
            return;
        }
        // SAFETY: each handle was made in `new` and is released once; null ones were not made.
        unsafe {
            let _ = sys::cuCtxSetCurrent(self.context);
            if !self.stream.is_null() {
                if let Some(chain) = self.chain.take() {
                    let _ = free_escaped(&chain, self.stream);
                }
                let _ = sys::cuStreamSynchronize(self.stream);
                drop(self.update.take());
                let _ = sys::cuStreamSynchronize(self.stream);
                let _ = sys::cuStreamDestroy(self.stream);
            }
            if !self.module.is_null() {
                let _ = sys::cuModuleUnload(self.module);
            }
            let _ = sys::cuDevicePrimaryCtxRelease(self.device);
        }
    }
}

/// A raw graph destroyed on drop (also on an error part-way through a build).
#[derive(Debug)]
struct OwnedGraph(sys::CUgraph);

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the graph is owned here and destroyed once.
            let _ = unsafe { sys::cuGraphDestroy(self.0) };
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
struct OwnedBuffer(sys::CUdeviceptr);

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        if self.0 != 0 {
            // SAFETY: the memory is owned here, freed once, after the work that used it (the
            // owner synchronizes first).
            let _ = unsafe { sys::cuMemFree_v2(self.0) };
        }
    }
}

/// A raw executable graph destroyed on drop.
#[derive(Debug)]
struct OwnedExec(sys::CUgraphExec);

impl Drop for OwnedExec {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the executable graph is owned here and destroyed once.
            let _ = unsafe { sys::cuGraphExecDestroy(self.0) };
        }
    }
}

impl RawPath {
    /// [`Workloads::update_step`] on `chain`.
    fn update_step_on(&self, chain: &mut UpdateChain, step: u32) -> Result<UpdateRun> {
        let (k, shape) = (chain.k, chain.shape);
        let t = Instant::now();
        let graph = self.build_add_chain(chain.buffer.0, k, shape, step)?;
        let build = t.elapsed();
        let mut info = sys::CUgraphExecUpdateResultInfo {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: null_mut(),
            errorFromNode: null_mut(),
        };
        let t = Instant::now();
        driver(
            // SAFETY: both handles are live; `info` is a valid out-pointer.
            unsafe { sys::cuGraphExecUpdate_v2(chain.exec.0, graph.0, &mut info) },
            "cuGraphExecUpdate",
        )?;
        let update = t.elapsed();
        drop(graph);

        let graph = self.build_add_chain(chain.buffer.0, k, shape, step)?;
        let t = Instant::now();
        let fresh = instantiate(&graph, Mode::Explicit)?;
        let instantiate = t.elapsed();
        drop(fresh);
        drop(graph);

        let stream = self.stream;
        driver(
            // SAFETY: the buffer holds `elements` 32-bit values; the stream is live.
            unsafe { sys::cuMemsetD32Async(chain.buffer.0, 0, shape.elements as usize, stream) },
            "cuMemsetD32Async",
        )?;
        launch(chain.exec.0, stream)?;
        synchronize(stream)?;
        driver(
            // SAFETY: `host` holds `elements` values, as many bytes as the buffer; the work that
            // wrote the buffer is done (synchronized).
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    chain.host.as_mut_ptr().cast(),
                    chain.buffer.0,
                    shape.bytes(),
                )
            },
            "cuMemcpyDtoH",
        )?;
        verify_update(&chain.host, k, step)?;
        Ok(UpdateRun {
            build,
            update,
            instantiate,
        })
    }
}

/// `cuGraphLaunch`.
fn launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's handles are live.
    driver(unsafe { sys::cuGraphLaunch(exec, stream) }, "cuGraphLaunch")
}

/// `cuStreamSynchronize`.
fn synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's stream is live.
    driver(
        unsafe { sys::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// `cuGraphInstantiateWithFlags`: with AutoFreeOnLaunch for an escaping chain, else no flags.
fn instantiate(graph: &OwnedGraph, mode: Mode) -> Result<OwnedExec> {
    let flags = if mode.escapes() {
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64
    } else {
        0
    };
    let mut exec = OwnedExec(null_mut());
    driver(
        // SAFETY: valid out-pointer; the graph is live.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec.0, graph.0, flags) },
        "cuGraphInstantiateWithFlags",
    )?;
    Ok(exec)
}

/// Frees, on `stream` after its work, the allocations the last launch of an escaping chain left
/// live (`cuMemFreeAsync`).
fn free_escaped(chain: &Chain, stream: sys::CUstream) -> Result<()> {
    for &dptr in &chain.escaped {
        driver(
            // SAFETY: the chain was launched (graph_chain launches it once), so each address is
            // a live graph allocation; freed once, after the launches queued on the stream.
            unsafe { sys::cuMemFreeAsync(dptr, stream) },
            "cuMemFreeAsync",
        )?;
    }
    Ok(())
}

/// Ends a capture that an error interrupted, discarding its graph, so the stream stays usable.
struct CaptureGuard(sys::CUstream);

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        let mut graph = null_mut();
        // SAFETY: the stream is capturing (the guard is forgotten once the capture ends).
        let _ = unsafe { sys::cuStreamEndCapture(self.0, &mut graph) };
        drop(OwnedGraph(graph));
    }
}

impl Workloads for RawPath {
    fn id(&self) -> PathId {
        PathId::Raw
    }

    fn graph_chain(&mut self, mode: Mode, k: u32, shape: Shape) -> Result<GraphRun> {
        self.release_chain()?;
        let (graph, escaped) = self.build(mode, k, shape)?;
        let exec = instantiate(&graph, mode)?;
        let t = Instant::now();
        launch(exec.0, self.stream)?;
        let chain = Chain {
            exec,
            _graph: graph,
            escaped,
        };
        // Kept from here on, so that an error still frees what the launch allocated.
        let synced = synchronize(self.stream);
        let run = GraphRun {
            check: None,
            first_launch: t.elapsed(),
        };
        self.chain = Some(chain);
        synced?;
        Ok(run)
    }

    fn steady(&mut self, launches: u32) -> Result<SteadyRun> {
        let (exec, stream) = (self.kept("steady")?, self.stream);
        let t = Instant::now();
        for _ in 0..launches {
            launch(exec, stream)?;
        }
        let enqueue = t.elapsed();
        synchronize(stream)?;
        Ok(SteadyRun {
            enqueue,
            total: t.elapsed(),
        })
    }

    fn launch_sync(&mut self, iters: u32) -> Result<Duration> {
        let (exec, stream) = (self.kept("launch_sync")?, self.stream);
        let t = Instant::now();
        for _ in 0..iters {
            launch(exec, stream)?;
            synchronize(stream)?;
        }
        Ok(t.elapsed())
    }

    fn release_chain(&mut self) -> Result<()> {
        self.bind()?;
        if let Some(chain) = self.chain.take() {
            let freed = free_escaped(&chain, self.stream);
            let synced = synchronize(self.stream);
            drop(chain);
            freed?;
            synced?;
        }
        Ok(())
    }

    fn build_instantiate(
        &mut self,
        mode: Mode,
        k: u32,
        shape: Shape,
        _checked: bool,
    ) -> Result<CycleRun> {
        self.bind()?;
        let t = Instant::now();
        let (graph, _) = self.build(mode, k, shape)?;
        let build = t.elapsed();
        let t = Instant::now();
        let exec = instantiate(&graph, mode)?;
        let instantiate = t.elapsed();
        drop(exec);
        drop(graph);
        Ok(CycleRun { build, instantiate })
    }

    fn update_chain(&mut self, k: u32, shape: Shape) -> Result<()> {
        self.release_update()?;
        let mut buffer = OwnedBuffer(0);
        let bytes = shape.bytes();
        driver(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { sys::cuMemAlloc_v2(&mut buffer.0, bytes) },
            "cuMemAlloc",
        )?;
        // Not zeroed here: each step zeroes it on the stream before its launch.
        let graph = self.build_add_chain(buffer.0, k, shape, 0)?;
        let exec = instantiate(&graph, Mode::Explicit)?;
        drop(graph);
        self.update = Some(UpdateChain {
            exec,
            buffer,
            k,
            shape,
            host: vec![0; shape.elements as usize],
        });
        Ok(())
    }

    fn update_step(&mut self, step: u32) -> Result<UpdateRun> {
        self.bind()?;
        let Some(mut chain) = self.update.take() else {
            return Err(BenchError(
                "update_step: no kernel chain (call update_chain first)".into(),
            ));
        };
        let run = self.update_step_on(&mut chain, step);
        // Kept whatever happened, for release_update.
        self.update = Some(chain);
        run
    }

    fn release_update(&mut self) -> Result<()> {
        self.bind()?;
        if let Some(chain) = self.update.take() {
            let synced = synchronize(self.stream);
            drop(chain);
            synced?;
        }
        Ok(())
    }

    fn stream_chain(&mut self, k: u32, shape: Shape, iters: u32) -> Result<StreamRun> {
        self.bind()?;
        let stream = self.stream;
        let mut n = shape.elements;
        let t = Instant::now();
        for _ in 0..iters {
            for i in 0..k {
                let mut dptr = 0;
                driver(
                    // SAFETY: valid out-pointer; the stream is live.
                    unsafe { sys::cuMemAllocAsync(&mut dptr, shape.bytes(), stream) },
                    "cuMemAllocAsync",
                )?;
                let mut v = i;
                let mut args: [*mut c_void; 3] = [
                    (&raw mut dptr).cast(),
                    (&raw mut n).cast(),
                    (&raw mut v).cast(),
                ];
                driver(
                    // SAFETY: the arguments match fill_u32's parameters; the allocation is freed
                    // after the kernel in stream order.
                    unsafe {
                        sys::cuLaunchKernel(
                            self.fill,
                            shape.grid,
                            1,
                            1,
                            shape.block,
                            1,
                            1,
                            0,
                            stream,
                            args.as_mut_ptr(),
                            null_mut(),
                        )
                    },
                    "cuLaunchKernel",
                )?;
                driver(
                    // SAFETY: `dptr` came from cuMemAllocAsync and is freed once.
                    unsafe { sys::cuMemFreeAsync(dptr, stream) },
                    "cuMemFreeAsync",
                )?;
            }
        }
        let enqueue = t.elapsed();
        synchronize(stream)?;
        Ok(StreamRun {
            enqueue,
            total: t.elapsed(),
        })
    }
}
