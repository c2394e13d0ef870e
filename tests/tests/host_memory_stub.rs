//! Pinned host memory in graphs and stream copies (`PinnedBuffer`, `Graph::add_memcpy_node_htod`
//! and `_dtoh`, `StreamMemOps::memcpy_htod_async` and `_dtoh_async`, `Capture::memcpy_htod_async`
//! and `_dtoh_async`), against the checking stub driver (`stub-driver/hunt_cuda.c`), each test
//! in a child process of its own, as in `hunt_stub.rs` and `attack_new.rs`.
//!
//! The stub registers `cuMemHostAlloc` memory and reports a copy that touches it after
//! `cuMemFreeHost` (which, in the stub, waits for nothing); a device-to-host copy writes
//! `0xD2` into every byte it copies when it runs, and a host-to-device copy keeps the first
//! bytes it read (`hunt_last_host_read`), so that a test sees whether the host looked at, or
//! wrote, the memory before or after the GPU did. `HUNT_DELAY_US` makes each work item of the
//! stub's GPU thread run that much later.
//!
//! | test | shows | fails without |
//! |---|---|---|
//! | `memcpy_nodes_keep_their_dropped_pinned_buffers` | a node's pinned source or destination dropped before instantiate and launch is still allocated when the node runs, and freed after | the graph's keep of the pinned memory |
//! | `stream_copy_keeps_its_dropped_pinned_buffer_until_it_ran` | a pinned buffer dropped right after a stream copy is freed after the copy, not before | the free's wait for the copy's event |
//! | `views_wait_for_queued_copies_and_launches` | a view taken while a copy or a launch that writes or reads the buffer is queued shows the copy's data, and the copy read the old data | the view's wait |
//! | `views_racing_gpu_work_wait_for_it` | a view taken while another thread is inside the driver call that queues a copy or a launch on the buffer waits for it | the buffer's lock held from the check to the record |
//! | `gpu_work_is_refused_while_a_view_lives` | stream copies and launches that use a buffer a view holds are `InUseByHost`, nothing queued | the refusal |
//! | `captured_copies_keep_their_pinned_buffers` | copies captured through the guard, or through `StreamMemOps` on a capturing stream, keep their pinned buffers | the capture's keep |
//! | `view_during_a_global_capture_waits_without_synchronizing` | a view taken while a `Global` capture runs waits by polling, not with a synchronizing call the capture forbids | the polling path |
//! | `pinned_buffer_dropped_during_a_global_capture_is_freed_after_it` | the free is put off until the capture ends | the deferred release |
//! | `sizes_and_bounds_are_typed_errors_naming_the_call` | overflowing sizes, empty and out-of-bounds copies are `InvalidArgument` naming the call | |
//! | `memcpy_node_of_a_graph_allocation_is_a_checked_use` | a host copy node of a graph allocation is a use the lifetime checks see | |
//! | `view_in_a_host_function_is_refused` | a host node's function cannot wait for its own launch | |
#![cfg(cuda_graph_tests_hunt_stub)]

mod hunt_common;

use hunt_common::{
    SLOW, hunt_errors, is_in_use_by_host, is_invalid, isolated, settle, stall, stub_symbol,
};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_graph::{
    AllocParams, AsStream, Capture, CaptureMode, Device, DeviceBuffer, Error, Graph,
    InstantiateFlags, PinnedBuffer, Stream, StreamMemOps, capture, flush_deferred,
};

const WORDS: usize = 1 << 10;
const BYTES: usize = WORDS * 4;
/// A word of a device-to-host copy, as the stub writes it.
const D2H_WORD: u32 = 0xD2D2_D2D2;

/// The number of live `cuMemHostAlloc` allocations.
fn host_live() -> i32 {
    // SAFETY: the stub's `int hunt_host_live(void)`.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(stub_symbol(c"hunt_host_live")) };
    f()
}

/// The first 8 bytes that the last host-to-device copy read when it ran.
fn last_host_read() -> u64 {
    // SAFETY: the stub's `unsigned long long hunt_last_host_read(void)`.
    let f: extern "C" fn() -> u64 =
        unsafe { std::mem::transmute(stub_symbol(c"hunt_last_host_read")) };
    f()
}

// ------------------------------------------------------------------ ownership

/// A graph with an H2D node from a pinned buffer and a D2H node into another, both buffers
/// dropped before instantiate: the stub sees both allocated when the launch runs, and both are
/// freed once the executable graph is gone.
fn nodes_keep_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let src = PinnedBuffer::from_slice(&d, &[7u32; WORDS]).unwrap();
    let dst = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    let h2d = graph.add_memcpy_node_htod(&[], &dev, &src, BYTES).unwrap();
    graph
        .add_memcpy_node_dtoh(&[h2d], &dst, &dev, BYTES)
        .unwrap();
    drop((src, dst));
    flush_deferred();
    assert_eq!(host_live(), 2, "the graph holds both pinned buffers");
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);
    for _ in 0..2 {
        exec.launch(&s).unwrap();
    }
    drop(exec);
    flush_deferred();
    assert_eq!(host_live(), 2, "the queued launches still hold them");
    s.synchronize().unwrap();
    settle(
        "both pinned buffers are freed after the last launch",
        || host_live() == 0,
    );
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn memcpy_nodes_keep_their_dropped_pinned_buffers() {
    isolated(
        "memcpy_nodes_keep_their_dropped_pinned_buffers",
        SLOW,
        nodes_keep_body,
    );
}

/// A pinned buffer dropped right after a stream copy into it, and another right after a copy
/// out of it: `cuMemFreeHost` (which in the stub does not wait) is put off until each copy ran.
fn stream_copy_keep_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let into = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    s.memcpy_dtoh_async(&into, &dev, BYTES).unwrap();
    drop(into);
    let from = PinnedBuffer::from_slice(&d, &[3u32; WORDS]).unwrap();
    s.memcpy_htod_async(&dev, &from, BYTES).unwrap();
    drop(from);
    flush_deferred();
    assert_eq!(host_live(), 2, "freed only after the copies ran");
    s.synchronize().unwrap();
    settle("both pinned buffers are freed after their copies", || {
        host_live() == 0
    });
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn stream_copy_keeps_its_dropped_pinned_buffer_until_it_ran() {
    isolated(
        "stream_copy_keeps_its_dropped_pinned_buffer_until_it_ran",
        SLOW,
        stream_copy_keep_body,
    );
}

/// Copies captured into a graph through the guard (`Capture::memcpy_htod_async`,
/// `memcpy_dtoh_async`) and through `StreamMemOps` on the capturing stream; every pinned buffer
/// is dropped before the graph is instantiated and launched.
fn captured_keep_body() {
    let d = Device::get(0).unwrap();
    let (s, other) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let src = PinnedBuffer::from_slice(&d, &[5u32; WORDS]).unwrap();
    let dst = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let src2 = PinnedBuffer::from_slice(&d, &[6u32; WORDS]).unwrap();
    let dst2 = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let (graph, ()) = capture(&s, CaptureMode::Global, |cap| {
        cap.memcpy_htod_async(&dev, &src, BYTES)?;
        cap.memcpy_dtoh_async(&dst, &dev, BYTES)?;
        s.memcpy_htod_async(&dev, &src2, BYTES)?;
        s.memcpy_dtoh_async(&dst2, &dev, BYTES)
    })
    .unwrap();
    assert_eq!(graph.nodes().len(), 4, "{:?}", graph.nodes());
    drop((src, dst, src2, dst2));
    flush_deferred();
    assert_eq!(
        host_live(),
        4,
        "the captured graph holds the pinned buffers"
    );
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);
    exec.launch(&other).unwrap();
    drop(exec);
    other.synchronize().unwrap();
    settle("the pinned buffers are freed after the launch", || {
        host_live() == 0
    });
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn captured_copies_keep_their_pinned_buffers() {
    isolated(
        "captured_copies_keep_their_pinned_buffers",
        SLOW,
        captured_keep_body,
    );
}

// ------------------------------------------------------------------ host access

/// Views taken while GPU work on the buffer is queued wait for it: a stream copy into the
/// buffer, a graph launch that copies into it (the view shows the stub's 0xD2 bytes, not the
/// zeros from before), and a stream copy out of a buffer that the host then overwrites (the
/// copy read the old values).
fn views_wait_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();

    let out = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    assert!(out.is_idle().unwrap());
    s.memcpy_dtoh_async(&out, &dev, BYTES).unwrap();
    assert!(!out.is_idle().unwrap(), "the copy is still queued");
    {
        let view = out.as_slice().unwrap();
        assert!(
            view.iter().all(|&x| x == D2H_WORD),
            "a stream copy into the buffer: the view sees {:#x}",
            view[0]
        );
    }
    assert!(out.is_idle().unwrap());

    let mut graph = Graph::new(&d).unwrap();
    graph.add_memcpy_node_dtoh(&[], &out, &dev, BYTES).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let mut out = out;
    out.copy_from_slice(&[0; WORDS]).unwrap();
    exec.launch(&s).unwrap();
    assert!(!out.is_idle().unwrap(), "the launch is still queued");
    assert!(
        out.to_vec().unwrap().iter().all(|&x| x == D2H_WORD),
        "a launch that copies into the buffer"
    );

    let mut input = PinnedBuffer::from_slice(&d, &[1u32; WORDS]).unwrap();
    s.memcpy_htod_async(&dev, &input, BYTES).unwrap();
    input.as_mut_slice().unwrap().fill(2);
    assert_eq!(
        last_host_read(),
        0x0000_0001_0000_0001,
        "the copy out of the buffer read the values from before the view"
    );
    s.synchronize().unwrap();
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn views_wait_for_queued_copies_and_launches() {
    isolated(
        "views_wait_for_queued_copies_and_launches",
        SLOW,
        views_wait_body,
    );
}

/// While a view of a pinned buffer lives, stream copies into and out of it, and launches of a
/// graph that copies into it, are refused before anything is queued; once it is dropped they
/// run. A forgotten view goes on refusing (the buffer is then never used by the GPU again).
fn refused_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let mut buf = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    graph.add_memcpy_node_dtoh(&[], &buf, &dev, BYTES).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    {
        let view = buf.as_slice().unwrap();
        let e = s.memcpy_dtoh_async(&buf, &dev, BYTES).unwrap_err();
        assert!(
            is_in_use_by_host(&e, "StreamMemOps::memcpy_dtoh_async"),
            "{e}"
        );
        let e = s.memcpy_htod_async(&dev, &buf, BYTES).unwrap_err();
        assert!(
            is_in_use_by_host(&e, "StreamMemOps::memcpy_htod_async"),
            "{e}"
        );
        let e = exec.launch(&s).unwrap_err();
        assert!(is_in_use_by_host(&e, "ExecGraph::launch"), "{e}");
        assert_eq!(
            view[0], 0,
            "nothing was queued: the view's values are unchanged"
        );
    }
    {
        let mut view = buf.as_mut_slice().unwrap();
        view[0] = 9;
        let e = exec.launch(&s).unwrap_err();
        assert!(is_in_use_by_host(&e, "ExecGraph::launch"), "{e}");
    }
    s.synchronize().unwrap();
    assert_eq!(buf.as_slice().unwrap()[0], 9, "nothing was queued");
    exec.launch(&s).unwrap();
    s.memcpy_htod_async(&dev, &buf, BYTES).unwrap();
    assert!(buf.as_slice().unwrap().iter().all(|&x| x == D2H_WORD));

    std::mem::forget(buf.as_slice().unwrap());
    let e = exec.launch(&s).unwrap_err();
    assert!(is_in_use_by_host(&e, "ExecGraph::launch"), "{e}");
    s.synchronize().unwrap();
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn gpu_work_is_refused_while_a_view_lives() {
    isolated("gpu_work_is_refused_while_a_view_lives", SLOW, refused_body);
}

/// A view taken while another thread is inside the driver call that queues GPU work on the
/// buffer (preempted there: the stub stalls it 300 ms on entry), after the crate's check that
/// no view is alive: the view waits for that work too, since the check, the call and the record
/// of the use are made under the buffer's lock. For a stream copy into the buffer and for a
/// launch of a graph that copies into it.
fn views_racing_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let out = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            stall(c"cuMemcpyDtoHAsync", 300);
            s.memcpy_dtoh_async(&out, &dev, BYTES)
        });
        std::thread::sleep(Duration::from_millis(100));
        let view = out.as_slice().unwrap();
        assert!(
            view.iter().all(|&x| x == D2H_WORD),
            "a view racing a stream copy: {:#x}",
            view[0]
        );
        drop(view);
        worker.join().unwrap().unwrap();
    });

    let mut out = out;
    out.copy_from_slice(&[0; WORDS]).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    graph.add_memcpy_node_dtoh(&[], &out, &dev, BYTES).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let exec = std::thread::scope(|scope| {
        let s = &s;
        let worker = scope.spawn(move || {
            stall(c"cuGraphLaunch", 300);
            exec.launch(s).map(|()| exec)
        });
        std::thread::sleep(Duration::from_millis(100));
        let view = out.as_slice().unwrap();
        assert!(
            view.iter().all(|&x| x == D2H_WORD),
            "a view racing a launch: {:#x}",
            view[0]
        );
        drop(view);
        worker.join().unwrap().unwrap()
    });
    s.synchronize().unwrap();
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn views_racing_gpu_work_wait_for_it() {
    isolated("views_racing_gpu_work_wait_for_it", &[], views_racing_body);
}

/// A view taken on a thread whose `Global` capture is active, while a copy into the buffer is
/// queued on another stream: `cuEventSynchronize` is forbidden there (the stub reports and
/// refuses it under `HUNT_GLOBAL_CAPTURE`), so the view polls the copy's event, and shows the
/// copied data; the capture is undisturbed.
fn view_in_global_capture_body() {
    let d = Device::get(0).unwrap();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let out = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    s2.memcpy_dtoh_async(&out, &dev, BYTES).unwrap();
    let cap = Capture::begin(&s1, CaptureMode::Global).unwrap();
    let seen = out.to_vec().unwrap();
    let graph = cap.end().unwrap();
    assert!(seen.iter().all(|&x| x == D2H_WORD), "{:#x}", seen[0]);
    drop(graph);
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn view_during_a_global_capture_waits_without_synchronizing() {
    isolated(
        "view_during_a_global_capture_waits_without_synchronizing",
        &[
            ("HUNT_DELAY_US", "100000"),
            ("HUNT_DELAY_FIXED", "1"),
            ("HUNT_GLOBAL_CAPTURE", "1"),
        ],
        view_in_global_capture_body,
    );
}

/// A pinned buffer dropped while another thread's `Global` capture is active: `cuMemFreeHost`,
/// which such a capture forbids, waits for the capture to end.
fn dropped_in_global_capture_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let buf = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let (began, begun) = std::sync::mpsc::channel();
    let (end, ending) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let s = &s;
        scope.spawn(move || {
            let cap = Capture::begin(s, CaptureMode::Global).unwrap();
            began.send(()).unwrap();
            ending.recv().unwrap();
            drop(cap.end().unwrap());
        });
        begun.recv().unwrap();
        drop(buf);
        flush_deferred();
        assert_eq!(host_live(), 1, "not freed during the capture");
        end.send(()).unwrap();
    });
    settle("freed once the capture ended", || host_live() == 0);
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn pinned_buffer_dropped_during_a_global_capture_is_freed_after_it() {
    isolated(
        "pinned_buffer_dropped_during_a_global_capture_is_freed_after_it",
        &[("HUNT_GLOBAL_CAPTURE", "1")],
        dropped_in_global_capture_body,
    );
}

/// A host node's function that takes a view of a buffer its own graph copies into: refused
/// (`InHostFunction`), since the view would wait for the launch that runs the function.
fn host_function_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let buf = Arc::new(PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap());
    let result = Arc::new(Mutex::new(None));
    let mut graph = Graph::new(&d).unwrap();
    let copy = graph.add_memcpy_node_dtoh(&[], &buf, &dev, BYTES).unwrap();
    let (b, r) = (buf.clone(), result.clone());
    graph
        .add_host_node(&[copy], move || {
            *r.lock().unwrap() = Some(b.as_slice().map(|v| v[0]));
        })
        .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    let got = result
        .lock()
        .unwrap()
        .take()
        .expect("the host function ran");
    assert!(
        matches!(&got, Err(Error::InHostFunction { call }) if *call == "PinnedBuffer::as_slice"),
        "{got:?}"
    );
    assert_eq!(buf.as_slice().unwrap()[0], D2H_WORD);
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn view_in_a_host_function_is_refused() {
    isolated(
        "view_in_a_host_function_is_refused",
        &[],
        host_function_body,
    );
}

// ------------------------------------------------------------------ sizes and records

/// Sizes that overflow, empty copies and copies past either end are refused before the driver,
/// as `InvalidArgument` naming the call; none breaks a capture it is made in.
fn sizes_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    for e in [
        PinnedBuffer::<u64>::zeroed(&d, usize::MAX / 4).unwrap_err(),
        PinnedBuffer::<u32>::zeroed(&d, 0).unwrap_err(),
        PinnedBuffer::<()>::zeroed(&d, 5).unwrap_err(),
        PinnedBuffer::<u32>::from_slice(&d, &[]).unwrap_err(),
    ] {
        assert!(is_invalid(&e, "PinnedBuffer::zeroed"), "{e}");
    }
    let mut small = PinnedBuffer::<u32>::zeroed(&d, WORDS / 2).unwrap();
    let big = PinnedBuffer::<u32>::zeroed(&d, WORDS * 2).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let e = small.copy_from_slice(&[1; WORDS]).unwrap_err();
    assert!(is_invalid(&e, "PinnedBuffer::copy_from_slice"), "{e}");

    // (bytes, pinned side): past the pinned buffer, past the device memory, empty, usize::MAX.
    let cases: [(usize, &PinnedBuffer<u32>); 4] = [
        (BYTES, &small),
        (BYTES + 4, &big),
        (0, &big),
        (usize::MAX, &big),
    ];
    let mut graph = Graph::new(&d).unwrap();
    for (bytes, host) in cases {
        let e = graph
            .add_memcpy_node_htod(&[], &dev, host, bytes)
            .unwrap_err();
        assert!(is_invalid(&e, "cuGraphAddMemcpyNode"), "{e}");
        let e = graph
            .add_memcpy_node_dtoh(&[], host, &dev, bytes)
            .unwrap_err();
        assert!(is_invalid(&e, "cuGraphAddMemcpyNode"), "{e}");
        let e = s.memcpy_htod_async(&dev, host, bytes).unwrap_err();
        assert!(is_invalid(&e, "StreamMemOps::memcpy_htod_async"), "{e}");
        let e = s.memcpy_dtoh_async(host, &dev, bytes).unwrap_err();
        assert!(is_invalid(&e, "StreamMemOps::memcpy_dtoh_async"), "{e}");
    }
    assert!(graph.nodes().is_empty(), "no node was added");
    let (captured, ()) = capture(&s, CaptureMode::Global, |cap| {
        for (bytes, host) in cases {
            let e = cap.memcpy_htod_async(&dev, host, bytes).unwrap_err();
            assert!(is_invalid(&e, "Capture::memcpy_htod_async"), "{e}");
            let e = cap.memcpy_dtoh_async(host, &dev, bytes).unwrap_err();
            assert!(is_invalid(&e, "Capture::memcpy_dtoh_async"), "{e}");
        }
        cap.memcpy_htod_async(&dev, &big, BYTES)
    })
    .unwrap();
    assert_eq!(captured.nodes().len(), 1, "the capture still works");
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn sizes_and_bounds_are_typed_errors_naming_the_call() {
    isolated(
        "sizes_and_bounds_are_typed_errors_naming_the_call",
        &[],
        sizes_body,
    );
}

/// A memcpy node between a graph allocation and pinned memory records its use: a node not
/// ordered after the alloc node, or one after the free node, is refused at instantiation and
/// named; the ordered graph instantiates and launches with the stub seeing no misuse.
fn graph_allocation_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let input = PinnedBuffer::from_slice(&d, &[4u32; WORDS]).unwrap();
    let output = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();

    let mut graph = Graph::new(&d).unwrap();
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES).label("a"))
        .unwrap();
    let h2d = graph
        .add_memcpy_node_htod(&[alloc], &a, &input, BYTES)
        .unwrap();
    let d2h = graph
        .add_memcpy_node_dtoh(&[h2d], &output, &a, BYTES)
        .unwrap();
    for node in [h2d, d2h] {
        assert!(
            graph
                .record()
                .allocations_of(graph.node(node).unwrap(), cuda_graph::MemRole::Use)
                .any(|u| u.same(&a)),
            "the node records its use of the allocation"
        );
    }
    graph.add_mem_free_node(&[d2h], &a).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s).unwrap();
    assert!(output.as_slice().unwrap().iter().all(|&x| x == D2H_WORD));
    drop((exec, graph));

    // Not ordered after the alloc node.
    let mut graph = Graph::new(&d).unwrap();
    let (_, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
        .unwrap();
    let stray = graph.add_memcpy_node_dtoh(&[], &output, &a, BYTES).unwrap();
    graph.set_label(stray, "stray copy").unwrap();
    let e = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    assert!(matches!(e, Error::Lifetime(_)), "{e}");
    assert!(e.to_string().contains("stray copy"), "{e}");

    // After the free node.
    let mut graph = Graph::new(&d).unwrap();
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
        .unwrap();
    let free = graph.add_mem_free_node(&[alloc], &a).unwrap();
    let late = graph
        .add_memcpy_node_htod(&[free], &a, &input, BYTES)
        .unwrap();
    graph.set_label(late, "late copy").unwrap();
    let e = graph.instantiate(InstantiateFlags::NONE).unwrap_err();
    assert!(e.to_string().contains("late copy"), "{e}");
    s.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn memcpy_node_of_a_graph_allocation_is_a_checked_use() {
    isolated(
        "memcpy_node_of_a_graph_allocation_is_a_checked_use",
        &[],
        graph_allocation_body,
    );
}
