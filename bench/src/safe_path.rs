//! The workloads through the safe API (`cuda-graph`), written as a user of the crate writes them.

use std::time::{Duration, Instant};

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, ExecGraph, Function, Graph, InstantiateFlags, KernelArgs,
    LaunchConfig, Module, Node, Stream, StreamAllocation, StreamFlags, capture,
};

use crate::workload::{
    BenchError, CycleRun, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun, Workloads,
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
    /// The stream every workload runs on (non-blocking, as in the other paths).
    pub stream: Stream,
    /// The chain `graph_chain` left for `launch_sync`.
    chain: Option<(ExecGraph, Graph)>,
}

impl SafePath {
    /// Loads the kernels on `device` and makes the stream.
    pub fn new(device: &cuda_graph::Device) -> Result<SafePath> {
        let module = Module::from_ptx(device, cuda_graph::kernels::PTX)?;
        Ok(SafePath {
            device: device.clone(),
            fill: module.function("fill_u32")?,
            spin_fill: module.function("spin_then_fill_u32")?,
            stream: Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?,
            chain: None,
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
