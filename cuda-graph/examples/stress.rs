//! Stress and leaks, the long run: cycles of build, instantiate, launch and
//! drop, in every way a graph's memory can end, every launch's output verified; before and
//! after, the figures that show nothing leaks: graph memory used and reserved (after a
//! synchronize and a trim), the process's resident memory, and the live CUDA objects this crate
//! holds.
//!
//! One cycle runs each of seven variants once: explicit and captured graphs freed in the graph;
//! explicit and captured graphs with an unfreed allocation and AutoFreeOnLaunch, launched twice
//! and then freed by `free_async` (explicit) or by RAII (captured); explicit and captured graphs
//! whose allocation escapes and is freed by RAII (after a synchronize, or dropped while the
//! launch may still run); and an escaping allocation freed by a free node in a second graph.
//!
//! Run with `cargo run --release --example stress --features example-kernels [-- --cycles N]`
//! (10,000 cycles by default).
//! Passes (exit 0) when graph memory used and reserved are 0 after trim, the live objects are
//! back to their starting count, and resident memory grew by less than 1 MiB after a warm-up;
//! exits 1 otherwise, and 2 with one line when there is no GPU.

mod common;

use std::time::Instant;

use anyhow::{Context, bail, ensure};
use common::{Kernels, args, config, describe, thousands, verify_u32};
use cuda_graph::{
    AllocParams, AsStream, Bytes, CaptureMode, Device, DeviceBuffer, Graph, GraphAllocation,
    InstantiateFlags, LiveObjects, Stream, capture, live_objects,
};

/// Bytes of each graph allocation.
const BYTES: usize = 1 << 20;
/// Its elements.
const N: u64 = (BYTES / 4) as u64;
/// Elements copied out and verified per launch.
const SMALL: u64 = 4096;
/// Cycles run before the "before" figures, so that first-use costs are not counted as leaks.
const WARMUP: usize = 10;
/// The most resident memory may grow.
const RSS_LIMIT: u64 = 1 << 20;

/// How a graph's allocation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    ExplicitFreed,
    CapturedFreed,
    ExplicitAutoFree,
    CapturedAutoFree,
    ExplicitEscapingRaii,
    CapturedEscapingRaii,
    FreedByAnotherGraph,
}

const VARIANTS: [Variant; 7] = [
    Variant::ExplicitFreed,
    Variant::CapturedFreed,
    Variant::ExplicitAutoFree,
    Variant::CapturedAutoFree,
    Variant::ExplicitEscapingRaii,
    Variant::CapturedEscapingRaii,
    Variant::FreedByAnotherGraph,
];

/// Launches per cycle (AutoFreeOnLaunch graphs launch twice; the last variant launches two
/// graphs).
const LAUNCHES_PER_CYCLE: usize = 10;

struct Bench {
    device: Device,
    k: Kernels,
    stream: Stream,
    out: DeviceBuffer<u32>,
}

impl Bench {
    /// alloc → fill with `value` → copy SMALL values to `out` (→ free, when `free`).
    fn explicit(&self, value: u32, free: bool) -> anyhow::Result<(Graph, GraphAllocation)> {
        let mut graph = Graph::new(&self.device)?;
        let (alloc, buf) = graph.add_mem_alloc_node(&[], &AllocParams::new(&self.device, BYTES))?;
        // SAFETY: the argument lists match fill_u32 and copy_u32 (`args` checks the sizes); both
        // kernels are ordered after the alloc node and before the free node.
        let copy = unsafe {
            let fill = graph.add_kernel_node(
                &[alloc],
                &self.k.fill,
                config(N),
                &args::pnv(&buf, N, value),
            )?;
            graph.add_kernel_node(
                &[fill],
                &self.k.copy,
                config(SMALL),
                &args::copy(&self.out, &buf, SMALL),
            )?
        };
        if free {
            graph.add_mem_free_node(&[copy], &buf)?;
        }
        Ok((graph, buf))
    }

    /// The same graph, captured.
    fn captured(&self, value: u32, free: bool) -> anyhow::Result<(Graph, GraphAllocation)> {
        Ok(capture(&self.stream, CaptureMode::Global, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: as in `explicit`; captured in stream order after the allocation.
            unsafe {
                cap.launch(&self.k.fill, config(N), &args::pnv(&buf, N, value))?;
                cap.launch(
                    &self.k.copy,
                    config(SMALL),
                    &args::copy(&self.out, &buf, SMALL),
                )?;
            }
            if free {
                cap.free_async(&buf)?;
            }
            Ok(buf)
        })?)
    }

    fn verify(&self, variant: Variant, value: u32) -> anyhow::Result<()> {
        self.stream.synchronize()?;
        verify_u32(&format!("{variant:?}"), &self.out.to_vec()?, |_| value)
    }

    fn run(&self, variant: Variant, value: u32) -> anyhow::Result<()> {
        let s = &self.stream;
        match variant {
            Variant::ExplicitFreed | Variant::CapturedFreed => {
                let (graph, _buf) = if variant == Variant::ExplicitFreed {
                    self.explicit(value, true)?
                } else {
                    self.captured(value, true)?
                };
                let exec = graph.instantiate(InstantiateFlags::NONE)?;
                exec.launch(s)?;
                self.verify(variant, value)
            }
            Variant::ExplicitAutoFree | Variant::CapturedAutoFree => {
                let (graph, buf) = if variant == Variant::ExplicitAutoFree {
                    self.explicit(value, false)?
                } else {
                    self.captured(value, false)?
                };
                let exec = graph.instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)?;
                exec.launch(s)?;
                exec.launch(s)?;
                self.verify(variant, value)?;
                ensure!(buf.is_live(), "{variant:?}: the allocation is not live");
                if variant == Variant::ExplicitAutoFree {
                    buf.free_async(s)?;
                }
                Ok(())
            }
            Variant::ExplicitEscapingRaii => {
                let (graph, buf) = self.explicit(value, false)?;
                let exec = graph.instantiate(InstantiateFlags::NONE)?;
                exec.launch(s)?;
                self.verify(variant, value)?;
                ensure!(buf.is_live(), "{variant:?}: the allocation is not live");
                Ok(())
            }
            Variant::CapturedEscapingRaii => {
                let (graph, buf) = self.captured(value, false)?;
                let exec = graph.instantiate(InstantiateFlags::NONE)?;
                exec.launch(s)?;
                drop((exec, graph, buf));
                self.verify(variant, value)
            }
            Variant::FreedByAnotherGraph => {
                let (graph, buf) = self.explicit(value, false)?;
                let mut freer = Graph::new(&self.device)?;
                freer.add_mem_free_node(&[], &buf)?;
                let exec = graph.instantiate(InstantiateFlags::NONE)?;
                let freer_exec = freer.instantiate(InstantiateFlags::NONE)?;
                exec.launch(s)?;
                freer_exec.launch(s)?;
                self.verify(variant, value)?;
                ensure!(!buf.is_live(), "{variant:?}: the allocation is still live");
                Ok(())
            }
        }
    }

    fn cycles(&self, first: usize, count: usize) -> anyhow::Result<()> {
        for cycle in first..first + count {
            for (i, &variant) in VARIANTS.iter().enumerate() {
                let value = (cycle * VARIANTS.len() + i) as u32 + 1;
                self.run(variant, value)
                    .with_context(|| format!("cycle {cycle}, {variant:?}"))?;
            }
        }
        Ok(())
    }
}

/// The process's resident memory: `/proc/self/statm`'s resident pages times the page size
/// (`KernelPageSize` of `/proc/self/smaps`, 4 KiB when not found).
fn resident_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("no resident pages in /proc/self/statm")?;
    let page_kib = std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|smaps| {
            smaps
                .lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(4);
    Ok(pages * page_kib * 1024)
}

/// One row of figures.
struct Figures {
    used: Bytes,
    reserved: Bytes,
    rss: u64,
    live: LiveObjects,
}

impl Figures {
    /// After a synchronize and a trim.
    fn take(device: &Device) -> anyhow::Result<Figures> {
        device.synchronize()?;
        device.graph_mem_trim()?;
        let info = device.graph_mem_info()?;
        Ok(Figures {
            used: info.used_current,
            reserved: info.reserved_current,
            rss: resident_bytes()?,
            live: live_objects(),
        })
    }

    fn print(&self, what: &str) {
        println!(
            "  {what:<7} graph memory used {:>9}, reserved {:>9}; resident {:>8.2} MiB; live objects {}",
            self.used.to_string(),
            self.reserved.to_string(),
            self.rss as f64 / (1 << 20) as f64,
            self.live
        );
    }
}

/// `--cycles N` (also `--cycles=N`), 10,000 by default.
fn cycles_arg() -> anyhow::Result<usize> {
    let mut cycles = 10_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--cycles" {
            args.next().context("--cycles needs a number")?
        } else if let Some(v) = arg.strip_prefix("--cycles=") {
            v.to_string()
        } else {
            bail!("unknown argument {arg:?} (usage: stress [--cycles N])");
        };
        cycles = value
            .replace([',', '_'], "")
            .parse()
            .with_context(|| format!("--cycles {value:?} is not a number"))?;
    }
    Ok(cycles)
}

fn main() {
    let cycles = match cycles_arg() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e:#}", common::NAME);
            std::process::exit(common::CANNOT_RUN);
        }
    };
    common::run(|device| {
        println!(
            "stress: {} on {}",
            thousands(cycles as u64),
            describe(device)?
        );
        let stream = Stream::new(device)?;
        let bench = Bench {
            device: device.clone(),
            k: Kernels::load(device)?,
            out: DeviceBuffer::zeroed(device, SMALL as usize)?,
            stream,
        };
        let start = live_objects();
        bench.cycles(0, WARMUP)?;
        device.reset_graph_mem_high_watermarks()?;
        let before = Figures::take(device)?;
        println!(
            "{} variants a cycle, {LAUNCHES_PER_CYCLE} launches a cycle, 1 MiB allocations; figures after synchronize + trim:",
            VARIANTS.len()
        );
        before.print("before");

        let started = Instant::now();
        let step = (cycles / 10).max(1);
        let mut done = 0;
        while done < cycles {
            let count = step.min(cycles - done);
            bench.cycles(WARMUP + done, count)?;
            done += count;
            if done < cycles {
                Figures::take(device)?.print(&format!("{}%", done * 100 / cycles));
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let high = device.graph_mem_info()?;
        let after = Figures::take(device)?;
        after.print("after");
        println!(
            "{} cycles: {} graphs built, instantiated, launched and dropped, {} launches verified, in {elapsed:.1} s ({:.0} µs a graph)",
            thousands(cycles as u64),
            thousands((cycles * VARIANTS.len()) as u64),
            thousands((cycles * LAUNCHES_PER_CYCLE) as u64),
            elapsed * 1e6 / (cycles * VARIANTS.len()).max(1) as f64
        );
        println!(
            "graph memory high-water during the cycles: used {}, reserved {}",
            high.used_high, high.reserved_high
        );
        let growth = after.rss as i64 - before.rss as i64;
        println!("resident memory growth: {growth} B (limit {RSS_LIMIT} B)");

        let mut failures = Vec::new();
        if after.used.0 != 0 {
            failures.push(format!("graph memory still used: {}", after.used));
        }
        if after.reserved.0 != 0 {
            failures.push(format!(
                "graph memory still reserved after trim: {}",
                after.reserved
            ));
        }
        if after.live != start {
            failures.push(format!(
                "live objects {} at the end, {} at the start",
                after.live.total(),
                start.total()
            ));
        }
        if growth >= RSS_LIMIT as i64 {
            failures.push(format!("resident memory grew by {growth} B"));
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        println!(
            "stress: passed: nothing used, nothing reserved, no object and no resident memory leaked"
        );
        Ok(())
    });
}
