//! Attacks on the APIs added last: `GraphAllocation::free`, `Capture::free_async_on`,
//! `Capture::memset_async`, `Capture::memcpy_async`, `StreamMemOps` and the path every
//! stream-ordered operation shares (`module::stream_ordered`), `Graph::add_memset_node_2d`,
//! `Device::from_raw` and the typed state errors; against the checking stub driver
//! (`stub-driver/hunt_cuda.c`), each test in a child process of its own, as in `hunt_stub.rs`.
//!
//! Besides its usual checks, these tests use the stub's one-shot hooks and opt-in checks (its
//! header says how they work):
//!
//! - `hunt_stall(call, ms)`: the calling thread's next call of `call` sleeps on entry, as a thread
//!   preempted just before the driver takes its locks. Races between a check of the crate and
//!   the driver call it guards are shown this way, deterministically.
//! - `hunt_fail_next(call)`: the calling thread's next call of `call` fails, for error paths.
//! - `HUNT_ORDER=1`: stream order as a GPU sees it. The stub still runs all work in the order
//!   it was queued, but reports a stream-ordered free (`cuMemFreeAsync`, a graph launch's free
//!   or alloc node) of memory that work queued on another stream and not yet run uses, unless
//!   events order the freeing stream after that work. Cross-stream claims that only a GPU test
//!   could check otherwise are checked here (the "held" tests below run under it).
//! - `HUNT_GLOBAL_CAPTURE=1`: a synchronizing call while a `Global`-mode capture is active is
//!   reported and refused, as the crate's own docs assume the driver does.
//!
//! Tests that showed a hole (each failed before its fix):
//!
//! | test | hole |
//! |---|---|
//! | `stream_memset_racing_a_capture_begin_keeps_its_target` | `stream_ordered` checks "no capture" without the gate: a capture begun meanwhile captures the memset, and its graph does not keep the buffer |
//! | `kernel_launch_racing_a_capture_begin_keeps_its_module` | the same for `Function::launch`: the captured kernel outlives its module |
//! | `stream_memset_racing_a_fork_keeps_its_target` | a fork pulls a stream into a capture between `stream_ordered`'s check and its memset |
//! | `stream_allocation_racing_a_capture_begin_is_not_graph_memory` | `StreamAllocation::new` checks "not capturing" without the gate: its `cuMemAllocAsync` becomes an alloc node, and the handle holds an address that only the graph maps |
//! | `failed_use_record_still_orders_a_stream_allocation_free` | a copy queued with a stream allocation operand whose use cannot be recorded is not waited for: the allocation's free overtakes it |
//! | `sync_free_racing_a_global_capture_begin_does_not_synchronize_inside_it` | `GraphAllocation::free` checks for captures without the gate, and synchronizes outside it |
//! | `sync_free_in_a_host_function_is_refused_as_such` | `GraphAllocation::free` in a host function is refused as `Capturing` |
//! | `user_as_stream_impl_hands_the_driver_a_destroyed_stream` (now `tests/compile-fail/as_stream_is_sealed`) | `AsStream` was an open, safe trait: any safe impl handed the driver the handle it liked (a destroyed stream, the stub reported) |
#![cfg(cuda_graph_tests_hunt_stub)]

mod hunt_common;

use hunt_common::{fail_next, hunt_errors, isolated, settle, stall};

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, Capture, CaptureMode, Device, DeviceAddress,
    DeviceBuffer, Error, Graph, GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig,
    Module, NodeKind, Stream, StreamAllocation, StreamMemOps, capture, flush_deferred,
};

const WORDS: usize = 1 << 10;
const BYTES: usize = WORDS * 4;

fn cfg() -> LaunchConfig {
    LaunchConfig::new((4, 1, 1), (64, 1, 1))
}

fn kinds(graph: &Graph) -> Vec<NodeKind> {
    graph.nodes().iter().map(|n| n.kind().clone()).collect()
}

/// A graph whose launch leaves one allocation of BYTES live, launched once on `stream`.
fn live_allocation(d: &Device, stream: &Stream) -> (Graph, cuda_graph::ExecGraph, GraphAllocation) {
    let mut g = Graph::new(d).unwrap();
    let (_, x) = g
        .add_mem_alloc_node(&[], &AllocParams::new(d, BYTES).label("x"))
        .unwrap();
    let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    (g, exec, x)
}

/// Launches `graph` on `stream`, waits, and asserts the stub saw no misuse.
fn launch_and_settle(graph: Graph, stream: &Stream) {
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    stream.synchronize().unwrap();
    drop((exec, graph));
    flush_deferred();
}

// ------------------------------------------------------------------ the control

/// The order check itself: a raw copy queued on one stream and a raw free of its memory on
/// another, not ordered by any event, is reported once; the same free after a wait on an event
/// recorded behind the copy is not.
fn order_control_body() {
    use cuda_graph::sys;
    let d = Device::get(0).unwrap();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    for ordered in [false, true] {
        let mut p = 0;
        // SAFETY: raw calls on live streams; `p` is allocated, copied from and freed once.
        unsafe {
            assert_eq!(
                sys::cuMemAllocAsync(&mut p, BYTES, s1.as_raw()),
                sys::CUresult::CUDA_SUCCESS
            );
            s1.synchronize().unwrap();
            let _ = sys::cuMemcpyAsync(buf.device_ptr(), p, BYTES, s2.as_raw());
            if ordered {
                let e = cuda_graph::Event::new(&d).unwrap();
                e.record(&s2).unwrap();
                s1.wait_event(&e).unwrap();
            }
            let _ = sys::cuMemFreeAsync(p, s1.as_raw());
        }
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
    }
    assert_eq!(hunt_errors(), 1, "exactly the unordered free is reported");
}

#[test]
fn order_check_reports_an_unordered_raw_free_only() {
    isolated(
        "order_check_reports_an_unordered_raw_free_only",
        &[
            ("HUNT_ORDER", "1"),
            ("HUNT_DELAY_US", "50000"),
            ("HUNT_DELAY_FIXED", "1"),
        ],
        order_control_body,
    );
}

// ------------------------------------------------------------------ holes

/// A memset queued through `StreamMemOps` on a stream while another thread begins a capture of
/// it (the memset's thread is preempted between `stream_ordered`'s "no capture" check, made
/// without the gate, and the driver call): the memset becomes a node of the captured graph,
/// whose keep list does not hold the buffer. The buffer is dropped (freed: nothing else holds
/// it) and the graph launched: the stub reports the write to freed memory.
fn memset_racing_begin_body() {
    let d = Device::get(0).unwrap();
    let (s, other) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let graph = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            stall(c"cuMemsetD32Async", 300);
            s.memset_async(&buf, 7u32, WORDS)
        });
        std::thread::sleep(Duration::from_millis(100));
        let cap = Capture::begin(&s, CaptureMode::Relaxed).unwrap();
        worker.join().unwrap().unwrap();
        cap.end().unwrap()
    });
    println!("captured: {:?}", kinds(&graph));
    drop(buf);
    flush_deferred();
    launch_and_settle(graph, &other);
    s.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn stream_memset_racing_a_capture_begin_keeps_its_target() {
    isolated(
        "stream_memset_racing_a_capture_begin_keeps_its_target",
        &[],
        memset_racing_begin_body,
    );
}

/// As above, for `Function::launch` (used with matching arguments): the captured kernel node
/// runs after its module is unloaded and its buffer freed.
fn launch_racing_begin_body() {
    let d = Device::get(0).unwrap();
    let (s, other) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let module = Module::from_ptx(&d, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    drop(module);
    let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let graph = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            stall(c"cuLaunchKernel", 300);
            let args = KernelArgs::new().ptr(&buf).value(WORDS as u64).value(1u32);
            // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (buf, WORDS, 1): `buf` holds WORDS
            // values.
            unsafe { fill.launch(&s, cfg(), &args) }
        });
        std::thread::sleep(Duration::from_millis(100));
        let cap = Capture::begin(&s, CaptureMode::Relaxed).unwrap();
        worker.join().unwrap().unwrap();
        cap.end().unwrap()
    });
    println!("captured: {:?}", kinds(&graph));
    // Not captured (as after the fix), the launch runs on `s`: wait for it before the module
    // goes. A stream launch keeps its module only for the call, relying on `cuModuleUnload` to
    // wait for the kernels in flight, which the stub does not model (a GPU question).
    s.synchronize().unwrap();
    drop((fill, buf));
    flush_deferred();
    launch_and_settle(graph, &other);
    s.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn kernel_launch_racing_a_capture_begin_keeps_its_module() {
    isolated(
        "kernel_launch_racing_a_capture_begin_keeps_its_module",
        &[],
        launch_racing_begin_body,
    );
}

/// A capture forks a stream while another thread's `StreamMemOps::memset_async` on that stream
/// is between its check (the stream is not in the capture) and its driver call: the memset is
/// captured on the forked stream, and the graph does not keep the buffer.
fn memset_racing_fork_body() {
    let d = Device::get(0).unwrap();
    let (s1, s2, other) = (
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
    );
    let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let (done, queued) = mpsc::channel();
    let graph = std::thread::scope(|scope| {
        let (s2, buf) = (&s2, &buf);
        scope.spawn(move || {
            stall(c"cuMemsetD32Async", 300);
            done.send(s2.memset_async(buf, 7u32, WORDS)).unwrap();
        });
        capture(&s1, CaptureMode::Relaxed, |cap| {
            std::thread::sleep(Duration::from_millis(100));
            cap.fork(s2)?;
            queued.recv().unwrap()?;
            cap.join(s2)
        })
        .unwrap()
        .0
    });
    println!("captured: {:?}", kinds(&graph));
    drop(buf);
    flush_deferred();
    launch_and_settle(graph, &other);
    s2.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn stream_memset_racing_a_fork_keeps_its_target() {
    isolated(
        "stream_memset_racing_a_fork_keeps_its_target",
        &[],
        memset_racing_fork_body,
    );
}

/// `StreamAllocation::new` checks that its stream is not capturing, then allocates, without the
/// gate: a capture begun in between captures the `cuMemAllocAsync` as an alloc node. The handle
/// then holds an address that only the graph's launches map: a memset through `StreamMemOps`
/// writes unmapped memory, and the handle's free frees it.
fn stream_alloc_racing_begin_body() {
    let d = Device::get(0).unwrap();
    let (s, other) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let (graph, allocation) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            stall(c"cuMemAllocAsync", 300);
            StreamAllocation::new(&s, BYTES)
        });
        std::thread::sleep(Duration::from_millis(100));
        let cap = Capture::begin(&s, CaptureMode::Relaxed).unwrap();
        let allocation = worker.join().unwrap().unwrap();
        (cap.end().unwrap(), allocation)
    });
    println!("captured: {:?}", kinds(&graph));
    other.memset_async(&allocation, 1u32, WORDS).unwrap();
    other.synchronize().unwrap();
    drop(allocation);
    s.synchronize().unwrap();
    drop(graph);
    flush_deferred();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn stream_allocation_racing_a_capture_begin_is_not_graph_memory() {
    isolated(
        "stream_allocation_racing_a_capture_begin_is_not_graph_memory",
        &[],
        stream_alloc_racing_begin_body,
    );
}

/// A copy from a stream allocation, queued on another stream, whose use cannot be recorded (the
/// event for it cannot be created): the copy is queued, the call errs, and nothing orders the
/// allocation's free on its own stream after the copy (a graph allocation's use, in the same
/// case, is waited for before the error is returned). Under `HUNT_ORDER`, the free is
/// reported.
fn failed_record_body() {
    let d = Device::get(0).unwrap();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let out = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let allocation = StreamAllocation::new(&s1, BYTES).unwrap();
    fail_next(c"cuEventCreate");
    let copied = s2.memcpy_async(&out, &allocation, BYTES);
    assert!(
        matches!(&copied, Err(Error::Driver(e)) if e.call == "cuEventCreate"),
        "{copied:?}"
    );
    drop(allocation);
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn failed_use_record_still_orders_a_stream_allocation_free() {
    isolated(
        "failed_use_record_still_orders_a_stream_allocation_free",
        &[
            ("HUNT_ORDER", "1"),
            ("HUNT_DELAY_US", "100000"),
            ("HUNT_DELAY_FIXED", "1"),
        ],
        failed_record_body,
    );
}

/// `GraphAllocation::free` checks `release_allowed` without the gate and synchronizes its
/// private stream after `free_on` has let the gate go: a `Global` capture begun on another
/// thread in between has the synchronize made inside it, which the free's own docs say it
/// refuses (under `HUNT_GLOBAL_CAPTURE` the stub reports and refuses the synchronize).
fn sync_free_racing_global_body() {
    let d = Device::get(0).unwrap();
    let (s, c) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let (_g, _exec, x) = live_allocation(&d, &s);
    s.synchronize().unwrap();
    let (done, freed) = mpsc::channel();
    std::thread::scope(|scope| {
        let x = &x;
        scope.spawn(move || {
            stall(c"cuStreamSynchronize", 300);
            done.send(x.free()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        let (_, result) = capture(&c, CaptureMode::Global, |_| Ok(freed.recv().unwrap())).unwrap();
        result.unwrap();
    });
    assert!(!x.is_live());
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn sync_free_racing_a_global_capture_begin_does_not_synchronize_inside_it() {
    isolated(
        "sync_free_racing_a_global_capture_begin_does_not_synchronize_inside_it",
        &[("HUNT_GLOBAL_CAPTURE", "1")],
        sync_free_racing_global_body,
    );
}

/// `GraphAllocation::free` from a host node's function: refused, with nothing freed, as every
/// CUDA-calling operation is there (`Error::InHostFunction`); it is refused as `Capturing` ("a
/// capture of this crate forbids the synchronize here"), though no capture exists.
fn host_free_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let (_g, _exec, x) = live_allocation(&d, &s);
    let result = Arc::new(Mutex::new(None));
    let mut h = Graph::new(&d).unwrap();
    let (x2, r2) = (x.clone(), result.clone());
    h.add_host_node(&[], move || {
        *r2.lock().unwrap() = Some(x2.free());
    })
    .unwrap();
    let hx = h.instantiate(InstantiateFlags::NONE).unwrap();
    hx.launch(&s).unwrap();
    s.synchronize().unwrap();
    let got = result
        .lock()
        .unwrap()
        .take()
        .expect("the host function ran");
    assert!(x.is_live(), "the refused free freed nothing");
    x.free().unwrap();
    drop((hx, h));
    flush_deferred();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
    assert!(
        matches!(&got, Err(Error::InHostFunction { call }) if *call == "GraphAllocation::free"),
        "{got:?}"
    );
}

#[test]
fn sync_free_in_a_host_function_is_refused_as_such() {
    isolated(
        "sync_free_in_a_host_function_is_refused_as_such",
        &[],
        host_free_body,
    );
}

// ------------------------------------------------------------------ what held

/// `free` after uses on another stream and on two threads' per-thread default streams, all
/// still queued: the private stream waits for each (checked under `HUNT_ORDER`); the owner
/// relaunched on a third stream maps the address only after the free; a copy then freed by
/// `free_async` on another stream, a stream allocation used elsewhere and dropped, and a free
/// node of another graph launched while a copy is queued are each ordered after their uses.
fn ordered_frees_body() {
    let d = Device::get(0).unwrap();
    let (s1, s2, s3) = (
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
    );
    let out = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let (_g, exec, x) = live_allocation(&d, &s1);
    s2.memset_async(&x, 1u32, WORDS).unwrap();
    std::thread::scope(|scope| {
        for v in [2u32, 3] {
            let x = &x;
            scope.spawn(move || {
                let mine = BorrowedStream::per_thread(x.device());
                mine.memset_async(x, v, WORDS).unwrap();
            });
        }
    });
    x.free().unwrap();
    exec.launch(&s3).unwrap();
    s1.memcpy_async(&out, &x, BYTES).unwrap();
    x.free_async(&s2).unwrap();

    let allocation = StreamAllocation::new(&s1, BYTES).unwrap();
    s2.memcpy_async(&out, &allocation, BYTES).unwrap();
    drop(allocation);

    exec.launch(&s3).unwrap();
    s1.memcpy_async(&out, &x, BYTES).unwrap();
    let mut f = Graph::new(&d).unwrap();
    f.add_mem_free_node(&[], &x).unwrap();
    let fx = f.instantiate(InstantiateFlags::NONE).unwrap();
    fx.launch(&s2).unwrap();
    d.synchronize().unwrap();
    drop((fx, f, exec));
    flush_deferred();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn frees_wait_for_queued_uses_on_other_streams() {
    isolated(
        "frees_wait_for_queued_uses_on_other_streams",
        &[
            ("HUNT_ORDER", "1"),
            ("HUNT_DELAY_US", "5000"),
            ("HUNT_DELAY_FIXED", "1"),
        ],
        ordered_frees_body,
    );
}

/// Refusals name the call and the allocation, and change nothing: a second `free` and a
/// `free_async` of a freed allocation (`NotLive`, its id); `free_async` on a capturing stream
/// (`Capturing`, still live); `free_async_on` a stream outside the capture (`NotInCapture`, no
/// free node captured, still live); a copy of an allocation onto itself, and a memset or copy
/// whose size overflows (`InvalidArgument` before the driver).
fn refusals_body() {
    let d = Device::get(0).unwrap();
    let (s, c, outside) = (
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
        Stream::new(&d).unwrap(),
    );
    let (_g, _exec, x) = live_allocation(&d, &s);
    let (graph, ()) = capture(&c, CaptureMode::Global, |cap| {
        let refused = x.free_async(&c);
        assert!(
            matches!(&refused, Err(Error::Capturing { call, .. }) if *call == "GraphAllocation::free_async"),
            "{refused:?}"
        );
        let refused = cap.free_async_on(&outside, &x);
        assert!(
            matches!(&refused, Err(Error::NotInCapture { call }) if *call == "Capture::free_async_on"),
            "{refused:?}"
        );
        let refused = cap.memcpy_async(&x, &x, 4);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { call, .. }) if *call == "Capture::memcpy_async"),
            "{refused:?}"
        );
        let refused = cap.memset_async(&x, 0u32, usize::MAX / 2 + 1);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { call, .. }) if *call == "Capture::memset_async"),
            "{refused:?}"
        );
        Ok(())
    })
    .unwrap();
    assert!(graph.nodes().is_empty(), "{:?}", kinds(&graph));
    assert!(x.is_live(), "a refusal freed it");
    x.free().unwrap();
    for (what, refused) in [
        ("free", x.free()),
        ("free_async", x.free_async(&s)),
        ("memset", s.memset_async(&x, 0u8, 1)),
    ] {
        assert!(
            matches!(&refused, Err(Error::NotLive { allocation, .. }) if allocation.id == x.id()),
            "{what}: {refused:?}"
        );
    }
    s.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn refusals_name_the_call_and_the_allocation_and_change_nothing() {
    isolated(
        "refusals_name_the_call_and_the_allocation_and_change_nothing",
        &[],
        refusals_body,
    );
}

/// A 2-D memset node into a graph allocation is a use the lifetime checks see: not ordered
/// after the alloc node, or after the free node, the graph is refused; between them it passes.
fn memset_2d_allocation_body() {
    let d = Device::get(0).unwrap();
    for order in ["unordered", "after the free", "between"] {
        let mut g = Graph::new(&d).unwrap();
        let (alloc, a) = g
            .add_mem_alloc_node(&[], &AllocParams::new(&d, 64 * 48))
            .unwrap();
        match order {
            "unordered" => {
                g.add_memset_node_2d(&[], &a, 1u8, 16, 48, 64).unwrap();
                g.add_mem_free_node(&[alloc], &a).unwrap();
            }
            "after the free" => {
                let free = g.add_mem_free_node(&[alloc], &a).unwrap();
                g.add_memset_node_2d(&[free], &a, 1u32, 4, 48, 64).unwrap();
            }
            _ => {
                let set = g.add_memset_node_2d(&[alloc], &a, 1u16, 8, 48, 64).unwrap();
                g.add_mem_free_node(&[set], &a).unwrap();
            }
        }
        let checked = g.check();
        assert_eq!(checked.is_ok(), order == "between", "{order}: {checked:?}");
    }
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn memset_2d_node_into_a_graph_allocation_is_a_checked_use() {
    isolated(
        "memset_2d_node_into_a_graph_allocation_is_a_checked_use",
        &[],
        memset_2d_allocation_body,
    );
}

// ------------------------------------------------------------------ launches and their keep lists

/// A graph of one memset of `buf` (no memory nodes: the launch's fast path).
fn memset_graph(d: &Device, buf: &DeviceBuffer<u32>) -> Graph {
    let mut g = Graph::new(d).unwrap();
    g.add_memset_node(&[], buf, 7, WORDS).unwrap();
    g
}

/// Runs `body` while another thread holds a `Global` capture of a stream of its own open.
fn during_global_capture(d: &Device, body: impl FnOnce()) {
    let (begun, ready) = mpsc::channel();
    let (finish, finished) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let c = Stream::new(d).unwrap();
            capture(&c, CaptureMode::Global, |_| {
                begun.send(()).unwrap();
                finished.recv().unwrap();
                Ok(())
            })
            .unwrap();
        });
        ready.recv().unwrap();
        body();
        finish.send(()).unwrap();
    });
}

/// Launches whose event cannot be made or recorded while another thread captures in `Global`
/// mode, where no stream may be synchronized: a missing event refuses the launch before the
/// driver is called, and a failed record after the launch leaves what the launch uses kept and
/// in doubt, never released or freed under it. Before, both fell back to a synchronize, which
/// the capture refused (the stub reports it under `HUNT_GLOBAL_CAPTURE`), and the error was
/// ignored: the launch counted as done. The graph without memory nodes is launched on a
/// borrowed stream, where each launch is marked as it is queued (on an owned one the mark is
/// recorded later: the `lazy_mark` tests below).
fn unmarked_launch_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let g = memset_graph(&d, &buf);
    let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    // A graph that uses an allocation of another graph: the launch path with allocations.
    let (_producer, _producer_exec, x) = live_allocation(&d, &s);
    s.synchronize().unwrap();
    let mut consumer = Graph::new(&d).unwrap();
    consumer.add_memset_node(&[], &x, 9, WORDS).unwrap();
    let consumer_exec = consumer.instantiate(InstantiateFlags::NONE).unwrap();
    let failed = |r: cuda_graph::Result<()>, call: &str| {
        assert!(
            matches!(&r, Err(Error::Driver(e)) if e.call == call),
            "expected a {call} error: {r:?}"
        );
    };
    let borrowed = s.borrow();
    during_global_capture(&d, || {
        fail_next(c"cuEventCreate");
        failed(exec.launch(&borrowed), "cuEventCreate");
        fail_next(c"cuEventRecord");
        failed(exec.launch(&borrowed), "cuEventRecord");
        fail_next(c"cuEventCreate");
        failed(consumer_exec.launch(&s), "cuEventCreate");
        fail_next(c"cuEventRecord");
        failed(consumer_exec.launch(&s), "cuEventRecord");
    });
    assert_eq!(
        hunt_errors(),
        0,
        "the stub reported misuse (a synchronize inside the Global capture)"
    );
    s.synchronize().unwrap();
    let buffers = cuda_graph::live_objects().device_buffers;
    // The launches' ends are unknown: what they refer to stays, and the allocation they used
    // is neither freed nor used again.
    drop((exec, g, buf, consumer_exec, consumer));
    flush_deferred();
    assert_eq!(
        cuda_graph::live_objects().device_buffers,
        buffers,
        "the memset's buffer was released after a launch whose end is unknown"
    );
    let freed = x.free_async(&s);
    assert!(
        matches!(
            freed,
            Err(Error::InDoubt {
                queued_by: "ExecGraph::launch"
            })
        ),
        "{freed:?}"
    );
    assert!(x.is_live());
    let errors = d.drop_errors();
    assert!(
        matches!(errors.last, Some(Error::InDoubt { .. })),
        "{errors:?}"
    );
    s.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn launch_whose_event_fails_during_a_global_capture_is_never_counted_done() {
    isolated(
        "launch_whose_event_fails_during_a_global_capture_is_never_counted_done",
        &[("HUNT_GLOBAL_CAPTURE", "1")],
        unmarked_launch_body,
    );
}

/// A graph of one memset of a stream allocation made on `other` and dropped once the node is
/// added: the graph keeps it, and its release queues its `cuMemFreeAsync` on `other`, ordered
/// only by the crate's marks after the graph's launches. Under `HUNT_ORDER` the stub reports a
/// release that does not wait for them (a stream-ordered free overtaking queued work on another
/// stream), which a `DeviceBuffer` would not show: `cuMemFree` waits for the device.
fn stream_allocation_graph(d: &Device, other: &Stream) -> Graph {
    let a = StreamAllocation::new(other, BYTES).unwrap();
    let mut g = Graph::new(d).unwrap();
    g.add_memset_node(&[], &a, 7, WORDS).unwrap();
    drop(a);
    g
}

/// `stream_allocation_graph`'s executable graph, launched three times on `s` (its graph dropped).
fn launched_three_times(d: &Device, other: &Stream, s: &Stream) -> cuda_graph::ExecGraph {
    let g = stream_allocation_graph(d, other);
    let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    for _ in 0..3 {
        exec.launch(s).unwrap();
    }
    exec
}

/// Waits until the graph's stream allocation is released, then asserts that the stub saw no
/// misuse (a release before the launches ran, under `HUNT_ORDER`) and no drop error was met.
fn assert_released_after_the_launches(d: &Device, other: &Stream) {
    settle("the memset's allocation released", || {
        cuda_graph::live_objects().stream_allocations == 0
    });
    other.synchronize().unwrap();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
    assert_eq!(d.drop_errors().count, 0, "{:?}", d.drop_errors());
}

/// Every stub work item takes 100 ms, and stream order is checked.
const SLOW_ORDERED: &[(&str, &str)] = &[
    ("HUNT_DELAY_US", "100000"),
    ("HUNT_DELAY_FIXED", "1"),
    ("HUNT_ORDER", "1"),
];

/// A graph that uses nothing outside itself, launched on an owned stream: no event is recorded
/// per launch; its stream records one when it is destroyed first, and the executable graph's
/// drop gets that one. The stream is dropped with three launches queued (the stub runs them
/// later), then the graph and the executable graph: what the graph keeps must be released only
/// after the launches ran, and then without another call from the program.
fn lazy_mark_stream_dropped_body() {
    let d = Device::get(0).unwrap();
    let other = Stream::new(&d).unwrap();
    let s = Stream::new(&d).unwrap();
    let exec = launched_three_times(&d, &other, &s);
    drop(s);
    drop(exec);
    assert_released_after_the_launches(&d, &other);
}

#[test]
fn lazy_mark_of_a_launch_whose_stream_was_dropped_waits_for_it() {
    isolated(
        "lazy_mark_of_a_launch_whose_stream_was_dropped_waits_for_it",
        SLOW_ORDERED,
        lazy_mark_stream_dropped_body,
    );
}

/// The same launches, their stream still alive but capturing (a relaxed capture of this crate,
/// which lets releases run) when the executable graph is dropped: an event recorded then would
/// be captured, so the release waits for the capture to end. While it lasts the allocation
/// stays; after it, the allocation is released once the launches ran.
fn lazy_mark_capturing_body() {
    let d = Device::get(0).unwrap();
    let other = Stream::new(&d).unwrap();
    let s = Stream::new(&d).unwrap();
    let exec = launched_three_times(&d, &other, &s);
    let cap = Capture::begin(&s, CaptureMode::Relaxed).unwrap();
    drop(exec);
    std::thread::sleep(Duration::from_millis(20));
    flush_deferred();
    assert_eq!(
        cuda_graph::live_objects().stream_allocations,
        1,
        "the allocation was released while its launches' stream captured"
    );
    drop(cap.end().unwrap());
    assert_released_after_the_launches(&d, &other);
}

#[test]
fn lazy_mark_while_the_stream_captures_waits_for_the_capture() {
    isolated(
        "lazy_mark_while_the_stream_captures_waits_for_the_capture",
        SLOW_ORDERED,
        lazy_mark_capturing_body,
    );
}

/// The executable graph dropped while another thread captures in `Global` mode, with the
/// mark's event failing to be made and then to be recorded: no synchronize may run then (the
/// stub refuses and reports one under `HUNT_GLOBAL_CAPTURE`), so the release waits for the
/// capture to end and marks the launches then; nothing is in doubt and nothing is released
/// before the launches ran.
fn lazy_mark_failing_body() {
    let d = Device::get(0).unwrap();
    let other = Stream::new(&d).unwrap();
    let s = Stream::new(&d).unwrap();
    for failing in [c"cuEventCreate", c"cuEventRecord"] {
        let exec = launched_three_times(&d, &other, &s);
        during_global_capture(&d, || {
            fail_next(failing);
            drop(exec);
            assert_eq!(
                cuda_graph::live_objects().stream_allocations,
                1,
                "released during the capture"
            );
        });
        assert_released_after_the_launches(&d, &other);
    }
}

#[test]
fn lazy_mark_that_cannot_be_recorded_during_a_global_capture_waits_for_it() {
    let mut env = vec![("HUNT_GLOBAL_CAPTURE", "1")];
    env.extend_from_slice(SLOW_ORDERED);
    isolated(
        "lazy_mark_that_cannot_be_recorded_during_a_global_capture_waits_for_it",
        &env,
        lazy_mark_failing_body,
    );
}

/// `set_kernel_node_params` on one node, 50 times, each with a new buffer dropped afterwards:
/// the executable graph keeps the node's latest setting (and the graph's own operand), not
/// every setting it was ever given. Before, each call appended to the shared keep list, which
/// held all 50 buffers until the executable graph and the graph were gone.
fn set_params_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let module = Module::from_ptx(&d, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let first = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    fn args(buf: &DeviceBuffer<u32>, v: u32) -> KernelArgs<'_> {
        KernelArgs::new().ptr(buf).value(WORDS as u64).value(v)
    }
    let mut g = Graph::new(&d).unwrap();
    // SAFETY: fill_u32(u32* p, u64 n, u32 v) over a buffer of WORDS values, here and below.
    let node = unsafe { g.add_kernel_node(&[], &fill, cfg(), &args(&first, 1)) }.unwrap();
    let mut exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    let before = cuda_graph::live_objects().device_buffers;
    for v in 0..50 {
        let buf = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
        // SAFETY: as above.
        unsafe { exec.set_kernel_node_params(&g, node, &fill, cfg(), &args(&buf, v)) }.unwrap();
        exec.launch(&s).unwrap();
        if v % 2 == 0 {
            s.synchronize().unwrap();
        }
        drop(buf);
    }
    s.synchronize().unwrap();
    flush_deferred();
    let kept = cuda_graph::live_objects().device_buffers - before;
    assert!(
        kept <= 1,
        "{kept} buffers of earlier settings are still kept"
    );
    drop(exec);
    flush_deferred();
    assert_eq!(cuda_graph::live_objects().device_buffers, before);
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn set_kernel_node_params_keeps_the_latest_setting_only() {
    isolated(
        "set_kernel_node_params_keeps_the_latest_setting_only",
        &[],
        set_params_body,
    );
}
