//! Which driver calls does the crate make on a thread where no CUDA context is current? Only
//! those on a graph's topology (`TOPOLOGY`): every other call makes the device's context
//! current first.
//!
//! On an H200 (driver 580), `cuGraphAddKernelNode` without a current context killed the
//! process (see `context_stub.rs`). Safe code reaches "no context current" by making a value on
//! one thread and using or dropping it on a new one (the crate's handles are `Send`), and the
//! crate's deferred releases run on whatever thread flushes them, or on its own release thread.
//!
//! The driver is the context-tracking variant of `stub-driver/null_cuda.c` (`context_common`):
//! the current context kept per thread, and every driver function other than the init, device
//! and context queries logged with whether a context was current on the calling thread and the
//! thread's name. Stream capture is simulated as in the stub, plus fork/join.
//!
//! Each scenario runs a value made on the main thread (where the context is current) through
//! one API call or drop on a new thread named `fresh`, and prints `AUDIT <step>: <calls>`: the
//! calls made with no context current, as `function@thread` (`cuda-graph-rele` is the crate's
//! release thread), and fails when one of them is not in `TOPOLOGY` (`--nocapture` shows the
//! lists).

#![allow(clippy::undocumented_unsafe_blocks, clippy::missing_panics_doc)]

mod context_common;

use std::fmt::Debug;

use context_common::{BYTES, N, add_fill_node, cfg, not_ready, stub, try_on_fresh};
use cuda_graph::{
    Access, AllocParams, AsStream, BorrowedStream, CaptureMode, ConditionalKind, Device,
    DeviceBuffer, Event, Function, Graph, InstantiateFlags, KernelArgs, ManagedBuffer, MemPool,
    Module, PinnedBuffer, Stream, StreamAllocation, StreamMemOps, capture, flush_deferred,
};

/// The calls allowed where no context is current: a graph and its topology belong to no
/// context. `bench/probe/no_context.cu` found `cuGraphCreate`, `cuGraphAddMemAllocNode`,
/// `cuGraphAddMemFreeNode`, `cuGraphAddEmptyNode` and `cuGraphAddDependencies` succeeding on the
/// H200 (driver 580) with no context current; the others only read the graph's nodes and edges.
/// A kernel node is not among them: `cuGraphAddKernelNode` killed the process there.
const TOPOLOGY: &[&str] = &[
    "cuGraphCreate",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphAddEmptyNode",
    "cuGraphAddDependencies_v2",
    "cuGraphGetNodes",
    "cuGraphGetEdges_v2",
    "cuGraphGetRootNodes",
    "cuGraphNodeGetType",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphNodeGetDependentNodes_v2",
];

/// The calls made with no context current since the log was last taken, as (function, thread),
/// and clears the log.
fn take_log() -> Vec<(String, String)> {
    context_common::take_log()
        .into_iter()
        .filter(|call| !call.ctx)
        .map(|call| (call.name, call.thread))
        .collect()
}

/// Prints `AUDIT <label>: <calls>`, the log deduplicated in order, with counts, and notes
/// the calls outside `TOPOLOGY` (`assert_all_bound` fails on them). The test's own raw
/// `cuGraphDestroy` (a handed-over graph) is not the crate's.
fn report(label: &str) {
    let log = take_log();
    for (function, _) in &log {
        let own =
            label.starts_with("cuGraphDestroy of the raw graph") && function == "cuGraphDestroy";
        if !TOPOLOGY.contains(&function.as_str()) && !own {
            UNBOUND.lock().unwrap().push(format!("{label}: {function}"));
        }
    }
    let mut seen: Vec<((String, String), usize)> = Vec::new();
    for entry in log {
        match seen.iter_mut().find(|(e, _)| *e == entry) {
            Some((_, n)) => *n += 1,
            None => seen.push((entry, 1)),
        }
    }
    let calls: Vec<String> = seen
        .iter()
        .map(|((f, t), n)| {
            if *n > 1 {
                format!("{f}@{t} x{n}")
            } else {
                format!("{f}@{t}")
            }
        })
        .collect();
    let calls = if calls.is_empty() {
        "-".to_string()
    } else {
        calls.join(", ")
    };
    let notes = std::mem::take(&mut *NOTES.lock().unwrap());
    if notes.is_empty() {
        println!("AUDIT {label}: {calls}");
    } else {
        println!("AUDIT {label}: {calls}   [{}]", notes.join("; "));
    }
}

/// Runs `f` on a new thread named `fresh` (no context current), then reports the calls made
/// with no context current since the step began. `None` when `f` panicked.
fn step<T: Send>(label: &str, f: impl FnOnce() -> T + Send) -> Option<T> {
    let _ = take_log();
    let out = try_on_fresh(f);
    // Let the crate's release thread finish what the step woke it for.
    std::thread::sleep(std::time::Duration::from_millis(30));
    if out.is_err() {
        note("the step panicked".into());
    }
    report(label);
    out.ok()
}

/// The calls outside `TOPOLOGY` made with no context current, by step.
static UNBOUND: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Fails when a step made a call outside `TOPOLOGY` with no context current.
fn assert_all_bound() {
    let unbound = std::mem::take(&mut *UNBOUND.lock().unwrap());
    assert!(
        unbound.is_empty(),
        "driver calls made where no context is current:\n{}",
        unbound.join("\n")
    );
}

/// Remarks on the current step, printed with its report.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(text: String) {
    NOTES.lock().unwrap().push(text);
}

/// `r`'s value, or `None` after noting its error.
fn ok<T, E: Debug>(what: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            note(format!("{what}: error {e:?}"));
            None
        }
    }
}

/// Runs the test `name`'s `body` in a child process against the stub and prints its `AUDIT`
/// lines; fails when the child fails (a step made a call outside `TOPOLOGY` with no context
/// current, among others) or runs past 60 s.
fn isolated(name: &str, body: fn()) {
    let body = || {
        body();
        assert_all_bound();
    };
    context_common::isolated(name, body, |line| line.find("AUDIT ").map(|at| &line[at..]));
}

// ------------------------------------------------------------------ explicit graphs

fn explicit_graph_body() {
    let (device, _module, fill) = stub();
    let out = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let event = Event::new(&device).unwrap();
    let mut child = Graph::new(&device).unwrap();
    child.add_empty_node(&[]).unwrap();
    let mut moved = Graph::new(&device).unwrap();
    let (ca, cbuf) = moved
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    moved.add_mem_free_node(&[ca], &cbuf).unwrap();
    let stream = Stream::new(&device).unwrap();

    let mut graph = step("Graph::new", || Graph::new(&device).unwrap()).unwrap();
    let g = &mut graph;
    let (alloc, buf) = step("Graph::add_mem_alloc_node", || {
        g.add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap()
    })
    .unwrap();
    let kernel = step("Graph::add_kernel_node", || unsafe {
        g.add_kernel_node(
            &[alloc],
            &fill,
            cfg(),
            &KernelArgs::new().ptr(&buf).value(N).value(1u32),
        )
        .unwrap()
    })
    .unwrap();
    let memset = step("Graph::add_memset_node", || {
        g.add_memset_node(&[kernel], &buf, 7, N as usize).unwrap()
    })
    .unwrap();
    let memset2 = step("Graph::add_memset_node_2d", || {
        g.add_memset_node_2d(&[memset], &buf, 3u16, 16, 4, 64)
            .unwrap()
    })
    .unwrap();
    let copy = step("Graph::add_memcpy_node", || {
        g.add_memcpy_node(&[memset2], &out, &buf, BYTES).unwrap()
    })
    .unwrap();
    let htod = step("Graph::add_memcpy_node_htod", || {
        g.add_memcpy_node_htod(&[copy], &buf, &pinned, BYTES)
            .unwrap()
    })
    .unwrap();
    let dtoh = step("Graph::add_memcpy_node_dtoh", || {
        g.add_memcpy_node_dtoh(&[htod], &pinned, &buf, BYTES)
            .unwrap()
    })
    .unwrap();
    let empty = step("Graph::add_empty_node", || {
        g.add_empty_node(&[dtoh]).unwrap()
    })
    .unwrap();
    let host = step("Graph::add_host_node", || {
        g.add_host_node(&[empty], || {}).unwrap()
    })
    .unwrap();
    let rec = step("Graph::add_event_record_node", || {
        g.add_event_record_node(&[host], &event).unwrap()
    })
    .unwrap();
    let wait = step("Graph::add_event_wait_node", || {
        g.add_event_wait_node(&[rec], &event).unwrap()
    })
    .unwrap();
    let ch = step("Graph::add_child_graph_node", || {
        let child = child;
        let n = g.add_child_graph_node(&[wait], &child).unwrap();
        drop(child);
        n
    })
    .unwrap();
    #[cfg(cuda_graph_child_move)]
    let ch = step("Graph::add_child_graph_node_moved", || {
        g.add_child_graph_node_moved(&[ch], moved).unwrap()
    })
    .unwrap();
    #[cfg(not(cuda_graph_child_move))]
    drop(moved);
    let cond = step("Graph::add_condition", || g.add_condition(Some(1)).unwrap()).unwrap();
    let fill_ref = &fill;
    let out_ref = &out;
    let conditional = step(
        "Graph::add_conditional_node (If; body: empty + kernel node)",
        || {
            g.add_conditional_node(&[ch], &cond, ConditionalKind::If, |bodies| {
                let e = bodies[0].add_empty_node(&[])?;
                // SAFETY: fill_u32 over `out`; the stub runs nothing.
                unsafe {
                    bodies[0].add_kernel_node(
                        &[e],
                        fill_ref,
                        cfg(),
                        &KernelArgs::new().ptr(out_ref).value(N).value(2u32),
                    )
                }?;
                Ok(())
            })
            .unwrap()
        },
    )
    .unwrap();
    let free = step("Graph::add_mem_free_node", || {
        g.add_mem_free_node(&[conditional], &buf).unwrap()
    })
    .unwrap();
    step("Graph::add_dependency", || {
        g.add_dependency(alloc, free).unwrap();
    });
    step("Graph::set_label / check / to_dot / record", || {
        let g: &mut Graph = &mut *g;
        g.set_label(alloc, "a").unwrap();
        g.check().unwrap();
        let _ = g.to_dot();
        let _ = g.record().nodes().len();
    });
    let dot = std::env::temp_dir().join(format!("context-audit-{}.dot", std::process::id()));
    step("Graph::debug_dot_print", || {
        let g: &mut Graph = &mut *g;
        ok("debug_dot_print", g.debug_dot_print(&dot));
    });
    let _ = std::fs::remove_file(&dot);
    step("Graph::node_type", || {
        let g: &mut Graph = &mut *g;
        ok("node_type", g.node_type(kernel));
    });
    step("Graph::node_params (kernel node)", || {
        let g: &mut Graph = &mut *g;
        ok("node_params", g.node_params(kernel));
    });
    step("Graph::node_params (alloc node)", || {
        let g: &mut Graph = &mut *g;
        ok("node_params", g.node_params(alloc));
    });
    step("Graph::dependencies / dependents", || {
        let g: &mut Graph = &mut *g;
        ok("dependencies", g.dependencies(kernel));
        ok("dependents", g.dependents(kernel));
    });
    step("Graph::root_nodes / driver_nodes", || {
        let g: &mut Graph = &mut *g;
        ok("root_nodes", g.root_nodes());
        ok("driver_nodes", g.driver_nodes());
    });
    let exec = step("Graph::instantiate", || {
        let g: &mut Graph = &mut *g;
        g.instantiate(InstantiateFlags::NONE).unwrap()
    })
    .unwrap();
    drop(exec);
    flush_deferred();
    let s = &stream;
    let exec = step("Graph::instantiate_and_upload", || {
        let g: &mut Graph = &mut *g;
        ok(
            "instantiate_and_upload",
            g.instantiate_and_upload(InstantiateFlags::NONE, s),
        )
    })
    .unwrap();
    drop(exec);
    flush_deferred();
    step("drop Graph (explicit, all node kinds)", move || drop(graph));

    // into_raw and from_raw.
    let mut handed = Graph::new(&device).unwrap();
    let (a, b) = handed
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let k = add_fill_node(&mut handed, &[a], &fill, &b, 1u32);
    handed.add_mem_free_node(&[k], &b).unwrap();
    drop(b);
    let raw = step("Graph::into_raw", move || handed.into_raw() as usize).unwrap();
    step(
        "cuGraphDestroy of the raw graph on a fresh thread (user object destructor)",
        || {
            let _ = unsafe { cuda_graph::sys::cuGraphDestroy(raw as cuda_graph::sys::CUgraph) };
        },
    );
    let mut raw2 = std::ptr::null_mut();
    let _ = unsafe { cuda_graph::sys::cuGraphCreate(&mut raw2, 0) };
    let raw2 = raw2 as usize;
    let from = step("Graph::from_raw", || unsafe {
        Graph::from_raw(raw2 as cuda_graph::sys::CUgraph, &device).unwrap()
    })
    .unwrap();
    step("drop Graph (from_raw)", move || drop(from));
}

#[test]
fn explicit_graphs() {
    isolated("explicit_graphs", explicit_graph_body);
}

// ------------------------------------------------------------------ executable graphs

/// alloc → kernel → free.
fn alloc_kernel_free(device: &Device, fill: &Function) -> (Graph, cuda_graph::Node) {
    let mut graph = Graph::new(device).unwrap();
    let (a, b) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES))
        .unwrap();
    let k = add_fill_node(&mut graph, &[a], fill, &b, 1u32);
    graph.add_mem_free_node(&[k], &b).unwrap();
    (graph, k)
}

/// One kernel node on `buf` (no memory nodes: updatable).
fn kernel_on(
    device: &Device,
    fill: &Function,
    buf: &DeviceBuffer<u32>,
    v: u32,
) -> (Graph, cuda_graph::Node) {
    let mut graph = Graph::new(device).unwrap();
    let k = add_fill_node(&mut graph, &[], fill, buf, v);
    (graph, k)
}

fn exec_graph_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let s = &stream;
    let buf = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();

    // Memory nodes, alloc and free in the graph: the fast launch path.
    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    let exec = step("ExecGraph::launch (owned Stream)", move || {
        ok("launch", exec.launch(s));
        exec
    })
    .unwrap();
    let exec = step("ExecGraph::launch (BorrowedStream::legacy)", || {
        ok("launch", exec.launch(&BorrowedStream::legacy(&device)));
        exec
    })
    .unwrap();
    let exec = step("ExecGraph::upload", move || {
        ok("upload", exec.upload(s));
        exec
    })
    .unwrap();
    step("drop ExecGraph (after launches)", move || drop(exec));
    step("drop Graph (instantiated, launched)", move || drop(graph));

    // Update and kernel parameters.
    let (g1, k1) = kernel_on(&device, &fill, &buf, 1);
    let (g2, _) = kernel_on(&device, &fill, &buf, 2);
    let mut exec = g1.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    let (bufr, fillr) = (&buf, &fill);
    let (exec, g2) = step("ExecGraph::update", move || {
        ok("update", exec.update(&g2));
        (exec, g2)
    })
    .unwrap();
    let (exec, g1) = step("ExecGraph::set_kernel_node_params", move || {
        let mut exec = exec;
        ok("set_kernel_node_params", unsafe {
            exec.set_kernel_node_params(
                &g1,
                k1,
                fillr,
                cfg(),
                &KernelArgs::new().ptr(bufr).value(N).value(3u32),
            )
        });
        (exec, g1)
    })
    .unwrap();
    exec.launch(&stream).unwrap();
    step("drop ExecGraph (updated, launched)", move || drop(exec));
    drop((g1, g2));

    // An allocation that outlives its graph's launch: the checked launch path, and its frees.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
    pexec.launch(&stream).unwrap();
    let mut consumer = Graph::new(&device).unwrap();
    add_fill_node(&mut consumer, &[], &fill, &live, 4u32);
    let cexec = consumer.instantiate(InstantiateFlags::NONE).unwrap();
    let cexec = step(
        "ExecGraph::launch (uses a live allocation of another graph)",
        move || {
            ok("launch", cexec.launch(s));
            cexec
        },
    )
    .unwrap();
    let pexec = step(
        "ExecGraph::launch (relaunch refused: allocation live)",
        move || {
            ok("launch", pexec.launch(s));
            pexec
        },
    )
    .unwrap();
    let live2 = live.clone();
    step("GraphAllocation::free_async", || {
        ok("free_async", live2.free_async(s));
    });
    step("drop ExecGraph (consumer)", move || drop(cexec));
    step("drop ExecGraph (producer)", move || drop(pexec));
    drop((consumer, producer, live, live2));
    flush_deferred();

    // GraphAllocation::free (on the device's private stream), and a drop of a live one.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
    pexec.launch(&stream).unwrap();
    let lr = &live;
    step(
        "GraphAllocation::free (first use of the reaper stream)",
        || {
            ok("free", lr.free());
        },
    );
    pexec.launch(&stream).unwrap();
    drop(pexec);
    drop(producer);
    flush_deferred();
    step("drop GraphAllocation (live, last handle)", move || {
        drop(live)
    });

    // AUTO_FREE_ON_LAUNCH relaunch, on a fresh thread.
    let mut producer = Graph::new(&device).unwrap();
    let (_, live) = producer
        .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
        .unwrap();
    let pexec = producer
        .instantiate(InstantiateFlags::AUTO_FREE_ON_LAUNCH)
        .unwrap();
    pexec.launch(&stream).unwrap();
    let pexec = step(
        "ExecGraph::launch (AUTO_FREE_ON_LAUNCH relaunch)",
        move || {
            ok("launch", pexec.launch(s));
            pexec
        },
    )
    .unwrap();
    drop((pexec, producer));
    flush_deferred();
    step(
        "drop GraphAllocation (live, last handle, reaper exists)",
        move || drop(live),
    );

    // A stream allocation whose last holder is a graph (its handle let go first): the
    // graph's drop frees it on the device's private stream.
    {
        let sa = StreamAllocation::new(&stream, BYTES).unwrap();
        let mut g = Graph::new(&device).unwrap();
        add_fill_node(&mut g, &[], &fill, &sa, 1u32);
        let x = g.instantiate(InstantiateFlags::NONE).unwrap();
        x.launch(&stream).unwrap();
        drop(sa);
        drop(x);
        flush_deferred();
        step(
            "drop Graph (last holder of a StreamAllocation; reaper exists)",
            move || drop(g),
        );
    }

    // Releases that wait for the GPU: run by the crate's release thread.
    drop_exec_while_its_launch_runs(
        &device,
        &fill,
        &BorrowedStream::legacy(&device),
        [
            "drop ExecGraph on main while its launch runs (release thread polls)",
            "... the launch completes (release thread releases)",
        ],
    );
    let stream2 = Stream::new(&device).unwrap();
    drop_exec_while_its_launch_runs(
        &device,
        &fill,
        &stream2,
        [
            "drop ExecGraph on main, launched on an owned Stream still busy",
            "... the stream's work completes (release thread releases)",
        ],
    );
    drop(stream2);
    flush_deferred();
}

/// Launches an executable graph of `alloc_kernel_free` on `stream` and drops it while the
/// launch runs, then lets the launch complete; reports the release thread's calls in between
/// under `labels` (while it polls, once it releases).
fn drop_exec_while_its_launch_runs(
    device: &Device,
    fill: &Function,
    stream: &impl AsStream,
    labels: [&str; 2],
) {
    let (graph, _) = alloc_kernel_free(device, fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(stream).unwrap();
    not_ready(true);
    let _ = take_log();
    drop(exec);
    std::thread::sleep(std::time::Duration::from_millis(50));
    report(labels[0]);
    not_ready(false);
    std::thread::sleep(std::time::Duration::from_millis(100));
    report(labels[1]);
}

#[test]
fn exec_graphs() {
    isolated("exec_graphs", exec_graph_body);
}

// ------------------------------------------------------------------ streams, events, memory

fn objects_body() {
    let (device, module, fill) = stub();
    let d = &device;
    let stream = step("Stream::new", || Stream::new(d).unwrap()).unwrap();
    let s = &stream;
    step("AsStream::synchronize", || {
        ok("synchronize", s.synchronize());
    });
    step("AsStream::stream_id", || {
        ok("stream_id", s.stream_id());
    });
    step("AsStream::capture_status", || {
        ok("capture_status", s.capture_status());
    });
    let event = step("Event::new", || Event::new(d).unwrap()).unwrap();
    let e = &event;
    step("Event::record", || {
        ok("record", e.record(s));
    });
    step("AsStream::wait_event", || {
        ok("wait_event", s.wait_event(e));
    });
    step("Event::synchronize", || {
        ok("synchronize", e.synchronize());
    });
    step("Event::is_complete", || {
        ok("is_complete", e.is_complete());
    });
    let later = Event::new(d).unwrap();
    step("Event::elapsed_since", || {
        ok("elapsed_since", later.elapsed_since(e));
    });
    step("Event::into_raw", move || {
        let _ = later.into_raw();
    });
    step("drop Event", move || drop(event));

    let buf = step("DeviceBuffer::zeroed", || {
        DeviceBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let b = &buf;
    let data = vec![5u32; N as usize];
    let other = step("DeviceBuffer::from_slice", || {
        DeviceBuffer::<u32>::from_slice(d, &data).unwrap()
    })
    .unwrap();
    step("DeviceBuffer::copy_from", || {
        ok("copy_from", b.copy_from(&data));
    });
    step("DeviceBuffer::to_vec", || {
        ok("to_vec", b.to_vec());
    });
    step("DeviceBuffer::to_vec_after", || {
        ok("to_vec_after", b.to_vec_after(s));
    });
    let o = &other;
    step("StreamMemOps::memset_async", || {
        ok("memset_async", s.memset_async(b, 1u32, N as usize));
    });
    step("StreamMemOps::memcpy_async", || {
        ok("memcpy_async", s.memcpy_async(o, b, BYTES));
    });
    let mut pinned = step("PinnedBuffer::zeroed", || {
        PinnedBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let pinned2 = step("PinnedBuffer::from_slice", || {
        PinnedBuffer::<u32>::from_slice(d, &data).unwrap()
    })
    .unwrap();
    let p = &pinned;
    step("StreamMemOps::memcpy_htod_async", || {
        ok("memcpy_htod_async", s.memcpy_htod_async(b, p, BYTES));
    });
    step("StreamMemOps::memcpy_dtoh_async", || {
        ok("memcpy_dtoh_async", s.memcpy_dtoh_async(p, b, BYTES));
    });
    step("Function::launch", || {
        ok("launch", unsafe {
            fill.launch(s, cfg(), &KernelArgs::new().ptr(b).value(N).value(1u32))
        });
    });
    step("PinnedBuffer::as_slice / to_vec / is_idle", || {
        ok("as_slice", p.as_slice().map(|v| v.len()));
        ok("to_vec", p.to_vec());
        ok("is_idle", p.is_idle());
    });
    let pm = &mut pinned;
    step("PinnedBuffer::as_mut_slice / copy_from_slice", || {
        ok("as_mut_slice", pm.as_mut_slice().map(|v| v.len()));
        ok("copy_from_slice", pm.copy_from_slice(&data));
    });
    let managed = step("ManagedBuffer::zeroed", || {
        ManagedBuffer::<u32>::zeroed(d, N as usize).unwrap()
    })
    .unwrap();
    let m = &managed;
    step("ManagedBuffer::as_slice", || {
        ok("as_slice", m.as_slice().map(|v| v.len()));
    });
    // SAFETY: fill_u32 over `managed`; the stub runs nothing.
    unsafe { fill.launch(s, cfg(), &KernelArgs::new().ptr(m).value(N).value(1u32)) }.unwrap();
    step("ManagedBuffer::as_slice (after a kernel used it)", || {
        ok("as_slice", m.as_slice().map(|v| v.len()));
    });
    let pool = step("MemPool::new", || MemPool::new(d).unwrap()).unwrap();
    let pool2 = step("MemPool::new_managed", || {
        ok("new_managed", MemPool::new_managed(d))
    })
    .unwrap();
    let pl = &pool;
    step("MemPool::set_access / access", || {
        ok("set_access", pl.set_access(d, Access::ReadWrite));
        ok("access", pl.access(d));
    });
    let sa = step("StreamAllocation::new", || {
        StreamAllocation::new(s, BYTES).unwrap()
    })
    .unwrap();
    let sb = step("StreamAllocation::from_pool", || {
        StreamAllocation::from_pool(s, pl, BYTES).unwrap()
    })
    .unwrap();
    step("StreamAllocation::free_async", move || {
        ok("free_async", sa.free_async());
    });
    step("drop StreamAllocation", move || drop(sb));
    let sc = StreamAllocation::new(s, BYTES).unwrap();
    // SAFETY: fill_u32 over `sc`; the stub runs nothing.
    unsafe { fill.launch(s, cfg(), &KernelArgs::new().ptr(&sc).value(N).value(1u32)) }.unwrap();
    step(
        "drop StreamAllocation (after a kernel used it)",
        move || drop(sc),
    );
    let per_thread = BorrowedStream::per_thread(d);
    let sd = StreamAllocation::new(&per_thread, BYTES).unwrap();
    step(
        "drop StreamAllocation (per-thread stream of main)",
        move || drop(sd),
    );

    let module2 = step("Module::from_ptx", || {
        Module::from_ptx(d, cuda_graph::kernels::PTX).unwrap()
    })
    .unwrap();
    let m2 = &module2;
    let f2 = step("Module::function", || m2.function("fill_u32").unwrap()).unwrap();

    step("Device::get", || {
        ok("get", Device::get(0));
    });
    step("Device::synchronize", || {
        ok("synchronize", d.synchronize());
    });
    step("Device::graph_mem_info", || {
        ok("graph_mem_info", d.graph_mem_info());
    });
    step("Device::reset_graph_mem_high_watermarks", || {
        ok("reset", d.reset_graph_mem_high_watermarks());
    });
    step("Device::graph_mem_trim", || {
        ok("graph_mem_trim", d.graph_mem_trim());
    });
    step(
        "Device::name / total_memory / attribute / can_access_peer",
        || {
            ok("name", d.name());
            ok("total_memory", d.total_memory());
            ok("supports_memory_pools", d.supports_memory_pools());
            ok("can_access_peer", d.can_access_peer(d));
        },
    );
    let ctx = device.context_raw() as usize;
    step("Device::from_raw", || {
        ok("from_raw", unsafe {
            Device::from_raw(ctx as cuda_graph::sys::CUcontext)
        });
    });
    step("flush_deferred (nothing queued)", || {
        flush_deferred();
    });

    // Drops on a fresh thread.
    step("drop DeviceBuffer (after stream use)", move || drop(buf));
    step("drop DeviceBuffer", move || drop(other));
    step("drop PinnedBuffer (after stream copies)", move || {
        drop(pinned)
    });
    step("drop PinnedBuffer", move || drop(pinned2));
    step("drop ManagedBuffer (after a kernel used it)", move || {
        drop(managed)
    });
    step("drop MemPool", move || drop(pool));
    step("drop MemPool (managed)", move || drop(pool2));
    step("drop Function (module still held)", move || drop(f2));
    step("drop Module (last holder)", move || drop(module2));
    step("drop Stream (after work)", move || drop(stream));
    let idle = Stream::new(d).unwrap();
    step("drop Stream (never used)", move || drop(idle));
    let raw_stream = Stream::new(d).unwrap();
    step("Stream::into_raw", move || {
        let _ = raw_stream.into_raw();
    });
    step("drop Function + Module (last holders)", move || {
        drop((fill, module))
    });
    step(
        "drop Device (last handle: reaper stream, primary context)",
        move || drop(device),
    );
}

#[test]
fn streams_events_memory() {
    isolated("streams_events_memory", objects_body);
}

// ------------------------------------------------------------------ stream capture

/// In a capture: an allocation, a kernel that fills it, a memset of it, a copy of it into
/// `out`, its free.
fn captured_chain(
    cap: &cuda_graph::Capture<'_, Stream>,
    fill: &Function,
    out: &DeviceBuffer<u32>,
) -> cuda_graph::Result<()> {
    let a = cap.malloc_async(BYTES)?;
    unsafe { cap.launch(fill, cfg(), &KernelArgs::new().ptr(&a).value(N).value(1u32)) }?;
    cap.memset_async(&a, 9u32, N as usize)?;
    cap.memcpy_async(out, &a, BYTES)?;
    cap.free_async(&a)
}

fn capture_body() {
    let (device, _module, fill) = stub();
    let stream = Stream::new(&device).unwrap();
    let other = Stream::new(&device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    let pool = MemPool::new(&device).unwrap();
    let (s, o, d) = (&stream, &other, &device);
    let graph = step(
        "capture() on a fresh thread: malloc_async, launch, memset_async, memcpy_async, free_async",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::Global, |cap| {
                    captured_chain(cap, &fill, &out)
                }),
            )
        },
    )
    .flatten();
    drop(graph);
    step(
        "capture(): memcpy_htod_async, memcpy_dtoh_async, malloc_from_pool_async",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::ThreadLocal, |cap| {
                    let a = cap.malloc_from_pool_async(&pool, BYTES)?;
                    cap.memcpy_htod_async(&a, &pinned, BYTES)?;
                    cap.memcpy_dtoh_async(&pinned, &a, BYTES)?;
                    cap.free_async(&a)?;
                    Ok(())
                }),
            );
        },
    );
    step("capture(): fork, launch_on, join, free_async", || {
        ok(
            "capture",
            capture(s, CaptureMode::Global, |cap| {
                let a = cap.malloc_async(BYTES)?;
                cap.fork(o)?;
                unsafe {
                    cap.launch_on(
                        o,
                        &fill,
                        cfg(),
                        &KernelArgs::new().ptr(&a).value(N).value(1u32),
                    )
                }?;
                cap.join(o)?;
                cap.free_async(&a)?;
                Ok(())
            }),
        );
    });
    step(
        "capture(): Function::launch on the capturing stream (outside the guard)",
        || {
            ok(
                "capture",
                capture(s, CaptureMode::Relaxed, |_cap| unsafe {
                    fill.launch(s, cfg(), &KernelArgs::new().ptr(&out).value(N).value(1u32))
                }),
            );
        },
    );
    step(
        "capture(): closure fails (guard dropped, capture discarded)",
        || {
            let r: cuda_graph::Result<((), ())> = capture(s, CaptureMode::Global, |_cap| {
                Err(cuda_graph::Error::CaptureLeftOpen)
            })
            .map(|(g, v)| {
                drop(g);
                ((), v)
            });
            let _ = r;
        },
    );

    // Reading back a captured graph (the stub knows captured nodes' types), and taking over
    // a raw captured graph with memory nodes.
    let (captured, ()) = capture(&stream, CaptureMode::Global, |cap| {
        captured_chain(cap, &fill, &out)
    })
    .unwrap();
    let captured = step(
        "Graph::node_params / node_type on a captured graph (every node)",
        move || {
            let nodes: Vec<_> = captured
                .driver_nodes()
                .unwrap()
                .into_iter()
                .filter_map(|n| n.recorded())
                .collect();
            for node in nodes {
                ok("node_params", captured.node_params(node));
            }
            captured
        },
    )
    .unwrap();
    let raw = captured.into_raw() as usize;
    step(
        "Graph::from_raw of a captured graph with alloc and free nodes",
        move || {
            let g = ok("from_raw", unsafe {
                Graph::from_raw(raw as cuda_graph::sys::CUgraph, d)
            });
            std::mem::forget(g);
        },
    );

    // A capture left open on main (its guard forgotten); the stream dropped on a fresh thread.
    let open = Stream::new(&device).unwrap();
    let guard = cuda_graph::Capture::begin(&open, CaptureMode::Relaxed).unwrap();
    std::mem::forget(guard);
    step(
        "drop Stream with a capture left open (end_forgotten_capture)",
        move || drop(open),
    );
}

#[test]
fn stream_capture() {
    isolated("stream_capture", capture_body);
}

// ------------------------------------------------------------------ deferred releases

fn deferred_body() {
    let (device, module, fill) = stub();
    let work = Stream::new(&device).unwrap();
    let capturing = Stream::new(&device).unwrap();
    // A graph allocation whose free made the device's private (reaper) stream.
    {
        let mut producer = Graph::new(&device).unwrap();
        let (_, live) = producer
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
        pexec.launch(&work).unwrap();
        drop((pexec, producer));
        live.free().unwrap();
    }
    flush_deferred();

    // Releases put off while main captures (thread-local mode: only main is restricted), then
    // run by flush_deferred on a fresh thread, one value at a time (a release that binds the
    // context would hide the calls of the releases after it on that thread).
    // A live graph allocation (its graph launched, never freed), and an executable graph.
    let live = {
        let mut producer = Graph::new(&device).unwrap();
        let (_, live) = producer
            .add_mem_alloc_node(&[], &AllocParams::new(&device, BYTES))
            .unwrap();
        let pexec = producer.instantiate(InstantiateFlags::NONE).unwrap();
        pexec.launch(&work).unwrap();
        drop((pexec, producer));
        flush_deferred();
        live
    };
    let (graph, _) = alloc_kernel_free(&device, &fill);
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&BorrowedStream::legacy(&device)).unwrap();

    let guard = cuda_graph::Capture::begin(&capturing, CaptureMode::ThreadLocal).unwrap();
    // First, while the crate's release thread has not run anything: its drop wakes it.
    let _ = take_log();
    drop(exec);
    std::thread::sleep(std::time::Duration::from_millis(100));
    report(
        "ExecGraph: dropped on main inside a thread-local capture (the release thread runs its releases)",
    );
    step("ExecGraph: flush_deferred afterwards", || {
        flush_deferred();
    });
    let queued = |label: &str, value: Box<dyn FnOnce() + '_>| {
        let _ = take_log();
        value();
        report(&format!(
            "{label}: dropped on main inside a thread-local capture"
        ));
        step(
            &format!("{label}: its queued release, run by flush_deferred"),
            || {
                let left = flush_deferred();
                if left != 0 {
                    note(format!("flush_deferred left {left} queued"));
                }
            },
        );
    };
    let m = Module::from_ptx(&device, cuda_graph::kernels::PTX).unwrap();
    queued("Module", Box::new(move || drop(m)));
    let f = module.function("fill_u32").unwrap();
    let m = module.clone();
    queued(
        "Function + Module (last holders)",
        Box::new(move || drop((f, m))),
    );
    let b = DeviceBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("DeviceBuffer", Box::new(move || drop(b)));
    let p = PinnedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("PinnedBuffer", Box::new(move || drop(p)));
    let mb = ManagedBuffer::<u32>::zeroed(&device, N as usize).unwrap();
    queued("ManagedBuffer", Box::new(move || drop(mb)));
    let pool = MemPool::new(&device).unwrap();
    queued("MemPool", Box::new(move || drop(pool)));
    let e = Event::new(&device).unwrap();
    queued("Event", Box::new(move || drop(e)));
    let st = Stream::new(&device).unwrap();
    queued("Stream", Box::new(move || drop(st)));
    {
        // A queued release run by Graph::instantiate on a fresh thread (it flushes first).
        let e = Event::new(&device).unwrap();
        drop(e);
        let g = Graph::new(&device).unwrap();
        let x = step(
            "Event: its queued release, run by Graph::instantiate",
            move || {
                let x = g.instantiate(InstantiateFlags::NONE).unwrap();
                (x, g)
            },
        );
        drop(x);
        flush_deferred();
        step("flush_deferred (what dropping that graph queued)", || {
            flush_deferred();
        });
    }
    let g = Graph::new(&device).unwrap();
    queued("Graph", Box::new(move || drop(g)));
    queued(
        "GraphAllocation (live, last handle)",
        Box::new(move || drop(live)),
    );
    let sa = StreamAllocation::new(&work, BYTES).unwrap();
    queued("StreamAllocation", Box::new(move || drop(sa)));
    drop(guard.end());
    drop(graph);
    drop(capturing);
    drop(work);
    drop((fill, module));
    flush_deferred();
    step(
        "drop Device (last handle; reaper stream exists)",
        move || drop(device),
    );
}

#[test]
fn deferred_releases() {
    isolated("deferred_releases", deferred_body);
}

/// Guards the audit's own machinery: its log holds a call made with no context current and
/// none made with one.
#[test]
fn the_audit_stub_logs_calls_without_a_context() {
    isolated("the_audit_stub_logs_calls_without_a_context", || {
        let (device, _module, _fill) = stub();
        let _ = take_log();
        let _ = Event::new(&device).unwrap();
        flush_deferred();
        assert!(
            take_log().is_empty(),
            "calls on main, where the context is current"
        );
        std::thread::spawn(|| {
            let mut g = std::ptr::null_mut();
            let _ = unsafe { cuda_graph::sys::cuGraphCreate(&mut g, 0) };
        })
        .join()
        .unwrap();
        let log = take_log();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].0, "cuGraphCreate");
    });
}
