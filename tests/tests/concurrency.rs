//! Concurrency: several threads, each with its own stream, building, capturing, instantiating
//! and launching graphs at once, each checking its own output, after which nothing the crate
//! made is left; and an AutoFreeOnLaunch executable graph shared between two threads through a
//! `Mutex` (an `ExecGraph` is `Send` but not `Sync`, so sharing one without a lock does not
//! compile: `tests/compile-fail/`), whose relaunch on one thread's stream must wait for the
//! consumer the other thread queued on its own stream (the crate docs' "Safety model": every
//! free, an AutoFreeOnLaunch relaunch included, waits for every recorded use).
//!
//! Captures here use `CaptureMode::ThreadLocal`: in global mode a capture on one thread makes
//! capture-unsafe calls on every other thread fail (`misuse.rs` shows it), which is the point of
//! global mode, and not what threads that each capture their own work want.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use safe_common::{assert_no_drop_errors, settle};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, Device, DeviceBuffer, Event, EventFlags, ExecGraph,
    Function, Graph, InstantiateFlags, KernelArgs, Module, Stream, StreamFlags, capture,
    live_objects,
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

/// [`THREADS`] threads, each with its own stream, build, capture, instantiate and launch graphs
/// at once ([`worker`]), each launch's output checked by its thread; afterwards the crate's live
/// objects are back to their count at the start, graph memory is released and no driver error
/// was met in `Drop`.
#[test]
#[ignore = "needs a GPU"]
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
    assert_eq!(
        settle(device, live),
        live,
        "objects of the crate still live after every thread's graphs were dropped"
    );
    assert_released(device, "after the threads");
    assert_no_drop_errors(device);
}

/// The value the shared producer's first launch writes; each launch writes one more.
const BASE: u32 = 0x0100_0000;

/// What the two threads of [`relaunch_from_two_threads`] share, behind one lock: the producer's
/// executable graph, how often it was launched, and, for the control, an event after the last
/// consumer.
struct Shared {
    producer: ExecGraph,
    launches: u32,
    consumed: Option<Event>,
}

/// Two threads, each with its own non-blocking stream and its own consumer graph, take turns
/// under one lock: launch the shared producer (an AutoFreeOnLaunch graph whose allocation `y`
/// escapes; each launch writes `BASE` + the number of earlier launches into every word of `y`),
/// then their consumer (a spin of about 1 ms, then `acc += y`). Each relaunch frees the
/// previous launch's `y`, which the other thread's consumer may still be reading on the other
/// stream. With `control`, the test orders each launch after the previous consumer itself (an
/// event); without, only the library does. Returns, per thread, the sum of the values it
/// launched consumers for, and every word of its `acc`.
fn relaunch_from_two_threads(
    g: &safe_common::Gpu,
    axpy: &Function,
    control: bool,
) -> Vec<(u32, Vec<u32>)> {
    const LAUNCHES: usize = 50;
    const CONSUMER_SPIN: u64 = 2_000_000;
    let device = &g.device;
    let src = DeviceBuffer::from_slice(device, &vec![BASE; N as usize]).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let (alloc, y) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("y"))
        .unwrap();
    // SAFETY: copy_u32(unsigned* dst, const unsigned* src, unsigned long long n) and
    // add_u32(unsigned* p, unsigned long long n, unsigned v) over the N values of `y` (after
    // its alloc node) and of `src`; the add after the copy.
    unsafe {
        let copy = graph
            .add_kernel_node(
                &[alloc],
                &g.k.copy,
                config(N),
                &KernelArgs::new().ptr(&y).ptr(&src).value(N),
            )
            .unwrap();
        graph
            .add_kernel_node(
                &[copy],
                &g.k.add,
                config(N),
                &KernelArgs::new().ptr(&src).value(N).value(1u32),
            )
            .unwrap();
    }
    let shared = Mutex::new(Shared {
        producer: graph
            .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
            .unwrap(),
        launches: 0,
        consumed: None,
    });
    let start = Barrier::new(2);
    let results = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (shared, start, y) = (&shared, &start, &y);
                scope.spawn(move || {
                    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
                    let acc = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
                    let mut consumer = Graph::new(device).unwrap();
                    let spin = probe::add_spin_node(
                        &mut consumer,
                        &[],
                        &g.k.spin_then_fill,
                        CONSUMER_SPIN,
                    );
                    // SAFETY: axpy_u32(unsigned* dst, const unsigned* src, unsigned long long
                    // n, unsigned a) over the N values of `acc` and of `y`, live whenever the
                    // consumer is launched (right after the producer).
                    unsafe {
                        consumer.add_kernel_node(
                            &[spin],
                            axpy,
                            config(N),
                            &KernelArgs::new().ptr(&acc).ptr(y).value(N).value(1u32),
                        )
                    }
                    .unwrap();
                    let consumer = consumer.instantiate(InstantiateFlags::NONE).unwrap();
                    let mut sum = 0u32;
                    start.wait();
                    for _ in 0..LAUNCHES {
                        let mut shared = shared.lock().unwrap();
                        if let Some(consumed) = shared.consumed.as_ref().filter(|_| control) {
                            stream.wait_event(consumed).unwrap();
                        }
                        shared.producer.launch(&stream).unwrap();
                        sum = sum.wrapping_add(BASE.wrapping_add(shared.launches));
                        shared.launches += 1;
                        consumer.launch(&stream).unwrap();
                        if control {
                            let consumed =
                                Event::with_flags(device, EventFlags::DISABLE_TIMING).unwrap();
                            consumed.record(&stream).unwrap();
                            shared.consumed = Some(consumed);
                        }
                    }
                    stream.synchronize().unwrap();
                    (sum, acc.to_vec().unwrap())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a launching thread panicked"))
            .collect()
    });
    assert!(y.is_live(), "the last launch left y allocated");
    results
}

/// An AutoFreeOnLaunch executable graph shared by two threads through a `Mutex`: each thread
/// launches it on its own stream and then its own consumer, which spins and then adds every
/// word of the allocation into its accumulator (see [`relaunch_from_two_threads`]). The other
/// thread's relaunch frees and rewrites the allocation: the library must order it after this
/// thread's consumer, so that each consumer adds exactly the value of the launch it follows and
/// each accumulator ends at the sum of those values. A relaunch that does not wait lets the
/// consumer add the next launch's value instead. Control: the same with each launch ordered
/// after the previous consumer by the test (an event).
#[test]
#[ignore = "needs a GPU"]
fn auto_free_relaunch_from_another_thread_waits_for_the_consumer_of_the_previous_launch() {
    let Some(g) =
        gpu("auto_free_relaunch_from_another_thread_waits_for_the_consumer_of_the_previous_launch")
    else {
        return;
    };
    let device = &g.device;
    let module = Module::from_ptx(device, cuda_graph::kernels::PTX).unwrap();
    let axpy = module.function("axpy_u32").unwrap();
    let live = live_objects();
    for control in [true, false] {
        let case = if control {
            "control (each launch after the previous consumer, by the test)"
        } else {
            "ordered by the library only"
        };
        let started = Instant::now();
        let results = relaunch_from_two_threads(&g, &axpy, control);
        println!(
            "{case}: 2 threads × 50 launches in {:.2} s",
            started.elapsed().as_secs_f64()
        );
        for (t, (sum, acc)) in results.iter().enumerate() {
            assert_all(
                acc,
                *sum,
                &format!(
                    "{case}: thread {t}'s accumulator (another value: a consumer read the allocation after the other thread's relaunch rewrote it)"
                ),
            );
        }
    }
    assert_eq!(
        settle(device, live),
        live,
        "objects of the crate still live after the shared graphs were dropped"
    );
    assert_released(device, "after the shared graphs");
    assert_no_drop_errors(device);
}
