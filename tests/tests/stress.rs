//! Short stress for the GPU suite: cycles of build, instantiate, launch and drop, in every way a
//! graph's memory can end, each launch's output verified. The cycles run in two equal halves;
//! after each, once the releases the crate put off have run (`flush_deferred`), the crate's live
//! objects are back to their count after the warm-up (`cuda_graph::live_objects`), exactly; at the
//! end, after a synchronize and a trim, no graph memory is used or reserved and no driver error
//! was met in `Drop`; and the process's resident memory grew by less than
//! [`RESIDENT_SLACK`] or [`RESIDENT_PER_GRAPH`] bytes per graph (whichever is more) over the
//! second half: a leak of that much per graph shows there, after the first half has paid the
//! one-time costs.
//!
//! One cycle runs each [`Variant`] once: explicit and captured graphs; freed in the graph;
//! unfreed with AutoFreeOnLaunch (relaunched, then freed by `free_async` or by RAII); escaping
//! and freed by RAII (after a synchronize, or dropped while the launch still spins, checked with
//! the reuse probe of the guide's "Testing"); escaping and freed by a free node in a second
//! graph. 500 cycles by default (`CUDA_GRAPH_STRESS_CYCLES=<n>` to change it; 20 under
//! compute-sanitizer, which `ci/sanitize-runner.sh` announces with `SANITIZER_TOOL`, and whose
//! own allocations make the resident-memory figure meaningless: there the live-object count is
//! asserted, the resident memory only printed). The long run is the example
//! `cargo run --release --example stress --features example-kernels` (10,000 cycles).
//!
//! Skips without a GPU (prints `SKIPPED ...`); fails instead under `CUDA_GRAPH_REQUIRE_GPU=1`.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use safe_common::settle;
use std::time::{Duration, Instant};

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, ExecGraph, Graph, GraphAllocation,
    InstantiateFlags, KernelArgs, LiveObjects, Stream, StreamFlags, capture, flush_deferred,
    live_objects,
};
use probe::{PATTERN, one_thread};
use safe_common::{BYTES, Gpu, MIB, N, assert_all, config, gpu, mem_info};

/// Elements copied out and verified per launch.
const SMALL: u64 = 4096;

/// The spin at the start of the graph whose handles are dropped while it runs: about 1 ms on an
/// H200 (clock cycles), far longer than the host needs to launch the probe after the drop.
const RAII_SPIN: u64 = 2_000_000;

/// Resident-memory growth over the second half that is never a leak (allocator and driver
/// noise: a few dozen pages).
const RESIDENT_SLACK: u64 = 256 << 10;

/// Resident-memory growth per graph of the second half above which it is a leak.
const RESIDENT_PER_GRAPH: u64 = 128;

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
    /// A second stream, for the probe.
    probe_stream: Stream,
    /// The probe: a graph that allocates `BYTES` (not freed in it) and fills them with
    /// [`PATTERN`], and its allocation.
    probe: (ExecGraph, Graph, GraphAllocation),
}

impl<'a> Bench<'a> {
    fn new(g: &'a Gpu) -> Bench<'a> {
        let device = &g.device;
        let new_stream = || Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
        let mut graph = Graph::new(device).unwrap();
        let (alloc, a) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("probe"))
            .unwrap();
        // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the N values of
        // `a`, after its alloc node.
        unsafe {
            graph.add_kernel_node(
                &[alloc],
                &g.k.fill,
                config(N),
                &KernelArgs::new().ptr(&a).value(N).value(PATTERN),
            )
        }
        .unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        Bench {
            g,
            stream: new_stream(),
            out: DeviceBuffer::zeroed(device, SMALL as usize).unwrap(),
            probe_stream: new_stream(),
            probe: (exec, graph, a),
        }
    }

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

    /// The same graph, captured on the stream; with `spin` > 0 a kernel that spins `spin` clock
    /// cycles comes first, after the allocation.
    fn captured(&self, value: u32, free: bool, spin: u64) -> (Graph, GraphAllocation) {
        capture(&self.stream, CaptureMode::Global, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: spin_then_fill_u32(unsigned* p, unsigned long long n, unsigned v,
            // unsigned long long spins) with n = 0 writes nothing; the others as in `explicit`.
            unsafe {
                if spin > 0 {
                    cap.launch(
                        &self.g.k.spin_then_fill,
                        one_thread(),
                        &KernelArgs::new()
                            .value(0u64)
                            .value(0u64)
                            .value(0u32)
                            .value(spin),
                    )?;
                }
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
        self.stream
            .synchronize()
            .unwrap_or_else(|e| panic!("{variant:?}, value {value}: {e}"));
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
                    self.captured(value, true, 0)
                };
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                self.verify(variant, value);
            }
            Variant::ExplicitAutoFree | Variant::CapturedAutoFree => {
                let (graph, buf) = if variant == Variant::ExplicitAutoFree {
                    self.explicit(value, false)
                } else {
                    self.captured(value, false, 0)
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
                // Every handle dropped while the graph still spins; then the reuse probe on
                // another stream: a free before the graph is done hands the probe its memory,
                // and the graph's fill then lands in the probe (and a trim of it unmaps what
                // the graph still uses).
                let (graph, buf) = self.captured(value, false, RAII_SPIN);
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(s).unwrap();
                drop((exec, graph, buf));
                let (probe_exec, _, probe) = &self.probe;
                probe_exec.launch(&self.probe_stream).unwrap();
                self.probe_stream.synchronize().unwrap();
                self.g.device.graph_mem_trim().unwrap();
                self.verify(variant, value);
                let got = probe::read_words(&self.g.device, probe.ptr(), N as usize).unwrap();
                if let Some((i, w)) = got.iter().enumerate().find(|&(_, &w)| w != PATTERN) {
                    panic!(
                        "{variant:?}, value {value}: the probe was overwritten: word {i} is {w:#x} (the dropped graph wrote memory freed before it was done)"
                    );
                }
                probe.free_async(&self.probe_stream).unwrap();
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

/// Waits until the crate's live objects stop changing (the same count at five polls 10 ms
/// apart, nothing queued; at most 10 s) and returns them: the count the cycles must come back
/// to.
fn settle_stable(device: &Device) -> LiveObjects {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut last, mut same) = (live_objects(), 0);
    while same < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        device.synchronize().expect("cuCtxSynchronize");
        let queued = flush_deferred();
        let live = live_objects();
        same = if live == last && queued == 0 {
            same + 1
        } else {
            0
        };
        last = live;
    }
    last
}

/// Build, instantiate, launch and drop cycles (see the module docs): every launch's output
/// verified, the reuse probe after each graph dropped while it runs, the crate's live objects
/// back to the start after each half, graph memory released, no driver error in `Drop`, and
/// resident memory flat over the second half (not under compute-sanitizer).
#[test]
#[ignore = "needs a GPU"]
fn build_instantiate_launch_drop_cycles_leak_nothing() {
    let Some(g) = gpu("build_instantiate_launch_drop_cycles_leak_nothing") else {
        return;
    };
    let sanitizer = std::env::var("SANITIZER_TOOL").ok();
    let cycles: usize = std::env::var("CUDA_GRAPH_STRESS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if sanitizer.is_some() { 20 } else { 500 })
        .max(2);
    let half = cycles / 2;
    let device = &g.device;
    let live_empty = live_objects();
    let bench = Bench::new(&g);

    // Warm-up: the driver's and the allocator's first-use costs are not leaks; nor is what the
    // bench keeps between cycles (the probe allocation keeps the event of its last launch).
    const WARMUP: usize = 10;
    bench.cycles(0, WARMUP);
    let live_start = settle_stable(device);
    println!("live objects after the warm-up: {live_start}");
    device.graph_mem_trim().unwrap();
    device.reset_graph_mem_high_watermarks().unwrap();
    let before = mem_info(device, "before the cycles");

    let started = Instant::now();
    let mut resident = vec![resident_bytes()];
    for (i, first) in [WARMUP, WARMUP + half].into_iter().enumerate() {
        bench.cycles(first, half);
        let live = settle(device, live_start);
        resident.push(resident_bytes());
        println!("live objects after half {}: {live}", i + 1);
        assert_eq!(
            live,
            live_start,
            "objects of the crate still live after half {} of the cycles (start: {live_start})",
            i + 1
        );
    }
    let elapsed = started.elapsed();
    let high = mem_info(device, "after the cycles, before the trim");
    // Everything dropped, and what the driver still held released: the probe's executable
    // graph keeps its memory mapped (G.5) until it is destroyed.
    drop(bench);
    assert_eq!(
        settle(device, live_empty),
        live_empty,
        "objects of the crate still live after the bench was dropped"
    );
    device.graph_mem_trim().unwrap();
    let after = mem_info(
        device,
        "after the cycles, with everything dropped, synchronize and trim",
    );

    let graphs = 2 * half * VARIANTS.len();
    let graphs_per_half = (half * VARIANTS.len()) as u64;
    println!(
        "{} cycles ({graphs} graphs, {} launches) in {:.2} s",
        2 * half,
        2 * half * (VARIANTS.len() + 4),
        elapsed.as_secs_f64()
    );
    println!("graph memory before: {before}");
    println!("graph memory after:  {after} (high-water during the cycles: {high})");
    let growth = |from: u64, to: u64| to as i64 - from as i64;
    println!(
        "resident memory: {:.2} MiB at the start, {:.2} MiB after half 1 ({:+} B), {:.2} MiB after half 2 ({:+} B, {:.1} B per graph)",
        resident[0] as f64 / MIB as f64,
        resident[1] as f64 / MIB as f64,
        growth(resident[0], resident[1]),
        resident[2] as f64 / MIB as f64,
        growth(resident[1], resident[2]),
        growth(resident[1], resident[2]) as f64 / graphs_per_half as f64
    );

    // A driver error in a drop explains a free that did not happen: checked first.
    let errors = device.drop_errors();
    assert_eq!(
        errors.count, 0,
        "driver errors met in Drop: {} (the last: {:?})",
        errors.count, errors.last
    );
    assert_eq!(
        after.used_current.0, 0,
        "graph memory still used with everything dropped (an allocation was never freed): {after}"
    );
    assert_eq!(
        after.reserved_current.0, 0,
        "graph memory still reserved after trim: {after}"
    );
    let second = resident[2].saturating_sub(resident[1]);
    let limit = RESIDENT_SLACK.max(RESIDENT_PER_GRAPH * graphs_per_half);
    match sanitizer {
        Some(tool) => println!(
            "resident memory not asserted under compute-sanitizer ({tool}); the live objects are"
        ),
        None => assert!(
            second < limit,
            "resident memory grew by {second} B over the second half ({graphs_per_half} graphs, {} B per graph; the limit is {limit} B)",
            second / graphs_per_half
        ),
    }
}
