//! G.3.2 in the safe layer: stream capture of `malloc_async`/`free_async` with a fork to a second
//! stream and a join back; the capture guard that ends the capture on errors and panics and leaves
//! the stream usable; the three capture modes.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use cuda_graph::{
    AsStream, Capture, CaptureMode, CaptureStatus, DeviceBuffer, Error, InstantiateFlags,
    KernelArgs, MemRole, NodeKind, Stream, capture,
};
use safe_common::{BYTES, N, assert_all, assert_iota, config, gpu, iota_sum};

/// The guide's G.3.2: `malloc_async` on stream 1, kernel A, fork stream 2, kernel B on stream 1
/// and C on stream 2, join, `free_async`. The captured graph has one alloc node, one free node
/// after B and C, and three kernels; it passes the lifetime check, and B's copy and C's sum are
/// right on each of two launches.
#[test]
#[ignore = "needs a GPU"]
fn g3_2_capture_with_fork_and_join() {
    let Some(g) = gpu("g3_2_capture_with_fork_and_join") else {
        return;
    };
    let device = &g.device;
    let (stream1, stream2) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let sum = DeviceBuffer::<u64>::zeroed(device, 1).unwrap();
    let cfg = config(N);

    let (graph, dptr) = capture(&stream1, CaptureMode::Global, |cap| {
        assert_eq!(cap.status()?, CaptureStatus::Active);
        let dptr = cap.malloc_async(BYTES)?;
        // SAFETY: (the three launches) iota_u32(u32*, u64, u32), copy_u32(u32*, const u32*, u64),
        // sum_u32(const u32*, u64, u64*); `dptr` and `out` hold N values, `sum` one u64.
        unsafe {
            cap.launch(
                &g.k.iota,
                cfg,
                &KernelArgs::new().ptr(&dptr).value(N).value(3u32),
            )?
        }; // kernel A
        cap.fork(&stream2)?; // event1
        // SAFETY: as above.
        unsafe {
            cap.launch(
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out).ptr(&dptr).value(N),
            )?
        }; // kernel B
        // SAFETY: as above.
        unsafe {
            cap.launch_on(
                &stream2,
                &g.k.sum,
                cfg,
                &KernelArgs::new().ptr(&dptr).value(N).ptr(&sum),
            )?
        }; // kernel C
        cap.join(&stream2)?; // event2
        cap.free_async(&dptr)?; // after A, B and C
        Ok(dptr)
    })
    .unwrap();
    assert_eq!(stream1.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(stream2.capture_status().unwrap(), CaptureStatus::None);

    let nodes = graph.nodes();
    let count = |kind: &dyn Fn(&NodeKind) -> bool| nodes.iter().filter(|n| kind(n.kind())).count();
    assert_eq!(count(&|k| *k == NodeKind::MemAlloc), 1, "{nodes:?}");
    assert_eq!(count(&|k| *k == NodeKind::MemFree), 1, "{nodes:?}");
    assert_eq!(count(&|k| matches!(k, NodeKind::Kernel(_))), 3, "{nodes:?}");
    let alloc = nodes
        .iter()
        .position(|n| n.kind() == NodeKind::MemAlloc)
        .unwrap();
    let free = nodes
        .iter()
        .position(|n| n.kind() == NodeKind::MemFree)
        .unwrap();
    let record = graph.record();
    let dptr_key = record.key_of(&dptr);
    assert!(
        matches!(nodes[alloc].refs(), [(MemRole::Alloc, k)] if Some(*k) == dptr_key),
        "the alloc node is the captured allocation"
    );
    assert!(matches!(nodes[free].refs(), [(MemRole::Free, k)] if Some(*k) == dptr_key));
    let users: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            record
                .allocations_of(&nodes[i], MemRole::Use)
                .any(|a| a.same(&dptr))
        })
        .collect();
    assert_eq!(users.len(), 3, "A, B and C use the allocation: {nodes:?}");
    assert_eq!(
        nodes[free].deps().len(),
        2,
        "the free node depends on B and C: {nodes:?}"
    );
    graph.check().unwrap();
    println!("G.3.2 captured graph:\n{}", graph.to_dot());

    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for launch in 0..2 {
        sum.copy_from(&[0]).unwrap();
        exec.launch(&stream1).unwrap();
        stream1.synchronize().unwrap();
        assert_iota(
            &out.to_vec().unwrap(),
            3,
            &format!("launch {launch}: B's copy"),
        );
        assert_eq!(
            sum.to_vec().unwrap(),
            vec![iota_sum(3, N)],
            "launch {launch}: C's sum"
        );
        assert!(!dptr.is_live());
    }
}

/// The capture guard: an error returned from the closure, a panic inside it, and a guard
/// dropped without `end` each end the capture; the stream is then not capturing and runs work.
#[test]
#[ignore = "needs a GPU"]
fn capture_always_ends_and_leaves_the_stream_usable() {
    let Some(g) = gpu("capture_always_ends_and_leaves_the_stream_usable") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let usable = |value: u32| {
        assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
        // SAFETY: fill_u32(u32*, u64, u32) on the N values of `out`.
        unsafe {
            g.k.fill.launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&out).value(N).value(value),
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        assert_all(&out.to_vec().unwrap(), value, "fill after the capture");
    };

    // `?` inside the closure.
    let err = capture(&stream, CaptureMode::Global, |cap| {
        let _buf = cap.malloc_async(BYTES)?;
        cap.malloc_async(0)?; // refused: 0 bytes
        Ok(())
    })
    .unwrap_err();
    println!("capture ended by an error: {err}");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    usable(1);

    // A panic inside the closure.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = capture(&stream, CaptureMode::Global, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: fill_u32 on the N values of `buf`.
            unsafe {
                cap.launch(
                    &g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(5u32),
                )?
            };
            panic!("boom inside the capture");
            #[allow(unreachable_code)]
            Ok(())
        });
    }));
    assert!(panicked.is_err());
    usable(2);

    // A guard dropped without `end`.
    {
        let guard = Capture::begin(&stream, CaptureMode::ThreadLocal).unwrap();
        assert_eq!(guard.status().unwrap(), CaptureStatus::Active);
        let _buf = guard.malloc_async(BYTES).unwrap();
    }
    usable(3);
}

/// The three capture modes each produce a graph that runs: alloc, fill, copy out, free.
#[test]
#[ignore = "needs a GPU"]
fn capture_modes_global_thread_local_relaxed() {
    let Some(g) = gpu("capture_modes_global_thread_local_relaxed") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    for (value, mode) in [
        (21u32, CaptureMode::Global),
        (22, CaptureMode::ThreadLocal),
        (23, CaptureMode::Relaxed),
    ] {
        let guard = Capture::begin(&stream, mode).unwrap();
        let buf = guard.malloc_async(BYTES).unwrap();
        // SAFETY: fill_u32 then copy_u32 on the N values of `buf` and `out`.
        unsafe {
            guard
                .launch(
                    &g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&buf).value(N).value(value),
                )
                .unwrap();
            guard
                .launch(
                    &g.k.copy,
                    config(N),
                    &KernelArgs::new().ptr(&out).ptr(&buf).value(N),
                )
                .unwrap();
        }
        guard.free_async(&buf).unwrap();
        let graph = guard.end().unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(&out.to_vec().unwrap(), value, &format!("{mode:?} capture"));
    }
}

/// Capturing on the per-thread default stream (`cudaStreamPerThread`), as G.3.4 does.
#[test]
#[ignore = "needs a GPU"]
fn capture_on_the_per_thread_stream() {
    let Some(g) = gpu("capture_on_the_per_thread_stream") else {
        return;
    };
    let device = &g.device;
    let per_thread = cuda_graph::BorrowedStream::per_thread(device);
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (graph, ()) = capture(&per_thread, CaptureMode::Global, |cap| {
        let buf = cap.malloc_async(BYTES)?;
        // SAFETY: iota_u32 then copy_u32 on the N values of `buf` and `out`.
        unsafe {
            cap.launch(
                &g.k.iota,
                config(N),
                &KernelArgs::new().ptr(&buf).value(N).value(100u32),
            )?;
            cap.launch(
                &g.k.copy,
                config(N),
                &KernelArgs::new().ptr(&out).ptr(&buf).value(N),
            )?;
        }
        cap.free_async(&buf)
    })
    .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&per_thread).unwrap();
    per_thread.synchronize().unwrap();
    assert_iota(&out.to_vec().unwrap(), 100, "per-thread capture");
}

/// `Capture::free_async_on`: the allocation is made and written on stream 1, read on stream 2
/// after a fork, and freed on stream 2 (the guide's `cudaFreeAsync(d, stream2)` inside a
/// capture); the free node follows the read on stream 2, the graph passes the lifetime check,
/// and the read copies the data on each of two launches. A free on a stream that is not part of
/// the capture is refused by name, frees nothing and leaves the capture usable.
#[test]
#[ignore = "needs a GPU"]
fn free_on_a_forked_stream_inside_a_capture() {
    let Some(g) = gpu("free_on_a_forked_stream_inside_a_capture") else {
        return;
    };
    let device = &g.device;
    let (s1, s2, outside) = (
        Stream::new(device).unwrap(),
        Stream::new(device).unwrap(),
        Stream::new(device).unwrap(),
    );
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);
    let (graph, a) = capture(&s1, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        // SAFETY: iota_u32(u32*, u64, u32) and copy_u32(u32*, const u32*, u64) over the N
        // values of `a` and `out`.
        unsafe {
            cap.launch(
                &g.k.iota,
                cfg,
                &KernelArgs::new().ptr(&a).value(N).value(5u32),
            )?
        };
        cap.fork(&s2)?;
        // SAFETY: as above.
        unsafe {
            cap.launch_on(
                &s2,
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&out).ptr(&a).value(N),
            )?
        };
        let refused = cap.free_async_on(&outside, &a);
        assert!(
            matches!(
                &refused,
                Err(Error::NotInCapture {
                    call: "Capture::free_async_on"
                })
            ),
            "a free on a stream outside the capture: {refused:?}"
        );
        cap.free_async_on(&s2, &a)?;
        cap.join(&s2)?;
        Ok(a)
    })
    .unwrap();
    let nodes = graph.nodes();
    let free = nodes
        .iter()
        .position(|n| n.kind() == NodeKind::MemFree)
        .expect("a free node");
    assert!(
        matches!(nodes[free].refs(), [(MemRole::Free, k)] if Some(*k) == graph.record().key_of(&a))
    );
    let copy = nodes
        .iter()
        .position(|n| {
            matches!(n.kind(), NodeKind::Kernel(_))
                && n.deps().len() == 1
                && nodes[n.deps()[0] as usize].kind() != NodeKind::MemAlloc
        })
        .expect("the copy on stream 2");
    assert!(
        nodes[free].deps().iter().any(|&d| d as usize == copy),
        "the free node follows the read on stream 2: {nodes:?}"
    );
    graph.check().unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for launch in 0..2 {
        out.copy_from(&vec![0; N as usize]).unwrap();
        exec.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        assert_iota(
            &out.to_vec().unwrap(),
            5,
            &format!("launch {launch}: the copy on stream 2"),
        );
    }
    assert_eq!(outside.capture_status().unwrap(), CaptureStatus::None);
}
