//! G.3.4 in the safe layer: a producer graph instantiated with AutoFreeOnLaunch whose
//! allocations consumer graphs read, relaunched in a loop without freeing in between, then freed
//! with `free_async`; the clear error when a graph with unfreed allocations is relaunched
//! without AutoFreeOnLaunch; and the RAII free of an escaped allocation, which waits for the
//! stream work still using it, shown with the reuse probe of the guide ("Testing"). (The
//! footprint side of RAII is in `safe_footprint`.)
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, CaptureMode, DeviceBuffer, Error, Event, EventFlags,
    Graph, GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig, Stream, StreamFlags,
    capture, live_objects,
};
use probe::{PATTERN, SPIN_50_MS, assert_intact, read_words};
use safe_common::{
    BYTES, Gpu, N, assert_all, assert_iota, assert_no_drop_errors, assert_released, config, gpu,
    settle,
};

/// The guide's G.3.4 loop: the producer (captured on the per-thread stream) allocates `data1`
/// and `data2` and fills them; consumer 1 adds to `data1` and copies it out; consumer 2 copies
/// `data2` out, on every other iteration. Relaunching the producer frees the previous
/// iteration's allocations (AutoFreeOnLaunch), so consumer 1 always sees a fresh fill. After the
/// loop, `free_async` frees both.
#[test]
#[ignore = "needs a GPU"]
fn g3_4_producer_with_auto_free_on_launch_and_two_consumers() {
    let Some(g) = gpu("g3_4_producer_with_auto_free_on_launch_and_two_consumers") else {
        return;
    };
    let device = &g.device;
    let per_thread = BorrowedStream::per_thread(device);
    let my_stream = Stream::new(device).unwrap();
    let out1 = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let out2 = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);

    let (graph, (data1, data2)) = capture(&per_thread, CaptureMode::Global, |cap| {
        let data1 = cap.malloc_async(BYTES)?;
        let data2 = cap.malloc_async(BYTES)?;
        // SAFETY: fill_u32 and iota_u32 on the N values of `data1` and `data2`.
        unsafe {
            cap.launch(
                &g.k.fill,
                cfg,
                &KernelArgs::new().ptr(&data1).value(N).value(10u32),
            )?;
            cap.launch(
                &g.k.iota,
                cfg,
                &KernelArgs::new().ptr(&data2).value(N).value(100u32),
            )?;
        }
        Ok((data1, data2))
    })
    .unwrap();
    graph.check().unwrap();
    let producer = graph
        .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
        .unwrap();
    drop(graph);
    assert!(
        producer
            .flags()
            .contains(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
    );
    assert_eq!(producer.unfreed_allocations().len(), 2);

    let (graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: add_u32 on `data1`, then copy_u32 of its N values into `out1`.
        unsafe {
            cap.launch(
                &g.k.add,
                cfg,
                &KernelArgs::new().ptr(&data1).value(N).value(1u32),
            )?;
            cap.launch(
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out1).ptr(&data1).value(N),
            )
        }
    })
    .unwrap();
    let consumer1 = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);
    let (graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        // SAFETY: copy_u32 of the N values of `data2` into `out2`.
        unsafe {
            cap.launch(
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out2).ptr(&data2).value(N),
            )
        }
    })
    .unwrap();
    let consumer2 = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);

    // Consumers before the producer ever ran: their allocations are not live.
    let err = consumer1.launch(&my_stream).unwrap_err();
    println!("consumer before the producer: {err}");
    assert!(
        matches!(&err, Error::NotLive { call, .. } if *call == "ExecGraph::launch"),
        "{err:?}"
    );

    let address = (data1.ptr(), data2.ptr());
    let mut launch_consumer2 = false;
    for iteration in 0..6 {
        producer.launch(&my_stream).unwrap();
        assert!(data1.is_live() && data2.is_live());
        consumer1.launch(&my_stream).unwrap();
        if launch_consumer2 {
            out2.copy_from(&vec![0; N as usize]).unwrap();
            consumer2.launch(&my_stream).unwrap();
        }
        my_stream.synchronize().unwrap();
        assert_all(
            &out1.to_vec().unwrap(),
            11,
            &format!("iteration {iteration}: consumer 1 sees a fresh fill + 1"),
        );
        if launch_consumer2 {
            assert_iota(
                &out2.to_vec().unwrap(),
                100,
                &format!("iteration {iteration}: consumer 2"),
            );
        }
        assert_eq!((data1.ptr(), data2.ptr()), address);
        launch_consumer2 = !launch_consumer2;
    }
    data1.free_async(&my_stream).unwrap();
    data2.free_async(&my_stream).unwrap();
    assert!(!data1.is_live() && !data2.is_live());
    my_stream.synchronize().unwrap();
    drop((producer, consumer1, consumer2));
}

/// Without AutoFreeOnLaunch, relaunching a graph whose previous launch left an allocation live
/// is `Error::UnfreedOnRelaunch` naming it, before CUDA is asked; after `free_async` the relaunch
/// works.
#[test]
#[ignore = "needs a GPU"]
fn relaunch_with_unfreed_allocations_is_refused_without_auto_free() {
    let Some(g) = gpu("relaunch_with_unfreed_allocations_is_refused_without_auto_free") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let (alloc, kept) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("kept"))
        .unwrap();
    // SAFETY: iota_u32 on the N values of `kept`, after its alloc node.
    unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            config(N),
            &KernelArgs::new().ptr(&kept).value(N).value(60u32),
        )
    }
    .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    assert_eq!(exec.unfreed_allocations().len(), 1);

    for round in 0..2 {
        exec.launch(&stream).unwrap();
        assert!(kept.is_live());
        let err = exec.launch(&stream).unwrap_err();
        println!("relaunch with 'kept' live: {err}");
        match &err {
            Error::UnfreedOnRelaunch { allocations } => {
                assert_eq!(allocations, &vec![kept.describe()]);
                assert!(err.to_string().contains("allocation 'kept'"), "{err}");
            }
            other => panic!("expected UnfreedOnRelaunch, got {other:?}"),
        }
        assert!(err.to_string().contains("AUTO_FREE_ON_LAUNCH"), "{err}");
        // SAFETY: copy_u32 of the N values of `kept` (live, allocated on this stream) into `out`.
        unsafe {
            g.k.copy.launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(&kept).value(N),
            )
        }
        .unwrap();
        kept.free_async(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_iota(&out.to_vec().unwrap(), 60, &format!("round {round}"));
    }
}

/// A graph with an alloc node of `BYTES` labelled `label` and, after it, `iota_u32` from
/// `base` over every word; no free node, so the allocation outlives each launch (G.3.3).
fn escaping_iota(g: &Gpu, label: &str, base: u32) -> (Graph, GraphAllocation) {
    let device = &g.device;
    let mut graph = Graph::new(device).unwrap();
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label(label))
        .unwrap();
    // SAFETY: iota_u32(unsigned* p, unsigned long long n, unsigned base) on the N values of
    // `a`, after its alloc node.
    unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            config(N),
            &KernelArgs::new().ptr(&a).value(N).value(base),
        )
    }
    .unwrap();
    (graph, a)
}

/// RAII never frees an escaped allocation while stream work may still use it. The allocation's
/// graph and executable graph are dropped after its launch on stream A; on stream B (non-
/// blocking) a slow kernel (it spins about 50 ms, then writes 88 to every word) and a copy of
/// the allocation into `out` are queued; then the allocation's last handle is dropped while
/// they run. The reuse probe follows at once: a graph allocating the same size, launched on
/// stream A, fills its allocation with the pattern, and graph memory is trimmed. Stream B must
/// then synchronize without error, `out` must hold 88 in every word (not the probe's
/// pattern), and the probe must still hold the pattern in every word (not the slow kernel's
/// 88). Control: the same with a clone of the handle kept until stream B is done.
#[test]
#[ignore = "needs a GPU"]
fn raii_free_waits_for_stream_work_still_using_the_allocation() {
    let Some(g) = gpu("raii_free_waits_for_stream_work_still_using_the_allocation") else {
        return;
    };
    let device = &g.device;
    let new_stream = || Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let (stream_a, stream_b) = (new_stream(), new_stream());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let live_start = live_objects();
    let mut probe_graph = Graph::new(device).unwrap();
    let (alloc, probe) = probe_graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("probe"))
        .unwrap();
    // SAFETY: fill_u32(unsigned* p, unsigned long long n, unsigned v) on the N values of
    // `probe`, after its alloc node.
    unsafe {
        probe_graph.add_kernel_node(
            &[alloc],
            &g.k.fill,
            config(N),
            &KernelArgs::new().ptr(&probe).value(N).value(PATTERN),
        )
    }
    .unwrap();
    let probe_exec = probe_graph.instantiate(InstantiateFlags::NONE).unwrap();

    for keep_alive in [true, false] {
        let case = if keep_alive {
            "control (a handle kept)"
        } else {
            "last handle dropped"
        };
        out.copy_from(&vec![0; N as usize]).unwrap();
        let (graph, escaped) = escaping_iota(&g, "escaped", 1);
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream_a).unwrap();
        let allocated = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();
        allocated.record(&stream_a).unwrap();
        drop(exec);
        drop(graph);
        assert!(escaped.is_live(), "live until its last handle drops");
        let freed = escaped.ptr();

        stream_b.wait_event(&allocated).unwrap();
        // SAFETY: spin_then_fill_u32(unsigned* p, unsigned long long n, unsigned v,
        // unsigned long long spins) and copy_u32(unsigned* dst, const unsigned* src,
        // unsigned long long n) on the N values of `escaped` (live: allocated by the launch that
        // stream B waits for) and of `out`.
        unsafe {
            g.k.spin_then_fill
                .launch(
                    &stream_b,
                    few_blocks(),
                    &KernelArgs::new()
                        .ptr(&escaped)
                        .value(N)
                        .value(88u32)
                        .value(SPIN_50_MS),
                )
                .unwrap();
            g.k.copy
                .launch(
                    &stream_b,
                    config(N),
                    &KernelArgs::new().ptr(&out).ptr(&escaped).value(N),
                )
                .unwrap();
        }
        let kept = keep_alive.then(|| escaped.clone());
        drop(escaped); // the last handle unless kept, while stream B still runs
        probe_exec.launch(&stream_a).unwrap();
        stream_a.synchronize().unwrap();
        device.graph_mem_trim().unwrap();
        let b_done = stream_b.synchronize();
        println!("{case}: stream B: {b_done:?}");
        b_done.unwrap_or_else(|e| {
            panic!("{case}: stream B used the allocation after it was freed and trimmed: {e}")
        });
        assert_all(
            &out.to_vec().unwrap(),
            88,
            &format!(
                "{case}: the copy of the slow kernel's values ({PATTERN:#x}: the probe's pattern, read through the freed allocation)"
            ),
        );
        let got = read_words(device, probe.ptr(), N as usize).unwrap();
        assert_intact(
            &format!("{case}: the slow kernel on stream B"),
            freed,
            probe.ptr(),
            &got,
            PATTERN,
        );
        if let Some(escaped) = kept {
            escaped.free_async(&stream_a).unwrap();
        }
        probe.free_async(&stream_a).unwrap();
        stream_a.synchronize().unwrap();
    }
    drop((probe_exec, probe_graph, probe));
    assert_eq!(
        settle(device, live_start),
        live_start,
        "objects of the crate still live after every graph and handle was dropped"
    );
    assert_released(
        device,
        "raii_free_waits_for_stream_work_still_using_the_allocation",
    );
    assert_no_drop_errors(device);
}

/// Four blocks of 256 threads: the slow kernel writes every word (grid-stride loop) while all
/// its threads spin at once.
fn few_blocks() -> LaunchConfig {
    LaunchConfig::new((4, 1, 1), (256, 1, 1))
}
