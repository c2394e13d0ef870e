//! The crate's releases, checked without a GPU against the context-tracking variant of
//! `stub-driver/null_cuda.c` (`context_common`: the current context kept per thread, a switch
//! that makes `cuCtxSetCurrent` fail, one that makes `cuEventQuery`/`cuStreamQuery` report work
//! in flight, and a log of the driver calls with whether a context was current):
//!
//! 1. a release whose device context cannot be made current makes none of its frees and
//!    destroys with no context current; buffers whose release binds for itself keep their
//!    memory;
//! 2. a pinned buffer is not freed while GPU work that uses it is in flight, and is freed once,
//!    with the context current, when it is done;
//! 3. values dropped on another thread while a global capture is open release nothing until it
//!    ends; then they are released, with the context current;
//! 4. no user `Drop` (a host closure's captured value) runs while the crate holds its capture
//!    gate: a `Drop` that waits for another thread's `Capture::begin` does not deadlock;
//! 5. odd sizes (`usize::MAX`, products that overflow, a stream allocation of 0 bytes) are
//!    refused with errors;
//! 6. a stream allocation dropped while its stream is forked into a capture is freed once, after
//!    the capture has ended, not into the captured graph;
//! 7. a user `Drop` that panics in a release is recorded as a drop error, and an executable
//!    graph keeps its host closure and its kernel's buffer until its launch is done, whatever
//!    the order they are dropped in;
//! 8. a release whose bind keeps failing records a few drop errors, not one per poll of its
//!    launch, and is retried once the bind works again.
//!
//! Each test runs in a child process of its own (the stub captures one stream at a time, and
//! some tests leave the release queue stuck on purpose), under a watchdog.

#![allow(clippy::undocumented_unsafe_blocks, clippy::missing_panics_doc)]

mod context_common;

use std::time::Duration;

use context_common::{
    BYTES, Call, N, add_fill_node, fail_bind, not_ready, on_fresh, stub, take_log,
};
use cuda_graph::{
    AsStream, CaptureMode, Device, DeviceBuffer, Event, Function, Graph, InstantiateFlags,
    PinnedBuffer, Stream, StreamAllocation, StreamMemOps, flush_deferred,
};

/// How many calls of `name` the log holds.
fn count(log: &[Call], name: &str) -> usize {
    log.iter().filter(|c| c.name == name).count()
}

/// The calls of `names` the log holds that were made with no context current.
fn unbound<'a>(log: &'a [Call], names: &[&str]) -> Vec<&'a Call> {
    log.iter()
        .filter(|c| !c.ctx && names.contains(&c.name.as_str()))
        .collect()
}

/// Asserts that the device has recorded no drop error.
#[track_caller]
fn assert_no_drop_errors(device: &Device) {
    let errors = device.drop_errors();
    assert_eq!(errors.count, 0, "{errors:?}");
}

/// Lets the crate's release thread look at the queue.
fn settle() {
    std::thread::sleep(Duration::from_millis(60));
}

/// Runs the test `name`'s `body` in a child process against the stub, and prints the child's
/// output.
fn isolated(name: &str, body: fn()) {
    context_common::isolated(name, body, |line| Some(line));
}

/// A test that runs its body in a child process of its own ([`isolated`]).
macro_rules! isolated_test {
    ($name:ident, $body:ident) => {
        #[test]
        fn $name() {
            isolated(stringify!($name), $body);
        }
    };
}

/// Frees and destroys: what a release job does.
const RELEASE_CALLS: &[&str] = &[
    "cuMemFreeAsync",
    "cuMemFree_v2",
    "cuMemFreeHost",
    "cuEventDestroy_v2",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuStreamDestroy_v2",
    "cuMemPoolDestroy",
    "cuModuleUnload",
    "cuStreamWaitEvent",
    "cuEventQuery",
];

/// A graph of one kernel node over `buffer`, instantiated.
fn exec_over(
    device: &Device,
    fill: &Function,
    buffer: &DeviceBuffer<u32>,
) -> cuda_graph::ExecGraph {
    let mut g = Graph::new(device).unwrap();
    add_fill_node(&mut g, &[], fill, buffer, 1);
    g.instantiate(InstantiateFlags::NONE).unwrap()
}

// ------------------------------------------------------------------ 1. a bind that fails

/// While the device's context cannot be made current, the releases of an event, a stream
/// allocation (freed on the reaper stream), a launched executable graph and its buffer, a device
/// buffer and a pinned buffer, each dropped on a fresh thread, make none of their frees,
/// destroys and launch polls (`RELEASE_CALLS`) with no context current; the device buffer and
/// the pinned buffer keep their memory (no `cuMemFree`, no `cuMemFreeHost`).
fn bind_failure_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    // The reaper stream exists from here on: a stream allocation held by a graph is freed by
    // the graph's drop, on the reaper stream.
    {
        let sa = StreamAllocation::new(&stream, BYTES).unwrap();
        let mut g = Graph::new(&device).unwrap();
        add_fill_node(&mut g, &[], &fill, &sa, 1);
        drop(sa);
        drop(g);
        flush_deferred();
    }
    let _ = device.take_drop_errors();

    let event = Event::new(&device).unwrap();
    let sa = StreamAllocation::new(&stream, BYTES).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let exec = exec_over(&device, &fill, &buffer);
    exec.launch(&cuda_graph::BorrowedStream::legacy(&device))
        .unwrap();
    let kept_buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    flush_deferred();
    let _ = take_log();

    fail_bind(true);
    let mut report = Vec::new();
    let mut bad = Vec::new();
    let mut step = |label: &str, f: &mut (dyn FnMut() + Send)| {
        on_fresh(f);
        settle();
        let log = take_log();
        let unb: Vec<String> = unbound(&log, RELEASE_CALLS)
            .iter()
            .map(|c| format!("{}@{}", c.name, c.thread))
            .collect();
        report.push(format!("{label}: made without context: {unb:?}"));
        if !unb.is_empty() {
            bad.push(format!("{label}: {unb:?}"));
        }
        log
    };
    let mut event = Some(event);
    step("drop Event on a fresh thread", &mut || drop(event.take()));
    let mut sa = Some(sa);
    step("drop StreamAllocation on a fresh thread", &mut || {
        drop(sa.take())
    });
    let mut exec = Some(exec);
    let mut buffer = Some(buffer);
    step(
        "drop ExecGraph (launched) and its buffer on a fresh thread",
        &mut || {
            drop(exec.take());
            drop(buffer.take());
        },
    );
    let mut kept_buffer = Some(kept_buffer);
    let log_buffer = step("drop DeviceBuffer on a fresh thread", &mut || {
        drop(kept_buffer.take())
    });
    let mut pinned = Some(pinned);
    let log_pinned = step("drop PinnedBuffer on a fresh thread", &mut || {
        drop(pinned.take())
    });
    let errors = device.drop_errors();
    fail_bind(false);
    for line in &report {
        println!("{line}");
    }
    println!(
        "drop errors recorded: {} (last: {:?})",
        errors.count, errors.last
    );
    // The buffers' releases bind for themselves, and keep the memory they cannot free.
    assert_eq!(
        count(&log_buffer, "cuMemFree_v2"),
        0,
        "cuMemFree made though the bind failed"
    );
    assert_eq!(
        count(&log_pinned, "cuMemFreeHost"),
        0,
        "cuMemFreeHost made though the bind failed"
    );
    assert!(
        bad.is_empty(),
        "release jobs ran driver calls where the bind had failed (no context current):\n{}",
        bad.join("\n")
    );
}

isolated_test!(
    failed_bind_release_makes_no_unbound_driver_calls,
    bind_failure_body
);

// ------------------------------------------------------------------ 2. host memory release

/// A pinned buffer that a stream copy uses is not freed while the copy's event reports work in
/// flight, though dropped on a thread where no context is current; it is freed once (with the
/// context current) when the work is done.
fn host_release_waits_body() {
    let (device, _module, _fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    stream.memcpy_dtoh_async(&pinned, &buffer, BYTES).unwrap();
    not_ready(true);
    assert!(!on_fresh(|| pinned.is_idle().unwrap()));
    let _ = take_log();
    on_fresh(move || drop(pinned));
    settle();
    flush_deferred();
    let log = take_log();
    assert_eq!(
        count(&log, "cuMemFreeHost"),
        0,
        "freed while its GPU use is in flight"
    );
    not_ready(false);
    flush_deferred();
    settle();
    let log = take_log();
    assert_eq!(
        count(&log, "cuMemFreeHost"),
        1,
        "freed once the GPU is done"
    );
    let unb = unbound(&log, RELEASE_CALLS);
    assert!(unb.is_empty(), "{unb:?}");
    assert_no_drop_errors(&device);
}

isolated_test!(host_release_waits_for_gpu_use, host_release_waits_body);

// ------------------------------------------------------------------ 3. releases inside a capture

/// While a global capture is open, an event, a device buffer, a pinned buffer, a launched
/// executable graph and a stream allocation dropped on another thread release nothing; once it
/// ends, the executable graph and the three allocations are released once each, with the
/// context current.
fn capture_puts_off_releases_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let capturing = Stream::new(&device).unwrap();
    let event = Event::new(&device).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let exec = exec_over(&device, &fill, &buffer);
    exec.launch(&stream).unwrap();
    let sa = StreamAllocation::new(&stream, BYTES).unwrap();
    flush_deferred();
    let guard = cuda_graph::Capture::begin(&capturing, CaptureMode::Global).unwrap();
    let _ = take_log();
    std::thread::scope(|s| {
        s.spawn(move || {
            drop(event);
            drop(exec);
            drop(buffer);
            drop(pinned);
            drop(sa);
        });
    });
    settle();
    let during = take_log();
    let released: Vec<&Call> = during
        .iter()
        .filter(|c| {
            [
                "cuEventDestroy_v2",
                "cuGraphExecDestroy",
                "cuMemFree_v2",
                "cuMemFreeHost",
                "cuMemFreeAsync",
            ]
            .contains(&c.name.as_str())
        })
        .collect();
    assert!(
        released.is_empty(),
        "released during a global capture: {released:?}"
    );
    let graph = guard.end().unwrap();
    drop(graph);
    flush_deferred();
    settle();
    let after = take_log();
    for name in [
        "cuGraphExecDestroy",
        "cuMemFree_v2",
        "cuMemFreeHost",
        "cuMemFreeAsync",
    ] {
        assert_eq!(
            count(&after, name),
            1,
            "{name} after the capture: {after:?}"
        );
    }
    let unb = unbound(&after, RELEASE_CALLS);
    assert!(unb.is_empty(), "{unb:?}");
    assert_no_drop_errors(&device);
}

isolated_test!(capture_puts_off_releases, capture_puts_off_releases_body);

// ------------------------------------------------------------------ 4. a lock across user code

/// A value a host closure holds, whose `Drop` waits (at most 5 s) for a worker thread that
/// begins and ends a capture on a stream of its own: what a pool of capture workers does when
/// its last handle drops.
struct JoinsCaptureWorker {
    device: Device,
    began: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for JoinsCaptureWorker {
    fn drop(&mut self) {
        let device = self.device.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let stream = Stream::new(&device).unwrap();
            let began = cuda_graph::Capture::begin(&stream, CaptureMode::Relaxed);
            let ok = began.is_ok();
            if let Ok(guard) = began {
                let _ = guard.end();
            }
            let _ = tx.send(ok);
        });
        if let Ok(true) = rx.recv_timeout(Duration::from_secs(5)) {
            self.began.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A graph's release drops its host closures (and what they captured) without holding the
/// capture gate: a user `Drop` there that waits for another thread's `Capture::begin` (which
/// takes the gate exclusively) sees that capture begin (here: within 5 s) instead of waiting
/// forever.
fn user_drop_under_gate_body() {
    let (device, _module, _fill) = stub();
    let began = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = JoinsCaptureWorker {
        device: device.clone(),
        began: began.clone(),
    };
    let mut graph = Graph::new(&device).unwrap();
    graph
        .add_host_node(&[], move || {
            let _ = &held;
        })
        .unwrap();
    let start = std::time::Instant::now();
    drop(graph);
    let waited = start.elapsed();
    println!("the user's Drop waited {waited:?}");
    assert!(
        began.load(std::sync::atomic::Ordering::SeqCst),
        "a capture on another thread could not begin while a host closure's captured value was \
         dropped by the crate's release (the capture gate is held across the user's Drop; a Drop \
         that waits for that thread deadlocks; here it gave up after {waited:?})"
    );
}

isolated_test!(
    user_drop_in_release_does_not_hold_the_gate,
    user_drop_under_gate_body
);

// ------------------------------------------------------------------ 5. odd sizes

/// Sizes of `usize::MAX` (and products that overflow), and a stream allocation of 0 bytes, are
/// refused with errors by every allocation and stream operation tried.
fn odd_sizes_body() {
    let (device, _module, _fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, 16).unwrap();
    let other = DeviceBuffer::<u32>::zeroed(&device, 16).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, 16).unwrap();
    assert!(StreamAllocation::new(&stream, usize::MAX).is_err());
    assert!(StreamAllocation::new(&stream, 0).is_err());
    assert!(DeviceBuffer::<u64>::zeroed(&device, usize::MAX).is_err());
    assert!(DeviceBuffer::<u64>::zeroed(&device, usize::MAX / 8 + 1).is_err());
    assert!(PinnedBuffer::<u64>::zeroed(&device, usize::MAX / 8 + 1).is_err());
    assert!(stream.memset_async(&buffer, 1u32, usize::MAX).is_err());
    assert!(
        stream
            .memset_async(&buffer, 1u32, usize::MAX / 4 + 1)
            .is_err()
    );
    assert!(stream.memcpy_async(&buffer, &other, usize::MAX).is_err());
    assert!(
        stream
            .memcpy_htod_async(&buffer, &pinned, usize::MAX)
            .is_err()
    );
    assert!(
        stream
            .memcpy_dtoh_async(&pinned, &buffer, usize::MAX)
            .is_err()
    );
    let mut graph = Graph::new(&device).unwrap();
    assert!(
        graph
            .add_mem_alloc_node(&[], &cuda_graph::AllocParams::new(&device, usize::MAX))
            .is_err()
    );
    assert_no_drop_errors(&device);
}

isolated_test!(odd_sizes_are_refused, odd_sizes_body);

// ------------------------------------------------------------------ 6. free while forked in

/// A stream allocation dropped while its stream is forked into a (relaxed) capture of another
/// stream is not freed into the captured graph: the free waits until the capture has ended, and
/// then runs once.
fn forked_free_body() {
    let (device, _module, _fill) = stub();
    let origin = Stream::new(&device).unwrap();
    let forked = Stream::new(&device).unwrap();
    let sa = StreamAllocation::new(&forked, BYTES).unwrap();
    let guard = cuda_graph::Capture::begin(&origin, CaptureMode::Relaxed).unwrap();
    guard.fork(&forked).unwrap();
    let _ = take_log();
    drop(sa);
    let during = take_log();
    assert_eq!(
        count(&during, "cuMemFreeAsync"),
        0,
        "freed into the capture: {during:?}"
    );
    guard.join(&forked).unwrap();
    let graph = guard.end().unwrap();
    flush_deferred();
    let after = take_log();
    let end = after.iter().position(|c| c.name == "cuStreamEndCapture");
    let free = after.iter().position(|c| c.name == "cuMemFreeAsync");
    assert!(
        matches!((end, free), (Some(e), Some(f)) if f > e),
        "the free runs once, after the capture: {after:?}"
    );
    assert_eq!(count(&after, "cuMemFreeAsync"), 1);
    drop(graph);
    assert_no_drop_errors(&device);
}

isolated_test!(free_while_forked_into_a_capture_waits, forked_free_body);

// ------------------------------------------------------------------ 7. panics, drop order

struct PanicsOnDrop;
impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("user drop panicked");
    }
}

/// A host closure's captured value that panics when the crate's release drops it is recorded
/// as a drop error (no panic reaches the caller); the executable graph made from the graph keeps
/// the closure, and a device buffer its kernel uses, until its launch is done, though the graph,
/// the buffer and the executable graph are dropped first, in that order, on another thread.
fn panics_and_order_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let mut graph = Graph::new(&device).unwrap();
    let p = PanicsOnDrop;
    let h = graph
        .add_host_node(&[], move || {
            let _ = &p;
        })
        .unwrap();
    add_fill_node(&mut graph, &[h], &fill, &buffer, 1);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    not_ready(true);
    let _ = take_log();
    on_fresh(move || {
        drop(graph);
        drop(buffer);
        drop(exec);
    });
    settle();
    flush_deferred();
    let during = take_log();
    assert_eq!(
        count(&during, "cuMemFree_v2"),
        0,
        "freed under the launch: {during:?}"
    );
    assert_eq!(
        device.drop_errors().count,
        0,
        "the closure dropped before the launch ended"
    );
    not_ready(false);
    device.synchronize().unwrap();
    settle();
    let after = take_log();
    assert_eq!(count(&after, "cuMemFree_v2"), 1, "{after:?}");
    let errors = device.take_drop_errors();
    assert_eq!(errors.count, 1, "{errors:?}");
    assert!(
        matches!(&errors.last, Some(cuda_graph::Error::ReleasePanicked(m)) if m.contains("user drop panicked")),
        "{errors:?}"
    );
    // The crate still works after the panic.
    let again = DeviceBuffer::<u32>::zeroed(&device, 4).unwrap();
    drop(again);
    flush_deferred();
    assert_no_drop_errors(&device);
}

isolated_test!(panicking_user_drop_and_drop_order, panics_and_order_body);

// ------------------------------------------------------------------ 8. a bind that keeps failing

/// While the device's context cannot be made current, the releases of a launched executable
/// graph (its launch reported in flight) and of a pinned buffer, dropped on a fresh thread and
/// polled by the release thread for 0.5 s, record at most 4 drop errors, not one per poll; once
/// the bind works again, the pinned buffer's release is retried and frees it, once.
fn bind_keeps_failing_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let exec = exec_over(&device, &fill, &buffer);
    exec.launch(&cuda_graph::BorrowedStream::legacy(&device))
        .unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    stream.synchronize().unwrap();
    let _ = device.take_drop_errors();
    let _ = take_log();
    fail_bind(true);
    not_ready(true);
    on_fresh(move || {
        drop(exec);
        drop(pinned);
    });
    std::thread::sleep(Duration::from_millis(500));
    let polled = device.take_drop_errors();
    let log = take_log();
    let queries = unbound(&log, &["cuEventQuery"]).len();
    fail_bind(false);
    not_ready(false);
    device.synchronize().unwrap();
    settle();
    let after = take_log();
    println!(
        "in 0.5 s of a failing bind: {} drop errors recorded, {queries} event queries with no context; cuMemFreeHost after the bind works again: {}",
        polled.count,
        count(&after, "cuMemFreeHost")
    );
    let mut problems = Vec::new();
    if polled.count > 4 {
        problems.push(format!(
            "{} drop errors recorded for 2 releases (one per poll)",
            polled.count
        ));
    }
    if count(&after, "cuMemFreeHost") != 1 {
        problems.push("the pinned buffer is never freed once the bind works again".to_string());
    }
    assert!(problems.is_empty(), "{}", problems.join("; "));
}

isolated_test!(
    failing_bind_is_recorded_once_and_retried,
    bind_keeps_failing_body
);
