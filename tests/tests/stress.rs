//! Short stress for the GPU suite (issue 6, item 2): cycles of build, instantiate, launch and
//! drop, in every way a graph's memory can end, each launch's output verified; then, after a
//! synchronize and a trim, no graph memory is used or reserved, the live CUDA objects we track
//! are back to their starting count, and the process's resident memory has grown by less than
//! 1 MiB.
//!
//! One cycle runs each [`Variant`] once: explicit and captured graphs; freed in the graph;
//! unfreed with AutoFreeOnLaunch (relaunched, then freed by `free_async` or by RAII); escaping
//! and freed by RAII (after a synchronize, or dropped while the launch may still run); escaping
//! and freed by a free node in a second graph. 500 cycles by default
//! (`CUDA_GRAPH_STRESS_CYCLES=<n>` to change it; 20 under compute-sanitizer, which
//! `ci/sanitize-runner.sh` announces with `SANITIZER_TOOL`, and which also makes the resident
//! memory figure meaningless, so it is printed but not asserted there). The long run is the
//! example `cargo run --release --example stress` (10,000 cycles).
//!
//! Skips without a GPU (prints `SKIPPED ...`); fails instead under `CUDA_GRAPH_REQUIRE_GPU=1`.

mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, DeviceBuffer, Graph, GraphAllocation, InstantiateFlags,
    KernelArgs, Stream, capture, live_objects,
};
use safe_common::{BYTES, Gpu, MIB, N, assert_all, config, gpu, mem_info};

/// Elements copied out and verified per launch.
const SMALL: u64 = 4096;

/// How a graph's allocation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Explicit graph, freed by its own free node.
    ExplicitFreed,
    /// Captured graph, freed by a captured `free_async`.
    CapturedFreed,
    /// Explicit, unfreed, AutoFreeOnLaunch: launched twice, then `free_async`.
    ExplicitAutoFree,
    /// Captured, unfreed, AutoFreeOnLaunch: launched twice, then freed by RAII.
    CapturedAutoFree,
    /// Explicit, unfreed: launched once, synchronized, then freed by RAII.
    ExplicitEscapingRaii,
    /// Captured, unfreed: launched once and dropped at once; RAII frees it after the launch.
    CapturedEscapingRaii,
    /// Explicit, unfreed: freed by launching a second graph with a free node for it (G.3.3).
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

/// What each cycle works with.
struct Bench<'a> {
    g: &'a Gpu,
    stream: Stream,
    out: DeviceBuffer<u32>,
}

impl Bench<'_> {
    /// An explicit graph: alloc (1 MiB) → fill with `value` → copy SMALL values to `out`, and a
    /// free node when `free`.
    fn explicit(&self, value: u32, free: bool) -> (Graph, GraphAllocation) {
        let device = &self.g.device;
        let mut graph = Graph::new(device).unwrap();
        let (alloc, buf) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
            .unwrap();
        // SAFETY: fill_u32 over the N values of `buf`; copy_u32 of SMALL of them into `out`.
        let copy = unsafe {
            let fill = graph
                .add_kernel_node(
                    &[alloc],
                    &self.g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(value),
                )
                .unwrap();
            graph
                .add_kernel_node(
                    &[fill],
                    &self.g.k.copy,
                    config(SMALL),
                    &KernelArgs::new().ptr(&self.out).ptr(&buf).value(SMALL),
                )
                .unwrap()
        };
        if free {
            graph.add_mem_free_node(&[copy], &buf).unwrap();
        }
        (graph, buf)
    }

    /// The same graph, captured on the stream.
    fn captured(&self, value: u32, free: bool) -> (Graph, GraphAllocation) {
        capture(&self.stream, CaptureMode::Global, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: as in `explicit`.
            unsafe {
                cap.launch(
                    &self.g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(value),
                )?;
                cap.launch(
                    &self.g.k.copy,
                    config(SMALL),
                    &KernelArgs::new().ptr(&self.out).ptr(&buf).value(SMALL),
                )?;
            }
            if free {
                cap.free_async(&buf)?;
            }
            Ok(buf)
        })
        .unwrap()
    }

    fn verify(&self, variant: Variant, value: u32) {
        self.stream.synchronize().unwrap();
        assert_all(
            &self.out.to_vec().unwrap(),
            value,
            &format!("{variant:?}, value {value}"),
        );
    }

    /// One build, instantiate, launch (and relaunch), verify, drop.
    fn run(&self, variant: Variant, value: u32) {
        let s = &self.stream;
        match variant {
            Variant::ExplicitFreed | Variant::CapturedFreed => {
                let (graph, _buf) = if variant == Variant::ExplicitFreed {
                    self.explicit(value, true)
                } else {
                    self.captured(value, true)
                };
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                self.verify(variant, value);
            }
            Variant::ExplicitAutoFree | Variant::CapturedAutoFree => {
                let (graph, buf) = if variant == Variant::ExplicitAutoFree {
                    self.explicit(value, false)
                } else {
                    self.captured(value, false)
                };
                let exec = graph
                    .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
                    .unwrap();
                exec.launch(s).unwrap();
                exec.launch(s).unwrap();
                self.verify(variant, value);
                assert!(buf.is_live());
                if variant == Variant::ExplicitAutoFree {
                    buf.free_async(s).unwrap();
                }
            }
            Variant::ExplicitEscapingRaii => {
                let (graph, buf) = self.explicit(value, false);
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                self.verify(variant, value);
                assert!(buf.is_live());
            }
            Variant::CapturedEscapingRaii => {
                let (graph, buf) = self.captured(value, false);
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                drop((exec, graph, buf));
                self.verify(variant, value);
            }
            Variant::FreedByAnotherGraph => {
                let (graph, buf) = self.explicit(value, false);
                let mut freer = Graph::new(&self.g.device).unwrap();
                freer.add_mem_free_node(&[], &buf).unwrap();
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                let freer_exec = freer.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                freer_exec.launch(s).unwrap();
                self.verify(variant, value);
                assert!(!buf.is_live());
            }
        }
    }

    fn cycles(&self, first: usize, count: usize) {
        for cycle in first..first + count {
            for (i, &variant) in VARIANTS.iter().enumerate() {
                self.run(variant, (cycle * VARIANTS.len() + i) as u32 + 1);
            }
        }
    }
}

/// The process's resident memory in bytes: `/proc/self/statm`'s resident pages times the page
/// size (`KernelPageSize` of `/proc/self/smaps`, 4 KiB when not found).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages in /proc/self/statm");
    let page_kib = std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|smaps| {
            smaps
                .lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(4);
    pages * page_kib * 1024
}

#[test]
fn build_instantiate_launch_drop_cycles_leak_nothing() {
    let Some(g) = gpu("build_instantiate_launch_drop_cycles_leak_nothing") else {
        return;
    };
    let sanitizer = std::env::var("SANITIZER_TOOL").ok();
    let cycles: usize = std::env::var("CUDA_GRAPH_STRESS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if sanitizer.is_some() { 20 } else { 500 });
    let device = &g.device;
    let bench = Bench {
        g: &g,
        stream: Stream::new(device).unwrap(),
        out: DeviceBuffer::zeroed(device, SMALL as usize).unwrap(),
    };
    let live_start = live_objects();

    // Warm-up: the driver's and the allocator's first-use costs are not leaks.
    const WARMUP: usize = 10;
    bench.cycles(0, WARMUP);
    device.synchronize().unwrap();
    device.graph_mem_trim().unwrap();
    device.reset_graph_mem_high_watermarks().unwrap();
    let before = mem_info(device, "before the cycles");
    let rss_before = resident_bytes();
    assert_eq!(live_objects(), live_start, "after the warm-up");

    let started = std::time::Instant::now();
    bench.cycles(WARMUP, cycles);
    let elapsed = started.elapsed();
    let high = mem_info(device, "after the cycles, before synchronize and trim");
    device.synchronize().unwrap();
    device.graph_mem_trim().unwrap();
    let after = mem_info(device, "after the cycles, synchronize and trim");
    let rss_after = resident_bytes();
    let live_end = live_objects();

    let graphs = cycles * VARIANTS.len();
    println!(
        "{cycles} cycles ({graphs} graphs, {} launches) in {:.2} s",
        cycles * (VARIANTS.len() + 3),
        elapsed.as_secs_f64()
    );
    println!("graph memory before: {before}");
    println!("graph memory after:  {after} (high-water during the cycles: {high})");
    println!(
        "resident memory: {:.2} MiB before, {:.2} MiB after, growth {} B",
        rss_before as f64 / MIB as f64,
        rss_after as f64 / MIB as f64,
        rss_after as i64 - rss_before as i64
    );
    println!("live objects at start: {live_start}");
    println!("live objects at end:   {live_end}");

    assert_eq!(after.used_current.0, 0, "graph memory still used: {after}");
    assert_eq!(
        after.reserved_current.0, 0,
        "graph memory still reserved after trim: {after}"
    );
    assert_eq!(live_end, live_start, "live CUDA objects leaked");
    let growth = rss_after.saturating_sub(rss_before);
    match sanitizer {
        Some(tool) => println!("resident memory not asserted under compute-sanitizer ({tool})"),
        None => assert!(
            growth < MIB,
            "resident memory grew by {growth} B over {cycles} cycles"
        ),
    }
}
