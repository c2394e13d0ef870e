//! G.3.3 in the safe layer: an allocation that its graph does not free outlives the launch, is
//! used by stream work and other graphs, and is freed outside the allocating graph, with the
//! three orderings of the guide: one stream and `GraphAllocation::free_async`; events between
//! streams and a separate free graph; event record and wait nodes in the graphs. Also a free
//! graph made by capture, and the refusal to launch a free graph before the allocation exists.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, DeviceBuffer, Error, Event, EventFlags, Graph,
    InstantiateFlags, KernelArgs, Stream, capture,
};
use safe_common::{BYTES, N, assert_all, assert_iota, config, gpu};

/// A graph with one alloc node (labelled `label`) and nothing else.
fn alloc_graph(device: &cuda_graph::Device, label: &str) -> (Graph, cuda_graph::GraphAllocation) {
    let mut graph = Graph::new(device).unwrap();
    let (_, buf) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label(label))
        .unwrap();
    (graph, buf)
}

/// Ordering with a single stream: launch the allocating graph, then a kernel and a copy-out on
/// the same stream, then `free_async` on it.
#[test]
#[ignore = "needs a GPU"]
fn g3_3_single_stream_free_async() {
    let Some(g) = gpu("g3_3_single_stream_free_async") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (graph, dptr) = alloc_graph(device, "dptr");
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    assert_eq!(exec.unfreed_allocations().len(), 1);
    assert!(exec.unfreed_allocations()[0].same(&dptr));

    // Not yet launched: nothing to free.
    let err = dptr.free_async(&stream).unwrap_err();
    println!("free_async before the launch: {err}");
    assert!(
        matches!(&err, Error::NotLive { call, allocation } if *call == "GraphAllocation::free_async" && allocation.id == dptr.id()),
        "{err:?}"
    );

    exec.launch(&stream).unwrap();
    assert!(dptr.is_live());
    // SAFETY: iota_u32 then copy_u32 on the N values of `dptr` (live: allocated by the launch
    // queued before on this stream) and `out`.
    unsafe {
        g.k.iota
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&dptr).value(N).value(50u32),
            )
            .unwrap();
        g.k.copy
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(&dptr).value(N),
            )
            .unwrap();
    }
    dptr.free_async(&stream).unwrap();
    assert!(!dptr.is_live());
    let err = dptr.free_async(&stream).unwrap_err();
    println!("second free_async: {err}");
    stream.synchronize().unwrap();
    assert_iota(
        &out.to_vec().unwrap(),
        50,
        "kernel on the allocating stream",
    );

    // Freed: the graph can be launched again, and freed again.
    exec.launch(&stream).unwrap();
    dptr.free_async(&stream).unwrap();
    stream.synchronize().unwrap();
}

/// Ordering with events between streams: the allocating graph on `alloc_stream`, an event that
/// stream 2 waits for, a kernel on stream 2, an event that stream 3 waits for, and a separate
/// graph on stream 3 whose kernel uses the allocation before its free node frees it.
#[test]
#[ignore = "needs a GPU"]
fn g3_3_events_between_streams_and_a_free_graph() {
    let Some(g) = gpu("g3_3_events_between_streams_and_a_free_graph") else {
        return;
    };
    let device = &g.device;
    let [alloc_stream, stream2, stream3] = [(); 3].map(|()| Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (alloc_graph, dptr) = alloc_graph(device, "dptr");

    let mut free_graph = Graph::new(device).unwrap();
    // SAFETY: add_u32 then copy_u32 on the N values of `dptr` (live when the graph runs: the
    // launches below are ordered by events) and `out`.
    let a = unsafe {
        free_graph.add_kernel_node(
            &[],
            &g.k.add,
            config(N),
            &KernelArgs::new().ptr(&dptr).value(N).value(1000u32),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let copy = unsafe {
        free_graph.add_kernel_node(
            &[a],
            &g.k.copy,
            config(N),
            &KernelArgs::new().ptr(&out).ptr(&dptr).value(N),
        )
    }
    .unwrap();
    free_graph.add_mem_free_node(&[copy], &dptr).unwrap();
    free_graph.check().unwrap();

    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let alloc_event = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();
    let use_done = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();

    for round in 0..2u32 {
        alloc_exec.launch(&alloc_stream).unwrap();
        alloc_event.record(&alloc_stream).unwrap();
        stream2.wait_event(&alloc_event).unwrap();
        // SAFETY: iota_u32 on the N values of `dptr`, after the allocating launch (event).
        unsafe {
            g.k.iota.launch(
                &stream2,
                config(N),
                &KernelArgs::new().ptr(&dptr).value(N).value(round * 10),
            )
        }
        .unwrap();
        use_done.record(&stream2).unwrap();
        stream3.wait_event(&use_done).unwrap();
        free_exec.launch(&stream3).unwrap();
        assert!(!dptr.is_live());
        stream3.synchronize().unwrap();
        assert_iota(
            &out.to_vec().unwrap(),
            round * 10 + 1000,
            &format!("round {round}: stream-2 iota + free graph's add"),
        );
    }
}

/// Ordering with event record and wait nodes: the allocating graph records `alloc_event` after
/// its alloc node; the wait-and-free graph waits for `alloc_event` and `use_done`, runs its
/// kernel, copies out, and frees after both its own users and the stream-2 user.
#[test]
#[ignore = "needs a GPU"]
fn g3_3_event_record_and_wait_nodes() {
    let Some(g) = gpu("g3_3_event_record_and_wait_nodes") else {
        return;
    };
    let device = &g.device;
    let [alloc_stream, stream2, stream3] = [(); 3].map(|()| Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let alloc_event = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();
    let use_done = Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();

    let mut alloc_graph = Graph::new(device).unwrap();
    let (alloc_node, dptr) = alloc_graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("dptr"))
        .unwrap();
    let record = alloc_graph
        .add_event_record_node(&[alloc_node], &alloc_event)
        .unwrap();
    assert!(alloc_graph.node(record).unwrap().event().is_some());

    let mut free_graph = Graph::new(device).unwrap();
    let use_done_node = free_graph.add_event_wait_node(&[], &use_done).unwrap();
    let alloc_ready = free_graph.add_event_wait_node(&[], &alloc_event).unwrap();
    assert!(free_graph.node(alloc_ready).unwrap().event().is_some());
    // The guide's kernel node depends on the alloc-ready wait only; it also waits for the stream-2
    // user here so that its result can be checked.
    // SAFETY: add_u32 then copy_u32 on the N values of `dptr` (live: ordered after the
    // allocating graph by the wait node) and `out`.
    let kernel = unsafe {
        free_graph.add_kernel_node(
            &[alloc_ready, use_done_node],
            &g.k.add,
            config(N),
            &KernelArgs::new().ptr(&dptr).value(N).value(5u32),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let copy = unsafe {
        free_graph.add_kernel_node(
            &[kernel],
            &g.k.copy,
            config(N),
            &KernelArgs::new().ptr(&out).ptr(&dptr).value(N),
        )
    }
    .unwrap();
    free_graph
        .add_mem_free_node(&[copy, use_done_node], &dptr)
        .unwrap();

    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE).unwrap();
    for round in 0..2u32 {
        alloc_exec.launch(&alloc_stream).unwrap();
        stream2.wait_event(&alloc_event).unwrap();
        // SAFETY: fill_u32 on the N values of `dptr`, after the event record node.
        unsafe {
            g.k.fill.launch(
                &stream2,
                config(N),
                &KernelArgs::new().ptr(&dptr).value(N).value(70 + round),
            )
        }
        .unwrap();
        use_done.record(&stream2).unwrap();
        free_exec.launch(&stream3).unwrap();
        stream3.synchronize().unwrap();
        assert_all(
            &out.to_vec().unwrap(),
            75 + round,
            &format!("round {round}: stream-2 fill + graph's add"),
        );
        assert!(!dptr.is_live());
    }
    device.synchronize().unwrap();
}

/// A free graph made by stream capture: `Capture::free_async` of an allocation that another graph
/// made becomes a free node, and the launch frees it.
#[test]
#[ignore = "needs a GPU"]
fn g3_3_captured_free_of_an_outside_allocation() {
    let Some(g) = gpu("g3_3_captured_free_of_an_outside_allocation") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (alloc_graph, dptr) = alloc_graph(device, "dptr");
    let (free_graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
        // SAFETY: copy_u32 from the N values of `dptr` into `out`.
        unsafe {
            cap.launch(
                &g.k.copy,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(&dptr).value(N),
            )?
        };
        cap.free_async(&dptr)
    })
    .unwrap();
    free_graph.check().unwrap();
    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE).unwrap();

    alloc_exec.launch(&stream).unwrap();
    // SAFETY: fill_u32 on the N values of `dptr`, after the allocating launch on this stream.
    unsafe {
        g.k.fill.launch(
            &stream,
            config(N),
            &KernelArgs::new().ptr(&dptr).value(N).value(31u32),
        )
    }
    .unwrap();
    free_exec.launch(&stream).unwrap();
    assert!(!dptr.is_live());
    stream.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 31, "captured free graph's copy");
}

/// A graph that frees (or uses) an allocation of another graph is refused before the allocating
/// graph has launched, and after the allocation has been freed.
#[test]
#[ignore = "needs a GPU"]
fn launch_of_a_free_graph_needs_a_live_allocation() {
    let Some(g) = gpu("launch_of_a_free_graph_needs_a_live_allocation") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let (alloc_graph, dptr) = alloc_graph(device, "dptr");
    let mut free_graph = Graph::new(device).unwrap();
    free_graph.add_mem_free_node(&[], &dptr).unwrap();
    let alloc_exec = alloc_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let free_exec = free_graph.instantiate(InstantiateFlags::NONE).unwrap();

    let err = free_exec.launch(&stream).unwrap_err();
    println!("free graph before the allocating launch: {err}");
    assert!(err.to_string().contains("allocation 'dptr'"), "{err}");
    alloc_exec.launch(&stream).unwrap();
    free_exec.launch(&stream).unwrap();
    let err = free_exec.launch(&stream).unwrap_err();
    println!("free graph launched twice: {err}");
    assert!(
        matches!(&err, Error::NotLive { call, .. } if *call == "ExecGraph::launch"),
        "{err:?}"
    );
    stream.synchronize().unwrap();
}

/// Stream-ordered memsets and copies on device buffers and a graph allocation
/// (`StreamMemOps`), and their captured forms: a graph allocates `x` and fills it (iota from 4)
/// behind a spin on stream 1; a copy of `x` queued on stream 2 right after the launch reads the
/// iota (the crate orders stream 2 after the launch that allocated `x`); a memset of `x` to 9 on
/// stream 2, a copy back and 1- and 2-byte memsets of a buffer read back exactly. Captured:
/// `Capture::memset_async` and `memcpy_async` on a graph allocation make a graph whose launch
/// writes the buffer.
#[test]
#[ignore = "needs a GPU"]
fn memsets_and_copies_on_streams_and_in_captures() {
    use cuda_graph::{CaptureMode, StreamFlags, StreamMemOps, capture};
    let Some(g) = gpu("memsets_and_copies_on_streams_and_in_captures") else {
        return;
    };
    let device = &g.device;
    let s1 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let s2 = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let (alloc, x) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    // SAFETY: spin_then_fill_u32(u32*, u64, u32, u64) with n = 0 writes nothing and spins;
    // iota_u32(u32*, u64, u32) over the N values of `x`, after its alloc node.
    unsafe {
        let spin = graph
            .add_kernel_node(
                &[alloc],
                &g.k.spin_then_fill,
                config(1),
                &KernelArgs::new()
                    .value(0u64)
                    .value(0u64)
                    .value(0u32)
                    .value(20_000_000u64),
            )
            .unwrap();
        graph
            .add_kernel_node(
                &[spin],
                &g.k.iota,
                config(N),
                &KernelArgs::new().ptr(&x).value(N).value(4u32),
            )
            .unwrap();
    }
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s1).unwrap();
    s2.memcpy_async(&out, &x, BYTES).unwrap();
    s2.synchronize().unwrap();
    assert_iota(
        &out.to_vec().unwrap(),
        4,
        "a copy ordered after the allocating launch",
    );
    s2.memset_async(&x, 9u32, N as usize).unwrap();
    s2.memcpy_async(&out, &x, BYTES).unwrap();
    x.free_async(&s2).unwrap();
    s2.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        9,
        "memset of the allocation, copied back",
    );

    let bytes = DeviceBuffer::<u8>::zeroed(device, 64).unwrap();
    s1.memset_async(&bytes, 0xABu8, 64).unwrap();
    s1.memset_async(&bytes, 0x0102u16, 8).unwrap();
    s1.synchronize().unwrap();
    let got = bytes.to_vec().unwrap();
    let want: Vec<u8> = (0..64)
        .map(|i| if i < 16 { [2, 1][i % 2] } else { 0xAB })
        .collect();
    assert_eq!(got, want, "1- and 2-byte memsets");

    let (captured, _y) = capture(&s1, CaptureMode::Global, |cap| {
        let y = cap.malloc_async(BYTES)?;
        cap.memset_async(&y, 11u32, N as usize)?;
        cap.memcpy_async(&out, &y, BYTES)?;
        cap.free_async(&y)?;
        Ok(y)
    })
    .unwrap();
    captured.check().unwrap();
    let exec = captured.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s1).unwrap();
    s1.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 11, "the captured memset and copy");
}
