//! Concurrency (issue 6, item 3): several threads, each with its own stream, building,
//! capturing, instantiating and launching graphs at once, each checking its own output; and
//! executable graphs shared between two threads through a `Mutex` (an `ExecGraph` is `Send` but
//! not `Sync`, so sharing one without a lock does not compile: `tests/compile-fail/`), whose
//! launches CUDA orders one after another, checked by a non-atomic read-modify-write kernel that
//! would lose updates if two launches overlapped.
//!
//! Captures here use `CaptureMode::ThreadLocal`: in global mode a capture on one thread makes
//! capture-unsafe calls on every other thread fail (`misuse.rs` shows it), which is the point of
//! global mode, and not what threads that each capture their own work want.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`.

mod safe_common;

use std::sync::{Arc, Barrier, Mutex};

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, Function, Graph, InstantiateFlags,
    KernelArgs, Module, Stream, StreamFlags, capture, live_objects,
};
use safe_common::{BYTES, N, assert_all, assert_released, config, gpu};

/// Threads that build and launch graphs at once.
const THREADS: usize = 6;
/// Rounds per thread; each round makes three graphs.
const ROUNDS: usize = 40;

/// `ROUNDS`, or 4 under compute-sanitizer (`ci/sanitize-runner.sh` sets `SANITIZER_TOOL`),
/// where racecheck makes each launch take far longer.
fn rounds() -> usize {
    if std::env::var_os("SANITIZER_TOOL").is_some() {
        4
    } else {
        ROUNDS
    }
}

/// One thread's work: [`rounds`] rounds of an explicit graph (freed in the graph), a captured
/// graph (freed in the capture) and an AutoFreeOnLaunch graph launched twice and freed with
/// `free_async`, all on the thread's own stream, each round's output checked. Returns how many
/// launches it verified.
fn worker(device: &Device, fill: &Function, copy: &Function, id: usize, start: &Barrier) -> usize {
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);
    let mut verified = 0;
    start.wait();
    for round in 0..rounds() {
        let value = (id * 1_000_000 + round * 10) as u32;
        let check = |value: u32, what: &str| {
            stream.synchronize().unwrap();
            assert_all(
                &out.to_vec().unwrap(),
                value,
                &format!("thread {id}, round {round}, {what}"),
            );
        };

        // Explicit, freed in the graph.
        let mut graph = Graph::new(device).unwrap();
        let (alloc, buf) = graph
            .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
            .unwrap();
        // SAFETY: fill_u32 over the N values of `buf`, copy_u32 of them into `out` (N values).
        let last = unsafe {
            let f = graph
                .add_kernel_node(
                    &[alloc],
                    fill,
                    cfg,
                    &KernelArgs::new().ptr(&buf).value(N).value(value + 1),
                )
                .unwrap();
            graph
                .add_kernel_node(
                    &[f],
                    copy,
                    cfg,
                    &KernelArgs::new().ptr(&out).ptr(&buf).value(N),
                )
                .unwrap()
        };
        graph.add_mem_free_node(&[last], &buf).unwrap();
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        check(value + 1, "explicit graph");
        verified += 1;

        // Captured, freed in the capture; launched on another thread than the one that built it
        // would be legal too (`Graph` and `ExecGraph` are `Send`): here it moves to a scoped
        // thread for the launch.
        let (graph, ()) = capture(&stream, CaptureMode::ThreadLocal, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: as above.
            unsafe {
                cap.launch(
                    fill,
                    cfg,
                    &KernelArgs::new().ptr(&buf).value(N).value(value + 2),
                )?;
                cap.launch(copy, cfg, &KernelArgs::new().ptr(&out).ptr(&buf).value(N))?;
            }
            cap.free_async(&buf)
        })
        .unwrap();
        let on = &stream;
        let (exec, graph) = std::thread::scope(|s| {
            s.spawn(move || {
                let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
                exec.launch(on).unwrap();
                (exec, graph)
            })
            .join()
            .unwrap()
        });
        check(value + 2, "captured graph, launched from a helper thread");
        drop((exec, graph));
        verified += 1;

        // AutoFreeOnLaunch, relaunched, then freed with free_async.
        let (graph, buf) = capture(&stream, CaptureMode::ThreadLocal, |cap| {
            let buf = cap.malloc_async(BYTES)?;
            // SAFETY: as above.
            unsafe {
                cap.launch(
                    fill,
                    cfg,
                    &KernelArgs::new().ptr(&buf).value(N).value(value + 3),
                )?;
                cap.launch(copy, cfg, &KernelArgs::new().ptr(&out).ptr(&buf).value(N))?;
            }
            Ok(buf)
        })
        .unwrap();
        let exec = graph
            .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
            .unwrap();
        exec.launch(&stream).unwrap();
        exec.launch(&stream).unwrap();
        check(value + 3, "AutoFreeOnLaunch graph, launched twice");
        buf.free_async(&stream).unwrap();
        verified += 2;
    }
    stream.synchronize().unwrap();
    verified
}

#[test]
fn threads_with_their_own_streams_build_and_launch_graphs_at_once() {
    let Some(g) = gpu("threads_with_their_own_streams_build_and_launch_graphs_at_once") else {
        return;
    };
    let device = &g.device;
    let live = live_objects();
    let start = Barrier::new(THREADS);
    let started = std::time::Instant::now();
    let verified: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|id| {
                let (start, fill, copy) = (&start, &g.k.fill, &g.k.copy);
                s.spawn(move || worker(device, fill, copy, id, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread panicked"))
            .collect()
    });
    println!(
        "{THREADS} threads: {} verified launches ({:?} each) of {} graphs in {:.2} s",
        verified.iter().sum::<usize>(),
        verified,
        THREADS * rounds() * 3,
        started.elapsed().as_secs_f64()
    );
    assert!(verified.iter().all(|&v| v == rounds() * 4));
    assert_eq!(live_objects(), live, "every thread's objects are released");
    assert_released(device, "after the threads");
}

/// Two threads launch one executable graph (alloc X → fill X with 1 after a spin → counter +=
/// X → free X), each on its own stream, `LAUNCHES` times, through an `Arc<Mutex<ExecGraph>>`.
/// CUDA orders launches of one executable graph one after another, whatever their streams
/// (`cuGraphLaunch`: "ordered behind ... any previous launches of hGraphExec"); the lock makes
/// the host side legal. Every counter element ends at 2 × `LAUNCHES`, and the allocation at its
/// fixed address is never used by two launches at once. A second executable graph, with an
/// allocation it does not free and AutoFreeOnLaunch, is shared the same way: its live-state
/// bookkeeping is updated by both threads.
#[test]
fn an_exec_graph_shared_through_a_mutex_is_serialised() {
    const LAUNCHES: usize = 100;
    let Some(g) = gpu("an_exec_graph_shared_through_a_mutex_is_serialised") else {
        return;
    };
    let device = &g.device;
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX).unwrap();
    let axpy = module.function("axpy_u32").unwrap();
    let counter = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let counter2 = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let cfg = config(N);

    // Freed in the graph.
    let mut graph = Graph::new(device).unwrap();
    let (alloc, x) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    // SAFETY: spin_then_fill_u32(p, n, v, spins) over the N values of `x`; axpy_u32(dst, src,
    // n, a) adds them into `counter` (N values); both between the alloc and free nodes.
    let last = unsafe {
        let f = graph
            .add_kernel_node(
                &[alloc],
                &g.k.spin_then_fill,
                cfg,
                &KernelArgs::new()
                    .ptr(&x)
                    .value(N)
                    .value(1u32)
                    .value(20_000u64),
            )
            .unwrap();
        graph
            .add_kernel_node(
                &[f],
                &axpy,
                cfg,
                &KernelArgs::new().ptr(&counter).ptr(&x).value(N).value(1u32),
            )
            .unwrap()
    };
    graph.add_mem_free_node(&[last], &x).unwrap();
    let shared = Arc::new(Mutex::new(
        graph.instantiate(InstantiateFlags::NONE).unwrap(),
    ));

    // Unfreed, AutoFreeOnLaunch.
    let mut graph2 = Graph::new(device).unwrap();
    let (alloc, y) = graph2
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("y"))
        .unwrap();
    // SAFETY: as above, into `counter2`.
    unsafe {
        let f = graph2
            .add_kernel_node(
                &[alloc],
                &g.k.spin_then_fill,
                cfg,
                &KernelArgs::new()
                    .ptr(&y)
                    .value(N)
                    .value(1u32)
                    .value(20_000u64),
            )
            .unwrap();
        graph2
            .add_kernel_node(
                &[f],
                &axpy,
                cfg,
                &KernelArgs::new()
                    .ptr(&counter2)
                    .ptr(&y)
                    .value(N)
                    .value(1u32),
            )
            .unwrap();
    }
    let shared2 = Arc::new(Mutex::new(
        graph2
            .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
            .unwrap(),
    ));

    let start = Arc::new(Barrier::new(2));
    let started = std::time::Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (shared, shared2, start, device) = (
                Arc::clone(&shared),
                Arc::clone(&shared2),
                Arc::clone(&start),
                device.clone(),
            );
            std::thread::spawn(move || {
                let stream = Stream::with_flags(&device, StreamFlags::NON_BLOCKING, 0).unwrap();
                start.wait();
                for _ in 0..LAUNCHES {
                    shared.lock().unwrap().launch(&stream).unwrap();
                    shared2.lock().unwrap().launch(&stream).unwrap();
                }
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a launching thread panicked");
    }
    println!(
        "2 threads × {LAUNCHES} launches of 2 shared executable graphs in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_all(
        &counter.to_vec().unwrap(),
        2 * LAUNCHES as u32,
        "counter of the shared graph (a lost update means two launches overlapped)",
    );
    assert_all(
        &counter2.to_vec().unwrap(),
        2 * LAUNCHES as u32,
        "counter of the shared AutoFreeOnLaunch graph",
    );
    assert!(y.is_live(), "the last launch left y allocated");
    let stream = Stream::new(device).unwrap();
    y.free_async(&stream).unwrap();
    stream.synchronize().unwrap();
    drop((shared, shared2, graph, graph2, x, y));
    assert_released(device, "after the shared graphs");
}
