//! G.3.2 in the safe layer: stream capture of `malloc_async`/`free_async` with a fork to a second
//! stream and a join back; the capture guard that ends the capture on errors and panics and leaves
//! the stream usable; the three capture modes.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are copied back and checked element by element.

mod safe_common;

use cuda_graph::{
    AsStream, Capture, CaptureMode, CaptureStatus, DeviceBuffer, Error, InstantiateFlags,
    KernelArgs, MemRole, NodeKind, Stream, StreamMemOps, capture,
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

/// A fork/join capture of allocations, kernels, a memset and frees on two streams, captured on
/// `s1`: on an owned stream the crate matches the nodes to its calls by the order in which the
/// driver lists them; on a borrowed one it asks the driver for each call's node.
fn fork_join_workload<S: AsStream>(
    g: &safe_common::Gpu,
    s1: &S,
    s2: &Stream,
    out: &DeviceBuffer<u32>,
) -> cuda_graph::Graph {
    let cfg = config(N);
    let (graph, ()) = capture(s1, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        let b = cap.malloc_async(BYTES)?;
        cap.memset_async(&b, 7u32, N as usize)?;
        // SAFETY: (each launch) iota_u32(u32*, u64, u32), copy_u32(u32*, const u32*, u64) or
        // add_u32(u32*, u64, u32) over the N values of `a`, `b` and `out`.
        unsafe {
            cap.launch(
                &g.k.iota,
                cfg,
                &KernelArgs::new().ptr(&a).value(N).value(1u32),
            )?
        };
        cap.fork(s2)?;
        // SAFETY: as above.
        unsafe {
            cap.launch_on(
                s2,
                &g.k.add,
                cfg,
                &KernelArgs::new().ptr(&b).value(N).value(2u32),
            )?
        };
        // SAFETY: as above.
        unsafe {
            cap.launch(
                &g.k.add,
                cfg,
                &KernelArgs::new().ptr(&a).value(N).value(3u32),
            )?
        };
        // SAFETY: as above.
        unsafe {
            cap.launch_on(
                s2,
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(out).ptr(&b).value(N),
            )?
        };
        cap.free_async_on(s2, &b)?;
        cap.join(s2)?;
        // SAFETY: as above.
        unsafe {
            cap.launch(
                &g.k.add,
                cfg,
                &KernelArgs::new().ptr(out).value(N).value(0u32),
            )?
        };
        cap.free_async(&a)?;
        Ok(())
    })
    .unwrap();
    graph
}

/// A node as its kind, its dependencies (sorted) and its (role, key) pairs.
type NodeShape = (String, Vec<u32>, Vec<(MemRole, usize)>);

/// Each node of a record as a [`NodeShape`].
fn shape(graph: &cuda_graph::Graph) -> Vec<NodeShape> {
    graph
        .nodes()
        .iter()
        .map(|n| {
            let mut deps = n.deps().to_vec();
            deps.sort_unstable();
            let refs = n.refs().iter().map(|&(r, k)| (r, k.0)).collect();
            (n.kind().to_string(), deps, refs)
        })
        .collect()
}

/// The driver lists a captured graph's nodes in the order captured, which is what lets a
/// capture on an owned stream match nodes to calls without asking the driver after each call:
/// the same fork/join workload read both ways (by order on the owned stream; by each call's
/// node, in the driver's order, on a borrowed one) gives the same record, node for node, which
/// passes the check, launches and computes the right values.
#[test]
#[ignore = "needs a GPU"]
fn nodes_matched_by_order_agree_with_nodes_asked_for() {
    let Some(g) = gpu("nodes_matched_by_order_agree_with_nodes_asked_for") else {
        return;
    };
    let device = &g.device;
    let (s1, s2) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let by_order = fork_join_workload(&g, &s1, &s2, &out);
    let asked = fork_join_workload(&g, &s1.borrow(), &s2, &out);
    assert_eq!(by_order.nodes().len(), 10);
    assert_eq!(shape(&by_order), shape(&asked));
    for graph in [by_order, asked] {
        graph.check().unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        s1.memset_async(&out, 0u32, N as usize).unwrap();
        exec.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        // out = b + 2 = 9 (the last add adds 0).
        assert_all(&out.to_vec().unwrap(), 9, "out after the fork/join graph");
    }
}

/// Work other code queues through the raw handle of a capturing owned stream makes a node the
/// crate did not capture: the capture says so (the graph cannot be checked) and leaves the
/// stream usable. From the fork of a borrowed stream on, each call asks for its node, and other
/// code may add nodes there: they are read from the driver.
#[test]
#[ignore = "needs a GPU"]
fn other_code_in_a_capture_is_refused_on_owned_streams_and_read_on_borrowed_ones() {
    let Some(g) =
        gpu("other_code_in_a_capture_is_refused_on_owned_streams_and_read_on_borrowed_ones")
    else {
        return;
    };
    let device = &g.device;
    let (s1, s2) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);
    // fill_u32(out, N, 4) through cuLaunchKernel on `stream`.
    let raw_fill = |stream: cuda_graph::sys::CUstream| {
        let (mut p, mut n, mut v) = (cuda_graph::Handle::as_raw(&out), N, 4u32);
        let mut args: [*mut std::ffi::c_void; 3] = [
            (&raw mut p).cast(),
            (&raw mut n).cast(),
            (&raw mut v).cast(),
        ];
        // SAFETY: fill_u32's three arguments; `out` holds N values and outlives the graphs.
        let r = unsafe {
            cuda_graph::sys::cuLaunchKernel(
                g.k.fill.as_raw(),
                cfg.grid.0,
                1,
                1,
                cfg.block.0,
                1,
                1,
                0,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, cuda_graph::sys::CUresult::CUDA_SUCCESS);
    };
    let refused = capture(&s1, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        raw_fill(s1.as_raw());
        cap.free_async(&a)
    });
    assert!(
        matches!(
            refused,
            Err(Error::CaptureNotMatched {
                call: "Capture::end",
                captured: 2,
                found: 3
            })
        ),
        "{refused:?}"
    );
    assert_eq!(s1.capture_status().unwrap(), CaptureStatus::None);

    let borrowed = s2.borrow();
    let (graph, ()) = capture(&s1, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        cap.fork(&borrowed)?;
        raw_fill(s2.as_raw());
        // SAFETY: copy_u32(u32*, const u32*, u64) over the N values of `a` and `out`.
        unsafe {
            cap.launch_on(
                &borrowed,
                &g.k.copy,
                cfg,
                &KernelArgs::new().ptr(&a).ptr(&out).value(N),
            )?
        };
        cap.join(&borrowed)?;
        cap.free_async(&a)
    })
    .unwrap();
    let kinds: Vec<String> = graph.nodes().iter().map(|n| n.kind().to_string()).collect();
    assert_eq!(
        kinds,
        [
            "alloc node",
            "kernel captured",
            "kernel copy_u32",
            "free node"
        ]
    );
    let copy = &graph.nodes()[2];
    assert!(
        matches!(copy.refs(), [(MemRole::Use, _)]),
        "the copy uses the capture's allocation: {:?}",
        copy.refs()
    );
    assert_eq!(
        copy.deps(),
        [1],
        "the copy follows the raw fill on the forked stream"
    );
    graph.check().unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s1).unwrap();
    s1.synchronize().unwrap();
    assert_all(&out.to_vec().unwrap(), 4, "out after the raw fill");
}
