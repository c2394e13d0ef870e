//! Host-side stress of the safe layer under concurrency, against `stub-driver/hunt_cuda.c`: a
//! checking stand-in for the driver, built against the toolkit's `cuda.h`, whose "GPU" thread
//! runs work later, in issue order, and calls CUDA user-object destructors and host functions
//! there, as the driver's internal threads do; it reports (`HUNT ERROR`) every use of a
//! destroyed, moved or unknown handle, double destroy, double free, work that touches freed
//! device memory when it runs, relaunch over a live allocation without AutoFreeOnLaunch, and
//! CUDA calls made while the driver is torn down at process exit. It runs no kernel code: it
//! reads a launch's arguments by the kernel's layout and checks the addresses among them. The
//! stress mimics `stress_streams.rs` and soundness.rs's
//! `relaunch_into_streams_another_thread_shares_stays_in_order` (two threads sharing four
//! streams), adds drops while in flight, drops on other threads, captures, stream allocations,
//! events, memset/memcpy/event/host nodes and flushes, and runs once more with failures injected
//! into driver calls.
//!
//! `no_driver_call_from_the_release_thread_during_exit_teardown` guards the crate's exit handler
//! (`cuda-graph/src/deferred.rs`) that stops releases at process exit; it fails without it.
//!
//! Each test runs in a child process of its own (the stub is the whole process's driver, and
//! one test checks what happens at exit): the test binary run again on that one test, with
//! `HUNT_CHILD` naming it, which runs the test's body in that process. `build.rs` compiles the
//! stub against the headers cuda-graph-sys used, into the `OUT_DIR` that a nextest archive
//! carries (as the other stub). Without a C compiler each test prints `SKIPPED <test>: <reason>`
//! and returns, except in CI (`CI=true`) and under `CUDA_GRAPH_REQUIRE_GPU=1`, where it fails:
//! those runs count only tests that ran. `HUNT_LIB` names a prebuilt stub instead; `HUNT_ROUNDS` changes the stress's rounds
//! (200).
//!
//! Under valgrind, ASan and TSan (with `CUDA_PATH` as for any build; `CI=true` makes a stub that
//! failed to build fail the tests): a report makes the child fail, and so its test, except in the
//! exit test, which does not check its children's exit status. Valgrind follows the children;
//! fewer rounds keep the stress's child under the 120 s limit:
//!
//! ```text
//! CI=true HUNT_ROUNDS=50 \
//!   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind -q --trace-children=yes --error-exitcode=1" \
//!   cargo nextest run -p cuda-graph-tests --test hunt_stub
//! ```
//!
//! ASan and TSan instrument the Rust side (nightly toolchain with `rust-src`), not the stub:
//!
//! ```text
//! CI=true RUSTFLAGS=-Zsanitizer=address cargo +nightly test -Zbuild-std \
//!   --target x86_64-unknown-linux-gnu -p cuda-graph-tests --test hunt_stub
//! CI=true RUSTFLAGS=-Zsanitizer=thread cargo +nightly test -Zbuild-std \
//!   --target x86_64-unknown-linux-gnu -p cuda-graph-tests --test hunt_stub
//! ```
//!
//! The stub is written against the CUDA 13.0 driver API (its entry points' signatures), so
//! this file holds tests only in builds on 13.0 headers or newer (`tests/build.rs`).
#![cfg(cuda_graph_tests_hunt_stub)]

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use cuda_graph::{
    AllocParams, AsStream, BorrowedStream, CaptureMode, Device, DeviceBuffer, Event, EventFlags,
    ExecGraph, Function, Graph, GraphAllocation, InstantiateFlags, KernelArgs, LaunchConfig,
    Module, Stream, StreamAllocation, StreamFlags, capture, flush_deferred, live_objects,
};

const WORDS: u64 = 1 << 10;
const BYTES: usize = WORDS as usize * 4;

/// The checking stub that `build.rs` compiled (or `HUNT_LIB`); `Err` says why there is none.
fn stub_path() -> Result<PathBuf, String> {
    if let Ok(lib) = std::env::var("HUNT_LIB") {
        return Ok(PathBuf::from(lib));
    }
    cuda_graph_tests::built_library(
        env!("CUDA_GRAPH_TESTS_HUNT_STUB"),
        env!("CUDA_GRAPH_TESTS_HUNT_STUB_ERROR"),
    )
}

/// In the child: loads the stub as the driver.
fn use_stub() {
    let path = stub_path().expect("the stub was built by the parent");
    // SAFETY: before this process's first driver call; the test thread reads no other
    // environment meanwhile.
    unsafe { std::env::set_var("CUDA_GRAPH_LIBCUDA", &path) };
}

/// The number of `HUNT ERROR`s the loaded stub reported.
fn hunt_errors() -> i32 {
    let path = CString::new(stub_path().unwrap().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: `path` is a NUL-terminated string that outlives the call; with RTLD_NOLOAD, dlopen
    // only takes a reference to the library if it is already loaded (as this process's driver),
    // running no initializer.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!lib.is_null(), "the hunt stub is loaded");
    // SAFETY: `lib` is the live handle dlopen returned; the symbol's name is a NUL-terminated
    // literal.
    let f = unsafe { libc::dlsym(lib, c"hunt_errors".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: `f` is the address of the stub's `int hunt_errors(void)` (`hunt_cuda.c`): a C
    // function without parameters that returns a C `int`, which is `i32` here.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(f) };
    // The reference taken above keeps the library, and so `f`, loaded until the dlclose.
    let n = f();
    // SAFETY: `lib` is the live handle of the dlopen above, closed once; `f` is not used after
    // (the driver's own reference keeps the library loaded anyway).
    unsafe { libc::dlclose(lib) };
    n
}

/// Runs `body` in a child process of this test binary with `env` set (the test `name`,
/// `HUNT_CHILD` naming it); returns whether it exited successfully and its output (stdout and
/// stderr), or `None` in the child itself (after `body`) and when the stub could not be built
/// (printed as `SKIPPED <name>: <reason>`). Kills the child after 120 s (then: not a success).
///
/// # Panics
/// When the stub could not be built, in CI (`CI=true`) or under `CUDA_GRAPH_REQUIRE_GPU=1`.
fn isolated(name: &str, env: &[(&str, &str)], body: fn()) -> Option<(bool, String)> {
    if std::env::var("HUNT_CHILD").as_deref() == Ok(name) {
        use_stub();
        body();
        return None;
    }
    if let Err(why) = stub_path() {
        let why = format!("the checking stub driver could not be built ({why})");
        if cuda_graph_tests::stub_required() {
            panic!("{name}: {why}, and CI=true or CUDA_GRAPH_REQUIRE_GPU=1 is set");
        }
        println!("SKIPPED {name}: {why}");
        return None;
    }
    let (status, text) =
        cuda_graph_tests::run_test_in_child(name, "HUNT_CHILD", env, Duration::from_secs(120));
    Some((status.is_some_and(|s| s.success()), text))
}

struct K {
    copy: Function,
    add: Function,
    fill: Function,
    spin: Function,
    _module: Module,
}

fn cfg() -> LaunchConfig {
    LaunchConfig::new((4, 1, 1), (64, 1, 1))
}

fn spin(k: &K, s: &impl AsStream) {
    let args = KernelArgs::new()
        .value(0u64)
        .value(0u64)
        .value(0u32)
        .value(1000u64);
    // SAFETY: spin_then_fill_u32(u32* p, u64 n, u32 v, u64 cycles) gets (null, 0, 0, 1000),
    // matching in number, order and type; with n = 0 it writes nothing.
    unsafe { k.spin.launch(s, cfg(), &args) }.unwrap();
}

/// Producer: alloc node (no free), copy src into it, add 1 to src, and a host node.
fn producer(
    d: &Device,
    k: &K,
    src: &DeviceBuffer<u32>,
    hits: &Arc<AtomicUsize>,
) -> (Graph, GraphAllocation) {
    let mut g = Graph::new(d).unwrap();
    let (alloc, a) = g
        .add_mem_alloc_node(&[], &AllocParams::new(d, BYTES).label("A"))
        .unwrap();
    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (a, src, WORDS): `a` has BYTES
    // (WORDS values), allocated by this graph's `alloc`, which the node depends on; `src` holds
    // WORDS values.
    let copy = unsafe {
        g.add_kernel_node(
            &[alloc],
            &k.copy,
            cfg(),
            &KernelArgs::new().ptr(&a).ptr(src).value(WORDS),
        )
    }
    .unwrap();
    // SAFETY: add_u32(u32* p, u64 n, u32 v) gets (src, WORDS, 1); `src` holds WORDS values.
    let add = unsafe {
        g.add_kernel_node(
            &[copy],
            &k.add,
            cfg(),
            &KernelArgs::new().ptr(src).value(WORDS).value(1u32),
        )
    }
    .unwrap();
    let h = hits.clone();
    // On the heap: a host function run after its closure is freed reads freed memory.
    let payload = Box::new([7u8; 64]);
    g.add_host_node(&[add], move || {
        assert_eq!(payload[63], 7);
        h.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    (g, a)
}

fn consumer(
    d: &Device,
    k: &K,
    a: &GraphAllocation,
    out: &DeviceBuffer<u32>,
    sp: bool,
) -> ExecGraph {
    let mut g = Graph::new(d).unwrap();
    let deps = if sp {
        let args = KernelArgs::new()
            .value(0u64)
            .value(0u64)
            .value(0u32)
            .value(1000u64);
        // SAFETY: spin_then_fill_u32(u32* p, u64 n, u32 v, u64 cycles) gets (null, 0, 0, 1000),
        // matching in number, order and type; with n = 0 it writes nothing.
        vec![unsafe { g.add_kernel_node(&[], &k.spin, cfg(), &args) }.unwrap()]
    } else {
        Vec::new()
    };
    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (out, a, WORDS): `out` holds WORDS
    // values, `a` has BYTES (WORDS values); the crate checks at each launch that `a` is live.
    unsafe {
        g.add_kernel_node(
            &deps,
            &k.copy,
            cfg(),
            &KernelArgs::new().ptr(out).ptr(a).value(WORDS),
        )
    }
    .unwrap();
    g.instantiate(InstantiateFlags::NONE).unwrap()
}

fn copy_out(k: &K, s: &impl AsStream, out: &DeviceBuffer<u32>, a: &GraphAllocation) {
    let args = KernelArgs::new().ptr(out).ptr(a).value(WORDS);
    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (out, a, WORDS): `out` holds WORDS
    // values, `a` has BYTES (WORDS values); passed with `ptr`, `a` is checked live and ordered
    // after the launch that allocated it.
    unsafe { k.copy.launch(s, cfg(), &args) }.unwrap();
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

static CAPTURE_LOCK: Mutex<()> = Mutex::new(());

#[allow(clippy::too_many_lines)]
fn worker(d: &Device, k: &K, streams: &[Stream; 4], t: usize, rounds: usize, start: &Barrier) {
    let hits = Arc::new(AtomicUsize::new(0));
    let src: Vec<DeviceBuffer<u32>> = (0..4)
        .map(|v| DeviceBuffer::from_slice(d, &vec![v as u32; WORDS as usize]).unwrap())
        .collect();
    let out: Vec<DeviceBuffer<u32>> = (0..5)
        .map(|_| DeviceBuffer::<u32>::zeroed(d, WORDS as usize).unwrap())
        .collect();
    let (graph0, a0) = producer(d, k, &src[0], &hits);
    let p0 = graph0.instantiate(InstantiateFlags::NONE).unwrap();
    let c0 = consumer(d, k, &a0, &out[0], true);
    let (graph1, a1) = producer(d, k, &src[1], &hits);
    let p1 = graph1.instantiate(InstantiateFlags::NONE).unwrap();
    let mut freer = Graph::new(d).unwrap();
    freer.add_mem_free_node(&[], &a1).unwrap();
    let f1 = freer.instantiate(InstantiateFlags::NONE).unwrap();
    let (graph3, a3) = producer(d, k, &src[3], &hits);
    let p3 = graph3
        .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
        .unwrap();
    let c3a = consumer(d, k, &a3, &out[3], true);
    let c3b = consumer(d, k, &a3, &out[4], false);
    let mut probe_graph = Graph::new(d).unwrap();
    let probes: Vec<GraphAllocation> = (0..4)
        .map(|_| {
            let (alloc, p) = probe_graph
                .add_mem_alloc_node(&[], &AllocParams::new(d, BYTES))
                .unwrap();
            let args = KernelArgs::new().ptr(&p).value(WORDS).value(5u32);
            // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (p, WORDS, 5): `p` has BYTES (WORDS
            // values), allocated by `alloc`, which the node depends on.
            unsafe { probe_graph.add_kernel_node(&[alloc], &k.fill, cfg(), &args) }.unwrap();
            p
        })
        .collect();
    let q = probe_graph.instantiate(InstantiateFlags::NONE).unwrap();
    let first_read = Event::with_flags(d, EventFlags::DISABLE_TIMING).unwrap();
    let own = Stream::with_flags(d, StreamFlags::NON_BLOCKING, 0).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));

    start.wait();
    for round in 0..rounds {
        let rot = (round + 2 * t) % 4;
        let [prod, cons, free, other] = [0, 1, 2, 3].map(|j| &streams[(rot + j) % 4]);
        let (graph2, a2) = producer(d, k, &src[2], &hits);
        let p2 = graph2.instantiate(InstantiateFlags::NONE).unwrap();
        let c2 = consumer(d, k, &a2, &out[2], true);

        spin(k, prod);
        p0.launch(prod).unwrap();
        p1.launch(prod).unwrap();
        p2.launch(prod).unwrap();
        p3.launch(prod).unwrap();

        c0.launch(cons).unwrap();
        first_read.record(cons).unwrap();
        if rng.next() % 4 == 0 {
            // A use on the per-thread default stream before the free.
            copy_out(k, &BorrowedStream::per_thread(d), &out[0], &a0);
        }
        a0.free_async(free).unwrap();

        spin(k, cons);
        copy_out(k, cons, &out[1], &a1);
        f1.launch(free).unwrap();

        c2.launch(cons).unwrap();
        // RAII drops while in flight, in a random order.
        match rng.next() % 3 {
            0 => drop((c2, p2, graph2, a2)),
            1 => drop((a2, graph2, p2, c2)),
            _ => {
                // Dropped on another thread.
                std::thread::spawn(move || drop((p2, c2, a2, graph2)))
                    .join()
                    .unwrap();
            }
        }

        c3a.launch(cons).unwrap();
        p3.launch(free).unwrap();
        c3b.launch(other).unwrap();

        q.launch(free).unwrap();
        let _ = first_read.is_complete().unwrap();
        for (o, p) in out.iter().zip(&probes) {
            copy_out(k, free, o, p);
        }

        // Extras.
        match rng.next() % 6 {
            0 => {
                // A stream allocation used on another stream, dropped at once.
                let sa = StreamAllocation::new(other, BYTES).unwrap();
                let args = KernelArgs::new().ptr(&sa).value(WORDS).value(1u32);
                // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (sa, WORDS, 1): `sa` has BYTES
                // (WORDS values); passed with `ptr`, the launch is ordered after its allocation
                // on `other`, and its free after the launch.
                unsafe { k.fill.launch(prod, cfg(), &args) }.unwrap();
                drop(sa);
            }
            1 => {
                // A memset/memcpy/event graph over a buffer, dropped while in flight.
                let buf = DeviceBuffer::<u32>::zeroed(d, WORDS as usize).unwrap();
                let ev = Event::new(d).unwrap();
                let mut g = Graph::new(d).unwrap();
                let m = g.add_memset_node(&[], &buf, 3, WORDS as usize).unwrap();
                let c = g.add_memcpy_node(&[m], &out[0], &buf, BYTES).unwrap();
                g.add_event_record_node(&[c], &ev).unwrap();
                let x = g.instantiate(InstantiateFlags::NONE).unwrap();
                x.launch(other).unwrap();
                drop(g);
                drop(buf);
                drop(ev);
                drop(x);
            }
            2 => {
                // Events across streams.
                let ev = Event::with_flags(d, EventFlags::DISABLE_TIMING).unwrap();
                ev.record(prod).unwrap();
                other.wait_event(&ev).unwrap();
                drop(ev);
            }
            3 => {
                // A capture on this thread's own stream.
                let _serial = CAPTURE_LOCK.lock().unwrap();
                let mode = if rng.next() % 2 == 0 {
                    CaptureMode::Global
                } else {
                    CaptureMode::ThreadLocal
                };
                let (g, ()) = capture(&own, mode, |cap| {
                    let p = cap.malloc_async(BYTES)?;
                    let args = KernelArgs::new().ptr(&p).value(WORDS).value(9u32);
                    // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (p, WORDS, 9): `p` has BYTES
                    // (WORDS values), allocated earlier in this capture.
                    unsafe { cap.launch(&k.fill, cfg(), &args)? };
                    let args = KernelArgs::new().ptr(&out[1]).ptr(&p).value(WORDS);
                    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (out[1], p, WORDS):
                    // `out[1]` holds WORDS values, `p` as above, freed only after this node.
                    unsafe { cap.launch(&k.copy, cfg(), &args)? };
                    cap.free_async(&p)
                })
                .unwrap();
                let x = g.instantiate(InstantiateFlags::NONE).unwrap();
                drop(g);
                x.launch(&own).unwrap();
                drop(x);
            }
            4 => {
                flush_deferred();
                let _ = d.drop_errors();
                let _ = d.graph_mem_info().unwrap();
            }
            _ => {
                d.graph_mem_trim().unwrap();
            }
        }

        for s in streams {
            s.synchronize().unwrap();
        }
        own.synchronize().unwrap();
        for p in &probes {
            p.free_async(free).unwrap();
        }
    }
    for s in streams {
        s.synchronize().unwrap();
    }
    // Leave a0..a3 live (escaping): their RAII frees run at drop.
    drop((p0, p1, p3, c0, c3a, c3b, f1, q));
    drop((graph0, graph1, graph3, freer, probe_graph));
    drop((a0, a1, a3));
    drop(own);
}

fn stress_body() {
    let rounds: usize = std::env::var("HUNT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let d = Device::get(0).unwrap();
    let module = Module::from_ptx(&d, cuda_graph::kernels::PTX).unwrap();
    let k = K {
        copy: module.function("copy_u32").unwrap(),
        add: module.function("add_u32").unwrap(),
        fill: module.function("fill_u32").unwrap(),
        spin: module.function("spin_then_fill_u32").unwrap(),
        _module: module.clone(),
    };
    drop(module);
    let live_start = live_objects();
    let streams = [(); 4].map(|()| Stream::with_flags(&d, StreamFlags::NON_BLOCKING, 0).unwrap());
    let start = Barrier::new(2);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let flusher = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                flush_deferred();
                let _ = d.drop_errors();
                let _ = live_objects();
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (d, k, streams, start) = (&d, &k, &streams, &start);
                scope.spawn(move || worker(d, k, streams, t, rounds, start))
            })
            .collect();
        for w in workers {
            w.join().expect("a worker panicked");
        }
        stop.store(true, Ordering::Relaxed);
        flusher.join().unwrap();
    });
    drop(streams);
    // Settle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        d.synchronize().unwrap();
        let queued = flush_deferred();
        if (live_objects() == live_start && queued == 0) || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    d.graph_mem_trim().unwrap();
    d.synchronize().unwrap();
    let errors = d.drop_errors();
    println!("live at end: {}", live_objects());
    println!("drop errors: {errors:?}");
    let n = hunt_errors();
    assert_eq!(n, 0, "the stub reported {n} errors (HUNT ERROR lines)");
    assert_eq!(errors.count, 0, "drop errors: {errors:?}");
    assert_eq!(live_objects(), live_start, "objects left");
}

fn sanity_body() {
    let d = Device::get(0).unwrap();
    let module = Module::from_ptx(&d, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let s = Stream::new(&d).unwrap();
    let mut g = Graph::new(&d).unwrap();
    let (n, a) = g
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
        .unwrap();
    // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (a, WORDS, 1): `a` has BYTES (WORDS values),
    // allocated by `n`, which the node depends on.
    unsafe {
        g.add_kernel_node(
            &[n],
            &fill,
            cfg(),
            &KernelArgs::new().ptr(&a).value(WORDS).value(1u32),
        )
    }
    .unwrap();
    let x = g.instantiate(InstantiateFlags::NONE).unwrap();
    x.launch(&s).unwrap();
    a.free_async(&s).unwrap();
    let before = hunt_errors();
    // SAFETY: `s` is a live stream. The address was freed just above: a second free, the misuse
    // under test, which the driver of this process (the stub, loaded by `isolated` before the
    // first driver call) only looks up in its registry and reports; no device memory exists.
    unsafe {
        let _ = cuda_graph::sys::cuMemFreeAsync(a.ptr(), s.as_raw());
    }
    s.synchronize().unwrap();
    // A kernel on freed memory.
    let p = a.ptr();
    // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (p, WORDS, 1), matching in number, order and
    // type. `p` is freed: the misuse under test. The stub runs no kernel code, it only checks
    // the address when the launch runs and reports it, so nothing accesses it.
    unsafe {
        fill.launch(
            &s,
            cfg(),
            &KernelArgs::new().value(p).value(WORDS).value(1u32),
        )
    }
    .unwrap();
    s.synchronize().unwrap();
    let ev = Event::new(&d).unwrap();
    let raw = ev.as_raw();
    drop(ev);
    flush_deferred();
    // SAFETY: `s` is a live stream. `raw` names a destroyed event, the misuse under test: the
    // stub looks the handle up in its registry (never dereferencing it) and reports it.
    unsafe {
        let _ = cuda_graph::sys::cuEventRecord(raw, s.as_raw());
    }
    let after = hunt_errors();
    assert_eq!(after - before, 3, "three errors reported");
}

/// What one thread of the fault-injection stress works with, every round.
#[derive(Clone, Copy)]
struct FaultThread<'a> {
    d: &'a Device,
    k: &'a K,
    streams: &'a [Stream; 4],
    /// The thread's own stream, for captures.
    own: &'a Stream,
    /// Four buffers of WORDS values.
    out: &'a [DeviceBuffer<u32>],
    /// The thread's index.
    t: usize,
}

/// One round of the fault-injection stress: everything may fail (HUNT_FAIL_PM); errors end the
/// round early, dropping what was made so far.
#[allow(clippy::too_many_lines)]
fn fault_round(
    thread: FaultThread<'_>,
    persistent: &mut Option<(ExecGraph, GraphAllocation, Graph)>,
    round: usize,
    rng: &mut Rng,
) -> cuda_graph::Result<()> {
    let FaultThread {
        d,
        k,
        streams,
        own,
        out,
        t,
    } = thread;
    let rot = (round + 2 * t) % 4;
    let [prod, cons, free, other] = [0, 1, 2, 3].map(|j| &streams[(rot + j) % 4]);
    let hits = Arc::new(AtomicUsize::new(0));
    // Producer / consumer / freer, made this round.
    let mut g = Graph::new(d)?;
    let (n, a) = g.add_mem_alloc_node(&[], &AllocParams::new(d, BYTES))?;
    // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (a, WORDS, 1): `a` has BYTES (WORDS values),
    // allocated by `n`, which the node depends on.
    let n2 = unsafe {
        g.add_kernel_node(
            &[n],
            &k.fill,
            cfg(),
            &KernelArgs::new().ptr(&a).value(WORDS).value(1u32),
        )
    }?;
    let h = hits.clone();
    g.add_host_node(&[n2], move || {
        h.fetch_add(1, Ordering::Relaxed);
    })?;
    let flags = if rng.next() % 2 == 0 {
        InstantiateFlags::AUTO_FREE_ON_LAUNCH
    } else {
        InstantiateFlags::NONE
    };
    let p = g.instantiate(flags)?;
    let mut cg = Graph::new(d)?;
    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (out[0], a, WORDS): `out[0]` holds
    // WORDS values, `a` has BYTES (WORDS values); the crate checks at each launch that `a` is
    // live and orders the launch after the one that allocated it.
    unsafe {
        cg.add_kernel_node(
            &[],
            &k.copy,
            cfg(),
            &KernelArgs::new().ptr(&out[0]).ptr(&a).value(WORDS),
        )
    }?;
    let c = cg.instantiate(InstantiateFlags::NONE)?;
    let mut fg = Graph::new(d)?;
    fg.add_mem_free_node(&[], &a)?;
    let f = fg.instantiate(InstantiateFlags::NONE)?;
    spin_res(k, prod)?;
    p.launch(prod)?;
    if flags == InstantiateFlags::AUTO_FREE_ON_LAUNCH && rng.next() % 2 == 0 {
        c.launch(cons)?;
        p.launch(other)?;
    }
    c.launch(cons)?;
    copy_out_res(k, other, &out[1], &a)?;
    match rng.next() % 4 {
        0 => a.free_async(free)?,
        1 => f.launch(free)?,
        2 => {} // RAII
        _ => {
            drop(p);
            drop(g);
        }
    }
    // Persistent AutoFree graph relaunched across streams.
    if persistent.is_none() {
        let mut pg = Graph::new(d)?;
        let (n, pa) = pg.add_mem_alloc_node(&[], &AllocParams::new(d, BYTES))?;
        // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (pa, WORDS, 2): `pa` has BYTES (WORDS
        // values), allocated by `n`, which the node depends on.
        unsafe {
            pg.add_kernel_node(
                &[n],
                &k.fill,
                cfg(),
                &KernelArgs::new().ptr(&pa).value(WORDS).value(2u32),
            )
        }?;
        let px = pg.instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)?;
        *persistent = Some((px, pa, pg));
    }
    if let Some((px, pa, _)) = persistent.as_ref() {
        px.launch(other)?;
        copy_out_res(k, cons, &out[2], pa)?;
        if rng.next() % 8 == 0 {
            pa.free_async(free)?;
        }
    }
    match rng.next() % 5 {
        0 => {
            let sa = StreamAllocation::new(other, BYTES)?;
            let args = KernelArgs::new().ptr(&sa).value(WORDS).value(1u32);
            // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (sa, WORDS, 1): `sa` has BYTES (WORDS
            // values); passed with `ptr`, the launch is ordered after its allocation on `other`,
            // and its free after the launch.
            unsafe { k.fill.launch(prod, cfg(), &args) }?;
            if rng.next() % 2 == 0 {
                sa.free_async()?;
            }
        }
        1 => {
            let _serial = CAPTURE_LOCK.lock().unwrap();
            let mode = if rng.next() % 2 == 0 {
                CaptureMode::Global
            } else {
                CaptureMode::ThreadLocal
            };
            let (cg, ()) = capture(own, mode, |cap| {
                let p = cap.malloc_async(BYTES)?;
                let args = KernelArgs::new().ptr(&p).value(WORDS).value(9u32);
                // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (p, WORDS, 9): `p` has BYTES
                // (WORDS values), allocated earlier in this capture.
                unsafe { cap.launch(&k.fill, cfg(), &args)? };
                // A value dropped inside the capture: its release is put off.
                drop(DeviceBuffer::<u32>::zeroed(d, 4));
                if rng.next() % 2 == 0 {
                    cap.free_async(&p)
                } else {
                    Ok(())
                }
            })?;
            let x = cg.instantiate(InstantiateFlags::NONE)?;
            x.launch(own)?;
        }
        2 => {
            let buf = DeviceBuffer::<u32>::zeroed(d, WORDS as usize)?;
            let ev = Event::new(d)?;
            let mut g = Graph::new(d)?;
            let m = g.add_memset_node(&[], &buf, 3, WORDS as usize)?;
            let c = g.add_memcpy_node(&[m], &out[3], &buf, BYTES)?;
            g.add_event_record_node(&[c], &ev)?;
            let x = g.instantiate(InstantiateFlags::NONE)?;
            x.launch(other)?;
        }
        3 => {
            flush_deferred();
            let _ = d.drop_errors();
            d.graph_mem_trim()?;
        }
        _ => {
            let ev = Event::with_flags(d, EventFlags::DISABLE_TIMING)?;
            ev.record(prod)?;
            other.wait_event(&ev)?;
            let _ = ev.is_complete();
        }
    }
    Ok(())
}

fn spin_res(k: &K, s: &impl AsStream) -> cuda_graph::Result<()> {
    let args = KernelArgs::new()
        .value(0u64)
        .value(0u64)
        .value(0u32)
        .value(1000u64);
    // SAFETY: spin_then_fill_u32(u32* p, u64 n, u32 v, u64 cycles) gets (null, 0, 0, 1000),
    // matching in number, order and type; with n = 0 it writes nothing.
    unsafe { k.spin.launch(s, cfg(), &args) }
}

fn copy_out_res(
    k: &K,
    s: &impl AsStream,
    out: &DeviceBuffer<u32>,
    a: &GraphAllocation,
) -> cuda_graph::Result<()> {
    let args = KernelArgs::new().ptr(out).ptr(a).value(WORDS);
    // SAFETY: copy_u32(u32* dst, const u32* src, u64 n) gets (out, a, WORDS): `out` holds WORDS
    // values, `a` has BYTES (WORDS values); passed with `ptr`, `a` is checked live and ordered
    // after the launch that allocated it.
    unsafe { k.copy.launch(s, cfg(), &args) }
}

fn faults_body() {
    let rounds: usize = std::env::var("HUNT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // Setup may fail too: retry.
    let d = loop {
        if let Ok(d) = Device::get(0) {
            break d;
        }
    };
    let (k, streams) = loop {
        let made = (|| -> cuda_graph::Result<(K, [Stream; 4])> {
            let module = Module::from_ptx(&d, cuda_graph::kernels::PTX)?;
            let k = K {
                copy: module.function("copy_u32")?,
                add: module.function("add_u32")?,
                fill: module.function("fill_u32")?,
                spin: module.function("spin_then_fill_u32")?,
                _module: module.clone(),
            };
            let s = [
                Stream::new(&d)?,
                Stream::new(&d)?,
                Stream::new(&d)?,
                Stream::new(&d)?,
            ];
            Ok((k, s))
        })();
        if let Ok(m) = made {
            break m;
        }
    };
    let errors = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (d, k, streams, errors) = (&d, &k, &streams, &errors);
            scope.spawn(move || {
                let own = loop {
                    if let Ok(s) = Stream::new(d) {
                        break s;
                    }
                };
                let out: Vec<DeviceBuffer<u32>> = (0..4)
                    .map(|_| {
                        loop {
                            if let Ok(b) = DeviceBuffer::<u32>::zeroed(d, WORDS as usize) {
                                break b;
                            }
                        }
                    })
                    .collect();
                let mut rng = Rng(0x1234_5678 ^ ((t as u64 + 1) * 0x9E37));
                let thread = FaultThread {
                    d,
                    k,
                    streams,
                    own: &own,
                    out: &out,
                    t,
                };
                let mut persistent = None;
                for round in 0..rounds {
                    if fault_round(thread, &mut persistent, round, &mut rng).is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if round % 17 == 0 {
                        persistent = None;
                    }
                    for s in streams {
                        let _ = s.synchronize();
                    }
                }
            });
        }
    });
    drop(streams);
    for _ in 0..200 {
        let _ = d.synchronize();
        flush_deferred();
    }
    println!(
        "rounds ended by an error: {}; drop errors: {:?}; live: {}",
        errors.load(Ordering::Relaxed),
        d.drop_errors().count,
        live_objects()
    );
    let n = hunt_errors();
    assert_eq!(n, 0, "the stub reported {n} errors (HUNT ERROR lines)");
}

/// Work in flight when the process exits: graphs launched and every handle dropped, then the
/// test returns (HUNT_EXIT_PANIC=1: panics instead, as a failing GPU test does). With
/// HUNT_TEARDOWN=1 and a long HUNT_DELAY_US the stub reports CUDA calls made during its
/// exit-time teardown.
fn exit_body() {
    let d = Device::get(0).unwrap();
    let module = Module::from_ptx(&d, cuda_graph::kernels::PTX).unwrap();
    let fill = module.function("fill_u32").unwrap();
    let s = Stream::new(&d).unwrap();
    for _ in 0..4 {
        let mut g = Graph::new(&d).unwrap();
        let (n, a) = g
            .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
            .unwrap();
        // SAFETY: fill_u32(u32* p, u64 n, u32 v) gets (a, WORDS, 1): `a` has BYTES (WORDS
        // values), allocated by `n`, which the node depends on.
        unsafe {
            g.add_kernel_node(
                &[n],
                &fill,
                cfg(),
                &KernelArgs::new().ptr(&a).value(WORDS).value(1u32),
            )
        }
        .unwrap();
        let x = g.instantiate(InstantiateFlags::NONE).unwrap();
        x.launch(&s).unwrap();
        drop((x, g, a));
    }
    drop((fill, module, s));
    println!("hunt_exit: returning with work in flight");
    if std::env::var("HUNT_EXIT_PANIC").as_deref() == Ok("1") {
        panic!("a failing test");
    }
}

/// The stub's checks work. In a child, a raw second `cuMemFreeAsync` of a freed graph
/// allocation, a `fill_u32` launch on that freed address and a raw `cuEventRecord` of a
/// destroyed event raise the stub's error count (`hunt_errors()`) by exactly 3, asserted there;
/// here: the child exited successfully, and its output holds exactly 3 `HUNT ERROR` lines.
#[test]
fn stub_reports_misuse() {
    let Some((ok, out)) = isolated("stub_reports_misuse", &[], sanity_body) else {
        return;
    };
    assert!(ok, "the control failed:\n{out}");
    assert_eq!(out.matches("HUNT ERROR").count(), 3, "{out}");
}

/// Two threads on four shared streams (see the module docs), the stub delaying each work item by
/// 50 µs, while a third thread flushes deferred releases. Asserted in the child: every call
/// succeeds (none is expected to fail), the stub reported no `HUNT ERROR`, the device recorded
/// no drop error, and `live_objects()` is back to its count before the streams were made; here:
/// the child exited successfully within 120 s.
#[test]
fn two_threads_four_streams_misuse_nothing() {
    let Some((ok, out)) = isolated(
        "two_threads_four_streams_misuse_nothing",
        &[("HUNT_DELAY_US", "50")],
        stress_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// The same kind of work, two threads on four shared streams, with about one in 200 of the
/// stub's checked driver calls failing with `CUDA_ERROR_OUT_OF_MEMORY` (`HUNT_FAIL_PM=5`), so
/// that the safe layer's error paths run. Asserted in the child: the stub reported no `HUNT
/// ERROR` (rounds ended by an error, drop errors and live objects are printed, not checked);
/// here: the child exited successfully within 120 s.
#[test]
fn injected_driver_failures_misuse_nothing() {
    let Some((ok, out)) = isolated(
        "injected_driver_failures_misuse_nothing",
        &[("HUNT_FAIL_PM", "5"), ("HUNT_DELAY_US", "30")],
        faults_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// The same fault-injection stress under the stub's stream-order check (`HUNT_ORDER=1`): no
/// stream-ordered free is queued unordered after work on another stream that uses its memory,
/// on the error paths too. Before stream allocations' uses that failed to be recorded were
/// waited for (`tests/attack_new.rs`, `failed_use_record_still_orders_a_stream_allocation_free`),
/// about one run in three reported such a free.
#[test]
fn injected_driver_failures_keep_stream_order() {
    let Some((ok, out)) = isolated(
        "injected_driver_failures_keep_stream_order",
        &[
            ("HUNT_FAIL_PM", "5"),
            ("HUNT_DELAY_US", "30"),
            ("HUNT_ORDER", "1"),
        ],
        faults_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// The process exits while launches are in flight and every handle is dropped, once after the
/// test body returns and once after it panics (`HUNT_EXIT_PANIC`): as the work completes during
/// the stub's exit-time teardown (`HUNT_TEARDOWN=1`, 40 ms per work item), the stub runs the
/// user objects' destructors, which queue releases for the crate's release thread. For each of
/// the two children, whatever its exit status, asserted: its output holds the stub's
/// `HUNT: teardown over` line, reporting `0 calls` arrived during the teardown.
///
/// Guards the crate's exit handler (`cuda-graph/src/deferred.rs`), which stops releases at
/// process exit: without it the release thread calls the driver during its teardown (stream
/// creations, frees, destroys, a module unload), and this test fails.
#[test]
fn no_driver_call_from_the_release_thread_during_exit_teardown() {
    for panic in ["0", "1"] {
        let Some((_, out)) = isolated(
            "no_driver_call_from_the_release_thread_during_exit_teardown",
            &[
                ("HUNT_TEARDOWN", "1"),
                ("HUNT_DELAY_US", "40000"),
                ("HUNT_EXIT_PANIC", panic),
            ],
            exit_body,
        ) else {
            return;
        };
        assert!(
            out.contains("HUNT: teardown over"),
            "the stub's teardown ran:\n{out}"
        );
        assert!(
            out.contains("teardown over: 0 calls"),
            "driver calls during the exit teardown (panic: {panic}):\n{out}"
        );
    }
}

/// The region checks of `Graph::add_memset_node_2d`, against the checking stub: regions that
/// fit (1-D of each element size, 2-D with a pitch, the last row ending at the target's end)
/// become memset nodes; an empty region, a pitch shorter than a row, a region one row or one
/// element too long, and sizes whose byte counts overflow are refused by name before the
/// driver, and the stub reports no misuse.
fn memset_body() {
    let device = Device::get(0).unwrap();
    let image = DeviceBuffer::<u8>::zeroed(&device, 64 * 48).unwrap();
    let mut graph = Graph::new(&device).unwrap();
    let fits: [(&str, cuda_graph::Result<cuda_graph::Node>); 4] = [
        (
            "u8, 1-D, whole",
            graph.add_memset_node_2d(&[], &image, 0xABu8, 64 * 48, 1, 0),
        ),
        (
            "u16, 1-D, whole",
            graph.add_memset_node_2d(&[], &image, 0xABCDu16, 32 * 48, 1, 0),
        ),
        (
            "u32, 2-D, left half",
            graph.add_memset_node_2d(&[], &image, 7u32, 8, 48, 64),
        ),
        (
            "u8, 2-D, last row ends at the end",
            graph.add_memset_node_2d(&[], &image, 1u8, 64, 48, 64),
        ),
    ];
    for (what, node) in fits {
        let node = node.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            graph.node(node).unwrap().kind(),
            cuda_graph::NodeKind::Memset,
            "{what}"
        );
    }
    let refused: [(&str, cuda_graph::Result<cuda_graph::Node>); 7] = [
        (
            "empty width",
            graph.add_memset_node_2d(&[], &image, 0u8, 0, 1, 0),
        ),
        (
            "empty height",
            graph.add_memset_node_2d(&[], &image, 0u8, 1, 0, 64),
        ),
        (
            "pitch shorter than a row",
            graph.add_memset_node_2d(&[], &image, 0u16, 33, 2, 64),
        ),
        (
            "one row too many",
            graph.add_memset_node_2d(&[], &image, 0u8, 64, 49, 64),
        ),
        (
            "one element too many",
            graph.add_memset_node_2d(&[], &image, 0u16, 32 * 48 + 1, 1, 0),
        ),
        (
            "width overflows",
            graph.add_memset_node_2d(&[], &image, 0u32, usize::MAX / 4 + 2, 1, 0),
        ),
        (
            "pitch overflows",
            graph.add_memset_node_2d(&[], &image, 0u8, 1, 3, usize::MAX / 2 + 1),
        ),
    ];
    for (what, result) in refused {
        match result {
            Err(cuda_graph::Error::InvalidArgument { call, reason }) => {
                assert_eq!(call, "cuGraphAddMemsetNode", "{what}");
                println!("{what}: refused: {reason}");
            }
            other => panic!("{what}: not refused by name: {other:?}"),
        }
    }
    assert_eq!(graph.nodes().len(), 4, "a refused memset left a node");
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn memset_regions_are_checked_before_the_driver() {
    let Some((ok, out)) = isolated(
        "memset_regions_are_checked_before_the_driver",
        &[],
        memset_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// Stream-ordered memsets and copies (`StreamMemOps`) and their captured forms
/// (`Capture::memset_async`, `Capture::memcpy_async`), against the checking stub: on device
/// buffers and a live graph allocation they reach the driver with the memory live (the stub,
/// which runs work in the order it was queued, reports no use of freed memory; cross-stream
/// order is the GPU test's, `safe_outside`); a graph allocation that is not live is refused by
/// name, with nothing queued; overlapping and oversized copies and empty or oversized memsets are refused
/// before the driver; captured, they become memset and memcpy nodes that record their uses of a
/// graph allocation, and the captured graph passes the lifetime check; on a stream that
/// captures without the guard, a graph allocation operand is refused.
fn transfers_body() {
    use cuda_graph::{Error, NodeKind, StreamMemOps};
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let a = DeviceBuffer::<u32>::zeroed(&d, WORDS as usize).unwrap();
    let b = DeviceBuffer::<u32>::zeroed(&d, WORDS as usize).unwrap();
    s.memset_async(&a, 7u32, WORDS as usize).unwrap();
    s.memset_async(&a, 1u8, BYTES).unwrap();
    s.memset_async(&a, 2u16, BYTES / 2).unwrap();
    s.memcpy_async(&b, &a, BYTES).unwrap();

    // A graph allocation: refused before its launch, used after it, refused after its free.
    let mut g = Graph::new(&d).unwrap();
    let (_, x) = g
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
        .unwrap();
    let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    let refused = s.memcpy_async(&b, &x, BYTES);
    assert!(
        matches!(&refused, Err(Error::NotLive { call, allocation }) if *call == "StreamMemOps::memcpy_async" && allocation.id == x.id()),
        "{refused:?}"
    );
    exec.launch(&s).unwrap();
    s.memset_async(&x, 3u32, WORDS as usize).unwrap();
    s.memcpy_async(&b, &x, BYTES).unwrap();
    x.free_async(&s).unwrap();
    let refused = s.memset_async(&x, 0u8, 1);
    assert!(
        matches!(&refused, Err(Error::NotLive { .. })),
        "{refused:?}"
    );

    // Checked before the driver.
    for (what, result) in [
        ("empty memset", s.memset_async(&a, 0u32, 0)),
        (
            "memset past the end",
            s.memset_async(&a, 0u16, BYTES / 2 + 1),
        ),
        (
            "memset count overflows",
            s.memset_async(&a, 0u32, usize::MAX / 2),
        ),
        ("empty copy", s.memcpy_async(&b, &a, 0)),
        ("copy past the end", s.memcpy_async(&b, &a, BYTES + 1)),
        ("copy onto itself", s.memcpy_async(&a, &a, 4)),
    ] {
        assert!(
            matches!(&result, Err(Error::InvalidArgument { .. })),
            "{what}: {result:?}"
        );
    }

    // Captured: nodes with their uses; the graph passes the check.
    let c = Stream::new(&d).unwrap();
    let (graph, y) = capture(&c, CaptureMode::Global, |cap| {
        let y = cap.malloc_async(BYTES)?;
        cap.memset_async(&y, 9u32, WORDS as usize)?;
        cap.memcpy_async(&b, &y, BYTES)?;
        assert!(
            matches!(c.memset_async(&y, 0u32, 1), Err(Error::Capturing { .. })),
            "a graph allocation through StreamMemOps on a capturing stream"
        );
        c.memset_async(&a, 5u32, 1)?; // no graph allocation: captured, kept by the graph
        cap.free_async(&y)?;
        Ok(y)
    })
    .unwrap();
    let kinds: Vec<&NodeKind> = graph.nodes().iter().map(|n| n.kind()).collect();
    assert_eq!(
        kinds,
        [
            &NodeKind::MemAlloc,
            &NodeKind::Memset,
            &NodeKind::Memcpy,
            &NodeKind::Memset,
            &NodeKind::MemFree
        ],
        "{kinds:?}"
    );
    for i in [1, 2] {
        assert!(
            graph
                .record()
                .allocations_of(&graph.nodes()[i], cuda_graph::MemRole::Use)
                .any(|u| u.same(&y)),
            "node {i} records its use of the allocation"
        );
    }
    graph.check().unwrap();
    let captured = graph.instantiate(InstantiateFlags::NONE).unwrap();
    captured.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop((captured, graph, exec, g, x, y, a, b));
    flush_deferred();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn memsets_and_copies_on_streams_and_in_captures() {
    let Some((ok, out)) = isolated(
        "memsets_and_copies_on_streams_and_in_captures",
        &[],
        transfers_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// `GraphAllocation::free` against the checking stub, which runs all work in the order it was
/// queued (so it checks what the crate hands the driver, not cross-stream order: the GPU test
/// `soundness::sync_free_waits_for_a_queued_consumer` does that): after a launch that allocates
/// and a memset queued on another stream that uses the allocation, `free` frees it once (the
/// stub reports no misuse) and it is no longer live; a second `free` is refused by name; during
/// a `Global` capture of this crate `free` is refused by name and frees nothing.
fn sync_free_body() {
    use cuda_graph::{Error, StreamMemOps};
    let d = Device::get(0).unwrap();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mut g = Graph::new(&d).unwrap();
    let (_, x) = g
        .add_mem_alloc_node(&[], &AllocParams::new(&d, BYTES))
        .unwrap();
    let exec = g.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s1).unwrap();
    s2.memset_async(&x, 1u32, WORDS as usize).unwrap();

    let c = Stream::new(&d).unwrap();
    let refused = capture(&c, CaptureMode::Global, |_| Ok(x.free()))
        .unwrap()
        .1;
    assert!(
        matches!(&refused, Err(Error::Capturing { call, .. }) if *call == "GraphAllocation::free"),
        "{refused:?}"
    );
    assert!(x.is_live(), "the refused free freed nothing");

    x.free().unwrap();
    assert!(!x.is_live());
    let again = x.free();
    assert!(
        matches!(&again, Err(Error::NotLive { call, .. }) if *call == "GraphAllocation::free"),
        "{again:?}"
    );
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    drop((exec, g, x));
    flush_deferred();
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn sync_free_waits_for_every_use() {
    let Some((ok, out)) = isolated(
        "sync_free_waits_for_every_use",
        &[("HUNT_DELAY_US", "2000")],
        sync_free_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}

/// `Device::from_raw` against the checking stub: the primary context's handle gives back the
/// same device as `Device::get(0)`, and the thread's current context is as it was; another
/// context of the device is refused by name; the stub reports no misuse.
fn from_raw_body() {
    use cuda_graph::Error;
    let d = Device::get(0).unwrap();
    let primary = d.context_raw();
    // SAFETY: the primary context is retained by `d`.
    let adopted = unsafe { Device::from_raw(primary) }.unwrap();
    assert!(adopted.same(&d));
    assert_eq!(adopted.as_raw(), d.as_raw());
    let mut current = std::ptr::null_mut();
    // SAFETY: `current` is a valid out-pointer.
    let code = unsafe { cuda_graph::sys::cuCtxGetCurrent(&mut current) };
    assert_eq!(code, cuda_graph::sys::CUresult::CUDA_SUCCESS);
    assert!(current.is_null(), "from_raw left a context current");
    // A handle the stub takes for a context made with cuCtxCreate.
    let other = 0x77 as cuda_graph::sys::CUcontext;
    // SAFETY: the stub answers for any handle; no driver state is touched.
    let refused = unsafe { Device::from_raw(other) };
    assert!(
        matches!(&refused, Err(Error::InvalidArgument { call, .. }) if *call == "Device::from_raw"),
        "{refused:?}"
    );
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn device_from_raw_adopts_the_primary_context_only() {
    let Some((ok, out)) = isolated(
        "device_from_raw_adopts_the_primary_context_only",
        &[],
        from_raw_body,
    ) else {
        return;
    };
    assert!(ok, "{out}");
}
