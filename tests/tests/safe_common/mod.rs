//! Shared by the `safe_*` GPU tests of the safe layer (`cuda-graph`): the GPU gate, the test
//! kernels as [`Function`]s, result checks, and footprint helpers.
//!
//! The GPU tests are marked `#[ignore = "needs a GPU"]`, so that `cargo test` without a GPU
//! counts them as ignored in its summary; `--include-ignored` (or nextest's `--run-ignored all`,
//! as `ci/gpu-run.sh` does) runs them. Every test starts with [`gpu`]: when
//! `cuda_graph::Device::get(0)` fails it prints
//! `SKIPPED <test>: no GPU (<reason>)` and returns `None`, unless `CUDA_GRAPH_REQUIRE_GPU=1`, when
//! it panics instead. The returned [`Gpu`] holds a lock for the test's whole run: `cargo test`
//! runs a binary's tests as threads of one process, where a capture in global mode forbids
//! unsafe calls from other threads and graph-memory footprint is process-wide. (`cargo nextest`
//! runs each test in its own process, where the lock costs nothing.)

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use cuda_graph::{Device, Function, GraphMemInfo, LaunchConfig, Module};

/// The variable that turns a missing GPU from a skip into a failure.
pub const REQUIRE_GPU_VAR: &str = "CUDA_GRAPH_REQUIRE_GPU";

/// One MiB.
pub const MIB: u64 = 1 << 20;

/// Elements of the small test allocations (1 MiB of `u32`).
pub const N: u64 = 1 << 18;

/// Bytes of the small test allocations.
pub const BYTES: usize = N as usize * 4;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// The launch shape for `n` elements (the kernels use grid-stride loops).
pub fn config(n: u64) -> LaunchConfig {
    LaunchConfig::for_elements(n, BLOCK)
}

/// Whether `CUDA_GRAPH_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v.trim() == "1")
}

/// The kernels of `cuda-graph/kernels/graph_kernels.cu` (see `cuda_graph::kernels`).
#[derive(Debug)]
pub struct Kernels {
    /// `fill_u32(p, n, v)`: `p[i] = v`.
    pub fill: Function,
    /// `iota_u32(p, n, base)`: `p[i] = base + i`.
    pub iota: Function,
    /// `add_u32(p, n, v)`: `p[i] += v`.
    pub add: Function,
    /// `copy_u32(dst, src, n)`: `dst[i] = src[i]`.
    pub copy: Function,
    /// `sum_u32(p, n, out)`: `*out += Σ p[i]` (64-bit).
    pub sum: Function,
    /// `spin_then_fill_u32(p, n, v, spins)`: busy-waits `spins` clock ticks, then `p[i] = v`.
    pub spin_then_fill: Function,
}

impl Kernels {
    /// Loads the PTX on `device`.
    #[track_caller]
    pub fn load(device: &Device) -> Kernels {
        let module = Module::from_ptx(device, cuda_graph::kernels::PTX).expect("load the PTX");
        let get = |name: &str| {
            module
                .function(name)
                .unwrap_or_else(|e| panic!("kernel {name}: {e}"))
        };
        Kernels {
            fill: get("fill_u32"),
            iota: get("iota_u32"),
            add: get("add_u32"),
            copy: get("copy_u32"),
            sum: get("sum_u32"),
            spin_then_fill: get("spin_then_fill_u32"),
        }
    }
}

/// What [`gpu`] hands a test: device 0, the kernels, and the lock that serialises the tests of
/// one binary (dropped last, after everything the test made).
#[derive(Debug)]
pub struct Gpu {
    /// Device 0, its primary context retained.
    pub device: Device,
    /// The test kernels, loaded on it.
    pub k: Kernels,
    _serial: MutexGuard<'static, ()>,
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The GPU gate. `None` (after printing `SKIPPED <test>: no GPU (<reason>)`) when device 0 cannot
/// be opened; panics instead under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[track_caller]
pub fn gpu(test: &str) -> Option<Gpu> {
    let serial = serial();
    match Device::get(0) {
        Ok(device) => {
            let k = Kernels::load(&device);
            Some(Gpu {
                device,
                k,
                _serial: serial,
            })
        }
        Err(e) => {
            if gpu_required() {
                panic!("{test}: {REQUIRE_GPU_VAR}=1 but no GPU is usable: {e}");
            }
            println!("SKIPPED {test}: no GPU ({e})");
            None
        }
    }
}

/// As [`gpu`], and also needs `count` devices that can map each other's memory. With fewer, or
/// with devices that cannot, it prints `SKIPPED <test>: ...` and returns `None`, or, under
/// `CUDA_GRAPH_REQUIRE_GPU=1`, panics: a GPU run counts only tests that ran (the runner excludes
/// the tests of `ci/needs-two-gpus.txt` by name where there are fewer GPUs).
///
/// # Panics
/// Also without a GPU, when `count` is 2 and `test` is not listed in `ci/needs-two-gpus.txt`.
#[track_caller]
pub fn gpus(test: &str, count: usize) -> Option<(Gpu, Vec<Device>)> {
    // Before `gpu`, so that a run without a GPU (CI) already catches an unlisted test.
    cuda_graph_tests::assert_listed_two_gpu_test(test, count);
    let gpu = gpu(test)?;
    let found = cuda_graph::device_count().expect("cuDeviceGetCount");
    if !cuda_graph_tests::enough_gpus(test, count, found) {
        return None;
    }
    let mut devices = vec![gpu.device.clone()];
    for ordinal in 1..count {
        let peer = Device::get(ordinal).expect("open the peer device");
        let both = gpu
            .device
            .can_access_peer(&peer)
            .expect("cuDeviceCanAccessPeer")
            && peer
                .can_access_peer(&gpu.device)
                .expect("cuDeviceCanAccessPeer");
        if !both {
            cuda_graph_tests::cannot_run(
                test,
                &format!("devices 0 and {ordinal} cannot access each other's memory"),
            );
            return None;
        }
        devices.push(peer);
    }
    Some((gpu, devices))
}

/// Checks that every element is `value`, naming the first mismatch.
#[track_caller]
pub fn assert_all(got: &[u32], value: u32, what: &str) {
    if let Some((i, v)) = got.iter().enumerate().find(|&(_, &v)| v != value) {
        panic!(
            "{what}: element {i} is {v}, expected {value} ({} elements)",
            got.len()
        );
    }
}

/// Checks `got[i] == base + i` (wrapping), naming the first mismatch.
#[track_caller]
pub fn assert_iota(got: &[u32], base: u32, what: &str) {
    if let Some((i, v)) = got
        .iter()
        .enumerate()
        .find(|&(i, &v)| v != base.wrapping_add(i as u32))
    {
        panic!(
            "{what}: element {i} is {v}, expected {} (iota from {base}, {} elements)",
            base.wrapping_add(i as u32),
            got.len()
        );
    }
}

/// Σ (base + i) for i in 0..n, as `sum_u32` computes it.
pub fn iota_sum(base: u32, n: u64) -> u64 {
    (0..n).map(|i| u64::from(base.wrapping_add(i as u32))).sum()
}

/// Reads the device's graph-memory attributes and prints them with `what`.
#[track_caller]
pub fn mem_info(device: &Device, what: &str) -> GraphMemInfo {
    let info = device
        .graph_mem_info()
        .expect("cuDeviceGetGraphMemAttribute");
    println!("graph memory {what}: {info}");
    info
}

/// Waits for all work, trims graph memory and asserts that nothing is used or reserved any more
/// (G.6): what every footprint test leaves behind.
#[track_caller]
pub fn assert_released(device: &Device, what: &str) -> GraphMemInfo {
    device.synchronize().expect("cuCtxSynchronize");
    device.graph_mem_trim().expect("cuDeviceGraphMemTrim");
    let info = mem_info(device, &format!("{what}, after synchronize and trim"));
    assert_eq!(
        info.used_current.0, 0,
        "{what}: graph memory still used after trim: {info}"
    );
    assert_eq!(
        info.reserved_current.0, 0,
        "{what}: graph memory still reserved after trim: {info}"
    );
    info
}

/// Waits until the crate's live objects are back to `start` and returns them: the driver calls
/// the destructors of the CUDA user objects that hold what graphs refer to on its own thread,
/// some time after the last launch, and the releases they queue run at the crate's next flush
/// point. Synchronizes and flushes (`flush_deferred`) until the count matches and nothing is
/// queued, for at most 10 s.
pub fn settle(device: &Device, start: cuda_graph::LiveObjects) -> cuda_graph::LiveObjects {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        device.synchronize().expect("cuCtxSynchronize");
        let queued = cuda_graph::flush_deferred();
        let live = cuda_graph::live_objects();
        if (live == start && queued == 0) || std::time::Instant::now() > deadline {
            device.synchronize().expect("cuCtxSynchronize");
            return live;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Asserts that no driver error was met in `Drop` on `device` (the crate docs' "Safety model":
/// no error is dropped).
#[track_caller]
pub fn assert_no_drop_errors(device: &Device) {
    let errors = device.drop_errors();
    assert_eq!(
        errors.count, 0,
        "driver errors met in Drop: {} (the last: {:?})",
        errors.count, errors.last
    );
}
