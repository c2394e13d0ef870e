//! Managed memory (`ManagedBuffer`) on the GPU: the graphMemoryNodes sample's result flag (a
//! kernel sets it, the host reads it through a view that waits for the kernel), managed memory
//! as the operand of memset, kernel and memcpy nodes relaunched with host writes in between,
//! stream copies between managed, pinned and device memory, and a reuse probe that a managed
//! buffer dropped after the graph is built is still the one the graph writes.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`. Results are read back through views and checked element by
//! element.

#[path = "safe_common/probe.rs"]
mod probe;
mod safe_common;

use cuda_graph::{
    AsStream, DeviceBuffer, Error, Graph, InstantiateFlags, KernelArgs, ManagedBuffer,
    PinnedBuffer, Stream, StreamMemOps, live_objects,
};
use probe::{PATTERN, SPIN_50_MS, one_thread};
use safe_common::{BYTES, N, assert_all, assert_iota, assert_no_drop_errors, config, gpu, settle};

/// The arguments of `spin_then_fill_u32(p, n, v, cycles)`.
fn spin_fill(p: &ManagedBuffer<u32>, n: u64, v: u32, cycles: u64) -> KernelArgs<'_> {
    KernelArgs::new().ptr(p).value(n).value(v).value(cycles)
}

/// A kernel that spins ~50 ms and then sets the flag: a view taken right after the launch
/// shows the kernel's 1, not the 0 from before; a launch while the view lives is refused; the
/// host clears the flag through a mutable view, and the next kernel's write shows again.
#[test]
#[ignore = "needs a GPU"]
fn kernel_sets_a_managed_flag_that_a_view_reads_after_it() {
    let Some(g) = gpu("kernel_sets_a_managed_flag_that_a_view_reads_after_it") else {
        return;
    };
    let device = &g.device;
    let start = live_objects();
    let stream = Stream::new(device).unwrap();
    let mut flag = ManagedBuffer::<u32>::zeroed(device, 1).unwrap();
    for round in 1..=3u32 {
        // SAFETY: spin_then_fill_u32(u32* p, u64 n, u32 v, u64 cycles) over the flag's value.
        unsafe {
            g.k.spin_then_fill
                .launch(
                    &stream,
                    one_thread(),
                    &spin_fill(&flag, 1, round, SPIN_50_MS),
                )
                .unwrap()
        };
        {
            let view = flag.as_slice().unwrap();
            assert_eq!(
                view[0], round,
                "round {round}: the view waited for the kernel"
            );
            // SAFETY: as above.
            let e = unsafe {
                g.k.spin_then_fill
                    .launch(&stream, one_thread(), &spin_fill(&flag, 1, 99, 0))
            }
            .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InUseByHost {
                        call: "Function::launch"
                    }
                ),
                "{e}"
            );
        }
        flag.as_mut_slice().unwrap()[0] = 0;
        stream.synchronize().unwrap();
        assert_eq!(
            flag.to_vec().unwrap(),
            [0],
            "round {round}: nothing ran under the view"
        );
    }
    drop((flag, stream));
    settle(device, start);
    assert_no_drop_errors(device);
}

/// A graph: memset node (7) on a managed buffer → `add_u32` (+ round) on it → memcpy node into
/// a device buffer. Launched three times; before each, the host checks the last launch's result
/// through a view and overwrites the buffer (the memset rewrites it anyway); the device copy and
/// the managed buffer both hold 7 + round.
#[test]
#[ignore = "needs a GPU"]
fn graph_nodes_on_managed_memory_relaunched_with_host_access_between() {
    let Some(g) = gpu("graph_nodes_on_managed_memory_relaunched_with_host_access_between") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let mut managed = ManagedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let copy = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let mut graph = Graph::new(device).unwrap();
    let memset = graph
        .add_memset_node(&[], &managed, 7u32, N as usize)
        .unwrap();
    // SAFETY: add_u32(u32* p, u64 n, u32 v) over the buffer's N values.
    let add = unsafe {
        graph.add_kernel_node(
            &[memset],
            &g.k.add,
            config(N),
            &KernelArgs::new().ptr(&managed).value(N).value(5u32),
        )
    }
    .unwrap();
    graph
        .add_memcpy_node(&[add], &copy, &managed, BYTES)
        .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for round in 0..3 {
        managed.as_mut_slice().unwrap().fill(1000 + round);
        exec.launch(&stream).unwrap();
        assert_all(
            &managed.as_slice().unwrap(),
            12,
            "the managed buffer after the launch",
        );
        assert_all(&copy.to_vec_after(&stream).unwrap(), 12, "the device copy");
    }
    drop((exec, graph));
    assert_no_drop_errors(device);
}

/// Stream copies: pinned iota → managed (`memcpy_htod_async`), managed → device
/// (`memcpy_async`), device → pinned; each destination holds the iota.
#[test]
#[ignore = "needs a GPU"]
fn stream_copies_between_managed_pinned_and_device_memory() {
    let Some(g) = gpu("stream_copies_between_managed_pinned_and_device_memory") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let iota: Vec<u32> = (0..N as u32).collect();
    let src = PinnedBuffer::from_slice(device, &iota).unwrap();
    let managed = ManagedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let back = PinnedBuffer::<u32>::zeroed(device, N as usize).unwrap();
    stream.memcpy_htod_async(&managed, &src, BYTES).unwrap();
    stream.memcpy_async(&dev, &managed, BYTES).unwrap();
    stream.memcpy_dtoh_async(&back, &dev, BYTES).unwrap();
    assert_iota(
        &managed.as_slice().unwrap(),
        0,
        "managed, after the copy in",
    );
    assert_iota(&back.as_slice().unwrap(), 0, "pinned, after the round trip");
    assert_no_drop_errors(device);
}

/// A graph whose kernel node (after a ~50 ms spin) writes 3 into a managed buffer, the buffer
/// dropped after the graph is built (and a control that keeps it): a probe of the same size,
/// filled with the pattern, keeps it through the launch, and the kept buffer holds 3.
#[test]
#[ignore = "needs a GPU"]
fn managed_buffer_dropped_after_building_is_the_one_written() {
    let Some(g) = gpu("managed_buffer_dropped_after_building_is_the_one_written") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    for keep_alive in [true, false] {
        let what = if keep_alive {
            "control: the buffer kept"
        } else {
            "the buffer dropped"
        };
        let target = ManagedBuffer::<u32>::zeroed(device, N as usize).unwrap();
        let freed = target.as_ptr() as usize;
        let mut graph = Graph::new(device).unwrap();
        let spun = probe::add_spin_node(&mut graph, &[], &g.k.spin_then_fill, SPIN_50_MS);
        // SAFETY: fill_u32(u32* p, u64 n, u32 v) over the buffer's N values.
        unsafe {
            graph
                .add_kernel_node(
                    &[spun],
                    &g.k.fill,
                    config(N),
                    &KernelArgs::new().ptr(&target).value(N).value(3u32),
                )
                .unwrap()
        };
        let held = live_objects().managed_buffers;
        let kept = if keep_alive {
            Some(target)
        } else {
            drop(target);
            None
        };
        cuda_graph::flush_deferred();
        assert_eq!(
            live_objects().managed_buffers,
            held,
            "{what}: the graph holds it"
        );
        let probe = ManagedBuffer::from_slice(device, &vec![PATTERN; N as usize]).unwrap();
        println!(
            "{what}: the probe {} the buffer's address",
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
            "{what}: the probe kept its pattern"
        );
        if let Some(kept) = &kept {
            assert_all(
                &kept.as_slice().unwrap(),
                3,
                "the control's buffer was written",
            );
        }
        drop((exec, graph, kept, probe));
    }
    assert_no_drop_errors(device);
}

/// Whether the driver says `ptr` is managed memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED`).
fn is_managed(ptr: u64) -> bool {
    use cuda_graph::sys;
    let mut managed: u32 = 0;
    // SAFETY: the attribute is a 4-byte boolean written to the out-pointer; `ptr` is mapped.
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&mut managed as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr,
        )
    };
    assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "cuPointerGetAttribute");
    managed != 0
}

/// Allocations from a managed pool (`MemPool::new_managed`), stream-ordered: the driver says
/// their address is managed memory, and one from the device's default pool beside them is not;
/// a stream memset and a copy into a device buffer see the memory like any other.
#[test]
#[ignore = "needs a GPU"]
fn managed_pool_allocations_are_managed_memory() {
    use cuda_graph::{DeviceAddress, MemPool, StreamAllocation};
    let Some(g) = gpu("managed_pool_allocations_are_managed_memory") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let pool = MemPool::new_managed(device).unwrap();
    let managed = StreamAllocation::from_pool(&stream, &pool, BYTES).unwrap();
    let plain = StreamAllocation::new(&stream, BYTES).unwrap();
    stream.synchronize().unwrap();
    assert!(
        is_managed(managed.device_ptr()),
        "an allocation from the managed pool"
    );
    assert!(
        !is_managed(plain.device_ptr()),
        "an allocation from the default pool"
    );
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    stream
        .memset_async(&managed, 0x00C0_FFEE_u32, N as usize)
        .unwrap();
    stream.memcpy_async(&out, &managed, BYTES).unwrap();
    stream.synchronize().unwrap();
    assert_all(
        &out.to_vec().unwrap(),
        0x00C0_FFEE,
        "the copy of the managed allocation",
    );
    drop((managed, plain, pool));
    stream.synchronize().unwrap();
    assert_no_drop_errors(device);
}

/// A captured allocation from a managed pool (`MemPool::new_managed`): filled, copied out and
/// freed in the capture; the copy holds the fill at every launch.
#[test]
#[ignore = "needs a GPU"]
fn captured_allocation_from_a_managed_pool() {
    use cuda_graph::{CaptureMode, MemPool, capture};
    let Some(g) = gpu("captured_allocation_from_a_managed_pool") else {
        return;
    };
    let device = &g.device;
    let stream = Stream::new(device).unwrap();
    let pool = MemPool::new_managed(device).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let (graph, ()) = capture(&stream, CaptureMode::Global, |cap| {
        let a = cap.malloc_from_pool_async(&pool, BYTES)?;
        cap.memset_async(&a, 0x5EED_u32, N as usize)?;
        cap.memcpy_async(&out, &a, BYTES)?;
        cap.free_async(&a)
    })
    .unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    for launch in 0..3 {
        out.copy_from(&vec![0; N as usize]).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(
            &out.to_vec().unwrap(),
            0x5EED,
            &format!("launch {launch}: the copy of the pool's allocation"),
        );
    }
    drop((exec, graph, pool));
    assert_no_drop_errors(device);
}
