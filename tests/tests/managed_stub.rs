//! Managed memory (`ManagedBuffer`: `cuMemAllocManaged`) as a device operand and as host
//! memory behind views, against the checking stub driver (`stub-driver/hunt_cuda.c`), each test
//! in a child process of its own, as in `host_memory_stub.rs`.
//!
//! The stub's managed memory is real host memory registered as device memory: work that uses
//! it (a kernel, a memset, a copy, a graph node) writes `0xD2` into every byte of it when it
//! runs, and a use of it after `cuMemFree` is reported (`HUNT ERROR`). `HUNT_DELAY_US` makes
//! each work item of the stub's GPU thread run that much later, so that work a test queues is
//! still queued at its next line.
//!
//! | test | shows | fails without |
//! |---|---|---|
//! | `views_wait_for_queued_gpu_work` | a view taken while a memset, a kernel or a graph launch that writes the buffer is queued shows what the GPU wrote | the view's wait for the recorded uses |
//! | `gpu_work_is_refused_while_a_view_lives` | memsets, copies, kernels and launches that use a buffer a view holds are `InUseByHost`, nothing queued | the refusal in `stream_ordered` and `ExecGraph::launch` |
//! | `graphs_keep_a_dropped_managed_buffer` | a buffer dropped after it became a memset node's target and a kernel node's argument is allocated when they run, and freed after | the graph's keep of the memory |
//! | `drop_after_stream_work_frees_after_it_ran` | `cuMemFree` is put off until the queued memset ran | the free's wait for the recorded events |
//! | `refused_without_concurrent_managed_access` | no managed memory on a system where a view could fault | the device check |
//! | `sizes_and_bounds_are_typed_errors_naming_the_call` | empty and overflowing sizes and out-of-bounds memsets are `InvalidArgument` naming the call | |
#![cfg(cuda_graph_tests_hunt_stub)]

mod hunt_common;

use hunt_common::{
    SLOW, hunt_errors, is_in_use_by_host, is_invalid, isolated, settle, stub_symbol,
};

use cuda_graph::{
    AsStream, Device, DeviceBuffer, Graph, InstantiateFlags, KernelArgs, LaunchConfig,
    ManagedBuffer, Module, PinnedBuffer, Stream, StreamMemOps, flush_deferred, kernels,
};

const WORDS: usize = 1 << 10;
const BYTES: usize = WORDS * 4;
/// A word of managed memory after GPU work used it, as the stub writes it.
const GPU_WORD: u32 = 0xD2D2_D2D2;

/// The number of live `cuMemAllocManaged` allocations.
fn managed_live() -> i32 {
    // SAFETY: the stub's `int hunt_managed_live(void)`.
    let f: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(stub_symbol(c"hunt_managed_live")) };
    f()
}

/// `fill_u32(p, n, v)` over the whole buffer.
fn fill_args(p: &ManagedBuffer<u32>) -> KernelArgs<'_> {
    KernelArgs::new().ptr(p).value(WORDS as u64).value(1u32)
}

/// A memset, a kernel and a graph launch that write the buffer, each queued (slow) while the
/// buffer holds zeros: a view taken right after shows the GPU's bytes, not the zeros.
fn views_wait_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let fill = Module::from_ptx(&d, kernels::PTX)
        .unwrap()
        .function("fill_u32")
        .unwrap();
    let mut buf = ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();

    s.memset_async(&buf, 1u32, WORDS).unwrap();
    assert!(!buf.is_idle().unwrap(), "the memset is still queued");
    assert!(
        buf.as_slice().unwrap().iter().all(|&x| x == GPU_WORD),
        "a view after a queued memset"
    );

    buf.as_mut_slice().unwrap().fill(0);
    // SAFETY: fill_u32(u32* p, u64 n, u32 v) over the buffer's WORDS values.
    unsafe {
        fill.launch(
            &s,
            LaunchConfig::for_elements(WORDS as u64, 256),
            &fill_args(&buf),
        )
        .unwrap()
    };
    assert!(
        buf.to_vec().unwrap().iter().all(|&x| x == GPU_WORD),
        "a view after a queued kernel"
    );

    buf.copy_from_slice(&[0; WORDS]).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    graph.add_memset_node(&[], &buf, 2u32, WORDS).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    exec.launch(&s).unwrap();
    assert!(!buf.is_idle().unwrap(), "the launch is still queued");
    assert_eq!(
        buf.as_slice().unwrap()[0],
        GPU_WORD,
        "a view after a launch"
    );
    s.synchronize().unwrap();
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn views_wait_for_queued_gpu_work() {
    isolated("views_wait_for_queued_gpu_work", SLOW, views_wait_body);
}

/// While a view lives, a memset, a copy to pinned memory, a kernel and a launch that use the
/// buffer are refused with nothing queued (the buffer still holds the host's values after the
/// stream is drained); once the view is dropped, they run.
fn refused_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let fill = Module::from_ptx(&d, kernels::PTX)
        .unwrap()
        .function("fill_u32")
        .unwrap();
    let mut buf = ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    graph.add_memcpy_node(&[], &buf, &dev, BYTES).unwrap();
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    buf.as_mut_slice().unwrap()[0] = 9;
    {
        let view = buf.as_slice().unwrap();
        let e = s.memset_async(&buf, 0u32, WORDS).unwrap_err();
        assert!(is_in_use_by_host(&e, "StreamMemOps::memset_async"), "{e}");
        let e = s.memcpy_async(&dev, &buf, BYTES).unwrap_err();
        assert!(is_in_use_by_host(&e, "StreamMemOps::memcpy_async"), "{e}");
        let e = s.memcpy_dtoh_async(&pinned, &buf, BYTES).unwrap_err();
        assert!(
            is_in_use_by_host(&e, "StreamMemOps::memcpy_dtoh_async"),
            "{e}"
        );
        // SAFETY: as in `views_wait_body`.
        let e = unsafe {
            fill.launch(
                &s,
                LaunchConfig::for_elements(WORDS as u64, 256),
                &fill_args(&buf),
            )
        }
        .unwrap_err();
        assert!(is_in_use_by_host(&e, "Function::launch"), "{e}");
        let e = exec.launch(&s).unwrap_err();
        assert!(is_in_use_by_host(&e, "ExecGraph::launch"), "{e}");
        assert_eq!(view[0], 9, "the view's values are the host's");
    }
    s.synchronize().unwrap();
    assert_eq!(buf.as_slice().unwrap()[0], 9, "nothing was queued");
    assert_eq!(buf.as_slice().unwrap()[1], 0, "nothing was queued");
    exec.launch(&s).unwrap();
    assert_eq!(buf.as_slice().unwrap()[0], GPU_WORD, "the launch ran");
    s.memcpy_dtoh_async(&pinned, &buf, BYTES).unwrap();
    s.synchronize().unwrap();
    drop((exec, graph));
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn gpu_work_is_refused_while_a_view_lives() {
    isolated("gpu_work_is_refused_while_a_view_lives", SLOW, refused_body);
}

/// A graph with a memset node on one managed buffer and a kernel node whose argument is
/// another, both buffers dropped before instantiate: both are allocated when the launches run
/// (the stub reports a use of freed memory otherwise), and freed once the executable graph is
/// gone and its launches are done.
fn graphs_keep_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let fill = Module::from_ptx(&d, kernels::PTX)
        .unwrap()
        .function("fill_u32")
        .unwrap();
    let target = ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let argument = ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    let mut graph = Graph::new(&d).unwrap();
    let memset = graph.add_memset_node(&[], &target, 3u32, WORDS).unwrap();
    // SAFETY: as in `views_wait_body`.
    unsafe {
        graph
            .add_kernel_node(
                &[memset],
                &fill,
                LaunchConfig::for_elements(WORDS as u64, 256),
                &fill_args(&argument),
            )
            .unwrap()
    };
    drop((target, argument));
    flush_deferred();
    assert_eq!(managed_live(), 2, "the graph holds both buffers");
    let exec = graph.instantiate(InstantiateFlags::NONE).unwrap();
    drop(graph);
    for _ in 0..2 {
        exec.launch(&s).unwrap();
    }
    drop(exec);
    flush_deferred();
    assert_eq!(managed_live(), 2, "the queued launches still hold them");
    s.synchronize().unwrap();
    settle("both buffers are freed after the last launch", || {
        managed_live() == 0
    });
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn graphs_keep_a_dropped_managed_buffer() {
    isolated(
        "graphs_keep_a_dropped_managed_buffer",
        SLOW,
        graphs_keep_body,
    );
}

/// A buffer dropped right after a memset on it was queued: `cuMemFree` (which, in the stub,
/// frees as soon as the work queued so far has run) is not even called until the memset's event
/// has completed, as for pinned memory.
fn drop_after_stream_work_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let buf = ManagedBuffer::<u32>::zeroed(&d, WORDS).unwrap();
    s.memset_async(&buf, 1u32, WORDS).unwrap();
    drop(buf);
    flush_deferred();
    assert_eq!(managed_live(), 1, "the free waits for the queued memset");
    settle("the buffer is freed after the memset ran", || {
        managed_live() == 0
    });
    assert_eq!(hunt_errors(), 0, "the stub reported misuse");
}

#[test]
fn drop_after_stream_work_frees_after_it_ran() {
    isolated(
        "drop_after_stream_work_frees_after_it_ran",
        SLOW,
        drop_after_stream_work_body,
    );
}

/// A device without concurrent managed access: no managed buffer is made (a view could fault
/// while unrelated work runs), and nothing is allocated.
fn no_concurrent_body() {
    let d = Device::get(0).unwrap();
    let e = ManagedBuffer::<u32>::zeroed(&d, 1).unwrap_err();
    assert!(is_invalid(&e, "ManagedBuffer::zeroed"), "{e}");
    assert!(e.to_string().contains("concurrent managed access"), "{e}");
    assert_eq!(managed_live(), 0, "nothing was allocated");
    // Pinned memory needs no such check.
    PinnedBuffer::<u32>::zeroed(&d, 1).unwrap();
}

#[test]
fn refused_without_concurrent_managed_access() {
    isolated(
        "refused_without_concurrent_managed_access",
        &[("HUNT_NO_CONCURRENT_MANAGED", "1")],
        no_concurrent_body,
    );
}

/// Empty and overflowing sizes, a copy-in of the wrong length and a memset past the end are
/// `InvalidArgument` naming the call, before the driver is called.
fn sizes_body() {
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    for len in [0, usize::MAX / 2] {
        let e = ManagedBuffer::<u32>::zeroed(&d, len).unwrap_err();
        assert!(is_invalid(&e, "ManagedBuffer::zeroed"), "{len}: {e}");
    }
    assert_eq!(managed_live(), 0, "nothing was allocated");
    let mut buf = ManagedBuffer::<u32>::zeroed(&d, 4).unwrap();
    let e = buf.copy_from_slice(&[1, 2, 3]).unwrap_err();
    assert!(is_invalid(&e, "ManagedBuffer::copy_from_slice"), "{e}");
    let e = s.memset_async(&buf, 0u32, 5).unwrap_err();
    assert!(is_invalid(&e, "StreamMemOps::memset_async"), "{e}");
    assert_eq!(buf.byte_len(), 16);
    assert_eq!(buf.to_vec().unwrap(), [0; 4], "zeroed when made");
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
