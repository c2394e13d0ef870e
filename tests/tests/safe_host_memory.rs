//! Pinned host memory in graphs and stream copies, on the GPU: NVIDIA's graphMemoryNodes
//! pattern (a graph allocation, a host-to-device memcpy node from a `PinnedBuffer`, a kernel, a
//! device-to-host memcpy node, a free node) relaunched with new input, the same captured, stream
//! copies both ways, views that wait for the GPU, and a reuse probe that a pinned buffer dropped
//! after the graph is built is still the one the graph copies.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are read back through views and checked element by
//! element.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use cuda_graph::{
    AllocParams, AsStream, CaptureMode, DeviceBuffer, Error, Graph, InstantiateFlags, KernelArgs,
    PinnedBuffer, Stream, StreamAllocation, StreamMemOps, capture, live_objects,
};
use probe::{PATTERN, SPIN_50_MS, spin};
use safe_common::{BYTES, N, assert_iota, assert_no_drop_errors, config, gpu, settle};

/// The input of launch `step`: an iota from `step × 1000`.
fn input_of(step: u32) -> Vec<u32> {
    (0..N as u32).map(|i| i.wrapping_add(step * 1000)).collect()
}

/// The graphMemoryNodes sample's shape, explicitly built: alloc → H2D from `input` → `add_u32`
/// (+ 5) → D2H into `output` → free. Launched four times; between launches the input is
/// rewritten through a view (which waits for the launch before), and each launch's output is
/// read through a view (which waits for it) and checked: iota from `step × 1000 + 5`.
#[test]
#[ignore = "needs a GPU"]
fn graph_copies_host_input_in_and_results_out_at_each_launch() {
    let Some(g) = gpu("graph_copies_host_input_in_and_results_out_at_each_launch") else {
        return;
    };
    let device = &g.device;
    let start = live_objects();
    let stream = Stream::new(device).unwrap();
    let mut input = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let output = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();

    let mut graph = Graph::new(device).unwrap();
    let (alloc, a) = graph
        .add_mem_alloc_node(&[], &AllocParams::new(device, BYTES).label("a"))
        .unwrap();
    let h2d = graph
        .add_memcpy_node_htod(&[alloc], &a, &input, BYTES)
        .unwrap();
    // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over `a`, N values.
    let add = unsafe {
        graph.add_kernel_node(
            &[h2d],
            &g.k.add,
            config(N),
            &KernelArgs::new().ptr(&a).value(N).value(5u32),
        )
    }
    .unwrap();
    let d2h = graph
        .add_memcpy_node_dtoh(&[add], &output, &a, BYTES)
        .unwrap();
    graph.add_mem_free_node(&[d2h], &a).unwrap();
    graph.check().unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();

    for step in 0..4u32 {
        input.copy_from_slice(&input_of(step)).unwrap();
        exec.launch(&stream).unwrap();
        assert_iota(
            &output.as_slice().unwrap(),
            step * 1000 + 5,
            &format!("launch {step}: the output copied back"),
        );
        assert!(!a.is_live(), "freed in the graph");
    }
    drop((exec, graph, a, input, output, stream));
    let live = settle(device, start);
    assert_eq!(live, start, "everything was released: {live}");
    assert_no_drop_errors(device);
}

/// The same work captured: `malloc_async`, `memcpy_htod_async`, `add_u32` (+ 7),
/// `memcpy_dtoh_async`, `free_async`; launched three times with new input, each output checked.
#[test]
#[ignore = "needs a GPU"]
fn captured_copies_between_host_and_device() {
    let Some(g) = gpu("captured_copies_between_host_and_device") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let mut input = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let output = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
        let a = cap.malloc_async(BYTES)?;
        cap.memcpy_htod_async(&a, &input, BYTES)?;
        // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over `a`, N values.
        unsafe {
            cap.launch(
                &g.k.add,
                config(N),
                &KernelArgs::new().ptr(&a).value(N).value(7u32),
            )?
        };
        cap.memcpy_dtoh_async(&output, &a, BYTES)?;
        cap.free_async(&a)
    })
    .unwrap();
    assert_eq!(graph.nodes().len(), 5, "{:?}", graph.nodes());
    graph.check().unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for step in 0..3u32 {
        input.copy_from_slice(&input_of(step)).unwrap();
        exec.launch(&stream).unwrap();
        assert_iota(
            &output.to_vec().unwrap(),
            step * 1000 + 7,
            &format!("launch {step}: the captured graph's output"),
        );
    }
    drop((exec, graph));
    assert_no_drop_errors(device);
}

/// Stream copies both ways: host → a `DeviceBuffer` and a `StreamAllocation`, `add_u32` on
/// each, and back; a spin kernel ahead of the copies back makes them run well after the calls
/// return, and the views still show the results (they wait for the copies).
#[test]
#[ignore = "needs a GPU"]
fn stream_copies_both_ways() {
    let Some(g) = gpu("stream_copies_both_ways") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let input = PinnedBuffer::from_slice(device, &input_of(3)).unwrap();
    let back = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let back2 = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let buffer = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let allocation = StreamAllocation::new(&stream, BYTES).unwrap();

    stream.memcpy_htod_async(&buffer, &input, BYTES).unwrap();
    stream
        .memcpy_htod_async(&allocation, &input, BYTES)
        .unwrap();
    // SAFETY: add_u32(unsigned* p, unsigned long long n, unsigned v) over N values of each.
    unsafe {
        g.k.add
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&buffer).value(N).value(1u32),
            )
            .unwrap();
        g.k.add
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&allocation).value(N).value(2u32),
            )
            .unwrap();
    }
    spin(&g.k.spin_then_fill, &stream, SPIN_50_MS);
    stream.memcpy_dtoh_async(&back, &buffer, BYTES).unwrap();
    stream
        .memcpy_dtoh_async(&back2, &allocation, BYTES)
        .unwrap();
    assert!(
        !back.is_idle().unwrap(),
        "the copy back waits behind the spin"
    );
    assert_iota(
        &back.as_slice().unwrap(),
        3001,
        "the DeviceBuffer, copied back",
    );
    assert_iota(
        &back2.as_slice().unwrap(),
        3002,
        "the StreamAllocation, copied back",
    );
    assert!(back.is_idle().unwrap() && back2.is_idle().unwrap());
    drop(allocation);
    stream.synchronize().unwrap();
    assert_no_drop_errors(device);
}

/// A view of a graph's output taken while the launch is held back by a spin kernel waits for
/// the launch; while the view lives a relaunch is refused (nothing queued), and after it the
/// relaunch runs.
#[test]
#[ignore = "needs a GPU"]
fn view_waits_for_the_launch_and_refuses_the_next() {
    let Some(g) = gpu("view_waits_for_the_launch_and_refuses_the_next") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let source = DeviceBuffer::from_slice(device, &input_of(0)).unwrap();
    let output = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let spun = probe::add_spin_node(&mut graph, &[], &g.k.spin_then_fill, SPIN_50_MS);
    graph
        .add_memcpy_node_dtoh(&[spun], &output, &source, BYTES)
        .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    {
        let view = output.as_slice().unwrap();
        assert_iota(&view, 0, "the view after the spun launch");
        let e = exec.launch(&stream).unwrap_err();
        assert!(
            matches!(e, Error::InUseByHost { call } if call == "ExecGraph::launch"),
            "{e}"
        );
    }
    source.copy_from(&input_of(1)).unwrap();
    exec.launch(&stream).unwrap();
    assert_iota(
        &output.to_vec().unwrap(),
        1000,
        "the relaunch after the view",
    );
    drop((exec, graph));
    assert_no_drop_errors(device);
}

/// The reuse probe: a pinned source dropped right after the graph is built is still the one
/// the graph copies. After the drop a new pinned buffer of the same size is allocated and
/// filled with the probe pattern (it tends to get the freed address, had the source been
/// freed); a spin node delays the copy until after that; the graph must copy the original
/// iota, and the probe must keep its pattern. The same for a pinned destination: the probe
/// must not receive the graph's output. Control: the source kept alive.
#[test]
#[ignore = "needs a GPU"]
fn pinned_buffers_dropped_after_building_are_the_ones_copied() {
    let Some(g) = gpu("pinned_buffers_dropped_after_building_are_the_ones_copied") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let iota = input_of(0);
    let pattern = vec![PATTERN; N as usize];

    for keep_alive in [true, false] {
        let what = if keep_alive {
            "control: the source kept"
        } else {
            "the source dropped"
        };
        let src = PinnedBuffer::from_slice(device, &iota).unwrap();
        let dst = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
        let freed = src.as_ptr() as usize;
        let mut graph = Graph::new(device).unwrap();
        let spun = probe::add_spin_node(&mut graph, &[], &g.k.spin_then_fill, SPIN_50_MS);
        graph
            .add_memcpy_node_htod(&[spun], &dst, &src, BYTES)
            .unwrap();
        let held = live_objects().pinned_buffers;
        let kept = if keep_alive {
            Some(src)
        } else {
            drop(src);
            None
        };
        cuda_graph::flush_deferred();
        assert_eq!(
            live_objects().pinned_buffers,
            held,
            "{what}: the graph still holds the source"
        );
        let probe = PinnedBuffer::from_slice(device, &pattern).unwrap();
        println!(
            "{what}: the probe {} the source's address",
            if probe.as_ptr() as usize == freed {
                "got"
            } else {
                "did not get"
            }
        );
        let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_iota(
            &dst.to_vec().unwrap(),
            0,
            &format!("{what}: the graph copied the original"),
        );
        assert!(
            probe.as_slice().unwrap().iter().all(|&x| x == PATTERN),
            "{what}: the probe kept its pattern"
        );
        drop((exec, graph, kept, probe));
    }

    // The destination dropped: the graph's output must go to it, not to a probe.
    let src = DeviceBuffer::from_slice(device, &iota).unwrap();
    let out = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let freed = out.as_ptr() as usize;
    let mut graph = Graph::new(device).unwrap();
    let spun = probe::add_spin_node(&mut graph, &[], &g.k.spin_then_fill, SPIN_50_MS);
    graph
        .add_memcpy_node_dtoh(&[spun], &out, &src, BYTES)
        .unwrap();
    drop(out);
    let probe = PinnedBuffer::from_slice(device, &pattern).unwrap();
    println!(
        "the destination dropped: the probe {} its address",
        if probe.as_ptr() as usize == freed {
            "got"
        } else {
            "did not get"
        }
    );
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(
        probe.as_slice().unwrap().iter().all(|&x| x == PATTERN),
        "the destination dropped: the probe kept its pattern"
    );
    drop((exec, graph, probe));
    assert_no_drop_errors(device);
}
