//! The workloads through the safe API (`cuda-graph`), written as a user of the crate writes them.

use std::time::{Duration, Instant};

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, DeviceBuffer, ExecGraph, Function, Graph, InstantiateFlags,
    KernelArgs, LaunchConfig, Module, Node, Stream, StreamAllocation, StreamFlags, capture,
};

use crate::workload::{
    BenchError, CycleRun, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun, UpdateRun,
    Workloads, update_value, verify_update,
};

/// The safe path's device, kernels and stream.
#[derive(Debug)]
pub struct SafePath {
    /// The device (its primary context is the one the other paths use too).
    pub device: cuda_graph::Device,
    /// `fill_u32(p, n, v)`.
    fill: Function,
    /// `spin_then_fill_u32(p, n, v, spins)`, for the footprint scenarios.
    pub spin_fill: Function,
    /// `add_u32(p, n, v)`, the kernel chain's kernel.
    add: Function,
    /// The stream every workload runs on (non-blocking, as in the other paths).
    pub stream: Stream,
    /// The chain `graph_chain` left for `launch_sync`.
    chain: Option<(ExecGraph, Graph)>,
    /// The kernel chain `update_chain` set up for `update_step`.
    update: Option<UpdateChain>,
}

/// The kernel chain of the update measurements: its buffer, the executable graph updated at
/// every step, and its shape.
#[derive(Debug)]
struct UpdateChain {
    exec: ExecGraph,
    buffer: DeviceBuffer<u32>,
    k: u32,
    shape: Shape,
}

impl SafePath {
    /// Loads the kernels on `device` and makes the stream.
    pub fn new(device: &cuda_graph::Device) -> Result<SafePath> {
        let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
        Ok(SafePath {
            device: device.clone(),
            fill: module.function("fill_u32")?,
            spin_fill: module.function("spin_then_fill_u32")?,
            add: module.function("add_u32")?,
            stream: Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?,
            chain: None,
            update: None,
        })
    }

    /// The executable chain `graph_chain` left, for `call`.
    fn kept(&self, call: &str) -> Result<&ExecGraph> {
        match &self.chain {
            Some((exec, _)) => Ok(exec),
            None => Err(BenchError(format!(
                "{call}: no chain (call graph_chain first)"
            ))),
        }
    }

    fn build(&self, mode: Mode, k: u32, shape: Shape) -> Result<Graph> {
        let config = launch_config(shape);
        let n = shape.elements;
        match mode {
            Mode::Explicit => {
                let mut graph = Graph::new(&self.device)?;
                let params = AllocParams::new(&self.device, shape.bytes());
                let mut prev: Option<Node> = None;
                for i in 0..k {
                    let deps = prev.as_slice();
                    let (alloc, buf) = graph.add_mem_alloc_node(deps, &params)?;
                    let args = KernelArgs::new().ptr(&buf).value(n).value(i);
                    // SAFETY: fill_u32 takes (unsigned* p, unsigned long long n, unsigned v); the
                    // allocation holds n values and is used only between its alloc and free nodes.
                    let kernel =
                        unsafe { graph.add_kernel_node(&[alloc], &self.fill, config, &args)? };
                    prev = Some(graph.add_mem_free_node(&[kernel], &buf)?);
                }
                Ok(graph)
            }
            Mode::Escaping => {
                let mut graph = Graph::new(&self.device)?;
                let params = AllocParams::new(&self.device, shape.bytes());
                let mut prev: Option<Node> = None;
                for i in 0..k {
                    let (alloc, buf) = graph.add_mem_alloc_node(prev.as_slice(), &params)?;
                    let args = KernelArgs::new().ptr(&buf).value(n).value(i);
                    // SAFETY: fill_u32 takes (unsigned* p, unsigned long long n, unsigned v); the
                    // allocation holds n values and outlives the launch (nothing frees it here).
                    prev = Some(unsafe {
                        graph.add_kernel_node(&[alloc], &self.fill, config, &args)?
                    });
                }
                Ok(graph)
            }
            Mode::Capture => {
                let (graph, ()) = capture(&self.stream, CaptureMode::Global, |cap| {
                    for i in 0..k {
                        let buf = cap.malloc_async(shape.bytes())?;
                        let args = KernelArgs::new().ptr(&buf).value(n).value(i);
                        // SAFETY: as above; the kernel is captured between the allocation and its
                        // free.
                        unsafe { cap.launch(&self.fill, config, &args)? };
                        cap.free_async(&buf)?;
                    }
                    Ok(())
                })?;
                Ok(graph)
            }
        }
    }
}

/// The kernel chain of step `step`: `k` nodes `add_u32(buffer, n, update_value(step, i))`, each
/// after the previous one, no memory nodes.
fn build_add_chain(
    device: &cuda_graph::Device,
    add: &Function,
    buffer: &DeviceBuffer<u32>,
    k: u32,
    shape: Shape,
    step: u32,
) -> Result<Graph> {
    let config = launch_config(shape);
    let n = shape.elements;
    let mut graph = Graph::new(device)?;
    let mut prev: Option<Node> = None;
    for i in 0..k {
        let args = KernelArgs::new()
            .ptr(buffer)
            .value(n)
            .value(update_value(step, i));
        // SAFETY: add_u32 takes (unsigned* p, unsigned long long n, unsigned v); the buffer holds
        // n values and lives as long as the graphs that refer to it.
        prev = Some(unsafe { graph.add_kernel_node(prev.as_slice(), add, config, &args)? });
    }
    Ok(graph)
}

/// How `mode`'s chain is instantiated: escaping allocations with AutoFreeOnLaunch, so that it
/// can be launched again while the previous launch's allocations are live.
fn flags(mode: Mode) -> InstantiateFlags {
    if mode.escapes() {
        InstantiateFlags::AUTO_FREE_ON_LAUNCH
    } else {
        InstantiateFlags::NONE
    }
}

/// The shape as the safe API's launch configuration.
pub fn launch_config(shape: Shape) -> LaunchConfig {
    LaunchConfig::new((shape.grid, 1, 1), (shape.block, 1, 1))
}

impl Workloads for SafePath {
    fn id(&self) -> PathId {
        PathId::Safe
    }

    fn graph_chain(&mut self, mode: Mode, k: u32, shape: Shape) -> Result<GraphRun> {
        self.release_chain()?;
        let mut run = GraphRun::default();
        let graph = self.build(mode, k, shape)?;
        let exec = graph.instantiate(flags(mode))?;

        // The checks alone, after the checked instantiation so that they do not warm it.
        let t = Instant::now();
        graph.check()?;
        run.check = Some(t.elapsed());

        let stream = &self.stream;
        let t = Instant::now();
        exec.launch(stream)?;
        stream.synchronize()?;
        run.first_launch = t.elapsed();
        self.chain = Some((exec, graph));
        Ok(run)
    }

    fn steady(&mut self, launches: u32) -> Result<SteadyRun> {
        let exec = self.kept("steady")?;
        let stream = &self.stream;
        let t = Instant::now();
        for _ in 0..launches {
            exec.launch(stream)?;
        }
        let enqueue = t.elapsed();
        stream.synchronize()?;
        Ok(SteadyRun {
            enqueue,
            total: t.elapsed(),
        })
    }

    fn launch_sync(&mut self, iters: u32) -> Result<Duration> {
        let exec = self.kept("launch_sync")?;
        let stream = &self.stream;
        let t = Instant::now();
        for _ in 0..iters {
            exec.launch(stream)?;
            stream.synchronize()?;
        }
        Ok(t.elapsed())
    }

    fn release_chain(&mut self) -> Result<()> {
        if let Some((exec, _)) = &self.chain {
            // The allocations the last launch left live (escaping chains), freed in stream order
            // as a user frees them; dropping the last handle would free them too, on the
            // device's private stream.
            for a in exec.unfreed_allocations() {
                if a.is_live() {
                    a.free_async(&self.stream)?;
                }
            }
            self.stream.synchronize()?;
            self.chain = None;
        }
        Ok(())
    }

    fn build_instantiate(
        &mut self,
        mode: Mode,
        k: u32,
        shape: Shape,
        checked: bool,
    ) -> Result<CycleRun> {
        let t = Instant::now();
        let graph = self.build(mode, k, shape)?;
        let build = t.elapsed();
        let t = Instant::now();
        let exec = if checked {
            graph.instantiate(flags(mode))?
        } else {
            // SAFETY: the benchmark's chains obey the lifetime rules (the checked path, on the
            // same chains, passes).
            unsafe { graph.instantiate_unchecked(flags(mode))? }
        };
        let instantiate = t.elapsed();
        drop(exec);
        drop(graph);
        Ok(CycleRun { build, instantiate })
    }

    fn has_unchecked(&self) -> bool {
        true
    }

    fn update_chain(&mut self, k: u32, shape: Shape) -> Result<()> {
        self.release_update()?;
        let buffer = DeviceBuffer::<u32>::zeroed(&self.device, shape.elements as usize)?;
        let exec = build_add_chain(&self.device, &self.add, &buffer, k, shape, 0)?
            .instantiate(InstantiateFlags::NONE)?;
        self.update = Some(UpdateChain {
            exec,
            buffer,
            k,
            shape,
        });
        Ok(())
    }

    fn update_step(&mut self, step: u32) -> Result<UpdateRun> {
        let Some(chain) = self.update.as_mut() else {
            return Err(BenchError(
                "update_step: no kernel chain (call update_chain first)".into(),
            ));
        };
        let (device, add) = (&self.device, &self.add);
        let (k, shape) = (chain.k, chain.shape);

        let t = Instant::now();
        let graph = build_add_chain(device, add, &chain.buffer, k, shape, step)?;
        let build = t.elapsed();
        let t = Instant::now();
        chain.exec.update(&graph)?;
        let update = t.elapsed();
        drop(graph);

        let graph = build_add_chain(device, add, &chain.buffer, k, shape, step)?;
        let t = Instant::now();
        let fresh = graph.instantiate(InstantiateFlags::NONE)?;
        let instantiate = t.elapsed();
        drop(fresh);
        drop(graph);

        chain.buffer.copy_from(&vec![0; chain.buffer.len()])?;
        chain.exec.launch(&self.stream)?;
        let values = chain.buffer.to_vec_after(&self.stream)?;
        verify_update(&values, k, step)?;
        Ok(UpdateRun {
            build,
            update,
            instantiate,
        })
    }

    fn release_update(&mut self) -> Result<()> {
        if self.update.take().is_some() {
            // The executable graph's drop lets go of the buffer once its launches are done;
            // the stream is synchronized after each launch anyway.
            self.stream.synchronize()?;
        }
        Ok(())
    }

    fn stream_chain(&mut self, k: u32, shape: Shape, iters: u32) -> Result<StreamRun> {
        let config = launch_config(shape);
        let n = shape.elements;
        let bytes = shape.bytes();
        let t = Instant::now();
        for _ in 0..iters {
            for i in 0..k {
                let buf = StreamAllocation::new(&self.stream, bytes)?;
                let args = KernelArgs::new().ptr(&buf).value(n).value(i);
                // SAFETY: fill_u32 takes (unsigned* p, unsigned long long n, unsigned v); the
                // allocation holds n values and is freed after the kernel in stream order.
                unsafe { self.fill.launch(&self.stream, config, &args)? };
                buf.free_async()?;
            }
        }
        let enqueue = t.elapsed();
        self.stream.synchronize()?;
        Ok(StreamRun {
            enqueue,
            total: t.elapsed(),
        })
    }
}
