//! The footprint scenarios of NVIDIA's graphMemoryFootprint sample, through the safe API and
//! through the C baseline, with the device's graph-memory attributes read after each step.
//!
//! The steps, in the order both sides record them (`c/graph_bench.c` documents the same order):
//!
//! 1. address reuse in one graph: alloc A → free A → alloc B → free B;
//! 2. eight graphs (alloc → kernel → free) launched into one stream;
//! 3. eight such graphs launched into eight streams;
//! 4. eight graphs that allocate and do not free, launched into one stream; trimmed with the
//!    allocations live, then freed, then trimmed.
//!
//! Each starts from a synchronized, trimmed device with its high-water marks reset, and ends with
//! the executable graphs destroyed and a trim.

use cuda_graph::{
    AllocParams, AsStream, Device, Graph, GraphAllocation, InstantiateFlags, KernelArgs, Stream,
    StreamFlags,
};

use crate::c_path::CPath;
use crate::safe_path::{SafePath, launch_config};
use crate::workload::{BenchError, Result, Shape};

/// Graphs per scenario, as in the sample.
pub const GRAPHS: usize = 8;

/// The device's graph-memory attributes at one step, in bytes (`gb_mem` on the C side).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mem {
    /// `USED_MEM_CURRENT`.
    pub used: u64,
    /// `RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `USED_MEM_HIGH`.
    pub used_high: u64,
    /// `RESERVED_MEM_HIGH`.
    pub reserved_high: u64,
}

/// One scenario as both paths ran it.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its title.
    pub name: &'static str,
    /// What the sample shows with it.
    pub expect: &'static str,
    /// The name of each step.
    pub steps: Vec<String>,
    /// The safe API's figures, one per step.
    pub safe: Vec<Mem>,
    /// The C baseline's figures, one per step.
    pub c: Vec<Mem>,
    /// A property both sides check, with each side's answer: (what, safe, C).
    pub property: Option<(&'static str, bool, bool)>,
}

impl Scenario {
    /// Whether used and reserved memory agree at every step.
    pub fn identical(&self) -> bool {
        self.safe.len() == self.c.len()
            && self
                .safe
                .iter()
                .zip(&self.c)
                .all(|(s, c)| s.used == c.used && s.reserved == c.reserved)
    }
}

/// What the scenarios allocate: 64 MiB, as in the sample.
pub const BYTES: usize = 64 << 20;

/// The kernel of scenarios 2 and 3: `spin_then_fill_u32` over the 64 MiB, long enough (about
/// 50 ms at 2 GHz) that graphs launched into different streams overlap, however long the host
/// takes to launch the next one.
pub const SPIN_SHAPE: Shape = Shape {
    elements: (BYTES / 4) as u64,
    grid: 256,
    block: 256,
};

/// Clock cycles each thread of the spinning kernel waits.
pub const SPINS: u64 = 100_000_000;

fn step_names(scenario: usize) -> Vec<String> {
    let mut v = Vec::new();
    match scenario {
        0 => {
            v.push("instantiated (graph destroyed)".to_string());
            v.push("launched, synchronized".to_string());
        }
        1 => {
            v.push(format!("{GRAPHS} graphs instantiated"));
            v.push("graph 0 launched".to_string());
            v.push("graph 0 relaunched".to_string());
            for i in 1..GRAPHS {
                v.push(format!("graph {i} launched"));
            }
            v.push("synchronized".to_string());
        }
        2 => {
            v.push(format!("{GRAPHS} graphs instantiated"));
            for i in 0..GRAPHS {
                v.push(format!("graph {i} launched into stream {i}"));
            }
            v.push("all streams synchronized".to_string());
        }
        _ => {
            v.push(format!("{GRAPHS} graphs instantiated"));
            for i in 0..GRAPHS {
                v.push(format!("graph {i} launched"));
            }
            v.push("synchronized".to_string());
            v.push("trimmed, allocations still live".to_string());
            v.push("allocations freed (free_async), synchronized".to_string());
            v.push("trimmed".to_string());
        }
    }
    v.push("execs destroyed, trimmed".to_string());
    v
}

/// Runs the four scenarios, each through the safe API and then through C.
pub fn run(safe: &SafePath, c: &mut CPath) -> Result<Vec<Scenario>> {
    let mut out = Vec::new();

    let (safe_steps, safe_same) =
        address_reuse(safe).map_err(|e| e.context("safe path, footprint: address reuse"))?;
    let (c_steps, c_same) = c
        .address_reuse(BYTES)
        .map_err(|e| e.context("C path, footprint: address reuse"))?;
    out.push(Scenario {
        name: "address reuse in one graph",
        expect: "alloc B after free A gets A's address: one allocation's memory",
        steps: step_names(0),
        safe: safe_steps,
        c: c_steps,
        property: Some(("B has A's address", safe_same, c_same)),
    });

    let (safe_steps, safe_distinct) =
        one_stream(safe).map_err(|e| e.context("safe path, footprint: one stream"))?;
    let (c_steps, c_distinct) = c
        .one_stream(SPIN_SHAPE, SPINS)
        .map_err(|e| e.context("C path, footprint: one stream"))?;
    out.push(Scenario {
        name: "eight graphs in one stream",
        expect: "distinct addresses, one allocation's physical memory shared by all",
        steps: step_names(1),
        safe: safe_steps,
        c: c_steps,
        property: Some(("all addresses differ", safe_distinct, c_distinct)),
    });

    let safe_steps =
        concurrent(safe).map_err(|e| e.context("safe path, footprint: concurrent streams"))?;
    let c_steps = c
        .concurrent(SPIN_SHAPE, SPINS)
        .map_err(|e| e.context("C path, footprint: concurrent streams"))?;
    out.push(Scenario {
        name: "graphs in concurrent streams",
        expect: "each concurrent launch needs memory of its own: the footprint grows",
        steps: step_names(2),
        safe: safe_steps,
        c: c_steps,
        property: None,
    });

    let safe_steps =
        unfreed(safe).map_err(|e| e.context("safe path, footprint: unfreed allocations"))?;
    let c_steps = c
        .unfreed(BYTES)
        .map_err(|e| e.context("C path, footprint: unfreed allocations"))?;
    out.push(Scenario {
        name: "unfreed allocations, free, trim",
        expect: "unfreed allocations keep their memory through a trim; freed, a trim returns it",
        steps: step_names(3),
        safe: safe_steps,
        c: c_steps,
        property: None,
    });

    for s in &out {
        if s.safe.len() != s.steps.len() || s.c.len() != s.steps.len() {
            return Err(BenchError(format!(
                "footprint scenario '{}': {} steps named, the safe path recorded {}, C recorded {}",
                s.name,
                s.steps.len(),
                s.safe.len(),
                s.c.len()
            )));
        }
    }
    Ok(out)
}

fn read(device: &Device) -> Result<Mem> {
    let info = device.graph_mem_info()?;
    Ok(Mem {
        used: info.used_current.0,
        reserved: info.reserved_current.0,
        used_high: info.used_high.0,
        reserved_high: info.reserved_high.0,
    })
}

fn fresh_start(device: &Device) -> Result<()> {
    device.synchronize()?;
    device.graph_mem_trim()?;
    device.reset_graph_mem_high_watermarks()?;
    Ok(())
}

fn address_reuse(p: &SafePath) -> Result<(Vec<Mem>, bool)> {
    let device = &p.device;
    let mut steps = Vec::new();
    fresh_start(device)?;
    let params = AllocParams::new(device, BYTES);
    let mut graph = Graph::new(device)?;
    let (alloc_a, a) = graph.add_mem_alloc_node(&[], &params)?;
    let free_a = graph.add_mem_free_node(&[alloc_a], &a)?;
    let (alloc_b, b) = graph.add_mem_alloc_node(&[free_a], &params)?;
    graph.add_mem_free_node(&[alloc_b], &b)?;
    let same = a.ptr() == b.ptr();
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    drop(graph);
    steps.push(read(device)?);
    exec.launch(&p.stream)?;
    p.stream.synchronize()?;
    steps.push(read(device)?);
    drop(exec);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    Ok((steps, same))
}

/// alloc → spin_then_fill_u32 → free, instantiated; the graph itself is dropped.
fn simple_alloc_free_graph(p: &SafePath) -> Result<(cuda_graph::ExecGraph, u64)> {
    let device = &p.device;
    let mut graph = Graph::new(device)?;
    let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))?;
    let args = KernelArgs::new()
        .ptr(&buf)
        .value(SPIN_SHAPE.elements)
        .value(7u32)
        .value(SPINS);
    // SAFETY: spin_then_fill_u32 takes (unsigned* p, unsigned long long n, unsigned v,
    // unsigned long long spins); the allocation holds n values between its alloc and free nodes.
    let kernel =
        unsafe { graph.add_kernel_node(&[alloc], &p.spin_fill, launch_config(SPIN_SHAPE), &args)? };
    graph.add_mem_free_node(&[kernel], &buf)?;
    let exec = graph.instantiate(InstantiateFlags::NONE)?;
    Ok((exec, buf.ptr()))
}

fn one_stream(p: &SafePath) -> Result<(Vec<Mem>, bool)> {
    let device = &p.device;
    let mut steps = Vec::new();
    fresh_start(device)?;
    let mut execs = Vec::new();
    let mut ptrs = Vec::new();
    for _ in 0..GRAPHS {
        let (exec, ptr) = simple_alloc_free_graph(p)?;
        execs.push(exec);
        ptrs.push(ptr);
    }
    steps.push(read(device)?);
    execs[0].launch(&p.stream)?;
    steps.push(read(device)?);
    execs[0].launch(&p.stream)?;
    steps.push(read(device)?);
    for exec in &execs[1..] {
        exec.launch(&p.stream)?;
        steps.push(read(device)?);
    }
    p.stream.synchronize()?;
    steps.push(read(device)?);
    let distinct = (0..ptrs.len()).all(|i| !ptrs[i + 1..].contains(&ptrs[i]));
    drop(execs);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    Ok((steps, distinct))
}

fn concurrent(p: &SafePath) -> Result<Vec<Mem>> {
    let device = &p.device;
    let mut steps = Vec::new();
    fresh_start(device)?;
    let mut execs = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..GRAPHS {
        execs.push(simple_alloc_free_graph(p)?.0);
        streams.push(Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0)?);
    }
    steps.push(read(device)?);
    for (exec, stream) in execs.iter().zip(&streams) {
        exec.launch(stream)?;
        steps.push(read(device)?);
    }
    for stream in &streams {
        stream.synchronize()?;
    }
    steps.push(read(device)?);
    drop(execs);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    Ok(steps)
}

fn unfreed(p: &SafePath) -> Result<Vec<Mem>> {
    let device = &p.device;
    let mut steps = Vec::new();
    fresh_start(device)?;
    let mut execs = Vec::new();
    let mut allocations: Vec<GraphAllocation> = Vec::new();
    for _ in 0..GRAPHS {
        let mut graph = Graph::new(device)?;
        let (_, allocation) = graph.add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))?;
        execs.push(graph.instantiate(InstantiateFlags::NONE)?);
        allocations.push(allocation);
    }
    steps.push(read(device)?);
    for exec in &execs {
        exec.launch(&p.stream)?;
        steps.push(read(device)?);
    }
    p.stream.synchronize()?;
    steps.push(read(device)?);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    for allocation in &allocations {
        allocation.free_async(&p.stream)?;
    }
    p.stream.synchronize()?;
    steps.push(read(device)?);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    drop(execs);
    drop(allocations);
    device.graph_mem_trim()?;
    steps.push(read(device)?);
    Ok(steps)
}
