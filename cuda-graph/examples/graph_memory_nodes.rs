//! NVIDIA's cuda-samples `graphMemoryNodes`, runs 1 to 6, on the safe API: its output is the C
//! sample's, line for line, so that `diff` shows where the two differ.
//!
//! Each run negates the squares of 8,000,000 random floats, `neg[i] = -(in[i] * in[i])`, in two
//! kernels, and checks the result on the host (against the input) and, from run 4 on, on the
//! device (a validation kernel against a reference copy, setting a managed result flag that the
//! host reads after the work is done):
//!
//! 1. in a stream: stream-ordered allocations (`StreamAllocation`), copies between pinned host
//!    memory and the device on two streams joined by events;
//! 2. the same captured into a graph (`capture`): alloc and free nodes, the last free on a
//!    stream forked into the capture (`Capture::free_async_on`);
//! 3. an explicitly built graph (`Graph::add_mem_alloc_node`, `add_mem_free_node`, memcpy
//!    nodes to and from pinned memory), whose third allocation reuses the first's address;
//! 4. that graph without its last free: the result outlives the launch (G.3.3), a kernel
//!    outside the graph validates it, and `GraphAllocation::free` frees it;
//! 5. the same graph launched again, its result freed in stream order
//!    (`GraphAllocation::free_async`);
//! 6. launched again, its result freed by another graph's free node.
//!
//! Where the port differs from the C sample: the square is copied back on the first stream in
//! run 2 (`Capture` copies to host memory on its own stream; the free of the square array is
//! the forked stream's work, as in the sample); in run 1 each stream allocation is freed on the
//! stream that allocated it, the crate ordering the free after the other stream's copy (the C
//! sample frees the square array on the second stream); the result flag is a `u32`, not a
//! `bool` (only types valid for every bit pattern are read back). Exits 0 only when all six
//! runs validate.
//!
//! Needs the kernels `square_f32`, `negate_f32` and `validate_f32` of
//! `kernels/graph_kernels.cu` in the checked-in PTX (`ci/gen-ptx.sh`).
//!
//! ```text
//! cargo run --example graph_memory_nodes --features example-kernels
//! ```

mod common;

use std::process::exit;

use anyhow::{Context, Result};
use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, Event, ExecGraph, Function, Graph,
    GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig, ManagedBuffer, Module,
    PinnedBuffer, Stream, StreamAllocation, StreamMemOps, capture, driver_version, kernels,
};

const THREADS_PER_BLOCK: u32 = 512;
const ALLOWABLE_VARIANCE: f32 = 1.0e-6;
const NUM_ELEMENTS: usize = 8_000_000;
const BYTES: usize = NUM_ELEMENTS * 4;

/// The sample's three kernels.
struct Kernels {
    /// `square_f32(const float* in, float* out, u64 n)`.
    square: Function,
    /// `negate_f32(const float* in, float* out, u64 n)`.
    negate: Function,
    /// `validate_f32(const float* got, const float* ref, u64 n, float variance, u32* failed)`.
    validate: Function,
}

/// The host arrays, pinned: memcpy nodes and stream copies read and write them.
struct HostArrays {
    input: PinnedBuffer<f32>,
    square: PinnedBuffer<f32>,
    neg_square: PinnedBuffer<f32>,
}

/// `rand() / RAND_MAX`, from a generator of our own (xorshift64*), seeded from the clock as the
/// sample seeds `rand`.
struct Random(u64);

impl Random {
    fn seeded() -> Random {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Random(nanos | 1)
    }

    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32) / ((1u64 << 24) - 1) as f32
    }

    fn fill(&mut self, buffer: &mut PinnedBuffer<f32>) -> Result<()> {
        for x in buffer.as_mut_slice()?.iter_mut() {
            *x = self.next();
        }
        Ok(())
    }
}

/// The launch shape: `THREADS_PER_BLOCK` threads a block over every element.
fn config() -> LaunchConfig {
    LaunchConfig::for_elements(NUM_ELEMENTS as u64, THREADS_PER_BLOCK)
}

/// `(in, out, n)` for `square_f32` and `negate_f32`.
fn unary<'a>(
    input: &'a impl cuda_graph::DeviceAddress,
    output: &'a impl cuda_graph::DeviceAddress,
) -> KernelArgs<'a> {
    KernelArgs::new()
        .ptr(input)
        .ptr(output)
        .value(NUM_ELEMENTS as u64)
}

/// Run 1: the work on two streams, outside any graph.
fn negate_squares_in_stream(k: &Kernels, s1: &Stream, host: &HostArrays) -> Result<()> {
    let s2 = Stream::new(s1.device())?;
    let d_input = StreamAllocation::new(s1, BYTES)?;
    let d_square = StreamAllocation::new(s1, BYTES)?;
    s1.memcpy_htod_async(&d_input, &host.input, BYTES)?;
    // SAFETY: square_f32(const float*, float*, u64) over NUM_ELEMENTS floats of each.
    unsafe { k.square.launch(s1, config(), &unary(&d_input, &d_square))? };
    let square_done = Event::new(s1.device())?;
    square_done.record(s1)?;
    s2.wait_event(&square_done)?;
    s2.memcpy_dtoh_async(&host.square, &d_square, BYTES)?;
    d_input.free_async()?;
    let d_neg_square = StreamAllocation::new(s1, BYTES)?;
    // SAFETY: negate_f32(const float*, float*, u64), as above.
    unsafe {
        k.negate
            .launch(s1, config(), &unary(&d_square, &d_neg_square))?
    };
    s1.memcpy_dtoh_async(&host.neg_square, &d_neg_square, BYTES)?;
    d_neg_square.free_async()?;
    // Ordered after the copy on s2 by the crate (the square array's recorded use there).
    d_square.free_async()?;
    let s2_done = Event::new(s1.device())?;
    s2_done.record(&s2)?;
    s1.wait_event(&s2_done)?;
    Ok(())
}

/// Run 2: the same work captured from `s1` into a graph, with a second stream forked in.
fn negate_squares_captured(k: &Kernels, s1: &Stream, host: &HostArrays) -> Result<ExecGraph> {
    let s2 = Stream::new(s1.device())?;
    let (graph, ()) = capture(s1, CaptureMode::Global, |cap| {
        let d_input = cap.malloc_async(BYTES)?;
        let d_square = cap.malloc_async(BYTES)?;
        cap.memcpy_htod_async(&d_input, &host.input, BYTES)?;
        // SAFETY: as in run 1.
        unsafe { cap.launch(&k.square, config(), &unary(&d_input, &d_square))? };
        cap.memcpy_dtoh_async(&host.square, &d_square, BYTES)?;
        cap.free_async(&d_input)?;
        let d_neg_square = cap.malloc_async(BYTES)?;
        // SAFETY: as in run 1.
        unsafe { cap.launch(&k.negate, config(), &unary(&d_square, &d_neg_square))? };
        cap.memcpy_dtoh_async(&host.neg_square, &d_neg_square, BYTES)?;
        cap.free_async(&d_neg_square)?;
        cap.fork(&s2)?;
        cap.free_async_on(&s2, &d_square)?;
        cap.join(&s2)
    })?;
    Ok(graph.instantiate(InstantiateFlags::NONE)?)
}

/// Runs 3 and 4: the graph built node by node. With `keep_result`, the negated squares are not
/// freed in the graph and are returned.
fn negate_squares_explicit(
    k: &Kernels,
    device: &Device,
    host: &HostArrays,
    keep_result: bool,
) -> Result<(ExecGraph, Option<GraphAllocation>)> {
    let params = AllocParams::new(device, BYTES);
    let mut g = Graph::new(device)?;
    let (alloc_input, d_input) = g.add_mem_alloc_node(&[], &params)?;
    let (alloc_square, d_square) = g.add_mem_alloc_node(&[alloc_input], &params)?;
    let copy_input = g.add_memcpy_node_htod(&[alloc_square], &d_input, &host.input, BYTES)?;
    // SAFETY: as in run 1; the lifetime checks verify that the node runs inside both
    // allocations' lifetimes.
    let square = unsafe {
        g.add_kernel_node(
            &[copy_input],
            &k.square,
            config(),
            &unary(&d_input, &d_square),
        )?
    };
    let copy_square = g.add_memcpy_node_dtoh(&[square], &host.square, &d_square, BYTES)?;
    let free_input = g.add_mem_free_node(&[square], &d_input)?;
    let (alloc_neg, d_neg_square) = g.add_mem_alloc_node(&[free_input], &params)?;
    if d_neg_square.ptr() == d_input.ptr() {
        println!("Check verified that d_negSquare and d_input share a virtual address.");
    }
    // SAFETY: as above.
    let negate = unsafe {
        g.add_kernel_node(
            &[alloc_neg],
            &k.negate,
            config(),
            &unary(&d_square, &d_neg_square),
        )?
    };
    g.add_mem_free_node(&[copy_square, negate], &d_square)?;
    let copy_neg = g.add_memcpy_node_dtoh(&[negate], &host.neg_square, &d_neg_square, BYTES)?;
    if !keep_result {
        g.add_mem_free_node(&[copy_neg], &d_neg_square)?;
    }
    let exec = g.instantiate(InstantiateFlags::NONE)?;
    Ok((exec, keep_result.then_some(d_neg_square)))
}

/// The device-side check: `validate_f32` of the kept result against the reference, setting
/// `flag` on a mismatch.
fn validate_gpu(
    k: &Kernels,
    stream: &Stream,
    d_neg_square: &GraphAllocation,
    reference: &DeviceBuffer<f32>,
    flag: &ManagedBuffer<u32>,
) -> Result<()> {
    let args = KernelArgs::new()
        .ptr(d_neg_square)
        .ptr(reference)
        .value(NUM_ELEMENTS as u64)
        .value(ALLOWABLE_VARIANCE)
        .ptr(flag);
    // SAFETY: validate_f32(const float*, const float*, u64, float, u32*): NUM_ELEMENTS floats in
    // each array, one u32 flag.
    unsafe { k.validate.launch(stream, config(), &args)? };
    Ok(())
}

/// The host-side check: whether any result differs from `-(in * in)` beyond the variance.
fn host_fails(host: &HostArrays) -> Result<bool> {
    let input = host.input.as_slice()?;
    let got = host.neg_square.as_slice()?; // waits for the copies into it
    Ok(input.iter().zip(got.iter()).any(|(&x, &g)| {
        let reference = -(x * x);
        let diff = g - reference;
        (diff * diff) / (reference * reference) > ALLOWABLE_VARIANCE
    }))
}

/// Prints the verdict of the flag and `host_failed`, clears the flag; whether it passed.
fn check_validation(flag: &mut ManagedBuffer<u32>, host_failed: bool) -> Result<bool> {
    let mut view = flag.as_mut_slice()?; // waits for the validation kernel
    let failed = host_failed || view[0] != 0;
    view[0] = 0;
    println!(
        "{}",
        if failed {
            "Validation FAILURE!\n"
        } else {
            "Validation PASSED!\n"
        }
    );
    Ok(!failed)
}

/// `_ConvertSMVer2ArchName` of the samples' helpers, for the device line.
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0) | (7, 2) => "Volta",
        (7, 5) => "Turing",
        (8, 9) => "Ada",
        (8, _) => "Ampere",
        (9, _) => "Hopper",
        (10, _) | (11, _) | (12, _) => "Blackwell",
        _ => "Graphics Device",
    }
}

fn sample(device: &Device) -> Result<()> {
    let (major, minor) = device.compute_capability()?;
    println!(
        "GPU Device {}: \"{}\" with compute capability {major}.{minor}\n",
        device.ordinal(),
        arch_name(major, minor)
    );
    let version = driver_version()?;
    println!(
        "Driver version is: {}.{}",
        version / 1000,
        (version % 100) / 10
    );
    println!("Setting up sample.");
    let module = Module::from_ptx(device, kernels::PTX).context("loading the kernels' PTX")?;
    let find = |name: &str| {
        module.function(name).with_context(|| {
            format!("kernel {name}: the checked-in PTX lacks it; regenerate it with ci/gen-ptx.sh")
        })
    };
    let k = Kernels {
        square: find("square_f32")?,
        negate: find("negate_f32")?,
        validate: find("validate_f32")?,
    };
    let mut random = Random::seeded();
    let mut host = HostArrays {
        input: PinnedBuffer::zeroed(device, NUM_ELEMENTS)?,
        square: PinnedBuffer::zeroed(device, NUM_ELEMENTS)?,
        neg_square: PinnedBuffer::zeroed(device, NUM_ELEMENTS)?,
    };
    random.fill(&mut host.input)?;
    let reference: Vec<f32> = host.input.as_slice()?.iter().map(|&x| -(x * x)).collect();
    let reference = DeviceBuffer::from_slice(device, &reference)?;
    let mut flag = ManagedBuffer::<u32>::zeroed(device, 1)?;
    let stream = Stream::new(device)?;
    println!("Setup complete.\n");

    let mut reset = |host: &mut HostArrays| -> Result<()> {
        random.fill(&mut host.square)?;
        random.fill(&mut host.neg_square)
    };
    reset(&mut host)?;
    let mut passed = 0;

    println!("Running negateSquares in a stream.");
    negate_squares_in_stream(&k, &stream, &host)?;
    stream.synchronize()?;
    println!("Validating negateSquares in a stream...");
    passed += usize::from(check_validation(&mut flag, host_fails(&host)?)?);
    reset(&mut host)?;

    println!("Running negateSquares in a stream-captured graph.");
    let exec = negate_squares_captured(&k, &stream, &host)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    println!("Validating negateSquares in a stream-captured graph...");
    passed += usize::from(check_validation(&mut flag, host_fails(&host)?)?);
    reset(&mut host)?;
    drop(exec);

    println!("Running negateSquares in an explicitly constructed graph.");
    let (exec, _) = negate_squares_explicit(&k, device, &host, false)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    println!("Validating negateSquares in an explicitly constructed graph...");
    passed += usize::from(check_validation(&mut flag, host_fails(&host)?)?);
    reset(&mut host)?;
    drop(exec);

    // Each of the three runs below frees d_negSquare outside the graph; before that, a kernel
    // outside the graph validates it.
    println!("Running negateSquares with d_negSquare freed outside the stream.");
    let (exec, kept) = negate_squares_explicit(&k, device, &host, true)?;
    let d_neg_square = kept.context("the explicit graph keeps its result")?;
    exec.launch(&stream)?;
    validate_gpu(&k, &stream, &d_neg_square, &reference, &flag)?;
    // Synchronous: waits for the validation kernel, then frees.
    d_neg_square.free()?;
    println!("Validating negateSquares with d_negSquare freed outside the stream...");
    passed += usize::from(check_validation(&mut flag, host_fails(&host)?)?);
    reset(&mut host)?;

    println!("Running negateSquares with d_negSquare freed outside the graph.");
    exec.launch(&stream)?;
    validate_gpu(&k, &stream, &d_neg_square, &reference, &flag)?;
    d_neg_square.free_async(&stream)?;
    stream.synchronize()?;
    println!("Validating negateSquares with d_negSquare freed outside the graph...");
    passed += usize::from(check_validation(&mut flag, false)?);
    reset(&mut host)?;

    println!("Running negateSquares with d_negSquare freed in a different graph.");
    let mut free_graph = Graph::new(device)?;
    free_graph.add_mem_free_node(&[], &d_neg_square)?;
    let exec_free = free_graph.instantiate(InstantiateFlags::NONE)?;
    exec.launch(&stream)?;
    validate_gpu(&k, &stream, &d_neg_square, &reference, &flag)?;
    exec_free.launch(&stream)?;
    stream.synchronize()?;
    println!("Validating negateSquares with d_negSquare freed in a different graph...");
    passed += usize::from(check_validation(&mut flag, false)?);

    println!("Cleaning up sample.");
    drop((
        exec,
        exec_free,
        free_graph,
        d_neg_square,
        flag,
        reference,
        host,
        stream,
    ));
    println!("Cleanup complete. Exiting sample.");
    if passed != 6 {
        eprintln!("{}: {passed} of 6 runs validated", common::NAME);
        exit(common::FAILED);
    }
    Ok(())
}

fn main() {
    common::run(sample);
}
