//! cudarc interop (`cuda-graph`'s `cudarc` feature): cudarc's device memory as node operands and
//! kernel arguments under the ownership rule of the crate docs' "Safety model", its free by
//! cudarc ordered after the crate's work, cudarc's streams adopted for captures, and the
//! refusals. The soundness tests are reuse probes (`safe_common/probe.rs`): after the suspect
//! drop, a cudarc allocation of the same size on the same stream (which tends to get the freed
//! address) is filled with the pattern, the suspect work runs, and the pattern must be intact;
//! each has a control whose output is checked.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. cudarc is called only after the GPU gate found a device: cudarc
//! panics when the driver library is missing.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use std::sync::Arc;

use cuda_graph::{
    AsStream, BorrowedStream, CaptureMode, CudarcSlice, Device, DeviceAddress, Error, Graph,
    InstantiateFlags, KernelArgs, LaunchConfig, Stream, StreamFlags, capture,
};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use probe::{PATTERN, SPIN_50_MS, assert_intact, read_words};
use safe_common::{BYTES, Gpu, N, assert_all, assert_iota, assert_no_drop_errors, config, gpu};

/// What the late writer writes: not a value any other kernel here writes.
const LATE: u32 = 0xBAD0_BAD0;

/// What a second late writer writes, over [`LATE`].
const LATER: u32 = 0xBAD1_BAD1;

/// cudarc's context of device 0 (the primary context the crate's `Device` retains too) and a
/// stream of it made with `new_stream`, with cudarc's event tracking off for the slices made
/// after it (all cudarc work of a test is on this one stream, and the capture test captures
/// cudarc work, which event tracking would invalidate).
fn cudarc_stream(gpu: &Gpu) -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = CudaContext::new(0).expect("CudaContext::new(0)");
    // SAFETY: every slice of the test is used by cudarc on `stream` only; the crate orders its
    // own work on other streams.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("CudaContext::new_stream");
    let device = Device::from_cudarc(&ctx).expect("Device::from_cudarc");
    assert_eq!(device.ordinal(), gpu.device.ordinal());
    assert_eq!(device.context_raw(), gpu.device.context_raw());
    (ctx, stream)
}

/// `N` zeroed words from cudarc, in the crate's keeping.
#[track_caller]
fn zeroed(stream: &Arc<CudaStream>) -> CudarcSlice<u32> {
    let slice = stream.alloc_zeros::<u32>(N as usize).expect("alloc_zeros");
    CudarcSlice::new(slice).expect("CudarcSlice::new")
}

/// A plain cudarc allocation of `N` words filled with the pattern: the probe.
#[track_caller]
fn probe_on(stream: &Arc<CudaStream>) -> CudaSlice<u32> {
    let mut probe = stream
        .alloc_zeros::<u32>(N as usize)
        .expect("alloc the probe");
    stream
        .memcpy_htod(&vec![PATTERN; N as usize], &mut probe)
        .expect("fill the probe");
    probe
}

/// The device address of a plain cudarc slice.
fn address(slice: &CudaSlice<u32>, stream: &CudaStream) -> cuda_graph::sys::CUdeviceptr {
    slice.device_ptr(stream).0
}

/// A graph with one `fill_u32(target, N, value)` kernel node (the slice kept through the
/// kernel's argument list).
#[track_caller]
fn fill_graph(gpu: &Gpu, target: &impl DeviceAddress, value: u32) -> Graph {
    let mut graph = Graph::new(&gpu.device).expect("Graph::new");
    let args = KernelArgs::new().ptr(target).value(N).value(value);
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) over the N words of
    // `target`, which the graph keeps alive.
    unsafe { graph.add_kernel_node(&[], &gpu.k.fill, config(N), &args) }.expect("fill node");
    graph
}

/// A graph with one memset node writing `value` to the `N` words of `target` (the slice kept as
/// the node's operand).
#[track_caller]
fn memset_graph(gpu: &Gpu, target: &impl DeviceAddress, value: u32) -> Graph {
    let mut graph = Graph::new(&gpu.device).expect("Graph::new");
    graph
        .add_memset_node(&[], target, value, N as usize)
        .expect("memset node");
    graph
}

/// Queues `spin_then_fill_u32(target, N, LATE, SPIN_50_MS)` on `stream`: a writer that writes
/// about 50 ms late.
#[track_caller]
fn late_writer(gpu: &Gpu, stream: &impl AsStream, target: &CudarcSlice<u32>) {
    late_fill(gpu, stream, target, LATE);
}

/// Queues `spin_then_fill_u32(target, N, value, SPIN_50_MS)` on `stream`.
#[track_caller]
fn late_fill(gpu: &Gpu, stream: &impl AsStream, target: &CudarcSlice<u32>, value: u32) {
    let args = KernelArgs::new()
        .ptr(target)
        .value(N)
        .value(value)
        .value(SPIN_50_MS);
    // SAFETY: spin_then_fill_u32(unsigned* p, unsigned long long n, unsigned v,
    // unsigned long long spins) over the N words of `target`, whose free the crate orders after
    // the kernel (recorded as a use on `stream`).
    unsafe {
        gpu.k
            .spin_then_fill
            .launch(stream, LaunchConfig::new((4, 1, 1), (256, 1, 1)), &args)
    }
    .expect("launch spin_then_fill_u32");
}

/// A non-blocking stream of the crate's: it does not wait for the legacy stream.
fn crate_stream(device: &Device) -> Stream {
    Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).expect("create a stream")
}

/// The ownership rule for cudarc memory: a graph whose node writes a `CudarcSlice` keeps it
/// allocated after the handle is dropped right after the graph is built, for both ways a graph
/// holds memory: a kernel node (the slice in its argument list, `KernelArgs::ptr`) and a memset
/// node (the slice as the node's operand). The probe, a new cudarc allocation of the same size
/// on the slice's stream filled with the pattern before the launch, must stay intact, and the
/// graph must have written the original memory (read back through its address, still allocated
/// while the executable graph lives). Control: the same graph with the handle kept writes the
/// slice.
#[test]
#[ignore = "needs a GPU"]
fn cudarc_slice_dropped_after_building_a_graph_that_writes_it_stays_allocated() {
    let Some(g) = gpu("cudarc_slice_dropped_after_building_a_graph_that_writes_it_stays_allocated")
    else {
        return;
    };
    let (ctx, cs) = cudarc_stream(&g);
    // SAFETY: no capture begun outside this crate records `cs`; no StreamAllocation is made on it.
    let stream = unsafe { BorrowedStream::from_cudarc(&cs, &g.device) }.unwrap();
    type Build = fn(&Gpu, &CudarcSlice<u32>, u32) -> Graph;
    let builds: [(&str, Build, u32); 2] = [
        ("a kernel node", |g, t, v| fill_graph(g, t, v), 0x0BAD_CAFE),
        (
            "a memset node",
            |g, t, v| memset_graph(g, t, v),
            0x0CAF_EBAD,
        ),
    ];
    for (node, build, value) in builds {
        // Control.
        let target = zeroed(&cs);
        let graph = build(&g, &target, value);
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let got = cs.clone_dtoh(target.as_cudarc().unwrap()).unwrap();
        assert_all(&got, value, &format!("control: the target of {node}"));
        drop((exec, graph, target));

        // The probe.
        let target = zeroed(&cs);
        let freed = target.device_ptr();
        let graph = build(&g, &target, value);
        drop(target);
        let probe = probe_on(&cs);
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let got = cs.clone_dtoh(&probe).unwrap();
        assert_intact(
            &format!("a CudarcSlice dropped after building a graph whose {node} writes it"),
            freed,
            address(&probe, &cs),
            &got,
            PATTERN,
        );
        let original = read_words(&g.device, freed, N as usize).unwrap();
        assert_all(
            &original,
            value,
            &format!("the dropped slice's memory, written by the graph's {node}"),
        );
        drop((exec, graph, probe));
        g.device.synchronize().unwrap();
    }

    ctx.check_err().expect("no error in cudarc's record");
    assert_no_drop_errors(&g.device);
}

/// Stream order of the free: a crate kernel on stream A writes a `CudarcSlice` about 50 ms late
/// (`spin_then_fill_u32`), and the handle is dropped right after the launch. Its free, by cudarc
/// on the slice's own stream, must come after the kernel: the probe, allocated next on that
/// stream (stream order hands it the freed memory at once) and filled with the pattern, must
/// stay intact. Control: with the handle kept, the late writer's value arrives.
#[test]
#[ignore = "needs a GPU"]
fn cudarc_slice_free_waits_for_a_kernel_on_another_stream() {
    let Some(g) = gpu("cudarc_slice_free_waits_for_a_kernel_on_another_stream") else {
        return;
    };
    let (ctx, cs) = cudarc_stream(&g);
    let a = crate_stream(&g.device);

    // Control.
    let target = zeroed(&cs);
    late_writer(&g, &a, &target);
    a.synchronize().unwrap();
    let got = cs.clone_dtoh(target.as_cudarc().unwrap()).unwrap();
    assert_all(&got, LATE, "control: the late writer's target");
    drop(target);

    // The probe.
    let target = zeroed(&cs);
    let freed = target.device_ptr();
    late_writer(&g, &a, &target);
    drop(target);
    let probe = probe_on(&cs);
    cs.synchronize().unwrap();
    a.synchronize().unwrap();
    let got = cs.clone_dtoh(&probe).unwrap();
    assert_intact(
        "a CudarcSlice dropped while a kernel on another stream still writes it",
        freed,
        address(&probe, &cs),
        &got,
        PATTERN,
    );

    drop(probe);
    g.device.synchronize().unwrap();
    ctx.check_err().expect("no error in cudarc's record");
    assert_no_drop_errors(&g.device);
}

/// Back to cudarc in order: `into_inner` is refused while a graph holds the slice; once it is
/// handed back, cudarc's next work on the slice's stream follows the crate's. A late writer on
/// stream A fills the slice; `into_inner` right after the launch, then cudarc copies the slice
/// to the host on its own stream: it must read the late writer's value, not the zeros before it.
/// Then read access while the crate keeps the slice: taken in again, a second late writer on A
/// writes another value, and cudarc's copy through `as_cudarc` right after the launch, on the
/// slice's stream, must read that value, not the first writer's.
#[test]
#[ignore = "needs a GPU"]
fn into_inner_orders_cudarc_after_the_crates_work() {
    let Some(g) = gpu("into_inner_orders_cudarc_after_the_crates_work") else {
        return;
    };
    let (ctx, cs) = cudarc_stream(&g);
    let a = crate_stream(&g.device);

    let target = zeroed(&cs);
    let graph = fill_graph(&g, &target, 1);
    let refused = target.into_inner().unwrap_err();
    assert!(
        matches!(
            refused.error,
            Error::InvalidArgument {
                call: "CudarcSlice::into_inner",
                ..
            }
        ),
        "{}",
        refused.error
    );
    let target = refused.value;
    drop(graph);

    late_writer(&g, &a, &target);
    let slice = target.into_inner().unwrap();
    let got = cs.clone_dtoh(&slice).unwrap();
    assert_all(&got, LATE, "cudarc's copy after into_inner");

    // Taken back in again: cudarc's read through as_cudarc follows the crate's next work.
    let target = CudarcSlice::new(slice).unwrap();
    late_fill(&g, &a, &target, LATER);
    let got = cs.clone_dtoh(target.as_cudarc().unwrap()).unwrap();
    assert_all(
        &got,
        LATER,
        "cudarc's copy through as_cudarc after a late writer",
    );
    drop(target);
    a.synchronize().unwrap();
    g.device.synchronize().unwrap();
    ctx.check_err().expect("no error in cudarc's record");
    assert_no_drop_errors(&g.device);
}

/// A capture on a cudarc stream (`BorrowedStream::from_cudarc`) whose temporary is a graph
/// allocation, with crate kernels on cudarc memory and a cudarc copy captured among them:
/// `t = malloc_async; t = x; t += 1; y = t; free t; snapshot = z (cudarc's memcpy_dtod)`. The
/// graph keeps `x` as a kernel operand, and `z`, which only cudarc's captured copy reads, because
/// `as_cudarc` was called during the capture. Both handles are dropped before the first launch,
/// and two probes (cudarc allocations of the same size on the slices' stream, which stream order
/// hands the freed memory at once) are filled with the pattern; three launches; `y` must be
/// `x + 1` and the snapshot `z`, not values computed from the pattern, and the probes intact.
#[test]
#[ignore = "needs a GPU"]
fn capture_on_a_cudarc_stream_keeps_cudarc_memory() {
    let Some(g) = gpu("capture_on_a_cudarc_stream_keeps_cudarc_memory") else {
        return;
    };
    let (ctx, cs) = cudarc_stream(&g);
    // SAFETY: no capture begun outside this crate records `cs`; no StreamAllocation is made on it.
    let stream = unsafe { BorrowedStream::from_cudarc(&cs, &g.device) }.unwrap();
    const Z_BASE: u32 = 1000;
    let iota: Vec<u32> = (0..N as u32).collect();
    let from_z: Vec<u32> = (0..N as u32).map(|i| Z_BASE + i).collect();
    let x = CudarcSlice::new(cs.clone_htod(&iota).unwrap()).unwrap();
    let z = CudarcSlice::new(cs.clone_htod(&from_z).unwrap()).unwrap();
    let y = zeroed(&cs);
    // A plain cudarc slice: the captured cudarc copy's destination, which the graph does not
    // keep (cudarc's work is not seen by the crate): it outlives the executable graph here.
    let mut snapshot = cs.alloc_zeros::<u32>(N as usize).unwrap();

    let (graph, ()) = capture(&stream, CaptureMode::ThreadLocal, |cap| {
        let t = cap.malloc_async(BYTES)?;
        let cfg = config(N);
        // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n) and
        // add_u32(unsigned* p, unsigned long long n, unsigned v) over N words of memory the
        // graph keeps (graph allocation `t` between its alloc and free, `x`, `y`).
        unsafe {
            cap.launch(&g.k.copy, cfg, &KernelArgs::new().ptr(&t).ptr(&x).value(N))?;
            cap.launch(
                &g.k.add,
                cfg,
                &KernelArgs::new().ptr(&t).value(N).value(1u32),
            )?;
            cap.launch(&g.k.copy, cfg, &KernelArgs::new().ptr(&y).ptr(&t).value(N))?;
        }
        cap.free_async(&t)?;
        cs.memcpy_dtod(z.as_cudarc()?, &mut snapshot)?;
        Ok(())
    })
    .unwrap();
    let (x_at, z_at) = (x.device_ptr(), z.device_ptr());
    drop((x, z));
    let probes = [probe_on(&cs), probe_on(&cs)];
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    for (probe, (what, freed)) in probes.iter().zip([
        ("x, a kernel operand of the captured graph", x_at),
        ("z, read by cudarc's captured copy", z_at),
    ]) {
        let got = cs.clone_dtoh(probe).unwrap();
        let at = address(probe, &cs);
        let freed = if at == x_at || at == z_at { at } else { freed };
        assert_intact(
            &format!("a CudarcSlice dropped after a capture that uses it ({what})"),
            freed,
            at,
            &got,
            PATTERN,
        );
    }
    let got = cs.clone_dtoh(y.as_cudarc().unwrap()).unwrap();
    assert_iota(&got, 1, "y = x + 1 (x dropped before the launches)");
    let got = cs.clone_dtoh(&snapshot).unwrap();
    assert_iota(
        &got,
        Z_BASE,
        "the snapshot cudarc copied from z (dropped before the launches)",
    );

    drop((exec, graph, y, probes));
    g.device.synchronize().unwrap();
    drop(snapshot);
    ctx.check_err().expect("no error in cudarc's record");
    assert_no_drop_errors(&g.device);
}

/// What the adoption functions and `CudarcSlice` refuse, each with its value handed back or
/// nothing changed: an empty slice; a slice on the per-thread stream (cudarc would free it on
/// whichever thread's per-thread stream); a slice whose stream captures; `as_cudarc` while
/// cudarc's own capture records the slice's stream; a stream or a context that is not the
/// device's primary context's.
#[test]
#[ignore = "needs a GPU"]
fn cudarc_handles_the_crate_cannot_order_are_refused() {
    let Some(g) = gpu("cudarc_handles_the_crate_cannot_order_are_refused") else {
        return;
    };
    let (ctx, cs) = cudarc_stream(&g);
    let invalid = |e: &Error, name: &str| {
        assert!(
            matches!(e, Error::InvalidArgument { call, .. } if *call == name),
            "expected an InvalidArgument of {name}: {e}"
        );
    };

    // cudarc's empty slice (`CudaStream::null`, a 0-byte cuMemAllocAsync), where the driver
    // makes one.
    match cs.null::<u32>() {
        Ok(empty) => {
            let refused = CudarcSlice::new(empty).unwrap_err();
            invalid(&refused.error, "CudarcSlice::new");
            assert_eq!(refused.value.len(), 0);
        }
        Err(e) => println!("cudarc made no empty slice ({e:?}): that refusal is not tried"),
    }

    let per_thread = ctx.per_thread_stream();
    let on_per_thread = per_thread.alloc_zeros::<u32>(16).unwrap();
    let refused = CudarcSlice::new(on_per_thread).unwrap_err();
    invalid(&refused.error, "CudarcSlice::new");
    per_thread.synchronize().unwrap();
    drop(refused);

    // A slice whose stream is capturing (a capture of this crate on it): refused, handed back,
    // and dropped after the capture (cudarc would capture its free otherwise).
    // SAFETY: no capture begun outside this crate records `cs`; no StreamAllocation is made on it.
    let stream = unsafe { BorrowedStream::from_cudarc(&cs, &g.device) }.unwrap();
    let slice = cs.alloc_zeros::<u32>(16).unwrap();
    cs.synchronize().unwrap();
    let (_graph, refused) = capture(&stream, CaptureMode::ThreadLocal, |_| {
        Ok(CudarcSlice::new(slice).unwrap_err())
    })
    .unwrap();
    assert!(
        matches!(
            refused.error,
            Error::Capturing {
                call: "CudarcSlice::new",
                ..
            }
        ),
        "{}",
        refused.error
    );
    drop(refused);

    // Read access while cudarc's own capture records the slice's stream: refused (that graph
    // would keep nothing cudarc captures on the slice).
    let kept = zeroed(&cs);
    cs.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let e = kept.as_cudarc().unwrap_err();
    let cudarc_graph = cs.end_capture(CUgraphInstantiate_flags(0));
    assert!(
        matches!(
            e,
            Error::Capturing {
                call: "CudarcSlice::as_cudarc",
                ..
            }
        ),
        "{e}"
    );
    drop(cudarc_graph.expect("end cudarc's capture"));
    drop(kept);

    let other = CudaContext::new_non_primary(0, 0).expect("a non-primary context");
    invalid(
        &Device::from_cudarc(&other).unwrap_err(),
        "Device::from_cudarc",
    );
    let other_stream = other.new_stream().unwrap();
    // SAFETY: refused before anything is queued on it.
    let e = unsafe { BorrowedStream::from_cudarc(&other_stream, &g.device) }.unwrap_err();
    invalid(&e, "BorrowedStream::from_cudarc");
    drop((other_stream, other));

    g.device.synchronize().unwrap();
    ctx.check_err().expect("no error in cudarc's record");
    assert_no_drop_errors(&g.device);
}
