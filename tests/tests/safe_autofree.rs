//! G.3.4 in the safe layer: a producer graph instantiated with AutoFreeOnLaunch whose
//! allocations consumer graphs read, relaunched in a loop without freeing in between, then freed
//! with `free_async`; the clear error when a graph with unfreed allocations is relaunched
//! without AutoFreeOnLaunch; and the RAII free of an escaped allocation, which waits for the
//! stream work still using it. (The footprint side of RAII is in `safe_footprint`.)
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, CaptureMode, DeviceBuffer, Error, Event, EventFlags,
    Graph, InstantiateFlags, KernelArgs, Stream, capture,
};
use safe_common::{BYTES, N, assert_all, assert_iota, config, gpu};

/// The guide's G.3.4 loop: the producer (captured on the per-thread stream) allocates `data1`
/// and `data2` and fills them; consumer 1 adds to `data1` and copies it out; consumer 2 copies
/// `data2` out, on every other iteration. Relaunching the producer frees the previous
/// iteration's allocations (AutoFreeOnLaunch), so consumer 1 always sees a fresh fill. After the
/// loop, `free_async` frees both.
#[test]
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
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");

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
                assert_eq!(allocations, &vec!["allocation 'kept'".to_string()]);
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

/// RAII never frees an escaped allocation while stream work may still use it: the graph and the
/// executable graph are dropped first; a slow kernel (it spins ~10 ms, then writes) and a copy-out
/// are queued on a second stream; the last handle is dropped while they run. The private stream
/// that frees it waits for them, so the copy sees the slow kernel's values.
#[test]
fn raii_free_waits_for_stream_work_still_using_the_allocation() {
    let Some(g) = gpu("raii_free_waits_for_stream_work_still_using_the_allocation") else {
        return;
    };
    let device = &g.device;
    let (stream_a, stream_b) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let (alloc, escaped) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("escaped"))
        .unwrap();
    // SAFETY: iota_u32 on the N values of `escaped`, after its alloc node.
    unsafe {
        graph.add_kernel_node(
            &[alloc],
            &g.k.iota,
            config(N),
            &KernelArgs::new().ptr(&escaped).value(N).value(1u32),
        )
    }
    .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream_a).unwrap();
    let allocated = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();
    allocated.record(&stream_a).unwrap();
    drop(exec);
    drop(graph);
    assert!(escaped.is_live(), "live until its last handle drops");

    stream_b.wait_event(&allocated).unwrap();
    // SAFETY: spin_then_fill_u32(u32*, u64, u32, u64) and copy_u32 on the N values of `escaped`
    // (live: allocated by the launch that stream B waits for) and `out`.
    unsafe {
        g.k.spin_then_fill
            .launch(
                &stream_b,
                config(N),
                &KernelArgs::new()
                    .ptr(&escaped)
                    .value(N)
                    .value(88u32)
                    .value(20_000_000u64),
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
    drop(escaped); // the last handle, while stream B still runs
    stream_b.synchronize().unwrap();
    device.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        88,
        "copy of the slow kernel's values",
    );
}
