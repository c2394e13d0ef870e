//! What the tests against the stub driver (`stub-driver/null_cuda.c`, built by `build.rs`)
//! share: loading it as this process's driver, and the kernel's launch shape. The stub returns
//! success and made-up handles and runs nothing, so these tests check only what the safe layer
//! decides on the host.
//!
//! The whole binary uses the stub. `build.rs` writes it into the build script's `OUT_DIR`, which
//! a nextest archive carries (nextest archives the `OUT_DIR` of a workspace crate with tests, and
//! sets `OUT_DIR` at run time to where it unpacked it), so a packed suite finds it on the GPU
//! machine too. Where it is missing anyway (the C compiler failed), each test prints
//! `SKIPPED ...` and returns, except in CI (`CI=true`) and under `CUDA_GRAPH_REQUIRE_GPU=1`,
//! where it fails: those runs count only tests that ran.

#![allow(dead_code)] // each test binary uses a part

use std::path::PathBuf;
use std::sync::Once;

use cuda_graph::{Device, Function, LaunchConfig, Module};

/// Where `build.rs` wrote the stub (an absolute path on the machine that built the tests).
const STUB: &str = env!("CUDA_GRAPH_TESTS_STUB_DRIVER");
const STUB_ERROR: &str = env!("CUDA_GRAPH_TESTS_STUB_DRIVER_ERROR");
pub const BYTES: usize = 1 << 20;
pub const N: u64 = (BYTES / 4) as u64;

/// The stub library on this machine: where `build.rs` wrote it, else in the `OUT_DIR` the test
/// runner names at run time (nextest: the archive's copy). `Err` says why there is none.
pub fn stub_path() -> Result<PathBuf, String> {
    cuda_graph_tests::built_library(STUB, STUB_ERROR)
}

/// The device behind the stub driver, and a kernel; `None` (after saying why) without the stub.
///
/// # Panics
/// Without the stub, in CI (`CI=true`) or under `CUDA_GRAPH_REQUIRE_GPU=1`.
#[track_caller]
pub fn stub(test: &str) -> Option<(Device, Function, Module)> {
    let path = match stub_path() {
        Ok(path) => path,
        Err(why) if cuda_graph_tests::stub_required() => {
            panic!("{test}: no stub driver ({why}), and CI=true or CUDA_GRAPH_REQUIRE_GPU=1 is set")
        }
        Err(why) => {
            println!("SKIPPED {test}: no stub driver ({why})");
            return None;
        }
    };
    static USE_STUB: Once = Once::new();
    USE_STUB.call_once(|| {
        // SAFETY: set once, before this process's first driver call (which reads it); the
        // test threads read no other environment meanwhile.
        unsafe { std::env::set_var("CUDA_GRAPH_LIBCUDA", &path) };
    });
    let device = Device::get(0).expect("device 0 of the stub driver");
    let module = Module::from_ptx(&device, cuda_graph::kernels::PTX).expect("stub module");
    let fill = module.function("fill_u32").expect("stub function");
    Some((device, fill, module))
}

/// The launch shape of `fill_u32` over `N` values.
pub fn config() -> LaunchConfig {
    LaunchConfig::for_elements(N, 256)
}
