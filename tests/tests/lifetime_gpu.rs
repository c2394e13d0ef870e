//! The lifetime check prevents a real fault, not a theoretical one (the guide's G.4.1 and
//! G.4.2).
//!
//! Each test builds a graph in which a kernel writes an allocation `x` outside its lifetime (after
//! its free node, or unordered with it) while a later alloc node, ordered after that free node,
//! makes allocation `y`, which the driver may place at `x`'s address. `y` is filled with
//! [`VICTIM`] and copied out to a plain device buffer.
//!
//! - `instantiate` refuses the graph with an error that names the kernel, `x`, the free node and
//!   the edge;
//! - `instantiate_unchecked` runs it, and the copy of `y` is read back: it must read [`BAD`] in
//!   every word, `y`'s data overwritten through the dead `x`. That needs the driver to give `y`
//!   the address of `x` (the guide's G.4.1: an alloc node ordered after a free node may reuse
//!   its address); the test asserts that it did, and fails, naming the driver version, when it
//!   did not (then the demonstration does not hold on that driver, and the test says so rather
//!   than pass). A fault instead of the overwrite fails the test too.
//! - The same kernels in a legal order give `VICTIM` everywhere (the control).
//!
//! Each test also asserts that no driver error was met in `Drop`.
//!
//! Without a GPU each test prints `SKIPPED <test>: no GPU (...)`; with `CUDA_GRAPH_REQUIRE_GPU=1`
//! it fails instead. Run them one test per process (`cargo nextest`): a graph that faults leaves
//! the context unusable.

use cuda_graph::check::Rule;
use cuda_graph::{
    AllocParams, AsStream, Device, DeviceBuffer, Error, Function, Graph, GraphAllocation,
    InstantiateFlags, KernelArgs, LaunchConfig, Module, Node, Stream,
};
mod safe_common;
use safe_common::assert_no_drop_errors;

/// Words per allocation (4 MiB).
const N: usize = 1 << 20;
/// What `y` holds when nothing corrupts it.
const VICTIM: u32 = 0x600D_600D;
/// What the kernel that breaks the rules writes through `x`.
const BAD: u32 = 0xBAD0_BAD0;
/// `spin_then_fill_u32`'s delay in clock cycles: about 25 ms at 2 GHz, far longer than the
/// free → alloc → fill chain beside it.
const SPINS: u64 = 50_000_000;

/// Device 0, or `None` after printing why the test is skipped (a failure with
/// `CUDA_GRAPH_REQUIRE_GPU=1`).
fn gpu(test: &str) -> Option<Device> {
    match Device::get(0) {
        Ok(device) => Some(device),
        Err(e) => {
            if std::env::var("CUDA_GRAPH_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1") {
                panic!("{test}: CUDA_GRAPH_REQUIRE_GPU=1 but no GPU is usable: {e}");
            }
            println!("SKIPPED {test}: no GPU ({e})");
            None
        }
    }
}

struct Kernels {
    fill: Function,
    spin_then_fill: Function,
    copy: Function,
}

impl Kernels {
    fn load(device: &Device) -> Kernels {
        let module = Module::from_ptx(device, cuda_graph::kernels::PTX).expect("load the PTX");
        let f = |name| module.function(name).expect("kernel");
        Kernels {
            fill: f("fill_u32"),
            spin_then_fill: f("spin_then_fill_u32"),
            copy: f("copy_u32"),
        }
    }
}

fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N as u64, 256)
}

/// `fill_u32(target, N, value)` after `deps`.
fn fill(g: &mut Graph, k: &Kernels, deps: &[Node], target: &GraphAllocation, value: u32) -> Node {
    let args = KernelArgs::new().ptr(target).value(N as u64).value(value);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v); `target` holds N words.
    unsafe { g.add_kernel_node(deps, &k.fill, config(), &args) }.expect("kernel node")
}

/// `spin_then_fill_u32(target, N, value, SPINS)` after `deps`, on a few blocks so that other
/// work runs beside it.
fn spin_then_fill(
    g: &mut Graph,
    k: &Kernels,
    deps: &[Node],
    target: &GraphAllocation,
    value: u32,
) -> Node {
    let args = KernelArgs::new()
        .ptr(target)
        .value(N as u64)
        .value(value)
        .value(SPINS);
    let few = LaunchConfig::new((4, 1, 1), config().block);
    // SAFETY: spin_then_fill_u32(unsigned* p, unsigned long long n, unsigned v,
    // unsigned long long spins); `target` holds N words.
    unsafe { g.add_kernel_node(deps, &k.spin_then_fill, few, &args) }.expect("kernel node")
}

/// `copy_u32(out, src, N)` after `deps`.
fn copy_out(
    g: &mut Graph,
    k: &Kernels,
    deps: &[Node],
    out: &DeviceBuffer<u32>,
    src: &GraphAllocation,
) -> Node {
    let args = KernelArgs::new().ptr(out).ptr(src).value(N as u64);
    // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n); both hold N
    // words and do not overlap (one is cuMemAlloc memory, the other graph memory).
    unsafe { g.add_kernel_node(deps, &k.copy, config(), &args) }.expect("kernel node")
}

fn alloc(g: &mut Graph, device: &Device, deps: &[Node], label: &str) -> (Node, GraphAllocation) {
    g.add_mem_alloc_node(deps, &AllocParams::new(device, N * 4).label(label))
        .expect("alloc node")
}

/// The lifetime error of `instantiate`, which must refuse the graph.
fn refused(graph: &Graph) -> cuda_graph::check::LifetimeError {
    let checked = graph.check();
    match graph.instantiate(InstantiateFlags::NONE) {
        Err(Error::Lifetime(e)) => {
            assert_eq!(checked, Err(Error::Lifetime(e.clone())));
            println!("instantiate refused the graph: {e}");
            e
        }
        Err(e) => panic!("instantiate failed, but not with the lifetime check: {e}"),
        Ok(_) => panic!("instantiate accepted a graph that breaks the lifetime rules"),
    }
}

/// Launches the graph without the check and reports what `out` holds: `Ok(corrupted words)`,
/// or `Err` when the launch faulted.
fn run_unchecked(graph: &Graph, stream: &Stream, out: &DeviceBuffer<u32>) -> Result<usize, Error> {
    // SAFETY: deliberately broken: the graph uses `x` after its free node, to show the
    // corruption that `instantiate`'s check prevents. What it overwrites is `y`, another
    // allocation of this same graph, which the test then reads; no memory outside the graph's
    // own allocations is touched.
    let exec = unsafe { graph.instantiate_unchecked(InstantiateFlags::NONE) }?;
    exec.launch(stream)?;
    stream.synchronize()?;
    let data = out.to_vec()?;
    let bad = data.iter().filter(|&&w| w == BAD).count();
    let other = data.iter().filter(|&&w| w != BAD && w != VICTIM).count();
    assert_eq!(other, 0, "words that are neither VICTIM nor BAD");
    Ok(bad)
}

/// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13000; 0 if unknown.
fn driver_version() -> i32 {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    let _ = unsafe { cuda_graph::sys::cuDriverGetVersion(&mut version) };
    version
}

/// Asserts what the graph the check refuses does when run unchecked: `y` was placed at `x`'s
/// address (G.4.1), and every word of `y`'s copy reads [`BAD`]: the write through the dead `x`
/// overwrote `y`'s live data. A fault, or a different address, fails.
#[track_caller]
fn assert_overwrites(
    test: &str,
    x: &GraphAllocation,
    y: &GraphAllocation,
    outcome: Result<usize, Error>,
) {
    let version = driver_version();
    assert_eq!(
        y.ptr(),
        x.ptr(),
        "{test}: the driver (CUDA {version}) placed y at {:#x}, not at x's address {:#x}: without G.4.1's address reuse the unchecked graph cannot show the overwrite it is meant to show",
        y.ptr(),
        x.ptr()
    );
    match outcome {
        Ok(bad) => {
            println!(
                "{test}: y reuses x's address {:#x}; {bad} of {N} words of y read {BAD:#x} after the unchecked launch (driver CUDA {version})",
                x.ptr()
            );
            assert_eq!(
                bad, N,
                "{test}: only {bad} of {N} words of y read {BAD:#x}: the write through the dead x must overwrite all of y"
            );
        }
        Err(e) => panic!(
            "{test}: the unchecked graph failed ({e}) instead of overwriting y at the shared address"
        ),
    }
}

/// The control: the same kernels, legally ordered, leave `y` intact.
fn legal_control(device: &Device, k: &Kernels, stream: &Stream) {
    let mut g = Graph::new(device).expect("graph");
    let out = DeviceBuffer::<u32>::zeroed(device, N).expect("buffer");
    let (ax, x) = alloc(&mut g, device, &[], "x");
    let late = spin_then_fill(&mut g, k, &[ax], &x, BAD);
    let fx = g.add_mem_free_node(&[late], &x).expect("free node");
    let (ay, y) = alloc(&mut g, device, &[fx], "y");
    let fy_fill = fill(&mut g, k, &[ay], &y, VICTIM);
    let c = copy_out(&mut g, k, &[fy_fill], &out, &y);
    g.add_mem_free_node(&[c], &y).expect("free node");
    g.check().expect("the legal graph passes the check");
    let exec = g.instantiate(InstantiateFlags::NONE).expect("instantiate");
    exec.launch(stream).expect("launch");
    stream.synchronize().expect("synchronize");
    let data = out.to_vec().expect("read back");
    assert!(
        data.iter().all(|&w| w == VICTIM),
        "the legal graph corrupted y"
    );
}

/// A kernel ordered after `x`'s free node writes `x`: `instantiate` refuses the graph
/// (`Rule::UseAfterFree`, naming the node, the allocation, the free node, the path and the
/// offending edge); run unchecked, the write lands in `y`, allocated after `x`'s free at the
/// same address and filled just before, so `y`'s copy reads `BAD` in every word. The legal
/// order of the same kernels leaves `y` intact (the control).
#[test]
#[ignore = "needs a GPU"]
fn use_after_free_is_refused_and_overwrites_the_next_allocation_unchecked() {
    const TEST: &str = "use_after_free_is_refused_and_overwrites_the_next_allocation_unchecked";
    let Some(device) = gpu(TEST) else { return };
    let k = Kernels::load(&device);
    let stream = Stream::new(&device).expect("stream");
    legal_control(&device, &k, &stream);

    // x: alloc → fill → free; y: alloc after x's free (may reuse x's address) → fill VICTIM;
    // then "late" writes x after y's fill, and y is copied out.
    let mut g = Graph::new(&device).expect("graph");
    let out = DeviceBuffer::<u32>::zeroed(&device, N).expect("buffer");
    let (ax, x) = alloc(&mut g, &device, &[], "x");
    let fx_fill = fill(&mut g, &k, &[ax], &x, 1);
    let fx = g.add_mem_free_node(&[fx_fill], &x).expect("free node");
    g.set_label(fx, "free x").unwrap();
    let (ay, y) = alloc(&mut g, &device, &[fx], "y");
    let fy_fill = fill(&mut g, &k, &[ay], &y, VICTIM);
    g.set_label(fy_fill, "fill y").unwrap();
    let late = fill(&mut g, &k, &[fy_fill], &x, BAD);
    g.set_label(late, "late").unwrap();
    let c = copy_out(&mut g, &k, &[late], &out, &y);
    g.add_mem_free_node(&[c], &y).expect("free node");

    let e = refused(&g);
    assert_eq!(e.violations.len(), 1, "{:#?}", e.violations);
    let v = &e.violations[0];
    assert_eq!(v.rule, Rule::UseAfterFree);
    assert_eq!(v.node.index, late.index());
    assert_eq!(v.node.label.as_deref(), Some("late"));
    assert_eq!(v.allocation, "allocation 'x'");
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(fx.index()));
    let path: Vec<usize> = v.path.iter().map(|n| n.index).collect();
    assert_eq!(
        path,
        [fx.index(), ay.index(), fy_fill.index(), late.index()]
    );
    assert_eq!(v.offending_edge, Some((fy_fill.index(), late.index())));
    let s = e.to_string();
    assert!(
        s.contains("node 'late' (kernel fill_u32, #")
            && s.contains("uses allocation 'x' after its free node, node 'free x' (free node, #"),
        "{s}"
    );

    assert_overwrites(TEST, &x, &y, run_unchecked(&g, &stream, &out));
    drop((g, x, y, out, stream));
    assert_no_drop_errors(&device);
}

/// A kernel that spins, then writes `x`, is not ordered with `x`'s free node: `instantiate`
/// refuses the graph (`Rule::UnorderedWithFree`, naming the node, the allocation and the missing
/// edge); run unchecked, the late write lands in `y`, allocated after `x`'s free at the same
/// address, after `y` was filled, so `y`'s copy reads `BAD` in every word.
#[test]
#[ignore = "needs a GPU"]
fn unordered_with_free_is_refused_and_a_delayed_writer_overwrites_unchecked() {
    const TEST: &str = "unordered_with_free_is_refused_and_a_delayed_writer_overwrites_unchecked";
    let Some(device) = gpu(TEST) else { return };
    let k = Kernels::load(&device);
    let stream = Stream::new(&device).expect("stream");
    legal_control(&device, &k, &stream);

    // x: alloc → free (not after the writer); the writer spins, then fills x: it is unordered
    // with x's free, and runs while y, allocated after x's free, is filled and then copied.
    let mut g = Graph::new(&device).expect("graph");
    let out = DeviceBuffer::<u32>::zeroed(&device, N).expect("buffer");
    let (ax, x) = alloc(&mut g, &device, &[], "x");
    let writer = spin_then_fill(&mut g, &k, &[ax], &x, BAD);
    g.set_label(writer, "late writer").unwrap();
    let fx = g.add_mem_free_node(&[ax], &x).expect("free node");
    let (ay, y) = alloc(&mut g, &device, &[fx], "y");
    let fy_fill = fill(&mut g, &k, &[ay], &y, VICTIM);
    let c = copy_out(&mut g, &k, &[fy_fill, writer], &out, &y);
    g.add_mem_free_node(&[c], &y).expect("free node");

    let e = refused(&g);
    assert_eq!(e.violations.len(), 1, "{:#?}", e.violations);
    let v = &e.violations[0];
    assert_eq!(v.rule, Rule::UnorderedWithFree);
    assert_eq!(v.node.label.as_deref(), Some("late writer"));
    assert_eq!(v.allocation, "allocation 'x'");
    assert_eq!(v.other.as_ref().map(|o| o.index), Some(fx.index()));
    assert_eq!(v.missing_edge, Some((writer.index(), fx.index())));
    let s = e.to_string();
    assert!(
        s.contains("node 'late writer' (kernel spin_then_fill_u32, #1) uses allocation 'x' but is not ordered before its free node, free node #2"),
        "{s}"
    );

    assert_overwrites(TEST, &x, &y, run_unchecked(&g, &stream, &out));
    drop((g, x, y, out, stream));
    assert_no_drop_errors(&device);
}
