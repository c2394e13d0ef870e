//! `DeviceBuffer`, the plain device memory that holds test inputs and results: zero-filled when
//! `zeroed` returns, whichever stream uses it next.
//!
//! Each test skips without a GPU (prints `SKIPPED ...`) and fails instead under
//! `CUDA_GRAPH_REQUIRE_GPU=1`.

mod safe_common;

use cuda_graph::{AsStream, BorrowedStream, DeviceBuffer, KernelArgs, Stream, StreamFlags};
use safe_common::{N, assert_all, config, gpu};

/// `cuMemsetD8` returns before it runs, queued on the legacy default stream, which a
/// non-blocking stream does not wait for. With the legacy stream kept busy by a spinning
/// kernel, a buffer zeroed and then filled on a non-blocking stream must read back filled: had
/// `zeroed` returned before its memset ran, the memset would clear the buffer after the fill
/// (the concurrency test saw that, now and then, under compute-sanitizer).
#[test]
#[ignore = "needs a GPU"]
fn zeroed_is_zero_before_other_streams_use_it() {
    let Some(g) = gpu("zeroed_is_zero_before_other_streams_use_it") else {
        return;
    };
    let device = &g.device;
    let scratch = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let legacy = BorrowedStream::legacy(device);
    // SAFETY: spin_then_fill_u32(p, n, v, spins) over the N values of `scratch`.
    unsafe {
        g.k.spin_then_fill
            .launch(
                &legacy,
                config(N),
                &KernelArgs::new()
                    .ptr(&scratch)
                    .value(N)
                    .value(1u32)
                    .value(100_000_000u64),
            )
            .unwrap();
    }
    let out = DeviceBuffer::<u32>::zeroed(device, N as usize).unwrap();
    let stream = Stream::with_flags(device, StreamFlags::NON_BLOCKING, 0).unwrap();
    // SAFETY: fill_u32(p, n, v) over the N values of `out`.
    unsafe {
        g.k.fill
            .launch(
                &stream,
                config(N),
                &KernelArgs::new().ptr(&out).value(N).value(7u32),
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
    // to_vec copies on the legacy stream, after the spinning kernel (and any memset).
    assert_all(
        &out.to_vec().unwrap(),
        7,
        "a zeroed buffer filled on another stream",
    );
    assert_all(
        &scratch.to_vec().unwrap(),
        1,
        "the spinning kernel's output",
    );
}
